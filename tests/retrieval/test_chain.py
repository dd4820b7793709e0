"""The second retrieval round (chain.py): seeds by hand, the merge by hand, both backends agree."""
import dataclasses

import pytest
import torch

from linearrag_torch.retrieval import scipy_backend
from linearrag_torch.retrieval.activation import seed_pairs
from linearrag_torch.retrieval.chain import (ChainSeeds, ChainTables, chain_seeds, chain_sources, merge, passage_prior,
                                            second_round_queries)
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.index import TriGraphIndex
from linearrag_torch.queries import EncodedQueries, PassagePrior, Retrieved
from linearrag_torch.index.csr import Csr
from linearrag_torch.synthetic import random_index, random_queries

from test_backends_agree import assert_same


def _unit(rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.norm(dim=1, keepdim=True)


def tiny_index():
    """p0: s0 {e0, e1}, s1 {e2};  p1: s2 {e1, e3};  p2: s3 {e3}. With q = x: sigma = .8, .6, .6, 0."""
    M = Csr.from_rows([[0, 1], [2], [1, 3], [3]], 4)
    PS = Csr.from_rows([[0, 1], [2], [3]], 4)
    C = Csr.from_rows([[0, 1, 2], [1, 3], [3]], 4, [[1 / 3] * 3, [0.5, 0.5], [1.0]])
    return TriGraphIndex(
        passage_ids=[0, 1, 2], titles=["a", "b", "c"], texts=["", "", ""], sentences=["", "", "", ""],
        entities=["e0", "e1", "e2", "e3"],
        passage_emb=_unit([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]),
        sentence_emb=_unit([[0.8, 0.6, 0, 0], [0.6, 0.8, 0, 0], [0.6, 0, 0.8, 0], [0, 0, 0, 1]]),
        entity_emb=torch.eye(4), M=M, C=C, N=C.with_values(torch.ones(C.nnz)), PS=PS,
    )


def one_question(entities: bool = True):
    """q = x, with one question entity (a question without any gets no chain seeds: it is answered densely)."""
    if entities:
        return EncodedQueries(torch.tensor([[1.0, 0, 0, 0]]), torch.tensor([[0.0, 0, 1, 0]]), torch.tensor([0]), ["e2"])
    return EncodedQueries(torch.tensor([[1.0, 0, 0, 0]]), torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), [])


def seeds_of(ix, queries, first, cfg, used=None):
    """One round's chain seeds as per-question dicts, and the used sources after it ([B, U] as sets)."""
    B = queries.batch_size
    used = torch.zeros((B, 0), dtype=torch.int64) if used is None else used
    source, used = chain_sources(first, queries.has_entities(), used, cfg)
    seeds = chain_seeds(ChainTables.build(ix, "cpu"), queries, first, source, cfg)
    return seeds.to_dicts(B), used


def used_sets(used):
    return [{p for p in row if p >= 0} for row in used.tolist()]


def test_chain_seeds_by_hand():
    first = Retrieved(torch.tensor([[0, 1, 2]]), torch.tensor([[0.5, 0.25, 0.1]]))
    cfg = RetrievalConfig(chain_passages=2, chain_sentences=1, chain_weight=1.0)
    # p0 (share 1): best sentence s0 (sigma .8) -> e0, e1 at .8;  p1 (share .5): s2 (sigma .6) -> e1 at .3
    # (e1 keeps .8), e3 at .3;  p2 is not among the top 2
    seeds, _ = seeds_of(tiny_index(), one_question(), first, cfg)
    assert seeds[0].keys() == {0, 1, 3}
    assert [seeds[0][e] for e in (0, 1, 3)] == pytest.approx([0.8, 0.8, 0.3])
    # two sentences per passage: p0's s1 (sigma .6) adds e2 at .6; the weight scales every seed
    seeds, _ = seeds_of(tiny_index(), one_question(), first, cfg.replace(chain_sentences=2, chain_weight=0.5))
    assert {e: round(w, 6) for e, w in seeds[0].items()} == {0: 0.4, 1: 0.4, 2: 0.3, 3: 0.15}


def test_chain_seeds_of_a_batch_are_each_questions_own():
    """Three questions at once: each gets what it gets alone (a question without entities nothing, a top
    score of 0 nothing, though its sources count as used), ties between sentences go to the lower one."""
    ix = tiny_index()
    q = one_question()
    three = EncodedQueries(q.query_emb.repeat(3, 1), q.entity_emb.repeat(2, 1), torch.tensor([0, 2]), ["e2", "e2"])
    first = Retrieved(torch.tensor([[0, 1, 2], [0, 1, 2], [2, 1, -1]]),
                      torch.tensor([[0.5, 0.25, 0.1], [0.5, 0.25, 0.1], [0.0, 0.0, 0.0]]))
    cfg = RetrievalConfig(chain_passages=2, chain_sentences=1, chain_weight=1.0)
    seeds, used = seeds_of(ix, three, first, cfg)
    alone, _ = seeds_of(ix, q, Retrieved(first.indices[:1], first.scores[:1]), cfg)
    assert seeds[0] == alone[0] and seeds[1] == {} and seeds[2] == {}
    assert used_sets(used) == [{0, 1}, set(), {2, 1}]
    # p0's s0 and s1 tie (sigma .6 both): s0, the lower, is taken
    ix.sentence_emb[0] = ix.sentence_emb[1]
    seeds, _ = seeds_of(ix, q, Retrieved(torch.tensor([[0]]), torch.tensor([[1.0]])), cfg)
    assert seeds[0].keys() == {0, 1}


def test_second_round_seeds_are_the_chain_entities_with_their_weights():
    ix = tiny_index()
    q = one_question(entities=False)
    enc = second_round_queries(ChainTables.build(ix, "cpu"), q, seeds_from([{0: 0.8, 3: 0.3}]))
    keys, vals = seed_pairs(ix.entity_emb, enc.entity_emb, enc.entity_owner, 1)
    assert keys.tolist() == [0, 3] and vals.tolist() == pytest.approx([0.8, 0.3])
    assert list(enc.entity_text) == ["e0", "e3"]  # names read when asked for


def test_merge_keeps_the_first_rounds_top_then_the_second_round():
    first = Retrieved(torch.tensor([[4, 2, 7]]), torch.tensor([[0.5, 0.3, 0.1]]))
    second = Retrieved(torch.tensor([[2, 9, 4, 1]]), torch.tensor([[0.6, 0.2, 0.1, 0.05]]))
    out = merge(first, second, keep=1, k=3)
    # 4 is kept first with its second-round score .1 (the second round lists it)
    assert out.indices.tolist() == [[4, 2, 9]] and out.scores[0].tolist() == pytest.approx([0.1, 0.6, 0.2])
    out = merge(first, second, keep=0, k=3)
    assert out.indices.tolist() == [[2, 9, 4]]


def test_chain_off_is_one_round():
    index = random_index(60, 80, dim=8, seed=1)
    queries = random_queries(index, 5, seed=2)
    g = DeviceGraph(index)
    a = retrieve(g, queries, RetrievalConfig(delta=0.2, chain_passages=0))
    b = retrieve(g, queries, RetrievalConfig(delta=0.2, chain_passages=0, chain_keep=3, chain_sentences=4,
                                             chain_rounds=3, chain_passage_weight=7.0))
    assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)
    assert RetrievalConfig.reference_code().chain_passages == 0


@pytest.mark.parametrize("mode", ["reference"])  # paper mode answers in one round (chain.enabled)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_and_scipy_agree_with_a_second_round(mode, seed):
    index = random_index(120, 150, dim=12, seed=seed)
    queries = random_queries(index, 6, seed=seed + 10)
    cfg = RetrievalConfig(mode=mode, delta=0.2, top_k=6, chain_passages=2, chain_sentences=2, chain_keep=1)
    got = retrieve(DeviceGraph(index), queries, cfg)
    want = scipy_backend.retrieve(index, queries, cfg)
    assert_same(got, want)
    # the second round changes the answer somewhere (else this test would test nothing)
    one = retrieve(DeviceGraph(index), queries, cfg.replace(chain_passages=0))
    assert not torch.equal(one.indices, got.indices)


def test_later_rounds_take_new_source_passages():
    ix = tiny_index()
    first = Retrieved(torch.tensor([[0, 1, 2]]), torch.tensor([[0.5, 0.25, 0.1]]))
    cfg = RetrievalConfig(chain_passages=1, chain_sentences=1, chain_weight=1.0)
    seeds, used = seeds_of(ix, one_question(), first, cfg)
    assert seeds[0].keys() == {0, 1} and used_sets(used) == [{0}]  # p0's s0
    # the next round passes over p0: p1 (share .5, s2 sigma .6) gives e1, e3 at .3
    seeds, used = seeds_of(ix, one_question(), first, cfg, used)
    assert seeds[0].keys() == {1, 3} and seeds[0][3] == pytest.approx(0.3) and used_sets(used) == [{0, 1}]


def test_title_line_is_not_a_chain_sentence():
    ix = tiny_index()
    ix.sentences[0] = "a"  # s0 is now p0's title line: p0's best other sentence is s1 (sigma .6, e2)
    first = Retrieved(torch.tensor([[0, 1, 2]]), torch.tensor([[0.5, 0.25, 0.1]]))
    seeds, _ = seeds_of(ix, one_question(), first, RetrievalConfig(chain_passages=1, chain_weight=1.0))
    assert seeds[0].keys() == {2} and seeds[0][2] == pytest.approx(0.6)
    assert seeds_of(ix, one_question(entities=False), first, RetrievalConfig(chain_passages=1))[0] == [{}]


@pytest.mark.parametrize("rounds", [1, 2])
def test_rounds_agree_across_backends_and_keep_each_rounds_top(rounds):
    index = random_index(150, 160, dim=12, seed=7)
    queries = random_queries(index, 5, seed=8)
    cfg = RetrievalConfig(delta=0.2, top_k=6, chain_passages=1, chain_rounds=rounds, pair_candidates=0)  # (test_pairs.py)
    got = retrieve(DeviceGraph(index), queries, cfg)
    assert_same(got, scipy_backend.retrieve(index, queries, cfg))
    first = retrieve(DeviceGraph(index), queries, cfg.replace(chain_passages=0))
    assert torch.equal(got.indices[:, 0], first.indices[:, 0])  # chain_keep = 1: round 1's best stays first
    assert got.indices.shape == (5, 6)


def test_explain_style_trace_comes_from_the_last_round():
    index = random_index(80, 90, dim=8, seed=3)
    queries = random_queries(index, 3, seed=4)
    cfg = RetrievalConfig(delta=0.2, top_k=4, chain_passages=1)
    out, tr = retrieve(DeviceGraph(index), queries, cfg, trace=True)
    plain, tr1 = retrieve(DeviceGraph(index), queries, cfg.replace(chain_passages=0), trace=True)
    assert torch.equal(out.indices, retrieve(DeviceGraph(index), queries, cfg).indices)
    assert int(tr.is_seed.sum()) >= int(tr1.is_seed.sum())  # the chain seeds join the question's


def test_paper_mode_and_entity_less_questions_answer_in_one_round():
    index = random_index(60, 80, dim=8, seed=11)
    queries = random_queries(index, 6, seed=12)
    g = DeviceGraph(index)
    for backend in (lambda c: retrieve(g, queries, c), lambda c: scipy_backend.retrieve(index, queries, c)):
        paper = backend(RetrievalConfig(mode="paper", delta=0.2, chain_passages=2))
        one = backend(RetrievalConfig(mode="paper", delta=0.2, chain_passages=0))
        assert torch.equal(paper.indices, one.indices)
    # a question without entities keeps its dense ranking (cosines) with the chain on
    no_ent = EncodedQueries(queries.query_emb[:1], queries.entity_emb[:0], queries.entity_owner[:0], [])
    out = retrieve(g, no_ent, RetrievalConfig(chain_passages=2, top_k=5))
    cos = index.passage_emb @ queries.query_emb[0]
    assert out.indices[0].tolist() == torch.sort(cos, descending=True, stable=True).indices[:5].tolist()
    torch.testing.assert_close(out.scores[0], cos[out.indices[0]])


def test_merge_gives_a_kept_passage_its_second_round_score():
    first = Retrieved(torch.tensor([[4, 2]]), torch.tensor([[0.5, 0.3]]))
    second = Retrieved(torch.tensor([[2, 4, 9]]), torch.tensor([[0.6, 0.6, 0.2]]))
    out = merge(first, second, keep=1, k=3)
    assert out.indices.tolist() == [[4, 2, 9]] and out.scores[0].tolist() == pytest.approx([0.6, 0.6, 0.2])


def test_chain_seeds_take_their_own_row_unless_another_entity_has_their_tokens():
    """A chain seed is its entity's stored vector: with token keys, a seed whose tokens no other entity has
    carries its row (the engine skips the scan), one sharing them (e1, e3 here) is scanned; the seeds equal
    the scan's either way, and an index without keys scans them all (as before)."""

    from linearrag_torch.index.graph import TokenKeys

    base = tiny_index()
    emb = base.entity_emb.clone()
    emb[3] = emb[1]  # e1 and e3: equal tokens, so equal vectors
    keys = TokenKeys(torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
                     torch.tensor([10, 11, 12, 11]))
    ix = dataclasses.replace(base, entity_emb=emb, keys=keys)
    q = one_question()  # its entity e2 was encoded (row -1)
    seeds = seeds_from([{0: 0.8, 1: 0.3, 3: 0.5}])
    enc = second_round_queries(ChainTables.build(ix, "cpu"), q, seeds)
    assert enc.rows_of is ix and enc.entity_rows.tolist() == [-1, 0, -1, -1]
    known = seed_pairs(ix.entity_emb, enc.entity_emb, enc.entity_owner, 1, enc.entity_rows)
    scan = seed_pairs(ix.entity_emb, enc.entity_emb, enc.entity_owner, 1)
    assert torch.equal(known[0], scan[0]) and torch.allclose(known[1], scan[1], atol=1e-7)
    assert second_round_queries(ChainTables.build(base, "cpu"), q, seeds).entity_rows is None  # no keys: all scan
    graph = DeviceGraph(ix)
    cfg = RetrievalConfig(chain_passages=2, chain_sentences=2, delta=0.1)
    out = retrieve(graph, q, cfg)
    assert_same(out, scipy_backend.retrieve(ix, q, cfg))


def seeds_from(dicts):
    """ChainSeeds from per-question {entity: w} dicts."""
    entries = [(b, e, w) for b, d in enumerate(dicts) for e, w in d.items()]
    q, e, w = zip(*entries) if entries else ((), (), ())
    return ChainSeeds.from_entries(torch.tensor(q, dtype=torch.int64), torch.tensor(e, dtype=torch.int64),
                                   torch.tensor(w, dtype=torch.float64), 4)


def prior_of(ix, queries, dicts, cfg):
    return passage_prior(ChainTables.build(ix, "cpu"), queries, seeds_from(dicts), cfg)


def _entries(prior):
    return sorted((r, c, round(v, 6)) for r, c, v in zip(prior.row.tolist(), prior.col.tolist(), prior.val.tolist()))


def test_passage_prior_by_hand():
    """Later rounds' eq. 7 prior: per passage, the best cosine of a sentence that mentions a chain seed."""
    ix, q, cfg = tiny_index(), one_question(), RetrievalConfig()
    # e1 is in s0 (p0, cosine .8) and s2 (p1, .6)
    prior = prior_of(ix, q, [{1: 0.5}], cfg)
    assert prior.floor == pytest.approx(0.1) and _entries(prior) == [(0, 0, 0.8), (1, 0, 0.6)]
    # e3 is in s2 (p1, .6) and s3 (p2, 0); e0 and e3 together: the best sentence of each passage
    assert _entries(prior_of(ix, q, [{3: 1.0}], cfg)) == [(1, 0, 0.6), (2, 0, 0.0)]
    assert _entries(prior_of(ix, q, [{0: 1.0, 3: 1.0}], cfg)) == [(0, 0, 0.8), (1, 0, 0.6), (2, 0, 0.0)]
    # a passage's own title line is not taken: s0 becomes p0's title, so p0 has no such sentence left
    ix = dataclasses.replace(ix, sentences=["a"] + ix.sentences[1:])
    assert _entries(prior_of(ix, q, [{1: 0.5}], cfg)) == [(1, 0, 0.6)]
    # the switches: the floor alone, and both off
    floor_only = prior_of(ix, q, [{1: 0.5}], cfg.replace(chain_bridge_prior=False))
    assert floor_only.floor == pytest.approx(0.1) and _entries(floor_only) == []
    assert prior_of(ix, q, [{1: 0.5}], cfg.replace(chain_bridge_prior=False, chain_prior_floor=-1.0)) is None
    # questions without chain seeds get no entries; the columns are the questions
    two = EncodedQueries(torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]]), torch.zeros(0, 4),
                         torch.zeros(0, dtype=torch.int64), [])
    assert _entries(prior_of(tiny_index(), two, [{}, {3: 1.0}], cfg)) == [(1, 1, 0.0), (2, 1, 1.0)]


def test_passage_prior_raises_the_cosines_and_follows_the_questions():
    sim = torch.tensor([[0.05, 0.3], [0.5, -0.2], [0.2, 0.0]])  # [P = 3, B = 2]
    prior = PassagePrior(0.1, torch.tensor([1, 2, 0]), torch.tensor([1, 0, 0]), torch.tensor([0.4, 0.15, 0.01]))
    torch.testing.assert_close(prior.apply(sim), torch.tensor([[0.1, 0.3], [0.5, 0.4], [0.2, 0.1]]))
    torch.testing.assert_close(sim, torch.tensor([[0.05, 0.3], [0.5, -0.2], [0.2, 0.0]]))  # a new tensor
    kept = prior.select(torch.tensor([-1, 0]))  # question 1 alone, now column 0
    assert _entries(kept) == [(1, 0, 0.4)] and kept.floor == pytest.approx(0.1)
    q = EncodedQueries(torch.eye(2, 4), torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), [], prior=prior)
    assert _entries(q.slice(1, 2).prior) == [(1, 0, 0.4)] and _entries(q.to("cpu").prior) == _entries(prior)


@pytest.mark.parametrize("floor,bridge", [(0.1, True), (-1.0, True), (0.3, False)])
def test_torch_and_scipy_agree_with_the_later_round_prior(floor, bridge):
    index = random_index(120, 150, dim=12, seed=5)
    queries = random_queries(index, 6, seed=15)
    cfg = RetrievalConfig(delta=0.2, top_k=6, chain_prior_floor=floor, chain_bridge_prior=bridge)
    got = retrieve(DeviceGraph(index), queries, cfg)
    assert_same(got, scipy_backend.retrieve(index, queries, cfg))
    # the prior changes the later round's scores (else this would test nothing)
    off = retrieve(DeviceGraph(index), queries, cfg.replace(chain_prior_floor=-1.0, chain_bridge_prior=False))
    assert not torch.allclose(off.scores, got.scores)


def test_pair_cosines_are_each_pairs_own():
    """chain.pair_cosines: each (question, sentence) pair's dot product (float64 check), the same bits for a
    question alone as in its batch; half-precision sentence vectors give float32 values too."""
    from linearrag_torch.retrieval.chain import pair_cosines

    g = torch.Generator().manual_seed(3)
    sent_emb, q = torch.randn(40, 8, generator=g), torch.randn(5, 8, generator=g)
    b = torch.tensor([0, 0, 0, 2, 2, 3, 4, 4, 4, 4])  # sorted by question; question 1 has no pair
    s = torch.tensor([3, 7, 39, 3, 7, 0, 1, 3, 7, 20])
    want = (sent_emb.double()[s] * q.double()[b]).sum(1)
    got = pair_cosines(sent_emb, q, s, b)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, atol=1e-5)
    alone = pair_cosines(sent_emb, q[4:], s[b == 4], torch.zeros(4, dtype=torch.int64))
    assert torch.equal(alone, got[b == 4])
    half = pair_cosines(sent_emb.half(), q, s, b)
    assert half.dtype == torch.float32 and torch.allclose(half.double(), want, atol=2e-2)
    assert pair_cosines(sent_emb, q, s[:0], b[:0]).numel() == 0


def test_pair_cosines_without_the_sampled_product(monkeypatch):
    """A torch or device without torch.sparse.sampled_addmm: the row products of kernels.gather_sigma."""
    from linearrag_torch.kernels import gather_sigma
    from linearrag_torch.retrieval.chain import pair_cosines

    def missing(*args, **kwargs):
        raise NotImplementedError("sampled_addmm")

    monkeypatch.setattr(torch.sparse, "sampled_addmm", missing)
    g = torch.Generator().manual_seed(4)
    sent_emb, q = torch.randn(30, 8, generator=g), torch.randn(3, 8, generator=g)
    s, b = torch.tensor([1, 5, 2, 9]), torch.tensor([0, 0, 2, 2])
    assert torch.equal(pair_cosines(sent_emb, q, s, b), gather_sigma((sent_emb, q), s, b))
