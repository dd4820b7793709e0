"""Scoring pairs of passages with the chain-aware reranker: does choosing the top two jointly beat the default?

    python -m benchmarks.rerank_pairs --data DIR [DIR ...] [--reranker DIR] [--contexts 3] [--cache DIR]
                                      [--json OUT]

The shipped reranker reads each candidate with one context passage (the graph's top candidate; the second,
for the top one). A second hop is relevant only through its first, so a pair (a, b) of the graph's top
candidates can be scored as a whole. For every question the cross-encoder's logit of each top-10 candidate
is computed with each of the graph's top ``--contexts`` candidates as context (cached in --cache: the
costly part, ``contexts`` x 10 pairs per question), then these orders are compared, recall@1/2/5/10:

* ``default_topK``: the engine's rerank of the top K (K = 5, 10): one context per candidate, the fused score;
* ``pair_asym_F{F}_topK``: the top two are the pair (a, b), a among the top F, b among the top K, that
  maximises fused(a) + w_model x logit(b | context a) + graph terms of b; the rest keep the fused order;
* ``pair_sym_F{F}_topK``: the pair among the top F that maximises the fused terms of both with each read in
  the context of the other (logit(a | b) + logit(b | a));
* ``pair_sym+single_F{F}_topK``: that sum plus both candidates' own fused scores.

A pair's first place goes to the one with the larger fused score. The extra cost over the default is
``(F - 1) x (K - 1)`` pairs per question for the asymmetric form (F = 3, K = 5: 13 pairs where the default
reads 5). Nothing else should run meanwhile only if the times printed matter (they are not the result).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.quality import DEFAULT_CACHE, encode, load_or_build, machine_info  # noqa: E402
from benchmarks.rerank import metrics  # noqa: E402
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.rerank import Reranker  # noqa: E402
from linearrag_torch.rerank.scoring import fuse  # noqa: E402

DEPTH = 10
SHOWN = ("recall@1", "recall@2", "recall@5", "recall@10")


def context_logits(rag, reranker: Reranker, texts: list[str], contexts: int) -> dict:
    """The graph's top DEPTH (``idx``, ``sc`` [B, DEPTH]) and L [B, contexts, DEPTH]: the logit of candidate j
    read with the graph's candidate c as its context (L[b, c, c] is a candidate read with itself: unused)."""
    cfg = RetrievalConfig()
    out = rag.retrieve(encode(rag, texts, cfg), cfg.replace(top_k=DEPTH, rerank=False))
    idx, sc = out.indices.cpu(), out.scores.cpu()
    B = len(texts)
    qt, pt = reranker.question_tokens(texts), reranker.passage_tokens(rag.index)
    q_of = torch.arange(B).repeat_interleave(DEPTH)
    L = torch.full((B, contexts, DEPTH), float("nan"))
    for c in range(contexts):
        t0 = time.perf_counter()
        ctx = idx[:, c:c + 1].expand(B, DEPTH).reshape(-1)
        L[:, c] = reranker.pair_logits(qt, pt, q_of, idx.clamp(min=0).reshape(-1), ctx).view(B, DEPTH).cpu()
        print(f"  context {c + 1}: {B * DEPTH} pairs in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"idx": idx, "sc": sc, "L": L}


def graph_terms(settings, sc: torch.Tensor, K: int) -> torch.Tensor:
    """The fused score's graph part (rank and score terms, scoring.fuse) of the first K candidates."""
    return fuse(settings, torch.zeros(sc.shape[0], K), sc[:, :K])


def orders(settings, idx: torch.Tensor, sc: torch.Tensor, L: torch.Tensor) -> dict:
    """{variant: rows [B][DEPTH]} for the variants of the module docstring."""
    B, C, _ = L.shape
    wm = settings.w_model
    out = {"graph": idx.tolist()}
    for K in (5, 10):
        G = graph_terms(settings, sc, K)
        single = L[:, 0, :K].clone()
        single[:, 0] = L[:, 1, 0]  # the top candidate is read with the second
        fused = wm * single + G
        order = torch.sort(fused, dim=1, descending=True, stable=True).indices
        out[f"default_top{K}"] = torch.cat([idx[:, :K].gather(1, order), idx[:, K:]], 1).tolist()
        for F in range(2, C + 1):
            for mode in ("asym", "sym", "sym+single"):
                rows = []
                for b in range(B):
                    best, pair = float("-inf"), None
                    for a in range(F):
                        for c in range(K if mode == "asym" else F):
                            if c == a:
                                continue
                            if mode == "asym":
                                s = fused[b, a] + wm * L[b, a, c] + G[b, c]
                            else:
                                s = wm * (L[b, c, a] + L[b, a, c]) + G[b, a] + G[b, c]
                                if mode == "sym+single":
                                    s = s + fused[b, a] + fused[b, c]
                            if s > best:
                                best, pair = float(s), (a, c)
                    a, c = pair
                    first, second = (a, c) if fused[b, a] >= fused[b, c] else (c, a)
                    rest = [j for j in order[b].tolist() if j not in pair]
                    rows.append([int(idx[b, j]) for j in [first, second] + rest] + idx[b, K:].tolist())
                out[f"pair_{mode}_F{F}_top{K}"] = rows
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rerank_pairs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", required=True, type=Path, help="data folders (corpus.jsonl, questions.jsonl)")
    ap.add_argument("--reranker", type=Path, default=None, help="reranker folder (default: the shipped one)")
    ap.add_argument("--contexts", type=int, default=3, help="the graph's top candidates tried as contexts (default 3)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "linearrag_torch" / "rerank_pairs",
                    help="where the logits are kept, one file per data folder (default %(default)s)")
    ap.add_argument("--index-cache", type=Path, default=DEFAULT_CACHE, help="benchmarks.quality's index cache")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.contexts < 2:
        ap.error("--contexts must be >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    reranker = Reranker.load(args.reranker)
    result = {"benchmark": "rerank_pairs", "date": time.strftime("%Y-%m-%d"), "machine": machine_info(),
              "reranker": str(args.reranker or "shipped"), "contexts": args.contexts, "sets": {}}
    for folder in args.data:
        rag, _ = load_or_build(folder / "corpus.jsonl", args.index_cache)
        questions = read_questions(folder / "questions.jsonl")
        texts = [q["question"] for q in questions]
        cache = args.cache / f"{folder.name}_{args.contexts}.pt"
        if cache.is_file():
            got = torch.load(cache)
        else:
            print(f"{folder.name}: {len(texts)} questions x {args.contexts} contexts x {DEPTH} candidates",
                  file=sys.stderr, flush=True)
            got = context_logits(rag, reranker, texts, args.contexts)
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save(got, cache)
        res = {name: {k: round(v, 1) for k, v in metrics(rows, rag, questions).items() if k in SHOWN}
               for name, rows in orders(reranker.settings, got["idx"], got["sc"], got["L"]).items()}
        result["sets"][folder.name] = res
        print(f"\n{folder.name}: recall@1 / @2 / @5 / @10")
        for name, m in res.items():
            print(f"  {name:26s} " + " / ".join(f"{m[k]:5.1f}" for k in SHOWN))
        rag.close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
