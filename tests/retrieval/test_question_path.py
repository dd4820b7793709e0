"""The question path (linearrag_torch.retrieval.pipeline): stored index vectors for entity strings, the token-id
encoder path, stage timings, the int8 encoder, and the throughput benchmark end to end."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linearrag_torch import LinearRAG
from linearrag_torch.retrieval.pipeline import STAGES, IndexEntityVectors

from conftest import demo_questions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def questions():
    return [q["question"] for q in demo_questions()]


@pytest.fixture(scope="module")
def int8_encoder():
    from linearrag_torch.models.encoding import Encoder

    return Encoder(quantize="int8")


def test_stored_vectors_give_the_top_k_of_encoding_every_string(small_rag, questions):
    """Reusing the index's entity vectors answers like encoding every entity string again (the path
    before reuse), on all 40 demo questions against the small index."""
    cfg = small_rag.config.replace(top_k=10)
    reused = small_rag.encode_queries(questions, cfg)
    fresh = small_rag.encode_queries(questions, cfg, reuse_index_vectors=False)
    assert reused.entity_text == fresh.entity_text
    assert torch.equal(reused.entity_owner, fresh.entity_owner)
    assert (reused.entity_emb - fresh.entity_emb).abs().max() < 1e-5
    assert (reused.query_emb - fresh.query_emb).abs().max() < 1e-5
    a, b = small_rag.retrieve(reused, cfg), small_rag.retrieve(fresh, cfg)
    assert torch.equal(a.indices, b.indices)
    assert torch.allclose(a.scores, b.scores, atol=1e-5)


def test_question_vectors_equal_the_build_encoder(small_rag, encoder, questions):
    """encode_token_ids (length-sorted, padded by hand) gives Encoder.encode's vectors (tokenizer padding)."""
    enc = small_rag.encode_queries(questions[:12])
    ref = encoder.encode(questions[:12])
    assert (enc.query_emb - ref).abs().max() < 1e-5
    ents = enc.entity_text
    assert ents and (enc.entity_emb - encoder.encode(ents)).abs().max() < 1e-5


def test_token_id_encoding_batches_mixed_lengths(encoder):
    texts = ["a", "Who was the director of the 1994 film that starred the actor born in Ohio in 1950?",
             "Paris", "paris", "Thunder On The Hill", "x " * 300]
    keys = encoder.token_keys(texts)
    got = encoder.encode_token_ids(keys, token_budget=40, max_rows=2)  # several passes, one row over budget
    assert (got - encoder.encode(texts)).abs().max() < 1e-5
    assert torch.equal(got[2], got[3])  # equal tokens (uncased model), one vector
    assert encoder.encode_token_ids([]).shape == (0, encoder.dim)


def test_index_entity_lookup_by_tokens(small_rag, encoder):
    ix = small_rag.index
    v = IndexEntityVectors(ix, encoder)
    names = [e.lower() for e in ix.entities[:50]] + ["no such entity qqq zzz"]
    rows = v.find(encoder.token_keys(names))
    assert rows[-1] is None
    for name, r in zip(names[:-1], rows[:-1]):
        assert r is not None and ix.entities[r].lower() == name  # uncased: the lower-cased string finds its entity
    # an index written without token keys: the keys are computed from the entity strings, same rows
    old = dataclasses.replace(ix, keys=None)
    assert IndexEntityVectors(old, encoder).find(encoder.token_keys(names)) == rows


def test_other_encoder_does_not_reuse_index_vectors(small_rag, nlp, encoder):
    class Renamed:  # the same model under another name: its vector space is not known to match
        name = "some-other-encoder"

        def __getattr__(self, attr):
            return getattr(encoder, attr)

    rag = LinearRAG(small_rag.index, "cpu", nlp=nlp, encoder=Renamed())
    assert not rag.pipeline.can_reuse and small_rag.pipeline.can_reuse


def test_timings_hold_every_stage(small_rag, questions):
    t = {}
    hits = small_rag.search(questions[:5], top_k=3, timings=t)
    assert len(hits) == 5 and set(t) == set(STAGES)
    assert all(v >= 0 for v in t.values())
    before = dict(t)
    small_rag.search(questions[:2], timings=t)  # accumulates
    assert all(t[k] >= before[k] for k in STAGES)
    t2 = {}
    small_rag.encode_queries(questions[:2], small_rag.config.replace(lexicon_seeds=False), timings=t2)
    assert set(t2) == {"ner", "encoder"}


def test_int8_encoder_vectors_are_close_to_the_exact_ones(encoder, int8_encoder, questions, small_rag):
    """Cosine with the exact vectors: > 0.98 on average for the 40 questions and for 200 entity names,
    > 0.97 for every question (measured: ~0.99 and ~0.98)."""
    names = small_rag.index.entities[:200]
    texts = questions + names
    exact = encoder.encode_token_ids(encoder.token_keys(texts))
    q = int8_encoder.encode_token_ids(int8_encoder.token_keys(texts))
    cos = (exact * q).sum(1)
    cq, ce = cos[:len(questions)], cos[len(questions):]
    assert cq.mean() > 0.98 and ce.mean() > 0.98 and cq.min() > 0.97, (float(cq.mean()), float(ce.mean()), float(cq.min()))
    assert (exact - q).abs().max() > 1e-4  # it is really another model
    assert sum(isinstance(m, torch.nn.Linear) for m in int8_encoder.model.modules()) == 6  # the FFN outputs stay float


def test_int8_search_and_its_settings(small_rag, nlp, int8_encoder, questions):
    rag = LinearRAG(small_rag.index, "cpu", nlp=nlp, encoder=int8_encoder, quantize="int8")
    hits = rag.search(questions[:6], top_k=5)
    exact = small_rag.search(questions[:6], top_k=5)
    overlap = [len({h.row for h in a} & {h.row for h in b}) / 5 for a, b in zip(hits, exact)]
    assert sum(overlap) / len(overlap) >= 0.6, overlap  # mostly the same passages (measured: 0.9)
    with pytest.raises(ValueError, match="quantize"):
        LinearRAG(small_rag.index, "cpu", quantize="int4")
    with pytest.raises(ValueError, match="CPU only"):
        LinearRAG(small_rag.index, "cuda" if torch.cuda.is_available() else "meta", quantize="int8")


def test_set_threads(monkeypatch):
    from linearrag_torch.runtime.threads import THREADS_ENV, set_threads

    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv(THREADS_ENV, "1")
        assert set_threads() == 1
        monkeypatch.delenv(THREADS_ENV)
        assert set_threads() == 1  # nothing asked: unchanged
        with pytest.raises(ValueError):
            set_threads(0)
    finally:
        torch.set_num_threads(before)


def test_throughput_benchmark_end_to_end(small_index_dir, small_questions, tmp_path):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question": q["question"]}) + "\n" for q in small_questions))
    out = tmp_path / "throughput.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--index", str(small_index_dir),
                           "--questions", str(qfile), "--json", str(out), "--batch-sizes", "1", "4",
                           "--min-questions", "4", "--int8", "--threads", "1", "--clock", "cpu",
                           "--graph-batch-sizes", "1", "8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert [(r["encoder"], r["batch"]) for r in res["rows"]] == [("exact", 1), ("exact", 4), ("int8", 1), ("int8", 4)]
    for r in res["rows"]:
        ms = r["ms_per_question"]
        assert set(ms) == set(STAGES) | {"end_to_end"}
        assert all(v >= 0 for v in ms.values()) and ms["encoder"] > 0 and ms["graph"] > 0
        assert ms["end_to_end"] >= sum(ms[s] for s in STAGES) * 0.99
    assert res["torch_threads"] == 1 and res["clock"] == "cpu"
    assert out.with_suffix(".png").stat().st_size > 0
    graph = res["graph_rows"]  # the graph stage alone; batch 8 tiles the 6 distinct questions
    assert [(r["batch"], r["questions"], r["unique_questions"]) for r in graph] == [(1, 4, 4), (8, 8, 6)]
    assert all(r["graph_ms_per_question"] > 0 and 0 < r["host_reads_per_batch"] < 100 for r in graph)


def test_throughput_benchmark_with_ner_processes(small_index_dir, tmp_path):
    from conftest import demo_questions

    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question": q["question"]}) + "\n" for q in demo_questions()))
    out = tmp_path / "throughput.json"
    cmd = [sys.executable, "-m", "benchmarks.throughput", "--index", str(small_index_dir), "--questions", str(qfile),
           "--json", str(out), "--batch-sizes", "32", "--min-questions", "32", "--ner-processes", "2",
           "--graph-batch-sizes"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["encoder"], r["batch"]) for r in rows] == [("exact", 32), ("exact+ner2", 32)]
    assert all(r["ms_per_question"]["ner"] > 0 for r in rows)
    bad = subprocess.run(cmd + ["--clock", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--ner-processes needs --clock wall" in bad.stderr


def test_cli_query_with_int8_encoder_and_one_thread(small_index_dir, small_questions, capsys):
    from linearrag_torch.cli import main

    before = torch.get_num_threads()
    try:
        rc = main(["query", str(small_index_dir), small_questions[0]["question"], "--quantize", "int8",
                   "--threads", "1", "--json", "--top-k", "3", "--device", "cpu"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1 and len(json.loads(out[0])["hits"]) == 3


def test_cli_query_with_ner_processes(small_index_dir, tmp_path, capsys):
    from conftest import demo_questions

    from linearrag_torch.cli import main

    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"id": i, "question": q["question"]}) + "\n"
                             for i, q in enumerate(demo_questions()[:20])))
    args = ["query", str(small_index_dir), "--questions", str(qfile), "--json", "--top-k", "3", "--device", "cpu"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--ner-processes", "1"]) == 0  # 20 questions: one part here, one in the worker
    assert capsys.readouterr().out == plain and len(plain.splitlines()) == 20
    with pytest.raises(SystemExit, match="does not apply with --shards"):
        main(args + ["--ner-processes", "1", "--shards", "2"])


def test_known_rows_skip_the_entity_scan_with_the_same_seeds(small_rag, questions):
    """An entity string holding an index entity's stored vector seeds that entity: the scan over all
    entities (nearest_entities without ``known``) finds the same entity and cosine."""
    from linearrag_torch.retrieval.activation import nearest_entities, seed_pairs

    enc = small_rag.encode_queries(questions)
    assert enc.entity_rows is not None and enc.rows_of is small_rag.index
    known = enc.entity_rows
    assert 0 < int((known >= 0).sum()) < known.numel()  # both kinds occur in the demo questions
    emb = small_rag.index.entity_emb
    best_k, arg_k = nearest_entities(emb, enc.entity_emb, known=known)
    best_s, arg_s = nearest_entities(emb, enc.entity_emb)
    assert torch.equal(arg_k, arg_s) and (best_k - best_s).abs().max() < 1e-6
    keys_k, vals_k = seed_pairs(emb, enc.entity_emb, enc.entity_owner, len(questions), known)
    keys_s, vals_s = seed_pairs(emb, enc.entity_emb, enc.entity_owner, len(questions))
    assert torch.equal(keys_k, keys_s) and (vals_k - vals_s).abs().max() < 1e-6


def test_rows_are_not_used_against_another_index(small_rag, nlp, encoder, questions):
    """Vectors encoded for one index and ranked on another (benchmarks/compare_indexes.py) ignore the
    first index's rows (the engine checks rows_of by identity)."""
    from linearrag_torch.retrieval import engine

    ix = small_rag.index
    enc = small_rag.encode_queries(questions[:8])
    other = dataclasses.replace(ix)  # another index object: rows_of does not match
    graph = engine.DeviceGraph(other, "cpu")
    out = engine.retrieve(graph, enc, small_rag.config)
    ref = engine.retrieve(graph, dataclasses.replace(enc, entity_rows=None, rows_of=None), small_rag.config)
    assert torch.equal(out.indices, ref.indices)
    calls = []
    real = engine.NearestMemo.__call__
    one_round = small_rag.config.replace(chain_passages=0)  # one scan per retrieve
    try:
        engine.NearestMemo.__call__ = lambda self, *a: calls.append(a[2:3]) or real(self, *a)
        engine.retrieve(graph, enc, one_round)
        engine.retrieve(small_rag.graph, enc, one_round)
    finally:
        engine.NearestMemo.__call__ = real
    assert calls[0] == (None,) and calls[1][0] is enc.entity_rows


def test_retrieval_runs_in_inference_mode_and_returns_ordinary_tensors(small_rag, questions):
    """The engine ranks under torch.inference_mode (fewer dispatches per small op); its results and trace are
    ordinary tensors that a caller may change in place, its answer is the one computed inside inference mode
    too, and the mode does not outlive the call."""
    from linearrag_torch.retrieval import engine
    from linearrag_torch.queries import Retrieved

    enc = small_rag.encode_queries(questions)
    graph = small_rag.graph
    cfg = small_rag.config
    from linearrag_torch.retrieval import round as graph_round

    seen = []
    real = graph_round.one_chunk

    def spy(*args, **kwargs):
        seen.append(torch.is_inference_mode_enabled())
        return real(*args, **kwargs)

    graph_round.one_chunk = spy
    try:
        out, tr = engine.retrieve(graph, enc, cfg, trace=True)
    finally:
        graph_round.one_chunk = real
    assert seen and all(seen) and not torch.is_inference_mode_enabled()
    assert isinstance(out, Retrieved)
    tensors = [out.indices, out.scores, tr.seeds, tr.is_seed, tr.dense, tr.activation.act, tr.activation.tier,
               tr.activation.reset]
    assert not any(t.is_inference() for t in tensors)
    out.scores.add_(1.0)  # allowed: an inference tensor would raise here
    tr.activation.act.zero_()
    with torch.inference_mode():
        inside = engine.retrieve(graph, enc, cfg)
    assert torch.equal(inside.indices, out.indices) and torch.equal(inside.scores + 1.0, out.scores)
    again = small_rag.retrieve(enc)  # the caches made in inference mode serve a later call
    assert torch.equal(again.indices, out.indices)


def test_question_path_versions_benchmark_options(small_index_dir, tmp_path):
    """benchmarks/question_path_versions.py times this checkout with LinearRAG.load options and NER worker
    processes; the rankings equal those of the plain run (neither changes a float32 result)."""
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question": q["question"]}) + "\n" for q in demo_questions()))
    script = str(ROOT / "benchmarks" / "question_path_versions.py")
    base = [sys.executable, script, "--src", str(ROOT), "--index", str(small_index_dir), "--questions", str(qfile),
            "--batch-sizes", "32"]
    runs = {}
    for name, extra in (("plain", []), ("options", ["--load", '{"encoder_backend": "torch"}', "--ner-processes", "1"])):
        out, ranking = tmp_path / f"{name}.json", tmp_path / f"{name}_top10.json"
        proc = subprocess.run(base + extra + ["--json", str(out), "--ranking", str(ranking)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[name] = json.loads(out.read_text()), json.loads(ranking.read_text())
    res, top = runs["options"]
    assert res["load"] == {"encoder_backend": "torch"} and res["ner_processes"] == 1
    assert [r["batch"] for r in res["rows"]] == [32] and all(r["end_to_end_ms"] > 0 for r in res["rows"])
    assert runs["plain"][0]["ner_processes"] == 0
    assert top["indices"] == runs["plain"][1]["indices"] and len(top["indices"]) == len(demo_questions())


def test_question_ner_fallback_and_off_use_the_lexicon_first(small_rag, questions):
    """question_ner: 'always' = NER then lexicon (today's path); 'fallback' = the lexicon's matches, NER only
    where the lexicon finds nothing; 'off' = the lexicon's matches only (a question without any has none)."""
    from linearrag_torch.models.nlp import question_entities

    pipe = small_rag.pipeline
    qs = list(questions) + ["zzqx wibble frobnicate?"]  # the last one: nothing the lexicon knows
    lex = [pipe.lexicon.match(q) for q in qs]
    ner = question_entities(small_rag.nlp, qs, small_rag.index.index_config.dropped_labels)
    assert any(lex) and not lex[-1]
    assert pipe.entities(qs, True) == [list(dict.fromkeys(n + m)) for n, m in zip(ner, lex)]
    assert pipe.entities(qs, True, ner="off") == [list(dict.fromkeys(m)) for m in lex]
    assert pipe.entities(qs, True, ner="fallback") == [list(dict.fromkeys(m if m else n)) for n, m in zip(ner, lex)]
    t = {}
    cfg = small_rag.config.replace(question_ner="off")
    enc = small_rag.encode_queries(qs, cfg, timings=t)
    assert "ner" not in t and enc.entity_owner.tolist() == [i for i, m in enumerate(lex) for _ in dict.fromkeys(m)]
    assert len(small_rag.retrieve(enc, cfg).indices) == len(qs)
    with pytest.raises(ValueError, match="needs lexicon_seeds"):
        small_rag.config.replace(question_ner="off", lexicon_seeds=False)
    with pytest.raises(ValueError, match="question_ner must be one of"):
        small_rag.config.replace(question_ner="never")


def test_question_ner_benchmark_on_two_small_sets(tmp_path, small_corpus, small_questions, small_rag):
    from conftest import two_data_folders

    from benchmarks import question_ner as bench

    cache, folders = two_data_folders(tmp_path, small_corpus, small_questions, small_rag)
    out = tmp_path / "q.json"
    assert bench.main(["--data", *map(str, folders), "--cache", str(cache), "--batch", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for folder, qs in zip(folders, (small_questions[:3], small_questions[3:])):
        got = res["datasets"][folder.name]
        texts = [q["question"] for q in qs]
        for ner in ("always", "fallback", "off"):  # each path's recall@10 is the engine's with that setting
            rows = [[h.row for h in hits] for hits in small_rag.search(texts, top_k=10, question_ner=ner)]
            gold = [{str(g) for g in q["supporting_ids"]} for q in qs]
            ids = small_rag.index.passage_ids
            want = 100 * sum(len(g & {str(ids[r]) for r in row}) / len(g) for row, g in zip(rows, gold)) / len(qs)
            assert got[ner]["metrics"]["recall@10"] == pytest.approx(want, abs=0.01)
        assert got["always"]["ner_share"] == 1.0 and got["off"]["ner_share"] == 0.0
        assert "ner" not in got["off"]["ms_per_question"] and got["off"]["one_core_ceiling_qps"] > 0
    with pytest.raises(SystemExit):
        bench.main(["--data", str(tmp_path / "missing")])


def test_throughput_benchmark_graph_stage_alone(small_index_dir, small_questions, tmp_path):
    """With no --batch-sizes only the graph stage is timed; its plot shows it with the host reads per batch."""
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question": q["question"]}) + "\n" for q in small_questions))
    out = tmp_path / "graph.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--index", str(small_index_dir),
                           "--questions", str(qfile), "--json", str(out), "--batch-sizes", "--threads", "1",
                           "--graph-batch-sizes", "1", "8", "--min-questions", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert res["rows"] == [] and [r["batch"] for r in res["graph_rows"]] == [1, 8]
    assert all(r["host_reads_per_batch"] < 100 for r in res["graph_rows"])
    assert out.with_suffix(".png").stat().st_size > 0
