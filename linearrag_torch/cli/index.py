"""`linearrag index CORPUS.jsonl INDEX_DIR`: build an index."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..config import IndexConfig, RetrievalConfig
from .common import check_output_dir, sizes
from .flags import add_flags, add_ray_build_flags, add_retrieval_flags, device_arg, ray_options, retrieval_config


def add_parser(sub) -> None:
    p = sub.add_parser("index", help="build an index from a JSONL corpus",
                       usage="%(prog)s CORPUS.jsonl INDEX_DIR [index settings] [retrieval settings] [--ray ...] [--device D]",
                       description="Sentence split, NER and encode every passage; write the Tri-Graph index to INDEX_DIR.")
    p.add_argument("corpus", metavar="CORPUS.jsonl", help='one JSON object per line: "text", optional "id" and "title"')
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.set_defaults(index_fields=add_flags(p.add_argument_group("index settings", "stored with the index (config.IndexConfig)"),
                                          IndexConfig))
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    device_arg(p)
    add_retrieval_flags(p, stored=False)
    add_ray_build_flags(p)


def run(args) -> int:
    from ..api import LinearRAG  # deferred: imports torch, which `linearrag --help` must not load

    t0 = time.perf_counter()
    check_output_dir(args.index_dir)  # not after minutes of indexing
    cfg = retrieval_config(args, RetrievalConfig())
    icfg = IndexConfig(**{name: getattr(args, name) for name in args.index_fields})
    from contextlib import nullcontext

    from ..index import index_lock  # deferred: imports torch

    timings: dict = {}  # seconds per stage (LinearRAG.build), printed at the end
    existing = Path(args.index_dir).is_dir()  # replacing an index: lock before the work, not only to write
    with index_lock(args.index_dir) if existing else nullcontext():
        if args.ray is not None:  # the local build does not touch the Ray code
            from ..indexing.ray_build import build_index_on_ray

            rag = LinearRAG(build_index_on_ray(args.corpus, index_config=icfg, config=cfg, options=ray_options(args),
                                               progress=not args.quiet), args.device)
        else:
            rag = LinearRAG.build(args.corpus, index_config=icfg, config=cfg, device=args.device, progress=not args.quiet,
                                  timings=timings)
        t_save = time.perf_counter()
        rag.save(args.index_dir)
        timings["save"] = time.perf_counter() - t_save
    s = rag.index.summary()
    print(f"indexed {sizes(s)} "
          f"(nnz M {s['nnz_M']}, C {s['nnz_C']}, N {s['nnz_N']}) into {args.index_dir} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if len(timings) > 1:  # the local build's stages (the Ray build times its own)
        print("stages: " + ", ".join(f"{name.replace('_', ' ')} {sec:.1f} s" for name, sec in timings.items()),
              file=sys.stderr)
    return 0
