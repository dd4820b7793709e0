"""The PageRank walk on merged leaf buckets (pagerank.Leaves) equals the walk on the full graph."""
import pytest
import torch

from linearrag_torch.retrieval import pagerank
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.retrieval.pagerank import PPRGraph, StepLog, personalized_pagerank
from linearrag_torch.index.csr import Csr
from linearrag_torch.synthetic import random_index


def _resets(P, E, B, seed, active=0.05):
    gen = torch.Generator().manual_seed(seed)
    rp = torch.rand(P, B, generator=gen)
    re = torch.rand(E, B, generator=gen) * (torch.rand(E, B, generator=gen) < active)  # a few active entities
    re[:, 0] = 0  # a question with passage reset only
    rp[:, 1], re[:, 1] = 0, 0  # and one with no reset at all
    return rp, re


@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_leaf_buckets_give_the_full_walk(adjacent, seed):
    index = random_index(60, 90, entities_per_sentence=1.5, dim=8, seed=seed)  # many degree-1 entities
    C = index.C
    full = PPRGraph.build(C, adjacent, collapse_leaves=False)
    merged = PPRGraph.build(C, adjacent)
    assert merged.leaves is not None and int(merged.leaves.is_leaf.sum()) > 10
    assert merged.to_entities.shape[0] < full.to_entities.shape[0]
    rp, re = _resets(60, 90, 6, seed)
    for tol in (1e-6, 1e-9):  # 1e-9: down to the float32 floor, where the stopping rule matters most
        cfg = RetrievalConfig(damping=0.5, ppr_tol=tol, ppr_max_iter=300)
        t1 = StepLog()
        xp1, xe1, v1 = personalized_pagerank(full, rp, re, cfg, steps=t1)
        t2 = StepLog()
        xp2, xe2, v2 = personalized_pagerank(merged, rp, re, cfg, steps=t2)
        changes1, changes2 = t1.changes(6), t2.changes(6)
        if tol >= 1e-6:  # above the float32 floor: the same steps, stopping at the same time
            assert len(changes1) == len(changes2)
            for c1, c2 in zip(changes1, changes2):  # the L1 change of every step, leaves included
                torch.testing.assert_close(c2, c1, rtol=1e-2, atol=2e-8, equal_nan=True)
        assert torch.equal(v1, v2)
        torch.testing.assert_close(xp2, xp1, rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(xe2, xe1, rtol=1e-4, atol=1e-9)
        xp3, none, _ = personalized_pagerank(merged, rp, re, cfg, entity_scores=False)
        assert none is None and torch.equal(xp3, xp2)


def test_the_change_of_tracked_leaves_counts_like_the_full_graph():
    # passage 0 holds leaves e0, e1 (shares .25, .25) and e2 (degree 2, also in passage 1); e3 is a leaf of 1
    C = Csr.from_rows([[0, 1, 2], [2, 3]], 4, [[0.25, 0.25, 0.5], [0.5, 0.5]])
    full, merged = PPRGraph.build(C, collapse_leaves=False), PPRGraph.build(C)
    assert merged.leaves.is_leaf.tolist() == [True, True, False, True]
    rp = torch.tensor([[0.0], [0.0]])
    re = torch.tensor([[1.0], [0.0], [0.0], [0.0]])  # all reset on leaf e0: e0 and e1 move in opposite directions
    for it in range(1, 8):  # the same iterate and change after any number of steps
        cfg = RetrievalConfig(ppr_tol=1e-30, ppr_max_iter=it)
        ta = StepLog()
        a = personalized_pagerank(full, rp, re, cfg, steps=ta)
        tb = StepLog()
        b = personalized_pagerank(merged, rp, re, cfg, steps=tb)
        ca, cb = ta.changes(1), tb.changes(1)
        torch.testing.assert_close(b[0], a[0])
        torch.testing.assert_close(b[1], a[1])
        torch.testing.assert_close(torch.stack(cb), torch.stack(ca))


def _stop_step(changes, tol: float, cap: int) -> int:
    """The steps a column runs by the stop rule: up to the first change below tol, or below
    pagerank.FLOOR_RULE_BELOW and not below the one before."""
    last = float("inf")
    for t, c in enumerate(changes, 1):
        if c < tol or (c >= last and c < pagerank.FLOOR_RULE_BELOW):
            return t
        last = c
    return cap


@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("tol,max_iter", [(1e-6, 200), (1e-9, 300), (1e-30, 7)])
def test_a_question_alone_takes_the_steps_it_takes_in_a_batch(adjacent, tol, max_iter):
    """A batch of one runs its own loop (pagerank._one_column): per column the same steps, the same stop
    (tolerance, change no longer shrinking, or the cap) and the same scores as in a batch."""
    index = random_index(60, 90, entities_per_sentence=1.5, dim=8, seed=2)
    C = index.C
    for graph in (PPRGraph.build(C, adjacent), PPRGraph.build(C, adjacent, collapse_leaves=False)):
        rp, re = _resets(60, 90, 6, 2)
        cfg = RetrievalConfig(damping=0.5, ppr_tol=tol, ppr_max_iter=max_iter)
        batch = StepLog()
        xp, xe, valid = personalized_pagerank(graph, rp, re, cfg, steps=batch)
        changes = torch.stack(batch.changes(6))  # a stopped column is iterated (ignored) until the set is compacted
        for b in range(6):
            alone = StepLog()
            xp1, xe1, valid1 = personalized_pagerank(graph, rp[:, b:b + 1], re[:, b:b + 1], cfg, steps=alone)
            assert bool(valid1[0]) == bool(valid[b])
            steps = len(alone.changes(1))
            assert steps == _stop_step(torch.cat(alone.changes(1)).tolist(), tol, max_iter)
            if tol >= 1e-6 or max_iter < 10:  # away from the float32 floor (where late sums round apart): same steps
                assert steps == _stop_step(changes[:, b].tolist(), tol, max_iter), b
                torch.testing.assert_close(torch.cat(alone.changes(1)), changes[:steps, b], rtol=1e-2, atol=5e-8)
            torch.testing.assert_close(xp1[:, 0], xp[:, b], rtol=1e-5, atol=1e-9)
            torch.testing.assert_close(xe1[:, 0], xe[:, b], rtol=1e-4, atol=1e-9)
