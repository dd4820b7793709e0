"""Dynamic batching: questions from concurrent requests coalesced into one engine call.

The event loop never runs the engine. Requests put their questions in a FIFO queue and await a
future; one collector task forms a batch as soon as the engine is free and either
``max_batch_size`` questions are waiting or the oldest of them has waited ``max_wait_ms``, and hands it
to the single engine thread. Only questions with the same settings share a batch (the engine runs
one RetrievalConfig per call). With a ``cost`` function (work units of a question: serve/admission.py) a batch
also holds at most ``max_batch_size`` units, so that a batch of heavy questions takes the engine about as long as
a full batch of plain ones. A request larger than a batch is split into parts, and a part is queued only once
the one before it is answered, behind what came meanwhile: the light requests that arrive while a heavy one is
answered wait for one of its parts, not for all of them. A heavy request's part (over ``heavy_cost`` units) is
also bounded in time while light requests come: it holds at most the units the engine runs, at the heavy parts'
measured pace, in the time of a recent light batch, so a light request waits behind about one light batch's
worth of heavy work (the units are a model of the cost; a long question at a large top_k may cost five times
what its units say). While both classes wait, a batch starts from the class below its share of the engine's
recent seconds (``heavy_share``), counted per class with an exponential decay over SERVED_TAU_S seconds of
engine time, and a heavy part rides in a light batch (where the settings match) only while the heavy requests
are below that share: riding in every light batch, one long question each, they took a third of the engine in
the heavy mix. A request that gave up (timeout, client gone) before its batch formed is dropped from the queue
and costs no engine time.

With ``gather_ms`` > 0 a batch also waits, after the engine finished its last call, up to gather_ms and
at most GATHER_SHARE of that call's duration (so the engine idles at most that share of its time, and a
fast GPU engine waits little), while fewer questions are queued than were inside when that call ended (those
it answered and those queued): the clients just answered are about to send their next questions. A request in
parts counts its current part (its next one is queued at once), and not at its end (its client's next heavy
request waits for its share at the admission). Counted over the last second instead (the most inside at once),
a heavy request's questions and every brief peak made each batch wait its whole allowance in vain, and the engine
idled for much of its time in the heavy mix (benchmarks/serve_hostile.py; the figures: docs/serving.md).
Without it, closed-loop clients split into two halves that alternate on the engine (each half queues
while the other's batch runs), and every batch holds half of them.

With ``group`` (a store's indexes: ``group(key)`` is the index's name), while several groups have questions waiting,
a batch starts from the group with the fewest recent engine seconds (decayed as the classes' are), and a batch of
a group is bounded in time while a group that has had fewer recent engine seconds is active (questions waiting,
or its last batch ended within GROUP_ACTIVE_S: its clients, just answered, are about to send their next ones): it
holds at most the units the group runs, at its own recent pace, in the time of that group's recent batches (at
least GROUP_MIN_SHARE of max_batch_size). So a quiet index's client waits behind about one batch of its own
length, not behind a busy index's full batch: without the bound, 8 closed-loop clients of a quiet index waited a
second a question behind each full batch of the busy one. A group alone (or the one below the others' engine
time) is never bounded: one busy index keeps its full batches. A group that comes back from idle brings no credit
(its engine seconds lifted to the fewest of the active groups'), so an index that had the engine to itself is not
made to wait for the returning one to catch up.

The engine results of one question do not depend on the batch it rode in (the engine's chunking
contract), so batching changes throughput and latency, never answers.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

# run_batch(key, questions) -> one result per question, called on the engine thread
RunBatch = Callable[[Hashable, list], list]
SERVED_TAU_S = 10.0  # the engine seconds each class ran count with weight exp(-engine seconds since / this): a
# decay per batch instead let a heavy part of seconds count as little as a light batch of a tenth of that
PACE_WEIGHT = 0.3  # the paces (seconds per unit of heavy parts, seconds of a light batch): this weight to the last
LIGHT_RECENT_S = 5.0  # a heavy part is bounded in time while a light batch ran within this many seconds
GATHER_SHARE = 0.25  # gather_ms: the wait is at most this share of the last engine call's duration
GROUP_ACTIVE_S = 1.0  # with groups: a group whose last batch ended within this many seconds is active
GROUP_MIN_SHARE = 0.125  # ... and a batch bounded in time for it still holds this share of max_batch_size units
GROUP_FORGET_S = 600.0  # a group's pace and batch time are forgotten this long after its last batch


@dataclass
class _Entry:
    key: Hashable
    questions: list
    future: asyncio.Future
    work: float = 0.0
    enqueued: float = field(default_factory=time.perf_counter)
    heavy: bool = False  # a part of a request of more than heavy_cost units
    last: bool = True  # the last part of its request (after it, its client has its answer)


@dataclass
class BatchStats:
    """What one engine call did; passed to the ``on_batch`` callback (metrics)."""

    size: int  # questions in the batch
    requests: int  # queue entries (request parts) in the batch
    queue_waits: list  # seconds each entry waited in the queue
    engine_s: float  # seconds of the engine call
    error: BaseException | None = None
    work: float | None = None  # work units of the batch (None: not counted; a question is one)
    heavy_work: float = 0.0  # ... of them, those of heavy requests' parts
    key: Hashable = None  # the batch's key (its settings; in a store, the index's name first)


class Batcher:
    """Coalesces ``submit`` calls into engine calls of up to ``max_batch_size`` questions.

    ``run_batch(key, questions)`` runs on one dedicated thread (the engine's models are used by that
    thread only); ``call(fn)`` runs any other function on that same thread, between batches.
    Start with ``start()`` inside the event loop, stop with ``await stop()`` (finishes what is queued).
    """

    def __init__(self, run_batch: RunBatch, max_batch_size: int = 64, max_wait_ms: float = 0.0,
                 on_batch: Callable[[BatchStats], None] | None = None, gather_ms: float = 0.0,
                 cost: Callable[[Hashable, object], float] | None = None, heavy_share: float | None = None,
                 heavy_cost: float = float("inf"), group: Callable[[Hashable], Hashable] | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0 or gather_ms < 0:
            raise ValueError(f"max_wait_ms and gather_ms must be >= 0, got {max_wait_ms} and {gather_ms}")
        self.run_batch = run_batch
        self.cost = cost  # cost(key, question): its work units (None: one each)
        # with a cost: the heavy requests' (over heavy_cost units) share of the engine's work while light ones wait
        self.heavy_share, self.heavy_cost = heavy_share, heavy_cost
        self._served = {False: 0.0, True: 0.0}  # engine seconds per class (heavy?), decaying (SERVED_TAU_S)
        self._heavy_pace: float | None = None  # engine seconds per unit of the recent heavy parts
        self._light_batch_s: float | None = None  # engine seconds of the recent light batches
        self._light_ran_at = float("-inf")  # when the last light batch ended
        self._heavy_inside = 0  # heavy requests submitted and not answered
        # with ``group`` (a store's indexes: group(key) is the index's name), the engine seconds of each group,
        # decaying as the classes' do: while several groups wait, a batch starts from the one with the fewest
        self.group = group
        self._group_served: dict = {}
        # per group, as the heavy parts' pace: engine seconds per unit and of a batch, and when its last batch ended
        self._group_pace: dict = {}
        self._group_batch_s: dict = {}
        self._group_ran_at: dict = {}
        self._waiting_groups: set = set()  # the groups with questions queued when the last batch was taken
        self._group_seen: dict = {}  # when each group last submitted a request
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.gather = gather_ms / 1000.0
        self._inside = 0  # questions queued or in the engine (a request in parts: its current part)
        self._coming = 0  # gather_ms: the questions expected in the next batch (those waiting and the clients'
        # just answered, as counted when the engine finished its last call)
        self._engine_free_at = 0.0  # when the engine finished its last call
        self._gather_for = 0.0  # how long after it the next batch may wait (gather_ms)
        self.on_batch = on_batch
        self._queue: deque[_Entry] = deque()
        self._waiting = 0  # questions in the queue
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="linearrag-engine")
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the collector task on the running event loop."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._collect(), name="linearrag-batcher")

    async def stop(self) -> None:
        """Answer everything already queued, then stop the collector and the engine thread."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            await self._task
            self._task = None
        self._executor.shutdown(wait=True)

    @property
    def queued(self) -> int:
        """Questions waiting for a batch."""
        return self._waiting

    # ------------------------------------------------------------------ use
    async def submit(self, key: Hashable, questions: Sequence) -> list:
        """One result per question, in order. A request larger than a batch is queued a part at a time (the
        module's docstring). Cancelling the awaiting task drops the questions that have not reached the engine
        yet."""
        if self._task is None or self._stopping:
            raise RuntimeError("the batcher is not running")
        loop = asyncio.get_running_loop()
        questions = list(questions)
        results = []
        costs = [1.0] * len(questions) if self.cost is None else [self.cost(key, q) for q in questions]
        heavy = self.cost is not None and sum(costs) > self.heavy_cost
        if heavy:
            self._arrives_heavy()
        if self.group is not None:
            self._group_arrives(self.group(key))
        try:
            for part, work, last in self._parts(questions, costs, heavy):
                e = _Entry(key, part, loop.create_future(), work, heavy=heavy, last=last)
                self._queue.append(e)
                self._waiting += len(part)
                self._inside += len(part)  # a request in parts counts its current part: the next batch's share
                self._wake.set()
                try:
                    results += await e.future
                except BaseException:
                    e.future.cancel()
                    self._drop_cancelled()  # out of the queue (and its count) now, not when the engine is next free
                    raise
                finally:
                    self._inside -= len(part)
        finally:
            self._heavy_inside -= heavy
        return results

    def _arrives_heavy(self) -> None:
        """A heavy request comes in. Into an idle heavy class it brings no credit: its engine seconds are lifted to
        its share of the light ones' (they decay with engine time, and a quiet spell of light batches let the first
        heavy request after it run part after part, seconds of them, while light requests waited)."""
        if self._heavy_inside == 0 and self.heavy_share is not None:
            fair = self.heavy_share / (1.0 - self.heavy_share) * self._served[False]
            self._served[True] = max(self._served[True], fair)
        self._heavy_inside += 1

    def _group_arrives(self, g: Hashable) -> None:
        """A request of group ``g``. A group that was idle (nothing submitted and no batch within GROUP_ACTIVE_S)
        brings no credit: its engine seconds are lifted to the fewest of the active groups' (as a heavy request into
        an idle class). Without it, an index that had the engine to itself while the other idled had to wait, on the
        other's return, until the other's decayed seconds caught up with its own: seconds of the other's full
        batches, its queue growing meanwhile."""
        now = time.perf_counter()
        last = max(self._group_ran_at.get(g, float("-inf")), self._group_seen.get(g, float("-inf")))
        self._group_seen[g] = now
        if now - last <= GROUP_ACTIVE_S:
            return
        active = [self._group_served.get(h, 0.0) for h, t in self._group_seen.items()
                  if h != g and now - max(t, self._group_ran_at.get(h, float("-inf"))) <= GROUP_ACTIVE_S]
        if active:
            self._group_served[g] = max(self._group_served.get(g, 0.0), min(active))

    def _parts(self, questions: list, costs: list, heavy: bool):
        """(part, its work, whether it is the last) of at most max_batch_size questions and ``_part_units(heavy)``
        units each (at least one question), each sized when the one before it is answered (a generator: the paces
        it reads are current)."""
        start = 0
        while start < len(questions):
            limit, work, end = self._part_units(heavy), costs[start], start + 1
            while end < len(questions) and end - start < self.max_batch_size and work + costs[end] <= limit:
                work += costs[end]
                end += 1
            yield questions[start:end], work, end == len(questions)
            start = end

    def _part_units(self, heavy: bool) -> float:
        """The units a part may hold: max_batch_size; a heavy request's part, while light batches run (one within
        LIGHT_RECENT_S), at most what the engine runs in a recent light batch's time at the heavy parts' pace."""
        if not heavy or self._heavy_pace is None or self._light_batch_s is None or \
                time.perf_counter() - self._light_ran_at > LIGHT_RECENT_S:
            return float(self.max_batch_size)
        return min(float(self.max_batch_size), self._light_batch_s / self._heavy_pace)

    def _gathering(self, now: float) -> bool:
        """Whether to wait for the clients just answered (module docstring, gather_ms)."""
        return (now - self._engine_free_at < self._gather_for
                and self._waiting < min(self._coming, self.max_batch_size))

    async def call(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the engine thread (between batches) and return its result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------ the collector
    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            if not self._queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._waiting < self.max_batch_size and not self._stopping:
                now = time.perf_counter()
                remaining = self.max_wait - (now - self._queue[0].enqueued)
                if self._gathering(now):
                    remaining = max(remaining, self._gather_for - (now - self._engine_free_at))
                if remaining > 0:
                    self._wake.clear()
                    try:  # woken early by a new entry: re-check the size
                        await asyncio.wait_for(self._wake.wait(), remaining)
                    except asyncio.TimeoutError:
                        pass
                    self._drop_cancelled()
                    now = time.perf_counter()
                    if self._queue and self._waiting < self.max_batch_size and \
                            (now - self._queue[0].enqueued < self.max_wait or self._gathering(now)):
                        continue
            batch = self._take()
            if not batch:
                continue
            questions = [q for e in batch for q in e.questions]
            now = time.perf_counter()
            waits = [now - e.enqueued for e in batch]
            t0 = time.perf_counter()
            error = None
            try:
                results = await loop.run_in_executor(self._executor, self.run_batch, batch[0].key, questions)
                if len(results) != len(questions):
                    raise RuntimeError(f"the engine returned {len(results)} results for {len(questions)} questions")
            except Exception as exc:  # reported to each request of the batch
                error = exc
            self._engine_free_at = time.perf_counter()
            engine_s = self._engine_free_at - t0
            self._gather_for = min(self.gather, GATHER_SHARE * engine_s)
            # those waiting and those answered now (the answered are still inside until their awaiters run), but the
            # end of a heavy request: its client's next heavy request waits for its share at the admission
            self._coming = self._inside - sum(len(e.questions) for e in batch
                                              if e.heavy and e.last and not e.future.done())
            pos = 0
            for e in batch:
                if not e.future.done():
                    if error is not None:
                        e.future.set_exception(error)
                    else:
                        e.future.set_result(results[pos:pos + len(e.questions)])
                pos += len(e.questions)
            self._account(batch, engine_s, error is None)
            self.charge(batch[0].key, engine_s)
            self._account_group(batch, engine_s, error is None)
            if self.on_batch is not None:
                self.on_batch(BatchStats(len(questions), len(batch), waits, engine_s, error,
                                         sum(e.work for e in batch) if self.cost is not None else None,
                                         sum(e.work for e in batch if e.heavy), key=batch[0].key))

    def _account(self, batch: list[_Entry], engine_s: float, ok: bool) -> None:
        """The engine's seconds of a batch, shared by its entries' classes in proportion to their work (older
        seconds decayed); the heavy parts' pace and the light batches' duration."""
        decay = math.exp(-engine_s / SERVED_TAU_S)
        for cls in self._served:
            self._served[cls] *= decay
        total = sum(e.work for e in batch) or 1.0
        heavy_work = 0.0
        for e in batch:
            self._served[e.heavy] += engine_s * e.work / total
            heavy_work += e.work if e.heavy else 0.0
        if not ok or self.cost is None:
            return
        if heavy_work:
            pace = engine_s / total  # seconds per unit of this batch, the heavy part's included
            self._heavy_pace = pace if self._heavy_pace is None else \
                (1 - PACE_WEIGHT) * self._heavy_pace + PACE_WEIGHT * pace
        else:
            self._light_ran_at = time.perf_counter()
            self._light_batch_s = engine_s if self._light_batch_s is None else \
                (1 - PACE_WEIGHT) * self._light_batch_s + PACE_WEIGHT * engine_s

    def _account_group(self, batch: list[_Entry], engine_s: float, ok: bool) -> None:
        """With groups: the pace (engine seconds per unit) and the batch time of the batch's group, and when it
        ended; groups idle for GROUP_FORGET_S are forgotten (a store's dropped indexes)."""
        if self.group is None:
            return
        now = time.perf_counter()
        g = self.group(batch[0].key)
        self._group_ran_at[g] = now
        for h in [h for h, t in self._group_ran_at.items() if now - t > GROUP_FORGET_S]:
            for d in (self._group_ran_at, self._group_pace, self._group_batch_s, self._group_seen):
                d.pop(h, None)
        units = sum(e.work for e in batch) if self.cost is not None else sum(len(e.questions) for e in batch)
        if not ok or units <= 0 or engine_s <= 0:
            return
        pace, old_pace, old_s = engine_s / units, self._group_pace.get(g), self._group_batch_s.get(g)
        self._group_pace[g] = pace if old_pace is None else (1 - PACE_WEIGHT) * old_pace + PACE_WEIGHT * pace
        self._group_batch_s[g] = engine_s if old_s is None else (1 - PACE_WEIGHT) * old_s + PACE_WEIGHT * engine_s

    def _group_units(self, g: Hashable, waiting: set) -> float:
        """The units a batch of group ``g`` may hold (module docstring): max_batch_size, or, while a group with
        fewer recent engine seconds is active (in ``waiting``, or its last batch ended within GROUP_ACTIVE_S), what
        ``g`` runs at its recent pace in the longest of those groups' recent batch times, at least GROUP_MIN_SHARE of
        max_batch_size."""
        full = float(self.max_batch_size)
        pace = self._group_pace.get(g)
        if self.group is None or not pace:
            return full
        now, mine = time.perf_counter(), self._group_served.get(g, 0.0)
        slices = [s for h, s in self._group_batch_s.items()
                  if h != g and self._group_served.get(h, 0.0) < mine
                  and (h in waiting or now - self._group_ran_at.get(h, float("-inf")) <= GROUP_ACTIVE_S)]
        if not slices:
            return full
        return min(full, max(GROUP_MIN_SHARE * full, max(slices) / pace))

    def charge(self, key: Hashable, engine_s: float) -> None:
        """Count ``engine_s`` engine seconds to the group of ``key`` (a batch, or other engine work such as a store's
        write: ``call_for``); every group's earlier seconds decay by the time that passed on the engine."""
        if self.group is None:
            return
        decay = math.exp(-engine_s / SERVED_TAU_S)
        served = self._group_served
        for g in list(served):
            served[g] *= decay
            if served[g] < 1e-6:
                del served[g]
        g = self.group(key)
        served[g] = served.get(g, 0.0) + engine_s

    async def call_for(self, key: Hashable, fn: Callable, *args):
        """``call(fn, *args)``, its engine seconds counted to the group of ``key`` (a store's write to an index
        takes its turn like that index's batches)."""
        t0 = time.perf_counter()
        try:
            return await self.call(fn, *args)
        finally:
            self.charge(key, time.perf_counter() - t0)

    def _drop_cancelled(self) -> None:
        if any(e.future.done() for e in self._queue):
            kept = deque(e for e in self._queue if not e.future.done())
            self._waiting = sum(len(e.questions) for e in kept)
            self._queue = kept

    def _head(self, heavy_below: bool) -> _Entry:
        """The entry the next batch starts from: the oldest one, except that while both classes wait, the oldest
        of the class that has had less than its share of the engine's recent time (heavy_share for the heavy ones):
        then a heavy request's parts, each up to a batch of work, cannot take the engine from the light ones.
        With groups (a store's indexes), the entries considered are first those of the waiting group that has had
        the fewest recent engine seconds: a busy index cannot starve a quiet one, whose questions wait for at most
        about one batch of each other index."""
        queue = self._queue
        if self.group is not None:
            waiting = {self.group(e.key) for e in queue}
            if len(waiting) > 1:
                least = min(waiting, key=lambda g: self._group_served.get(g, 0.0))
                queue = [e for e in queue if self.group(e.key) == least]
            self._waiting_groups = waiting
        oldest = queue[0]
        if self.heavy_share is None:
            return oldest
        return next((e for e in queue if e.heavy == heavy_below), oldest)

    def _heavy_below_share(self) -> bool:
        """Whether the heavy requests have had less than their share of the engine's recent time."""
        return self._served[True] < self.heavy_share * (self._served[True] + self._served[False])

    def _take(self) -> list[_Entry]:
        """The head entry (``_head``) and, in FIFO order, the next entries with its key that still fit (in
        questions, and in work units with a cost function)."""
        self._drop_cancelled()
        if not self._queue:
            return []
        below = self.heavy_share is not None and self._heavy_below_share()
        head = self._head(below)
        key = head.key
        # a light batch takes no heavy part while the heavy ones have had their share: riding along in every light
        # batch, one heavy question each, they took a third of the engine in the heavy mix
        heavy_ok = head.heavy or self.heavy_share is None or below
        # with groups, the units this batch may hold (bounded in time while a quieter group is active)
        limit = float(self.max_batch_size) if self.group is None else \
            self._group_units(self.group(key), self._waiting_groups)
        units = (lambda e: e.work) if self.cost is not None else (lambda e: len(e.questions))
        batch, rest, n, work = [head], deque(), len(head.questions), units(head)
        for e in self._queue:
            if e is head:
                continue
            if e.key == key and n + len(e.questions) <= self.max_batch_size and (heavy_ok or not e.heavy) and \
                    work + units(e) <= limit + 1e-9:
                batch.append(e)
                n += len(e.questions)
                work += units(e)
            else:
                rest.append(e)
        self._queue = rest
        self._waiting -= n
        return batch
