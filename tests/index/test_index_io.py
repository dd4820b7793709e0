"""Index folders: save/load round trip, atomic replacement, and load errors that name the problem.

Synthetic indexes only (linearrag_torch.synthetic): no spaCy, no encoder.
"""
import dataclasses
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from linearrag_torch.config import IndexConfig, RetrievalConfig
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.index import FORMAT, FORMAT_VERSION, MATRICES, IndexFormatError, TriGraphIndex
from linearrag_torch.index.csr import Csr
from linearrag_torch.synthetic import random_index, random_queries

STRING_FIELDS = ("passage_ids", "titles", "texts", "sentences", "entities")
TENSOR_FIELDS = ("passage_emb", "sentence_emb", "entity_emb")


def sample_index(seed=0, passages=30, entities=40, dim=16):
    """A random index with mixed id types and non-ASCII strings (the JSON side of the format)."""
    ix = random_index(passages, entities, dim=dim, seed=seed)
    P, S, E = ix.num_passages, ix.num_sentences, ix.num_entities
    return dataclasses.replace(
        ix,
        passage_ids=[i if i % 3 else f"doc-{i}-é" for i in range(P)],
        titles=[f"Titel {i} – München" if i % 2 else "" for i in range(P)],
        texts=[f"text {i}\nline two 😀 \"quoted\"" for i in range(P)],
        sentences=[f"sentence {s} ß" for s in range(S)],
        entities=[f"Entity {e} İ" for e in range(E)],
        index_config=IndexConfig(max_length=128, batch_size=8, dropped_labels=("ORDINAL",)),
        retrieval_config=RetrievalConfig(mode="paper", delta=0.3, top_k=7, adjacent_passages=True),
    )


def assert_same_index(a: TriGraphIndex, b: TriGraphIndex):
    for name in STRING_FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        assert va == vb, name
        assert [type(x) for x in va] == [type(x) for x in vb], name
    for name in TENSOR_FIELDS:
        ta, tb = getattr(a, name), getattr(b, name)
        assert ta.dtype == tb.dtype and torch.equal(ta, tb), name
    for name in MATRICES:
        ma, mb = getattr(a, name), getattr(b, name)
        assert tuple(ma.shape) == tuple(mb.shape), name
        for part in ("crow", "col", "val"):
            pa, pb = getattr(ma, part), getattr(mb, part)
            assert pa.dtype == pb.dtype and torch.equal(pa, pb), f"{name}.{part}"
    assert a.index_config == b.index_config
    assert a.retrieval_config == b.retrieval_config


@pytest.fixture
def saved(tmp_path):
    ix = sample_index()
    path = ix.save(tmp_path / "idx")
    return ix, path


def meta_of(path):
    return json.loads((path / "index.json").read_text(encoding="utf-8"))


def write_meta(path, meta):
    (path / "index.json").write_text(json.dumps(meta), encoding="utf-8")


def load_error(path, **kw):
    with pytest.raises(IndexFormatError) as info:
        TriGraphIndex.load(path, **kw)
    return str(info.value)


# ---------------------------------------------------------------- round trip
def test_round_trip_keeps_every_tensor_string_and_setting(saved):
    ix, path = saved
    loaded = TriGraphIndex.load(path)
    assert_same_index(ix, loaded)
    assert loaded.passage_emb.device.type == "cpu"


def test_folder_layout_and_manifest(saved):
    _, path = saved
    meta = meta_of(path)
    assert meta["format"] == FORMAT and meta["format_version"] == FORMAT_VERSION
    files = sorted(p.name for p in path.iterdir())
    assert files == sorted(["index.json", meta["files"]["tensors"], meta["files"]["strings"]])
    for name, rec in meta["manifest"].items():
        data = (path / name).read_bytes()
        assert rec == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # no pickle: the tensors file is plain safetensors, the strings file plain JSON
    assert set(load_file(str(path / meta["files"]["tensors"]))) == set(TENSOR_FIELDS) | {
        f"{m}.{p}" for m in MATRICES for p in ("crow", "col", "val")}
    strings = json.loads((path / meta["files"]["strings"]).read_text(encoding="utf-8"))
    assert strings["passage_ids"][0] == "doc-0-é"


def test_loaded_index_retrieves_exactly_like_the_original(saved):
    ix, path = saved
    loaded = TriGraphIndex.load(path)
    queries = random_queries(ix, 10, seed=3)
    for mode in ("paper", "reference"):
        cfg = RetrievalConfig(mode=mode, delta=0.25, top_k=8)
        a = retrieve(DeviceGraph(ix), queries, cfg)
        b = retrieve(DeviceGraph(loaded), queries, cfg)
        assert torch.equal(a.indices, b.indices)
        # the data are bit-identical, but safetensors hands back tensors that are only 8-byte aligned,
        # and the CPU matmul kernels may then round differently in the last bit
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-6, atol=1e-9)


def test_second_save_replaces_the_first_and_leaves_no_stale_files(tmp_path):
    path = tmp_path / "idx"
    sample_index(seed=1).save(path)
    first = meta_of(path)["files"]
    # leftovers of a crashed write, and a file that is not ours
    (path / "index.json.0123456789ab.tmp").write_text("{}")
    (path / "tensors-deadbeef0000.safetensors").write_bytes(b"junk")
    (path / "strings-deadbeef0000.json").write_text("[]")
    (path / "notes.txt").write_text("keep me")
    second_ix = sample_index(seed=2, passages=12, entities=9)
    second_ix.save(path)
    meta = meta_of(path)
    assert set(meta["files"].values()).isdisjoint(first.values())
    assert sorted(p.name for p in path.iterdir()) == sorted(["index.json", "notes.txt", *meta["files"].values()])
    assert (path / "notes.txt").read_text() == "keep me"
    assert_same_index(second_ix, TriGraphIndex.load(path))


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_every_index_file_has_the_mode_the_umask_gives(tmp_path, umask):
    """An index built by one user can be served by another: no file of the folder is private unless the
    umask says so (safetensors' own temporary file is 0600 whatever the umask)."""
    import os
    import stat

    old = os.umask(umask)
    try:
        path = sample_index(passages=5, entities=6).save(tmp_path / "idx")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()}
    assert len(modes) == 3 and modes == dict.fromkeys(modes, 0o666 & ~umask), {k: oct(v) for k, v in modes.items()}


def test_save_creates_missing_parent_folders(tmp_path):
    ix = sample_index(passages=5, entities=6)
    path = ix.save(tmp_path / "a" / "b" / "idx")
    assert_same_index(ix, TriGraphIndex.load(path))


def test_save_refuses_an_invalid_index(tmp_path):
    ix = sample_index()
    bad = dataclasses.replace(ix, titles=ix.titles[:-1])
    with pytest.raises(IndexFormatError, match="titles"):
        bad.save(tmp_path / "idx")
    assert not (tmp_path / "idx" / "index.json").exists()


# ---------------------------------------------------------------- load errors
def test_unknown_folder(tmp_path):
    msg = load_error(tmp_path / "missing")
    assert str(tmp_path / "missing") in msg and "no such index folder" in msg


def test_folder_without_index_json(tmp_path):
    (tmp_path / "strings-x.json").write_text("{}")
    msg = load_error(tmp_path)
    assert str(tmp_path) in msg and "no index.json" in msg


def test_unreadable_index_json(saved):
    _, path = saved
    (path / "index.json").write_text("{not json", encoding="utf-8")
    msg = load_error(path)
    assert "index.json" in msg and "unreadable" in msg


@pytest.mark.parametrize("meta", [{"format": "something-else", "format_version": 1}, {"hello": "world"}, [1, 2]])
def test_foreign_json(saved, meta):
    _, path = saved
    write_meta(path, meta)
    msg = load_error(path)
    assert "index.json" in msg and f"not a {FORMAT} file" in msg


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_wrong_format_version(saved, version):
    _, path = saved
    meta = meta_of(path)
    meta["format_version"] = version
    write_meta(path, meta)
    msg = load_error(path)
    assert f"format version {version} is not supported" in msg


def test_missing_field_in_index_json(saved):
    _, path = saved
    meta = meta_of(path)
    del meta["manifest"]
    write_meta(path, meta)
    msg = load_error(path)
    assert "missing or invalid field" in msg and "manifest" in msg


def test_invalid_stored_retrieval_config(saved):
    _, path = saved
    meta = meta_of(path)
    meta["retrieval_config"]["mode"] = "sideways"
    write_meta(path, meta)
    assert "missing or invalid field" in load_error(path)


@pytest.mark.parametrize("field", ["files", "manifest", "counts"])
def test_index_json_field_of_the_wrong_type(saved, field):
    _, path = saved
    meta = meta_of(path)
    meta[field] = None
    write_meta(path, meta)
    msg = load_error(path)
    assert "missing or invalid field" in msg and field in msg


def _data_file(path, role):
    return path / meta_of(path)["files"][role]


def test_truncated_tensors_file(saved):
    _, path = saved
    f = _data_file(path, "tensors")
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[: size // 2])
    msg = load_error(path)
    assert str(f) in msg and "truncated" in msg and str(size) in msg and str(size // 2) in msg


def test_truncated_tensors_file_without_verification(saved):
    _, path = saved
    f = _data_file(path, "tensors")
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    msg = load_error(path, verify=False)
    assert str(f) in msg and "unreadable safetensors" in msg


@pytest.mark.parametrize("role", ["tensors", "strings"])
def test_flipped_byte(saved, role):
    _, path = saved
    f = _data_file(path, role)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    msg = load_error(path)
    assert str(f) in msg and "checksum" in msg


@pytest.mark.parametrize("role", ["tensors", "strings"])
def test_missing_data_file(saved, role):
    _, path = saved
    f = _data_file(path, role)
    f.unlink()
    msg = load_error(path)
    assert str(f) in msg and "missing" in msg


@pytest.mark.parametrize("name, delta", [("passages", 1), ("sentences", -1), ("entities", 2)])
def test_counts_mismatched_with_data(saved, name, delta):
    ix, path = saved
    meta = meta_of(path)
    real = meta["counts"][name]
    meta["counts"][name] = real + delta
    write_meta(path, meta)
    msg = load_error(path)
    assert f"records {real + delta} {name}" in msg and f"holds {real}" in msg


def test_wrong_dim_recorded(saved):
    ix, path = saved
    meta = meta_of(path)
    meta["counts"]["dim"] = 384
    write_meta(path, meta)
    msg = load_error(path)
    assert "dimension 384" in msg and f"have {ix.dim}" in msg


def _rewrite_tensors(path, change):
    """Replace the tensors file by change(tensors) and fix the manifest, so only the content is wrong."""
    meta = meta_of(path)
    name = meta["files"]["tensors"]
    t = load_file(str(path / name))
    change(t)
    save_file(t, str(path / name))
    data = (path / name).read_bytes()
    meta["manifest"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_meta(path, meta)


def test_missing_tensor_with_a_consistent_manifest(saved):
    _, path = saved
    _rewrite_tensors(path, lambda t: t.pop("N.val"))
    msg = load_error(path)
    assert "missing tensors" in msg and "N.val" in msg


def test_malformed_matrix_with_a_consistent_manifest(saved):
    ix, path = saved

    def corrupt(t):
        col = t["M.col"].clone()
        col[0] = ix.num_entities  # one past the last entity
        t["M.col"] = col

    _rewrite_tensors(path, corrupt)
    msg = load_error(path)
    assert "matrix M" in msg and "column index out of range" in msg


def test_embedding_rows_mismatch_with_a_consistent_manifest(saved):
    ix, path = saved
    _rewrite_tensors(path, lambda t: t.update(entity_emb=t["entity_emb"][:-1].contiguous()))
    msg = load_error(path)
    assert "entity_emb" in msg and f"expected {ix.num_entities}" in msg


def test_float64_embeddings_are_rejected(saved):
    _, path = saved
    _rewrite_tensors(path, lambda t: t.update(passage_emb=t["passage_emb"].double()))
    assert "float32" in load_error(path)


def test_an_interrupted_second_save_leaves_the_first_index_loadable(tmp_path):
    # a crash between writing the new data files and replacing index.json: the old index.json
    # still names the old files, which are intact
    path = tmp_path / "idx"
    first = sample_index(seed=4)
    first.save(path)
    before = (path / "index.json").read_bytes()
    (path / "tensors-feedfeedfeed.safetensors").write_bytes(b"partial")
    (path / "index.json.feedfeedfeed.tmp").write_text("{")
    assert (path / "index.json").read_bytes() == before
    assert_same_index(first, TriGraphIndex.load(path))


# ---------------------------------------------------------------- Csr.check
def good_csr():
    # [[0, 2, 0], [0, 0, 0], [1, 0, 3]]
    return Csr(torch.tensor([0, 1, 1, 3]), torch.tensor([1, 0, 2]), torch.tensor([2.0, 1.0, 3.0]), (3, 3))


def test_csr_check_accepts_a_well_formed_matrix():
    m = good_csr()
    m.check("ok")
    assert m.scipy().toarray().tolist() == [[0, 2, 0], [0, 0, 0], [1, 0, 3]]
    Csr(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0), (0, 5)).check("empty")


@pytest.mark.parametrize("change, words", [
    (dict(crow=torch.tensor([0, 1, 1, 3], dtype=torch.int32)), "int64"),
    (dict(col=torch.tensor([1, 0, 2], dtype=torch.int32)), "int64"),
    (dict(crow=torch.tensor([0, 1, 3])), "row pointer has 3 entries, expected 4"),
    (dict(crow=torch.tensor([1, 1, 1, 3])), "does not match"),
    (dict(crow=torch.tensor([0, 1, 1, 2])), "does not match"),
    (dict(val=torch.tensor([2.0, 1.0])), "does not match"),
    (dict(crow=torch.tensor([0, 3, 1, 3])), "not monotone"),
    (dict(col=torch.tensor([1, 0, 3])), "out of range"),
    (dict(col=torch.tensor([1, -1, 2])), "out of range"),
])
def test_csr_check_rejects_malformed_matrices(change, words):
    m = dataclasses.replace(good_csr(), **change)
    with pytest.raises(ValueError, match="^mymat: ") as info:
        m.check("mymat")
    assert words in str(info.value)


def test_validate_rejects_a_matrix_of_the_wrong_shape():
    ix = sample_index()
    bad = dataclasses.replace(ix, C=Csr(ix.C.crow, ix.C.col, ix.C.val, (ix.num_passages, ix.num_entities + 1)))
    with pytest.raises(IndexFormatError, match="matrix C has shape"):
        bad.validate()
