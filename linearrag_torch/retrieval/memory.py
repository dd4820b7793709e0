"""Memory settings: the working-memory budget of a query batch, and the allocator setting for big indexes.

The budget (``default_memory_budget``): how many bytes one engine call may use for its batch state; the
engine (engine.DeviceGraph.questions_per_chunk) runs a batch in chunks of questions that fit it, on a CPU
by default in smaller chunks than the limit allows (``default_chunk_budget``: they are faster there).
``$LINEARRAG_MEMORY_BUDGET`` overrides the default; ``parse_bytes`` reads '4G'-style sizes (the
environment, ``linearrag serve --memory-budget``, the benchmarks).

The allocator setting (``keep_freed_memory``), process-wide, for big indexes on Linux/glibc:

glibc serves every allocation above its mmap threshold (dynamic, at most 32 MiB) with a fresh mmap and
gives it back to the kernel on free, so each large temporary tensor of an index build or of a big query
chunk is faulted in again page by page, which can cost more than the arithmetic on it. From about 300,000
passages up most arrays cross that threshold, and building a 1,000,000-passage graph takes markedly longer
(measured: docs/tuning.md, "Big indexes on Linux"). ``keep_freed_memory`` raises the thresholds
so freed blocks stay in the process and are reused. The cost: the process keeps its peak memory instead
of returning it to the system between steps.

The ``linearrag`` command and the benchmarks call it; a library user who owns the process can too.
``release_freed_memory`` is its counterpart for a moment when much was freed at once (the server's reload
drops a whole index): glibc's malloc_trim gives the free pages of every arena back to the system.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time

from .. import env

MEMORY_BUDGET_ENV = env.MEMORY_BUDGET.name


def parse_bytes(text: str) -> int:
    """'4G', '512M', '2GiB', '1000000' -> bytes (K/M/G/T are powers of 1024)."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def default_memory_budget(device) -> int:
    """The working memory a batch may use: $LINEARRAG_MEMORY_BUDGET if set, else on CUDA half the free
    device memory, on CPU a quarter of the available RAM capped at 4 GiB."""
    budget = env.MEMORY_BUDGET.get()
    if budget:
        return parse_bytes(budget)
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return max(256 << 20, min(4 << 30, _available_ram() // 4))


# A CPU chunk's working set when no budget is given. Measured at batch 1,024 on synthetic indexes (2-vCPU EPYC,
# keep_freed_memory on, interleaved; docs/benchmarks/scaling.md): at 30k passages (2.3 MB per question) chunks of
# 115 questions answered 33% more per second than the 4 GiB limit's 1,846; at 100k (7.7 MB) chunks of 64, 42% more
# than its 555; at 10k no difference. (A chunk's dense [rows, questions] arrays are streamed once per
# PageRank step; why a few hundred MiB of them go faster than gigabytes was not profiled further.)
CPU_CHUNK_BYTES = 256 << 20
# at least a server's batch (ServeSettings.max_batch_size, 64) in one chunk: split, the batch of 64 at 100k passages
# (two chunks of 34) answered 9.0 q/s against 10.6 whole, each chunk paying the call's fixed work again
CPU_CHUNK_MIN_QUESTIONS = 64


def default_chunk_budget(device, bytes_per_question: int) -> int:
    """The working memory of one chunk of a batch when no budget is given: $LINEARRAG_MEMORY_BUDGET if set,
    on CUDA default_memory_budget (big chunks: a GPU wants wide products), on a CPU the smaller of that limit
    and CPU_CHUNK_BYTES or room for CPU_CHUNK_MIN_QUESTIONS questions, whichever is larger."""
    limit = default_memory_budget(device)
    import torch

    if env.MEMORY_BUDGET.get() or torch.device(device).type != "cpu":
        return limit
    return min(limit, max(CPU_CHUNK_BYTES, CPU_CHUNK_MIN_QUESTIONS * int(bytes_per_question)))


_MEMINFO_MAX_AGE_S = 1.0  # a query batch reads the budget up to three times (a chain's rounds): once a second is enough
_meminfo: tuple = (float("-inf"), 0)  # (time.monotonic() of the reading, MemAvailable bytes)


def _available_ram() -> int:
    """MemAvailable of /proc/meminfo in bytes, read at most once per _MEMINFO_MAX_AGE_S (8 GiB where unreadable)."""
    global _meminfo
    now = time.monotonic()
    if now - _meminfo[0] < _MEMINFO_MAX_AGE_S:
        return _meminfo[1]
    try:
        with open("/proc/meminfo") as fh:
            avail = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable"))
    except (OSError, StopIteration, ValueError):
        avail = 8 << 30
    _meminfo = (now, avail)
    return avail


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_applied: bool | None = None


def _glibc():
    """The C library when it is glibc on Linux (the allocator calls below are glibc's), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has no such function)
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Make glibc keep and reuse freed memory (mallopt: mmap threshold 1 GiB, no trimming, 256 MiB top
    pad). Returns True when applied (Linux with glibc), False elsewhere; calling again does nothing new."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 256 << 20)))
    return _applied


def release_freed_memory() -> bool:
    """Collect garbage, then give freed heap pages back to the system (glibc's malloc_trim(0), which works
    whatever keep_freed_memory set). True when malloc_trim ran (Linux with glibc), False elsewhere."""
    import gc

    gc.collect()
    libc = _glibc()
    if libc is None:
        return False
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


_MADV_RANDOM = 1  # Linux's madvise advice: no read-ahead around a faulting page


def read_at_random(t) -> bool:
    """Tell the kernel that ``t``'s memory (a CPU tensor) is read at random rows: for a tensor mapped from an index
    file, a page fault then reads that page, not the read-ahead window around it (tens of pages: a gathered row of
    a 20 GB vector file would bring in 128 KiB, and push out of the page cache rows other questions read). Advice
    only: the data is unchanged, anonymous memory is unaffected. True where madvise took it (Linux)."""
    if not sys.platform.startswith("linux") or t.device.type != "cpu" or t.numel() == 0:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr()
    end = start + t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    lo = start - start % page  # madvise takes whole pages
    return madvise(lo, end - lo, _MADV_RANDOM) == 0


def status_bytes(field: str, pid="self") -> int | None:
    """A size field of /proc/PID/status ("VmRSS", "VmHWM", ...) in bytes; None where it cannot be read
    (not Linux, the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None
