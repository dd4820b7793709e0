"""How a call is timed and traced, for every part of the package (the question path, the engine, the index build):

- ``stage(timings, name)``: the seconds of a block added to ``timings[name]`` (a plain dict: wall time;
  ``StageTimings``: a dict with its own clock, e.g. the process's CPU time);
- ``OpCounter``: what a traced batch asks of Python, its torch calls and the values it reads back to the host
  (on CUDA each waits for the device; a batch that keeps to the device makes a number of both that does not
  grow with the batch). engine.retrieve counts a traced batch with it (Trace.host_reads, Trace.torch_calls):
  a torch function mode, it sees every torch call made from Python on its thread, and nothing of other
  threads; ``uncounted`` leaves a trace's own diagnostics out.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Optional

from torch.overrides import TorchFunctionMode


class StageTimings(dict):
    """A timings dict with its own clock: time.perf_counter (wall seconds, what a plain dict gets) or
    time.process_time (CPU seconds of the whole process: steadier than wall time on cores shared with
    other busy processes; with one torch thread it is the work done)."""

    def __init__(self, clock=time.perf_counter):
        super().__init__()
        self.clock = clock


@contextmanager
def stage(timings: Optional[dict], name: str):
    """Add the seconds spent in the block to timings[name] (no-op when timings is None), by the
    dict's ``clock`` attribute when it has one (StageTimings), else wall time."""
    if timings is None:
        yield
        return
    clock = getattr(timings, "clock", time.perf_counter)
    t0 = clock()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + clock() - t0


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
