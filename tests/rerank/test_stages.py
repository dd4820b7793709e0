"""The query path's stage list (retrieval/stages.py): its order per setting, and the reranker inside the chain
rounds checked against the round computed by hand from the lower-level functions."""
import math

import pytest
import torch

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.queries import Retrieved
from linearrag_torch.rerank import Reranker
from linearrag_torch.retrieval import chain, engine, rerank_stage, stages


@pytest.mark.parametrize("changes, names", [
    ({}, ["round 1", "round 2", "pairs", "top-k"]),
    ({"mode": "paper"}, ["round 1", "top-k"]),  # paper mode: one round, no pairs
    ({"chain_passages": 0, "pair_candidates": 0}, ["round 1", "top-k"]),
    ({"chain_rounds": 2}, ["round 1", "round 2", "round 3", "pairs", "top-k"]),
    ({"rerank": True}, ["round 1", "rerank 1", "round 2", "pairs", "rerank", "top-k"]),  # the loop by default
    ({"rerank": True, "rerank_loop_candidates": 0}, ["round 1", "round 2", "pairs", "rerank", "top-k"]),
    ({"rerank": True, "rerank_loop_candidates": 5, "chain_rounds": 2},
     ["round 1", "rerank 1", "round 2", "rerank 2", "round 3", "pairs", "rerank", "top-k"]),
    ({"rerank_loop_candidates": 5}, ["round 1", "round 2", "pairs", "top-k"]),  # no loop without rerank
    ({"rerank": True, "rerank_loop_candidates": 5, "chain_passages": 0}, ["round 1", "pairs", "rerank", "top-k"]),
])
def test_plan_lists_the_stages_in_order(changes, names):
    assert [s.name for s in stages.plan(RetrievalConfig(**changes))] == names


def test_question_strings_start_at_stage_0():
    assert [s.name for s in stages.plan(RetrievalConfig(), encode_first=True)] == \
        ["encode", "round 1", "round 2", "pairs", "top-k"]


def test_search_runs_the_question_path_as_stage_0(small_rag, small_questions):
    """search() hands the engine the question strings: stage 0 encodes them (its parts timed as before), and the
    answer is that of encode_queries then retrieve; strings without the question path are refused."""
    qs = [q["question"] for q in small_questions]
    cfg = small_rag.config.replace(top_k=4)
    want = small_rag.hits(small_rag.retrieve(small_rag.encode_queries(qs, cfg), cfg))
    timings = {}
    got = small_rag.search(qs, top_k=4, timings=timings)
    assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in want]
    assert {"ner", "encoder", "graph"} <= set(timings) and "encode" not in timings and None not in timings
    with pytest.raises(ValueError, match="encode_queries"):
        engine.retrieve(small_rag.graph, qs, cfg)


def test_depths_cover_every_later_stage():
    cfg = RetrievalConfig(top_k=3, rerank=True, rerank_candidates=7, rerank_loop_candidates=9)
    assert stages.final_depth(cfg) == 7
    assert stages.graph_depth(cfg) == 9
    assert stages.graph_depth(RetrievalConfig(top_k=3)) == 5  # pairs 5; chain 2 x 2 rounds


def test_loop_order_by_hand():
    rnd = Retrieved(torch.tensor([[4, 7, 9, 2]]), torch.tensor([[0.5, 0.4, 0.3, 0.2]]))

    class RR:  # the candidates 9, 4, 7 in the fused order (a rerank.Reranked's first two fields)
        indices = torch.tensor([[9, 4, 7]])
        scores = torch.tensor([[2.0, 1.0, -1.0]])

    out = rerank_stage.loop_order(rnd, RR)
    assert out.indices.tolist() == [[9, 4, 7, 2]]
    want = [0.5, 0.5 * math.exp(-1.0), 0.5 * math.exp(-3.0), 0.2]  # the top graph score times exp(fused - top fused)
    assert out.scores[0].tolist() == pytest.approx(want, rel=1e-6)


def test_the_chain_takes_its_sources_from_the_reranked_round(small_rag, small_questions, tiny_reranker_dir):
    """With the reranker in the loop, round 1's list (trace.rounds[0]) is the graph's round 1 with its top K in the
    reranker's fused order (loop_order), and the chain seeds are those of that order's first chain_passages."""
    qs = [q["question"] for q in small_questions]
    K = 6
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_reranker_dir), rerank_loop_candidates=K, top_k=5)
    enc = small_rag.encode_queries(qs, cfg)
    out, tr = engine.retrieve(small_rag.graph, enc, cfg, trace=True)
    # round 1 by hand: the graph alone, one round, as deep as the stages rank
    depth = stages.graph_depth(cfg)
    one = engine.graph_round(small_rag.graph, enc, cfg.replace(chain_passages=0, pair_candidates=0, rerank=False,
                                                                top_k=depth))
    r = Reranker.load(tiny_reranker_dir, precision=cfg.reranker_precision)  # bfloat16 where the CPU has it (auto)
    rr = r.rerank(enc.rerank_tokens, r.passage_tokens(small_rag.index), one.indices[:, :K], one.scores[:, :K])
    want = rerank_stage.loop_order(one, rr)
    assert torch.equal(tr.rounds[0].indices, want.indices)
    assert torch.allclose(tr.rounds[0].scores, want.scores, rtol=1e-5)
    assert not torch.equal(want.indices[:, :2], one.indices[:, :2]), "the tiny reranker should move a source"
    # the chain seeds: those of the reranked order's sources
    used = torch.zeros((len(qs), 0), dtype=torch.int64)
    source, _ = chain.chain_sources(want, enc.has_entities(), used, cfg)
    seeds = chain.chain_seeds(small_rag.graph.chain_tables, enc, want, source, cfg).to_dicts(len(qs))
    names = small_rag.index.entities
    for b, got in enumerate(tr.chain_seeds):
        assert {n: pytest.approx(w) for n, w in got} == {names[e]: w for e, w in seeds[b].items()}
    # and without the loop, round 1 is the graph's own
    _, plain = engine.retrieve(small_rag.graph, enc, cfg.replace(rerank_loop_candidates=0), trace=True)
    got = plain.rounds[0].indices
    assert torch.equal(got, one.indices[:, :got.shape[1]])  # (as deep as the stages without the loop rank)


def test_the_loop_runs_the_same_on_the_scipy_backend(small_rag, small_questions, tiny_reranker_dir):
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_reranker_dir), rerank_loop_candidates=6, top_k=5)
    enc = small_rag.encode_queries([q["question"] for q in small_questions], cfg)
    a, b = small_rag.retrieve(enc, cfg), small_rag.retrieve(enc, cfg, backend="scipy")
    assert torch.equal(a.indices, b.indices)
    assert torch.allclose(a.scores, b.scores, rtol=1e-4, atol=1e-6)


def test_explain_names_the_round_that_found_each_hit(small_rag, small_questions, tiny_reranker_dir):
    qs = [q["question"] for q in small_questions]
    cfg = dict(rerank=True, reranker=str(tiny_reranker_dir), rerank_loop_candidates=6)
    ex = small_rag.explain(qs, top_k=5, **cfg)
    enc = small_rag.encode_queries(qs, small_rag.config.replace(**cfg, top_k=5))
    _, tr = engine.retrieve(small_rag.graph, enc, small_rag.config.replace(**cfg, top_k=5), trace=True)
    first = tr.rounds[0].indices.tolist()
    for b, e in enumerate(ex):
        assert [f["id"] for f in e["found"]] == [h.id for h, _ in e["hits"]]
        for (h, _), f in zip(e["hits"], e["found"]):
            if h.row in first[b]:  # listed by round 1: found there, at its place in that list
                assert f["round"] == 1 and f["round_rank"] == first[b].index(h.row) + 1
            else:
                assert f["round"] == 2
    assert any(f["round"] == 2 for e in ex for f in e["found"]), "the chain should bring in a hit"


def test_the_loop_reads_the_host_as_often_for_any_batch(small_rag, small_questions, tiny_reranker_dir):
    """The reranker in the loop keeps the batch on the device: Trace.host_reads (less the PageRank's steps, one
    convergence read each) is the same for 3 and for 6 questions, and the loop adds the same few reads whatever
    the batch."""
    qs = [q["question"] for q in small_questions]
    base = small_rag.config.replace(rerank=True, reranker=str(tiny_reranker_dir), top_k=5)
    reads = {}
    for loop in (0, 6):
        cfg = base.replace(rerank_loop_candidates=loop)
        for B in (3, 6):
            enc = small_rag.encode_queries(qs[:B], cfg)
            engine.retrieve(small_rag.graph, enc, cfg)  # warm: the reranker's passage tokens, the chain tables
            _, tr = engine.retrieve(small_rag.graph, enc, cfg, trace=True)
            reads[loop, B] = tr.host_reads - len(tr.ppr_steps)
    assert reads[0, 3] == reads[0, 6] and reads[6, 3] == reads[6, 6], reads


@pytest.mark.parametrize("folder", ["tiny_reranker_dir", "tiny_chain_reranker_dir"])
def test_the_final_rerank_takes_the_loops_logits_again(request, small_rag, small_questions, folder, monkeypatch):
    """A pair the loop scored (the same question, passage and context) is not scored again by the final rerank:
    the results are bit-identical to scoring every pair, and the pairs scored fewer by exactly the final pairs
    that the loop's pairs hold (counted from the pairs each call was given)."""
    qs = [q["question"] for q in small_questions]
    B, K = len(qs), 6
    cfg = small_rag.config.replace(rerank=True, reranker=str(request.getfixturevalue(folder)),
                                   rerank_loop_candidates=K, rerank_candidates=K, top_k=8)
    enc = small_rag.encode_queries(qs, cfg)
    reranker = small_rag.graph.reranker(cfg.reranker, cfg.reranker_precision)
    calls, pair_logits = [], Reranker.pair_logits

    def counted(self, q, p, q_of_pair, rows, context=None):
        calls.append(list(zip(q_of_pair.tolist(), rows.tolist(),
                              [-1] * rows.numel() if context is None else context.tolist())))
        return pair_logits(self, q, p, q_of_pair, rows, context)

    monkeypatch.setattr(Reranker, "pair_logits", counted)
    runs = {}
    for reuse in (False, True):
        reranker.reuse_logits = reuse
        calls.clear()
        out, tr = engine.retrieve(small_rag.graph, enc, cfg, trace=True)
        runs[reuse] = out, tr.rerank.logits, [list(c) for c in calls]
    reranker.reuse_logits = True
    (plain, plain_logits, every), (out, logits, fewer) = runs[False], runs[True]
    assert torch.equal(out.indices, plain.indices) and torch.equal(out.scores, plain.scores)
    assert torch.equal(logits, plain_logits)
    loop_pairs, final_pairs = every
    assert len(loop_pairs) == len(final_pairs) == B * K
    again = [t for t in final_pairs if t in set(loop_pairs)]
    assert again, "the loop and the final list should share pairs here"
    assert fewer[0] == loop_pairs and sorted(fewer[1]) == sorted(t for t in final_pairs if t not in set(loop_pairs))
