"""The process's torch threads (``$LINEARRAG_THREADS``): set once by the command line, the server and a shard."""
from __future__ import annotations

from typing import Optional

import torch

from .. import env

THREADS_ENV = env.THREADS.name


def set_threads(n: Optional[int] = None) -> int:
    """Set torch's intra-op threads (process-wide) to ``n``, else to $LINEARRAG_THREADS when set, else
    leave them; returns the count in use.

    torch's default (one thread per core) is fastest on idle cores, but its OpenMP threads spin at
    every barrier: when another busy process shares the cores they wait for each other, and a
    question batch runs several times slower than with 1 thread (docs/tuning.md, "Question throughput",
    has the figures). On shared cores use 1 thread, or OMP_WAIT_POLICY=PASSIVE in the
    environment of the process (read when torch loads)."""
    if n is None and env.THREADS.get():
        n = int(env.THREADS.get())
    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        torch.set_num_threads(n)
    return torch.get_num_threads()
