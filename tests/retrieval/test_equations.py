"""Each equation of docs/METHOD.md on a tiny graph computed by hand."""
import math

import numpy as np
import pytest
import torch

from linearrag_torch.retrieval.activation import propagate_paper
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.kernels import top_k_per_segment
from linearrag_torch.retrieval.pagerank import PPRGraph, minmax, personalized_pagerank
from linearrag_torch.index.csr import Csr
from linearrag_torch.testing import passage_reset, propagate_reference, seed_entities, sigma_pair

# sentences: s0 = {e0, e1}, s1 = {e1, e2}, s2 = {e2}
M = Csr.from_rows([[0, 1], [1, 2], [2]], 3)
MT = M.transpose()
SIGMA = torch.tensor([[0.8], [0.6], [0.5]])


def _unit(v):
    v = torch.tensor(v, dtype=torch.float32)
    return v / v.norm(dim=-1, keepdim=True)


def test_seeds_pick_most_similar_entity_and_keep_the_largest_cosine():
    ents = torch.eye(3)
    q_ents = _unit([[0.9, 0.1, 0.0], [0.6, 0.0, 0.8], [0.99, 0.01, 0.0], [0.0, 0.0, 1.0]])
    owner = torch.tensor([0, 0, 0, 1])
    seeds, is_seed = seed_entities(ents, q_ents, owner, 2)
    # question 0: e0 seeded twice (keeps the larger cosine), e2 once; question 1: e2 with cosine 1
    assert is_seed[:, 0].tolist() == [True, False, True]
    assert seeds[0, 0] == pytest.approx(float(q_ents[2, 0]))
    assert seeds[2, 0] == pytest.approx(0.8)
    assert is_seed[:, 1].tolist() == [False, False, True] and seeds[2, 1] == pytest.approx(1.0)


def test_seed_with_negative_cosine_is_still_a_seed():
    seeds, is_seed = seed_entities(torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, 0.0]]), torch.tensor([0]), 1)
    assert bool(is_seed[0, 0]) and seeds[0, 0] == pytest.approx(-1.0)


def _paper(delta=0.4, iters=3):
    seeds = torch.tensor([[0.9], [0.0], [0.0]])
    cfg = RetrievalConfig(mode="paper", delta=delta, max_iterations=iters)
    return propagate_paper(M.torch(), MT.torch(), sigma_pair(SIGMA), seeds, seeds > 0, cfg)


def test_paper_propagation_two_steps_by_hand():
    out = _paper()
    # step 1: M a = [.9,0,0]; sigma*x = [.72,0,0]; y = [.72,.72,0]; a1 = [.9,.72,0]
    # step 2: M a = [1.62,.72,0]; sigma*x = [1.296,.432,0]; y = [1.296,1.728,.432]
    assert out.act[:, 0].tolist() == pytest.approx([1.296, 1.728, 0.432])
    assert out.tier[:, 0].tolist() == [1, 2, 3]
    assert out.steps == 2


def test_paper_max_iterations_counts_like_the_reference_code():
    out = _paper(iters=2)  # while t < 2: one step
    assert out.act[:, 0].tolist() == pytest.approx([0.9, 0.72, 0.0])
    assert out.tier[:, 0].tolist() == [1, 2, 0]


def test_paper_threshold_prunes_and_stops_early():
    out = _paper(delta=0.75)  # y = [.72,.72,0] all below delta: nothing new, stop
    assert out.act[:, 0].tolist() == pytest.approx([0.9, 0.0, 0.0])
    assert out.tier[:, 0].tolist() == [1, 0, 0] and out.steps == 0


def _reference(seeds, sigma, delta=0.4, iters=3, k=1):
    cfg = RetrievalConfig(mode="reference", delta=delta, max_iterations=iters, top_k_sentence=k)
    return propagate_reference(M.crow, M.col, MT.crow, MT.col, sigma_pair(sigma), seeds, seeds > 0, cfg)


def test_reference_mode_trace_by_hand():
    out = _reference(torch.tensor([[0.9], [0.0], [0.0]]), SIGMA)
    # step 1: e0 takes s0 (only sentence): cand .72 to e0 and e1
    # step 2: e0 has no unused sentence; e1 takes s1 (s0 used): cand .432 to e1 and e2
    assert out.act[:, 0].tolist() == pytest.approx([0.72, 0.432, 0.432])
    assert out.tier[:, 0].tolist() == [2, 3, 3]
    assert out.reset[:, 0].tolist() == pytest.approx([0.9 + 0.72, 0.72 + 0.432, 0.432])


def test_reference_mode_candidates_below_delta_do_not_count():
    out = _reference(torch.tensor([[0.9], [0.0], [0.0]]), SIGMA, delta=0.5)
    # step 1 as before (.72 >= .5); step 2: .72 * .6 = .432 < .5: nothing, frontier empty
    assert out.act[:, 0].tolist() == pytest.approx([0.72, 0.72, 0.0])
    assert out.reset[:, 0].tolist() == pytest.approx([1.62, 0.72, 0.0])
    assert out.tier[:, 0].tolist() == [2, 2, 0]


def test_reference_mode_top_k_sentence_and_shared_sentence_in_one_step():
    # seeds e1 (.9) and e2 (.8); e1 mentions s0, s1; e2 mentions s1, s2. sigma: s1 is best for both.
    sigma = torch.tensor([[0.5], [0.9], [0.7]])
    out = _reference(torch.tensor([[0.0], [0.9], [0.8]]), sigma, iters=2, k=1)
    # both take s1 in the same step: e1 -> .81 to e1 and e2; e2 -> .72 to e1 and e2
    assert out.reset[:, 0].tolist() == pytest.approx([0.0, 0.9 + 0.81 + 0.72, 0.8 + 0.81 + 0.72])
    assert out.act[:, 0].tolist() == pytest.approx([0.0, 0.81, 0.81])  # the largest candidate
    out2 = _reference(torch.tensor([[0.0], [0.9], [0.0]]), sigma, iters=2, k=2)
    # k = 2: e1 takes s1 (.81 to e1, e2) and s0 (.45 to e0, e1)
    assert out2.reset[:, 0].tolist() == pytest.approx([0.45, 0.9 + 0.81 + 0.45, 0.81])


def test_batch_columns_are_independent():
    seeds = torch.tensor([[0.9, 0.0], [0.0, 0.9], [0.0, 0.8]])
    sigma = torch.tensor([[0.8, 0.5], [0.6, 0.9], [0.5, 0.7]])
    both = _reference(seeds, sigma)
    for b in range(2):
        one = _reference(seeds[:, b:b + 1], sigma[:, b:b + 1])
        assert torch.allclose(both.reset[:, b], one.reset[:, 0]) and torch.equal(both.tier[:, b], one.tier[:, 0])


def test_top_k_per_segment_ties_keep_the_first():
    values = torch.tensor([1.0, 3.0, 3.0, float("-inf"), 2.0, 5.0])
    owner = torch.tensor([0, 0, 0, 1, 1, 2])
    offsets = torch.tensor([0, 3, 5])
    assert sorted(top_k_per_segment(values, owner, offsets, 1).tolist()) == [1, 4, 5]
    assert sorted(top_k_per_segment(values, owner, offsets, 2).tolist()) == [1, 2, 4, 5]


def test_minmax_and_passage_reset_by_hand():
    sim = torch.tensor([[0.2], [0.6], [0.4]])
    assert minmax(sim)[:, 0].tolist() == pytest.approx([0.0, 1.0, 0.5])
    assert minmax(torch.ones(3, 1)).abs().sum() == 0
    N = Csr.from_rows([[0], [1, 2], []], 3, [[2.0], [1.0, 3.0], []])
    N_log = N.with_values(torch.log1p(N.val)).torch()
    act = torch.tensor([[1.296], [1.728], [0.432]])
    tier = torch.tensor([[1], [2], [3]])
    cfg = RetrievalConfig(lam=0.05, passage_node_weight=0.05)
    got = passage_reset(sim, N_log, act, tier, cfg)[:, 0].tolist()
    want = [
        (0.05 * 0.0 + math.log(1 + 1.296 * math.log(3))) * 0.05,
        (0.05 * 1.0 + math.log(1 + 1.728 / 2 * math.log(2) + 0.432 / 3 * math.log(4))) * 0.05,
        (0.05 * 0.5 + 0.0) * 0.05,
    ]
    assert got == pytest.approx(want, rel=1e-6)
    inactive = passage_reset(sim, N_log, act, torch.zeros_like(tier), cfg)  # tier 0: no entity term
    assert inactive[:, 0].tolist() == pytest.approx([0.0, 0.05 * 0.05, 0.025 * 0.05])


def _dense_ppr(C: np.ndarray, r: np.ndarray, d: float, adjacent: bool) -> np.ndarray:
    """Solve x = (1-d) r + d (T x + (dangling . x) r) directly on the (P+E) x (P+E) graph."""
    P, E = C.shape
    A = np.zeros((P + E, P + E))
    A[:P, P:] = C
    A[P:, :P] = C.T
    if adjacent:
        for i in range(P - 1):
            A[i, i + 1] = A[i + 1, i] = 1.0
    strength = A.sum(1)
    T = np.divide(A, strength[:, None], out=np.zeros_like(A), where=strength[:, None] > 0).T  # column-stochastic
    dangling = (strength == 0).astype(float)
    K = T + np.outer(r, dangling)
    return np.linalg.solve(np.eye(P + E) - d * K, (1 - d) * r)


@pytest.mark.parametrize("adjacent", [False, True])
def test_personalized_pagerank_matches_a_direct_solve(adjacent):
    # passage 2 has no entity (dangling unless adjacent edges are on)
    C = np.array([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75], [0.0, 0.0, 0.0]])
    csr = Csr.from_rows([[0, 1], [1, 2], []], 3, [[0.5, 0.5], [0.25, 0.75], []])
    rng = np.random.default_rng(0)
    r = rng.random((6, 2))
    r[2, 1] = 0.0
    cfg = RetrievalConfig(damping=0.5, ppr_tol=1e-12, ppr_max_iter=500)
    xp, xe, valid = personalized_pagerank(PPRGraph.build(csr, adjacent), torch.tensor(r[:3]).float(), torch.tensor(r[3:]).float(), cfg)
    got = torch.cat([xp, xe]).numpy()
    for b in range(2):
        want = _dense_ppr(C, r[:, b] / r[:, b].sum(), 0.5, adjacent)
        assert np.allclose(got[:, b], want, atol=1e-6)
        assert got[:, b].sum() == pytest.approx(1.0, abs=1e-5)
    assert valid.all()


def test_pagerank_reset_cleaning_and_zero_reset():
    csr = Csr.from_rows([[0], [0]], 1, [[1.0], [1.0]])
    rp = torch.tensor([[float("nan"), 0.0], [-1.0, 0.0]])
    re = torch.tensor([[1.0, 0.0]])
    xp, xe, valid = personalized_pagerank(PPRGraph.build(csr), rp, re, RetrievalConfig())
    assert valid.tolist() == [True, False]
    # NaN and negatives become 0: all reset on the entity, passages symmetric
    assert xp[0, 0] == pytest.approx(float(xp[1, 0])) and float(xp[:, 0].sum() + xe[:, 0].sum()) == pytest.approx(1.0)
    assert xp[:, 1].abs().sum() == 0


def test_gauss_seidel_change_shrinks_above_the_floor_and_halves_the_steps():
    """pagerank.FLOOR_RULE_BELOW's premise: on random graphs (dangling nodes, adjacent passages, damping up to
    0.95) a block Gauss-Seidel step's L1 change never grows while it is between 1e-6 (above float32's floor)
    and 1e-3, and the result is the power iteration's fixed point in about half the steps."""
    import random

    from linearrag_torch.retrieval import pagerank
    from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
    from linearrag_torch.synthetic import random_index, random_queries

    checked = 0
    for t in range(80):
        rnd = random.Random(t)
        cfg = RetrievalConfig(damping=rnd.uniform(0.1, 0.95), adjacent_passages=rnd.random() < 0.5, ppr_tol=1e-9,
                              ppr_max_iter=400, chain_passages=0, pair_candidates=0, delta=0.2)
        ix = random_index(rnd.randint(2, 60), rnd.randint(2, 80), zipf=rnd.uniform(0, 1.5), dim=8, seed=t)
        q = random_queries(ix, 4, seed=t + 1)
        _, tr = retrieve(DeviceGraph(ix), q, cfg, trace="steps")
        changes = tr.ppr_steps.changes(q.batch_size)
        for col in torch.stack(changes).T if changes else []:
            c = col[~torch.isnan(col)].tolist()
            for a, b in zip(c, c[1:]):
                if 1e-6 < a < 1e-3:
                    assert b < a, (t, c)
                    checked += 1
    assert checked > 500
    # steps to 1e-6 on one graph: Gauss-Seidel against the plain power iteration (float64, the same fixed point)
    ix = random_index(200, 300, dim=8, seed=1)
    C = ix.C.scipy().toarray().astype(np.float64)
    P, E = C.shape
    rng = np.random.default_rng(2)
    r = rng.random(P + E)
    r /= r.sum()
    d = 0.7
    A = np.block([[np.zeros((P, P)), C], [C.T, np.zeros((E, E))]])
    strength = A.sum(1)
    T = np.divide(A, strength[:, None], out=np.zeros_like(A), where=strength[:, None] > 0).T
    dang = strength == 0
    x, power_steps = r.copy(), 0
    while True:
        new = (1 - d) * r + d * (T @ x + x[dang].sum() * r)
        power_steps += 1
        done, x = np.abs(new - x).sum() < 1e-6, new
        if done:
            break
    want = _dense_ppr(C, r, d, False)
    xp, xe, _ = personalized_pagerank(PPRGraph.build(ix.C), torch.tensor(r[:P, None]).float(),
                                      torch.tensor(r[P:, None]).float(), RetrievalConfig(damping=d, ppr_tol=1e-6))
    tr = pagerank.StepLog()
    personalized_pagerank(PPRGraph.build(ix.C), torch.tensor(r[:P, None]).float(), torch.tensor(r[P:, None]).float(),
                          RetrievalConfig(damping=d, ppr_tol=1e-6), steps=tr)
    assert np.abs(torch.cat([xp, xe]).double().numpy()[:, 0] - want).sum() < 2e-6
    assert len(tr) <= 0.6 * power_steps, (len(tr), power_steps)
