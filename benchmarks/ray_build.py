"""The Ray build (`linearrag index --ray`) against the plain build of the same corpus: overhead and equality.

    python -m benchmarks.ray_build                       # hotpotqa_train100, a local Ray on this machine's cores
    python -m benchmarks.ray_build --data /work/shared/datasets/2wiki --ray-address HOST:6379

Builds the corpus twice in this process, first as `linearrag index` does (LinearRAG.build, models
loaded inside the timing) and then with ray_build.build_index_on_ray (a Ray started here with --ray-cpus CPUs, or
the cluster at --ray-address; its start is timed apart), writes both indexes and compares them with
benchmarks.compare_indexes (strings, matrices, NER record, embeddings, top-k of every question in
both modes). Writes benchmarks/results/ray_build_<dataset>.json: wall times, per-stage seconds,
the overhead (Ray build / plain build), the comparison, the load average before and after, and the
machine. Exit status 1 when the builds differ. Run it with nothing else busy for quiet figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import machine
from benchmarks.compare_indexes import compare
from linearrag_torch import LinearRAG
from linearrag_torch.indexing import ray_build
from linearrag_torch.config import IndexConfig
from linearrag_torch.corpus import read_corpus, read_questions

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path("/work/shared/datasets/hotpotqa_train100")
EMB_TOL = 1e-6


def run(args) -> dict:
    data = Path(args.data)
    corpus, questions = data / "corpus.jsonl", data / "questions.jsonl"
    passages = read_corpus(corpus)
    if args.limit:
        passages = passages[:args.limit]
    qs = [q["question"] for q in read_questions(questions)] if questions.is_file() else []
    icfg = IndexConfig(encoder_precision=args.precision) if args.precision else IndexConfig()
    result = {"dataset": data.name, "passages": len(passages), "questions": len(qs), "load_before": os.getloadavg(),
              "machine": machine(torch.device("cpu"), torch.get_num_threads())}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()  # the plain build, models loaded inside the timing as in `linearrag index`
        plain = LinearRAG.build(passages, index_config=icfg, device="cpu", progress=not args.quiet)
        plain.save(Path(tmp) / "plain")
        result["plain_s"] = time.perf_counter() - t
        del plain

        import ray

        t = time.perf_counter()
        if args.ray_address:
            ray_build.connect(args.ray_address)
        else:
            ray.init(num_cpus=args.ray_cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        result["ray_start_s"] = time.perf_counter() - t
        result["ray_resources"] = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")}
        opts = ray_build.RayOptions(address=args.ray_address, ner_actors=args.ner_actors,
                                    encode_actors=args.encode_actors, encode_cpus=args.encode_cpus)
        stages: dict = {}
        t = time.perf_counter()
        built = LinearRAG(ray_build.build_index_on_ray(passages, index_config=icfg, options=opts,
                                                       progress=not args.quiet, timings=stages), "cpu")
        built.save(Path(tmp) / "ray")
        result["ray_build_s"] = time.perf_counter() - t
        result["ray_stages_s"] = {k: round(v, 2) for k, v in stages.items()}
        result["ray_plan"] = vars(ray_build.plan_actors(opts, *ray_build._resources(ray)))
        ray.shutdown()
        del built
        result["overhead"] = result["ray_build_s"] / result["plain_s"]
        result["comparison"] = compare(Path(tmp) / "plain", Path(tmp) / "ray", qs, top_k=5) if qs else None
    result["load_after"] = os.getloadavg()
    result["equal"] = _equal(result["comparison"]) if qs else None
    return result


def _equal(c: dict) -> bool:
    exact = all(c["strings_equal"].values()) and all(c["matrices_equal"].values()) and all((c["ner_equal"] or {}).values())
    close = all(isinstance(v, float) and v <= EMB_TOL for v in c["emb_max_abs_diff"].values())
    return exact and close and c.get("ok", True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="dataset folder with corpus.jsonl (and questions.jsonl)")
    ap.add_argument("--limit", type=int, default=None, help="first N passages only")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count(), help="CPUs of the local Ray (default: the cores)")
    ap.add_argument("--ray-address", default=None, help="an existing cluster instead of a local Ray")
    ap.add_argument("--ner-actors", type=int, default=None)
    ap.add_argument("--encode-actors", type=int, default=None)
    ap.add_argument("--encode-cpus", type=float, default=None)
    ap.add_argument("--precision", default=None, help="IndexConfig.encoder_precision (default: IndexConfig's)")
    ap.add_argument("--json", default=None, help="result file (default benchmarks/results/ray_build_<dataset>.json)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    res = run(args)
    out = Path(args.json) if args.json else ROOT / "benchmarks" / "results" / f"ray_build_{res['dataset']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    c = res["comparison"] or {}
    print(f"{res['dataset']}: {res['passages']} passages; plain build {res['plain_s']:.1f} s, Ray build "
          f"{res['ray_build_s']:.1f} s (+ Ray start {res['ray_start_s']:.1f} s): x{res['overhead']:.2f}; "
          f"stages {res['ray_stages_s']}; equal: {res['equal']} (embeddings max |diff| {c.get('emb_max_abs_diff')}); "
          f"load {res['load_before'][0]:.1f} -> {res['load_after'][0]:.1f}; wrote {out}", file=sys.stderr)
    return 0 if res["equal"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
