"""One index sharded over 1, 2 and 3 gloo processes on this machine: PageRank's per-iteration
communication (bytes each rank contributes to the one all-reduce) against its compute time, the bytes
of every other exchange per batch, the time per batch, and what each rank holds; then the projected
communication cost of N GPUs over NVLink and InfiniBand.

    python -m benchmarks.sharded [--index /work/idx/hotpotqa_train100] [--questions FILE.jsonl]
                                 [--worlds 1 2 3] [--batch-sizes 1 16 64] [--repeat 3]
                                 [--json benchmarks/results/sharded_<index>.json] [--png ...]

The questions are encoded once in this process (LinearRAG.encode_queries) and sent to every rank;
each rank loads the index folder, keeps its shard (distributed.Shard) and answers every batch with the
default settings (chain round on: two PageRank runs per batch), with one torch thread. A batch runs
once as warm-up, then ``--repeat`` times; the medians are reported. Timings on a CPU shared with other
work are marked by the load averages recorded beside them.

Projection (``projection`` in the JSON): a PageRank iteration all-reduces S = (shared entities + 2) x B
float32 values per rank. On N GPUs with a ring all-reduce it costs about

    t(N) = latency + 2 (N - 1) / N * S / bandwidth

with the figures in LINKS (assumed, not measured here). The shared-entity count for N contiguous
shards is computed exactly on this index for each N; for larger corpora it is scaled per passage from
this index's count at the largest N (an estimate: at most every entity of degree >= 2 is shared).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

# assumed link figures for the projection: per-collective latency (s) and all-reduce bus bandwidth (bytes/s)
LINKS = {
    "NVLink (one node, NVSwitch, ~H100/H200 class)": {"latency_s": 15e-6, "bandwidth_Bps": 350e9},
    "InfiniBand (across nodes, 400 Gb/s per GPU)": {"latency_s": 30e-6, "bandwidth_Bps": 45e9},
}
PROJECT_N = (2, 4, 8, 16, 32, 64)
PROJECT_PASSAGES = (1_000_000, 100_000_000)


def load_avg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _bench_job(comm, index_dir: str, queries, batch_sizes: list, repeat: int) -> dict:
    """One rank: shard the index, answer each batch size ``repeat`` times; timings and exchanged bytes."""
    from linearrag_torch.config import RetrievalConfig
    from linearrag_torch.index import TriGraphIndex
    from linearrag_torch.distributed import Shard, ShardedEngine

    torch.set_num_threads(1)
    index = TriGraphIndex.load(index_dir, device="cpu")
    cfg = index.retrieval_config
    t0 = time.perf_counter()
    shard = Shard.build(index, comm.rank, comm.world)
    build_s = time.perf_counter() - t0
    del index
    eng = ShardedEngine(shard, comm)
    out = {"rank": comm.rank, "build_s": build_s, "passages": shard.hi - shard.lo,
           "sentences": int(shard.sentences.numel()), "entities": int(shard.entities.numel()),
           "walk_private": int(shard.walk_private.numel()), "walk_shared": int(shard.walk_shared.numel()),
           "bytes": shard.nbytes(), "batches": {}}
    for B in batch_sizes:
        q = queries.slice(0, B) if B < queries.batch_size else queries
        eng.retrieve(q, cfg)  # warm-up
        runs = []
        for _ in range(repeat):
            comm.stats = {}
            eng.iteration_log = []
            t = time.perf_counter()
            eng.retrieve(q, cfg)
            wall = time.perf_counter() - t
            log = eng.iteration_log
            runs.append({
                "wall_s": wall, "stats": comm.stats, "iterations": len(log),
                "iteration_bytes": [b for b, _, _ in log], "compute_s": [c for _, c, _ in log],
                "comm_s": [m for _, _, m in log],
            })
        out["batches"][str(B)] = runs
    return out


def _summary(per_rank: list, B: int) -> dict:
    """Medians over ranks' repeats for one batch size."""
    runs = [r for rank in per_rank for r in rank["batches"][str(B)]]
    it_b = [b for r in runs for b in r["iteration_bytes"]]
    comp = [c for r in runs for c in r["compute_s"]]
    com = [c for r in runs for c in r["comm_s"]]
    phases = {}
    for r in per_rank[0]["batches"][str(B)]:
        for name, s in r["stats"].items():
            p = phases.setdefault(name, {"calls": [], "bytes": [], "seconds": []})
            for k in p:
                p[k].append(s[k])
    return {
        "batch": B,
        "wall_ms_per_batch": 1e3 * statistics.median(max(rank["batches"][str(B)][i]["wall_s"] for rank in per_rank)
                                                     for i in range(len(runs) // len(per_rank))),
        "ppr_iterations_per_batch": statistics.median(r["iterations"] for r in runs),
        "ppr_bytes_per_iteration_per_rank": int(statistics.median(it_b)) if it_b else 0,
        "ppr_compute_ms_per_iteration": 1e3 * statistics.median(comp) if comp else 0.0,
        "ppr_comm_ms_per_iteration": 1e3 * statistics.median(com) if com else 0.0,
        "exchange_per_batch_rank0": {k: {"calls": statistics.median(v["calls"]), "bytes": int(statistics.median(v["bytes"])),
                                         "ms": 1e3 * statistics.median(v["seconds"])} for k, v in phases.items()},
    }


def shared_entities(index, worlds) -> dict:
    """Entities whose passages lie on several of N contiguous shards, for each N (the all-reduced rows)."""
    from linearrag_torch.distributed import passage_bounds

    C = index.C
    rows = C.row_index()
    out = {}
    for n in worlds:
        if n > index.num_passages:
            continue
        bounds = torch.tensor(passage_bounds(index.num_passages, n))
        r = torch.searchsorted(bounds[1:], rows, right=True)
        E = index.num_entities
        lo = torch.full((E,), n, dtype=torch.int64).scatter_reduce_(0, C.col, r, "amin")
        hi = torch.full((E,), -1, dtype=torch.int64).scatter_reduce_(0, C.col, r, "amax")
        out[n] = int(((hi >= 0) & (lo != hi)).sum())
    return out


def projection(index, batch_sizes) -> dict:
    P = index.num_passages
    degree = torch.bincount(index.C.col, minlength=index.num_entities)
    nonleaf = int((degree >= 2).sum())
    sh = shared_entities(index, PROJECT_N)
    top_n = max(sh)
    per_passage = sh[top_n] / P
    rows = []
    for link, f in LINKS.items():
        for n in PROJECT_N:
            for corpus in (P,) + PROJECT_PASSAGES:
                n_sh = sh.get(n) if corpus == P else None
                if n_sh is None:
                    if corpus == P:
                        continue
                    n_sh = per_passage * corpus
                for B in batch_sizes:
                    S = (n_sh + 2) * B * 4
                    t = f["latency_s"] + 2 * (n - 1) / n * S / f["bandwidth_Bps"]
                    rows.append({"link": link, "gpus": n, "passages": corpus, "batch": B, "shared_entities": round(n_sh),
                                 "bytes_per_iteration": round(S), "ms_per_iteration": 1e3 * t})
    return {"model": "t = latency + 2 (N - 1) / N * S / bandwidth per PageRank iteration (ring all-reduce); "
                     "S = (shared entities + 2) * B * 4 bytes",
            "links_assumed": LINKS, "shared_entities_this_index": sh, "entities_degree_ge_2_this_index": nonleaf,
            "shared_per_passage_used_for_larger_corpora": per_passage, "rows": rows}


def run(args) -> dict:
    from linearrag_torch import LinearRAG
    from linearrag_torch.corpus import read_questions
    from linearrag_torch.distributed import run_local

    from benchmarks.common import machine
    from benchmarks.sharded import _bench_job  # by module name: the spawned ranks import it

    rag = LinearRAG.load(args.index, device="cpu")
    qs = list(dict.fromkeys(q["question"] for q in read_questions(args.questions)))[: max(args.batch_sizes)]
    queries = rag.encode_queries(qs)
    queries.rows_of = None  # entity_rows stay valid for the index folder every rank loads
    B = [b for b in args.batch_sizes if b <= len(qs)]
    result = {
        "index": str(args.index), "passages": rag.index.num_passages, "sentences": rag.index.num_sentences,
        "entities": rag.index.num_entities, "questions": len(qs), "batch_sizes": B, "repeat": args.repeat,
        "config": rag.config.to_dict(), "machine": machine(torch.device("cpu"), 1), "torch_threads_per_rank": 1,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "note": "timings under load: the CPU is shared with other work (load averages beside each run)",
        "worlds": {},
    }
    for world in args.worlds:
        la0 = load_avg()
        t = time.perf_counter()
        per_rank = run_local(world, _bench_job, (str(args.index), queries, B, args.repeat), timeout_s=args.timeout)
        result["worlds"][str(world)] = {
            "load_avg_before": la0, "load_avg_after": load_avg(), "seconds": time.perf_counter() - t,
            "ranks": [{k: v for k, v in r.items() if k != "batches"} for r in per_rank],
            "batches": [_summary(per_rank, b) for b in B],
        }
        print(f"{world} process(es): done in {time.perf_counter() - t:.0f} s", flush=True)
    result["projection"] = projection(rag.index, B)
    return result


def table(result: dict) -> str:
    lines = ["| processes | batch | PPR iterations | bytes / iteration / rank | compute ms / iteration | "
             "all-reduce ms / iteration | ms / batch | shared entities |",
             "|---|---|---|---|---|---|---|---|"]
    for w, r in result["worlds"].items():
        for b in r["batches"]:
            lines.append(f"| {w} | {b['batch']} | {b['ppr_iterations_per_batch']:.0f} | "
                         f"{b['ppr_bytes_per_iteration_per_rank']:,} | {b['ppr_compute_ms_per_iteration']:.3f} | "
                         f"{b['ppr_comm_ms_per_iteration']:.3f} | {b['wall_ms_per_batch']:.1f} | "
                         f"{r['ranks'][0]['walk_shared']:,} |")
    return "\n".join(lines)


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    worlds = list(result["worlds"])
    for B in result["batch_sizes"]:
        rows = [next(x for x in result["worlds"][w]["batches"] if x["batch"] == B) for w in worlds]
        a.plot(worlds, [r["ppr_compute_ms_per_iteration"] for r in rows], "o-", label=f"compute, B={B}")
        a.plot(worlds, [r["ppr_comm_ms_per_iteration"] for r in rows], "s--", label=f"all-reduce, B={B}")
        b.plot(worlds, [r["ppr_bytes_per_iteration_per_rank"] / 1024 for r in rows], "o-", label=f"B={B}")
    a.set_xlabel("gloo processes (CPU, under load)")
    a.set_ylabel("ms per PageRank iteration (median)")
    a.set_yscale("log")
    a.legend(fontsize=7)
    b.set_xlabel("gloo processes")
    b.set_ylabel("KiB all-reduced per iteration per rank")
    b.legend(fontsize=7)
    fig.suptitle(f"Sharded PageRank on {Path(result['index']).name}: communication vs compute per iteration")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, default=Path("/work/idx/hotpotqa_train100"), help="index folder")
    ap.add_argument("--questions", type=Path, default=None,
                    help="questions JSONL (default: /work/shared/datasets/<index name>/questions.jsonl)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 3], help="process counts (default 1 2 3)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per batch size (medians reported)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per group of processes")
    ap.add_argument("--json", type=Path, default=None, help="default benchmarks/results/sharded_<index>.json")
    ap.add_argument("--png", type=Path, default=None, help="default: next to --json")
    args = ap.parse_args(argv)
    name = args.index.resolve().name if args.index.name == "index" else args.index.name
    if args.questions is None:
        args.questions = Path("/work/shared/datasets") / args.index.name / "questions.jsonl"
    args.json = args.json or Path(__file__).parent / "results" / f"sharded_{name}.json"
    args.png = args.png or args.json.with_suffix(".png")
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot(result, args.png)
    print(table(result))
    print(f"wrote {args.json} and {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
