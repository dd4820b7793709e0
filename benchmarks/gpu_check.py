"""One-shot check of the CUDA path, written to finish within 8 minutes on one NVIDIA H200.

    python benchmarks/gpu_check.py [--json benchmarks/results/gpu_check.json] [--budget-s 420]
    python benchmarks/gpu_check.py --device cpu --smoke      # the same code on tiny sizes, on the CPU
    python benchmarks/gpu_check.py --sections graph --index DIR --questions FILE.jsonl   # one section only

Sections (each one recorded in the JSON, an error in one does not stop the others):
1. bandwidth  device-to-device copy of 1 GiB, in GB/s (read + write), the yardstick for what follows;
2. agreement  the engine on the device against the CPU scipy reference (and the CPU torch engine) on
              a mid-size random graph with fresh random inputs (seed in the JSON): top-k agreement and
              relative error of the scores, both activation modes, Triton kernels and torch fallbacks;
3. kernels    benchmarks/fused_ops.py's cases on the device: each fused op against the unfused torch;
4. timing     the query path at several sizes x batch sizes, CUDA events after a warm-up, with the
              PageRank steps' modeled memory traffic / their time as achieved bandwidth; the exact walk, and
              where ppr_mode auto takes the local push (ppr_local_from; the smoke run: every size) that too,
              so that a device's crossover can be read off (the threshold was measured on CPUs);
5. questions  the whole question path (spaCy NER on the CPU, the encoder and the graph on the device) on a
              real index built there from --corpus (default: the bundled demo corpus; pass the 2wiki
              corpus.jsonl and questions.jsonl when they were carried along) or loaded from --index:
              questions/s end to end and per stage at several batch sizes, and top-k against the same index
              searched on the CPU;
6. graph      the graph stage alone on that index (questions encoded once, tiled to the batch size), default
              settings: questions/s at batch 1 / 64 / 1,024 / 4,096 (issue 27 aims at >= 50,000 at 1,024 on
              2wiki), the host reads and torch calls of one batch (engine.Trace), and on CUDA the batch of 1,024
              once more under torch.cuda.set_sync_debug_mode: "warn" lists every synchronizing operation by
              source line, "error" names the first (the PageRank's convergence test reads one value per step,
              so "error" stops there at the latest; ops whose output size depends on the data, such as
              nonzero and unique, wait for the device too).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# run as a script from anywhere: the repository root first, and not this folder (which Python puts first for a
# script): a module here must never stand in for an installed package of the same name
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import StepMeter, kernel_backends, log, make_graph, sync, tile_queries, timed  # noqa: E402
from benchmarks.fused_ops import run_cases  # noqa: E402
from linearrag_torch.retrieval import scipy_backend  # noqa: E402
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve  # noqa: E402
from linearrag_torch.kernels.backends import kernels_mode, triton_available  # noqa: E402
from linearrag_torch.synthetic import random_queries  # noqa: E402

DATE = "2026-11-30"
FULL = {"copy_bytes": 1 << 30, "agree_passages": 50_000, "agree_batch": 64, "kernel_passages": 1_000_000,
        "kernel_batch": 256, "argmax_size": 1 << 24, "sizes": [100_000, 1_000_000, 3_000_000], "batches": [1, 64, 1024],
        "local_from": None, "question_passages": None, "question_batches": [1, 64, 256, 1024], "question_ner_processes": None,
        "graph_batches": [1, 64, 1024, 4096]}
SMOKE = {"copy_bytes": 1 << 24, "agree_passages": 1_500, "agree_batch": 8, "kernel_passages": 3_000,
         "kernel_batch": 8, "argmax_size": 1 << 15, "sizes": [2_000, 6_000], "batches": [1, 8],
         "local_from": 0, "question_passages": 25, "question_batches": [1, 16], "question_ner_processes": 1,
         "graph_batches": [1, 16]}


SECTIONS = ("bandwidth", "agreement", "kernels", "timing", "questions", "graph")


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)


# ----------------------------------------------------------------------------------------- 1. bandwidth
def copy_bandwidth(device, nbytes: int) -> dict:
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), device, repeat=10)
    return {"bytes": nbytes, "ms": ms, "GB_per_s": 2 * nbytes / ms / 1e6}  # each byte read once, written once


# ----------------------------------------------------------------------------------------- 2. agreement
def compare(got, want) -> dict:
    gi, gs = got.indices.cpu().numpy(), got.scores.cpu().double().numpy()
    wi, ws = want.indices.cpu().numpy(), want.scores.cpu().double().numpy()
    rel = np.abs(gs - ws) / np.maximum(np.abs(ws), 1e-12)
    same_order = (gi == wi).all(axis=1)
    same_set = np.array([set(a) == set(b) for a, b in zip(gi, wi)])
    return {"questions": int(len(gi)), "top_k_same_order": float(same_order.mean()),
            "top_k_same_set": float(same_set.mean()), "max_rel_err_scores": float(rel.max()) if rel.size else 0.0,
            "median_rel_err_scores": float(np.median(rel)) if rel.size else 0.0}


def agreement(device, P: int, B: int, seed: int) -> dict:
    index, _ = make_graph(P, 64, "cpu", seed=seed)
    queries = random_queries(index, B, seed=seed + 1)
    out = {"passages": P, "batch": B, "seed": seed, "entities": index.num_entities, "sentences": index.num_sentences}
    dev_graph, cpu_graph = DeviceGraph(index, device), DeviceGraph(index, "cpu")
    for mode in ("reference", "paper"):
        cfg = RetrievalConfig(mode=mode, delta=0.25, top_k=10)
        want = scipy_backend.retrieve(index, queries, cfg)
        cpu = retrieve(cpu_graph, queries, cfg)
        res = {"device_vs_scipy": compare(retrieve(dev_graph, queries, cfg), want),
               "cpu_torch_vs_scipy": compare(cpu, want)}
        if device.type == "cuda":
            with kernels_mode("torch"):
                res["device_torch_fallback_vs_scipy"] = compare(retrieve(dev_graph, queries, cfg), want)
            res["device_vs_cpu_torch"] = compare(retrieve(dev_graph, queries, cfg), cpu)
        out[mode] = res
    # the local PageRank: on a GPU the push's torch table, on the CPU (with numba) its compiled loop: the same
    # pushes in the same rounds (kernels/push.py), so the two must agree as closely as the exact walks do
    cfg = RetrievalConfig(delta=0.25, top_k=10, ppr_mode="local", reset_passages=min(200, P), ppr_eps=1e-5)
    out["local"] = {"device_vs_cpu": compare(retrieve(dev_graph, queries, cfg), retrieve(cpu_graph, queries, cfg))}
    worst = max(r["max_rel_err_scores"] for m in ("reference", "paper", "local") for r in out[m].values())
    # ids may differ where scores tie within float error; the scores themselves must agree
    out["ok"] = bool(worst < 1e-3)
    out["worst_max_rel_err"] = worst
    return out


# ----------------------------------------------------------------------------------------- 4. timing


def timing(device, sizes, batches, clock: Clock, copy_gbs: float, log, local_from: int | None = None) -> list:
    rows = []
    exact = RetrievalConfig(ppr_mode="exact")
    auto = RetrievalConfig() if local_from is None else RetrievalConfig(ppr_local_from=local_from)
    last_cost, last_P = None, None
    for P in sizes:
        # the cost grows about linearly with size: skip a size that cannot finish in the time left
        if last_cost is not None and clock.left() < 1.3 * last_cost * P / last_P:
            rows.append({"passages": P, "skipped": f"not enough time left ({clock.left():.0f} s)"})
            log(f"  {P:>9,} passages: skipped (time)")
            continue
        t0 = time.perf_counter()
        index, graph = make_graph(P, 64, device)
        sync(device)
        build_s = time.perf_counter() - t0
        modes = [("exact", exact)] + ([("auto", auto)] if auto.for_corpus(P).ppr_mode == "local" else [])
        for B, (mode, cfg) in [(B, m) for B in batches for m in modes]:
            q = random_queries(index, B, seed=B).to(device)
            retrieve(graph, random_queries(index, 2, seed=7), cfg)  # warm-up: Triton compilation, allocator
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            meter = StepMeter(device)  # the PageRank steps of the timed calls, summed as each call ends
            calls = 3 if B < 1024 else 1
            ms = timed(lambda: meter.add(retrieve(graph, q, cfg, trace="steps")[1]), device, repeat=calls)
            ppr_ms = meter.ms() / (calls + 1)  # timed() also runs one warm-up call
            ppr_bytes = meter.bytes / (calls + 1)
            r = {"passages": P, "entities": index.num_entities, "batch": B, "mode": mode,
                 "ppr_mode_run": cfg.for_corpus(P).ppr_mode, "build_s": build_s, "ms_per_call": ms,
                 "queries_per_s": B / ms * 1e3, "ppr_steps_per_call": meter.calls / (calls + 1),
                 "ppr_ms_per_call": ppr_ms, "ppr_modeled_bytes_per_call": ppr_bytes,
                 "ppr_GB_per_s": ppr_bytes / ppr_ms / 1e6 if ppr_ms else None,
                 "questions_per_chunk": graph.questions_per_chunk(None, cfg)}
            r["ppr_fraction_of_copy_bw"] = r["ppr_GB_per_s"] / copy_gbs if r["ppr_GB_per_s"] and copy_gbs else None
            if device.type == "cuda":
                r["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device)
            rows.append(r)
            log(f"  {P:>9,} passages batch {B:>5} {mode:>5}: {r['queries_per_s']:10.1f} q/s, PPR {ppr_ms:8.1f} ms "
                f"({r['ppr_GB_per_s'] or 0:.0f} GB/s modeled, {100 * (r['ppr_fraction_of_copy_bw'] or 0):.0f}% of copy)")
        last_cost, last_P = time.perf_counter() - t0, P
        del index, graph
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def open_index(device, index_dir, corpus, questions_file, max_passages, log):
    """(rag, questions, build info) of sections 5 and 6: the saved index ``index_dir`` loaded on the device, or
    ``corpus`` indexed with the device's encoder and spaCy NER in one process per core (issue 12)."""
    from linearrag_torch import LinearRAG
    from linearrag_torch.indexing.build import build_index
    from linearrag_torch.config import IndexConfig
    from linearrag_torch.corpus import read_corpus, read_questions

    qs = [q["question"] for q in read_questions(questions_file)]
    if index_dir is not None:
        t = time.perf_counter()
        rag = LinearRAG.load(index_dir, device=str(device))
        log(f"  loaded {index_dir} ({rag.index.num_passages} passages) in {time.perf_counter() - t:.1f} s")
        return rag, qs, {"passages": rag.index.num_passages, "index": str(index_dir)}
    passages = read_corpus(corpus)[:max_passages] if max_passages else read_corpus(corpus)
    cores = os.cpu_count() or 1
    stages: dict = {}
    t = time.perf_counter()
    rag = LinearRAG(build_index(passages, IndexConfig(n_process=cores), device=str(device), progress=False,
                                timings=stages), device)
    build_s = time.perf_counter() - t
    log(f"  indexed {len(passages)} passages on {device} in {build_s:.1f} s ({len(passages) / build_s:.1f} passages/s, "
        f"NER in {cores} processes: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()) + ")")
    return rag, qs, {"passages": len(passages), "build_s": build_s, "passages_per_s": len(passages) / build_s,
                     "ner_processes": cores, "build_stages_s": stages}


def question_path(device, real_index, batches, log, workers=None) -> dict:
    """Section 5: rag.search end to end and by stage (wall time, synchronised) at each batch size on the index of
    ``real_index()`` (open_index's answer); top-k of the device against the CPU on that index."""
    from linearrag_torch import LinearRAG
    from linearrag_torch.runtime.tracing import StageTimings

    rag, qs, info = real_index()
    cores = os.cpu_count() or 1
    rag.search(qs[:8])  # warm-up: models, PageRank operator, kernels

    def time_batches(sizes, label=""):
        rows = []
        for b in sizes:
            batch = [qs[i % len(qs)] for i in range(b)]
            rag.search(batch)
            timings = StageTimings()
            reps = max(1, min(20, 1024 // b))
            sync(device)
            t = time.perf_counter()
            for _ in range(reps):
                rag.search(batch, timings=timings)
            sync(device)
            el = (time.perf_counter() - t) / reps
            rows.append({"batch": b, "ms_per_question": 1000 * el / b, "questions_per_s": b / el,
                         **{f"{k}_ms_per_question": 1000 * v / reps / b for k, v in timings.items()}})
            log(f"  batch {b:5d}{label}: {b / el:9.1f} questions/s  " +
                "  ".join(f"{k} {1000 * v / reps / b:.2f}" for k, v in timings.items()) + " ms/question")
        return rows

    rows = time_batches(batches)
    # the question path's NER on one core bounds questions/s; the largest batches again with it split over
    # ``workers`` worker processes (LinearRAG.start_ner_processes; None: up to 8, leaving two cores to this one)
    workers = max(0, min(8, cores - 2)) if workers is None else workers
    rows_workers = []
    if workers:
        rag.start_ner_processes(workers)
        try:
            rows_workers = time_batches(batches[-2:], f", NER in {workers} processes")
        finally:
            rag.close()
    n = min(len(qs), 256)
    on_device = rag.search(qs[:n])
    cpu = LinearRAG(rag.index, "cpu").search(qs[:n])
    same = sum([h.id for h in a] == [h.id for h in c] for a, c in zip(on_device, cpu))
    return {**info, "rows": rows, "top_k_same_as_cpu": same, "compared": n, "question_ner_processes": workers,
            "rows_question_ner_processes": rows_workers}


def graph_stage(device, rag, questions: list, batches: list, log) -> dict:
    """Section 6: the graph stage alone (engine.retrieve on questions encoded once) at each batch size, default
    settings with top_k 10: questions/s (synchronised wall time, the best of a few calls), the host reads and
    torch calls of one traced batch, and on CUDA the synchronizing operations of the largest batch at most
    1,024 under torch.cuda.set_sync_debug_mode."""
    import warnings

    from linearrag_torch.retrieval import engine

    cfg = rag.config.replace(top_k=10)
    encoded = rag.encode_queries(questions, cfg).to(device)
    rows = []
    for b in batches:
        batch = tile_queries(encoded, b)
        engine.retrieve(rag.graph, batch, cfg)  # warm-up at this size
        reps = max(1, min(10, 4096 // b))
        best = None
        for _ in range(reps):
            sync(device)
            t = time.perf_counter()
            engine.retrieve(rag.graph, batch, cfg)
            sync(device)
            el = time.perf_counter() - t
            best = el if best is None else min(best, el)
        _, tr = engine.retrieve(rag.graph, batch, cfg, trace=True)
        rows.append({"batch": b, "questions_per_s": b / best, "ms_per_question": 1000 * best / b,
                     "host_reads_per_batch": tr.host_reads, "torch_calls_per_batch": tr.torch_calls})
        log(f"  graph stage batch {b:5d}: {b / best:10.1f} questions/s ({tr.host_reads} host reads, "
            f"{tr.torch_calls} torch calls per batch)")
    out = {"passages": rag.index.num_passages, "distinct_questions": len(questions), "rows": rows}
    if device.type != "cuda":
        return out
    b = max([x for x in batches if x <= 1024] or batches[:1])
    batch = tile_queries(encoded, b)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.retrieve(rag.graph, batch, cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites: dict = {}
    for w in caught:
        if "synchroniz" in str(w.message):
            key = f"{Path(w.filename).name}:{w.lineno}"
            sites[key] = sites.get(key, 0) + 1
    first_error = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        engine.retrieve(rag.graph, batch, cfg)
    except RuntimeError as exc:
        import traceback

        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "linearrag_torch" in f.filename]
        first_error = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].line})" if frames else str(exc)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out["sync_debug"] = {"batch": b, "synchronizing_ops": sum(sites.values()),
                         "by_line": dict(sorted(sites.items(), key=lambda kv: -kv[1])), "first_error": first_error}
    log(f"  batch {b}: {sum(sites.values())} synchronizing operations at {len(sites)} lines; "
        f"'error' mode stops at {first_error}")
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): a test of the script itself")
    ap.add_argument("--json", type=Path, default=None, help="default benchmarks/results/gpu_check[_smoke].json")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new work after this long")
    ap.add_argument("--seed", type=int, default=None, help="seed of the agreement check (default: fresh)")
    data = Path(__file__).resolve().parents[1] / "linearrag_torch" / "data"
    ap.add_argument("--corpus", type=Path, default=data / "demo_corpus.jsonl", help="corpus of the questions section")
    ap.add_argument("--questions", type=Path, default=data / "demo_questions.jsonl",
                    help="questions of the questions and graph sections")
    ap.add_argument("--index", type=Path, default=None,
                    help="a saved index (LinearRAG.save) for the questions and graph sections instead of building one "
                         "from --corpus")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="the sections to run (default: all)")
    ap.add_argument("--graph-batches", type=int, nargs="+", default=None,
                    help="batch sizes of the graph section (default 1 64 1024 4096; smoke: 1 16)")
    return ap.parse_args(argv)


def prepare(args, device):
    """(sizes, seed, the result skeleton with its info block, the JSON path)."""
    sizes = SMOKE if args.smoke else FULL
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") % 1_000_000
    backends = kernel_backends()
    info = {"benchmark": "gpu_check", "date": DATE, "device": str(device), "smoke": args.smoke,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": backends["triton"],
            "torch_scatter": backends["torch_scatter"], "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["triton_version"] = __import__("triton").__version__ if triton_available() else None
    out = {"info": info, "sections": {}}
    path = args.json or Path(__file__).resolve().parent / "results" / ("gpu_check_smoke.json" if args.smoke else "gpu_check.json")
    return sizes, seed, out, path


def run(device, sizes, seed, clock: Clock, out: dict, path: Path, args=None) -> None:
    """The sections (all, or args.sections), each recorded in ``out`` (and the JSON rewritten) as it ends; an
    error in one is recorded and does not stop the others."""
    chosen = set(args.sections) if args is not None else set(SECTIONS[:4])

    def section(name, fn):
        if name not in chosen:
            return
        t = time.perf_counter()
        log(f"[{name}] ({clock.left():.0f} s left)")
        try:
            out["sections"][name] = {"result": fn(), "seconds": time.perf_counter() - t}
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others' numbers
            import traceback

            out["sections"][name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                                     "seconds": time.perf_counter() - t}
            log(f"  ERROR {type(exc).__name__}: {exc}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=str))

    section("bandwidth", lambda: copy_bandwidth(device, sizes["copy_bytes"]))
    copy_gbs = out["sections"].get("bandwidth", {}).get("result", {}).get("GB_per_s")
    if copy_gbs:
        log(f"  device-to-device copy: {copy_gbs:.0f} GB/s")
    section("agreement", lambda: agreement(device, sizes["agree_passages"], sizes["agree_batch"], seed))
    agr = out["sections"].get("agreement", {}).get("result")
    if agr:
        log(f"  seed {seed}: worst max relative error of top-k scores {agr['worst_max_rel_err']:.2e} "
            f"-> {'OK' if agr['ok'] else 'MISMATCH'}")
    section("kernels", lambda: run_cases(sizes["kernel_passages"], sizes["kernel_batch"], device, repeat=5, log=log,
                                         argmax_size=sizes["argmax_size"]))
    section("timing", lambda: timing(device, sizes["sizes"], sizes["batches"], clock, copy_gbs or 0.0, log,
                                     sizes.get("local_from")))
    if args is None or not (clock.left() > 0 or args.smoke):
        return
    opened: dict = {}

    def real_index():  # sections 5 and 6 share one index, opened once
        if not opened:
            opened["value"] = open_index(device, args.index, args.corpus, args.questions, sizes["question_passages"],
                                         log)
        return opened["value"]

    section("questions", lambda: question_path(device, real_index, sizes["question_batches"], log,
                                                   sizes["question_ner_processes"]))
    section("graph", lambda: graph_stage(device, *real_index()[:2], args.graph_batches or sizes["graph_batches"], log))


def report(out: dict, path: Path, clock: Clock) -> int:
    """Writes the JSON; exit status 1 when a section failed or the agreement check (when it ran) did not pass."""
    out["total_s"] = time.perf_counter() - clock.t0
    path.write_text(json.dumps(out, indent=1, default=str))
    log(f"wrote {path} ({out['total_s']:.0f} s)")
    failed = [n for n, s in out["sections"].items() if "error" in s]
    if "agreement" in out["sections"] and not out["sections"]["agreement"].get("result", {}).get("ok"):
        failed.append("agreement")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --smoke for a CPU run of this script", file=sys.stderr)
        return 2
    clock = Clock(args.budget_s)
    sizes, seed, out, path = prepare(args, device)
    run(device, sizes, seed, clock, out, path, args)
    return report(out, path, clock)


if __name__ == "__main__":
    sys.exit(main())
