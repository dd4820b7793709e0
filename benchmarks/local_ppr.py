"""Recall of the local PageRank and of the sparse reset (issue 49) against the exact walk on real dev sets.

    python -m benchmarks.local_ppr --data DATA_DIR INDEX_DIR [DATA_DIR INDEX_DIR ...] --json OUT
                                   [--reset 100 300] [--eps 1e-4 1e-5] [--minmax global top] [--rerank]
                                   [--ann ivf hnsw] [--ann-probe 16 64]

With --rerank every setting runs with the learned reranker and is compared with the exact mode with it. Each DATA_DIR holds questions.jsonl (with supporting_ids), INDEX_DIR an index of its corpus.jsonl (`linearrag
index`). The questions are encoded once; then every setting ranks all of them in one batched call (timed), and
its recall@2 / @5 (as benchmarks/quality.py computes them) and the share of questions whose top 5 equals the
exact mode's (the defaults: ppr_mode exact, reset_passages 0) are written out, with the PageRank's touched
(question, node) pairs per question in local mode.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.retrieval.engine import retrieve  # noqa: E402

from benchmarks.common import cpu_model  # noqa: E402


def recall(rows, ids, questions, k: int) -> float:
    """Mean over the questions with gold of |gold in the top k| / |gold|, in percent."""
    vals = []
    for q, row in zip(questions, rows):
        gold = {str(g) for g in (q.get("supporting_ids") or [])}
        if gold:
            vals.append(len(gold.intersection(str(ids[i]) for i in row[:k] if i >= 0)) / len(gold))
    return 100.0 * sum(vals) / max(len(vals), 1)


def settings(args) -> dict:
    """name -> RetrievalConfig changes."""
    out = {"exact": {}}
    for m in args.reset:
        for mm in args.minmax:
            out[f"exact, reset {m} {mm}"] = {"reset_passages": m, "reset_minmax": mm}
            for eps in args.eps:
                out[f"local {eps:g}, reset {m} {mm}"] = {"ppr_mode": "local", "ppr_eps": eps, "reset_passages": m,
                                                         "reset_minmax": mm}
    for eps in args.eps_full:
        out[f"local {eps:g}, every passage"] = {"ppr_mode": "local", "ppr_eps": eps}
    for kind in args.ann:  # the local mode on the ANN stage (retrieval/ann.py)
        for probe in args.ann_probe:
            for m in args.reset:
                for mm in args.minmax:
                    for eps in args.eps:
                        out[f"local {eps:g}, reset {m} {mm}, {kind} probe {probe}"] = {
                            "ppr_mode": "local", "ppr_eps": eps, "reset_passages": m, "reset_minmax": mm, "ann": kind,
                            "ann_probe": probe}
    return out


def differences(top, ref, scores_ref) -> dict:
    """How the top 5 lists that differ from the exact mode's differ: the same five passages in another order,
    or other passages; and the exact mode's score gap (relative to its top score) between the first differing
    place and the next, median over those questions (a small gap: a near tie that any rounding may flip)."""
    reorder = other = 0
    gaps = []
    for t, r, s in zip(top, ref, scores_ref):
        if t == r:
            continue
        if sorted(t) == sorted(r):
            reorder += 1
        else:
            other += 1
        i = next(j for j in range(min(len(t), len(r))) if t[j] != r[j])
        if i + 1 < len(s) and s[0] > 0:
            gaps.append(abs(s[i] - s[i + 1]) / s[0])
    gaps.sort()
    return {"differ_order_only": reorder, "differ_other_passages": other,
            "median_relative_gap_at_first_difference": gaps[len(gaps) // 2] if gaps else None}


def run_set(data: Path, index_dir: Path, args) -> dict:
    rag = LinearRAG.load(index_dir, device="cpu")
    questions = read_questions(data / "questions.jsonl")
    questions = [q if isinstance(q, dict) else vars(q) for q in questions]
    texts = [q["question"] for q in questions]
    base = rag.config
    queries = rag.encode_queries(texts, base.replace(rerank=args.rerank))  # with the reranker's tokens when asked
    ids = rag.index.passage_ids
    graph = rag.graph
    rows = {}
    ref = None
    for rerank in ([True] if args.rerank else [False]):
        for name, changes in settings(args).items():
            if name != "exact" and args.only and name not in args.only:
                continue
            cfg = base.replace(rerank=rerank, **changes)
            rag.retrieve(queries.slice(0, min(4, queries.batch_size)), cfg)  # warm-up (operators built)
            t = time.perf_counter()
            if graph is not None:
                out, tr = retrieve(graph, queries, cfg, trace="steps")
                pushes, stage_s = tr.ppr_steps.pushes, dict(getattr(tr.ppr_steps, "stage_s", {}))
            else:
                out, pushes, stage_s = rag.retrieve(queries, cfg), [], {}
            sec = time.perf_counter() - t
            top = out.indices[:, :5].tolist()
            key = ("rerank " if rerank else "") + name
            if name == "exact":
                ref, ref_scores = top, out.scores[:, :6].tolist()
            row = {"settings": {**changes, "rerank": rerank}, "recall@2": recall(top, ids, questions, 2),
                   "recall@5": recall(top, ids, questions, 5),
                   "top5_same_as_exact": 100.0 * sum(a == b for a, b in zip(top, ref)) / len(top),
                   "ms_per_question": 1e3 * sec / len(top), "questions": len(top),
                   **differences(top, ref, ref_scores)}
            if stage_s:  # the graph rounds' parts (cosines, seeds and activation, reset, pagerank, top-k)
                row["stage_ms_per_question"] = {k: 1e3 * v / len(top) for k, v in stage_s.items()}
            if pushes:
                cols = sum(p.columns for p in pushes)
                row["ppr_touched_per_question_round"] = sum(p.touched for p in pushes) / cols
                row["ppr_pushed_per_question_round"] = sum(p.pushed for p in pushes) / cols
                row["ppr_rounds_max"] = max(p.rounds for p in pushes)
            rows[key] = row
            print(f"{data.name:<18} {key:<40} R@2 {row['recall@2']:6.2f} R@5 {row['recall@5']:6.2f} "
                  f"top5=exact {row['top5_same_as_exact']:5.1f}% (order only {row['differ_order_only']}, other "
                  f"{row['differ_other_passages']}, gap {row['median_relative_gap_at_first_difference'] or 0:.2g}) "
                  f"{row['ms_per_question']:8.2f} ms/q"
                  + (f" touched {row['ppr_touched_per_question_round']:.0f}/q" if pushes else ""), flush=True)
    stages = {f"{kind} probe {probe}": ann_recall(graph, queries, base.replace(ann=kind, ann_probe=probe), args.reset)
              for kind in args.ann for probe in args.ann_probe} if graph is not None else {}
    for name, r in stages.items():
        print(f"{data.name:<18} ANN {name}: nearest entity = exact {r['nearest_entity_recall']:.1f}%, "
              + ", ".join(f"top {m} recall {v:.1f}%" for m, v in r["top_m_recall"].items()), flush=True)
    return {"data": str(data), "index": str(index_dir), "passages": rag.index.num_passages, "rows": rows,
            "ann_stages": stages}


def ann_recall(graph, queries, cfg, ms) -> dict:
    """The ANN stage of ``cfg`` against the exact product on these questions, in percent: the share of question
    entities whose nearest entity (eq. 3; the entities found by the index's lexicon included) is the exact
    scan's, and of each question's exact top m passages among its m candidates (the sparse reset's), per m."""
    from linearrag_torch.retrieval import ann
    from linearrag_torch.retrieval.activation import nearest_entities
    from linearrag_torch.retrieval.engine import cosines
    from linearrag_torch.retrieval.pagerank import top_passages

    with torch.inference_mode():
        q_ent = queries.entity_emb.to(graph.entity_emb.dtype)
        want = nearest_entities(graph.entity_emb, q_ent)[1]
        got = ann.nearest_entities(graph, q_ent, None, cfg)[1]
        sim = cosines(graph.passage_emb, queries.query_emb)
        P, B = sim.shape
        recall = {}
        for m in ms:
            exact = top_passages(sim, m)[0]
            cand = ann.passage_candidates(graph, queries.query_emb, m, cfg, low=False)
            keys = (torch.arange(B)[None, :] * P + exact).flatten()
            recall[m] = 100.0 * float(torch.isin(keys, cand.question * P + cand.passage).float().mean())
    return {"nearest_entity_recall": 100.0 * float((want == got).float().mean()), "top_m_recall": recall,
            "question_entities": int(q_ent.shape[0]), "settings": {"ann": cfg.ann, "ann_probe": cfg.ann_probe}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", type=Path, required=True, help="pairs DATA_DIR INDEX_DIR")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--reset", type=int, nargs="+", default=[100, 300], help="reset_passages values")
    ap.add_argument("--minmax", nargs="+", default=["global", "top"], choices=["global", "top"])
    ap.add_argument("--eps", type=float, nargs="+", default=[1e-4, 1e-5], help="ppr_eps values with a sparse reset")
    ap.add_argument("--eps-full", type=float, nargs="*", default=[], help="ppr_eps values with every passage in the reset")
    ap.add_argument("--ann", nargs="*", default=[], choices=["ivf", "ivfpq", "hnsw"],
                    help="also the local settings on these ANN stages (RetrievalConfig.ann; needs faiss)")
    ap.add_argument("--ann-probe", type=int, nargs="+", default=[RetrievalConfig().ann_probe], help="ann_probe values")
    ap.add_argument("--rerank", action="store_true", help="every setting with the learned reranker (the reference: "
                                                          "the exact mode with it)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", nargs="*", default=[], help="run only these settings (their printed names) and 'exact'")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if len(args.data) % 2:
        ap.error("--data takes pairs DATA_DIR INDEX_DIR")
    sets = [run_set(args.data[i], args.data[i + 1], args) for i in range(0, len(args.data), 2)]
    out = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__, "sets": sets,
           "command": "python -m benchmarks.local_ppr " + " ".join(argv or __import__("sys").argv[1:])}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
