"""A big batch runs in chunks sized from a memory budget; the answers must not depend on the chunking."""
import pytest
import torch

from linearrag_torch.retrieval import engine
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.retrieval import memory
from linearrag_torch.retrieval.memory import MEMORY_BUDGET_ENV, default_chunk_budget, default_memory_budget, parse_bytes
from linearrag_torch.synthetic import random_index, random_queries


@pytest.mark.parametrize("mode", ["reference", "paper"])
def test_chunked_batches_give_identical_results(mode):
    index = random_index(300, 400, dim=16, seed=11)
    queries = random_queries(index, 23, seed=12)
    graph = DeviceGraph(index)
    cfg = RetrievalConfig(mode=mode, delta=0.25, top_k=7)
    whole = retrieve(graph, queries, cfg, memory_budget=1 << 40)
    per_question = graph.bytes_per_question(cfg)
    for chunk in (1, 4, 10):
        assert graph.questions_per_chunk(chunk * per_question, cfg) == chunk
        part = retrieve(graph, queries, cfg, memory_budget=chunk * per_question)
        assert torch.equal(part.indices, whole.indices)
        torch.testing.assert_close(part.scores, whole.scores, rtol=1e-6, atol=0)


def test_chunked_trace_is_the_concatenation():
    index = random_index(120, 150, dim=8, seed=13)
    queries = random_queries(index, 9, seed=14)
    graph = DeviceGraph(index)
    cfg = RetrievalConfig(delta=0.2)
    out1, tr1 = retrieve(graph, queries, cfg, trace=True, memory_budget=1 << 40)
    out2, tr2 = retrieve(graph, queries, cfg, trace=True, memory_budget=2 * graph.bytes_per_question(cfg))
    assert torch.equal(out1.indices, out2.indices)
    assert torch.equal(tr1.is_seed, tr2.is_seed) and torch.equal(tr1.activation.tier, tr2.activation.tier)
    torch.testing.assert_close(tr1.activation.reset, tr2.activation.reset)
    assert torch.equal(tr1.dense, tr2.dense)


def test_memory_budget_setting(monkeypatch):
    assert parse_bytes("4G") == 4 << 30 and parse_bytes("512MiB") == 512 << 20 and parse_bytes("1000") == 1000
    index = random_index(50, 60, dim=8, seed=1)
    graph = DeviceGraph(index)
    monkeypatch.setenv(MEMORY_BUDGET_ENV, str(3 * graph.bytes_per_question()))
    assert graph.questions_per_chunk() == 3
    graph.memory_budget = 1  # the attribute wins over the environment; a chunk holds at least one question
    assert graph.questions_per_chunk() == 1
    monkeypatch.delenv(MEMORY_BUDGET_ENV)
    assert default_memory_budget("cpu") >= 256 << 20


def test_default_chunks_on_a_cpu_are_256_mib_within_the_limit(monkeypatch):
    """Unset, a CPU chunk holds 256 MiB of questions (at least 64) within the memory limit; a set budget and a
    GPU keep the limit (documented in memory.py and docs/tuning.md)."""
    monkeypatch.delenv(MEMORY_BUDGET_ENV, raising=False)
    monkeypatch.setattr(memory, "default_memory_budget", lambda device: 3 << 30)
    assert default_chunk_budget("cpu", 1 << 20) == 256 << 20  # 256 questions of 1 MiB
    assert default_chunk_budget("cpu", 8 << 20) == 512 << 20  # 64 questions of 8 MiB
    assert default_chunk_budget("cpu", 1 << 30) == 3 << 30  # the limit wins over 64 questions
    assert default_chunk_budget("cuda", 1 << 20) == 3 << 30  # a GPU: the limit (torch.device needs no GPU)
    graph = DeviceGraph(random_index(50, 60, dim=8, seed=1))
    assert graph.questions_per_chunk() == (256 << 20) // graph.bytes_per_question()
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "8G")  # set: taken as it is, on a CPU too
    monkeypatch.setattr(memory, "default_memory_budget", lambda device: parse_bytes("8G"))
    assert default_chunk_budget("cpu", 1 << 20) == 8 << 30


def test_bytes_per_question_counts_what_each_mode_keeps():
    index = random_index(200, 300, dim=8, seed=2)
    graph = DeviceGraph(index)
    P, E = index.num_passages, index.num_entities
    ref, paper = RetrievalConfig(), RetrievalConfig(mode="paper")
    assert graph.bytes_per_question(ref) == engine.BYTES_PER_PASSAGE * P + engine.BYTES_PER_WALK_ROW * E  # walk not built
    rows = graph.ppr_graph(False).to_entities.shape[0]  # merged leaves: fewer rows than entities
    assert rows < E
    assert graph.bytes_per_question(ref) == engine.BYTES_PER_PASSAGE * P + engine.BYTES_PER_WALK_ROW * rows
    assert graph.bytes_per_question(paper) == graph.bytes_per_question(ref) + engine.BYTES_PER_ENTITY_PAPER * E


def test_select_and_slice_take_questions_with_their_entities():
    queries = random_queries(random_index(30, 40, dim=8, seed=3), 7, seed=5)
    own = queries.entity_owner.tolist()
    sub = queries.select([5, 2])
    assert torch.equal(sub.query_emb, queries.query_emb[[5, 2]])
    keep = [j for j, o in enumerate(own) if o in (5, 2)]  # entities in their order, owners renumbered
    assert sub.entity_owner.tolist() == [{5: 0, 2: 1}[own[j]] for j in keep]
    assert torch.equal(sub.entity_emb, queries.entity_emb[keep]) and sub.entity_text == [queries.entity_text[j] for j in keep]
    part = queries.slice(2, 5)
    keep = [j for j, o in enumerate(own) if 2 <= o < 5]
    assert torch.equal(part.query_emb, queries.query_emb[2:5]) and part.entity_owner.tolist() == [own[j] - 2 for j in keep]
    assert queries.slice(3, 3).batch_size == 0


def test_a_chunked_real_batch_keeps_the_stored_entity_vectors(small_rag, small_questions, monkeypatch):
    from linearrag_torch.retrieval import engine as engine_mod, round as round_mod

    enc = small_rag.encode_queries([q["question"] for q in small_questions])
    assert enc.entity_rows is not None and bool((enc.entity_rows >= 0).any())
    sub = enc.select([4, 1])
    keep = [j for j, o in enumerate(enc.entity_owner.tolist()) if o in (4, 1)]
    assert sub.entity_rows.tolist() == enc.entity_rows[keep].tolist() and sub.rows_of is enc.rows_of
    whole = engine_mod.retrieve(small_rag.graph, enc, small_rag.config)
    seen = []
    real_activate = round_mod.activate

    def spy(graph, queries, cfg):
        seen.append(queries.entity_rows is not None and queries.rows_of is graph.index)
        return real_activate(graph, queries, cfg)

    monkeypatch.setattr(round_mod, "activate", spy)
    per_q = small_rag.graph.bytes_per_question(small_rag.config)
    chunked = engine_mod.retrieve(small_rag.graph, enc, small_rag.config, memory_budget=2 * per_q)
    assert seen and all(seen)  # every chunk seeded from the stored vectors' rows
    assert torch.equal(chunked.indices, whole.indices) and torch.allclose(chunked.scores, whole.scores, atol=1e-6)
