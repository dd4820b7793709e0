"""The question encoder on ONNX Runtime (encoder_backend="onnx", linearrag_torch/models/onnx_encoder.py).

Independent reference: the torch float32 encoder (conftest.encoder) on the same texts and token ids, and the
search results of the default LinearRAG. The export goes to a temporary LINEARRAG_CACHE (once per module).
"""
import json

import pytest
import torch

pytest.importorskip("onnxruntime")

from linearrag_torch import LinearRAG
from linearrag_torch.models import onnx_encoder  # noqa: E402
from linearrag_torch.cli import main  # noqa: E402
from linearrag_torch.models.encoding import Encoder  # noqa: E402

from conftest import demo_questions  # noqa: E402

QUESTIONS = [q["question"] for q in demo_questions()]
TEXTS = QUESTIONS[:6] + ["Paris", "Bob Dylan", "a", "the 1998 FIFA World Cup in France"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("lr_cache")
    mp.setenv("LINEARRAG_CACHE", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def onnx_enc(cache):
    return Encoder(backend="onnx", precision="float32")


def test_vectors_equal_torch_float32(onnx_enc, encoder):
    # whole texts, batched and padded
    a, b = onnx_enc.encode(TEXTS), encoder.encode(TEXTS)
    assert a.dtype == torch.float32 and a.shape == b.shape
    assert float((a - b).abs().max()) < 1e-5
    # the query path: token ids in length buckets, one at a time and all together
    ids = encoder.token_keys(TEXTS)
    together = onnx_enc.encode_token_ids(ids)
    assert float((together - encoder.encode_token_ids(ids)).abs().max()) < 1e-5
    one_by_one = torch.cat([onnx_enc.encode_token_ids([k]) for k in ids])
    assert float((together - one_by_one).abs().max()) < 1e-5  # the batch does not change a vector beyond noise


def test_export_is_cached_and_checked(onnx_enc, cache):
    files = sorted((cache / "onnx").glob("*.onnx"))
    assert len(files) == 1 and not list((cache / "onnx").glob("*.tmp"))
    mtime = files[0].stat().st_mtime_ns
    Encoder(backend="onnx", precision="float32")  # a second encoder loads the same file
    assert files[0].stat().st_mtime_ns == mtime


def test_a_damaged_cache_file_is_named(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("LINEARRAG_CACHE", str(tmp_path))
    folder = tmp_path / "onnx"
    folder.mkdir()
    bad = folder / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(RuntimeError, match="bad.onnx"):
        onnx_encoder.session(bad)


def test_refuses_what_it_cannot_run(cache, small_rag):
    with pytest.raises(ValueError, match="float32 on the CPU"):
        Encoder(backend="onnx", precision="bfloat16")
    with pytest.raises(ValueError, match="encoder backend must be one of"):
        Encoder(backend="tensorrt")
    with pytest.raises(ValueError, match="CPU"):
        LinearRAG(small_rag.index, "cpu", quantize="int8", encoder_backend="onnx")
    with pytest.raises(ValueError, match="encoder_backend must be one of"):
        LinearRAG(small_rag.index, "cpu", encoder_backend="jax")


def test_missing_runtime_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ort(name, *a, **kw):
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    with pytest.raises(ImportError, match=r"\[onnx\]"):
        onnx_encoder.session("whatever.onnx")


def test_search_equals_the_torch_encoder(cache, small_rag, nlp):
    rag = LinearRAG(small_rag.index, "cpu", nlp=nlp, encoder_backend="onnx")
    assert rag.encoder.backend == "onnx"
    got, want = rag.search(QUESTIONS, top_k=5), small_rag.search(QUESTIONS, top_k=5)
    for g, w in zip(got, want):
        assert [h.id for h in g] == [h.id for h in w]
        assert [h.score for h in g] == pytest.approx([h.score for h in w], rel=1e-4, abs=1e-6)


def test_add_encodes_passages_with_torch(cache, small_rag, nlp):
    """add() must store what a build stores: the torch encoder in the index precision, not the onnx one."""
    rag = LinearRAG(small_rag.index, "cpu", nlp=nlp, encoder_backend="onnx")
    enc = rag.models.passage_encoder()
    assert getattr(enc, "backend", "torch") == "torch"


def test_cli_query_with_the_onnx_backend(cache, small_index_dir, capsys):
    def query(*extra):
        capsys.readouterr()
        rc = main(["query", str(small_index_dir), *QUESTIONS[:3], "--json", "--device", "cpu", *extra])
        out, err = capsys.readouterr()
        assert rc == 0, err
        return [json.loads(line) for line in out.splitlines()]

    got, want = query("--encoder-backend", "onnx"), query()
    for g, w in zip(got, want):
        assert [h["id"] for h in g["hits"]] == [h["id"] for h in w["hits"]]


def test_server_with_the_onnx_backend_answers_as_the_library(cache, small_rag, small_index_dir):
    """`linearrag serve --encoder-backend onnx`: the service loads the index with the onnx question encoder
    (a real uvicorn on 127.0.0.1) and answers what LinearRAG.search answers."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from test_serve import TIMEOUT, running, wait_ready

    from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app

    service = LinearRAGService(small_index_dir, ServeSettings(encoder_backend="onnx"))
    with running(create_app(service)) as url:
        wait_ready(url)
        r = httpx.post(url + "/v1/search", json={"questions": QUESTIONS[:4], "top_k": 5}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert service.rag.encoder.backend == "onnx"
    want = small_rag.search(QUESTIONS[:4], top_k=5)
    for got, w in zip(r.json()["results"], want):
        assert [h["id"] for h in got["hits"]] == [h.id for h in w]
