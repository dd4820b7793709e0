"""A batch's retrieval stays on its device (issue 27): with the default settings (two rounds, the pair rerank)
``retrieve`` reads back to the host only the PageRank's convergence test, once per step, and a few values
per call that do not depend on the batch size, each documented where it is read. Shown without a GPU: the
host-read entry points of torch are made to raise anywhere else while ``retrieve`` runs on CPU tensors
(the same code runs on CUDA: no branch depends on the device)."""
import sys
from contextlib import contextmanager

import pytest
import torch

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.kernels import segment_topk
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.synthetic import random_index, random_queries

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
# where a read is allowed, (file, function): the PageRank's convergence test (once per step; a batch of one
# reads its L1 change) and its choice of operator (once per call, PPRGraph.for_call); eq. 7's block size (once per call at these
# sizes), eq. 3's stored-vector branch (once per call) and, in paper mode, eq. 5's early stop (once per
# propagation step, at most max_iterations - 1): none of them grows with the batch
CONVERGENCE = {("pagerank.py", "personalized_pagerank"), ("pagerank.py", "_one_column"), ("pagerank.py", "for_call")}
ONCE_PER_CALL = {("sparse_rhs.py", "spmm_sparse_rhs"), ("activation.py", "nearest_entities"),
                 ("activation.py", "propagate_paper")}


@contextmanager
def host_reads_only_where_allowed():
    """Within the block: a host read outside the allowed functions raises, torch.cuda.synchronize always does;
    yields a dict of the allowed reads' counts (convergence, once per call)."""
    counts = {"convergence": 0, "once_per_call": 0}
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def guarded(name):
        def read(self, *args, **kwargs):
            frame = sys._getframe(1)
            site = (frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name)
            if site in CONVERGENCE:
                counts["convergence"] += 1
            elif site in ONCE_PER_CALL:
                counts["once_per_call"] += 1
            else:
                raise AssertionError(f"Tensor.{name} read on the host in {site[1]} ({site[0]}:{frame.f_lineno})")
            return saved[name](self, *args, **kwargs)
        return read

    def synchronize(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize in retrieve")

    sync = torch.cuda.synchronize
    for name in HOST_READS:
        setattr(torch.Tensor, name, guarded(name))
    torch.cuda.synchronize = synchronize
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.cuda.synchronize = sync


@pytest.fixture(scope="module")
def graph():
    return DeviceGraph(random_index(300, 400, dim=16, seed=4))


@pytest.mark.parametrize("cfg", [RetrievalConfig(delta=0.2), RetrievalConfig(delta=0.2, chain_rounds=2),
                                 RetrievalConfig(delta=0.2, mode="paper"),
                                 RetrievalConfig(delta=0.2, ppr_mode="local", reset_passages=50)],
                         ids=["default", "two rounds", "paper", "local PageRank"])
def test_retrieve_reads_the_host_only_for_convergence(graph, cfg, monkeypatch):
    # the local PageRank's push as a GPU runs it (the torch table): its numba loop runs on CPU tensors only, and
    # reads them as numpy views (no device involved)
    monkeypatch.setenv("LINEARRAG_KERNELS", "torch")
    retrieve(graph, random_queries(graph.index, 4, seed=1), cfg)  # the chain tables and the PageRank operator
    batch = random_queries(graph.index, 64, seed=3)
    counts = {}
    for B, queries in ((1, batch.select([int(batch.entity_owner[0])])), (8, batch.slice(0, 8)), (64, batch)):
        with host_reads_only_where_allowed() as c:
            out, tr = retrieve(graph, queries, cfg, trace="steps")  # the steps recorded: nothing read
        c["steps"] = len(tr.ppr_steps)
        if cfg.ppr_mode == "local":  # the push reads nothing back through these entry points: its one sync per
            assert len(tr.ppr_steps.pushes) >= 1 and c["convergence"] == 0  # round is the size of a nonzero
        assert out.indices.shape == (B, cfg.top_k)  # the final top-k is copied out by the caller, after this
        counts[B] = c
        # one read per step, and once per round the operator's choice (and with one question, which reads its
        # change in _one_column, its tolerance rounded to the iterate's dtype: a CPU value, no device involved)
        rounds = 1 + cfg.chain_rounds if cfg.mode == "reference" else 1
        assert 0 <= c["convergence"] - c["steps"] <= rounds * (2 if B == 1 else 1)
    # the reads besides the convergence test do not grow with the batch (in paper mode eq. 5 may stop earlier)
    other = [c["once_per_call"] for c in counts.values()]
    assert max(other) <= 10 and max(other) - min(other) <= (cfg.max_iterations - 1 if cfg.mode == "paper" else 0)
    total = {B: c["convergence"] + c["once_per_call"] for B, c in counts.items()}
    assert total[64] < 100 and total[64] - total[8] <= 2 + 2 * (counts[64]["steps"] - counts[8]["steps"])


def test_trace_counts_the_batchs_host_reads(graph, monkeypatch):
    """Trace.host_reads counts what the batch read (the trace's own diagnostics aside, and torch.equal beside
    the entry points above): the same for 16 and 64 questions but for the PageRank's steps. Trace.torch_calls
    does not grow with the batch either, but with the PageRank's steps and, on the CPU, eq. 4's blocks of
    kernels.segment_topk.CPU_SIGMA_CHUNK pairs (one block here)."""
    monkeypatch.setattr(segment_topk, "CPU_SIGMA_CHUNK", 1 << 20)
    cfg = RetrievalConfig(delta=0.2)
    seen = {}
    for B in (16, 64):
        queries = random_queries(graph.index, B, seed=3)
        with host_reads_only_where_allowed() as c:
            _, light = retrieve(graph, queries, cfg, trace="steps")
        _, tr = retrieve(graph, queries, cfg, trace=True)
        steps = len(tr.ppr_steps)
        assert steps == len(light.ppr_steps) and tr.host_reads >= c["convergence"] + c["once_per_call"]
        seen[B] = (tr.host_reads - steps, tr.torch_calls, steps)
    (reads16, calls16, steps16), (reads64, calls64, steps64) = seen[16], seen[64]
    assert reads16 == reads64
    # a step's calls depend a little on its working columns (ppr.GEMV_MIN_COLUMNS), a question adds none
    assert abs(calls64 - calls16) <= 40 * abs(steps64 - steps16) + 10 * max(steps16, steps64) + 20
