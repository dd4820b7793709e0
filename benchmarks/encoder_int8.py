"""Retrieval quality of the int8 and bf16 question encoders beside the exact float32 one, on several dev sets.

    python -m benchmarks.encoder_int8 --set NAME INDEX_DIR QUESTIONS.jsonl [--set ...] --json OUT
                                      [--variants exact int8 int8-all bfloat16] [--threads N] [--limit N]
                                      [--override FIELD=VALUE ...]

For each set and encoder (``LinearRAG.load(..., quantize=...)``; the index and spaCy model are shared)
all questions are encoded and ranked in batches of 64 with the index's stored retrieval settings
(changed by ``--override``, e.g. chain_passages=0; the JSON records them) and top_k = 10: recall@2/5/10 (per question |gold ∩ top-k| / |gold|, gold = supporting_ids, averaged),
how many questions keep the exact path's top-5 (as a list) and top-10 (as a set), the cosine of
each question vector with the exact one, and the encoder stage's ms per question.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.common import setting_overrides  # noqa: E402
from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402

KS = (2, 5, 10)
BATCH = 64


def rank(rag: LinearRAG, questions: list, cfg):
    """(top-10 passage ids per question, question vectors, stage timings in seconds)."""
    t: dict = {}
    ids, qv = [], []
    for s in range(0, len(questions), BATCH):
        enc = rag.encode_queries(questions[s:s + BATCH], cfg, timings=t)
        out = rag.retrieve(enc, cfg, timings=t)
        qv.append(enc.query_emb.cpu())
        ids += [[str(rag.index.passage_ids[i]) for i in row if i >= 0] for row in out.indices.tolist()]
    return ids, torch.cat(qv), t


def run_set(name: str, index: Path, qfile: Path, variants: list, limit: int | None, overrides: dict) -> dict:
    items = read_questions(qfile)
    if limit:
        items = items[:limit]
    questions = [it["question"] for it in items]
    gold = [{str(g) for g in it.get("supporting_ids") or []} for it in items]
    base = LinearRAG.load(index, device="cpu")
    cfg = base.config.replace(top_k=10, **overrides)
    res = {"index": str(index), "questions_file": str(qfile), "questions": len(items),
           "with_gold": sum(1 for g in gold if g), "config": dataclasses.asdict(cfg),
           "variants": {}}
    exact_ids = exact_q = None
    for v in variants:
        rag = base if v == "exact" else LinearRAG(base.index, "cpu", nlp=base.nlp, quantize=v)
        rank(rag, questions[:4], cfg)  # warm-up
        ids, qv, t = rank(rag, questions, cfg)
        if exact_ids is None:
            exact_ids, exact_q = ids, qv
        row = {}
        for k in KS:
            vals = [len(g.intersection(r[:k])) / len(g) for g, r in zip(gold, ids) if g]
            row[f"recall@{k}"] = 100.0 * sum(vals) / len(vals) if vals else None
        row["same_top5_list"] = sum(a[:5] == b[:5] for a, b in zip(ids, exact_ids))
        row["same_top10_set"] = sum(set(a) == set(b) for a, b in zip(ids, exact_ids))
        cos = (qv * exact_q).sum(1)
        row["question_cosine_mean"], row["question_cosine_min"] = float(cos.mean()), float(cos.min())
        row["encoder_ms_per_question"] = 1000.0 * t.get("encoder", 0.0) / len(questions)
        row["end_to_end_stages_ms_per_question"] = 1000.0 * sum(t.values()) / len(questions)
        res["variants"][v] = row
        print(f"{name:<20} {v:<9} " + "  ".join(f"R@{k} {row[f'recall@{k}']:5.1f}" for k in KS if row[f"recall@{k}"] is not None)
              + f"  same top-5 {row['same_top5_list']}/{len(items)}  cos mean {row['question_cosine_mean']:.4f}"
              f" min {row['question_cosine_min']:.4f}  encoder {row['encoder_ms_per_question']:.2f} ms/q", flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", nargs=3, action="append", required=True, metavar=("NAME", "INDEX_DIR", "QUESTIONS"),
                    help="a dev set: its name, index folder and questions file (repeat for several)")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--variants", nargs="+", default=["exact", "int8", "int8-all"],
                    choices=("exact", "int8", "int8-all", "bfloat16"),
                    help="encoders (LinearRAG quantize=...; the first one is the reference). bfloat16 runs in "
                         "bf16 only where the CPU has it natively, else float32 with a warning")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--limit", type=int, help="only the first N questions of each set")
    ap.add_argument("--override", nargs="+", default=[], metavar="FIELD=VALUE",
                    help="retrieval settings to change (VALUE as JSON: chain_passages=0, mode=\"paper\")")
    args = ap.parse_args(argv)
    overrides = setting_overrides(args.override, "--override", ap.error)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(), "top_k": 10, "batch": BATCH, "overrides": overrides, "units": {
               "recall@k": "% (mean over questions with gold)", "encoder_ms_per_question": "ms, noisy (shared CPU)"},
           "sets": {}}
    for name, index, qfile in args.set:
        out["sets"][name] = run_set(name, Path(index), Path(qfile), args.variants, args.limit, overrides)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
