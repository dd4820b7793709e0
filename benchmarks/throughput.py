"""Milliseconds per question of the whole question path, stage by stage, at several batch sizes.

    python -m benchmarks.throughput --index DIR --questions FILE.jsonl [FILE ...] --json OUT [--png OUT]
                                    [--batch-sizes 1 8 64 256] [--onnx] [--bf16] [--int8] [--threads N] ...

Each batch goes through ``rag.search(batch, timings=t)``: the stages are the library's own
(linearrag_torch.retrieval.pipeline.STAGES: ner, lexicon, encoder, graph), "end_to_end" is the wall time of the
search calls (stages plus input checks and hit lists). Each batch size times the first
``max(batch, --min-questions)`` distinct questions of the files (recycled, and reported as fewer
``unique_questions``, when there are not enough: the encoder encodes a repeated question once, so
repeats flatter it); one batch is run first as a warm-up (models loaded, index prepared). The exact float32 encoder always runs; ``--onnx`` adds it on
ONNX Runtime (``encoder_backend="onnx"``), ``--bf16`` the bf16-autocast
question encoder (``quantize="bfloat16"``), ``--int8`` the int8 encoder (``LinearRAG.load(..., quantize="int8")``) and ``--no-reuse`` the path that encodes every entity string
again instead of taking the index's stored vectors; ``--ner-processes N`` the exact (and bf16) path again with
spaCy NER in N worker processes.

Each row's encoder stage is set against the machine's limit (``encoder_vs_peak``, benchmarks/arithmetic.py): the
questions' FLOPs over the stage's time, against a matmul peak of the transformer's shapes in its precision.

The graph stage alone is timed at ``--graph-batch-sizes`` (default 1 64 1024 4096) on questions encoded once
(tiled to the batch size when there are fewer): ms per question, and from one traced call per batch size
what the batch asked of Python (engine.Trace.host_reads: values read back to the host; Trace.torch_calls:
torch calls, which grow with the PageRank's steps but not with the batch when no step runs per question).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks import arithmetic  # noqa: E402
from benchmarks.common import tile_queries  # noqa: E402

from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.retrieval import engine  # noqa: E402
from linearrag_torch.retrieval.pipeline import STAGES  # noqa: E402
from linearrag_torch.runtime.tracing import StageTimings  # noqa: E402

COLUMNS = STAGES + ("end_to_end",)


def load_avg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(rag: LinearRAG, questions: list, batch: int, n: int, repeat: int, clock: str = "wall") -> dict:
    """ms per question of each stage and end to end over ``n`` questions in batches of ``batch``
    (the fastest of ``repeat`` passes, by end-to-end time), by the wall or the process CPU clock."""
    pool = (questions * (1 + n // len(questions)))[:n]
    rag.search(pool[:batch], top_k=10)  # warm-up at this batch size
    best = None
    tick = CLOCKS[clock]
    for _ in range(repeat):
        t = StageTimings(tick)
        t0 = tick()
        for s in range(0, n, batch):
            rag.search(pool[s:s + batch], top_k=10, timings=t)
        t["end_to_end"] = tick() - t0
        if best is None or t["end_to_end"] < best["end_to_end"]:
            best = t
    return {c: 1000.0 * best.get(c, 0.0) / n for c in COLUMNS}


def measure_graph(rag: LinearRAG, questions: list, batches: list, repeat: int, min_questions: int,
                  clock: str = "wall") -> list:
    """The graph stage alone (rag.retrieve on encoded questions) per batch size: ms per question over
    max(batch, min_questions) questions (the fastest of ``repeat`` passes), and one traced batch's host reads
    and torch calls (engine.Trace)."""
    cfg = rag.config.replace(top_k=10)
    encoded = rag.encode_queries(questions, cfg)
    tick = CLOCKS[clock]
    rows = []
    for b in batches:
        n = max(b, min_questions)
        pool = tile_queries(encoded, n)
        chunks = [pool.slice(s, min(s + b, n)) for s in range(0, n, b)]
        rag.retrieve(chunks[0], cfg)  # warm-up at this batch size
        best = None
        for _ in range(repeat):
            t0 = tick()
            for chunk in chunks:
                rag.retrieve(chunk, cfg)
            el = tick() - t0
            best = el if best is None else min(best, el)
        _, tr = engine.retrieve(rag.graph, chunks[0], cfg, trace=True)
        # (None: a package from before the counters, timed with this script beside it)
        reads, calls = getattr(tr, "host_reads", None), getattr(tr, "torch_calls", None)
        rows.append({"batch": b, "questions": n, "unique_questions": min(n, len(questions)),
                     "graph_ms_per_question": 1000.0 * best / n, "questions_per_s": n / best if best else None,
                     "host_reads_per_batch": reads, "torch_calls_per_batch": calls})
        print(f"graph stage     batch {b:>4}: {1000.0 * best / n:8.3f} ms/question  ({reads} host reads, "
              f"{calls} torch calls per batch)", flush=True)
    return rows


_PEAKS: dict = {}


def encoder_vs_peak(encoder, questions: list, encoder_ms: float) -> dict:
    """The encoder stage against the machine's limit (benchmarks/arithmetic.py): the FLOPs of the questions
    themselves (their entity strings mostly take the index's stored vectors: a lower bound of the stage's work)
    per question over the stage's ms per question, against the matmul peak of the transformer's shapes in the
    encoder's precision, measured once here."""
    layers, hidden, inter = arithmetic.model_shape(encoder)
    precision = encoder.precision if encoder.precision in ("bfloat16", "int8") else "float32"
    if getattr(encoder, "quantize", None) == "int8-all":
        precision = "int8"
    if precision not in _PEAKS:
        _PEAKS[precision] = arithmetic.matmul_peak(precision, hidden, inter)
    lens = arithmetic.token_lengths(encoder.tokenizer, questions, encoder.max_length)
    flops = arithmetic.encoder_flops(lens, layers, hidden, inter) / len(lens)
    rate = flops / (encoder_ms / 1000.0)
    return {"question_gflop": round(flops / 1e9, 4), "gflops_lower_bound": round(rate / 1e9, 2),
            "matmul_peak_gflops": round(_PEAKS[precision] / 1e9, 2), "peak_precision": precision,
            "fraction_of_peak_lower_bound": round(rate / _PEAKS[precision], 3)}


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    questions = list(dict.fromkeys(q["question"] for f in args.questions for q in read_questions(f)))
    if args.limit:
        questions = questions[:args.limit]
    variants = [("exact", {}, {})]
    if args.no_reuse:
        variants.append(("exact_no_reuse", {}, {"reuse": False}))
    if args.bf16:
        variants.append(("bfloat16", {"quantize": "bfloat16"}, {}))
    if args.onnx:
        variants.append(("onnx", {"encoder_backend": "onnx"}, {}))
    if args.int8:
        variants.append(("int8", {"quantize": "int8"}, {}))
    if args.ner_processes:  # the exact (and bf16) path again with NER in worker processes
        k = args.ner_processes
        variants += [(f"{name}+ner{k}", kw, {**opts, "ner_processes": k}) for name, kw, opts in list(variants)
                     if name in ("exact", "bfloat16")]
    result = {
        "index": str(args.index), "questions_files": [str(f) for f in args.questions], "questions": len(questions),
        "batch_sizes": args.batch_sizes, "device": args.device, "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "load_avg_start": load_avg(), "clock": args.clock, "stages": list(COLUMNS), "rows": [],
        "units": "ms per question" + (" (process CPU time)" if args.clock == "cpu" else " (wall time)"),
    }
    if args.graph_batch_sizes:
        rag = LinearRAG.load(args.index, device=args.device)
        result["graph_batch_sizes"] = args.graph_batch_sizes
        result["graph_rows"] = measure_graph(rag, questions, args.graph_batch_sizes, args.repeat, args.min_questions,
                                             args.clock)
        rag.close()
        del rag
    for name, load_kw, opts in variants:
        rag = LinearRAG.load(args.index, device=args.device, **load_kw)
        if opts.get("reuse") is False:
            rag.reuse_index_vectors = False
        if opts.get("ner_processes"):
            rag.start_ner_processes(opts["ner_processes"])
        for b in args.batch_sizes:
            n = max(b, args.min_questions)
            ms = measure(rag, questions, b, n, args.repeat, args.clock)
            if n > len(questions):
                print(f"warning: batch {b} times {n} questions, {len(questions)} distinct", file=sys.stderr)
            row = {"encoder": name, "precision": getattr(rag.encoder, "precision", None), "batch": b, "questions": n,
                   "unique_questions": min(n, len(questions)), "ms_per_question": ms,
                   "questions_per_s": 1000.0 / ms["end_to_end"] if ms["end_to_end"] else None}
            if ms.get("encoder") and hasattr(rag.encoder, "model"):
                row["encoder_vs_peak"] = encoder_vs_peak(rag.encoder, questions[:min(b, len(questions))],
                                                         ms["encoder"])
            result["rows"].append(row)
            print(f"{name:<15} batch {b:>4}: " + "  ".join(f"{c} {ms[c]:7.2f}" for c in COLUMNS) + "  ms/question",
                  flush=True)
        rag.close()
        del rag
    result["load_avg_end"] = load_avg()
    return result


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(r["encoder"] for r in result["rows"]))
    sizes = result["batch_sizes"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(sizes) * len(variants)), 4.5))
    width = 0.8 / len(variants)
    colors = dict(zip(STAGES, ("#4c72b0", "#55a868", "#c44e52", "#8172b2")))
    for v, name in enumerate(variants):
        rows = {r["batch"]: r for r in result["rows"] if r["encoder"] == name}
        xs = [i + (v - (len(variants) - 1) / 2) * width for i in range(len(sizes))]
        bottom = [0.0] * len(sizes)
        for st in STAGES:
            h = [rows[b]["ms_per_question"][st] for b in sizes]
            ax.bar(xs, h, width * 0.9, bottom=bottom, color=colors[st], label=st if v == 0 else None,
                   hatch=None if v == 0 else "//", edgecolor="white")
            bottom = [a + b for a, b in zip(bottom, h)]
        for x, b in zip(xs, sizes):
            e2e = rows[b]["ms_per_question"]["end_to_end"]
            ax.text(x, e2e, f"{e2e:.1f}\n{name}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(sizes)), [f"batch {b}" for b in sizes])
    ax.set_ylabel("ms per question" + (" (CPU time)" if result.get("clock") == "cpu" else ""))
    ax.set_title(f"Question path by stage ({Path(result['index']).name}, torch threads: {result['torch_threads']})")
    ax.legend(title="stage")
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def plot_graph(result: dict, png: Path) -> None:
    """The graph stage alone (``graph_rows``): ms per question by batch size, host reads per batch on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["graph_rows"]
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    xs = range(len(rows))
    ax.bar(xs, [r["graph_ms_per_question"] for r in rows], 0.6, color="#4c72b0")
    for x, r in zip(xs, rows):
        reads = r.get("host_reads_per_batch")
        ax.text(x, r["graph_ms_per_question"], f"{r['graph_ms_per_question']:.2f} ms"
                + (f"\n{reads} host reads" if reads is not None else ""), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"batch {r['batch']}" for r in rows])
    ax.set_ylabel("graph stage, ms per question")
    ax.set_title(f"Graph stage alone ({Path(result['index']).name}, torch threads: {result['torch_threads']})")
    ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="index folder (LinearRAG.save)")
    ap.add_argument("--questions", type=Path, nargs="+", required=True,
                    help='JSON lines with "question" (several files: their distinct questions in order)')
    ap.add_argument("--json", type=Path, required=True, help="write the numbers here")
    ap.add_argument("--png", type=Path, help="write the stage plot here (default: next to --json)")
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8, 64, 256],
                    help="batch sizes of the whole question path (none: only the graph stage alone)")
    ap.add_argument("--graph-batch-sizes", type=int, nargs="*", default=[1, 64, 1024, 4096],
                    help="batch sizes of the graph stage timed alone (none: skip it)")
    ap.add_argument("--min-questions", type=int, default=64,
                    help="questions timed per batch size: max(batch, this) (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="passes per batch size; the fastest counts")
    ap.add_argument("--limit", type=int, help="only the first N questions of the file")
    ap.add_argument("--int8", action="store_true", help="also time the int8 encoder")
    ap.add_argument("--onnx", action="store_true",
                    help="also time the float32 question encoder on ONNX Runtime (encoder_backend='onnx', extra [onnx])")
    ap.add_argument("--bf16", action="store_true",
                    help="also time the bf16-autocast question encoder (quantize='bfloat16': faster where the CPU "
                         "has AMX, scores depend on the batch by ~1e-4)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="also time the path that encodes every entity string (no stored index vectors)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                    help="wall time, or the process's CPU time (steadier on shared cores; counts every thread)")
    ap.add_argument("--ner-processes", type=int, default=0,
                    help="also time the exact (and --bf16) path with NER in this many worker processes "
                         "(LinearRAG.start_ner_processes); wall clock only")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.ner_processes and args.clock == "cpu":
        ap.error("--ner-processes needs --clock wall: this process's CPU time leaves out the worker processes'")
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    png = args.png or args.json.with_suffix(".png")
    if result["rows"]:
        plot(result, png)
        print(f"wrote {args.json} and {png}", file=sys.stderr)
    elif result.get("graph_rows"):
        plot_graph(result, png)
        print(f"wrote {args.json} and {png}", file=sys.stderr)
    else:
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
