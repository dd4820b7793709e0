"""The pair rerank of the first two places (pairs.py), on a hand-computed case and against the reference."""
import dataclasses
import itertools

import pytest
import torch

from linearrag_torch.retrieval import pairs, scipy_backend
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.queries import EncodedQueries, Retrieved
from linearrag_torch.index.csr import Csr
from linearrag_torch.synthetic import random_index, random_queries

from conftest import assert_pair_moved
from test_backends_agree import assert_same

# q = e_x. Passages: rows 4, 2, 0, 5 are the candidates (in that ranked order), with vectors
#   slot 0: (1, 0, 0)   slot 1: (.8, .6, 0)   slot 2: (.6, -.8, 0)   slot 3: (0, 0, 1)
# cos(q, v_i + v_j): (0,1) 1.8/sqrt(3.6) = .9487, (0,2) 1.6/sqrt(3.2) = .8944, (1,2) 1.4/sqrt(2) = .9899,
# any pair with slot 3: at most 1/sqrt(2) = .7071. Scores 1, .5, .4, .3 (shares of the top one).
# Entity 0 is in the passages of slots 0 and 2 only (2 passages); entity 1 in slot 1's; entity 2 in slot 3's.
ROWS = [4, 2, 0, 5]
VECS = {4: (1.0, 0.0, 0.0), 2: (0.8, 0.6, 0.0), 0: (0.6, -0.8, 0.0), 5: (0.0, 0.0, 1.0)}


def hand_index():
    ix = random_index(passages=6, entities=3, dim=3, seed=1)
    emb = torch.zeros(6, 3)
    for row, v in VECS.items():
        emb[row] = torch.tensor(v)
    entities_of = {4: [0], 2: [1], 0: [0], 5: [2]}
    C = Csr.from_rows([entities_of.get(p, []) for p in range(6)], 3)
    return dataclasses.replace(ix, passage_emb=emb, C=C)


def hand_queries(with_entity=True):
    return EncodedQueries(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]] if with_entity else []).view(-1, 3),
                          torch.tensor([0] if with_entity else [], dtype=torch.int64), ["x"] if with_entity else [])


def ranked(top=1.0):
    return Retrieved(torch.tensor([ROWS]), torch.tensor([[top, 0.5 * top, 0.4 * top, 0.3 * top]]))


def both(index, queries, out, cfg):
    """(engine, reference) reranks, as lists of passage rows."""
    got = DeviceGraph(index).pair_rerank(queries, out, cfg)
    want = scipy_backend.pair_rerank(index, queries, out, cfg)
    return got.indices[0].tolist(), want.indices[0].tolist(), got, want


@pytest.mark.parametrize("settings, order", [
    # only the pair's cosine: (1, 2) .9899 beats (0, 1) .9487
    (dict(pair_rank_weight=0.0, pair_link_weight=0.0), [2, 0, 4, 5]),
    # with the scores: (0, 1) .9487 + .1 * 1.5 = 1.0987 beats (1, 2) .9899 + .09 = 1.0799, (0, 2) 1.0344
    (dict(pair_rank_weight=0.1, pair_link_weight=0.0), [4, 2, 0, 5]),
    # a shared entity in 2 passages links (0, 2): 1.0344 + .1 = 1.1344 wins
    (dict(pair_rank_weight=0.1, pair_link_weight=0.1, pair_link_max_passages=2), [4, 0, 2, 5]),
    # ... unless an entity in 2 passages is too common to link
    (dict(pair_rank_weight=0.1, pair_link_weight=0.1, pair_link_max_passages=1), [4, 2, 0, 5]),
    # only the first three candidates: slot 3 never moves, whatever its link
    (dict(pair_candidates=3, pair_rank_weight=0.0, pair_link_weight=0.0), [2, 0, 4, 5]),
])
def test_hand_computed_pairs(settings, order):
    cfg = RetrievalConfig(**{"pair_candidates": 4, **settings})
    got, want, g, w = both(hand_index(), hand_queries(), ranked(), cfg)
    assert got == order and want == order
    # the scores travel with their passages
    score_of = dict(zip(ROWS, [1.0, 0.5, 0.4, 0.3]))
    assert g.scores[0].tolist() == pytest.approx([score_of[p] for p in order])
    assert w.scores[0].tolist() == pytest.approx([score_of[p] for p in order])


def test_questions_it_leaves_alone():
    cfg = RetrievalConfig(pair_rank_weight=0.0, pair_link_weight=0.0)  # (1, 2) would move ahead
    # no question entity: answered by dense retrieval, its ranking stays
    got, want, _, _ = both(hand_index(), hand_queries(with_entity=False), ranked(), cfg)
    assert got == ROWS and want == ROWS
    # a top score that is not positive
    got, want, _, _ = both(hand_index(), hand_queries(), ranked(top=0.0), cfg)
    assert got == ROWS and want == ROWS
    # fewer than two passages listed (-1 pads)
    one = Retrieved(torch.tensor([[4, -1, -1, -1]]), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert DeviceGraph(hand_index()).pair_rerank(hand_queries(), one, cfg).indices[0].tolist() == [4, -1, -1, -1]
    assert scipy_backend.pair_rerank(hand_index(), hand_queries(), one, cfg).indices[0].tolist() == [4, -1, -1, -1]
    # off, and in paper mode
    assert not pairs.enabled(RetrievalConfig(pair_candidates=0))
    assert not pairs.enabled(RetrievalConfig(mode="paper"))
    assert not pairs.enabled(RetrievalConfig.reference_code())


def test_links_equal_shared_rare_entities():
    """pairs.linked from candidate_entities: slots i != j are linked iff their passages share an entity of
    at most max passages (checked with Python sets on a random index)."""
    ix = random_index(passages=60, entities=40, dim=4, seed=3)
    crow, col = ix.C.crow, ix.C.col
    gen = torch.Generator().manual_seed(0)
    cand = torch.stack([torch.randperm(60, generator=gen)[:6] for _ in range(7)])
    cand[2, 4:] = -1
    df = torch.bincount(col, minlength=40)
    for cap in (1, 3, 8, 60):
        link = pairs.linked(*pairs.candidate_entities(crow, col, pairs.link_entities(df, cap), cand), 7, 6)
        n_linked = 0
        for b, i, j in itertools.product(range(7), range(6), range(6)):
            p, r = int(cand[b, i]), int(cand[b, j])
            rare = lambda x: {int(e) for e in col[crow[x]:crow[x + 1]] if df[e] <= cap} if x >= 0 else set()
            want = i != j and bool(rare(p) & rare(r))
            assert bool(link[b, i, j]) == want, (cap, b, i, j)
            n_linked += want
        assert cap == 1 or n_linked > 0  # the case links something


@pytest.mark.parametrize("chain", [0, 2])
def test_engine_equals_reference_and_moves_only_the_top_two(chain):
    index = random_index(300, 200, dim=16, seed=11)
    queries = random_queries(index, 24, seed=12)
    cfg = RetrievalConfig(delta=0.2, top_k=7, chain_passages=chain, pair_link_weight=0.3, pair_link_max_passages=20)
    got = retrieve(DeviceGraph(index), queries, cfg)
    assert_same(got, scipy_backend.retrieve(index, queries, cfg))
    plain = retrieve(DeviceGraph(index), queries, cfg.replace(pair_candidates=0))
    moved = 0
    for g, p in zip(got.indices.tolist(), plain.indices.tolist()):
        assert_pair_moved(g, p)
        moved += g != p
    assert moved >= 3  # the case reranks something
    # a smaller top_k is the start of a larger one (the rerank always looks at pair_candidates passages)
    assert torch.equal(retrieve(DeviceGraph(index), queries, cfg.replace(top_k=2)).indices, got.indices[:, :2])


def test_the_trace_tells_where_the_first_two_were_ranked():
    index = random_index(300, 200, dim=16, seed=11)
    queries = random_queries(index, 24, seed=12)
    cfg = RetrievalConfig(delta=0.2, top_k=3, pair_link_weight=0.3, pair_link_max_passages=20)
    got, tr = retrieve(DeviceGraph(index), queries, cfg, trace=True)
    plain = retrieve(DeviceGraph(index), queries, cfg.replace(pair_candidates=0, top_k=5))
    assert torch.equal(got.indices, retrieve(DeviceGraph(index), queries, cfg).indices)
    moved = 0
    for g, p, ranks in zip(got.indices.tolist(), plain.indices.tolist(), tr.pair_ranks):
        assert ranks == (p.index(g[0]) + 1, p.index(g[1]) + 1) and ranks[0] < ranks[1] <= 5
        moved += ranks != (1, 2)
    assert moved >= 3
    # without the rerank the trace has no ranks
    assert retrieve(DeviceGraph(index), queries, cfg.replace(pair_candidates=0), trace=True)[1].pair_ranks is None
