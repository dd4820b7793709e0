"""How much of the recall still missing is a matter of order: the default ranking's top K passages
reordered by an oracle (the gold passages first) and by the question's cosine with each passage (the
only relevance score the packaged encoder gives: a bi-encoder, no cross-encoder).

    python -m benchmarks.rerank_headroom --data DIR [DIR ...] [--json OUT] [--cache DIR] [--set FIELD=VALUE ...]

For each data folder (corpus.jsonl + questions.jsonl with supporting_ids; the index is built or taken
from benchmarks.quality's cache) it ranks every question with the torch engine and reports recall@2 /
@5 / @10 / @20 (percent, averaged over questions as in benchmarks.quality) of
- ``default``: the ranking itself;
- ``oracle_top{K}``: its top K reordered with the gold passages first (K = 5, 10, 20): the most any
  rerank of those K passages could reach;
- ``cosine_top10``: its top 10 reordered by the question's cosine with the passage vectors.
If the oracle is far above the default while the cosine rerank is below it, the passages are found
and what is missing is a relevance model that orders them (docs/QUALITY.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.common import setting_overrides  # noqa: E402
from benchmarks.quality import check_data_folders, data_set_arguments, encode, load_or_build  # noqa: E402
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402

KS = (2, 5, 10, 20)
ORACLE_DEPTHS = (5, 10, 20)
COSINE_DEPTH = 10


def recall(rows: list[list[int]], gold: list[set], ks=KS) -> dict:
    """{"recall@k": percent} over the questions with gold: the share of each question's gold rows in its first k."""
    pairs = [(r, g) for r, g in zip(rows, gold) if g]
    if not pairs:
        return {f"recall@{k}": None for k in ks}
    return {f"recall@{k}": round(100.0 * sum(len(g.intersection(r[:k])) / len(g) for r, g in pairs) / len(pairs), 2)
            for k in ks}


def oracle_reorder(row: list[int], gold: set, depth: int) -> list[int]:
    """The first ``depth`` rows with the gold ones moved to the front (each group keeps its order), then the rest."""
    top = row[:depth]
    return [r for r in top if r in gold] + [r for r in top if r not in gold] + row[depth:]


def cosine_reorder(row: list[int], cos: list[float], depth: int) -> list[int]:
    """The first ``depth`` rows by descending cosine (ties keep their rank), then the rest; cos[i] is row[i]'s."""
    order = sorted(range(min(depth, len(row))), key=lambda i: (-cos[i], i))
    return [row[i] for i in order] + row[depth:]


def headroom(rag, questions: list[dict], cfg: RetrievalConfig) -> dict:
    depth = max(max(KS), max(ORACLE_DEPTHS), COSINE_DEPTH)
    id_to_row = {str(pid): i for i, pid in enumerate(rag.index.passage_ids)}
    gold = [{id_to_row[str(g)] for g in (q.get("supporting_ids") or []) if str(g) in id_to_row} for q in questions]
    enc = encode(rag, [q["question"] for q in questions], cfg)
    out = rag.retrieve(enc, cfg.replace(top_k=depth))
    rows = [[i for i in r if i >= 0] for r in out.indices.cpu().tolist()]
    q = enc.query_emb.detach().cpu().float()
    emb = rag.index.passage_emb
    cos = [(emb.index_select(0, torch.tensor(r[:COSINE_DEPTH], dtype=torch.int64)).float() @ q[b]).tolist() if r else []
           for b, r in enumerate(rows)]
    res = {"n_questions": len(questions), "n_with_gold": sum(1 for g in gold if g), "default": recall(rows, gold)}
    for d in ORACLE_DEPTHS:
        res[f"oracle_top{d}"] = recall([oracle_reorder(r, g, d) for r, g in zip(rows, gold)], gold)
    res[f"cosine_top{COSINE_DEPTH}"] = recall([cosine_reorder(r, c, COSINE_DEPTH) for r, c in zip(rows, cos)], gold)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rerank_headroom", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    data_set_arguments(ap)
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="RetrievalConfig overrides")
    args = ap.parse_args(argv)
    cfg = RetrievalConfig().replace(**setting_overrides(args.set, "--set", ap.error))
    check_data_folders(args.data, ap.error)
    results = {"config": cfg.to_dict(), "datasets": {}}
    for data in args.data:
        rag, _ = load_or_build(data / "corpus.jsonl", args.cache)
        questions = read_questions(str(data / "questions.jsonl"))
        res = headroom(rag, questions, cfg)
        results["datasets"][data.name] = res
        print(f"\n{data.name} ({res['n_with_gold']} questions with gold): recall@2 / @5 / @10 / @20")
        for system, r in res.items():
            if isinstance(r, dict):
                print(f"  {system:<14}" + " / ".join("-" if v is None else f"{v:.1f}" for v in r.values()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
