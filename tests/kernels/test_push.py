"""The forward push's two implementations (linearrag_torch/kernels/push.py): the numba loop of CPU tensors against
the torch table that a GPU runs (here on CPU tensors, with LINEARRAG_KERNELS=torch). The same pushes in the same
rounds: equal top-k lists and statistics, estimates equal to float32 rounding. (tests/retrieval/test_local_ppr.py
holds both against the exact PageRank and its bound.)"""
import numpy as np
import pytest
import torch

from linearrag_torch.index.csr import Csr
from linearrag_torch.kernels.backends import kernels_mode, numba_available, use_numba
from linearrag_torch.kernels.push import forward_push
from linearrag_torch.retrieval.local_ppr import PushGraph

needs_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed (pip install '.[numba]')")


def walk(P, E, seed, adjacent=False):
    """A random passage-entity walk with a hub entity (in half the passages), passages without entities and
    entities in no passage (isolated nodes), random weights."""
    rng = np.random.default_rng(seed)
    dense = (rng.random((P, E)) < 0.1) * rng.random((P, E))
    dense[: P // 2, 0] = rng.random(P // 2) + 0.1  # the hub
    dense[:2] = 0
    dense[:, E - 3:] = 0
    dense = dense / np.maximum(dense.sum(1, keepdims=True), 1e-12)
    r, c = np.nonzero(dense)
    C = Csr.from_coo(torch.from_numpy(r), torch.from_numpy(c), torch.from_numpy(dense[r, c]).float(), (P, E))
    return PushGraph.build(C, adjacent)


def reset(g, B, seed):
    """Each question's reset: a few passages and entities (one on an isolated passage), normalised; question
    B - 1 has none. Returns the sorted distinct keys b * N + u and their residuals."""
    rng = np.random.default_rng(seed)
    N = g.num_nodes
    keys, vals = [], []
    for b in range(B - 1):
        nodes = np.unique(np.concatenate([rng.choice(N, 6, replace=False), [0] if b == 0 else []])).astype(np.int64)
        w = rng.random(nodes.size) + 0.05
        keys.append(b * N + nodes)
        vals.append(w / w.sum())
    return torch.from_numpy(np.concatenate(keys)), torch.from_numpy(np.concatenate(vals)).float()


def push(g, keys, res, B, eps, k, mode, workspace=None, d=0.5):
    with kernels_mode(mode):
        return forward_push(g.crow, g.col, g.val, g.strength, keys, res, g.num_passages, B, d, eps, 10_000, k,
                            workspace)


@needs_numba
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eps", [1e-2, 1e-4, 1e-6])
def test_the_numba_loop_equals_the_torch_table(seed, eps):
    g = walk(60, 90, seed, adjacent=seed % 2 == 1)
    B = 5
    keys, res = reset(g, B, seed + 10)
    k = 200  # more than a question touches at the larger thresholds: the -1 tail too
    ti, tv, ts = push(g, keys, res, B, eps, k, "torch")
    ni, nv, ns = push(g, keys, res, B, eps, k, "auto")
    assert use_numba(keys)
    assert torch.equal(ti, ni)
    torch.testing.assert_close(nv, tv, rtol=1e-5, atol=1e-9)
    assert ts == ns  # rounds, touched pairs, touched passages, neighbour updates
    assert (ni[B - 1] == -1).all() and (nv[B - 1] == 0).all()  # no reset: nothing touched
    assert ns[3] > 0


@needs_numba
def test_the_kept_arrays_are_clean_for_the_next_call_and_threads_change_nothing():
    """The workspace's per-thread arrays are reset at the touched nodes after each question: a call on reused
    arrays, and one split over two threads, equal a call on fresh ones."""
    g = walk(80, 120, 7)
    B = 9
    fresh = push(g, *reset(g, B, 1), B, 1e-5, 10, "auto")
    workspace = {}
    push(g, *reset(g, B, 2), B, 1e-5, 10, "auto", workspace)  # other questions first
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        again = push(g, *reset(g, B, 1), B, 1e-5, 10, "auto", workspace)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(fresh[0], again[0]) and torch.equal(fresh[1], again[1]) and fresh[2] == again[2]
    assert len(workspace["push_scratch"]) >= 1
    rm, p = workspace["push_scratch"][0]
    assert not rm[:, 0].any() and (rm[:, 1] == -1).all() and not p.any()
    # another walk with the same workspace: the arrays of the old size are not used
    h = walk(30, 40, 8)
    got = push(h, *reset(h, 3, 3), 3, 1e-5, 5, "auto", workspace)
    want = push(h, *reset(h, 3, 3), 3, 1e-5, 5, "torch")
    assert torch.equal(got[0], want[0])


def test_the_torch_table_ranks_equal_estimates_by_the_lower_passage():
    """A star: every passage holds entity 0 alone; from entity 0 every passage
    gets the same estimate: they rank by index (both implementations where numba imports)."""
    P, E = 5, 1
    C = Csr.from_coo(torch.arange(P), torch.zeros(P, dtype=torch.int64), torch.ones(P), (P, E))
    g = PushGraph.build(C)
    for mode in ("torch", "auto"):
        i, v, _ = push(g, torch.tensor([P]), torch.tensor([1.0]), 1, 1e-8, 5, mode)
        assert i[0].tolist() == [0, 1, 2, 3, 4]
        torch.testing.assert_close(v[0], torch.full((5,), v[0, 0].item()))


@pytest.mark.parametrize("mode", ["torch", "auto"])
def test_no_passage_asked_or_no_question(mode):
    """k = 0 (an index without passages) and a batch of none: empty answers, no error, in both implementations."""
    g = walk(20, 30, 5)
    keys, res = reset(g, 3, 5)
    i, v, stats = push(g, keys, res, 3, 1e-4, 0, mode)
    assert i.shape == (3, 0) and v.shape == (3, 0)
    i, v, stats = push(g, keys[:0], res[:0], 0, 1e-4, 5, mode)
    assert i.shape == (0, 5) and stats[3] == 0

