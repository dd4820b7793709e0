"""NER of question batches in worker processes (nlp.NERPool, LinearRAG.start_ner_processes): the same entities,
hits and vectors as NER in the calling process; small batches stay in process; a dead worker loses nothing."""
import os
import signal
import time

import pytest
import torch

from conftest import demo_questions
from linearrag_torch import LinearRAG
from linearrag_torch.models.nlp import NERPool, question_entities

# the 40 bundled questions, a question without entities, and a few whose entities NER labels differently
QUESTIONS = [q["question"] for q in demo_questions()] + [
    "what is it?", "Who founded Microsoft in Albuquerque in 1975?", "When did the Eiffel Tower open to the public?"]


@pytest.fixture(scope="module")
def pooled(small_rag):
    """A LinearRAG over the small index sharing small_rag's models, with two NER worker processes."""
    rag = LinearRAG(small_rag.index, "cpu", small_rag.nlp, small_rag.encoder)
    pool = rag.start_ner_processes(2)
    yield rag
    rag.close()
    assert not pool.running


def test_workers_find_the_entities_of_this_process(pooled, small_rag):
    pool = pooled.ner_pool
    assert pool.running and pool.processes == 2 and pool.model == small_rag.index.index_config.spacy_model
    for dropped in ((), ("DATE", "CARDINAL", "ORDINAL")):
        want = question_entities(small_rag.nlp, QUESTIONS, dropped)
        assert pool.entities(small_rag.nlp, QUESTIONS, dropped) == want
        assert any(want) and [] in want  # the set has entities, and a question without any
    # 8 questions a part at least; one part in this process and one per worker
    assert [pool.parts(n) for n in (1, 7, 15, 16, 23, 24, 40, 400)] == [1, 1, 1, 2, 2, 3, 3, 3]


def test_search_with_workers_equals_in_process(pooled, small_rag):
    qs = QUESTIONS * 2
    got, want = pooled.encode_queries(qs), small_rag.encode_queries(qs)
    assert got.entity_text == want.entity_text and torch.equal(got.entity_owner, want.entity_owner)
    assert torch.equal(got.query_emb, want.query_emb) and torch.equal(got.entity_emb, want.entity_emb)
    hits = [[(h.id, h.score) for h in hs] for hs in pooled.search(qs, top_k=5)]
    assert hits == [[(h.id, h.score) for h in hs] for hs in small_rag.search(qs, top_k=5)]


def test_a_dead_worker_loses_no_batch(small_rag, caplog):
    pool = NERPool(small_rag.index.index_config.spacy_model, 2)
    try:
        pids = list(pool._pool._processes)
        os.kill(pids[0], signal.SIGKILL)
        want = question_entities(small_rag.nlp, QUESTIONS, ())
        with caplog.at_level("WARNING", logger="linearrag"):
            assert pool.entities(small_rag.nlp, QUESTIONS, ()) == want  # answered in process instead
        assert "NER worker processes failed" in caplog.text and pool.restarts == 1
        assert pool.entities(small_rag.nlp, QUESTIONS, ()) == want  # in process while new workers start
        deadline = time.monotonic() + 120
        while not pool.running:  # the pool replaces its workers
            assert time.monotonic() < deadline, "the NER workers were not replaced"
            time.sleep(0.1)
        assert not set(pool._pool._processes) & set(pids)
        assert pool.entities(small_rag.nlp, QUESTIONS, ()) == want  # by the new workers
    finally:
        pool.close()
    assert not pool.running


def test_bad_settings_fail_clearly(small_rag):
    with pytest.raises(ValueError, match="at least 1 process"):
        NERPool(small_rag.index.index_config.spacy_model, 0)
    rag = LinearRAG(small_rag.index, "cpu", small_rag.nlp, small_rag.encoder)
    assert rag.start_ner_processes(0) is None and rag.ner_pool is None  # 0: no processes
