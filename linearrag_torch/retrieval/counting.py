"""Counting what a batch's retrieval asks of Python: its torch calls, and the values it reads back to the host.

On CUDA each read of a tensor's value on the host (``item``, ``tolist``, a tensor in ``if`` or ``int()``, ...)
waits for the device to finish, and a step repeated per question multiplies the calls; a batch that keeps to
the device makes a number of both that does not grow with the batch. engine.retrieve counts them for a
traced batch (Trace.host_reads, Trace.torch_calls) with OpCounter, a torch function mode: it sees every torch
call made from Python on its thread, and nothing of other threads.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from torch.overrides import TorchFunctionMode

# the torch calls whose answer is a tensor's value on the host (numbers, lists, arrays, a CPU copy, a bool)
HOST_READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "equal"})

_active = threading.local()


class OpCounter(TorchFunctionMode):
    """Within a ``with`` block on this thread: ``calls``, the torch functions and tensor methods called from
    Python, and ``host_reads``, those of them in HOST_READS (counts by name in ``reads``); calls made inside
    ``uncounted`` blocks are left out."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.host_reads = 0
        self.reads: dict = {}
        self.paused = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.calls += 1
            name = getattr(func, "__name__", "")
            if name in HOST_READS:
                self.host_reads += 1
                self.reads[name] = self.reads.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._outer = getattr(_active, "counter", None)
        _active.counter = self
        return super().__enter__()

    def __exit__(self, *exc):
        _active.counter = self._outer
        return super().__exit__(*exc)


def active() -> OpCounter | None:
    """The OpCounter counting on this thread, if any."""
    return getattr(_active, "counter", None)


@contextmanager
def uncounted():
    """Leave the block's calls out of this thread's OpCounter (a trace's own diagnostics, read on the host)."""
    counter = active()
    if counter is None:
        yield
        return
    counter.paused += 1
    try:
        yield
    finally:
        counter.paused -= 1
