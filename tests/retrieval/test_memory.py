"""The glibc allocator setting the CLI and the benchmarks apply (linearrag_torch/retrieval/memory.py)."""
def test_keep_freed_memory_applies_once_on_glibc():
    import platform

    from linearrag_torch.retrieval import memory

    first = memory.keep_freed_memory()
    assert memory.keep_freed_memory() is first  # idempotent
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert first is True
