"""The sharded engine's exchanges checked in one process, fast (test_sharded.py runs the same engine in gloo
processes, marked slow): two ranks run as two threads joined by ThreadComm, a communicator whose collectives
exchange tensors through Python lists. Against the single-process engine: the graph rounds, the learned rerank
with and without the reranker in the chain rounds (each rank scoring only the pairs of the candidates it holds),
with a chain-aware reranker whose context passages lie on the other rank, and explain."""
import threading

import pytest
import torch

from conftest import assert_close, without_paths
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.distributed import Comm, Shard, ShardedEngine
from linearrag_torch.retrieval import engine
from linearrag_torch.synthetic import random_index, random_queries


class _Group:
    """The threads of one fake process group: ``exchange`` gives every rank the values of all, in rank order."""

    def __init__(self, world: int):
        self.world, self.slots = world, [None] * world
        self.barrier = threading.Barrier(world, timeout=120)

    def exchange(self, rank: int, value) -> list:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody writes the next exchange's slot before every rank has read this one
        return out


class ThreadComm(Comm):
    """distributed.Comm's collectives between the threads of a _Group (the sums in rank order, as gloo's)."""

    def __init__(self, group: _Group, rank: int):
        super().__init__(dist=False)
        self.group, self.rank, self.world = group, rank, group.world
        self.reduced = 0  # all_reduce calls

    def all_reduce(self, x, op="sum"):
        self.reduced += 1
        parts = self.group.exchange(self.rank, x.clone())
        out = parts[0]
        for p in parts[1:]:
            out = out + p if op == "sum" else torch.maximum(out, p)
        return x.copy_(out)

    def all_gather(self, x):
        return torch.stack(self.group.exchange(self.rank, x.clone()))

    def all_gather_object(self, obj):
        return self.group.exchange(self.rank, obj)

    def broadcast_object(self, obj, src=0):
        return self.group.exchange(self.rank, obj)[src]


def run_ranks(world: int, fn) -> list:
    """fn(comm) on ``world`` threads, one per rank; their results in rank order (a rank's error is raised)."""
    group, out, errors = _Group(world), [None] * world, []

    def rank(r):
        try:
            out[r] = fn(ThreadComm(group, r))
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)
            group.barrier.abort()  # the other ranks stop waiting

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def _sharded(index, comm, names=True) -> ShardedEngine:
    return ShardedEngine(Shard.build(index, comm.rank, comm.world), comm, index.entities if names else None)


def _assert_same(got, want, what):
    assert torch.equal(got.indices, want.indices), f"{what}: top-k differs\n{got.indices}\n{want.indices}"
    diff = (got.scores - want.scores).abs().max().item()
    assert diff <= 1e-5, f"{what}: max score difference {diff}"


@pytest.mark.parametrize("cfg", [RetrievalConfig(), RetrievalConfig(chain_rounds=2, chain_passages=3),
                                 RetrievalConfig.reference_code(), RetrievalConfig(mode="paper")],
                         ids=["default", "two chain rounds", "reference code", "paper"])
def test_two_thread_ranks_equal_one_process(cfg):
    idx = random_index(passages=48, entities=70, dim=16, seed=5)
    q = random_queries(idx, batch=8, seed=2)
    want = engine.retrieve(engine.DeviceGraph(idx), q, cfg)
    for r, got in enumerate(run_ranks(2, lambda comm: _sharded(idx, comm).retrieve(q, cfg))):
        _assert_same(got, want, f"rank {r}")


@pytest.fixture(scope="module")
def rerankers(tiny_reranker_dir, tiny_chain_reranker_dir):
    return {"plain": str(tiny_reranker_dir), "chain-aware": str(tiny_chain_reranker_dir)}


@pytest.mark.parametrize("loop", [0, 6], ids=["final rerank", "reranker in the loop"])
@pytest.mark.parametrize("kind", ["plain", "chain-aware"])
def test_rerank_on_two_ranks_equals_one_process(small_rag, small_questions, rerankers, kind, loop):
    qs = [q["question"] for q in small_questions]
    cfg = small_rag.config.replace(rerank=True, reranker=rerankers[kind], rerank_loop_candidates=loop, top_k=5,
                                   rerank_candidates=6)
    enc = small_rag.encode_queries(qs, cfg)
    one = small_rag.graph.reranker(cfg.reranker, cfg.reranker_precision)
    scored = {"one process": []}
    pair_logits = one.pair_logits
    one.pair_logits = lambda q, p, q_of_pair, *a, **kw: scored["one process"].append(q_of_pair.numel()) or \
        pair_logits(q, p, q_of_pair, *a, **kw)
    try:
        want = engine.retrieve(small_rag.graph, enc, cfg)
    finally:
        del one.pair_logits
    plain = engine.retrieve(small_rag.graph, enc, cfg.replace(rerank=False))
    assert not torch.equal(want.indices, plain.indices), "the tiny reranker should change an order"

    def job(comm):
        eng = _sharded(small_rag.index, comm)
        reranker = eng.reranker(cfg)
        pair_logits = reranker.pair_logits

        def counted(q, p, q_of_pair, *args):  # the pairs this rank scores, per call
            scored.setdefault(comm.rank, []).append(q_of_pair.numel())
            return pair_logits(q, p, q_of_pair, *args)

        reranker.pair_logits = counted
        return eng.retrieve(enc, cfg)

    for r, got in enumerate(run_ranks(2, job)):
        _assert_same(got, want, f"{kind}, loop {loop}, rank {r}")
    # one batched call per rerank stage on each rank, every pair scored by exactly one rank (the final rerank
    # scores only the pairs the loop did not: as many as in one process)
    stages = 1 + (cfg.chain_rounds if loop else 0)
    assert len(scored[0]) == len(scored[1]) == stages
    per_stage = [a + b for a, b in zip(scored[0], scored[1])]
    assert per_stage == scored["one process"]
    assert per_stage[:-1] == [len(qs) * loop] * (stages - 1) and 0 < per_stage[-1] <= len(qs) * 6
    assert min(sum(v) for v in scored.values()) > 0  # both ranks hold candidates


def test_explain_on_two_ranks_equals_one_process(small_rag, small_questions, rerankers):
    qs = [q["question"] for q in small_questions]
    over = dict(rerank=True, reranker=rerankers["chain-aware"], rerank_loop_candidates=6)
    want = small_rag.explain(qs, top_k=5, **over)
    cfg = small_rag.config.replace(top_k=5, **over)
    enc = small_rag.encode_queries(qs, cfg)
    got = run_ranks(2, lambda comm: _sharded(small_rag.index, comm, names=comm.rank == 0).explain(qs, enc, cfg))
    assert got[1] is None  # the explanations are made where the names are
    assert_close(got[0], without_paths(want), "explain")
    assert any(e["chain_seeds"] for e in want) and any(len(e["hits"][0][1]) for e in want)  # fields with content
    assert all(e["rerank"] and e["found"] for e in want)


def test_a_trace_without_names_numbers_the_chain_seeds(small_rag, small_questions):
    """A rank without the entity names (a shard holds none) calls entity e "entity e" in its trace."""
    qs = [q["question"] for q in small_questions]
    enc = small_rag.encode_queries(qs)
    _, want = engine.retrieve(small_rag.graph, enc, small_rag.config, trace=True)
    names = small_rag.index.entities
    numbered = [[(f"entity {names.index(n)}", w) for n, w in row] for row in want.chain_seeds]
    assert any(numbered)
    got = run_ranks(2, lambda comm: _sharded(small_rag.index, comm, names=False).retrieve(enc, small_rag.config,
                                                                                         trace=True)[1])
    for tr in got:
        assert_close(tr.chain_seeds, numbered, "chain seeds")
        assert torch.equal(tr.is_seed, want.is_seed) and torch.equal(tr.activation.tier, want.activation.tier)
        assert torch.equal(tr.dense, want.dense)
