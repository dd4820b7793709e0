"""Search the bundled sample and show how each hit was reached (seeds, bridging entities, the chain round).

    python examples/search_and_explain.py                       # builds ./demo_index once, then loads it
    python examples/search_and_explain.py "Who is Rani Mukerji's father-in-law?"

Options: --index DIR (default demo_index), --corpus FILE.jsonl (default: the bundled sample), --top-k K.
"""
import argparse
from pathlib import Path

from linearrag_torch import LinearRAG
from linearrag_torch.data import sample_corpus_path, sample_questions


def load_or_build(index_dir: str, corpus) -> LinearRAG:
    if (Path(index_dir) / "index.json").exists():
        return LinearRAG.load(index_dir, device="cpu")
    rag = LinearRAG.build(corpus, device="cpu")
    rag.save(index_dir)
    return rag


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("questions", nargs="*", help="default: three of the bundled questions")
    p.add_argument("--index", default="demo_index")
    p.add_argument("--corpus", default=None, help="default: the bundled sample")
    p.add_argument("--top-k", type=int, default=3)
    args = p.parse_args(argv)
    rag = load_or_build(args.index, args.corpus or sample_corpus_path())
    questions = args.questions or [q["question"] for q in sample_questions()[:3]]
    for ex in rag.explain(questions, top_k=args.top_k):
        print(f"\nQ: {ex['question']}")
        print("   question entities:", ", ".join(ex["question_entities"]) or "none (dense retrieval)")
        print("   seeds:", ", ".join(f"{name} ({score:.2f})" for name, score in ex["seeds"]))
        if ex["chain_seeds"]:
            print("   second-round seeds:", ", ".join(str(s[0]) for s in ex["chain_seeds"][:5]))
        for rank, (hit, entities) in enumerate(ex["hits"], 1):
            reached = ", ".join(f"{name} ({'seed' if tier == 1 else f'hop {tier - 1}'})"
                                for name, tier, _ in sorted(entities, key=lambda e: -e[2])[:4])
            print(f"   {rank}. [{hit.id}] {hit.title}  score {hit.score:.4f}" + (f"  via {reached}" if reached else ""))


if __name__ == "__main__":
    main()
