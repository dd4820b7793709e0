"""The small real index (spaCy + MiniLM over ~60 demo passages, built once in conftest.py).

Checks the index against the documented definitions recomputed naively from the strings, the torch
engine against the scipy reference on real questions, the encoder against sentence-transformers,
and the public search/explain results against the corpus file.
"""
import json

import numpy as np
import pytest
import torch

from linearrag_torch import Hit, LinearRAG, RetrievalConfig
from linearrag_torch.models.encoding import resolve_model_folder
from linearrag_torch.models.nlp import question_entities

from conftest import assert_pair_moved, demo_questions

NO_ENTITY_QUESTION = "what is this about?"


def rows(csr):
    """Per row: {col: value}."""
    crow, col, val = csr.crow.tolist(), csr.col.tolist(), csr.val.tolist()
    return [dict(zip(col[crow[r]:crow[r + 1]], val[crow[r]:crow[r + 1]])) for r in range(csr.shape[0])]


@pytest.fixture(scope="module")
def ix(small_rag):
    return small_rag.index


@pytest.fixture(scope="module")
def corpus_by_id(small_corpus):
    objs = [json.loads(line) for line in small_corpus.read_text(encoding="utf-8").splitlines()]
    return {o["id"]: o for o in objs}


@pytest.fixture(scope="module")
def all_questions():
    return [q["question"] for q in demo_questions()] + [NO_ENTITY_QUESTION]


@pytest.fixture(scope="module")
def encoded(small_rag, all_questions):
    return small_rag.encode_queries(all_questions)


# ---------------------------------------------------------------- the index against its definitions
def test_index_is_consistent_and_matches_the_corpus(ix, corpus_by_id):
    ix.validate()
    assert ix.num_passages == len(corpus_by_id) == 60
    assert ix.passage_ids == list(corpus_by_id)
    assert ix.titles == [o["title"] for o in corpus_by_id.values()]
    assert ix.texts == [o["text"] for o in corpus_by_id.values()]
    assert ix.num_entities > 100 and ix.num_sentences > 100
    assert len(set(ix.entities)) == ix.num_entities and len(set(ix.sentences)) == ix.num_sentences
    for emb in (ix.passage_emb, ix.sentence_emb, ix.entity_emb):
        torch.testing.assert_close(emb.norm(dim=1), torch.ones(emb.shape[0]), rtol=0, atol=1e-5)


def test_C_holds_case_sensitive_count_shares_of_the_passage_entities(ix):
    every_entity_used = set()
    for p, row in enumerate(rows(ix.C)):
        text = ix.passage_text(p)
        counts = {e: text.count(ix.entities[e]) for e in row}
        for e, c in counts.items():
            assert c >= 1, f"entity {ix.entities[e]!r} is not in passage {p}"
        total = sum(counts.values())
        for e, w in row.items():
            assert w == pytest.approx(counts[e] / total, rel=1e-6)
        if row:
            assert sum(row.values()) == pytest.approx(1.0, abs=1e-5)
        every_entity_used |= set(row)
    assert every_entity_used == set(range(ix.num_entities)), "every entity comes from some passage's NER"


def test_N_equals_lower_cased_str_count_everywhere(ix):
    want = np.array([[ix.passage_text(p).lower().count(e.lower()) for e in ix.entities]
                     for p in range(ix.num_passages)], dtype=np.float64)
    got = ix.N.scipy().toarray()
    np.testing.assert_array_equal(got, want)
    # N covers C's structure and more (an entity mentioned in passages where NER did not tag it)
    C = ix.C.scipy().toarray()
    assert ((C > 0) <= (got > 0)).all()
    assert ((got > 0) & (C == 0)).any()


def test_M_and_PS_relate_strings_that_contain_each_other(ix):
    ps_rows = rows(ix.PS)
    passages_of = {}
    for p, row in enumerate(ps_rows):
        for s in row:
            assert ix.sentences[s] in ix.passage_text(p)
            passages_of.setdefault(s, []).append(p)
    bind_titles = getattr(ix.index_config, "title_entities", False)
    entity_id = {name: e for e, name in enumerate(ix.entities)}
    for s, row in enumerate(rows(ix.M)):
        assert row, f"sentence {s} mentions no entity but is a node"
        assert s in passages_of, f"sentence {s} belongs to no passage"
        titles = {ix.titles[p].strip() for p in passages_of[s]} if bind_titles else set()
        for e, v in row.items():
            assert v == 1.0
            # an NER entity of the sentence, or (title_entities) the title of a passage holding it
            assert ix.entities[e] in ix.sentences[s] or ix.entities[e] in titles, (ix.entities[e], ix.sentences[s])
    m_rows = rows(ix.M)
    if bind_titles:  # every sentence node of a titled passage mentions the title entity
        for p, row in enumerate(ps_rows):
            title = ix.titles[p].strip()
            if title:
                assert all(entity_id[title] in m_rows[s] for s in row), ix.titles[p]
    # a title is its own sentence (newline rule)
    titles_as_sentences = [p for p in range(ix.num_passages) if ix.titles[p] in ix.sentences]
    assert len(titles_as_sentences) >= ix.num_passages // 2


# ---------------------------------------------------------------- backends
@pytest.mark.parametrize("mode", ["reference", "paper"])
def test_torch_and_scipy_agree_on_the_demo_questions(small_rag, encoded, all_questions, mode):
    cfg = small_rag.config.replace(mode=mode, top_k=5)
    a = small_rag.retrieve(encoded, cfg, backend="torch")
    b = small_rag.retrieve(encoded, cfg, backend="scipy")
    assert a.indices.shape == b.indices.shape == (len(all_questions), 5)
    np.testing.assert_allclose(a.scores.numpy(), b.scores.numpy(), rtol=1e-4, atol=1e-7)
    sa = b.scores.numpy()
    for q in range(len(all_questions)):
        for j in np.nonzero(a.indices[q].numpy() != b.indices[q].numpy())[0]:
            tied = np.isclose(sa[q], sa[q, j], rtol=1e-4).sum() > 1 or np.isclose(sa[q, j], sa[q, -1], rtol=1e-4)
            assert tied, f"{all_questions[q]!r} rank {j}: {a.indices[q].tolist()} vs {b.indices[q].tolist()}"


def test_unknown_backend(small_rag, encoded):
    with pytest.raises(ValueError, match="backend"):
        small_rag.retrieve(encoded, backend="numpy")


def test_saved_and_loaded_index_answers_like_the_built_one(small_rag, small_index_dir, encoded):
    loaded = LinearRAG.load(small_index_dir, device="cpu")
    assert loaded.index.index_config == small_rag.index.index_config
    for mode in ("reference", "paper"):
        cfg = small_rag.config.replace(mode=mode)
        a, b = small_rag.retrieve(encoded, cfg), loaded.retrieve(encoded, cfg)
        assert torch.equal(a.indices, b.indices)
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------- dense fallback
@pytest.mark.parametrize("question", [NO_ENTITY_QUESTION, demo_questions()[10]["question"]])
def test_question_without_entity_is_answered_by_cosine_ranking(small_rag, nlp, encoder, question):
    assert question_entities(nlp, [question], small_rag.index.index_config.dropped_labels) == [[]]
    cos = (small_rag.index.passage_emb @ encoder.encode([question])[0]).numpy()
    order = np.argsort(-cos, kind="stable")[:5]
    for backend in ("torch", "scipy"):  # spaCy finds nothing; lexicon matching would find a title
        hits = small_rag.search(question, top_k=5, backend=backend, lexicon_seeds=False)
        assert [h.row for h in hits] == order.tolist()
        np.testing.assert_allclose([h.score for h in hits], cos[order], rtol=1e-5, atol=1e-6)
    ex = small_rag.explain([question], lexicon_seeds=False)[0]
    assert ex["dense_fallback"] is True and ex["seeds"] == [] and ex["question_entities"] == []


# ---------------------------------------------------------------- encoder
def test_encoder_equals_sentence_transformers(ix, encoder, all_questions):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(resolve_model_folder(ix.index_config.encoder)), device="cpu")

    def assert_same(mine, texts):
        want = torch.as_tensor(model.encode(texts, normalize_embeddings=True, batch_size=64, convert_to_numpy=True))
        assert mine.shape == want.shape
        cos = (mine * want).sum(dim=1)
        assert float(cos.min()) >= 0.9999, f"lowest cosine {float(cos.min())}"

    # what the index stores (passage text = title + newline + text), and fresh encodings of questions
    # and of a text longer than the 256-token truncation
    # (a sample of each: encoding is the slow part of this test on 2 cores)
    assert_same(ix.passage_emb[::3], [ix.passage_text(p) for p in range(0, ix.num_passages, 3)])
    assert_same(ix.sentence_emb[::3], ix.sentences[::3])
    assert_same(ix.entity_emb[::4], ix.entities[::4])
    long_text = " ".join(ix.texts[:12])
    assert len(encoder.tokenizer(long_text)["input_ids"]) > 300
    texts = all_questions[:8] + [long_text, "x"]
    assert_same(encoder.encode(texts), texts)


# ---------------------------------------------------------------- search and explain
def test_search_returns_hits_with_corpus_ids_and_titles(small_rag, small_questions, corpus_by_id):
    questions = [q["question"] for q in small_questions]
    results = small_rag.search(questions, top_k=5)
    plain = small_rag.search(questions, top_k=5, pair_candidates=0)
    assert len(results) == len(questions)
    for q, hits, without in zip(small_questions, results, plain):
        # the chain round's kept first passage leads whatever its second-round score (chain.merge); the pair
        # rerank then moves two of the top five to the front (pairs.py)
        s = [h.score for h in without]
        assert s[1:] == sorted(s[1:], reverse=True)
        assert_pair_moved([h.id for h in hits], [h.id for h in without])
        assert len(hits) == 5
        assert all(isinstance(h, Hit) for h in hits)
        assert len({h.id for h in hits}) == 5
        for h in hits:
            assert h.id == small_rag.index.passage_ids[h.row]
            assert h.title == corpus_by_id[h.id]["title"] and h.text == corpus_by_id[h.id]["text"]
        scores = [h.score for h in hits]
        assert all(np.isfinite(scores))
        # multi-hop retrieval finds a gold supporting passage near the top for these questions
        assert set(q["supporting_ids"]) & {h.id for h in hits[:2]}, (q["question"], [h.title for h in hits])


def test_search_single_string_top_k_and_empty(small_rag):
    q = demo_questions()[0]["question"]
    one = small_rag.search(q, top_k=3)
    assert isinstance(one, list) and len(one) == 3 and isinstance(one[0], Hit)
    many = small_rag.search([q], top_k=3)
    assert [h.id for h in many[0]] == [h.id for h in one]
    assert len(small_rag.search(q, top_k=1000)) == small_rag.index.num_passages
    assert small_rag.search([]) == []
    with pytest.raises(ValueError, match="empty question"):
        small_rag.search(["Who?", "  "])


def test_search_overrides_do_not_change_the_stored_config(small_rag):
    before = small_rag.config
    q = demo_questions()[5]["question"]
    small_rag.search(q, mode="paper", delta=0.3, top_k=2)
    assert small_rag.config == before == RetrievalConfig()


@pytest.mark.parametrize("mode", ["paper", "reference"])
def test_explain_marks_seeds(small_rag, encoder, small_questions, mode):
    index = small_rag.index
    questions = [q["question"] for q in small_questions if q is not small_questions[3]]  # [3] has no entity
    explained = small_rag.explain(questions, top_k=5, mode=mode)
    searched = small_rag.search(questions, top_k=5, mode=mode)
    for ex, hits in zip(explained, searched):
        assert ex["dense_fallback"] is False and ex["question_entities"]
        # seeds recomputed independently: each question entity's nearest graph entity by cosine
        want = {}
        for ent in ex["question_entities"]:
            cos = index.entity_emb @ encoder.encode([ent])[0]
            e = int(torch.argmax(cos))
            want[index.entities[e]] = max(want.get(index.entities[e], -1.0), float(cos[e]))
        got = dict(ex["seeds"])
        assert got.keys() == want.keys()
        for name in want:
            assert got[name] == pytest.approx(want[name], abs=1e-5)
        assert [h.id for h, _ in ex["hits"]] == [h.id for h in hits]
        for h, ents in ex["hits"]:
            text = index.passage_text(h.row)
            for name, tier, act in ents:
                assert tier >= 1 and name in text
                if mode == "paper" and name in got:
                    assert tier == 1, f"seed {name!r} listed with tier {tier}"  # a seed never changes tier
                if tier == 1:
                    assert name in got, f"{name!r} has tier 1 but is not a seed"
        # the passage that holds a seed entity lists it (in paper mode as a seed, tier 1)
        if mode == "paper":
            for h, ents in ex["hits"]:
                in_passage = {index.entities[e] for e in rows(index.C)[h.row]}
                assert {n for n, t, _ in ents if t == 1} == set(got) & in_passage


def test_explain_names_the_chain_seeds_each_hit_contains(small_rag, small_questions):
    """"bridges": per hit, the later rounds' seeds whose entity its passage contains, in the chain seeds' order;
    the README's second hop (Hans J. Salter, a passage that names nothing of the question) is reached through one;
    with one round there are none."""
    index = small_rag.index
    questions = [q["question"] for q in small_questions]
    for ex in small_rag.explain(questions, top_k=5):
        assert len(ex["bridges"]) == len(ex["hits"])
        for (h, _), via in zip(ex["hits"], ex["bridges"]):
            in_passage = {index.entities[e] for e in rows(index.C)[h.row]}
            assert via == [(n, w) for n, w in ex["chain_seeds"] if n in in_passage]
    thunder = small_rag.explain(demo_questions()[0]["question"], top_k=5)[0]
    salter = next(via for (h, _), via in zip(thunder["hits"], thunder["bridges"]) if h.title == "Hans J. Salter")
    assert "Hans J. Salter" in [n for n, _ in salter]
    one_round = small_rag.explain(questions, top_k=5, chain_passages=0)
    assert all(via == [] for ex in one_round for via in ex["bridges"])
