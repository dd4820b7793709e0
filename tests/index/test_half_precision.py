"""Half-precision embedding storage (IndexConfig.embedding_dtype "float16" / "bfloat16").

Independent references: the float32 index of the small demo slice (conftest.small_rag) cast by torch,
the scipy reference backend (float64 arithmetic on the stored, rounded vectors) and float64 dot products.
"""
import json

import pytest
import torch

from linearrag_torch import LinearRAG
from linearrag_torch.retrieval import scipy_backend
from linearrag_torch.indexing.build import build_index, delete_passages, empty_index
from linearrag_torch.cli import main
from linearrag_torch.config import IndexConfig
from linearrag_torch.retrieval.engine import DeviceGraph, cosines, native_half, query_embeddings
from linearrag_torch.index import TriGraphIndex, embedding_dtype
from linearrag_torch.kernels.segment_topk import gather_sigma

from conftest import demo_questions, index_without_setting, small_passages
from test_updates import assert_same_graph

HALF = ("float16", "bfloat16")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
EMBEDDINGS = ("passage_emb", "sentence_emb", "entity_emb")
# spacing of the type's values in [0.5, 1): an embedding component (|x| <= 1) rounds by at most half of it
SPACING = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
QUESTIONS = [q["question"] for q in demo_questions()]


@pytest.fixture(scope="module")
def f32(small_rag):
    return small_rag.index


@pytest.mark.parametrize("dt", HALF)
def test_round_trip_keeps_the_dtype_and_the_matrices_exact(f32, dt, tmp_path):
    half = f32.with_embedding_dtype(dt)
    assert half.index_config.embedding_dtype == dt and f32.index_config.embedding_dtype == "float32"
    half.save(tmp_path / "ix")
    loaded = TriGraphIndex.load(tmp_path / "ix")  # sha256 of every file checked
    assert loaded.index_config.embedding_dtype == dt
    assert_same_graph(loaded, f32, embeddings=False)
    for name in EMBEDDINGS:
        got, want = getattr(loaded, name), getattr(f32, name)
        assert got.dtype == DTYPES[dt]
        assert torch.equal(got, want.to(DTYPES[dt]))  # torch's round-to-nearest cast, stored as is
        assert float((got.float() - want).abs().max()) <= SPACING[dt] / 2
    # the safetensors file holds 2-byte embeddings: its size drops by 2 bytes per stored value
    f32.save(tmp_path / "f32")
    size = {p: sum(f.stat().st_size for f in (tmp_path / p).glob("tensors-*")) for p in ("ix", "f32")}
    values = sum(getattr(f32, n).numel() for n in EMBEDDINGS)
    assert abs(size["f32"] - size["ix"] - 2 * values) < 256  # (the header differs by a few bytes)


def test_an_index_written_before_the_setting_loads_as_float32(small_index_dir, tmp_path):
    ix = TriGraphIndex.load(index_without_setting(small_index_dir, tmp_path / "old", "embedding_dtype"))
    assert ix.index_config.embedding_dtype == "float32" and ix.passage_emb.dtype == torch.float32


def test_a_stored_dtype_that_differs_from_the_setting_is_refused(f32, tmp_path):
    f32.with_embedding_dtype("float16").save(tmp_path / "ix")
    meta = json.loads((tmp_path / "ix" / "index.json").read_text())
    meta["index_config"]["embedding_dtype"] = "bfloat16"
    (tmp_path / "ix" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(Exception) as info:
        TriGraphIndex.load(tmp_path / "ix")
    assert "passage_emb" in str(info.value) and "bfloat16" in str(info.value) and "float16" in str(info.value)


def test_an_unknown_dtype_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match="embedding_dtype must be one of"):
        empty_index(IndexConfig(embedding_dtype="int8"))
    with pytest.raises(ValueError, match="float16"):
        embedding_dtype(IndexConfig(embedding_dtype="half"))


def test_conversion_equals_a_fresh_half_build(f32, nlp, encoder):
    """build(embedding_dtype=bfloat16) computes float32 vectors and rounds them: the cast of the float32 build."""
    built = build_index(_passages(), IndexConfig(embedding_dtype="bfloat16", encoder_precision="float32"), f32.retrieval_config, device="cpu",
                        progress=False, nlp=nlp, encoder=encoder)
    converted = f32.with_embedding_dtype("bfloat16")
    assert_same_graph(built, converted, embeddings=False)
    for name in EMBEDDINGS:
        a, b = getattr(built, name), getattr(converted, name)
        assert a.dtype == b.dtype == torch.bfloat16
        # the same float32 vectors up to batching noise (~1e-7): a value next to a rounding boundary may
        # round to the neighbouring bf16 value; nothing more
        assert float((a.float() - b.float()).abs().max()) <= SPACING["bfloat16"], name
        assert float((a != b).float().mean()) < 1e-3, name


def _passages():
    from linearrag_torch import Passage

    return [Passage(p["id"], p["title"], p["text"]) for p in small_passages()]


def test_add_and_delete_keep_the_dtype(f32, small_rag, nlp, encoder, tmp_path):
    half = f32.with_embedding_dtype("float16")
    ps = small_passages()
    gone = [p["id"] for p in ps[40:]]
    smaller = delete_passages(half, gone)
    for name in EMBEDDINGS:
        assert getattr(smaller, name).dtype == torch.float16
    # deleting keeps rows: exactly the half rows of a float32 delete
    f32_smaller = delete_passages(f32, gone)
    for name in EMBEDDINGS:
        assert torch.equal(getattr(smaller, name), getattr(f32_smaller, name).half())
    rag = LinearRAG(smaller, "cpu", nlp, encoder)
    rag.add(ps[40:])
    assert rag.index.index_config.embedding_dtype == "float16"
    for name in EMBEDDINGS:
        assert getattr(rag.index, name).dtype == torch.float16, name
    rag.save(tmp_path / "ix")
    back = TriGraphIndex.load(tmp_path / "ix")
    assert back.passage_emb.dtype == torch.float16
    assert_same_graph(back, half, embeddings=False)
    for name in EMBEDDINGS:  # re-encoded in other batches: within one float16 step of the converted index
        assert float((getattr(back, name).float() - getattr(half, name).float()).abs().max()) <= SPACING["float16"]


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("upcast", [False, True])
def test_half_queries_match_float32_top5(small_rag, f32, nlp, encoder, dt, upcast):
    """Every demo question (both activation modes): the half index's top 5 as float32's (identical lists
    for at least 90% of the questions; the scores within 0.01), and as the scipy reference on the same
    half index computes them in float64 (upcast: identical lists, scores within 1e-5)."""
    half = f32.with_embedding_dtype(dt)
    rag = LinearRAG(half, "cpu", nlp, encoder)
    rag._graph = DeviceGraph(half, "cpu", upcast=upcast)
    assert rag.graph.passage_emb.dtype == (torch.float32 if upcast else DTYPES[dt])
    enc32 = small_rag.encode_queries(QUESTIONS)
    enc = rag.encode_queries(QUESTIONS)
    for mode in ("reference", "paper"):
        cfg = f32.retrieval_config.replace(mode=mode, top_k=5)
        want, got = small_rag.retrieve(enc32, cfg), rag.retrieve(enc, cfg)
        same = (want.indices == got.indices).all(dim=1)
        assert float(same.float().mean()) >= 0.9, (mode, same)
        assert float((want.scores[same] - got.scores[same]).abs().max()) <= 0.01
        if upcast:
            ref = scipy_backend.retrieve(half, enc, cfg)
            assert torch.equal(ref.indices, got.indices), mode
            assert torch.allclose(ref.scores.float(), got.scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dt", HALF)
def test_cosines_in_the_stored_dtype(dt):
    """cosines(half emb, float32 q): float32 [N, B] within the rounding of the question vector and of the
    result to the stored type (the CPU path) of the float64 product of the stored vectors."""
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(500, 384, generator=g), dim=1).to(DTYPES[dt])
    q = torch.nn.functional.normalize(torch.randn(7, 384, generator=g), dim=1)
    got = cosines(emb, q)
    assert got.dtype == torch.float32 and got.shape == (500, 7)
    exact = emb.double() @ q.double().T
    # |error| <= query rounding (half a step per component, summed against |emb|) + result rounding
    bound = (SPACING[dt] / 2) * (emb.double().abs() @ q.double().abs().T) * 2 + SPACING[dt] / 2 * exact.abs() * 2
    assert bool(((got.double() - exact).abs() <= bound + 1e-6).all())
    assert torch.equal(cosines(emb.float(), q), emb.float() @ q.T)  # float32: the plain product
    # the device path (CUDA: torch.mm with a float32 result) on meta tensors: shapes and dtype
    meta = cosines(emb.to("meta"), q.to("meta"))
    assert meta.dtype == torch.float32 and meta.shape == (500, 7)


@pytest.mark.parametrize("dt", HALF)
def test_sigma_of_half_sentences_is_float32_and_exact(dt):
    g = torch.Generator().manual_seed(1)
    sent = torch.nn.functional.normalize(torch.randn(50, 32, generator=g), dim=1).to(DTYPES[dt])
    q = torch.nn.functional.normalize(torch.randn(3, 32, generator=g), dim=1)
    s, b = torch.randint(0, 50, (40,), generator=g), torch.randint(0, 3, (40,), generator=g)
    got = gather_sigma((sent, q), s, b)
    assert got.dtype == torch.float32
    want = (sent.double()[s] * q.double()[b]).sum(1)
    assert torch.allclose(got.double(), want, atol=1e-6, rtol=0)


def test_query_embeddings_choice():
    emb = torch.zeros(3, 4, dtype=torch.bfloat16)
    assert query_embeddings(emb, "cpu", upcast=True).dtype == torch.float32
    assert query_embeddings(emb, "cpu", upcast=False).dtype == torch.bfloat16
    assert query_embeddings(emb, "cpu").dtype == (torch.bfloat16 if native_half(torch.bfloat16, "cpu") else torch.float32)
    assert query_embeddings(emb.float(), "cpu", upcast=False).dtype == torch.float32
    assert native_half(torch.float16, "meta") is False


def test_cli_convert(small_index_dir, tmp_path, capsys):
    out = tmp_path / "half"
    assert main(["convert", str(small_index_dir), str(out), "--embedding-dtype", "float16"]) == 0
    err = capsys.readouterr().err
    assert "from float32" in err and "to float16" in err and "bytes per passage" in err
    src, half = TriGraphIndex.load(small_index_dir), TriGraphIndex.load(out)
    assert half.index_config.embedding_dtype == "float16"
    assert_same_graph(half, src, embeddings=False)
    assert torch.equal(half.entity_emb, src.entity_emb.half())
    # in place: replaced atomically, one tensors file left
    assert main(["convert", str(out), str(out), "--embedding-dtype", "bfloat16"]) == 0
    assert "in place" in capsys.readouterr().err
    again = TriGraphIndex.load(out)
    assert again.passage_emb.dtype == torch.bfloat16 and len(list(out.glob("tensors-*"))) == 1
    assert torch.equal(again.passage_emb, src.passage_emb.half().bfloat16())
    # errors: no index there (status 2, naming the folder); a dtype that does not exist (argparse)
    assert main(["convert", str(tmp_path / "nothing"), str(tmp_path / "x"), "--embedding-dtype", "float16"]) == 2
    assert "nothing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", str(out), str(out), "--embedding-dtype", "int8"])


def test_cli_help_names_the_setting(capsys):
    for command in ("index", "convert"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "--embedding-dtype" in out and "bfloat16" in out
