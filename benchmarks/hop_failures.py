"""Where the gold passages of later hops are lost: a per-hop breakdown of the default retrieval.

    python -m benchmarks.hop_failures --data /path/to/musique_dev200 [--json OUT] [--cache DIR] [--set k=v ...]

For the gold passage at position j of each question's supporting_ids (hop j where the data keeps hop
order, as MuSiQue does), with the full ranking of the torch engine (trace on):
- where it ranks: top 5, 6-20, 21-100, below 100;
- whether activation touched it: an active entity (seed or tier >= 2) occurs in it (N > 0, so eq. 7
  gives it an entity term), and whether that entity is one of its own PageRank edges (C > 0);
- whether it shares a PageRank entity with the previous hop's gold passage (a walk of length 2
  joins them), and whether that previous passage ranked in the top 5;
- whether its passage title is an entity the previous hop's passage contains.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.common import setting_overrides  # noqa: E402
from benchmarks.quality import DEFAULT_CACHE, encode, load_or_build  # noqa: E402
from linearrag_torch.retrieval import engine  # noqa: E402
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402


def rank_bucket(r: int) -> str:
    return "top5" if r < 5 else "6-20" if r < 20 else "21-100" if r < 100 else ">100"


def analyse(rag, questions, cfg: RetrievalConfig) -> dict:
    ix = rag.index
    P = ix.num_passages
    id_to_row = {str(pid): i for i, pid in enumerate(ix.passage_ids)}
    enc = encode(rag, [q["question"] for q in questions], cfg)
    full = cfg.replace(top_k=P)
    out, tr = engine.retrieve(rag.graph, enc, full, trace=True)
    order = out.indices.cpu()
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(P).expand_as(order).contiguous())
    dense_rank = torch.empty_like(order)
    dense_order = torch.sort(enc.query_emb.cpu() @ ix.passage_emb.T, dim=1, descending=True, stable=True).indices
    dense_rank.scatter_(1, dense_order, torch.arange(P).expand_as(order).contiguous())
    active = (tr.activation.tier > 0).cpu()  # [E, B]
    seed = tr.is_seed.cpu()
    C, N = ix.C, ix.N
    c_rows = [set(C.col[C.crow[p]:C.crow[p + 1]].tolist()) for p in range(P)]
    n_rows = [set(N.col[N.crow[p]:N.crow[p + 1]].tolist()) for p in range(P)]
    ent_of = {name: e for e, name in enumerate(ix.entities)}
    rows = []
    for b, q in enumerate(questions):
        gold = [id_to_row.get(str(g)) for g in q.get("supporting_ids") or []]
        act_b = set(torch.nonzero(active[:, b]).flatten().tolist())
        seed_b = set(torch.nonzero(seed[:, b]).flatten().tolist())
        for j, g in enumerate(gold):
            if g is None:
                continue
            r = int(rank[b, g])
            row = {"question": b, "hop": j + 1, "n_hops": len(gold), "rank": r, "bucket": rank_bucket(r),
                   "dense_rank": int(dense_rank[b, g]),
                   "touched": bool(n_rows[g] & act_b), "touched_C": bool(c_rows[g] & act_b),
                   "seeded": bool(n_rows[g] & seed_b), "dense_fallback": bool(tr.dense[b])}
            if j > 0 and gold[j - 1] is not None:
                prev = gold[j - 1]
                row["shares_entity_with_prev"] = bool(c_rows[g] & c_rows[prev])
                row["prev_in_top5"] = int(rank[b, prev]) < 5
                title = ix.titles[g]
                e = ent_of.get(title)
                row["title_entity_in_prev"] = e is not None and e in n_rows[prev]
                row["title_in_question"] = bool(title) and title.lower() in q["question"].lower()
            rows.append(row)
    return summarise(rows), rows


def summarise(rows) -> dict:
    by_hop = defaultdict(list)
    for r in rows:
        by_hop[r["hop"]].append(r)
    res = {}
    for hop, rs in sorted(by_hop.items()):
        n = len(rs)
        buckets = Counter(r["bucket"] for r in rs)
        lost = [r for r in rs if r["rank"] >= 5]
        d = {
            "n": n,
            "rank": {k: buckets.get(k, 0) for k in ("top5", "6-20", "21-100", ">100")},
            "dense_top5": sum(r["dense_rank"] < 5 for r in rs),
            "touched": sum(r["touched"] for r in rs),
            "touched_C": sum(r["touched_C"] for r in rs),
            "seeded": sum(r["seeded"] for r in rs),
            "lost": len(lost),
            "lost_touched": sum(r["touched"] for r in lost),
            "lost_untouched": sum(not r["touched"] for r in lost),
            "lost_dense_top5": sum(r["dense_rank"] < 5 for r in lost),
        }
        if hop > 1:
            d["shares_entity_with_prev"] = sum(r["shares_entity_with_prev"] for r in rs if "shares_entity_with_prev" in r)
            d["prev_in_top5"] = sum(r["prev_in_top5"] for r in rs if "prev_in_top5" in r)
            d["lost_with_prev_in_top5"] = sum(r.get("prev_in_top5", False) for r in lost)
            d["lost_with_prev_in_top5_sharing_entity"] = sum(
                r.get("prev_in_top5", False) and r.get("shares_entity_with_prev", False) for r in lost)
            d["title_entity_in_prev"] = sum(r.get("title_entity_in_prev", False) for r in rs)
            d["title_in_question"] = sum(r.get("title_in_question", False) for r in rs)
        res[str(hop)] = d
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hop_failures", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="RetrievalConfig overrides")
    args = ap.parse_args(argv)
    cfg = RetrievalConfig().replace(**setting_overrides(args.set, "--set", ap.error))
    questions = read_questions(args.data / "questions.jsonl")
    rag, _ = load_or_build(args.data / "corpus.jsonl", args.cache.expanduser())
    summary, rows = analyse(rag, questions, cfg)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"dataset": args.data.name, "config": cfg.to_dict(), "by_hop": summary,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
