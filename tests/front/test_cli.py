"""The `linearrag` command line, run in-process through linearrag_torch.cli.main (plus one real subprocess).

The models are loaded once per session (conftest.py) and handed to the CLI through the loaders it
calls, so each command costs only its own work.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linearrag_torch import LinearRAG, models
from linearrag_torch.cli import main
from linearrag_torch.config import IndexConfig

from conftest import assert_close, assert_pair_moved, demo_corpus, demo_questions, write_jsonl

TINY_IDS = (469, 467, 368, 369, 1, 33, 98, 557, 561, 715)  # gold passages of demo questions 0, 17 and 7
Q_THUNDER, Q_BORN_FIRST = demo_questions()[0], demo_questions()[17]


@pytest.fixture(scope="module", autouse=True)
def shared_models(nlp, encoder):
    """Let the CLI reuse the session's default spaCy pipeline and encoder (other models load for real)."""
    real_nlp, real_encoder = models.load_nlp, models.load_encoder
    default = IndexConfig()

    def load_nlp(cfg):
        return nlp if cfg.spacy_model == default.spacy_model else real_nlp(cfg)

    def load_encoder(cfg, device):
        same = (cfg.encoder, cfg.max_length) == (default.encoder, default.max_length) and str(device) == "cpu"
        return encoder if same else real_encoder(cfg, device)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "load_nlp", load_nlp)
        mp.setattr(models, "load_encoder", load_encoder)
        yield


@pytest.fixture(scope="module")
def tiny_passages():
    by_id = {p["id"]: p for p in demo_corpus()}
    # string ids, so that the output must carry the corpus ids and not positions
    return [{"id": f"d{i}", "title": by_id[i]["title"], "text": by_id[i]["text"]} for i in TINY_IDS]


@pytest.fixture(scope="module")
def tiny_corpus(tiny_passages, tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("tiny") / "tiny.jsonl", tiny_passages)


def run(capsys, *argv):
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse rejects a bad flag value with exit status 2
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def tiny_index(tiny_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny_index"
    rc = main(["index", str(tiny_corpus), str(out), "--quiet", "--device", "cpu"])
    assert rc == 0
    return out


def query_json(capsys, index, *args):
    rc, out, err = run(capsys, "query", index, *args, "--json", "--device", "cpu")
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def assert_same_hits(a, b, rel=1e-5):
    """Same passages in the same order, scores equal up to float noise: a question's embedding depends
    in the last bits on the other questions of its encoder batch (padding length)."""
    assert [(h["id"], h["title"]) for h in a] == [(h["id"], h["title"]) for h in b]
    assert [h["score"] for h in a] == pytest.approx([h["score"] for h in b], rel=rel, abs=1e-6)


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


# ---------------------------------------------------------------- index
def test_index_writes_a_loadable_index(tiny_index, tiny_passages, tiny_corpus, capsys, tmp_path):
    rag = LinearRAG.load(tiny_index, device="cpu")
    assert rag.index.passage_ids == [p["id"] for p in tiny_passages]
    assert rag.index.titles == [p["title"] for p in tiny_passages]
    meta = json.loads((tiny_index / "index.json").read_text())
    assert meta["counts"]["passages"] == 10 and meta["retrieval_config"]["mode"] == "reference"
    # the summary line goes to stderr, stdout stays clean
    rc, out, err = run(capsys, "index", tiny_corpus, tmp_path / "again", "--quiet", "--device", "cpu")
    assert rc == 0 and out == ""
    assert re.search(r"indexed 10 passages, \d+ sentences, \d+ entities", err)


def test_index_stores_retrieval_settings_that_query_then_uses(tiny_corpus, tiny_index, capsys, tmp_path):
    folder = tmp_path / "paper_index"
    rc, _, err = run(capsys, "index", tiny_corpus, folder, "--quiet", "--device", "cpu", "--mode", "paper",
                     "--delta", "0.3")
    assert rc == 0, err
    stored = json.loads((folder / "index.json").read_text())["retrieval_config"]
    assert stored["mode"] == "paper" and stored["delta"] == 0.3
    qs = [Q_THUNDER["question"], Q_BORN_FIRST["question"]]
    # same corpus, same models: the stored settings must act like the flags on the default index
    assert query_json(capsys, folder, *qs) == query_json(capsys, tiny_index, *qs, "--mode", "paper", "--delta", "0.3")



def test_the_local_build_loads_each_model_once_and_no_ray_code(tiny_corpus, tiny_passages, capsys, tmp_path,
                                                               monkeypatch):
    """`linearrag index` and `linearrag add` without --ray: spaCy and the encoder load once each (the question
    encoder shares the passage encoder's model), and nothing of indexing/ray_build runs."""
    from linearrag_torch.cli import add as add_command, index as index_command
    from linearrag_torch.indexing import ray_build

    loads = []
    nlp, encoder = models.load_nlp, models.load_encoder
    monkeypatch.setattr(models, "load_nlp", lambda cfg: loads.append("nlp") or nlp(cfg))
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, **kw: loads.append("encoder") or encoder(cfg, device))

    def no_ray(*args, **kwargs):
        raise AssertionError("the local build went through ray_build")

    for name in ("build_index_on_ray", "add", "connect"):
        monkeypatch.setattr(ray_build, name, no_ray)
    for command in (index_command, add_command):  # the RayOptions of the flags
        monkeypatch.setattr(command, "ray_options", no_ray)
    folder = tmp_path / "index"
    rc, _, err = run(capsys, "index", tiny_corpus, folder, "--quiet", "--device", "cpu")
    assert rc == 0, err
    assert sorted(loads) == ["encoder", "nlp"]
    loads.clear()
    more = write_jsonl(tmp_path / "more.jsonl", [{"id": "new", "title": "T", "text": tiny_passages[0]["text"]}])
    rc, _, err = run(capsys, "add", folder, more, "--quiet", "--device", "cpu")
    assert rc == 0, err
    assert sorted(loads) == ["encoder", "nlp"]


# ---------------------------------------------------------------- query
def test_query_json_prints_one_object_per_question(tiny_index, tiny_passages, capsys):
    titles = {p["id"]: p["title"] for p in tiny_passages}
    questions = [Q_THUNDER, Q_BORN_FIRST]
    results = query_json(capsys, tiny_index, *[q["question"] for q in questions])
    plain = query_json(capsys, tiny_index, *[q["question"] for q in questions], "--pair-candidates", "0")
    assert len(results) == 2
    for i, (q, res) in enumerate(zip(questions, results)):
        assert set(res) == {"id", "question", "hits"}
        assert res["id"] == i and res["question"] == q["question"]
        assert len(res["hits"]) == 5  # the default top_k
        for h in res["hits"]:
            assert set(h) == {"id", "score", "title"}
            assert h["id"] in titles and h["title"] == titles[h["id"]]
            assert isinstance(h["score"], float)
        # best first: without the pair rerank, the chain round keeps the first round's top passage ahead of
        # the second round's ranking, with its second-round score (chain.merge, METHOD.md), the rest sorted;
        # the pair rerank then moves two of the top five to the front (pairs.py)
        scores = [h["score"] for h in plain[i]["hits"]]
        assert scores[1:] == sorted(scores[1:], reverse=True)
        assert_pair_moved([h["id"] for h in res["hits"]], [h["id"] for h in plain[i]["hits"]])
        assert len({h["id"] for h in res["hits"]}) == 5
        # the top hit is a gold supporting passage of the demo question
        assert res["hits"][0]["id"] in {f"d{s}" for s in q["supporting_ids"]}


def test_query_explain_prints_what_explain_returns(small_index_dir, small_rag, small_questions, capsys):
    """--explain: per question one JSON line holding LinearRAG.explain's dict, each hit as id, score, title and
    the activated entities it contains; its hits are the query's (the sharded run: tests/distributed)."""
    qs = [q["question"] for q in small_questions]
    rc, out, err = run(capsys, "query", small_index_dir, *qs, "--explain", "--device", "cpu")
    assert rc == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    want = small_rag.explain(qs)
    assert [e["id"] for e in got] == list(range(len(qs)))
    for g, w in zip(got, want):
        hits = [{"id": h.id, "score": h.score, "title": h.title, "entities": [list(e) for e in ents]}
                for h, ents in w["hits"]]
        assert_close(g, {"id": g["id"], **json.loads(json.dumps({**w, "hits": hits}))}, g["question"])
    assert any(h["entities"] for e in got for h in e["hits"]) and any(e["chain_seeds"] for e in got)
    plain = query_json(capsys, small_index_dir, *qs)
    for g, p in zip(got, plain):
        assert_same_hits(g["hits"], p["hits"])


def test_query_top_k(tiny_index, capsys):
    five = query_json(capsys, tiny_index, Q_THUNDER["question"])
    three = query_json(capsys, tiny_index, Q_THUNDER["question"], "--top-k", "3")
    assert len(three[0]["hits"]) == 3 and three[0]["hits"] == five[0]["hits"][:3]
    everything = query_json(capsys, tiny_index, Q_THUNDER["question"], "--top-k", "50")
    assert len(everything[0]["hits"]) == 10  # capped at the number of passages


def test_query_questions_file_keeps_its_ids(tiny_index, capsys, tmp_path):
    qfile = write_jsonl(tmp_path / "questions.jsonl", [
        {"id": "alpha", "question": Q_BORN_FIRST["question"], "answers": ["x"]},
        {"id": 17, "question": Q_THUNDER["question"]},
        {"question": Q_THUNDER["question"]},
    ])
    from_file = query_json(capsys, tiny_index, "--questions", qfile)
    assert [r["id"] for r in from_file] == ["alpha", 17, 2]
    assert [r["question"] for r in from_file] == [Q_BORN_FIRST["question"], Q_THUNDER["question"], Q_THUNDER["question"]]
    direct = query_json(capsys, tiny_index, Q_THUNDER["question"], Q_BORN_FIRST["question"])
    assert_same_hits(from_file[1]["hits"], direct[0]["hits"])
    assert_same_hits(from_file[2]["hits"], direct[0]["hits"])
    assert_same_hits(from_file[0]["hits"], direct[1]["hits"])


def test_query_scipy_backend_gives_the_same_ranking(tiny_index, capsys):
    qs = [Q_THUNDER["question"], Q_BORN_FIRST["question"], "what is this about?"]
    for mode in ("reference", "paper"):
        a = query_json(capsys, tiny_index, *qs, "--mode", mode)
        b = query_json(capsys, tiny_index, *qs, "--mode", mode, "--backend", "scipy")
        for ra, rb in zip(a, b):
            assert [h["id"] for h in ra["hits"]] == [h["id"] for h in rb["hits"]]
            for ha, hb in zip(ra["hits"], rb["hits"]):
                assert ha["score"] == pytest.approx(hb["score"], rel=1e-4)


def test_query_batch_size_does_not_change_results(tiny_index, capsys):
    qs = [Q_THUNDER["question"], Q_BORN_FIRST["question"], "what is this about?"]
    one_by_one = query_json(capsys, tiny_index, *qs, "--batch-size", "1")
    together = query_json(capsys, tiny_index, *qs)
    assert [(r["id"], r["question"]) for r in one_by_one] == [(r["id"], r["question"]) for r in together]
    for a, b in zip(one_by_one, together):
        assert_same_hits(a["hits"], b["hits"])


def test_query_batch_size_zero_answers_or_refuses(tiny_index, capsys):
    qs = [Q_THUNDER["question"], Q_BORN_FIRST["question"]]
    rc, out, err = run(capsys, "query", tiny_index, *qs, "--json", "--device", "cpu", "--batch-size", "0")
    assert (rc == 2 and "batch" in err) or (rc == 0 and len(out.splitlines()) == len(qs))


def test_query_readable_output(tiny_index, capsys):
    qs = [Q_THUNDER["question"], Q_BORN_FIRST["question"]]
    rc, out, err = run(capsys, "query", tiny_index, *qs, "--top-k", "4", "--device", "cpu")
    assert rc == 0, err
    want = query_json(capsys, tiny_index, *qs, "--top-k", "4")
    lines = [l for l in out.splitlines() if not l.startswith("     (order: ")]  # the note on scores out of order
    assert len(lines) == 2 * (1 + 4)
    for b, res in enumerate(want):
        block = lines[b * 5:(b + 1) * 5]
        assert block[0] == f"Q {b}: {res['question']}"
        for rank, (line, h) in enumerate(zip(block[1:], res["hits"]), 1):
            m = re.fullmatch(r"  (\d+)\. \[(.+?)\] (.+)  score (\S+)", line)
            assert m, line
            assert int(m.group(1)) == rank and m.group(2) == h["id"] and m.group(3) == h["title"]
            assert float(m.group(4)) == pytest.approx(h["score"], rel=1e-3)


def test_scores_out_of_order_carry_a_note_naming_the_pair_rerank(small_index_dir, capsys, tmp_path):
    """The pair rerank gives places 1-2 to a pair and leaves their scores: where the printed scores are out of
    order a note under the question says which stage set the order; in order (or without the pair rerank, which
    leaves the scores in order) no note."""
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question": q["question"]}) + "\n" for q in demo_questions()))

    def blocks(*flags):
        rc, out, err = run(capsys, "query", small_index_dir, "--questions", questions, "--device", "cpu", *flags)
        assert rc == 0, err
        return [b.splitlines() for b in re.split(r"^(?=Q )", out, flags=re.M) if b]

    inverted = 0
    for block in blocks():
        scores = [float(m.group(1)) for m in (re.search(r"  score (\S+)$", l) for l in block) if m]
        out_of_order = any(a < b for a, b in zip(scores, scores[1:]))
        notes = [l for l in block if l.startswith("     (order: ")]
        assert notes == (["     (order: place 1 kept from the first round ahead of the last round's ranking; then "
                          "places 1-2 the pair rerank's best pair of the top 5; each score is its own round's, so a "
                          "lower one can come first)"] if out_of_order else []), block
        inverted += out_of_order
    assert inverted, "no question with its scores out of order: the note is untested"
    for block in blocks("--pair-candidates", "0"):  # the chain round alone: its note does not name the pair rerank
        assert not any("pair rerank" in l for l in block), block
    for block in blocks("--pair-candidates", "0", "--chain-passages", "0"):  # one round, no pairs: in score order
        scores = [float(m.group(1)) for m in (re.search(r"  score (\S+)$", l) for l in block) if m]
        assert scores == sorted(scores, reverse=True) and not any("(order: " in l for l in block), block


# ---------------------------------------------------------------- errors (exit status 2, message on stderr)
def assert_error(rc, out, err, *words):
    assert rc == 2
    assert out == ""
    assert re.search(r"^linearrag \w+: error: ", err, re.M), err  # ours, or argparse's after its usage line
    for w in words:
        assert str(w) in err, f"{w!r} not in {err!r}"


def test_unknown_index_folder(capsys, tmp_path):
    missing = tmp_path / "no_index_here"
    assert_error(*run(capsys, "query", missing, "Who?", "--device", "cpu"), missing, "no such index folder")


def test_folder_that_is_not_an_index(capsys, tmp_path):
    assert_error(*run(capsys, "query", tmp_path, "Who?", "--device", "cpu"), tmp_path, "no index.json")


@pytest.mark.parametrize("question", ["", "   "])
def test_empty_question(tiny_index, capsys, question):
    assert_error(*run(capsys, "query", tiny_index, "Who directed it?", question, "--device", "cpu"), "empty question")


def test_no_question_at_all(tiny_index, capsys):
    assert_error(*run(capsys, "query", tiny_index, "--device", "cpu"), "no question")


def test_bad_questions_file(tiny_index, capsys, tmp_path):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text('{"question": "Who?"}\n{"question": ""}\n', encoding="utf-8")
    assert_error(*run(capsys, "query", tiny_index, "--questions", qfile, "--device", "cpu"), qfile, "line 2", "empty")


def test_invalid_setting(tiny_index, capsys):
    assert_error(*run(capsys, "query", tiny_index, "Who?", "--top-k", "0", "--device", "cpu"), "--top-k")
    assert_error(*run(capsys, "query", tiny_index, "Who?", "--damping", "1.5", "--device", "cpu"), "damping")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_cuda(tiny_index, capsys):
    assert_error(*run(capsys, "query", tiny_index, "Who?", "--device", "cuda"), "CUDA")


def test_corrupted_index(tiny_index, capsys, tmp_path):
    folder = tmp_path / "corrupted"
    shutil.copytree(tiny_index, folder)
    tensors = json.loads((folder / "index.json").read_text())["files"]["tensors"]
    data = bytearray((folder / tensors).read_bytes())
    data[-5] ^= 0xFF
    (folder / tensors).write_bytes(bytes(data))
    assert_error(*run(capsys, "query", folder, "Who?", "--device", "cpu"), folder / tensors, "checksum")


def test_bad_corpus_names_file_and_line(capsys, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "a"}\n{"text": "b"}\n{"text": oops}\n', encoding="utf-8")
    out_dir = tmp_path / "out"
    assert_error(*run(capsys, "index", corpus, out_dir, "--quiet", "--device", "cpu"), corpus, "line 3", "JSON")
    assert not (out_dir / "index.json").exists()


@pytest.mark.parametrize("where", ["a file", "a folder under a file"])
def test_index_into_a_file_fails_before_any_work(tiny_corpus, capsys, tmp_path, monkeypatch, where):
    """OUT an existing file (or below one): one line, exit 2, before the corpus is read or a model loaded,
    and the file as it was (it used to fail when saving, after the whole build)."""
    import linearrag_torch.api

    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    out = target if where == "a file" else target / "index"
    work = []
    monkeypatch.setattr(linearrag_torch.api.LinearRAG, "build", classmethod(lambda cls, *a, **k: work.append(a)))
    monkeypatch.setattr(models, "load_nlp", lambda cfg: work.append("nlp"))
    rc, stdout, err = run(capsys, "index", tiny_corpus, out, "--quiet", "--device", "cpu")
    assert_error(rc, stdout, err, str(out), "is a file" if where == "a file" else f"{target} is a file")
    assert err.count("\n") == 1 and work == []
    assert target.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("hidden", ["onnxruntime", "onnx"])
def test_onnx_backend_without_its_extra_is_one_line(tiny_index, capsys, monkeypatch, hidden):
    """--encoder-backend onnx without the [onnx] extra (simulated: the import fails): one line naming the extra,
    exit 2, before the index loads (it was a 40-line traceback from the export)."""
    import linearrag_torch.api

    monkeypatch.setitem(sys.modules, hidden, None)
    monkeypatch.setattr(linearrag_torch.api.LinearRAG, "load", classmethod(lambda cls, *a, **k: pytest.fail("loaded")))
    rc, out, err = run(capsys, "query", tiny_index, "Who?", "--encoder-backend", "onnx", "--device", "cpu")
    assert_error(rc, out, err, "--encoder-backend onnx", hidden, 'pip install -e ".[onnx]"')
    assert err.count("\n") == 1, err


def test_serve_on_a_port_in_use_is_one_line_before_the_index_loads(tiny_index, capsys, monkeypatch):
    """The port is checked before the index loads: one line naming it, exit 2 (it was uvicorn's Errno 98
    traceback after the load)."""
    import socket

    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import linearrag_torch.serve.app as app

    monkeypatch.setattr(app, "serve", lambda *a, **k: pytest.fail("the server started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = run(capsys, "serve", tiny_index, "--port", port)
    assert_error(rc, out, err, f"127.0.0.1:{port}", "in use")
    assert err.count("\n") == 1, err


def test_counts_read_as_english():
    from linearrag_torch.cli.common import count, sizes

    assert [count(n, "passage") for n in (0, 1, 2, 1234)] == ["0 passages", "1 passage", "2 passages", "1,234 passages"]
    assert count(1, "entity", "entities") == "1 entity" and count(3, "reply", "replies") == "3 replies"
    assert sizes({"passages": 1, "sentences": 1, "entities": 2}) == "1 passage, 1 sentence, 2 entities"


def test_adding_one_passage_says_one_passage(tiny_index, capsys, tmp_path):
    folder = tmp_path / "grown"
    shutil.copytree(tiny_index, folder)
    more = write_jsonl(tmp_path / "one.jsonl", [{"id": "new1", "text": "Zorblat Quux was born in Nowhere."}])
    rc, _, err = run(capsys, "add", folder, more, "--quiet", "--device", "cpu")
    assert rc == 0, err
    assert re.match(r"added 1 passage \(\+\d+ sentences?, \+\d+ entit(y|ies)\) to ", err), err
    assert re.search(r"now 11 passages, ", err) and "1 sentences" not in err and "1 entities" not in err, err


def test_failed_index_leaves_the_existing_index_untouched(tiny_index, capsys, tmp_path):
    folder = tmp_path / "existing"
    shutil.copytree(tiny_index, folder)
    before = snapshot(folder)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": 1, "text": "a"}, {"id": 1, "text": "b"}])
    ok = write_jsonl(tmp_path / "ok.jsonl", [{"text": "Paris is the capital of France."}])
    failures = [
        (("index", empty, folder), ("no passages",)),
        (("index", dup, folder), ("duplicate id", "line 2")),
        (("index", tmp_path / "missing.jsonl", folder), ("no such file",)),
        (("index", ok, folder, "--spacy-model", "no_such_spacy_model"), ("no_such_spacy_model",)),
        (("index", ok, folder, "--encoder", tmp_path / "no_such_encoder"), ("no_such_encoder",)),
    ]
    for argv, words in failures:
        assert_error(*run(capsys, *argv, "--quiet", "--device", "cpu"), *words)
        assert snapshot(folder) == before, argv
    loaded = LinearRAG.load(folder, device="cpu")
    assert loaded.index.num_passages == 10
    assert query_json(capsys, folder, Q_THUNDER["question"]) == query_json(capsys, tiny_index, Q_THUNDER["question"])


# ---------------------------------------------------------------- demo
def test_demo_answers_bundled_questions_from_a_cached_index(small_index_dir, capsys, tmp_path):
    """The demo caches its index under demo-<sha256 of the bundled corpus>; with the small index placed
    there it loads it instead of indexing 300 passages, and prints seeds, hits and recall."""
    import hashlib

    from conftest import DATA

    digest = hashlib.sha256((DATA / "demo_corpus.jsonl").read_bytes()).hexdigest()[:12]
    shutil.copytree(small_index_dir, tmp_path / f"demo-{digest}")
    rc, out, err = run(capsys, "demo", "--limit", "2", "--top-k", "3", "--cache", tmp_path, "--device", "cpu")
    assert rc == 0, err
    assert re.search(r"^Loaded the demo index from .* in [\d.]+ s\n"
                     r"Loaded spaCy \S+ and the encoder all-MiniLM-L6-v2 in [\d.]+ s$", err, re.M), err
    questions = demo_questions()
    for q in questions[:2]:
        assert f"Q: {q['question']}" in out
    assert f"Q: {questions[2]['question']}" not in out
    assert "seeds: " in out
    assert re.search(r"^ \*1\. Thunder on the Hill  score ", out, re.M)  # gold passages are starred
    # the second hop, which names no entity of the question, shows the entity that bridged to it from the film's
    # passage (a chain seed of the later round), and the legend says what a bridge is
    assert re.search(r"^ \*\d\. Hans J\. Salter  score \S+(  \(found by round \d\))?\n"
                     r"      bridge: (.*, )?Hans J\. Salter\b", out, re.M), out
    assert "\nbridge: the entities a later round started from" in out
    # the questions' time apart from the models' loading, which a cached run does first (issue 60: it was counted
    # in the questions' time on a cached run only)
    assert re.search(r"On all 40 bundled questions: recall@2 [\d.]+, recall@5 [\d.]+ \(\w+ mode, device cpu; "
                     r"[\d.]+ s for the questions, after [\d.]+ s loading the models\)$", out, re.M), out
    # a question whose shown scores are out of order says which stages set the order
    for block in re.split(r"^(?=Q: )", out, flags=re.M)[1:]:
        scores = [float(x) for x in re.findall(r"^ [ *]\d\. .*  score (\S+)", block, re.M)]
        assert ("(order: " in block) == any(a < b for a, b in zip(scores, scores[1:])), block


def test_demo_limit_and_its_old_spelling(capsys, monkeypatch):
    """`demo --limit N` (how many bundled questions) is no longer spelled like `query --questions FILE`; the old
    `demo --questions N` still works, with a note saying the new spelling."""
    from linearrag_torch.cli import demo, parser

    assert parser().parse_args(["demo"]).limit == 5
    import linearrag_torch.data

    class Stop(Exception):
        pass

    def stop():
        raise Stop  # the demo got past its flags: stop before the index

    monkeypatch.setattr(linearrag_torch.data, "sample_corpus_path", stop)
    args = parser().parse_args(["demo", "--questions", "2"])
    with pytest.raises(Stop):
        demo.run(args)
    assert args.limit == 2
    assert capsys.readouterr().err == ("linearrag demo: --questions N is deprecated, use --limit N (query's "
                                       "--questions is a file)\n")
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--limit N" in out and "--questions" not in out


def test_query_says_what_it_loads_on_stderr(tiny_index, capsys):
    """The models load on first use (seconds): one line on stderr names them before; --json output is unchanged."""
    rc, out, err = run(capsys, "query", tiny_index, Q_THUNDER["question"], "--json", "--device", "cpu")
    assert rc == 0, err
    assert [json.loads(line)["question"] for line in out.splitlines()] == [Q_THUNDER["question"]]
    assert re.fullmatch(r"Loading spaCy \S+ and the encoder all-MiniLM-L6-v2 for 1 question on 10 passages, "
                        r"\d+ sentences, \d+ entities \.\.\.\n", err), err


# ---------------------------------------------------------------- help
@pytest.mark.parametrize("argv, words", [
    (["--help"], ["index", "query", "demo"]),
    (["query", "--help"], ["--top-k", "--questions", "--json", "--backend", "--mode", "--delta"]),
    (["index", "--help"], ["CORPUS.jsonl", "INDEX_DIR", "--spacy-model", "--encoder", "--device"]),
    # where the training set it names comes from (it is not in the repository)
    (["train-reranker", "--help"], ["train_multihop", "train splits", "not in this repository",
                                    "docs/reranker.md"]),
    (["delete", "--help"], ["--ids ID,...", "--ids-file"]),
])
def test_help(capsys, argv, words):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: linearrag")
    for w in words:
        assert w in out


def test_query_is_described_as_ranking_and_answer_as_answering(capsys):
    """`query` retrieves, `answer` answers: the command list must not say that query answers questions."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    line = {l.split()[0]: l for l in out.splitlines() if l.startswith("    ") and l.split()}
    assert "answer" not in line["query"] and "rank" in line["query"], line["query"]
    assert "answer" in line["answer"]


def test_the_command_line_guide_lists_every_command():
    """docs/cli.md's list of commands (its first indented block) names every subcommand `linearrag --help` lists,
    and no other (issue 60: train-set-reader was missing)."""
    from linearrag_torch.cli import commands

    guide = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    block = re.search(r"\n\n((?:    linearrag .*\n|                .*\n)+)", guide).group(1)
    listed = {m for m in re.findall(r"^    linearrag (\S+)", block, re.M)}
    assert set(commands()) | {"--version"} == listed, sorted(listed ^ (set(commands()) | {"--version"}))


def test_usage_errors_exit_2(capsys):
    for argv in ([], ["frobnicate"], ["query"], ["query", "idx", "q", "--mode", "sideways"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        assert "usage: linearrag" in capsys.readouterr().err


def test_console_script_help():
    exe = Path(sys.executable).with_name("linearrag")
    if not exe.exists():
        exe = shutil.which("linearrag")
    assert exe, "the console script `linearrag` is not installed (pip install -e .)"
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: linearrag") and "query" in proc.stdout


def test_every_setting_is_a_flag():
    from dataclasses import fields

    from linearrag_torch.cli import parser
    from linearrag_torch.cli.flags import retrieval_config
    from linearrag_torch.config import RetrievalConfig

    args = parser().parse_args(["query", "idx", "q", "--chain-rounds", "2", "--no-use-ppr", "--chain-weight", "1.5",
                                "--adjacent-passages", "--no-lexicon-seeds"])
    stored = RetrievalConfig(delta=0.3)
    cfg = retrieval_config(args, stored)
    assert (cfg.chain_rounds, cfg.use_ppr, cfg.chain_weight, cfg.adjacent_passages, cfg.lexicon_seeds) == (2, False, 1.5, True, False)
    assert cfg.delta == 0.3 and cfg.use_activation  # flags left out keep the stored values
    names = {f.name for f in fields(RetrievalConfig)}
    assert set(args.retrieval_fields) == names - {"top_k"}  # query's --top-k is per call
    idx = parser().parse_args(["index", "c.jsonl", "idx", "--processes", "2", "--no-title-entities",
                               "--dropped-labels", "ORDINAL, DATE"])
    assert set(idx.retrieval_fields) == names and set(idx.index_fields) == {f.name for f in fields(IndexConfig)}
    icfg = IndexConfig(**{n: getattr(idx, n) for n in idx.index_fields})
    assert icfg == IndexConfig(n_process=2, title_entities=False, dropped_labels=("ORDINAL", "DATE"))
    plain = parser().parse_args(["index", "c.jsonl", "idx"])
    assert IndexConfig(**{n: getattr(plain, n) for n in plain.index_fields}) == IndexConfig()
    assert retrieval_config(plain, RetrievalConfig()) == RetrievalConfig()
