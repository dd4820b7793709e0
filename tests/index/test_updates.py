"""Incremental updates: add and delete give the index a full build would, safely.

Real data: the small demo slice of conftest.py (small_rag, 60 passages) is the full build; the first 30
passages are built once more and the other 30 added, and a scattered third of the passages is deleted
and compared with a build without them. Exact equality is asserted for everything that is exact
(strings, M, C, N, PS, the NER record); the embeddings of texts encoded in other batches differ in the
last bits (~1e-7, padding), so they and the retrieval scores are compared with tolerances, and the
top-5 passage ids of every demo question must be identical.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from linearrag_torch import InputError, LinearRAG, Passage, models
from linearrag_torch.indexing.build import add_passages, build_index, delete_passages
from linearrag_torch.cli import main
from linearrag_torch.index import (KEY_PARTS, MATRICES, NER_PARTS, PAUSE_ENV, IndexFormatError, IndexLockedError,
                                   TriGraphIndex, index_lock)

from conftest import demo_questions, small_passages, write_jsonl

QUESTIONS = [q["question"] for q in demo_questions()]
EMB_TOL = 1e-6  # embeddings of one text encoded in different batches
SCORE_TOL = 1e-5


@pytest.fixture
def one_thread():
    """For tests on a few short texts: one torch thread. On a busy machine two threads that wait for
    each other make each small encoder call 10x slower (1.5 s instead of 0.1 s for three texts)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rag_of(index, nlp, encoder):
    return LinearRAG(index, "cpu", nlp, encoder)


def build(passages, nlp, encoder):
    return LinearRAG.build(passages, device="cpu", progress=False, nlp=nlp, encoder=encoder)


def assert_same_graph(a: TriGraphIndex, b: TriGraphIndex, embeddings: bool = True):
    """Strings, matrices, token keys and NER record identical; with ``embeddings``, the embeddings equal up to
    batching noise."""
    for name in ("passage_ids", "titles", "texts", "sentences", "entities"):
        assert getattr(a, name) == getattr(b, name), name
    for name in MATRICES:
        ma, mb = getattr(a, name), getattr(b, name)
        assert tuple(ma.shape) == tuple(mb.shape), name
        for part in ("crow", "col", "val"):
            assert getattr(ma, part).dtype == getattr(mb, part).dtype, f"{name}.{part}"
            assert torch.equal(getattr(ma, part), getattr(mb, part)), f"{name}.{part}"
    assert a.keys is not None and b.keys is not None
    for part in KEY_PARTS:
        assert torch.equal(getattr(a.keys, part), getattr(b.keys, part)), f"token keys of {part}"
    assert a.ner is not None and b.ner is not None
    for part in NER_PARTS:
        ma, mb = getattr(a.ner, part), getattr(b.ner, part)
        assert tuple(ma.shape) == tuple(mb.shape) and torch.equal(ma.crow, mb.crow) and torch.equal(ma.col, mb.col), part
    for name in ("passage_emb", "sentence_emb", "entity_emb") if embeddings else ():
        ea, eb = getattr(a, name), getattr(b, name)
        assert ea.shape == eb.shape, name
        assert ea.numel() == 0 or float((ea - eb).abs().max()) <= EMB_TOL, name


def assert_same_answers(a: LinearRAG, b: LinearRAG, questions=QUESTIONS):
    """Every question's top 5 in both modes. The questions are encoded once (their NER and vectors do not
    depend on the index, and both indexes hold the same entity strings)."""
    encoded = a.encode_queries(questions)
    for mode in ("reference", "paper"):
        cfg = a.config.replace(mode=mode, top_k=5)
        ha, hb = a.hits(a.retrieve(encoded, cfg)), b.hits(b.retrieve(encoded, cfg))
        for q, x, y in zip(questions, ha, hb):
            assert [h.id for h in x] == [h.id for h in y], (mode, q)
            assert [h.score for h in x] == pytest.approx([h.score for h in y], rel=0, abs=SCORE_TOL), (mode, q)


# ---------------------------------------------------------------- equivalence on real data
@pytest.fixture(scope="module")
def halves():
    ps = small_passages()
    return ps[:30], ps[30:]


@pytest.fixture(scope="module")
def first_half(halves, nlp, encoder):
    return build(halves[0], nlp, encoder)


@pytest.fixture(scope="module")
def grown(first_half, halves, nlp, encoder):
    rag = rag_of(first_half.index, nlp, encoder)
    rag.add(halves[1])
    return rag


def test_add_equals_the_full_build(small_rag, grown, first_half, halves):
    assert first_half.index.num_passages == 30, "add must not change the index it starts from"
    assert grown.index.num_entities > first_half.index.num_entities
    assert grown.index.num_sentences > first_half.index.num_sentences
    # the second half reuses entities of the first (by string) and mentions them in old passages (N)
    added_mentions = grown.index.ner.entities.col[first_half.index.C.nnz:]
    assert int((added_mentions < first_half.index.num_entities).sum()) > 10
    assert_same_graph(grown.index, small_rag.index)
    assert_same_answers(grown, small_rag)


def test_deleting_the_added_passages_gives_back_the_first_index(grown, first_half, nlp, encoder, halves):
    rag = rag_of(grown.index, nlp, encoder).delete([p["id"] for p in halves[1]])
    assert_same_graph(rag.index, first_half.index)
    for name in ("passage_emb", "sentence_emb", "entity_emb"):  # the kept rows, bit for bit
        assert torch.equal(getattr(rag.index, name), getattr(first_half.index, name)), name


GONE = [p["id"] for p in small_passages()[::3]]  # the first passage and every third one: renumbering everywhere


@pytest.fixture(scope="module")
def without_gone(nlp, encoder):
    """A fresh build of the small corpus without GONE."""
    return build([p for p in small_passages() if p["id"] not in set(GONE)], nlp, encoder)


def test_delete_equals_a_build_without_the_passages(small_rag, without_gone, nlp, encoder):
    rag = rag_of(small_rag.index, nlp, encoder).delete(GONE)
    assert small_rag.index.num_passages == 60, "delete must not change the index it starts from"
    fresh = without_gone
    assert rag.index.num_entities < small_rag.index.num_entities
    assert_same_graph(rag.index, fresh.index)
    assert_same_answers(rag, fresh)


def test_duplicate_texts_shared_sentences_and_case_variants(nlp, encoder, one_thread):
    """Two passages with one text stay two passages; a sentence in two passages is one node whose M row
    is the union; entities equal up to case share one vector and so tie exactly, after add as in a build."""
    base = [
        {"id": "a", "title": "Paris", "text": "Paris is the capital of France. Victor Hugo lived in Paris."},
        {"id": "b", "title": "Berlin", "text": "Berlin is the capital of Germany. Angela Merkel lives in Berlin."},
    ]
    more = [
        {"id": "c", "title": "Paris", "text": "Paris is the capital of France. Victor Hugo lived in Paris."},  # = a
        {"id": "d", "title": "", "text": "Victor Hugo lived in Paris. He wrote Les Misérables in Guernsey."},
        {"id": "e", "title": "PARIS", "text": "PARIS is a city in FRANCE."},
    ]
    full = build(base + more, nlp, encoder)
    grown = rag_of(build(base, nlp, encoder).index, nlp, encoder).add(more)
    assert_same_graph(grown.index, full.index)
    ix = grown.index
    assert ix.passage_ids == ["a", "b", "c", "d", "e"] and ix.texts[0] == ix.texts[2]
    assert torch.equal(ix.passage_emb[0], ix.passage_emb[2])  # one text, one vector: an exact tie
    hits = grown.search("Victor Hugo lived in Paris, the capital of France.", top_k=5)
    score = {h.id: h.score for h in hits}
    assert score["a"] == score["c"]
    s = ix.sentences.index("Victor Hugo lived in Paris.")
    assert sum(s in row for row in _rows(ix.PS)) == 3  # passages a, c and d
    for upper in ("PARIS", "FRANCE"):
        if upper in ix.entities and upper.title() in ix.entities:
            assert torch.equal(ix.entity_emb[ix.entities.index(upper)], ix.entity_emb[ix.entities.index(upper.title())])
    # deleting one of the twins or the case variant equals the build without it
    for gone in (["a"], ["e"], ["c", "d"]):
        rag = rag_of(full.index, nlp, encoder).delete(gone)
        assert_same_graph(rag.index, build([p for p in base + more if p["id"] not in gone], nlp, encoder).index)


def test_equal_tokens_are_found_by_hash_and_checked(nlp, encoder, monkeypatch, one_thread):
    """Old texts with the new text's tokens are found by the stored token hashes; every hash colliding
    changes nothing (the tokens are compared); an index without stored hashes gets them computed."""
    import dataclasses

    from linearrag_torch.models import encoding

    base = [Passage("a", "Paris", "Paris is the capital of France."), Passage("b", "", "Marie Curie lived in Paris.")]
    more = [Passage("c", "PARIS", "PARIS is the capital of FRANCE."), Passage("d", "", "Rome is the capital of Italy.")]
    full = build_index(base + more, nlp=nlp, encoder=encoder, progress=False)
    first = build_index(base, nlp=nlp, encoder=encoder, progress=False)
    grown = add_passages(first, more, nlp=nlp, encoder=encoder, progress=False)
    assert_same_graph(grown, full)
    assert torch.equal(grown.passage_emb[0], grown.passage_emb[2])  # "c" reused the vector of "a"
    assert_same_graph(add_passages(dataclasses.replace(first, keys=None), more, nlp=nlp, encoder=encoder,
                                   progress=False), full)
    monkeypatch.setattr(encoding, "token_hash", lambda key: 7)  # every text's hash equals every other's
    grown = add_passages(dataclasses.replace(first, keys=None), more, nlp=nlp, encoder=encoder, progress=False)
    assert torch.equal(grown.passage_emb[0], grown.passage_emb[2])
    assert not torch.equal(grown.passage_emb[0], grown.passage_emb[3])
    for part in ("passage_emb", "sentence_emb", "entity_emb"):
        assert float((getattr(grown, part) - getattr(full, part)).abs().max()) <= EMB_TOL


def _rows(m):
    crow, col = m.crow.tolist(), m.col.tolist()
    return [col[crow[r]:crow[r + 1]] for r in range(m.shape[0])]


# ---------------------------------------------------------------- ids and errors
def test_added_duplicate_ids_are_errors_naming_id_and_line(small_rag, tmp_path, nlp, encoder):
    rag = rag_of(small_rag.index, nlp, encoder)
    existing = small_rag.index.passage_ids[7]
    f = write_jsonl(tmp_path / "more.jsonl", [{"id": "new-1", "text": "x"}, {"id": str(existing), "text": "y"}])
    with pytest.raises(InputError, match=rf"more\.jsonl, line 2: duplicate id '{existing}' \(already in the index\)"):
        rag.add(f)
    f = write_jsonl(tmp_path / "twice.jsonl", [{"id": "n1", "text": "x"}, {"id": "n2", "text": "y"}, {"id": "n1", "text": "z"}])
    with pytest.raises(InputError, match=r"twice\.jsonl, line 3: duplicate id 'n1' \(first used on line 1\)"):
        rag.add(f)
    with pytest.raises(InputError, match=rf"passage 1: duplicate id {existing} \(already in the index\)"):
        rag.add([{"id": "n3", "text": "x"}, {"id": existing, "text": "y"}])
    with pytest.raises(InputError, match=r'passage 0: "text" must be a string'):
        rag.add([{"id": "n4", "text": None}])
    assert rag.index is small_rag.index  # nothing changed


def test_build_refuses_duplicate_ids_in_a_list(nlp, encoder):
    with pytest.raises(InputError, match=r"passage 2: duplicate id 'x' \(first used at passage 0\)"):
        build([{"id": "x", "text": "a"}, {"id": "y", "text": "b"}, {"id": "x", "text": "c"}], nlp, encoder)


def test_missing_ids_continue_the_numbering(nlp, encoder, tmp_path, one_thread):
    texts = ["Rome is in Italy.", "Madrid is in Spain.", "Lisbon is in Portugal."]
    base = build(write_jsonl(tmp_path / "base.jsonl", [{"text": t} for t in texts[:2]]), nlp, encoder)
    base.add(write_jsonl(tmp_path / "more.jsonl", [{"text": texts[2]}]))
    assert base.index.passage_ids == [0, 1, 2]
    assert_same_graph(base.index, build([{"text": t} for t in texts], nlp, encoder).index)


def test_delete_errors_and_id_types(small_rag, nlp, encoder):
    rag = rag_of(small_rag.index, nlp, encoder)
    ids = small_rag.index.passage_ids
    with pytest.raises(ValueError, match=r"no passage with id 'nope', 'also-not' in the index"):
        rag.delete([ids[0], "nope", "also-not"])
    with pytest.raises(ValueError, match="would leave the index empty"):
        rag.delete(ids)
    assert rag.index is small_rag.index
    # 7 and "7" are the same id; a single id may be given alone
    one = rag_of(small_rag.index, nlp, encoder).delete(str(ids[5]))
    two = rag_of(small_rag.index, nlp, encoder).delete([ids[5]])
    assert one.index.passage_ids == two.index.passage_ids == ids[:5] + ids[6:]


def test_an_index_without_ner_record_still_deletes(small_rag, without_gone, nlp, encoder):
    """Indexes written before the NER record existed: delete renumbers from M, C, PS (documented as
    possibly different from a fresh build in node order and M rows); the result is consistent."""
    import dataclasses

    legacy = dataclasses.replace(small_rag.index, ner=None)
    out = delete_passages(legacy, GONE)
    out.validate()
    assert out.ner is None
    fresh = without_gone.index
    assert out.passage_ids == fresh.passage_ids
    assert sorted(out.entities) == sorted(fresh.entities) and sorted(out.sentences) == sorted(fresh.sentences)
    assert add_passages(legacy, [Passage("new", "", "Rome is in Italy.")], progress=False, nlp=nlp,
                        encoder=encoder).ner is None


def test_build_is_an_add_to_an_empty_index(nlp, encoder, one_thread):
    ps = [Passage(i, "", t) for i, t in enumerate(["Rome is in Italy.", "Madrid is in Spain."])]
    with pytest.raises(ValueError, match="zero passages"):
        build_index([], nlp=nlp, encoder=encoder)
    with pytest.raises(ValueError, match="no passages to add"):
        add_passages(build_index(ps, nlp=nlp, encoder=encoder, progress=False), [], nlp=nlp, encoder=encoder)


# ---------------------------------------------------------------- the command line
@pytest.fixture
def shared_models(nlp, encoder, monkeypatch):
    """The CLI reuses the session's models (see test_cli.py)."""
    monkeypatch.setattr(models, "load_nlp", lambda cfg: nlp)
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device: encoder)


def run(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def test_cli_add_and_delete(shared_models, first_half, halves, nlp, encoder, capsys, tmp_path):
    idx = first_half.save(tmp_path / "idx")
    added = halves[1][:12]
    more = write_jsonl(tmp_path / "more.jsonl", added)
    rc, out, err = run(capsys, "add", idx, more, "--quiet", "--device", "cpu")
    assert rc == 0, err
    assert err.startswith("added 12 passages (+") and "now 42 passages" in err and err.count("\n") == 1
    api_result = rag_of(first_half.index, nlp, encoder).add(added).index
    assert_same_graph(TriGraphIndex.load(idx), api_result)
    assert not (idx / ".lock").exists()
    # a second add of the same file: every id is taken, the first one is named with its line
    before = snapshot(idx)
    rc, out, err = run(capsys, "add", idx, more, "--quiet")
    assert rc == 2 and err.startswith("linearrag add: error: ")
    assert f"more.jsonl, line 1: duplicate id {halves[1][0]['id']!r}" in err
    assert snapshot(idx) == before
    # delete: --ids and --ids-file (a corpus file works: its "id" fields)
    gone = [p["id"] for p in halves[0][:2] + added[:8]]
    rc, out, err = run(capsys, "delete", idx, "--ids", ",".join(map(str, gone[:3])))
    assert rc == 0, err
    assert err.startswith("deleted 3 passages (") and "now 39 passages" in err
    rc, out, err = run(capsys, "delete", idx, "--ids-file", write_jsonl(tmp_path / "gone.jsonl", added[1:8]))
    assert rc == 0, err
    assert "now 32 passages" in err
    assert_same_graph(TriGraphIndex.load(idx), delete_passages(api_result, gone))
    # errors leave the index as it was
    before = snapshot(idx)
    for argv, words in [
        (["delete", idx, "--ids", "nope"], "no passage with id 'nope'"),
        (["delete", idx, "--ids", "1,,2"], "empty id"),
        (["delete", idx], "no id given"),
        (["delete", idx, "2", "5"], f"the ids go after --ids: linearrag delete {idx} --ids 2,5 (or --ids-file FILE)"),
        (["delete", idx, "--ids-file", tmp_path / "missing.txt"], "missing.txt: no such file"),
        (["delete", tmp_path / "not-an-index", "--ids", "1"], "no such index folder"),
        (["add", tmp_path / "not-an-index", more], "no such index folder"),
        (["add", idx, tmp_path / "missing.jsonl"], "missing.jsonl: no such file"),
    ]:
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and err.startswith(f"linearrag {argv[0]}: error: ") and words in err, (argv, err)
    assert snapshot(idx) == before
    assert not (tmp_path / "not-an-index").exists()


@pytest.mark.parametrize("command, words", [
    ("add", ["INDEX_DIR", "MORE.jsonl", "--device", "--quiet", "locked"]),
    ("delete", ["INDEX_DIR", "--ids", "--ids-file", "locked"]),
])
def test_cli_help(capsys, command, words):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for w in words:
        assert w in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert command in capsys.readouterr().out


# ---------------------------------------------------------------- crash safety and the lock
def assert_same_search(a, b):
    """Same hits, scores equal up to the last bits (see test_index_io: loaded tensors are aligned differently)."""
    for x, y in zip(a.search(QUESTIONS[:8], top_k=5), b.search(QUESTIONS[:8], top_k=5)):
        assert [h.id for h in x] == [h.id for h in y]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], rel=1e-6, abs=1e-9)


def test_a_killed_add_leaves_the_previous_index_and_a_second_writer_is_refused(
        small_index_dir, small_rag, halves, tmp_path, nlp, encoder, capsys):
    """`linearrag add` pauses just before its commit (test hook); meanwhile a second add is refused
    with the lock message; then the first is killed (SIGKILL): the old index loads, verified, and
    answers as before; a later add (stale .lock file left behind) works."""
    import shutil

    idx = Path(shutil.copytree(small_index_dir, tmp_path / "idx"))
    before = snapshot(idx)
    more = write_jsonl(tmp_path / "more.jsonl", [{"id": "new-1", "title": "Rome", "text": "Rome is the capital of Italy."}])
    env = {**os.environ, PAUSE_ENV: "120", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "linearrag_torch.cli", "add", str(idx), str(more), "--quiet",
                             "--device", "cpu"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if PAUSE_ENV in line:
                break
        assert any(PAUSE_ENV in x for x in lines), "".join(lines)
        # the new data files are written, index.json is not replaced yet
        assert len(list(idx.iterdir())) > len(before)
        # a second writer, in this process: refused at once, naming the holder
        rc, out, err = run(capsys, "add", idx, more, "--quiet")
        assert rc == 2
        assert err == f"linearrag add: error: {idx} is locked by another writer (pid {proc.pid})\n"
        with pytest.raises(IndexLockedError):
            small_rag.index.save(idx)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert (idx / "index.json").read_bytes() == before["index.json"]
    loaded = LinearRAG.load(idx, device="cpu")  # verifies sizes and checksums
    loaded.models.nlp, loaded.models.encoder = nlp, encoder
    assert loaded.index.num_passages == small_rag.index.num_passages
    assert_same_search(loaded, small_rag)
    # the next writer gets the lock (the dead one's .lock file holds no lock) and cleans up
    rag = LinearRAG.load(idx, device="cpu")
    rag.models.nlp, rag.models.encoder = nlp, encoder
    rag.add(more).save(idx)
    assert sorted(p.name for p in idx.iterdir()) == sorted(["index.json", *_data_files(idx)])
    assert TriGraphIndex.load(idx).passage_ids[-1] == "new-1"


def _data_files(idx):
    return list(json.loads((idx / "index.json").read_text())["files"].values())


def test_lock_is_reentrant_and_released(tmp_path):
    with index_lock(tmp_path):
        assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
        with index_lock(tmp_path):
            pass
        assert (tmp_path / ".lock").exists()
        code = ("import sys; from linearrag_torch.index import index_lock, IndexLockedError\n"
                "try:\n    index_lock(sys.argv[1]).__enter__()\nexcept IndexLockedError as e:\n    print(e); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 3 and f"locked by another writer (pid {os.getpid()})" in proc.stdout
    assert not (tmp_path / ".lock").exists()
    with index_lock(tmp_path):  # free again
        pass


def test_a_reader_racing_a_writer_reloads(tmp_path, monkeypatch):
    """A load that finds the files of the index.json it read already replaced starts again."""
    from test_index_io import sample_index

    path = sample_index(seed=1).save(tmp_path / "idx")
    second = sample_index(seed=2, passages=12, entities=9)
    real = TriGraphIndex._load_once
    calls = []

    def racing(p, device, verify):
        calls.append(1)
        if len(calls) == 1:  # a writer commits between our reading index.json and opening its files
            second.save(path)
            raise IndexFormatError("tensors-x.safetensors: data file named by index.json is missing")
        return real(p, device, verify)

    monkeypatch.setattr(TriGraphIndex, "_load_once", staticmethod(racing))
    assert TriGraphIndex.load(path).num_passages == 12 and len(calls) == 2
    # a real error (index.json unchanged) is not retried
    calls.clear()
    monkeypatch.setattr(TriGraphIndex, "_load_once", staticmethod(
        lambda p, d, v: calls.append(1) or (_ for _ in ()).throw(IndexFormatError("broken"))))
    with pytest.raises(IndexFormatError, match="broken"):
        TriGraphIndex.load(path)
    assert len(calls) == 1


def test_a_full_disk_during_add_delete_or_index_is_a_clear_error_and_changes_nothing(
        shared_models, first_half, halves, small_corpus, capsys, tmp_path, monkeypatch):
    """ENOSPC while the new data files are written (simulated: safetensors' writer writes part of its file, then
    the disk is full): `add`, `delete` and `index` end with one error line naming the folder and the cause; the
    index in the folder is byte for byte what it was and loads verified; no new file is left behind; the lock
    is released (the next writer gets it)."""
    import errno

    from linearrag_torch.index import lock, storage

    def full_disk(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"\0" * 4096)  # a part written, then
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    idx = first_half.save(tmp_path / "idx")
    before = snapshot(idx)
    more = write_jsonl(tmp_path / "more.jsonl", halves[1][:4])
    monkeypatch.setattr(storage, "save_file", full_disk)
    for argv in (["add", idx, more, "--quiet", "--device", "cpu"],
                 ["delete", idx, "--ids", str(halves[0][0]["id"])]):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and err.count("\n") == 1, err
        assert err.startswith(f"linearrag {argv[0]}: error: ") and "No space left on device" in err
        assert str(idx) in err and "unchanged" in err
        assert snapshot(idx) == before  # no new file, nothing replaced (the .lock file is gone too)
        with lock.index_lock(idx):  # released
            pass
        TriGraphIndex.load(idx, verify=True)
    rc, out, err = run(capsys, "index", small_corpus, tmp_path / "new", "--quiet", "--device", "cpu")
    assert rc == 2 and "No space left on device" in err and err.count("\n") == 1, err
    assert not (tmp_path / "new" / "index.json").exists()
    assert not [p for p in (tmp_path / "new").glob("*") if p.name != ".lock"]  # no partial data files
    with lock.index_lock(tmp_path / "new"):
        pass
