"""The learned reranker (linearrag_torch/rerank): pair layout, fused score, training, saving, the engine stage.

A tiny BERT (2 layers, 32 wide, the packaged MiniLM's tokenizer) keeps training in the suite to seconds;
the shipped model is exercised where a test needs real relevance.
"""
import json

import pytest
import torch

from conftest import write_jsonl
from linearrag_torch.rerank import Reranker, RerankerLoadError, RerankerSettings
from linearrag_torch.models.reranker import base_cross_encoder, load_model, save_model
from linearrag_torch.rerank.scoring import PassageTokens, QuestionTokens, chain_context, fuse, pair_inputs
from linearrag_torch.rerank.train import (TrainConfig, listwise_loss, mining_questions, read_training_file,
                                          split_heldout, train)
from linearrag_torch.corpus import InputError


# ------------------------------------------------------------------------------------------ pure functions
def test_pair_inputs_lays_out_cls_question_sep_passage_sep_then_padding():
    q = QuestionTokens(torch.tensor([[101, 5, 6, 102], [101, 7, 102, 0]]), torch.tensor([4, 3]))
    p = PassageTokens(torch.tensor([[11, 12, 13, 0], [21, 22, 23, 24]]), torch.tensor([3, 4]))
    ids, mask, types = pair_inputs(q, p, torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1]), 10, sep_id=102)
    assert ids.tolist() == [[101, 5, 6, 102, 11, 12, 13, 102, 0, 0],
                            [101, 7, 102, 11, 12, 13, 102, 0, 0, 0],
                            [101, 5, 6, 102, 21, 22, 23, 24, 102, 0]]  # the last position is always padding
    assert mask.tolist() == [[1] * 8 + [0, 0], [1] * 7 + [0, 0, 0], [1] * 9 + [0]]
    assert types.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
                              [0, 0, 0, 0, 1, 1, 1, 1, 1, 0]]


def test_pair_inputs_cuts_the_passage_and_keeps_the_closing_sep():
    q = QuestionTokens(torch.tensor([[101, 5, 102]]), torch.tensor([3]))
    p = PassageTokens(torch.tensor([[11, 12, 13, 14, 15]]), torch.tensor([5]))
    ids, mask, _ = pair_inputs(q, p, torch.tensor([0]), torch.tensor([0]), 7, sep_id=102)
    assert ids.tolist() == [[101, 5, 102, 11, 12, 102, 0]]
    assert mask.tolist() == [[1] * 6 + [0]]


def test_chain_aware_pairs_read_the_context_after_the_question():
    q = QuestionTokens(torch.tensor([[101, 5, 6, 102]]), torch.tensor([4]))
    p = PassageTokens(torch.tensor([[11, 12, 13, 14], [21, 22, 23, 0]]), torch.tensor([4, 3]))
    # context cut to context_tokens - 1 = 2 tokens and closed by [SEP]; it has the question's token type
    ids, mask, types = pair_inputs(q, p, torch.tensor([0, 0]), torch.tensor([0, 0]), 14, 102,
                                   context_of_pair=torch.tensor([1, -1]), context_tokens=3)
    assert ids.tolist() == [[101, 5, 6, 102, 21, 22, 102, 11, 12, 13, 14, 102, 0, 0],
                            [101, 5, 6, 102, 11, 12, 13, 14, 102, 0, 0, 0, 0, 0]]  # -1: no context
    assert mask.tolist() == [[1] * 12 + [0] * 2, [1] * 9 + [0] * 5]
    assert types.tolist() == [[0] * 7 + [1] * 5 + [0] * 2, [0] * 4 + [1] * 5 + [0] * 5]
    # without context_tokens the layout is the plain pair's
    plain = pair_inputs(q, p, torch.tensor([0]), torch.tensor([0]), 14, 102)
    ctx_off = pair_inputs(q, p, torch.tensor([0]), torch.tensor([0]), 14, 102, context_of_pair=torch.tensor([1]))
    assert all(torch.equal(a, b) for a, b in zip(plain, ctx_off))


def test_chain_context_is_the_top_candidate_and_the_second_for_the_top_one():
    got = chain_context(torch.tensor([[7, 3, 9], [4, -1, -1], [5, 6, -1]]))
    assert got.tolist() == [[3, 7, 7], [-1, -1, -1], [6, 5, -1]]
    assert chain_context(torch.tensor([[8], [2]])).tolist() == [[-1], [-1]]


def test_fuse_is_the_documented_formula():
    s = RerankerSettings(w_model=2.0, w_rank=-0.5, w_score=0.25)
    logits = torch.tensor([[1.0, 3.0, -1.0]])
    graph = torch.tensor([[0.4, 0.2, 0.0]])
    got = fuse(s, logits, graph)[0].tolist()
    want = [2.0 * 1.0 - 0.5 * 0.0 + 0.25 * 0.0,
            2.0 * 3.0 - 0.5 * torch.log(torch.tensor(2.0)).item() + 0.25 * torch.log(torch.tensor(0.5)).item(),
            2.0 * -1.0 - 0.5 * torch.log(torch.tensor(3.0)).item() + 0.25 * torch.log(torch.tensor(1e-6)).item()]
    assert got == pytest.approx(want, rel=1e-6)


def test_listwise_loss_by_hand():
    logits = torch.tensor([2.0, 0.0, 1.0, -1.0])  # two positives, two negatives
    neg = torch.exp(torch.tensor(1.0)) + torch.exp(torch.tensor(-1.0))
    want = -0.5 * (torch.log(torch.exp(torch.tensor(2.0)) / (torch.exp(torch.tensor(2.0)) + neg))
                   + torch.log(1.0 / (1.0 + neg)))
    assert float(listwise_loss(logits, 2)) == pytest.approx(float(want), rel=1e-6)


def test_split_and_mining_questions_are_seeded_and_keep_every_heldout_question():
    tr, held = split_heldout(100, 0.1, seed=3)
    assert len(held) == 10 and sorted(tr + held) == list(range(100))
    assert (tr, held) == split_heldout(100, 0.1, seed=3) and held != split_heldout(100, 0.1, seed=4)[1]
    cfg = TrainConfig(seed=3, mine_share=0.5)
    mined = mining_questions(100, cfg)
    assert set(held) <= set(mined) and len(mined) == 10 + 45
    assert mining_questions(100, TrainConfig(seed=3, mine_share=0.0)) == held


# ------------------------------------------------------------------------------------------ training file
def _training_rows():
    rows = []
    for i in range(8):
        rows.append({"question": f"Where was composer number {i} born?",
                     "paragraphs": [{"title": f"Composer {i}", "text": f"Composer {i} was born in city {i}.",
                                     "supporting": True}]
                     + [{"title": f"Painter {i}-{j}", "text": f"Painter {i}-{j} lived in town {j}.", "supporting": False}
                        for j in range(4)]})
    return rows


def test_read_training_file_names_file_line_and_field(tmp_path):
    good = write_jsonl(tmp_path / "t.jsonl", _training_rows())
    qs, ps = read_training_file(good)
    assert len(qs) == 8 and len(ps) == 8 * 5 and all(len(q.positives) == 1 and len(q.negatives) == 4 for q in qs)
    bad = tmp_path / "bad.jsonl"
    rows = _training_rows()
    rows[2]["paragraphs"][1]["supporting"] = "yes"
    write_jsonl(bad, rows)
    with pytest.raises(InputError, match=r"bad.jsonl:3: paragraphs\[1\].*supporting"):
        read_training_file(bad)
    bad.write_text('{"question": "q", "paragraphs": [{"text": "a", "supporting": false}]}\n')
    with pytest.raises(InputError, match="bad.jsonl:1: no paragraph has 'supporting': true"):
        read_training_file(bad)
    bad.write_text("{not json\n")
    with pytest.raises(InputError, match="bad.jsonl:1: not JSON"):
        read_training_file(bad)
    with pytest.raises(InputError, match="missing.jsonl: no such training file"):
        read_training_file(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------------------------------ a tiny model
def _train_tiny(tmp_path, tiny_base, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    qs, ps = read_training_file(write_jsonl(tmp_path / "t.jsonl", _training_rows()))
    cfg = TrainConfig(epochs=kw.pop("epochs", 6), questions_per_step=2, negatives=3, max_length=32, question_tokens=16,
                      lr=kw.pop("lr", 1e-3), head_lr=1e-2, heldout=0.25, checkpoint_every=kw.pop("checkpoint_every", 50))
    return train(qs, ps, tmp_path / "out", cfg, init=tiny_base, progress=False, **kw)


def test_training_lowers_the_loss_and_is_deterministic(tmp_path, tiny_base):
    a = _train_tiny(tmp_path / "a", tiny_base, half=False)
    b = _train_tiny(tmp_path / "b", tiny_base, half=False)
    first, last = a["first_losses"], a["last_losses"]
    assert a["steps"] == 18 and sum(last[-3:]) / 3 < sum(first[:3]) / 3
    assert a["first_losses"] == b["first_losses"] and a["last_losses"] == b["last_losses"]
    from safetensors.torch import load_file

    wa, wb = (load_file(str(tmp_path / f"{x}/out/model/model.safetensors")) for x in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not (tmp_path / "a/out/checkpoint.safetensors").exists()  # removed once the model is written


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path, tiny_base, monkeypatch):
    import linearrag_torch.rerank.train as train_mod

    whole = _train_tiny(tmp_path / "whole", tiny_base, half=False, checkpoint_every=4)
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def dying_step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 7:  # the 7th step dies after the checkpoint of step 4
            raise KeyboardInterrupt
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        _train_tiny(tmp_path / "cut", tiny_base, half=False, checkpoint_every=4)
    assert json.loads((tmp_path / "cut/out/checkpoint.json").read_text())["step"] == 4
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    resumed = _train_tiny(tmp_path / "cut", tiny_base, half=False, checkpoint_every=4)
    assert resumed["last_losses"] == whole["last_losses"]
    assert train_mod  # the module under test


def test_saved_model_loads_and_scores_identically(tmp_path, tiny_base):
    model, tok = base_cross_encoder(tiny_base, seed=1)
    model.eval()
    s = RerankerSettings(max_length=32, question_tokens=16)
    save_model(model, tok, s, tmp_path / "m", half=False)
    r1 = Reranker(model, tok, s)
    r2 = Reranker.load(tmp_path / "m")
    pairs = [("Who wrote Hamlet?", "Hamlet\nA tragedy by William Shakespeare."), ("Who?", "Nobody knows.")]
    assert r1.predict(pairs) == r2.predict(pairs)
    save_model(model, tok, s, tmp_path / "h", half=True)  # float16 storage: within float16 rounding
    assert r2.predict(pairs) == pytest.approx(Reranker.load(tmp_path / "h").predict(pairs), abs=1e-2)


def test_missing_or_damaged_folders_are_named(tmp_path, tiny_base):
    with pytest.raises(RerankerLoadError, match=f"{tmp_path / 'nope'}: no such reranker folder"):
        load_model(tmp_path / "nope")
    model, tok = base_cross_encoder(tiny_base)
    save_model(model, tok, RerankerSettings(max_length=32, question_tokens=16), tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(RerankerLoadError, match="model.safetensors: cannot read the weights"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "reranker.json").unlink()
    with pytest.raises(RerankerLoadError, match="reranker.json is missing"):
        load_model(tmp_path / "m")


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_pairs_score_does_not_depend_on_its_pass(tiny_base, precision):
    """Every pass has one shape (3 pairs here, the last filled with copies): a pair's logit is the same bit for bit
    alone, among 7 and in any order, in bf16 too (passes of any size took other kernels: the shipped model's logits
    moved by up to 0.02 in bf16 on an AMX Xeon)."""
    model, tok = base_cross_encoder(tiny_base, seed=2)
    r = Reranker(model.eval(), tok, RerankerSettings(max_length=32, question_tokens=16), tokens_per_pass=32 * 3,
                 precision=precision)
    assert r.rows_per_pass == 3 and r.precision == precision
    pairs = [(f"question {i} about things", f"Passage {i}\n" + "word " * (i * 3)) for i in range(7)]
    together = r.predict(pairs)
    alone = [r.predict([p])[0] for p in pairs]
    backwards = r.predict(pairs[::-1])[::-1]
    assert together == alone == backwards  # bit for bit
    assert len(set(together)) == 7
    default = Reranker(model.eval(), tok, RerankerSettings(max_length=32, question_tokens=16))
    assert default.rows_per_pass == 8 and default.tokens_per_pass == 8 * 32  # CPU_ROWS_PER_PASS


# ------------------------------------------------------------------------------------------ the engine stage
def _by_hand(rag, reranker_dir, questions, k_candidates, top_k):
    """The reranked order computed outside the engine: the graph's ranking, Reranker.predict on text pairs,
    the fused score by the documented formula, a stable sort; then the graph's tail."""
    import math

    r = Reranker.load(reranker_dir, precision=rag.config.reranker_precision)  # as the engine runs it (auto)
    s = r.settings
    graph = rag.search(questions, top_k=max(top_k, k_candidates), rerank=False)
    out = []
    for q, hits in zip(questions, graph):
        cand, tail = hits[:k_candidates], hits[k_candidates:]
        logits = r.predict([(q, rag.index.passage_text(h.row)) for h in cand])
        top = cand[0].score
        fused = [s.w_model * lg + s.w_rank * math.log1p(i) + s.w_score * math.log(min(max(h.score / top, 1e-6), 1.0))
                 for i, (lg, h) in enumerate(zip(logits, cand))]
        order = sorted(range(len(cand)), key=lambda i: -fused[i])
        out.append(([cand[i].row for i in order] + [h.row for h in tail])[:top_k])
    return out


def test_engine_rerank_equals_the_order_computed_by_hand(small_rag, small_questions, tiny_reranker_dir):
    qs = [q["question"] for q in small_questions]
    want = _by_hand(small_rag, tiny_reranker_dir, qs, k_candidates=6, top_k=8)
    # the final list's rerank alone (the reranker in the loop: test_stages.py)
    got = small_rag.search(qs, top_k=8, rerank=True, rerank_candidates=6, reranker=str(tiny_reranker_dir),
                           rerank_loop_candidates=0)
    assert [[h.row for h in hits] for hits in got] == want
    plain = small_rag.search(qs, top_k=8)
    assert any([h.row for h in a] != [h.row for h in b] for a, b in zip(got, plain))  # the rerank changed something
    for hits, p in zip(got, plain):
        assert sorted(h.row for h in hits[:6]) == sorted(h.row for h in p[:6])  # a reorder of the candidates
        assert [(h.row, h.score) for h in hits[6:]] == [(h.row, h.score) for h in p[6:]]  # the tail is the graph's


def test_chain_aware_rerank_reads_the_top_passage_as_context(small_rag, small_questions, tiny_chain_reranker_dir):
    """The engine's chain-aware order equals one computed from text: each candidate's context is the graph's top
    passage (the second for the top one itself), scored by Reranker.predict with contexts, fused, sorted."""
    import math

    qs = [q["question"] for q in small_questions]
    r = Reranker.load(tiny_chain_reranker_dir, precision=small_rag.config.reranker_precision)
    s = r.settings
    graph = small_rag.search(qs, top_k=6, rerank=False)
    want = []
    for q, hits in zip(qs, graph):
        text = [small_rag.index.passage_text(h.row) for h in hits]
        contexts = [text[1] if i == 0 else text[0] for i in range(len(hits))]
        logits = r.predict([(q, t) for t in text], contexts)
        assert logits != r.predict([(q, t) for t in text])  # the context changes the scores
        fused = [s.w_model * lg + s.w_rank * math.log1p(i) + s.w_score * math.log(min(max(h.score / hits[0].score,
                                                                                           1e-6), 1.0))
                 for i, (lg, h) in enumerate(zip(logits, hits))]
        want.append([hits[i].row for i in sorted(range(len(hits)), key=lambda i: -fused[i])])
    got = small_rag.search(qs, top_k=6, rerank=True, rerank_candidates=6, reranker=str(tiny_chain_reranker_dir),
                           rerank_loop_candidates=0)
    assert [[h.row for h in hits] for hits in got] == want
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_chain_reranker_dir), top_k=6, rerank_candidates=6,
                                   rerank_loop_candidates=0)
    enc = small_rag.encode_queries(qs, cfg)
    together = small_rag.retrieve(enc, cfg)
    for b, q in enumerate(qs):  # a question's result does not depend on its batch
        assert torch.equal(small_rag.retrieve(small_rag.encode_queries([q], cfg), cfg).indices[0], together.indices[b])


def test_chain_aware_training_runs_from_a_reranker_folder(tmp_path, tiny_base, tiny_reranker_dir):
    qs, ps = read_training_file(write_jsonl(tmp_path / "t.jsonl", _training_rows()))
    for q in qs[::2]:  # half the questions with the engine's top two (a mistake first), half with stand-ins
        q.mined = [(q.negatives[0], 1.0), (q.positives[0], 0.5)]
    cfg = TrainConfig(epochs=2, questions_per_step=2, negatives=3, max_length=48, question_tokens=16, context_tokens=12,
                      lr=1e-3, head_lr=1e-2, heldout=0.25)
    facts = train(qs, ps, tmp_path / "out", cfg, init=tiny_reranker_dir, progress=False, half=False)
    again = train(qs, ps, tmp_path / "again", cfg, init=tiny_reranker_dir, progress=False, half=False)
    assert facts["last_losses"] == again["last_losses"]  # deterministic, the stand-in contexts included
    saved = Reranker.load(tmp_path / "out/model")
    assert saved.settings.context_tokens == 12 and "context" in (tmp_path / "out/model/MODEL_CARD.md").read_text()
    with pytest.raises(ValueError, match="context_tokens"):
        TrainConfig(max_length=30, question_tokens=16, context_tokens=12)


def test_a_questions_reranked_result_does_not_depend_on_its_batch(small_rag, small_questions, tiny_reranker_dir):
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_reranker_dir), top_k=10)
    qs = [q["question"] for q in small_questions]
    enc = small_rag.encode_queries(qs, cfg)
    together = small_rag.retrieve(enc, cfg)
    for b, q in enumerate(qs):
        alone = small_rag.retrieve(small_rag.encode_queries([q], cfg), cfg)
        assert torch.equal(alone.indices[0], together.indices[b])
        # the graph's scores (a term of the fused score) move in the last bits with the batch
        assert torch.allclose(alone.scores[0], together.scores[b], rtol=1e-6, atol=1e-6)
    # the rerank stage itself is exact: the same graph ranking gives bit-identical fused scores alone or batched
    r = small_rag.reranker(cfg)
    graph = small_rag.retrieve(enc, cfg.replace(rerank=False))
    p = r.passage_tokens(small_rag.index)
    batched = r.rerank(enc.rerank_tokens, p, graph.indices, graph.scores)
    for b in range(len(qs)):
        one = r.rerank(enc.rerank_tokens.select(torch.tensor([b])), p, graph.indices[b:b + 1], graph.scores[b:b + 1])
        assert torch.equal(one.indices[0], batched.indices[b]) and torch.equal(one.scores[0], batched.scores[b])
        assert torch.equal(one.logits[0], batched.logits[b])


def test_scipy_backend_reranks_the_same_way(small_rag, small_questions, tiny_reranker_dir):
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_reranker_dir), top_k=5)
    enc = small_rag.encode_queries([q["question"] for q in small_questions], cfg)
    a, b = small_rag.retrieve(enc, cfg), small_rag.retrieve(enc, cfg, backend="scipy")
    assert torch.equal(a.indices, b.indices)


def test_rerank_needs_the_questions_tokens(small_rag, small_questions, tiny_reranker_dir):
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_reranker_dir))
    enc = small_rag.encode_queries([small_questions[0]["question"]], cfg.replace(rerank=False))
    with pytest.raises(ValueError, match="reranker tokens"):
        small_rag.retrieve(enc, cfg)


def test_timings_and_explain_show_the_rerank(small_rag, small_questions, tiny_reranker_dir):
    timings = {}
    small_rag.search([small_questions[0]["question"]], rerank=True, reranker=str(tiny_reranker_dir), timings=timings)
    assert timings.get("rerank", 0) > 0 and timings.get("graph", 0) > 0
    ex = small_rag.explain([small_questions[0]["question"]], top_k=3, rerank=True, reranker=str(tiny_reranker_dir))[0]
    assert len(ex["rerank"]) == 3
    for row in ex["rerank"]:
        assert set(row) == {"id", "fused_score", "reranker_logit", "graph_score", "graph_rank"}
    assert [h.id for h, _ in ex["hits"]] == [r["id"] for r in ex["rerank"]]
    assert [h.score for h, _ in ex["hits"]] == [r["fused_score"] for r in ex["rerank"]]


def test_a_missing_reranker_folder_is_named(small_rag, small_questions, tmp_path):
    with pytest.raises(RerankerLoadError, match=str(tmp_path / "none")):
        small_rag.search([small_questions[0]["question"]], rerank=True, reranker=str(tmp_path / "none"))


def test_the_shipped_model_loads_and_prefers_the_relevant_passage():
    r = Reranker.load()  # the folder shipped in the package
    q = "Who directed the film Titanic?"
    good = "Titanic (1997 film)\nTitanic is a 1997 American epic romance film written and directed by James Cameron."
    bad = "Brisbane\nBrisbane is the capital of the Australian state of Queensland."
    lg = r.predict([(q, good), (q, bad)])
    assert lg[0] > lg[1]


def test_the_shipped_model_reads_a_second_hop_through_its_context():
    """The shipped model is chain-aware: given the first hop's passage as context, the second hop's passage
    (which never names the film) scores far above an unrelated one, and far above itself without the context."""
    r = Reranker.load()
    assert r.settings.context_tokens > 0
    q = "Where was the director of the film Titanic born?"
    first = "Titanic (1997 film)\nTitanic is a 1997 American epic romance film written and directed by James Cameron."
    hop2 = "James Cameron\nJames Francis Cameron is a Canadian filmmaker. He was born in Kapuskasing, Ontario."
    other = "Kate Winslet\nKate Elizabeth Winslet is an English actress. She was born in Reading, Berkshire."
    with_ctx = r.predict([(q, hop2), (q, other)], [first, first])
    without = r.predict([(q, hop2), (q, other)])
    assert with_ctx[0] > with_ctx[1] + 1.0 and with_ctx[0] > without[0] + 1.0


# ------------------------------------------------------------------------------------------ the ways in
def test_cli_query_and_train_reranker(small_index_dir, small_rag, small_questions, tiny_base, tiny_reranker_dir,
                                      tmp_path, capsys, monkeypatch):
    from linearrag_torch import models
    from linearrag_torch.cli import main

    q = small_questions[0]["question"]
    capsys.readouterr()
    assert main(["query", str(small_index_dir), q, "--json", "--device", "cpu", "--top-k", "4", "--rerank",
                 "--reranker", str(tiny_reranker_dir)]) == 0
    got = [h["id"] for h in json.loads(capsys.readouterr().out.splitlines()[0])["hits"]]
    want = [h.id for h in small_rag.search(q, top_k=4, rerank=True, reranker=str(tiny_reranker_dir))]
    assert got == want
    assert main(["query", str(small_index_dir), q, "--device", "cpu", "--rerank", "--reranker",
                 str(tmp_path / "none")]) == 2
    assert f"{tmp_path / 'none'}: no such reranker folder" in capsys.readouterr().err

    # train-reranker end to end on a tiny file: mining index built, the model written and loadable
    monkeypatch.setattr(models, "load_nlp", lambda cfg: small_rag.nlp)
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, *a, **k: small_rag.encoder)
    train_file = write_jsonl(tmp_path / "train.jsonl", _training_rows())
    rc = main(["train-reranker", "--train", str(train_file), "--out", str(tmp_path / "out"), "--init", str(tiny_base),
               "--epochs", "1", "--max-length", "32", "--question-tokens", "16", "--negatives", "2", "--mine-share", "0", "--quiet",
               "--device", "cpu", "--float32"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 2 and (tmp_path / "out/mining_index").is_dir()
    r = Reranker.load(tmp_path / "out/model")
    assert len(r.predict([("q", "p")])) == 1
    card = (tmp_path / "out/model/MODEL_CARD.md").read_text()
    assert "seed | 0" in card and "all-MiniLM-L6-v2" in card
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    assert main(["train-reranker", "--train", str(bad), "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    assert "bad.jsonl:1: field 'paragraphs'" in capsys.readouterr().err


def test_server_and_adapter_accept_rerank(small_rag, small_questions, tiny_reranker_dir):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from test_serve import serving

    qs = [q["question"] for q in small_questions[:3]]
    want = [[h.id for h in hits] for hits in small_rag.search(qs, top_k=4, rerank=True,
                                                              reranker=str(tiny_reranker_dir))]
    with serving(small_rag, reranker=str(tiny_reranker_dir)) as (url, _):
        r = httpx.post(url + "/v1/search", json={"questions": qs, "top_k": 4, "rerank": True}, timeout=60)
        assert r.status_code == 200, r.text
        assert [[h["id"] for h in res["hits"]] for res in r.json()["results"]] == want
        # a request cannot make the server load a folder of its choosing
        r = httpx.post(url + "/v1/search", json={"question": qs[0], "reranker": "/etc"}, timeout=60)
        assert r.status_code == 422 and "reranker" in r.text
        metrics = httpx.get(url + "/metrics", timeout=60).text
        assert 'linearrag_stage_seconds_count{stage="rerank"}' in metrics
        from linearrag_torch.integrations import HitSource

        src = HitSource(url=url, settings={"rerank": True})
        assert [[h.id for h in hits] for hits in src.search(qs, 4)] == want
    src = HitSource(small_rag, settings={"rerank": True, "reranker": str(tiny_reranker_dir)})
    assert [[h.id for h in hits] for hits in src.search(qs, 4)] == want


def test_rerank_benchmark_on_two_small_sets(tmp_path, small_corpus, small_questions, small_rag, tiny_reranker_dir):
    from conftest import two_data_folders

    from benchmarks import rerank as bench
    from benchmarks.rerank_headroom import recall

    cache, folders = two_data_folders(tmp_path, small_corpus, small_questions, small_rag)
    out = tmp_path / "r.json"
    assert bench.main(["--data", *map(str, folders), "--cache", str(cache), "--reranker", str(tiny_reranker_dir),
                       "--candidates", "3", "5", "--cost-batches", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    id_to_row = {str(p): i for i, p in enumerate(small_rag.index.passage_ids)}
    for folder, qs in zip(folders, (small_questions[:3], small_questions[3:])):
        got = res["datasets"][folder.name]
        assert got["engine_path_equal"] is True  # the engine's own path = the offline reorder at the default K
        rows = [[h.row for h in hits] for hits in small_rag.search([q["question"] for q in qs], top_k=10)]
        gold = [{id_to_row[str(g)] for g in q["supporting_ids"]} for q in qs]
        assert got["graph"]["recall@5"] == pytest.approx(recall(rows, gold, ks=(5,))["recall@5"], abs=0.01)
        assert set(got) >= {"rerank_top3", "rerank_top5", "model_only_top5"}
        assert set(res["cost_ms_per_question"][folder.name]["batch_1"]) == {"graph", "graph+rerank", "rerank"}
    with pytest.raises(SystemExit):
        bench.main(["--data", str(tmp_path / "missing")])


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_a_low_precision_reranker_leaves_the_callers_model_as_it_is(tiny_base, precision):
    """bfloat16 runs under autocast, int8 with the encoder's Linear layers quantised in a copy: the caller's model
    stays float32 and scores as before (int8 once replaced its encoder), the head float32, the logits near
    float32's."""
    model, tok = base_cross_encoder(tiny_base, seed=3)
    settings = RerankerSettings(max_length=32, question_tokens=16)
    exact = Reranker(model.eval(), tok, settings)
    pairs = [(f"question {i} about things", f"Passage {i}\n" + "word " * (i * 3)) for i in range(5)]
    want = exact.predict(pairs)
    low = Reranker(model, tok, settings, precision=precision)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert exact.predict(pairs) == want
    assert low.model.head.weight.dtype == torch.float32
    assert low.predict(pairs) == pytest.approx(want, abs=0.05 * max(1.0, max(abs(x) for x in want)))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_shipped_models_logits_do_not_depend_on_the_pass(precision):
    """The same with the shipped model at its own size (passes of any size moved a bf16 logit by up to 0.02 on an
    AMX Xeon, a float32 one by up to 5e-6): 11 pairs alone, together (passes of 8 and 3 + 5 copies), backwards."""
    r = Reranker.load(precision=precision)
    texts = ["Paris is the capital and largest city of France.", "The Nile is a river in Africa, flowing north.",
             "Marie Curie was a physicist and chemist who won two Nobel Prizes.", "Mount Everest is Earth's highest "
             "mountain above sea level, in the Himalayas.", "The Great Wall of China is a series of fortifications."]
    pairs = [(q, f"Title {i}\n{texts[i % 5]} " + "More words follow here. " * i)
             for i, q in enumerate(["Which city is the capital of France?", "Where does the Nile flow?",
                                    "Who won two Nobel Prizes?", "What is the highest mountain?",
                                    "What did China build?"] * 2 + ["Who was Marie Curie?"])]
    together = r.predict(pairs)
    assert [r.predict([p])[0] for p in pairs] == together == r.predict(pairs[::-1])[::-1]
