"""The learned reranker on the dev sets: recall with and without it, per hop, and what it costs.

    python -m benchmarks.rerank --data DIR [DIR ...] [--reranker DIR] [--candidates 5 10 20]
                                [--json OUT] [--png OUT] [--cost-batches 1 64]

For each data folder (corpus.jsonl + questions.jsonl with supporting_ids; the index is built or taken
from benchmarks.quality's cache) every question is ranked once by the graph (the default settings) and
the cross-encoder's logit of each (question, candidate) pair among the top max(--candidates) is computed
once; each candidate count K then reorders the top K by the fused score (RerankerSettings). The chosen
K (the settings' default, ``RetrievalConfig.rerank_candidates``) is also run through the engine's own
path (``rerank=True``) and its top 10 must equal the offline reorder. Reported: recall@1/2/5/10 and per
hop (hop j's gold passage in the top 2 / 5 / 10), for the graph alone, the fused rerank and the
cross-encoder's order alone; and the rerank stage's milliseconds per question at the given batch sizes
(nothing else should run meanwhile). The plot: recall@2 and @5 per set, graph vs rerank.
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

from benchmarks.quality import (aggregate, check_data_folders, data_set_arguments, encode,  # noqa: E402
                                load_or_build, machine_info, per_question_metrics)
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.rerank import Reranker  # noqa: E402
from linearrag_torch.rerank.scoring import chain_context, fuse  # noqa: E402

SHOWN = ("recall@1", "recall@2", "recall@5", "recall@10")


def metrics(rows: list[list[int]], rag, questions: list[dict]) -> dict:
    ids = rag.index.passage_ids
    per_q = [per_question_metrics([str(ids[i]) for i in row if i >= 0], q.get("supporting_ids") or [],
                                  q.get("answers") or [], lambda _: "") for q, row in zip(questions, rows)]
    agg = aggregate(per_q)
    return {k: v for k, v in agg.items() if k.startswith(("recall", "hop", "n"))}


def reorder(rows: torch.Tensor, key: torch.Tensor, k: int) -> list[list[int]]:
    """Each row's first k entries sorted by ``key`` (descending, ties keep the order), then the rest."""
    order = torch.sort(key[:, :k], dim=1, descending=True, stable=True).indices
    return torch.cat([rows[:, :k].gather(1, order), rows[:, k:]], 1).tolist()


def evaluate_set(rag, reranker: Reranker, questions: list[dict], cfg: RetrievalConfig, ks: list[int]) -> dict:
    depth = max(max(ks), 10)
    texts = [q["question"] for q in questions]
    enc = encode(rag, texts, cfg)
    out = rag.retrieve(enc, cfg.replace(top_k=depth, rerank=False))
    idx, scores = out.indices.cpu(), out.scores.cpu()
    qt = reranker.question_tokens(texts)
    pt = reranker.passage_tokens(rag.index)
    B, K = idx.shape[0], max(ks)
    t0 = time.perf_counter()
    # a chain-aware model reads each candidate with the graph's top passage (the second for the top one): the
    # same contexts whatever the candidate count, so one scoring serves every K
    ctx = chain_context(idx[:, :K]).reshape(-1) if reranker.settings.context_tokens else None
    logits = reranker.pair_logits(qt, pt, torch.arange(B).repeat_interleave(K),
                                  idx[:, :K].clamp(min=0).reshape(-1), ctx).view(B, K).cpu()
    score_s = time.perf_counter() - t0
    res = {"graph": metrics(idx.tolist(), rag, questions), "pairs_scored": B * K, "scoring_s": round(score_s, 2)}
    for k in ks:
        fused = fuse(reranker.settings, logits[:, :k], scores[:, :k])
        res[f"rerank_top{k}"] = metrics(reorder(idx, fused, k), rag, questions)
        res[f"model_only_top{k}"] = metrics(reorder(idx, logits[:, :k], k), rag, questions)
    # the engine's own path at the configured candidate count: the same top 10 as the offline reorder
    k = cfg.rerank_candidates
    if k in ks:
        eng = rag.retrieve(rag.encode_queries(texts, cfg.replace(rerank=True)), cfg.replace(top_k=10, rerank=True))
        fused = fuse(reranker.settings, logits[:, :k], scores[:, :k])
        offline = [r[:10] for r in reorder(idx, fused, k)]
        res["engine_path_equal"] = eng.indices.cpu().tolist() == offline
    return res


def cost(rag, questions: list[dict], cfg: RetrievalConfig, batches: list[int], repeat: int = 3) -> dict:
    """Milliseconds per question of the graph stage alone and with the rerank stage (median of ``repeat``)."""
    out = {}
    for b in batches:
        texts = [q["question"] for q in questions[:b]]
        row = {}
        for name, c in (("graph", cfg.replace(rerank=False)), ("graph+rerank", cfg.replace(rerank=True))):
            enc = rag.encode_queries(texts, c)
            rag.retrieve(enc, c)  # warm (the reranker loads, the passages are tokenised once)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                rag.retrieve(enc, c)
                times.append(time.perf_counter() - t)
            row[name] = round(1e3 * sorted(times)[len(times) // 2] / len(texts), 2)
        row["rerank"] = round(row["graph+rerank"] - row["graph"], 2)
        out[f"batch_{b}"] = row
    return out


def plot(path: Path, results: dict, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results["datasets"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, metric in zip(axes, ("recall@2", "recall@5")):
        g = [results["datasets"][s]["graph"][metric] for s in sets]
        r = [results["datasets"][s][f"rerank_top{k}"][metric] for s in sets]
        x = range(len(sets))
        ax.bar([i - 0.2 for i in x], g, 0.4, label="graph")
        ax.bar([i + 0.2 for i in x], r, 0.4, label=f"graph + rerank (top {k})")
        ax.set_xticks(list(x), sets, fontsize=8)
        ax.set_title(metric)
        ax.set_ylim(0, 100)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rerank", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    data_set_arguments(ap)
    ap.add_argument("--reranker", default=None, help="reranker folder (default: the packaged model)")
    ap.add_argument("--candidates", nargs="+", type=int, default=[5, 10, 20], help="candidate counts K compared")
    ap.add_argument("--cost-batches", nargs="*", type=int, default=[1, 64], help="batch sizes timed (none: skip)")
    ap.add_argument("--png", type=Path, help="write the plot here")
    args = ap.parse_args(argv)
    check_data_folders(args.data, ap.error)
    cfg = RetrievalConfig().replace(reranker=args.reranker or "", rerank_loop_candidates=0)  # the final list alone
    results = {"config": cfg.to_dict(), "candidates": args.candidates, "datasets": {}, "cost_ms_per_question": {},
               "date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads()}
    for data in args.data:
        rag, _ = load_or_build(data / "corpus.jsonl", args.cache)
        results.setdefault("machine", machine_info(rag))
        reranker = rag.reranker(cfg)
        questions = read_questions(str(data / "questions.jsonl"))
        res = evaluate_set(rag, reranker, questions, cfg, args.candidates)
        results["datasets"][data.name] = res
        print(f"\n{data.name}: " + " / ".join(SHOWN) + f"   (engine path equal: {res.get('engine_path_equal')})")
        for system in ["graph"] + [f"{p}_top{k}" for k in args.candidates for p in ("rerank", "model_only")]:
            r = res[system]
            print(f"  {system:<18}" + " / ".join(f"{r[m]:.1f}" for m in SHOWN))
        if args.cost_batches:
            results["cost_ms_per_question"][data.name] = c = cost(rag, questions, cfg, args.cost_batches)
            print("  ms per question: " + ", ".join(f"{b}: {v}" for b, v in c.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    if args.png:
        plot(args.png, results, cfg.rerank_candidates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
