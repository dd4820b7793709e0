"""`linearrag query --shards N`: the command line of the sharded engine (its torchrun entry point: torchrun.py).
The engine, its process group and its per-rank jobs live in distributed/ (launch.py), which knows nothing of the
command line."""
from __future__ import annotations

import os

from .. import env
from .common import open_index_dir, order_note, print_explanations, print_hits, retrieval_settings


def cmd_query_sharded(args, items: list) -> int:
    """`linearrag query INDEX_DIR ... --shards N`: N local processes, rank 0 prints (common.print_hits, with
    --explain print_explanations)."""
    from ..distributed.launch import query_config, query_job, run_local, stored_config  # deferred: imports torch

    if args.backend != "torch":
        raise ValueError("--shards runs the torch engine; --backend scipy answers in one process")
    open_index_dir(args.index_dir)  # a clear error now for a folder that holds no index
    device = env.shards_device(args.device, args.shards)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.shards)
    try:
        results = run_local(args.shards, query_job,
                            (str(args.index_dir), [it["question"] for it in items], retrieval_settings(args),
                             args.top_k, args.batch_size, args.reference_code, threads, device, args.quantize,
                             args.encoder_backend, args.explain),
                            device=device, timeout_s=float(env.SHARD_TIMEOUT.get()))[0]
    except RuntimeError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    if args.explain:
        print_explanations(items, results)
        return 0
    cfg = query_config(stored_config(args.index_dir), retrieval_settings(args), args.top_k, args.reference_code)
    print_hits(items, results, args.json, order_note(cfg))
    return 0
