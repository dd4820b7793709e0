"""Writing an index whose vectors never stand whole in memory (storage.RowBlocks, synthetic.write_index): the same
bytes as safetensors' save_file and as building the index in memory and saving it; the folder loads mapped."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.index import TriGraphIndex
from linearrag_torch.index.storage import RowBlocks, _write_streaming
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
from linearrag_torch.synthetic import index_from_mentions, random_embeddings, random_mentions, random_queries, write_index


def test_streamed_file_is_save_files_bytes_for_every_dtype(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "emb": torch.randn(7, 5, generator=gen), "half": torch.randn(6, 3, generator=gen).half(),
        "bf": torch.randn(4, 2, generator=gen).bfloat16(), "crow": torch.arange(9), "col": torch.arange(5, dtype=torch.int32),
        "flag": torch.tensor([True, False, True]), "u": torch.arange(3, dtype=torch.uint8), "empty": torch.zeros(0, 4),
        "a.val": torch.ones(2, dtype=torch.float64),
    }
    save_file(tensors, str(tmp_path / "whole.safetensors"))
    streamed = dict(tensors)
    for name in ("emb", "half", "bf"):
        t = tensors[name]
        streamed[name] = RowBlocks(tuple(t.shape), t.dtype, lambda t=t: [t[:2], t[2:3], t[3:]])
    _write_streaming(streamed, tmp_path / "streamed.safetensors")
    assert (tmp_path / "streamed.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()
    back = load_file(str(tmp_path / "streamed.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("bad, words", [
    (lambda t: [t[:3]], "blocks hold"),  # fewer rows than declared
    (lambda t: [t, t[:1]], "blocks hold"),  # more
    (lambda t: [t.double()], "a block of torch.float64"),
])
def test_streamed_blocks_that_do_not_match_the_shape_fail_and_leave_no_file(tmp_path, bad, words):
    t = torch.randn(5, 4)
    with pytest.raises(ValueError, match=words):
        _write_streaming({"x": RowBlocks((5, 4), torch.float32, lambda: bad(t))}, tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_index_is_the_in_memory_build_saved(tmp_path, dtype):
    """The same tensors file byte for byte and the same index.json (but its files' random names) as the index built
    in memory with the same vectors and saved; loaded, it answers as that index does."""
    m = random_mentions(300, 500, seed=2)
    dim, seed = 16, 5
    streamed = write_index(tmp_path / "streamed", m, dim, seed, dtype, chunk=64)  # several blocks a matrix
    assert streamed.entity_emb.stride(0) == 0  # placeholders: no memory
    emb = [random_embeddings(n, dim, seed + i + 1, dtype=dtype) for i, n in enumerate((m.passages, m.sentences, m.entities))]
    whole = index_from_mentions(m, *emb)
    whole.index_config = streamed.index_config
    whole.save(tmp_path / "whole")
    meta = {name: json.loads((tmp_path / name / "index.json").read_text()) for name in ("streamed", "whole")}
    files = {name: meta[name]["files"] for name in meta}
    for name in ("tensors", "strings"):
        a = (tmp_path / "streamed" / files["streamed"][name]).read_bytes()
        assert a == (tmp_path / "whole" / files["whole"][name]).read_bytes()
    for m_ in meta.values():
        m_.pop("files")
        m_["manifest"] = sorted(m_["manifest"].values(), key=lambda v: v["sha256"])
    assert meta["streamed"] == meta["whole"]
    loaded = TriGraphIndex.load(tmp_path / "streamed")
    assert torch.equal(loaded.entity_emb, emb[2]) and loaded.entity_emb.dtype == dtype
    q = random_queries(whole, 5, seed=1)
    cfg = RetrievalConfig(delta=0.2)
    got, want = retrieve(DeviceGraph(loaded), q, cfg), retrieve(DeviceGraph(whole), q, cfg)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.scores, want.scores)


def test_save_refuses_vectors_of_another_shape(tmp_path):
    m = random_mentions(40, 60, seed=1)
    index = index_from_mentions(m, *(random_embeddings(n, 8) for n in (m.passages, m.sentences, m.entities)))
    with pytest.raises(ValueError, match="passage_emb"):
        index.save(tmp_path / "x", vectors={"passage_emb": RowBlocks((3, 8), torch.float32, lambda: [])})
