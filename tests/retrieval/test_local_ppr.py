"""The local PageRank (ppr_mode="local", retrieval/local_ppr.py) against the exact one: scipy's float64
iteration of eq. 6 run to 1e-13 is the oracle, and the forward push must land within its stated bound
(docs/METHOD.md, beside eq. 6): for every node v, 0 <= x_v - x~_v <= eps * str(v) / (1 - d * r(dangling))."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.index.csr import Csr
from linearrag_torch.kernels.backends import kernels_mode, numba_available
from linearrag_torch.retrieval import scipy_backend
from linearrag_torch.retrieval.activation import ColumnEntries
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.retrieval.local_ppr import PushGraph, local_pagerank, local_scores
from linearrag_torch.retrieval.pagerank import sparse_reset_entries, top_passages
from linearrag_torch.synthetic import random_index, random_queries


def random_C(P, E, seed, empty_passages=2, empty_entities=3):
    """A random weighted passage-entity matrix with rows summing to 1 (as the index's C), a few passages
    without entities and a few entities in no passage (isolated nodes: eq. 6's dangling ones)."""
    rng = np.random.default_rng(seed)
    dense = (rng.random((P, E)) < 0.15) * rng.integers(1, 4, (P, E))
    dense[:empty_passages] = 0
    dense[:, E - empty_entities:] = 0
    rows = dense.sum(1, keepdims=True)
    dense = np.where(rows > 0, dense / np.maximum(rows, 1), 0.0)
    r, c = np.nonzero(dense)
    return Csr.from_coo(torch.from_numpy(r), torch.from_numpy(c), torch.from_numpy(dense[r, c]).float(), (P, E))


def random_reset(P, E, B, seed):
    """A reset per column over passages and entities, some on isolated nodes, one column all zero."""
    rng = np.random.default_rng(seed)
    x = (rng.random((P + E, B)) < 0.08) * rng.random((P + E, B))
    x[0, 0] = 0.7  # an isolated passage (random_C leaves passages 0, 1 empty)
    x[:, B - 1] = 0.0  # no reset at all: not valid
    r, c = np.nonzero(x)
    return x, ColumnEntries(torch.from_numpy(r), torch.from_numpy(c), torch.from_numpy(x[r, c]).float(), x.shape)


def exact(C: Csr, x: np.ndarray, d: float, adjacent: bool) -> np.ndarray:
    """scipy_backend's eq. 6 per column, in float64 to 1e-13 (the oracle)."""
    cfg = RetrievalConfig(damping=d, ppr_tol=1e-13, ppr_max_iter=5000, adjacent_passages=adjacent)
    Cs = sp.csr_matrix((C.val.double().numpy(), C.col.numpy(), C.crow.numpy()), shape=C.shape)
    walk = scipy_backend.transition_matrix(Cs, adjacent)
    P = C.shape[0]
    out = np.zeros_like(x)
    for b in range(x.shape[1]):
        got = scipy_backend.personalized_pagerank(Cs, x[:P, b], x[P:, b], cfg, walk=walk)
        if got is not None:
            out[:, b] = got
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("eps", [1e-3, 1e-4, 1e-6])
@pytest.mark.parametrize("kernels", ["auto", "torch"])  # auto: the numba loop where numba imports
def test_push_is_within_its_bound_of_the_exact_pagerank(seed, eps, kernels):
    if kernels == "auto" and not numba_available():
        pytest.skip("numba not installed: 'auto' is the torch table, tested beside")
    P, E, B = 40, 60, 5
    d = [0.5, 0.7, 0.85][seed % 3]
    adjacent = seed % 2 == 1
    C = random_C(P, E, seed)
    x, reset = random_reset(P, E, B, seed + 100)
    want = exact(C, x, d, adjacent)
    g = PushGraph.build(C, adjacent)
    cfg = RetrievalConfig(damping=d, ppr_eps=eps, ppr_max_iter=10_000)
    with kernels_mode(kernels):
        got = local_scores(g, reset, B, cfg).double().numpy()
    strength = g.strength.double().numpy()
    dangling = strength == 0
    total = x.sum(0)
    r0 = x / np.where(total > 0, total, 1)
    bound = eps * strength[:, None] / (1 - d * r0[dangling].sum(0))[None, :]
    err = want - got
    assert (err >= -1e-6).all()  # the push never overshoots (float32 rounding aside)
    assert (err <= bound + 1e-6).all(), np.max(err - bound)
    assert np.all(got[:, B - 1] == 0)  # a column without reset: zeros (the caller falls back to dense)
    # a passage's strength is 1 (+ its adjacent passages): every passage score within eps (+2 eps) / (1 - ...)
    assert np.all(strength[2:P] <= (3.0 if adjacent else 1.0) + 1e-5)


def test_push_matches_the_exact_engine_graph_on_its_own_graph():
    """The push graph is the walk of pagerank.PPRGraph: on an index's C, the push with a tiny threshold and the
    torch engine's exact iteration give the same scores."""
    index = random_index(60, 90, seed=2)
    C = index.C
    P, E = C.shape
    x, reset = random_reset(P, E, 4, 7)
    want = exact(C, x, 0.7, False)
    got = local_scores(PushGraph.build(C), reset, 4, RetrievalConfig(damping=0.7, ppr_eps=1e-9,
                                                                          ppr_max_iter=10_000))
    np.testing.assert_allclose(got.numpy(), want, atol=2e-6)


def test_a_batch_equals_one_question_at_a_time():
    C = random_C(50, 80, 3)
    x, reset = random_reset(50, 80, 6, 11)
    g = PushGraph.build(C)
    cfg = RetrievalConfig(ppr_eps=1e-5)
    idx, val, valid = local_pagerank(g, ColumnEntries(reset.row[reset.row < 50], reset.col[reset.row < 50],
                                                      reset.val[reset.row < 50], None),
                                     ColumnEntries(reset.row[reset.row >= 50] - 50, reset.col[reset.row >= 50],
                                                   reset.val[reset.row >= 50], None), 6, cfg, 7)
    assert valid.tolist() == [True] * 5 + [False]
    for b in range(6):
        at = reset.col == b
        rp, re = at & (reset.row < 50), at & (reset.row >= 50)
        one = local_pagerank(g, ColumnEntries(reset.row[rp], reset.col[rp] * 0, reset.val[rp], None),
                             ColumnEntries(reset.row[re] - 50, reset.col[re] * 0, reset.val[re], None), 1, cfg, 7)
        assert torch.equal(one[0][0], idx[b])
        torch.testing.assert_close(one[1][0], val[b], rtol=1e-5, atol=1e-8)


def hub_graph(passages):
    """A ring of 20 small passages sharing entities, plus ``passages`` passages that each hold the hub entity
    (id 0) and one entity of their own; passage 0 of the ring holds the hub too."""
    rows, cols = [], []
    for p in range(20):  # ring: passage p holds entities 1 + p and 1 + (p + 1) % 20
        rows += [p, p]
        cols += [1 + p, 1 + (p + 1) % 20]
    rows.append(0)
    cols.append(0)
    for j in range(passages):
        rows += [20 + j, 20 + j]
        cols += [0, 21 + j]
    r, c = torch.tensor(rows), torch.tensor(cols)
    P, E = 20 + passages, 21 + passages
    ones = torch.ones(r.numel())
    per = torch.zeros(P).index_add_(0, r, ones)
    return Csr.from_coo(r, c, (ones / per[r]).float(), (P, E))


def test_a_hub_does_not_pull_in_its_neighbourhood():
    """An entity held by every passage but the seed's ring: the degree-normalised threshold keeps the push from
    spreading over it, so the work does not grow with the hub's degree, and the result stays within the bound."""
    cfg = RetrievalConfig(damping=0.7, ppr_eps=1e-4, ppr_max_iter=10_000)
    seen = {}
    for n in (2_000, 20_000):
        C = hub_graph(n)
        g = PushGraph.build(C)
        reset_p = ColumnEntries(torch.tensor([3, 5]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0]), None)
        none = ColumnEntries(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0), None)
        stats = []
        idx, val, _ = local_pagerank(g, reset_p, none, 1, cfg, 5, stats)
        seen[n] = stats[0]
        assert set(idx[0].tolist()) <= set(range(20))  # the ring's passages lead
        if n == 2_000:
            x = np.zeros((C.shape[0] + C.shape[1], 1))
            x[[3, 5], 0] = 1.0
            want = exact(C, x, 0.7, False)[:C.shape[0], 0]
            np.testing.assert_allclose(val[0].numpy(), want[idx[0].numpy()], atol=1e-4 + 1e-6)
    assert seen[20_000].touched <= seen[2_000].touched
    assert seen[20_000].pushed <= seen[2_000].pushed
    assert seen[20_000].touched < 2_000  # far from the hub's degree


def test_top_passages_normalisations():
    sim = torch.tensor([[0.1, 0.5], [0.9, 0.5], [0.4, 0.5], [0.2, 0.5]])
    idx, val = top_passages(sim, 2, "global")
    assert idx[:, 0].tolist() == [1, 2]
    torch.testing.assert_close(val[:, 0], torch.tensor([1.0, 0.375]))
    assert val[:, 1].tolist() == [0.0, 0.0]  # equal cosines: 0
    _, val = top_passages(sim, 2, "top")
    torch.testing.assert_close(val[:, 0], torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("norm", ["global", "top"])
def test_sparse_reset_entries_equal_the_dense_reset(norm):
    index = random_index(80, 120, seed=9)
    graph = DeviceGraph(index)
    queries = random_queries(index, 5, seed=2)
    sim = graph.passage_cosines(queries.query_emb)
    cfg = RetrievalConfig(reset_passages=10, reset_minmax=norm)
    a = ColumnEntries(torch.tensor([0, 3, 3, 7]), torch.tensor([0, 1, 4, 4]), torch.tensor([0.5, 1.0, 0.25, 2.0]),
                      (120, 5))
    from linearrag_torch.retrieval.pagerank import passage_reset_entries
    dense = passage_reset_entries(sim, graph.N_logT, a, cfg)
    e = sparse_reset_entries(sim, graph.N_logT, a, cfg)
    got = torch.zeros_like(dense).index_put_((e.row, e.col), e.val, accumulate=True)
    torch.testing.assert_close(got, dense, rtol=1e-5, atol=1e-7)
    assert int((dense > 0).sum(0).max()) <= 10 + 3 * 8  # the top 10 and the active entities' passages


@pytest.mark.parametrize("cfg", [RetrievalConfig(delta=0.2, reset_passages=30),
                                 RetrievalConfig(delta=0.2, reset_passages=30, reset_minmax="top", chain_passages=0,
                                                 adjacent_passages=True),
                                 RetrievalConfig(delta=0.2, reset_passages=0, mode="paper")],
                         ids=["default", "top, one round, adjacent", "every passage, paper"])
def test_engine_local_mode_against_the_scipy_oracle(cfg):
    """The whole query path in local mode against the scipy reference (exact PageRank, same sparse reset):
    top-k identical but where scores tie within the bound, scores within it."""
    index = random_index(300, 400, dim=16, seed=4)
    queries = random_queries(index, 24, seed=3)
    eps = 1e-7
    got = retrieve(DeviceGraph(index), queries, cfg.replace(ppr_mode="local", ppr_eps=eps))
    want = scipy_backend.retrieve(index, queries, cfg.replace(ppr_tol=1e-10, ppr_max_iter=2000))
    tol = 3 * eps + 2e-6  # the bound on passages of strength <= 3 (adjacent passages), float32 rounding
    sa, sb = got.scores.numpy(), want.scores.numpy()
    np.testing.assert_allclose(sa, sb, atol=tol)
    for row, j in zip(*np.nonzero(got.indices.numpy() != want.indices.numpy())):
        assert np.isclose(sb[row], sb[row, j], atol=2 * tol).sum() > 1 or abs(sb[row, j] - sb[row, -1]) <= 2 * tol


def test_exact_mode_with_a_sparse_reset_matches_scipy():
    index = random_index(300, 400, dim=16, seed=4)
    queries = random_queries(index, 16, seed=5)
    for norm in ("global", "top"):
        cfg = RetrievalConfig(delta=0.2, reset_passages=25, reset_minmax=norm, ppr_tol=1e-7)
        got = retrieve(DeviceGraph(index), queries, cfg)
        want = scipy_backend.retrieve(index, queries, cfg)
        np.testing.assert_allclose(got.scores.numpy(), want.scores.numpy(), rtol=1e-4, atol=1e-6)


def test_local_mode_settings_are_checked():
    with pytest.raises(ValueError, match="ppr_mode"):
        RetrievalConfig(ppr_mode="fast")
    with pytest.raises(ValueError, match="ppr_eps"):
        RetrievalConfig(ppr_eps=0)
    with pytest.raises(ValueError, match="reset_passages"):
        RetrievalConfig(reset_passages=-1)
    with pytest.raises(ValueError, match="ppr_local_from"):
        RetrievalConfig(ppr_local_from=-1)


def test_auto_mode_resolves_by_the_corpus_size():
    """ppr_mode auto: the exact walk below ppr_local_from passages, the local one with a 2,000-passage sparse
    reset (or the one asked for) from there; explicit modes untouched; an engine without the local walk exact.
    ann auto: FAISS's IVF-PQ where the local walk with a sparse reset runs from ppr_local_from on and the engine can
    take it (ann_ready), else the exact product."""
    cfg = RetrievalConfig()
    assert cfg.ppr_mode == "auto" and cfg.ppr_local_from == 100_000 and cfg.ann == "auto"
    for ready in (False, True):
        assert cfg.for_corpus(99_999, ann_ready=ready) == cfg.replace(ppr_mode="exact", ann="exact")
        assert cfg.for_corpus(10 ** 6, local=False, ann_ready=ready) == cfg.replace(ppr_mode="exact", ann="exact")
    assert cfg.for_corpus(100_000) == cfg.replace(ppr_mode="local", reset_passages=2000, ann="exact")
    assert cfg.for_corpus(100_000, ann_ready=True) == cfg.replace(ppr_mode="local", reset_passages=2000, ann="ivfpq")
    assert cfg.replace(reset_passages=500).for_corpus(10 ** 6).reset_passages == 500
    # an explicit local walk takes the ANN stage from the same size on; without a sparse reset it has no top-m scan
    assert cfg.replace(ppr_mode="local", reset_passages=100).for_corpus(10 ** 6, ann_ready=True).ann == "ivfpq"
    assert cfg.replace(ppr_mode="local").for_corpus(10 ** 6, ann_ready=True).ann == "exact"
    assert cfg.replace(ppr_mode="exact").for_corpus(10 ** 6, ann_ready=True).ann == "exact"
    for mode in ("exact", "local"):
        fixed = cfg.replace(ppr_mode=mode, ann="exact")
        assert fixed.for_corpus(10) is fixed and fixed.for_corpus(10 ** 7, ann_ready=True) is fixed
    assert cfg.replace(ann="hnsw").for_corpus(10, ann_ready=True).ann == "hnsw"


@pytest.mark.parametrize("threshold", [0, 301], ids=["local from 0", "exact below 301"])
def test_engine_auto_mode_is_the_mode_it_resolves_to(threshold):
    """Both engines in auto give the bits of the mode it names for the index's 300 passages (the torch one
    traced: the local rows count pushes, the exact ones steps of the whole walk)."""
    index = random_index(300, 400, dim=16, seed=4)
    queries = random_queries(index, 12, seed=3)
    auto = RetrievalConfig(delta=0.2, ppr_local_from=threshold, reset_passages=30)
    fixed = auto.replace(ppr_mode="local" if threshold == 0 else "exact")
    graph = DeviceGraph(index)
    got, tr = retrieve(graph, queries, auto, trace="steps")
    want = retrieve(graph, queries, fixed)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.scores, want.scores)
    assert bool(tr.ppr_steps.pushes) == (threshold == 0)
    ref_auto, ref_fixed = scipy_backend.retrieve(index, queries, auto), scipy_backend.retrieve(index, queries, fixed)
    assert torch.equal(ref_auto.indices, ref_fixed.indices) and torch.equal(ref_auto.scores, ref_fixed.scores)
