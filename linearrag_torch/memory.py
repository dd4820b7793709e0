"""Process-wide allocator setting for big indexes on Linux/glibc.

glibc serves every allocation above its mmap threshold (dynamic, at most 32 MiB) with a fresh mmap and
gives it back to the kernel on free, so each large temporary tensor of an index build or of a big query
chunk is faulted in again page by page (about 0.6 ns per byte on our 2-core VM, more than the arithmetic
on it). From about 300,000 passages up most arrays cross that threshold, and building a 1,000,000-passage
graph took 17-20 s instead of 10-15 s (benchmarks/README.md). ``keep_freed_memory`` raises the thresholds
so freed blocks stay in the process and are reused. The cost: the process keeps its peak memory instead
of returning it to the system between steps.

The ``linearrag`` command and the benchmarks call it; a library user who owns the process can too.
"""
from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Make glibc keep and reuse freed memory (mallopt: mmap threshold 1 GiB, no trimming, 256 MiB top
    pad). Returns True when applied (Linux with glibc), False elsewhere; calling again does nothing new."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc only (musl has no such function)
    except (OSError, AttributeError):
        return False
    del gnu_get_libc_version
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 256 << 20)))
    return _applied
