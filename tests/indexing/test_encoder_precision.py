"""IndexConfig.encoder_precision: "auto" resolved from the device's bf16 support, stored resolved with the
index; questions encoded in float32 unless asked otherwise, `add` in the index's precision; old indexes load
as float32; bf16 vectors close to float32; a
float32 build gives the plain float32 encoder's vectors."""
import hashlib
import json
import warnings

import pytest
import torch

from benchmarks import quality
from conftest import index_without_setting, small_passages
from linearrag_torch import LinearRAG, env
from linearrag_torch.indexing.build import build_index
from linearrag_torch.config import IndexConfig
from linearrag_torch.corpus import as_passages
from linearrag_torch.models.encoding import Encoder, native_bf16, resolve_precision
from linearrag_torch.index import TriGraphIndex, passage_text


def _cpu_caps(monkeypatch, amx: bool, avx512_bf16: bool):
    """The CPU capability probe torch answers (torch.cpu.get_capabilities) replaced by a fixed answer."""
    monkeypatch.setattr(torch.cpu, "get_capabilities",
                        lambda: {"amx_bf16": amx, "amx_tile": amx, "avx512_bf16": avx512_bf16, "avx2": True})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")  # torch's kernels use it


@pytest.mark.parametrize("amx,avx512_bf16,want", [(False, False, "float32"), (True, True, "bfloat16"),
                                                  (True, False, "bfloat16"), (False, True, "bfloat16")])
def test_auto_is_bfloat16_only_on_a_cpu_with_native_bf16(monkeypatch, amx, avx512_bf16, want):
    _cpu_caps(monkeypatch, amx, avx512_bf16)
    assert native_bf16("cpu") == (want == "bfloat16")
    assert resolve_precision("auto", "cpu") == want
    assert resolve_precision("auto", torch.device("cpu")) == want
    # explicit settings are kept whatever the machine; bf16 without native support says what it costs
    assert resolve_precision("float32", "cpu") == "float32"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_precision("bfloat16", "cpu") == "bfloat16"
    assert [str(w.message) for w in caught if "emulates" in str(w.message)] == ([] if want == "bfloat16" else [
        "bfloat16 on cpu without native bf16 (AMX-BF16, AVX512-BF16 or CUDA): torch emulates it, far slower than "
        "float32 (docs/tuning.md, 'Encoder precision')"])


def test_auto_elsewhere_and_bad_values():
    assert resolve_precision("auto", "meta") == "float32"  # no native bf16 known: exact
    with pytest.raises(ValueError, match="encoder precision must be one of"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="encoder_precision must be one of"):
        IndexConfig(encoder_precision="half")


def test_old_index_config_loads_as_float32():
    old = IndexConfig().to_dict()
    del old["encoder_precision"]
    assert IndexConfig.from_dict(old).encoder_precision == "float32"
    for p in ("float32", "bfloat16", "auto"):
        assert IndexConfig.from_dict(IndexConfig(encoder_precision=p).to_dict()).encoder_precision == p


def test_bf16_vectors_are_within_cosine_bound_of_float32(encoder):
    texts = ["Teutberga was a queen of Lotharingia by marriage to Lothair II.", "Paris",
             "Who directed Polish-Russian War?", "The film was released in 1998 by Warner Bros."]
    half = Encoder(precision="bfloat16")
    assert (encoder.precision, half.precision) == ("float32", "bfloat16")
    assert half.autocast is torch.bfloat16 and encoder.autocast is None
    a, b = encoder.encode(texts), half.encode(texts)
    assert b.dtype == torch.float32 and torch.allclose(b.norm(dim=1), torch.ones(len(texts)), atol=1e-5)
    cos = (a * b).sum(dim=1)
    # measured here: >= 0.9999 (hotpotqa passages: min 0.99997); int8 dynamic quantisation gives ~0.99
    assert bool((cos > 0.999).all()), cos
    assert not torch.equal(a, b)  # bf16 really ran
    assert Encoder(precision="bfloat16", quantize="int8").precision == "int8"  # int8 runs without autocast, and says so


@pytest.fixture(scope="module")
def few():
    return as_passages(small_passages()[:6])


def test_float32_build_holds_the_plain_float32_encoders_vectors(few, nlp, encoder):
    ix = build_index(few, IndexConfig(encoder_precision="float32"), nlp=nlp, progress=False)
    assert ix.index_config.encoder_precision == "float32"
    texts = [passage_text(p.title, p.text) for p in few]
    assert torch.equal(ix.passage_emb, encoder.encode(texts))
    assert torch.equal(ix.sentence_emb, encoder.encode(ix.sentences))
    assert torch.equal(ix.entity_emb, encoder.encode(ix.entities))


def test_auto_is_stored_resolved(few, nlp, tmp_path, monkeypatch):
    _cpu_caps(monkeypatch, amx=True, avx512_bf16=True)
    ix = build_index(few, IndexConfig(encoder_precision="auto"), nlp=nlp, progress=False)
    assert ix.index_config.encoder_precision == "bfloat16"
    ref = Encoder(precision="float32")
    texts = [passage_text(p.title, p.text) for p in few]
    cos = (ix.passage_emb * ref.encode(texts)).sum(dim=1)
    assert bool((cos > 0.999).all()) and not torch.equal(ix.passage_emb, ref.encode(texts))
    # the stored setting survives save/load, whatever this machine would pick now
    LinearRAG(ix, "cpu", nlp=nlp).save(tmp_path / "bf16")
    _cpu_caps(monkeypatch, amx=False, avx512_bf16=False)
    loaded = LinearRAG.load(tmp_path / "bf16", device="cpu")
    assert loaded.index.index_config.encoder_precision == "bfloat16"
    # on a machine without bf16, auto builds in float32, stored as such
    assert build_index(few[:2], IndexConfig(encoder_precision="auto"), nlp=nlp,
                       progress=False).index_config.encoder_precision == "float32"


def test_an_index_written_without_the_setting_loads_as_float32(small_index_dir, tmp_path):
    loaded = LinearRAG.load(index_without_setting(small_index_dir, tmp_path / "old", "encoder_precision"), device="cpu")
    assert loaded.index.index_config.encoder_precision == "float32"
    assert loaded.encoder.precision == "float32"
    assert TriGraphIndex.load(small_index_dir).index_config.encoder_precision == "float32"  # built by `encoder`


def test_benchmark_cache_keys_of_float32_indexes_are_unchanged(small_corpus, monkeypatch):
    """benchmarks.quality keeps the key it gave before the setting existed for float32 builds (the
    IndexConfig without the field), and keys bf16 builds apart."""
    old_dict = IndexConfig().to_dict()
    del old_dict["encoder_precision"]
    del old_dict["embedding_dtype"]
    del old_dict["sentence_vectors"]
    h = hashlib.sha256(small_corpus.read_bytes())
    h.update(b"\0")
    h.update(json.dumps(old_dict, sort_keys=True).encode())
    old_key = h.hexdigest()
    assert quality.cache_key(small_corpus, IndexConfig(encoder_precision="float32")) == old_key
    assert quality.cache_key(small_corpus, IndexConfig(encoder_precision="bfloat16")) != old_key
    _cpu_caps(monkeypatch, amx=False, avx512_bf16=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert quality.cache_key(small_corpus, IndexConfig(encoder_precision="auto")) == old_key
    _cpu_caps(monkeypatch, amx=True, avx512_bf16=True)
    assert quality.cache_key(small_corpus, IndexConfig(encoder_precision="auto")) == \
        quality.cache_key(small_corpus, IndexConfig(encoder_precision="bfloat16"))


def test_questions_are_float32_and_add_encodes_in_the_index_precision(few, nlp, monkeypatch):
    ix = build_index(few[:3], IndexConfig(encoder_precision="bfloat16"), nlp=nlp, progress=False)
    rag = LinearRAG(ix, "cpu", nlp=nlp)
    assert rag.encoder.precision == "float32"  # exact questions: batch-independent (LinearRAG.__init__)
    # quantize="bfloat16": bf16 questions where the CPU has native bf16, float32 (with a warning) elsewhere
    for native in (True, False):
        monkeypatch.setattr(env, "native_bf16", lambda device, native=native: native)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = LinearRAG(ix, "cpu", nlp=nlp, quantize="bfloat16").encoder.precision
        assert got == ("bfloat16" if native else "float32")
        assert any("runs in float32" in str(w.message) for w in caught) == (not native)
    monkeypatch.undo()
    built = LinearRAG.build(few[:3], IndexConfig(encoder_precision="bfloat16"), device="cpu", progress=False, nlp=nlp)
    assert built.index.index_config.encoder_precision == "bfloat16" and built.encoder.precision == "float32"
    # new passages are encoded as the index was: bf16, with the question encoder's model (nothing reloaded)
    rag.add(few[3:])
    assert rag.encoder.precision == "float32" and rag.models.passage_encoder().model is rag.encoder.model
    texts = [passage_text(p.title, p.text) for p in few[3:]]
    new = rag.index.passage_emb[3:]
    assert torch.equal(new, Encoder(precision="bfloat16").encode(texts))
    assert not torch.equal(new, Encoder(precision="float32").encode(texts))
