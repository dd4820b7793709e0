"""Does `linearrag query INDEX --shards N` return what one process returns? Runs the command twice on the same
questions (one process, then N local processes), with the same flags (e.g. `--rerank`), and compares each
question's top-k passage ids, in order, and their scores; then runs `--shards N --explain` on a few questions
and checks that every explanation names the hits the search returned.

    python -m benchmarks.shards_agree --index DIR --questions questions.jsonl [--shards 2] [--top-k 5]
                                      [--flags=--rerank] [--json benchmarks/results/shards_agree_<name>.json]

The questions file is JSON lines with "question" (and optional "id"), as `linearrag query --questions` reads.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import machine


def query(index: str, questions: str, flags: list[str]) -> tuple[list[dict], float]:
    """One `linearrag query --json` run: its result lines and its wall seconds."""
    cmd = [sys.executable, "-m", "linearrag_torch.cli", "query", index, "--questions", questions, *flags]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], time.perf_counter() - t0


def hits_of(line: dict) -> list:
    return [h["id"] for h in line["hits"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, help="index folder")
    ap.add_argument("--questions", required=True, help='JSON lines with "question"')
    ap.add_argument("--shards", type=int, default=2, help="local processes of the sharded run (default %(default)s)")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--flags", default="", help="retrieval flags for both runs, written with = (--flags=--rerank)")
    ap.add_argument("--explain-questions", type=int, default=8, help="questions of the sharded --explain check")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    flags = ["--json", "--top-k", str(args.top_k), *shlex.split(args.flags)]
    one, one_s = query(args.index, args.questions, flags)
    sharded, sharded_s = query(args.index, args.questions, [*flags, "--shards", str(args.shards)])
    assert len(one) == len(sharded), (len(one), len(sharded))
    same = sum(hits_of(a) == hits_of(b) for a, b in zip(one, sharded))
    same_set = sum(set(hits_of(a)) == set(hits_of(b)) for a, b in zip(one, sharded))
    score_diff = max((abs(x["score"] - y["score"]) for a, b in zip(one, sharded)
                      for x, y in zip(a["hits"], b["hits"]) if x["id"] == y["id"]), default=0.0)
    differ = [{"question": a.get("question"), "one": hits_of(a), "sharded": hits_of(b)}
              for a, b in zip(one, sharded) if hits_of(a) != hits_of(b)]
    # --explain with --shards: one JSON line per question whose hits are the search's
    few = Path(args.json or "shards_agree").with_suffix(".explain_questions.jsonl")
    lines = Path(args.questions).read_text().splitlines()[:args.explain_questions]
    few.write_text("\n".join(lines) + "\n")
    try:
        explained, _ = query(args.index, str(few), [*flags[1:], "--explain", "--shards", str(args.shards)])
    finally:
        few.unlink()
    explain_ok = len(explained) == len(lines) and all(
        [h["id"] for h in e["hits"]] == hits_of(s) for e, s in zip(explained, sharded))
    result = {
        "date": _dt.date.today().isoformat(), "machine": machine(torch.device("cpu"), torch.get_num_threads()), "index": args.index,
        "questions": args.questions, "n_questions": len(one), "shards": args.shards, "top_k": args.top_k,
        "flags": args.flags, "same_top_k_in_order": same, "same_top_k_as_sets": same_set,
        "max_score_difference": score_diff, "differing": differ, "wall_s": {"one": round(one_s, 1),
                                                                              "sharded": round(sharded_s, 1)},
        "explain_with_shards": {"questions": len(lines), "hits_match_the_search": explain_ok},
    }
    print(f"{same} of {len(one)} questions: the same top {args.top_k} in the same order with --shards "
          f"{args.shards} {args.flags} (as sets: {same_set}); largest score difference {score_diff:.2e}; "
          f"--shards {args.shards} --explain on {len(lines)} questions: "
          f"{'its hits are the search' if explain_ok else 'MISMATCH'}; wall {one_s:.0f} s / {sharded_s:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if same == len(one) and explain_ok else 1


if __name__ == "__main__":
    sys.exit(main())
