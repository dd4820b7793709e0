"""Starting the sharded engine: the process group (init_group, one device per rank), N local processes
(run_local), and the per-rank jobs: query_job (`linearrag query --shards N` and the torchrun entry point:
cli/sharded.py) and retrieve_job (tests, benchmarks)."""
from __future__ import annotations

import pickle
import time

import torch

from .. import env
from ..config import RetrievalConfig
from ..index import TriGraphIndex
from ..models import load_question_encoder
from ..queries import EncodedQueries, Retrieved
from ..runtime.threads import set_threads
from .comm import Comm
from .engine import QuestionIndex, ShardedEngine, encode_questions
from .shard import Shard


def init_group(rank: int, world: int, port: int | None = None, device: torch.device = torch.device("cpu"),
               timeout_s: float = 300.0) -> Comm:
    """Join the process group: NCCL for CUDA, gloo for CPU. With ``port``, rendezvous on 127.0.0.1:port
    (local processes); without, torch's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: torchrun)."""
    import datetime

    import torch.distributed as td

    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    url = f"tcp://127.0.0.1:{port}" if port else "env://"
    kw = {"device_id": device} if device.type == "cuda" else {}
    td.init_process_group(backend, init_method=url, rank=rank, world_size=world,
                          timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return Comm()


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_worker(rank, world, port, device, fn, args, out_q):
    import torch.distributed as td

    try:
        comm = init_group(rank, world, port, env.device_for(rank, device))
        out = fn(comm, *args)
        # plain pickle bytes: tensors sent through torch's shared-memory reducers would need this
        # process alive until the parent has read them
        out_q.put((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        out_q.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if td.is_initialized():
            td.destroy_process_group()


def run_local(world: int, fn, args=(), device: str = "cpu", timeout_s: float = 600.0) -> list:
    """Run ``fn(comm, *args)`` in ``world`` local processes (spawned, one process group on 127.0.0.1 at a
    free port) and return their results in rank order; an error or ``timeout_s`` in any rank raises
    RuntimeError (the others are terminated). ``fn`` and ``args`` must be picklable."""
    import queue

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_local_worker, args=(r, world, port, device, fn, args, out_q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"sharded run: no result from ranks {sorted(set(range(world)) - set(results))} "
                                   f"within {timeout_s:.0f} s")
            try:
                rank, status, value = out_q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    raise RuntimeError(f"sharded run: rank {dead[0]} exited with code {procs[dead[0]].exitcode}")
                continue
            if status == "error":
                raise RuntimeError(f"sharded run: rank {rank} failed: {value}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [results[r] for r in range(world)]


# ------------------------------------------------------------------------------------------- the query job


def query_config(base: RetrievalConfig, overrides: dict, top_k=None, reference_code: bool = False) -> RetrievalConfig:
    """The settings a sharded query runs with: the index's stored ``base`` (or the reference code's), then the
    command line's ``overrides`` and ``top_k``."""
    if reference_code:
        base = RetrievalConfig.reference_code(top_k=base.top_k)
    return base.replace(**overrides).replace(top_k=top_k)


def stored_config(index_dir) -> RetrievalConfig:
    """The retrieval settings stored in index folder ``index_dir`` (its index.json), read without its tensors."""
    import json
    from pathlib import Path

    return RetrievalConfig.from_dict(json.loads((Path(index_dir) / "index.json").read_text())["retrieval_config"])


def query_job(comm: Comm, index_dir: str, questions: list, overrides: dict, top_k=None, batch_size: int = 256,
              reference_code: bool = False, threads: int | None = None, device: str = "auto",
              quantize: str | None = None, encoder_backend: str = "torch", explain: bool = False):
    """One rank of `linearrag query --shards N` (or of a torchrun job): load INDEX_DIR, keep this rank's
    shard (the rest is freed), answer the questions (rank 0 encodes them, with ``quantize`` and
    ``encoder_backend`` as LinearRAG takes them, and broadcasts the vectors) and return the hits (api.Hit
    lists), with ``explain`` LinearRAG.explain's dicts, on rank 0, None elsewhere."""
    import gc

    set_threads(threads)
    dev = env.device_for(comm.rank, device)
    index = TriGraphIndex.load(index_dir, device="cpu")
    cfg = query_config(index.retrieval_config, overrides, top_k, reference_code)
    shard = Shard.build(index, comm.rank, comm.world, dev)
    qindex = QuestionIndex(index) if comm.rank == 0 else None
    del index
    gc.collect()
    engine = ShardedEngine(shard, comm, qindex.entities if comm.rank == 0 else None)
    encoder = None
    if comm.rank == 0:
        encoder = load_question_encoder(qindex.index_config, dev, quantize, encoder_backend)
    results = []
    for start in range(0, len(questions), batch_size):
        chunk = questions[start:start + batch_size]
        enc = encode_questions(qindex, chunk, cfg, encoder=encoder, device=dev,
                               reranker=engine.reranker(cfg) if cfg.rerank else None) if comm.rank == 0 else None
        enc = comm.broadcast_object(None if enc is None else enc.to("cpu"))
        if explain:
            results += engine.explain(chunk, enc, cfg) or []
        else:
            results += engine.hits(engine.retrieve(enc, cfg))
    return results if comm.rank == 0 else None


def retrieve_job(comm: Comm, index, queries: EncodedQueries, configs: list, device: str = "cpu") -> list:
    """One rank: shard ``index`` (the whole TriGraphIndex, pickled to every rank) and retrieve ``queries``
    under each config; returns the Retrieved list (CPU tensors; every rank gets the same)."""
    shard = Shard.build(index, comm.rank, comm.world, env.device_for(comm.rank, device))
    engine = ShardedEngine(shard, comm, index.entities)
    out = []
    for cfg in configs:
        r = engine.retrieve(queries, cfg)
        out.append(Retrieved(r.indices.cpu(), r.scores.cpu()))
    return out
