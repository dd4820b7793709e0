"""The torchrun entry point of the sharded engine (``python -m linearrag_torch.distributed``, whose __main__.py
calls ``torchrun_main``) with the arguments of `linearrag query`. Its own module: nothing in cli/ imports it."""
from __future__ import annotations

import sys

from .. import env
from . import parser
from .common import order_note, print_explanations, print_hits, question_items, retrieval_settings


def torchrun_main(argv=None) -> int:
    """torchrun entry point: ``torchrun ... -m linearrag_torch.distributed INDEX_DIR QUESTION ...`` with the
    arguments of `linearrag query` (not --shards: the launcher's WORLD_SIZE is the shard count); each rank
    joins through env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) and rank 0 prints."""
    from ..distributed.launch import init_group, query_config, query_job, stored_config  # deferred: imports torch

    env.offline_by_default()
    args = parser().parse_args(["query", *(sys.argv[1:] if argv is None else argv)])
    items = question_items(args)
    rank, world = int(env.RANK.get()), int(env.WORLD_SIZE.get())
    comm = init_group(rank, world, None, env.device_for(rank, args.device))
    try:
        hits = query_job(comm, args.index_dir, [it["question"] for it in items], retrieval_settings(args), args.top_k,
                         args.batch_size, args.reference_code, args.threads, args.device, args.quantize,
                         args.encoder_backend, args.explain)
    finally:
        import torch.distributed as td

        td.destroy_process_group()
    if rank == 0 and args.explain:
        print_explanations(items, hits)
    elif rank == 0:
        cfg = query_config(stored_config(args.index_dir), retrieval_settings(args), args.top_k, args.reference_code)
        print_hits(items, hits, args.json, order_note(cfg))
    return 0
