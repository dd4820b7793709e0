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
in to wait past its deadline costs its share of the engine and then fails anyway (504). An idle engine (no question
inside) takes a request whatever the pace says: the pace is that of the last batches, which may be stale (a slow
spell over), and only a batch run refreshes it; refused by it, a server whose timeout is below its last pace
would refuse every request from then on.

By work: a request's cost is the work it brings (as TEI's queue counts tokens, not requests), the sum over its
questions of ``question_cost``: one unit for a question of up to UNIT_CHARS characters at a top_k up to
LIGHT_TOP_K without rerank, more in proportion to its length and its top_k beyond those, (1 + RERANK_WEIGHT) times
with rerank over the default RERANK_PAIRS pairs, the weight in proportion to the pairs the reranker reads (a fuzzed
request at rerank_candidates 27 took three times what the default's weight said: docs/serving.md). The pace is
measured per unit (the batcher reports each batch's work), the time check counts the units inside, and the units
of the requests admitted and not answered are bounded by a budget (``max_work``),
shared by two classes: a request costing more than HEAVY_COST units is heavy. Each class has its share of the
budget (``heavy_share`` for the heavy ones, the rest for the light ones; a request larger than its class's share
counts as the whole share). A loan lasts as long as the request that borrows: light requests may borrow the
heavy share while no heavy request has been refused within it in the last CROWD_WINDOW_S seconds (they are
answered in a fraction of a second, and the share comes back as soon as heavy requests want it), heavy ones the
light share only while no light request has come in that time (a heavy request holds its loan for seconds:
lent while light ones come, the light share went to the heavy requests and light ones were refused until they
were answered, a large share of the light capacity in the heavy mix: docs/serving.md). So the budget is used whatever the mix (heavy
requests alone fill it, as light ones alone do), and the batcher lets light requests through between the parts
of a heavy one (serve/batcher.py).

Nothing here reads a request: the front calls ``refusal`` before the body is read (serve/front.py's
EarlyAdmission middleware), and again with the request's real cost once the body is parsed.
"""
from __future__ import annotations

import math
import time
from collections import deque

# the heavy requests' guaranteed share (ServeSettings.heavy_share): 0.15 since issue 47's second heavy-mix A/B
# (light goodput >= 70% of capacity in 8 of 8 alternated runs, native and AVX2 kernels, against 6 of 8 with 0.2; heavy
# requests answered alike, each slower), 0.2 before it (0.25 until the first; docs/benchmarks/serve.md). The light
# requests get at most the rest of the engine while both classes wait, and a 4x crowd of aggressive clients costs
# them some of that: with 0.2 the target of 70% of capacity left them 12% for it
HEAVY_SHARE = 0.15

RATE_WINDOW_S = 10.0  # the engine's pace is measured over the batches of about this many seconds
RATE_MIN_BATCHES = 8  # ... or, when fewer ran in that window, over the last this many batches
CROWD_WINDOW_S = 5  # refusals by count in about this many seconds are the crowd waiting to come back
MAX_RETRY_AFTER_S = 60  # the longest Retry-After the crowd asks for
UNIT_CHARS = 150  # a question counts one unit per this many characters (at least one)
LIGHT_TOP_K = 50  # ... times top_k / this beyond it (the hits' serialisation)
RERANK_WEIGHT = 20  # ... times 1 + this with rerank (the cross-encoder over its candidates) ...
RERANK_PAIRS = 10  # ... over this many pairs a question (the defaults: 5 in the chain round, 5 in the final list)
HEAVY_COST = 8  # a request of more units is heavy (its class's share of the budget)


def question_cost(chars: int, top_k: int, rerank: bool, pairs: int = RERANK_PAIRS) -> float:
    """Work units of one question of ``chars`` characters at ``top_k``, with or without rerank (over ``pairs``
    question-passage pairs: ``rerank_pairs``)."""
    return max(1.0, chars / UNIT_CHARS) * max(1.0, top_k / LIGHT_TOP_K) * (
        1 + RERANK_WEIGHT * bool(rerank) * pairs / RERANK_PAIRS)


def rerank_pairs(cfg) -> int:
    """The pairs the reranker reads for one question with the retrieval settings ``cfg`` (a RetrievalConfig): the
    final list's candidates (at most the set reader's reach, ``rerank_reach``, with ``rerank_set_reader``), and the
    loop's in each chain round."""
    loop = cfg.rerank_loop_candidates * cfg.chain_rounds if cfg.chain_passages > 0 else 0
    final = max(cfg.rerank_candidates, cfg.rerank_reach) if getattr(cfg, "rerank_set_reader", False) \
        else cfg.rerank_candidates
    return final + loop


def request_cost(questions, top_k: int, rerank: bool) -> float:
    """Work units of a request: its questions' costs summed."""
    return sum(question_cost(len(q), top_k, rerank) for q in questions)


class Admission:
    """Counts of what is inside and the engine's recent pace. ``engines``: engine replicas answering in
    parallel (1 in a single process). ``max_work``: the budget of work units (default 4 x ``max_concurrent``),
    ``heavy_share`` of it guaranteed to heavy requests."""

    def __init__(self, max_concurrent: int, engines: int = 1, max_work: float | None = None,
                 heavy_share: float = HEAVY_SHARE):
        self.max_concurrent = max_concurrent
        self.engines = max(1, engines)
        self.max_work = float(max_work or 4 * max_concurrent)
        self.share = {"heavy": heavy_share, "light": 1.0 - heavy_share}
        # places beyond max_concurrent that only heavy requests keep: taken before the body says which class a
        # request is; once it does, a light request is let on only while fewer than max_concurrent light ones are
        # (whichever place it took: a heavy request in one of the first max_concurrent leaves a heavy place free).
        # Without them the light clients, answered fast and back at once, take every place that frees and a heavy
        # request never finds one
        self.heavy_places = round(heavy_share * max_concurrent)
        self.in_flight = 0  # requests admitted and not answered
        self.light_in_flight = 0  # ... of them, those whose body showed them light (``take``)
        self.questions = 0  # work units of the questions submitted to the engine host and not answered (a plain
        # question is one unit)
        self.heavy_questions = 0.0  # ... of them, those of heavy requests
        self.work = {"light": 0.0, "heavy": 0.0}  # units of the requests admitted by work and not answered
        self._heavy_wanted = float("-inf")  # when a heavy request was last refused within the heavy share
        self._light_seen = float("-inf")  # when a light request last came to the budget check
        self._batches: deque = deque(maxlen=512)  # (monotonic end, units, engine seconds)
        self._refused: deque = deque()  # [whole monotonic second, refusals by count in it], the last CROWD_WINDOW_S

    def on_batch(self, stats) -> None:
        """A batch the engine ran (serve/batcher.BatchStats): its pace counts unless it failed (per unit of work
        when the batch reports it, else per question)."""
        units = getattr(stats, "work", None) or stats.size
        if stats.error is None and units > 0 and stats.engine_s > 0:
            self._batches.append((time.monotonic(), units, stats.engine_s))

    def seconds_per_question(self) -> float | None:
        """Engine seconds per unit of work (a plain question) over the recent batches, divided among the engines
        (None: no batch yet)."""
        if not self._batches:
            return None
        now = time.monotonic()
        recent = [b for b in self._batches if now - b[0] <= RATE_WINDOW_S]
        if len(recent) < RATE_MIN_BATCHES:
            recent = list(self._batches)[-RATE_MIN_BATCHES:]
        questions = sum(b[1] for b in recent)
        return sum(b[2] for b in recent) / questions / self.engines

    def expected_wait(self, questions: float = 1, heavy: bool = False) -> float:
        """Seconds until ``questions`` more units would be answered (0 before any batch has run). A light
        request waits for the light units inside, and the heavy ones take at most their share of the engine
        meanwhile (the batcher's order); a heavy one waits for everything inside."""
        spq = self.seconds_per_question()
        if spq is None:
            return 0.0
        if heavy:
            return (self.questions + questions) * spq
        light = self.questions - self.heavy_questions + questions
        return min(self.questions + questions, light / (1.0 - self.share["heavy"])) * spq

    def refusal(self, deadline: float, questions: float = 1, admitted: bool = False,
                cost: float | None = None) -> tuple[str, int] | None:
        """None when a request of ``questions`` units may go on now, else (the reason, Retry-After seconds).
        ``admitted``: the request already holds its place (the second check, once its body is parsed), where
        ``cost`` (its units) is checked against the budget too, and a light request against the light places."""
        if (not admitted and self.in_flight >= self.max_concurrent + self.heavy_places) or (
                admitted and cost is not None and self.kind(cost) == "light"
                and self.light_in_flight >= self.max_concurrent):
            # a place frees when a request in flight is answered: at the latest when all inside are; the crowd
            # refused before this one is let in at the engine's pace
            self._count_refusal()
            spq = self.seconds_per_question() or 0.0  # (once: a refusal's cost is what overload spends)
            wait = max(self.expected_wait(0), min(MAX_RETRY_AFTER_S, self.crowd() * spq))
            return (f"more than {self.max_concurrent} requests in flight", retry_after(wait))
        if cost is not None:
            refused = self._over_budget(cost)
            if refused is not None:
                return refused
        wait = self.expected_wait(questions, heavy=cost is not None and self.kind(cost) == "heavy")
        if wait > deadline and self.questions > 0:  # an idle engine takes it: only a batch run refreshes a stale pace
            return (f"the queue would hold it ~{wait:.1f} s, past its {deadline:g} s deadline",
                    retry_after(wait - deadline))
        return None

    @staticmethod
    def kind(cost: float) -> str:
        return "heavy" if cost > HEAVY_COST else "light"

    def held(self, cost: float) -> float:
        """The units a request of ``cost`` holds of the budget: at most its class's share."""
        return min(cost, self.share[self.kind(cost)] * self.max_work)

    def _over_budget(self, cost: float) -> tuple[str, int] | None:
        kind = self.kind(cost)
        held, total = self.held(cost), self.work["light"] + self.work["heavy"]
        within_share = self.work[kind] + held <= self.share[kind] * self.max_work + 1e-9
        now = time.monotonic()
        if kind == "light":
            may_borrow = now - self._heavy_wanted > CROWD_WINDOW_S
            self._light_seen = now
        else:
            may_borrow = now - self._light_seen > CROWD_WINDOW_S
        if total + held <= self.max_work + 1e-9 and (within_share or may_borrow):
            return None
        if kind == "heavy" and within_share:  # the light ones borrow the heavy share: they stop borrowing
            self._heavy_wanted = now
        excess = total + held - self.max_work
        if excess > 1e-9:
            why = f"the work budget is full ({total:.0f} + {held:.0f} of {self.max_work:.0f} units)"
        else:
            excess = self.work[kind] + held - self.share[kind] * self.max_work
            why = (f"the {kind} requests' share of the work budget is taken ({self.work[kind]:.0f} + {held:.0f} of "
                   f"{self.share[kind] * self.max_work:.0f} units)")
        return why, retry_after(max(0.0, excess) * (self.seconds_per_question() or 0.0))

    def take(self, cost: float) -> tuple[str, float]:
        """The budget held by an admitted request of ``cost`` units until ``give_back``."""
        ticket = (self.kind(cost), self.held(cost))
        self.work[ticket[0]] += ticket[1]
        self.light_in_flight += ticket[0] == "light"
        return ticket

    def give_back(self, ticket: tuple[str, float]) -> None:
        self.work[ticket[0]] = max(0.0, self.work[ticket[0]] - ticket[1])
        self.light_in_flight -= ticket[0] == "light"

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
