"""Admission control of the HTTP front: who is let in, by count and by time.

By count: at most ``max_concurrent`` requests in flight. By time: the front estimates how long a new
request would wait for its answer from the questions already inside (admitted, not yet answered) and the
engine's recent pace (questions per engine-second over the batches of the last RATE_WINDOW_S seconds); a
request that would not be answered within its deadline (the request's ``X-Request-Timeout``, else the
server's ``--timeout``) is refused at once, with a Retry-After of when the queue will have drained enough.
A refusal by count also counts the crowd already refused: the clients refused in the last CROWD_WINDOW_S
seconds are waiting to come back, and the places free at the engine's pace, so its Retry-After is at least
the time the engine needs for that many questions (at most MAX_RETRY_AFTER_S). Clients that honour it then
come back spread over the time the engine can take them, instead of all after one second, and the server
refuses a few of them a second rather than each of them every second (on 2wiki with 16 times more clients
than places: docs/benchmarks/serve.md).
Refusing early is what keeps the engine's time for the requests that can still be answered: a request let
in to wait past its deadline costs its share of the engine and then fails anyway (504).

Nothing here reads a request: the front calls ``refusal`` before the body is read (serve/front.py's
EarlyAdmission middleware), and again with the real number of questions once the body is parsed.
"""
from __future__ import annotations

import math
import time
from collections import deque

RATE_WINDOW_S = 10.0  # the engine's pace is measured over the batches of about this many seconds
RATE_MIN_BATCHES = 8  # ... or, when fewer ran in that window, over the last this many batches
CROWD_WINDOW_S = 5  # refusals by count in about this many seconds are the crowd waiting to come back
MAX_RETRY_AFTER_S = 60  # the longest Retry-After the crowd asks for


class Admission:
    """Counts of what is inside and the engine's recent pace. ``engines``: engine replicas answering in
    parallel (1 in a single process)."""

    def __init__(self, max_concurrent: int, engines: int = 1):
        self.max_concurrent = max_concurrent
        self.engines = max(1, engines)
        self.in_flight = 0  # requests admitted and not answered
        self.questions = 0  # questions submitted to the engine host and not answered
        self._batches: deque = deque(maxlen=512)  # (monotonic end, questions, engine seconds)
        self._refused: deque = deque()  # [whole monotonic second, refusals by count in it], the last CROWD_WINDOW_S

    def on_batch(self, stats) -> None:
        """A batch the engine ran (serve/batcher.BatchStats): its pace counts unless it failed."""
        if stats.error is None and stats.size > 0 and stats.engine_s > 0:
            self._batches.append((time.monotonic(), stats.size, stats.engine_s))

    def seconds_per_question(self) -> float | None:
        """Engine seconds per question over the recent batches, divided among the engines (None: no batch yet)."""
        if not self._batches:
            return None
        now = time.monotonic()
        recent = [b for b in self._batches if now - b[0] <= RATE_WINDOW_S]
        if len(recent) < RATE_MIN_BATCHES:
            recent = list(self._batches)[-RATE_MIN_BATCHES:]
        questions = sum(b[1] for b in recent)
        return sum(b[2] for b in recent) / questions / self.engines

    def expected_wait(self, questions: int = 1) -> float:
        """Seconds until ``questions`` more questions would be answered (0 before any batch has run)."""
        spq = self.seconds_per_question()
        return 0.0 if spq is None else (self.questions + questions) * spq

    def refusal(self, deadline: float, questions: int = 1, admitted: bool = False) -> tuple[str, int] | None:
        """None when a request of ``questions`` questions may go on now, else (the reason, Retry-After seconds).
        ``admitted``: the request already holds its place (the second check, once its body is parsed)."""
        if not admitted and self.in_flight >= self.max_concurrent:
            # a place frees when a request in flight is answered: at the latest when all inside are; the crowd
            # refused before this one is let in at the engine's pace
            self._count_refusal()
            spq = self.seconds_per_question() or 0.0  # (once: a refusal's cost is what overload spends)
            wait = max(self.questions * spq, min(MAX_RETRY_AFTER_S, self.crowd() * spq))
            return (f"more than {self.max_concurrent} requests in flight", retry_after(wait))
        wait = self.expected_wait(questions)
        if wait > deadline:
            return (f"the queue would hold it ~{wait:.1f} s, past its {deadline:g} s deadline",
                    retry_after(wait - deadline))
        return None

    def _count_refusal(self) -> None:
        """Counts a refusal by count in its second's bucket, dropping the buckets past CROWD_WINDOW_S (a refusal
        costs an append or an increment)."""
        now = int(time.monotonic())
        refused = self._refused
        while refused and refused[0][0] <= now - CROWD_WINDOW_S:
            refused.popleft()
        if refused and refused[-1][0] == now:
            refused[-1][1] += 1
        else:
            refused.append([now, 1])

    def crowd(self) -> int:
        """Refusals by count in the last CROWD_WINDOW_S seconds (the clients waiting to come back)."""
        now = int(time.monotonic())
        return sum(n for t, n in self._refused if t > now - CROWD_WINDOW_S)


def retry_after(seconds: float) -> int:
    """Retry-After in whole seconds (HTTP's delta-seconds), at least 1."""
    return max(1, math.ceil(seconds))
