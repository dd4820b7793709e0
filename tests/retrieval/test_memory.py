"""The glibc allocator setting the CLI and the benchmarks apply (linearrag_torch/retrieval/memory.py)."""
def test_keep_freed_memory_applies_once_on_glibc():
    import platform

    from linearrag_torch.retrieval import memory

    first = memory.keep_freed_memory()
    assert memory.keep_freed_memory() is first  # idempotent
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert first is True


def test_release_freed_memory_gives_kept_memory_back():
    """With keep_freed_memory applied (as the CLI does), a freed 256 MiB tensor stays in the process until
    release_freed_memory (the server calls it after a reload drops an index). In a child process: the setting
    is process-wide."""
    import platform
    import subprocess
    import sys

    import pytest

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    script = """
import torch
from linearrag_torch.retrieval.memory import keep_freed_memory, release_freed_memory, status_bytes
assert keep_freed_memory()
x = torch.ones(64 << 20)  # 256 MiB, touched
del x
kept = status_bytes("VmRSS")
assert release_freed_memory()
print(kept - status_bytes("VmRSS"))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 200 << 20  # most of the 256 MiB went back


def test_bytes_by_part_count_each_storage_once():
    """TriGraphIndex.nbytes_by_part is the bytes of its tensors; DeviceGraph.nbytes_by_part adds only what the graph
    made beyond them (float32 vectors on the CPU are the index's own: 0), each storage once, with the caches it
    builds on first use (the push graph, the chain's tables) counted when there."""
    import torch

    from linearrag_torch.config import RetrievalConfig
    from linearrag_torch.retrieval.engine import DeviceGraph, retrieve
    from linearrag_torch.synthetic import random_index, random_queries

    index = random_index(120, 200, dim=8, seed=3)
    parts = index.nbytes_by_part()
    assert parts["entity_vectors"] == index.num_entities * 8 * 4
    assert parts["M"] == sum(t.numel() * t.element_size() for t in (index.M.crow, index.M.col, index.M.val))
    assert sum(parts.values()) == sum(t.numel() * t.element_size() for t in index.tensors())
    graph = DeviceGraph(index, "cpu")
    got = graph.nbytes_by_part()
    assert got["vectors"] == 0  # the index's float32 tensors, not copies
    mt = index.M.transpose()
    # M's arrays are the index's own; Mᵀ and ln(1 + N) by entity are the graph's
    assert got["activation"] == sum(t.numel() * t.element_size() for t in (mt.crow, mt.col))
    assert got["eq7"] == parts["N"] + (index.num_entities - index.num_passages) * 8
    assert "push" not in got
    retrieve(graph, random_queries(index, 3), RetrievalConfig(ppr_mode="local", reset_passages=30))
    push = graph.push_graph(False)
    assert graph.nbytes_by_part()["push"] >= sum(t.numel() * t.element_size() for t in (push.crow, push.col, push.val,
                                                                                         push.strength))
    assert graph.nbytes() == sum(graph.nbytes_by_part().values())
    # a half index upcast for the product: the float32 copies are the graph's
    half = index.with_embedding_dtype("float16")
    vectors = sum(v for k, v in parts.items() if k.endswith("_vectors"))
    assert DeviceGraph(half, "cpu", upcast=True).nbytes_by_part()["vectors"] == vectors
    assert DeviceGraph(half, "cpu", upcast=False).nbytes_by_part()["vectors"] == 0


def test_a_half_index_that_takes_the_ann_stage_keeps_its_vectors_half(tmp_path):
    """Where the index's settings take the ANN stage at its size, the graph gathers rows and keeps a half index's
    vectors as they are stored (no float32 copy, even without native half arithmetic); below that size it upcasts
    where the device lacks native half, as before. Mapped vectors are advised for random reads, unchanged."""
    import dataclasses

    import pytest
    import torch

    pytest.importorskip("faiss")
    from linearrag_torch.env import native_half
    from linearrag_torch.index import TriGraphIndex
    from linearrag_torch.retrieval.engine import DeviceGraph
    from linearrag_torch.retrieval.memory import read_at_random
    from linearrag_torch.synthetic import random_index

    half = random_index(150, 200, dim=8, seed=2).with_embedding_dtype("float16")
    small = DeviceGraph(half, "cpu")
    assert small.passage_emb.dtype == (torch.float16 if native_half(torch.float16, "cpu") else torch.float32)
    large = dataclasses.replace(half, retrieval_config=half.retrieval_config.replace(ppr_local_from=100))
    graph = DeviceGraph(large, "cpu")
    assert graph.entity_emb.dtype == torch.float16 and graph.nbytes_by_part()["vectors"] == 0
    large.save(tmp_path / "i")
    loaded = TriGraphIndex.load(tmp_path / "i")
    before = loaded.sentence_emb.clone()
    assert read_at_random(loaded.sentence_emb) is True
    assert torch.equal(DeviceGraph(loaded, "cpu").sentence_emb, before)
