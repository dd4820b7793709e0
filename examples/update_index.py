"""Build an index from the first half of the bundled sample, add the second half, delete a few passages, and
check that the grown index answers like one built from all passages at once (same top-5 lists).

    python examples/update_index.py        # two builds of the sample: a few minutes on two CPU cores

Options: --corpus FILE.jsonl (default: the bundled sample), --out DIR (default update_demo).
"""
import argparse
import json
from pathlib import Path

from linearrag_torch import LinearRAG
from linearrag_torch.data import sample_corpus_path, sample_questions


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=None, help="default: the bundled sample")
    p.add_argument("--out", default="update_demo")
    args = p.parse_args(argv)
    path = Path(args.corpus or sample_corpus_path())
    passages = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    half = len(passages) // 2

    rag = LinearRAG.build(passages[:half], device="cpu", progress=False)
    print("first half:", rag.index.summary())
    rag.add(passages[half:])                       # only the new passages are analysed and encoded
    print("after add: ", rag.index.summary())
    rag.save(args.out)                             # atomic, under the folder's writer lock

    full = LinearRAG.build(passages, device="cpu", progress=False)
    questions = [q["question"] for q in sample_questions()]
    same = sum([h.id for h in a] == [h.id for h in b]
               for a, b in zip(rag.search(questions, top_k=5), full.search(questions, top_k=5)))
    print(f"grown index against a fresh build: {same} of {len(questions)} top-5 lists identical")

    gone = [passages[0]["id"], passages[1]["id"]]
    rag.delete(gone)                               # also drops sentences and entities no passage keeps
    rag.save(args.out)
    print(f"after deleting {gone}:", rag.index.summary())


if __name__ == "__main__":
    main()
