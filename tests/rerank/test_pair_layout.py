"""The reranker pairs' layout settings (issue 50): ``rerank_pair_tokens`` (shorter pairs) and ``rerank_length_step``
(each pair at its own length, rounded up; passes grouped by length). Both off by default: results as before."""
from __future__ import annotations

import pytest
import torch

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.models.reranker import base_cross_encoder, load_model
from linearrag_torch.rerank import Reranker, RerankerSettings
from linearrag_torch.rerank.scoring import PassageTokens, QuestionTokens, pair_ends, pair_inputs


def _tokens():
    q = QuestionTokens(torch.tensor([[101, 7, 8, 102, 0], [101, 9, 102, 0, 0]]), torch.tensor([4, 3]))
    p = PassageTokens(torch.tensor([[11, 12, 13, 14, 15, 16], [21, 22, 0, 0, 0, 0], [31, 32, 33, 0, 0, 0]]),
                      torch.tensor([6, 2, 3]))
    return q, p


@pytest.mark.parametrize("context", [None, torch.tensor([2, -1, 1, 0])])
def test_pair_ends_is_where_pair_inputs_puts_the_closing_sep(context):
    q, p = _tokens()
    qo, po = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 0, 2])
    for L in (10, 14, 20):
        ids, mask, _ = pair_inputs(q, p, qo, po, L, 102, 0, context, 3 if context is not None else 0)
        ends = pair_ends(q, p, qo, po, L, context, 3 if context is not None else 0)
        assert torch.equal(mask.sum(1) - 1, ends)
        assert torch.equal(ids.gather(1, ends[:, None])[:, 0], torch.full_like(ends, 102))
        # the same pair laid out at end + 2 tokens (its last position padding) has the same tokens
        for i in range(4):
            short, _, _ = pair_inputs(q, p, qo[i:i + 1], po[i:i + 1], int(ends[i]) + 2, 102, 0,
                                      None if context is None else context[i:i + 1], 3 if context is not None else 0)
            assert torch.equal(short[0], ids[i, :int(ends[i]) + 2])


def _tiny(tiny_base, precision="float32", **settings):
    model, tok = base_cross_encoder(tiny_base, seed=3)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    return Reranker(model.eval(), tok, RerankerSettings(**{"max_length": 64, "question_tokens": 16, **settings}),
                    tokens_per_pass=64 * 3, precision=precision)


def _pairs(n=11):
    return [(f"question {i} about things", f"Passage {i}\n" + "word " * (i * 5)) for i in range(n)]


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_length_step_keeps_a_pairs_logit_independent_of_its_pass(tiny_base, precision):
    """With rerank_length_step each pair is scored at its own rounded length: its logit is the same bit for bit
    alone, among others and in any order, and within float rounding of its logit at the full length."""
    r = _tiny(tiny_base, precision)
    pairs = _pairs()
    q = r.question_tokens([a for a, _ in pairs])
    p = r.tokenize_passages([b for _, b in pairs])
    idx = torch.arange(len(pairs))
    full = r.pair_logits(q, p, idx, idx)
    step = r.pair_logits(q, p, idx, idx, length_step=8)
    alone = torch.cat([r.pair_logits(q, p, idx[i:i + 1], idx[i:i + 1], length_step=8) for i in range(len(pairs))])
    back = r.pair_logits(q, p, idx.flip(0), idx.flip(0), length_step=8).flip(0)
    assert torch.equal(step, alone) and torch.equal(step, back)
    tol = 1e-5 if precision == "float32" else 0.1
    assert torch.allclose(step, full, atol=tol, rtol=0)
    # the lengths it took: several, each a multiple of 8 at most the model's 64
    ends = pair_ends(q, p, idx, idx, 64) + 2
    lengths = torch.clamp(-(-ends // 8) * 8, max=64)
    assert len(set(lengths.tolist())) >= 3
    # its vectors too
    logits, vecs = r.pair_logits(q, p, idx, idx, vectors=True, length_step=8)
    assert torch.equal(logits, step) and vecs.shape == (len(pairs), 32)


def test_pair_tokens_cuts_the_passage_and_keeps_the_question(tiny_base):
    r = _tiny(tiny_base)
    pairs = _pairs()
    q = r.question_tokens([a for a, _ in pairs])
    p = r.tokenize_passages([b for _, b in pairs])
    idx = torch.arange(len(pairs))
    full = r.pair_logits(q, p, idx, idx)
    assert torch.equal(r.pair_logits(q, p, idx, idx, pair_tokens=64), full)  # the model's own length
    assert torch.equal(r.pair_logits(q, p, idx, idx, pair_tokens=200), full)  # longer reads as the model's
    cut = r.pair_logits(q, p, idx, idx, pair_tokens=24)
    # a pair that fits in 24 tokens keeps its tokens (another shape: the same logit within rounding); a longer one
    # is cut: its logit is that of the pair laid out at 24 tokens by hand
    ends = pair_ends(q, p, idx, idx, 64)
    fits = ends + 2 <= 24
    assert fits.any() and (~fits).any()
    assert torch.allclose(cut[fits], full[fits], atol=1e-5, rtol=0)
    assert not torch.allclose(cut[~fits], full[~fits], atol=1e-3, rtol=0)
    ids, mask, types = pair_inputs(q, p, idx, idx, 24, r.tokenizer.sep_token_id, 0)
    assert (mask[:, -1] == 0).all() and (mask.sum(1)[~fits] == 23).all()
    with torch.inference_mode():
        by_hand = torch.cat([r.model(ids[s:s + 8], mask[s:s + 8], types[s:s + 8]) for s in (0, 8)])[:len(pairs)]
    assert torch.allclose(cut, by_hand, atol=1e-5, rtol=0)
    # both settings together: each pair at its rounded length, at most 24
    assert torch.allclose(r.pair_logits(q, p, idx, idx, pair_tokens=24, length_step=8), cut, atol=1e-5, rtol=0)
    # below the question's share + 5 it reads as that (a request's setting cannot fail a server's batch)
    assert r.pair_length(20) == r.pair_length(16 + 5) == 21 and r.pair_length(30) == 30 and r.pair_length(99) == 64
    assert torch.equal(r.pair_logits(q, p, idx, idx, pair_tokens=16), r.pair_logits(q, p, idx, idx, pair_tokens=21))


def test_the_settings_are_validated():
    with pytest.raises(ValueError, match="rerank_pair_tokens"):
        RetrievalConfig(rerank_pair_tokens=8)
    with pytest.raises(ValueError, match="rerank_pair_tokens"):
        RetrievalConfig(rerank_pair_tokens=513)
    with pytest.raises(ValueError, match="rerank_length_step"):
        RetrievalConfig(rerank_length_step=-1)
    with pytest.raises(ValueError, match="rerank_length_step"):
        RetrievalConfig(rerank_length_step=600)
    cfg = RetrievalConfig(rerank_pair_tokens=128, rerank_length_step=16)
    assert (cfg.rerank_pair_tokens, cfg.rerank_length_step) == (128, 16)
    assert RetrievalConfig().rerank_pair_tokens == 0 and RetrievalConfig().rerank_length_step == 0


def test_the_server_schema_takes_their_range():
    pytest.importorskip("pydantic")
    from linearrag_torch.serve.schemas import request_schema, search_request_model
    from linearrag_torch.serve.settings import ServeSettings

    props = request_schema(search_request_model(ServeSettings()))["properties"]
    assert props["rerank_pair_tokens"]["anyOf"][:2] == [{"const": 0, "type": "integer"},
                                                        {"type": "integer", "minimum": 16, "maximum": 512}]
    assert props["rerank_length_step"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 512}


def test_the_engine_applies_them_and_is_unchanged_without_them(small_rag, small_questions, tiny_chain_reranker_dir):
    """Off (0, the default): the same hits and scores as before; the model's own length: the same; a length step:
    the same order on these questions (the logits move in the last bits); a short pair: the reranker reads less
    (its logits in explain change)."""
    qs = [q["question"] for q in small_questions]
    base = dict(top_k=8, rerank=True, reranker=str(tiny_chain_reranker_dir))

    def run(**kw):
        return [[(h.row, h.score) for h in hits] for hits in small_rag.search(qs, **base, **kw)]

    default = run()
    assert run(rerank_pair_tokens=0, rerank_length_step=0) == default
    assert run(rerank_pair_tokens=64) == default
    stepped = run(rerank_length_step=8)
    assert [[r for r, _ in hits] for hits in stepped] == [[r for r, _ in hits] for hits in default]
    assert all(abs(a[1] - b[1]) < 1e-4 for x, y in zip(stepped, default) for a, b in zip(x, y))
    short = run(rerank_pair_tokens=40)
    assert short != default
    # the scipy backend takes the same settings
    cfg = small_rag.config.replace(**base, rerank_pair_tokens=40, rerank_length_step=8)
    enc = small_rag.encode_queries(qs, cfg)
    assert torch.equal(small_rag.retrieve(enc, cfg).indices, small_rag.retrieve(enc, cfg, backend="scipy").indices)
    assert run(rerank_pair_tokens=16) == run(rerank_pair_tokens=37)  # at least question 20 + context 12 + 5


def test_the_shipped_model_with_a_length_step_is_pass_independent():
    """The shipped model (136-token pairs) with rerank_length_step 8: bit for bit alone and together."""
    model, tok, settings = load_model()
    r = Reranker(model, tok, settings)
    pairs = [("Which city is the capital of France?", "Paris\nParis is the capital and largest city of France."),
             ("Who won two Nobel Prizes?", "Marie Curie\nMarie Curie was a physicist and chemist. " * 6),
             ("Where does the Nile flow?", "Nile\nThe Nile is a river in Africa. " * 3)]
    q = r.question_tokens([a for a, _ in pairs])
    p = r.tokenize_passages([b for _, b in pairs])
    idx = torch.arange(3)
    together = r.pair_logits(q, p, idx, idx, length_step=8)
    alone = torch.cat([r.pair_logits(q, p, idx[i:i + 1], idx[i:i + 1], length_step=8) for i in range(3)])
    assert torch.equal(together, alone)
    assert torch.allclose(together, r.pair_logits(q, p, idx, idx), atol=1e-4, rtol=0)

