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
