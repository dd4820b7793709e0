"""Wall milliseconds per question of ``encode_queries`` and ``retrieve`` for any version of the package,
through the two calls every version has, so that a checkout of an older commit can be timed beside
this one in the same quiet session:

    git worktree add /tmp/before COMMIT
    python benchmarks/question_path_versions.py --src /tmp/before --index DIR --questions A.jsonl B.jsonl
    python benchmarks/question_path_versions.py --src . --index DIR --questions A.jsonl B.jsonl \\
        --settings '{"chain_passages": 0}' --json OUT [--ranking TOP10.json]
    python benchmarks/question_path_versions.py --src . --index DIR --questions A.jsonl \\
        --load '{"quantize": "bfloat16"}' --ner-processes 1   # options only newer versions have

Each batch size times the first max(batch, 64) questions of the files in consecutive batches, after a
warm-up batch. benchmarks.throughput gives the stage-by-stage table of the current version.
"""
import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="folder holding the linearrag_torch package to time")
    ap.add_argument("--index", required=True, help="index folder")
    ap.add_argument("--questions", nargs="+", required=True, help='JSON lines with "question"')
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--settings", default="{}", help="retrieval settings as JSON, e.g. '{\"chain_passages\": 0}'")
    ap.add_argument("--load", default="{}", help="LinearRAG.load options as JSON, e.g. '{\"quantize\": \"bfloat16\"}' "
                                                 "(a version without the option refuses it)")
    ap.add_argument("--ner-processes", type=int, default=0,
                    help="spaCy NER in this many worker processes (LinearRAG.start_ner_processes; newer versions)")
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--ranking", help="also write every question's top 10 (row indices and scores, one batched call) "
                                      "here, to compare two versions' rankings")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    here = os.path.dirname(os.path.abspath(__file__))  # a module of this folder must not shadow a
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # package of the same name
    sys.path.insert(0, os.path.abspath(args.src))
    import linearrag_torch
    from linearrag_torch import LinearRAG

    qs = [json.loads(line)["question"] for f in args.questions for line in open(f, encoding="utf-8") if line.strip()]
    load, settings = json.loads(args.load), json.loads(args.settings)
    rag = LinearRAG.load(args.index, device="cpu", **load)
    if args.ner_processes:
        rag.start_ner_processes(args.ner_processes)
    try:
        cfg = rag.config.replace(**settings)
        rag.retrieve(rag.encode_queries(qs[:8], cfg), cfg)  # warm-up: models, graph
        rows = []
        for b in args.batch_sizes:
            n = max(b, 64)
            t_enc = t_ret = 0.0
            for start in range(0, n, b):
                batch = [qs[i % len(qs)] for i in range(start, start + b)]
                t0 = time.perf_counter()
                enc = rag.encode_queries(batch, cfg)
                t1 = time.perf_counter()
                rag.retrieve(enc, cfg)
                t_enc, t_ret = t_enc + t1 - t0, t_ret + time.perf_counter() - t1
            row = {"batch": b, "encode_queries_ms": 1000 * t_enc / n, "retrieve_ms": 1000 * t_ret / n,
                   "end_to_end_ms": 1000 * (t_enc + t_ret) / n}
            rows.append(row)
            print(f"batch {b:4d}: encode_queries {row['encode_queries_ms']:6.2f}  retrieve {row['retrieve_ms']:6.2f}  "
                  f"end to end {row['end_to_end_ms']:6.2f} ms/question", file=sys.stderr)
        if args.ranking:
            out = rag.retrieve(rag.encode_queries(qs, cfg), cfg.replace(top_k=10))
            with open(args.ranking, "w") as fh:
                json.dump({"questions": qs, "indices": out.indices.tolist(), "scores": out.scores.tolist()}, fh)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"package": linearrag_torch.__file__, "settings": settings, "load": load,
                           "ner_processes": args.ner_processes, "rows": rows}, fh, indent=2)
    finally:
        if args.ner_processes:  # (older versions have no close())
            rag.close()
    return 0


if __name__ == "__main__":  # the NER worker processes start by spawn: they import this file
    sys.exit(main())
