"""Issue 50's targets, this code beside the issue-time code, in one run: the index command, the question path, the
reranker's cost.

    python -m benchmarks.cpu_targets --baseline-tree DIR --data DATA_DIR --index INDEX_DIR --json OUT [--png OUT]
                                     [--variant NAME=INDEX_FLAGS ...] [--label avx2|native] [--skip index ...]
    python -m benchmarks.cpu_targets plot RESULT.json [RESULT.json ...] OUT.png
    python -m benchmarks.cpu_targets --skip index --data DATA_DIR --index INDEX_DIR --json OUT --label avx2 \
        --rerank-variant NAME=FIELD=VALUE[,FIELD=VALUE]   # this code alone, rerank=True with other settings too

Every figure comes from a fresh process (``python -c``, PYTHONPATH = the code tree) so that the two codes never
share an interpreter: ``linearrag index DATA_DIR/corpus.jsonl OUT --quiet`` (wall clock of the whole command, with
each variant's extra index flags for this code), and on INDEX_DIR (an index both codes read) the question path end
to end (``rag.search(batch)``: ms per question, the best of 3 passes over 100 questions in batches of 100, and over
30 questions one at a time) and, end to end on a batch of 64 questions, the graph path (``rerank=False``)
against ``rerank=True`` (ms per question, best of 3), and ``rerank=True`` with each ``--rerank-variant``'s settings; the question path runs ``--rounds`` times per code, the codes
alternating, and each figure is the code's best. The code trees run alternately, baseline first.

The reference code itself is not run here (it is not part of this repository): issue 50 measured it on the same
kind of machine against the issue-time code (ratios 1.55x index / 15.6x batch 100 / 4.4x one question on an AVX2
EPYC; 3.47x / 15.1x / 5.2x on the Zen 4), so a ratio to the issue-time code measured here converts to one to the
reference code by those factors (REFERENCE_RATIOS).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the issue-time code against the reference code, issue 50's table (index command, batch 100, one question)
REFERENCE_RATIOS = {"avx2": {"index": 1.55, "batch100": 15.6, "batch1": 4.4},
                    "native": {"index": 3.47, "batch100": 15.1, "batch1": 5.2}}
AVX2_CAP = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}

QUESTION_PATH = r'''
import json, sys, time
from linearrag_torch import LinearRAG
from linearrag_torch.corpus import read_questions
index, qfile, quantize = sys.argv[1], sys.argv[2], sys.argv[3]
reranks = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
rag = LinearRAG.load(index, device="cpu", **({"quantize": quantize} if quantize != "none" else {}))
qs = [q["question"] if isinstance(q, dict) else q.question for q in read_questions(qfile)]
out = {}
def best(batch, n, **kw):
    pool = (qs * (1 + n // len(qs)))[:n]
    rag.search(pool[:batch], top_k=10, **kw)
    b = None
    for _ in range(3):
        t0 = time.perf_counter()
        for s in range(0, n, batch):
            rag.search(pool[s:s + batch], top_k=10, **kw)
        dt = time.perf_counter() - t0
        b = dt if b is None else min(b, dt)
    return 1000.0 * b / n
out["batch100_ms"] = best(100, 100)
out["batch1_ms"] = best(1, 30)
out["graph64_ms"] = best(64, 64, rerank=False)
out["rerank64_ms"] = best(64, 64, rerank=True)
for name, kw in reranks.items():
    out[f"rerank64_ms {name}"] = best(64, 64, rerank=True, **kw)
print("RESULT " + json.dumps(out))
'''


def run_code(tree: Path, args: list, env_extra: dict, code: str | None = None, timeout: int = 900):
    env = {**os.environ, **env_extra, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-c", code] + args if code else [sys.executable, "-m", "linearrag_torch.cli"] + args
    with tempfile.TemporaryDirectory(prefix="cpu_targets_") as cwd:
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
        sec = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{cmd[:4]} in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return sec, done


def plot(results: list, path: Path) -> None:
    """Each run's ratios to the reference code (index command, batch 100, one question) and the reranker's cost as a
    multiple of the graph path, beside issue 50's targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = {"avx2": {"index": 3, "batch100": 20, "batch1": 8, "rerank": 8},
               "native": {"index": 5, "batch100": 20, "batch1": 8, "rerank": 5}}
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.8), squeeze=False)
    for ax, r in zip(axes[0], results):
        bars, labels = [], []
        for key, v in r["ratios"].items():
            bars.append(v["vs_reference"])
            labels.append(key)
        for name, row in r["question_path"].items():
            for key in [k for k in row if k.startswith("rerank_over_graph")]:
                bars.append(row[key])
                labels.append(f"rerank / graph, {name}" + (f", {key.split(' ', 1)[1]}" if " " in key else ""))
        y = range(len(bars))
        ax.barh(list(y), bars, color=["tab:blue" if not lab.startswith("rerank") else "tab:orange" for lab in labels])
        for i, (b, lab) in enumerate(zip(bars, labels)):
            kind = "rerank" if lab.startswith("rerank") else lab.split(",")[0]
            t = targets[r["label"]].get(kind)
            ax.text(b, i, f" {b:.2f}x" + (f" (target {'<=' if kind == 'rerank' else '>='} {t}x)" if t else ""),
                    va="center", fontsize=7)
        ax.set_yticks(list(y), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("x the reference code (blue: higher is better); rerank / graph path (orange: lower)")
        ax.set_title(f"{r['label']} ({r['date'][:10]}), hotpotqa_train100", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "plot":  # python -m benchmarks.cpu_targets plot A.json ... OUT.png
        plot([json.loads(Path(f).read_text()) for f in sys.argv[2:-1]], Path(sys.argv[-1]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_targets", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-tree", type=Path, help="a checkout of the issue-time code (none: this code alone)")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="this code (default: here)")
    ap.add_argument("--data", type=Path, required=True, help="folder with corpus.jsonl and questions.jsonl")
    ap.add_argument("--index", type=Path, required=True, help="an index of that corpus, read by both codes")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="this code again with extra `linearrag index` flags (e.g. int8=--encoder-precision int8)")
    ap.add_argument("--quantize", action="append", default=[], metavar="NAME=QUANTIZE",
                    help="this code's question path again with LinearRAG.load(quantize=...)")
    ap.add_argument("--rerank-variant", action="append", default=[], metavar="NAME=FIELD=VALUE[,FIELD=VALUE]",
                    help="this code's batch of 64 again with rerank=True and these settings (e.g. "
                         "step16=rerank_length_step=16): rerank64_ms NAME, and its ratio to the graph path")
    ap.add_argument("--label", choices=("avx2", "native"), required=True,
                    help="avx2: run every process under the AVX2 caps (AVX2_CAP); native: as the CPU is")
    ap.add_argument("--rounds", type=int, default=2, help="question-path runs per code, alternating (best kept)")
    ap.add_argument("--skip", nargs="*", default=[], choices=("index", "questions"))
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    env_extra = AVX2_CAP if args.label == "avx2" else {}
    from benchmarks.rerank_loop import variants as rerank_variants

    try:
        search = {name: {k: v for k, v in cfg.to_dict().items() if k in changed}
                  for item in args.rerank_variant
                  for name, cfg in rerank_variants([item]).items()
                  for changed in [{part.split("=", 1)[0] for part in item.split("=", 1)[1].split(",") if part}]}
    except (ValueError, IndexError) as exc:
        ap.error(f"--rerank-variant: {exc}")
    res = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "label": args.label,
           "env": env_extra, "rerank_variants": search, "platform": platform.platform(), "cpu_count": os.cpu_count(),
           "baseline_tree": str(args.baseline_tree), "tree": str(args.tree), "data": str(args.data),
           "index": str(args.index), "reference_ratios_of_baseline": REFERENCE_RATIOS[args.label],
           "index_command_s": {}, "question_path": {}, "load": [os.getloadavg()]}
    base = [("baseline", args.baseline_tree, [])] if args.baseline_tree else []
    variants = base + [("this code", args.tree, [])] + [
        (v.split("=", 1)[0], args.tree, v.split("=", 1)[1].split()) for v in args.variant]
    if "index" not in args.skip:
        for name, tree, flags in variants:
            with tempfile.TemporaryDirectory(prefix="cpu_targets_idx_") as tmp:
                sec, done = run_code(tree, ["index", str(args.data / "corpus.jsonl"), str(Path(tmp) / "i"), "--quiet"]
                                     + flags, env_extra)
            res["index_command_s"][name] = {"seconds": round(sec, 2), "flags": flags,
                                            "stderr_tail": done.stderr.strip().splitlines()[-2:]}
            print(f"[{args.label}] index {name}: {sec:.1f} s  {done.stderr.strip().splitlines()[-1]}", flush=True)
    if "questions" not in args.skip:
        qruns = ([("baseline", args.baseline_tree, "none")] if args.baseline_tree else []) + [
            ("this code", args.tree, "none")] + [
            (q.split("=", 1)[0], args.tree, q.split("=", 1)[1]) for q in args.quantize]
        runs: dict = {}
        for rnd in range(args.rounds):  # the codes alternate, round by round; each keeps its best figure
            for name, tree, quantize in qruns:
                _, done = run_code(tree, [str(args.index), str(args.data / "questions.jsonl"), quantize]
                                   + ([json.dumps(search)] if search and name == "this code" else []), env_extra,
                                   code=QUESTION_PATH)
                got = json.loads(done.stdout.split("RESULT ", 1)[1])
                runs.setdefault(name, []).append(got)
                print(f"[{args.label}] questions {name}, round {rnd + 1}: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
        for name, got in runs.items():
            row = {k: min(g[k] for g in got) for k in got[0]}
            row["rerank_over_graph"] = row["rerank64_ms"] / row["graph64_ms"]
            for k in [k for k in row if k.startswith("rerank64_ms ")]:
                row[f"rerank_over_graph {k.split(' ', 1)[1]}"] = row[k] / row["graph64_ms"]
            row["rounds"] = got
            res["question_path"][name] = row
    res["load"].append(os.getloadavg())
    ratios = {}
    base = res["index_command_s"].get("baseline")
    for name, row in res["index_command_s"].items():
        if base and name != "baseline":
            x = base["seconds"] / row["seconds"]
            ratios[f"index, {name}"] = {"vs_issue_time_code": round(x, 3),
                                        "vs_reference": round(x * REFERENCE_RATIOS[args.label]["index"], 2)}
    qb = res["question_path"].get("baseline")
    for name, row in res["question_path"].items():
        if qb and name != "baseline":
            for k in ("batch100", "batch1"):
                x = qb[f"{k}_ms"] / row[f"{k}_ms"]
                ratios[f"{k}, {name}"] = {"vs_issue_time_code": round(x, 3),
                                          "vs_reference": round(x * REFERENCE_RATIOS[args.label][k], 2)}
    res["ratios"] = ratios
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1))
    print(json.dumps(ratios, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
