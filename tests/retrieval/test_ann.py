"""The ANN stage (RetrievalConfig.ann, retrieval/ann.py and local_round.py) against the exact one: an index searched
exhaustively (every IVF list probed) must give the exact product's answers (eq. 3's nearest entity, the top m
passages, and so the whole local round); a cached index must be read back, a stale one rebuilt."""
import warnings
import pytest
import torch

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.retrieval import ann
from linearrag_torch.retrieval.activation import nearest_entities
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.synthetic import random_index, random_queries

faiss = pytest.importorskip("faiss")

EVERY_LIST = 1 << 20  # ann_probe above any list count: the IVF search is exhaustive


def assert_same_ranking(got, want, tol=1e-6):
    """Equal scores (to float32 rounding: the cosines are summed in another order) and equal passages, but where
    two neighbouring places' scores are within the rounding (a near tie may fall either way)."""
    torch.testing.assert_close(got.scores, want.scores, atol=tol, rtol=1e-5)
    s = want.scores
    gap = torch.full_like(s, float("inf"))
    gap[:, 1:] = torch.minimum(gap[:, 1:], (s[:, :-1] - s[:, 1:]).abs())
    gap[:, :-1] = torch.minimum(gap[:, :-1], (s[:, :-1] - s[:, 1:]).abs())
    clear = gap > tol
    assert torch.equal(got.indices[clear], want.indices[clear])


def test_config_checks_the_ann_fields():
    with pytest.raises(ValueError, match="ann must be one of"):
        RetrievalConfig(ann="lsh")
    with pytest.raises(ValueError, match="ann_probe"):
        RetrievalConfig(ann_probe=0)
    with pytest.raises(ValueError, match="ann_lists"):
        RetrievalConfig(ann_lists=-1)


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_nearest_entity_matches_the_exact_scan(kind):
    index = random_index(200, 600, dim=16, seed=3)
    graph = DeviceGraph(index)
    queries = random_queries(index, batch=32, seed=5)
    # an exhaustive search (IVF: every list; HNSW: a candidate list as long as the entities)
    cfg = RetrievalConfig(ann=kind, ann_probe=EVERY_LIST if kind == "ivf" else 600)
    best, arg = ann.nearest_entities(graph, queries.entity_emb, None, cfg)
    want_best, want_arg = nearest_entities(graph.entity_emb, queries.entity_emb)
    assert torch.equal(arg, want_arg)
    torch.testing.assert_close(best, want_best)
    # a known row is its own answer and is not searched
    known = torch.full((arg.numel(),), -1, dtype=torch.int64)
    known[0] = 7
    searches = len(ann.built(graph)[("entity", kind, 0, "")].searches)
    _, arg2 = ann.nearest_entities(graph, queries.entity_emb, known, cfg)
    assert arg2[0] == 7 and torch.equal(arg2[1:], want_arg[1:])
    assert len(ann.built(graph)[("entity", kind, 0, "")].searches) == searches + 1  # still one search per batch


@pytest.mark.parametrize("minmax", ["global", "top"])
@pytest.mark.parametrize("chain", [0, 2])
def test_exhaustive_ivf_round_equals_the_exact_local_round(minmax, chain):
    """The local round on the ANN's candidates (no [P, B] product) gives the local round on the exact product's
    top m, chain rounds (their prior's floor and bridge entries) and the dense fallback included."""
    index = random_index(300, 500, dim=16, seed=4)
    graph = DeviceGraph(index)
    queries = random_queries(index, batch=24, seed=2)
    assert bool((queries.entity_owner.bincount(minlength=24) == 0).any())  # some questions fall back to dense
    # a push threshold far below the scores' gaps: both rounds' pushes land within 1e-8 of eq. 6 (the bound of
    # local_ppr), whatever order the rounding of their resets lets them push in
    cfg = RetrievalConfig(ppr_mode="local", ppr_eps=1e-8, reset_passages=40, reset_minmax=minmax,
                          chain_passages=chain, pair_candidates=0, top_k=8)
    want, wtr = retrieve(graph, queries, cfg, trace=True)
    got, gtr = retrieve(graph, queries, cfg.replace(ann="ivf", ann_probe=EVERY_LIST), trace=True)
    assert_same_ranking(got, want)
    assert torch.equal(gtr.dense, wtr.dense)
    assert {k[:2] for k in ann.built(graph)} == {("entity", "ivf"), ("passage", "ivf")}


@pytest.mark.parametrize("chain", [0, 2])
def test_ivfpq_round_equals_the_exact_local_round_where_every_row_is_a_candidate(chain):
    """ivfpq, made exact: with every list probed and fewer entities and passages than its rescored candidates (for
    eq. 3, the top m and the global min-max's low end), every row is rescored from the engine's vectors, so the round is the exact
    local round's whatever its codes (they only choose candidates); its codes are PQ (pq_codes sub-vectors)."""
    index = random_index(30, 30, dim=16, seed=4)  # the global min-max's low end: the best of 32 negated matches
    assert max(index.num_entities, index.num_passages) <= ann.PQ_CANDIDATES
    graph = DeviceGraph(index)
    queries = random_queries(index, batch=12, seed=2)
    cfg = RetrievalConfig(ppr_mode="local", ppr_eps=1e-8, reset_passages=30, chain_passages=chain, pair_candidates=0,
                          top_k=8)
    want = retrieve(graph, queries, cfg)
    got = retrieve(graph, queries, cfg.replace(ann="ivfpq", ann_probe=EVERY_LIST))
    assert_same_ranking(got, want)
    st = ann.built(graph)[("entity", "ivfpq", 0, "")]
    assert isinstance(st.index, faiss.IndexIVFPQ) and st.index.pq.M == ann.pq_codes(16) == 2


def test_ivfpq_codes_are_a_32nd_of_float32_and_find_most_nearest_entities():
    """At 384 dimensions an ivfpq code is 48 bytes (float32: 1,536); probing every list, its 32 rescored candidates
    hold the exact nearest entity of nearly every question entity (random unit vectors, their question entities
    near a stored one)."""
    assert ann.pq_codes(384) == 48 and ann.pq_codes(64) == 8 and ann.pq_codes(20) == 2
    index = random_index(2000, 12000, dim=64, seed=3)
    graph = DeviceGraph(index)
    queries = random_queries(index, batch=64, seed=5)
    cfg = RetrievalConfig(ann="ivfpq", ann_probe=EVERY_LIST)
    _, arg = ann.nearest_entities(graph, queries.entity_emb, None, cfg)
    _, want = nearest_entities(graph.entity_emb, queries.entity_emb)
    assert float((arg == want).float().mean()) >= 0.95
    st = ann.built(graph)[("entity", "ivfpq", 0, "")]
    assert st.index.code_size == 8 and st.nbytes() < graph.entity_emb.numel() * 4 / 4


def test_approximate_search_keeps_most_of_the_top_passages():
    """With few lists probed the answer may differ, but stays a valid ranking of real passages."""
    index = random_index(400, 500, dim=16, seed=6)
    graph = DeviceGraph(index)
    queries = random_queries(index, batch=16, seed=3)
    cfg = RetrievalConfig(ppr_mode="local", reset_passages=30, ann="ivf", ann_lists=20, ann_probe=2, top_k=5)
    out = retrieve(graph, queries, cfg)
    assert out.indices.shape == (16, 5)
    assert bool(((out.indices >= -1) & (out.indices < 400)).all())
    cand = ann.passage_candidates(graph, queries.query_emb, 30, cfg)
    assert bool((cand.low <= cand.prior.min()).all())
    # the candidates are real passages with their exact cosines
    want = (graph.passage_emb[cand.passage] * queries.query_emb[cand.question]).sum(1)
    torch.testing.assert_close(cand.cos, want)


def test_exact_stays_the_default_and_builds_nothing():
    index = random_index(100, 150, dim=16, seed=1)
    graph = DeviceGraph(index)
    retrieve(graph, random_queries(index, batch=4), RetrievalConfig(ppr_mode="local", reset_passages=20))
    assert ann.built(graph) == {}


def test_cache_is_written_read_back_and_rebuilt_when_stale(tmp_path):
    index = random_index(150, 300, dim=16, seed=8)
    queries = random_queries(index, batch=8, seed=4)
    cfg = RetrievalConfig(ppr_mode="local", reset_passages=20, ann="ivf", ann_cache=str(tmp_path))
    first = retrieve(DeviceGraph(index), queries, cfg)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len([f for f in files if f.endswith(".faiss")]) == 2 and len([f for f in files if f.endswith(".json")]) == 2
    graph = DeviceGraph(index)
    again = retrieve(graph, queries, cfg)
    assert all(st.from_cache for st in ann.built(graph).values())
    assert torch.equal(first.indices, again.indices)
    # other vectors (e.g. after adding passages): another fingerprint, a new file, not the stale one
    index.passage_emb = torch.nn.functional.normalize(torch.randn_like(index.passage_emb), dim=1)
    graph = DeviceGraph(index)
    retrieve(graph, queries, cfg)
    assert not ann.built(graph)[("passage", "ivf", 0, str(tmp_path))].from_cache
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".faiss"]) == 3


def test_cache_with_other_settings_is_not_read(tmp_path):
    vectors = torch.nn.functional.normalize(torch.randn(500, 8), dim=1)
    st = ann.AnnIndex.build(vectors, "ivf", 10)
    meta = {"kind": "ivf", "lists": 10, "rows": 500, "dim": 8}
    st.save(tmp_path / "x.faiss", meta)
    assert ann.AnnIndex.load(tmp_path / "x.faiss", {**meta, "lists": 11}) is None
    got = ann.AnnIndex.load(tmp_path / "x.faiss", meta)
    assert got.from_cache and got.rows == 500
    assert torch.equal(got.search(vectors[:5], 3, 10)[1], st.search(vectors[:5], 3, 10)[1])


def test_a_gpu_graph_keeps_the_exact_product_and_says_so():
    class FakeGraph:  # the stage reads only the device before it gives up
        device = torch.device("cuda")

    fake = FakeGraph()
    with pytest.warns(RuntimeWarning, match="exact product runs instead"):
        assert ann.stage(fake, "entity", RetrievalConfig(ann="ivf")) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per graph
        assert ann.stage(fake, "passage", RetrievalConfig(ann="ivf")) is None


def test_missing_faiss_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "faiss", None)
    index = random_index(50, 80, dim=16, seed=1)
    with pytest.raises(ImportError, match=r"linearrag_torch\[ann\]"):
        retrieve(DeviceGraph(index), random_queries(index, batch=2), RetrievalConfig(ann="hnsw"))


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_a_search_probe_goes_with_the_call_not_into_the_shared_index(kind):
    """Two searches with different probes, one after the other or at once from two threads (as two requests'
    settings do), each get their own probe's answer: the probe is never left in the index for the next search."""
    import threading

    vecs = torch.nn.functional.normalize(torch.randn(3000, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    q = vecs[:40] + 0.3 * torch.randn(40, 16, generator=torch.Generator().manual_seed(1))
    st = ann.AnnIndex.build(vecs, kind, lists=30)
    before = st.index.nprobe if kind == "ivf" else st.index.hnsw.efSearch
    narrow, wide = (1, 30) if kind == "ivf" else (10, 400)
    want = {p: st.search(q, 10, p)[1] for p in (narrow, wide)}
    assert not torch.equal(want[narrow], want[wide])  # the probes give different answers here
    assert (st.index.nprobe if kind == "ivf" else st.index.hnsw.efSearch) == before
    got, errors = {narrow: [], wide: []}, []

    def run(p):
        try:
            for _ in range(30):
                got[p].append(st.search(q, 10, p)[1])
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (narrow, wide)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for p in (narrow, wide):
        assert len(got[p]) == 30 and all(torch.equal(g, want[p]) for g in got[p])


def test_the_local_ann_round_sizes_its_chunks_without_the_corpus():
    """The ANN's local round forms no [P, B] tensor: its working memory per question (what sizes a batch's
    chunks) does not grow with the passages, where the exact round's does."""
    local = RetrievalConfig(ppr_mode="local", reset_passages=50, ann="ivf")
    small, large = (DeviceGraph(random_index(P, seed=0)) for P in (200, 2000))
    assert small.bytes_per_question(local) == large.bytes_per_question(local)
    assert large.bytes_per_question(RetrievalConfig()) > small.bytes_per_question(RetrievalConfig())
    assert large.bytes_per_question(local) < large.bytes_per_question(local.replace(ann="exact"))


def test_ann_auto_takes_the_ivf_stage_from_ppr_local_from_and_says_once_without_faiss(monkeypatch):
    """The defaults (ann auto) at and above ppr_local_from answer as ann ivfpq asked for (the stage is built), below it
    as the exact product (none built); where FAISS is missing they run the exact product with one warning."""
    index = random_index(400, 500, dim=16, seed=6)
    queries = random_queries(index, 6, seed=2)
    base = RetrievalConfig(reset_passages=40, ann_lists=8, ann_probe=2)
    graph = DeviceGraph(index)
    small = retrieve(graph, queries, base.replace(ppr_local_from=401))
    assert ann.built(graph) == {}
    want = retrieve(graph, queries, base.replace(ppr_local_from=401, ann="exact"))
    assert torch.equal(small.indices, want.indices) and torch.equal(small.scores, want.scores)
    auto = base.replace(ppr_local_from=400)
    got = retrieve(graph, queries, auto)
    assert {key[:2] for key in ann.built(graph)} == {("entity", "ivfpq"), ("passage", "ivfpq")}
    want = retrieve(DeviceGraph(index), queries, auto.replace(ppr_mode="local", ann="ivfpq"))
    assert torch.equal(got.indices, want.indices) and torch.equal(got.scores, want.scores)

    monkeypatch.setattr(ann, "faiss_available", lambda: False)
    bare = DeviceGraph(index)
    with pytest.warns(RuntimeWarning, match="FAISS is not installed") as caught:
        got = retrieve(bare, queries, auto)
        retrieve(bare, queries, auto)
    assert len([w for w in caught if "FAISS" in str(w.message)]) == 1 and ann.built(bare) == {}
    want = retrieve(bare, queries, auto.replace(ann="exact"))
    assert torch.equal(got.indices, want.indices) and torch.equal(got.scores, want.scores)
