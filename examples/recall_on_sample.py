"""Recall@2 and @5 on the 40 bundled questions, for the default settings and three variants, in one batched
call each: what the second round, the pair rerank and the reference code's settings do on this sample.

    python examples/recall_on_sample.py            # builds ./demo_index once, then loads it

Options: --index DIR (default demo_index), --corpus FILE.jsonl (default: the bundled sample).
"""
import argparse
import time

from linearrag_torch import RetrievalConfig
from linearrag_torch.data import sample_corpus_path, sample_questions

from search_and_explain import load_or_build

VARIANTS = {
    "defaults": {},
    "one round (chain_passages=0)": {"chain_passages": 0},
    "no pair rerank (pair_candidates=0)": {"pair_candidates": 0},
    "paper mode (eq. 5 as written)": {"mode": "paper"},
    "the reference code's settings": RetrievalConfig.reference_code().to_dict(),
}


def recall(hits, gold, k: int) -> float:
    return 100 * sum(len(g & {h.id for h in hs[:k]}) / len(g) for hs, g in zip(hits, gold)) / len(gold)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", default="demo_index")
    p.add_argument("--corpus", default=None, help="default: the bundled sample")
    args = p.parse_args(argv)
    rag = load_or_build(args.index, args.corpus or sample_corpus_path())
    ids = set(rag.index.passage_ids)
    qs = [q for q in sample_questions() if set(q["supporting_ids"]) <= ids]  # all 40 on the full sample
    gold = [set(q["supporting_ids"]) for q in qs]
    encoded = rag.encode_queries([q["question"] for q in qs])  # NER and encoder once for every variant
    print(f"{len(qs)} questions, {rag.index.num_passages} passages")
    for name, settings in VARIANTS.items():
        config = rag.config.replace(**{**settings, "top_k": 5})
        t0 = time.perf_counter()
        hits = rag.hits(rag.retrieve(encoded, config))
        ms = 1000 * (time.perf_counter() - t0) / len(qs)
        print(f"  {name:38s} recall@2 {recall(hits, gold, 2):5.1f}  recall@5 {recall(hits, gold, 5):5.1f}  "
              f"({ms:.1f} ms per question for the graph)")


if __name__ == "__main__":
    main()
