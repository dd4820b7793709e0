"""The dynamic batcher on its own: coalescing, limits of a batch, settings kept apart, cancellation,
errors. The engine here is a recording function, so each batch it was handed can be checked."""
import asyncio
import itertools
import threading
import time

import pytest

from linearrag_torch.serve.batcher import Batcher


class Recorder:
    """run_batch that answers each question with (question, batch number) after ``delay`` seconds."""

    def __init__(self, delay=0.0, fail_on=None):
        self.batches, self.delay, self.fail_on = [], delay, fail_on
        self.threads = set()

    def __call__(self, key, questions):
        self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        self.batches.append((key, list(questions)))
        if self.fail_on is not None and self.fail_on in questions:
            raise RuntimeError(f"cannot answer {self.fail_on}")
        return [(q, len(self.batches)) for q in questions]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_concurrent_requests_share_an_engine_call_and_keep_their_order():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch_size=64, max_wait_ms=200)
        b.start()
        outs = await asyncio.gather(*(b.submit("cfg", [f"q{i}a", f"q{i}b"]) for i in range(5)))
        await b.stop()
        return outs

    outs = run(main())
    assert len(rec.batches) == 1 and len(rec.batches[0][1]) == 10  # 5 requests, one call
    for i, out in enumerate(outs):
        assert [q for q, _ in out] == [f"q{i}a", f"q{i}b"]


def test_a_full_batch_does_not_wait_for_max_wait():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch_size=4, max_wait_ms=10_000)
        b.start()
        t0 = time.perf_counter()
        await asyncio.gather(*(b.submit("cfg", [i]) for i in range(8)))
        elapsed = time.perf_counter() - t0
        await b.stop()
        return elapsed

    elapsed = run(main())
    assert [len(q) for _, q in rec.batches] == [4, 4]
    assert elapsed < 5  # far below the 10 s max_wait: full batches go at once


def test_batches_never_exceed_max_batch_size_and_big_requests_are_split():
    rec = Recorder(delay=0.01)

    async def main():
        b = Batcher(rec, max_batch_size=3, max_wait_ms=20)
        b.start()
        big = b.submit("cfg", list(range(10)))
        small = [b.submit("cfg", [100 + i]) for i in range(5)]
        outs = await asyncio.gather(big, *small)
        await b.stop()
        return outs

    outs = run(main())
    assert all(len(q) <= 3 for _, q in rec.batches)
    assert [q for q, _ in outs[0]] == list(range(10))
    assert sorted(q for _, qs in rec.batches for q in qs) == list(range(10)) + [100 + i for i in range(5)]


def test_different_settings_never_share_a_batch():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch_size=64, max_wait_ms=100)
        b.start()
        await asyncio.gather(*(b.submit(("delta", d), [f"{d}-{i}"]) for i in range(3) for d in (0.3, 0.4)))
        await b.stop()

    run(main())
    assert len(rec.batches) == 2
    for key, qs in rec.batches:
        assert all(q.startswith(f"{key[1]}-") for q in qs)


def test_engine_runs_on_one_thread_that_is_not_the_event_loop():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch_size=2, max_wait_ms=1)
        b.start()
        await asyncio.gather(*(b.submit("k", [i]) for i in range(6)))
        loop_thread = threading.get_ident()
        other = await b.call(threading.get_ident)
        await b.stop()
        return loop_thread, other

    loop_thread, other = run(main())
    assert rec.threads == {other} and other != loop_thread


def test_a_request_that_gave_up_before_its_batch_costs_no_engine_time():
    rec = Recorder(delay=0.3)

    async def main():
        b = Batcher(rec, max_batch_size=1, max_wait_ms=0)
        b.start()
        first = asyncio.ensure_future(b.submit("k", ["busy"]))
        await asyncio.sleep(0.05)  # the engine is now busy with "busy"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.submit("k", ["abandoned"]), 0.05)
        await first
        await b.submit("k", ["after"])
        await b.stop()

    run(main())
    assert [qs for _, qs in rec.batches] == [["busy"], ["after"]]


def test_an_engine_error_reaches_every_request_of_its_batch_and_the_batcher_goes_on():
    rec = Recorder(fail_on="bad")

    async def main():
        b = Batcher(rec, max_batch_size=8, max_wait_ms=100)
        b.start()
        res = await asyncio.gather(b.submit("k", ["good"]), b.submit("k", ["bad"]), return_exceptions=True)
        after = await b.submit("k", ["later"])
        await b.stop()
        return res, after

    res, after = run(main())
    assert all(isinstance(r, RuntimeError) and "cannot answer bad" in str(r) for r in res)
    assert after[0][0] == "later"


def test_stop_answers_what_is_queued_first():
    rec = Recorder(delay=0.05)

    async def main():
        b = Batcher(rec, max_batch_size=1, max_wait_ms=0)
        b.start()
        pending = [asyncio.ensure_future(b.submit("k", [i])) for i in range(4)]
        await asyncio.sleep(0.01)
        await b.stop()
        return await asyncio.gather(*pending)  # all answered, none failed

    outs = run(main())
    assert [o[0][0] for o in outs] == [0, 1, 2, 3]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        Batcher(Recorder(), max_batch_size=0)
    with pytest.raises(ValueError, match="max_wait_ms"):
        Batcher(Recorder(), max_wait_ms=-1)


def _closed_loop(gather_ms, clients=8, rounds=12, delay=0.04, think=0.001):
    """``clients`` closed-loop clients against an engine that takes ``delay`` s a call: client c sends its next
    question (c + 1) * ``think`` s after its answer (as a network spreads them). Returns the batch sizes."""
    rec = Recorder(delay=delay)

    async def client(b, c):
        for r in range(rounds):
            await b.submit("cfg", [f"c{c}r{r}"])
            await asyncio.sleep(think * (c + 1))

    async def main():
        b = Batcher(rec, max_batch_size=64, gather_ms=gather_ms)
        b.start()
        await asyncio.gather(*(client(b, c) for c in range(clients)))
        await b.stop()

    run(main())
    return [len(q) for _, q in rec.batches]


def test_gather_waits_for_the_clients_just_answered():
    """Without gather_ms closed-loop clients split into two halves that alternate on the engine; with it a batch
    waits (at most a quarter of the last call, here 10 ms) for the answered ones and holds them all."""
    plain = _closed_loop(0)
    gathered = _closed_loop(50)
    assert sum(plain) == sum(gathered) == 8 * 12
    assert max(plain[1:]) < 8  # after the first call the answers come back spread out: never all together
    assert sum(1 for n in gathered if n == 8) >= 8, gathered  # whole batches once the clients are all in
    assert len(gathered) < len(plain)


def test_gather_does_not_delay_a_lone_client():
    """One client at a time: never fewer queued than were inside at once, so no gathering wait."""
    rec = Recorder(delay=0.2)

    async def main():
        b = Batcher(rec, max_batch_size=64, gather_ms=1000)  # at most 50 ms after a 200 ms call
        b.start()
        t0 = time.perf_counter()
        for i in range(5):
            await b.submit("cfg", [i])
        elapsed = time.perf_counter() - t0
        await b.stop()
        return elapsed

    elapsed = run(main())
    assert elapsed < 5 * 0.2 + 0.15, elapsed  # a wait after each call would add 4 x 50 ms
    assert [len(q) for _, q in rec.batches] == [1] * 5
    with pytest.raises(ValueError, match="gather_ms"):
        Batcher(rec, gather_ms=-1)


def test_gather_does_not_wait_for_the_rest_of_a_request_in_parts():
    """Closed-loop clients beside a heavy request split into parts: a batch waits for the clients just answered and
    that request's next part, not for all its questions (counted, they made every batch wait its whole allowance,
    a quarter of the last call's time, in vain, and the engine idled in the heavy mix: docs/serving.md)."""
    starts = []

    def run_batch(key, questions):
        starts.append((time.perf_counter(), list(questions)))
        time.sleep(0.06)
        return questions

    async def client(b, c, stop):
        r = 0
        while not stop.is_set():
            await b.submit("cfg", [f"c{c}r{r}"])
            r += 1

    async def main():
        b = Batcher(run_batch, max_batch_size=16, gather_ms=1000, heavy_share=0.5, heavy_cost=7,
                    cost=lambda key, q: 2.0 if q.startswith("big") else 1.0)  # the allowance: 15 ms
        b.start()
        stop = asyncio.Event()
        clients = [asyncio.ensure_future(client(b, c, stop)) for c in range(3)]
        await asyncio.sleep(0.2)  # the light batches' time is known: the big request goes in parts
        await b.submit("cfg", [f"big{i}" for i in range(40)])
        stop.set()
        await asyncio.gather(*clients)
        await b.stop()

    run(main())
    with_big = [i for i, (_, q) in enumerate(starts) if any(x.startswith("big") for x in q)]
    assert len(with_big) >= 4  # in parts
    gaps = [starts[i][0] - starts[i - 1][0] - 0.06 for i in with_big[1:]]
    assert sorted(gaps)[len(gaps) // 2] < 0.008, gaps  # the median gap: no allowance spent waiting


def test_groups_share_the_engine_and_a_busy_one_does_not_starve_a_quiet_one():
    """A store's indexes (group = the key's first part): while a busy index has many batches queued, a quiet
    index's question goes in the next batch, not after all of them; batches never mix groups."""
    rec = Recorder(delay=0.02)

    async def main():
        b = Batcher(rec, max_batch_size=2, max_wait_ms=0, group=lambda key: key[0])
        b.start()
        busy = [asyncio.ensure_future(b.submit(("B", "cfg"), [f"b{i}"])) for i in range(40)]
        await asyncio.sleep(0.05)  # the busy index's queue is long now
        quiet = await b.submit(("A", "cfg"), ["a0"])
        position = len(rec.batches)
        await asyncio.gather(*busy)
        await b.stop()
        return quiet, position

    quiet, position = run(main())
    assert quiet[0][0] == "a0"
    assert position <= 5, position  # within a batch or two of its arrival, not after the ~20 busy batches
    assert all(not (any(q.startswith("a") for q in qs) and any(q.startswith("b") for q in qs)) for _, qs in rec.batches)
    # without groups the same quiet question waits behind the busy queue (FIFO)
    rec2 = Recorder(delay=0.02)

    async def fifo():
        b = Batcher(rec2, max_batch_size=2, max_wait_ms=0)
        b.start()
        busy = [asyncio.ensure_future(b.submit(("B", "cfg"), [f"b{i}"])) for i in range(40)]
        await asyncio.sleep(0.05)
        await b.submit(("A", "cfg"), ["a0"])
        position = len(rec2.batches)
        await asyncio.gather(*busy)
        await b.stop()
        return position

    assert run(fifo()) > 10


def test_a_busy_group_is_bounded_in_time_while_a_quieter_one_is_active(monkeypatch):
    """With groups (a store's indexes): while a quiet index's closed-loop client is active, the busy index's
    batches are cut to about the quiet one's batch time (here a question's worth, at least an eighth of
    max_batch_size), so the quiet client waits behind about one short batch per question instead of a full one;
    the busy index alone, before and after, runs full batches."""
    import linearrag_torch.serve.batcher as batcher_module

    monkeypatch.setattr(batcher_module, "GROUP_ACTIVE_S", 0.3)

    class PerQuestion(Recorder):  # an engine whose time grows with the batch
        def __call__(self, key, questions):
            time.sleep(0.004 * len(questions))
            return super().__call__(key, questions)

    rec = PerQuestion()

    async def main():
        b = Batcher(rec, max_batch_size=16, max_wait_ms=0, group=lambda key: key[0])
        b.start()
        busy = [asyncio.ensure_future(b.submit(("B", "cfg"), [f"b{i}"])) for i in range(600)]
        while len(rec.batches) < 4:  # B alone for a few batches
            await asyncio.sleep(0.005)
        first_a = len(rec.batches)
        for i in range(12):  # one closed-loop client of A
            await b.submit(("A", "cfg"), [f"a{i}"])
        last_a = len(rec.batches)
        await asyncio.gather(*busy)
        await b.stop()
        return first_a, last_a

    first_a, last_a = run(main())
    sizes = [(k[0], len(q)) for k, q in rec.batches]
    assert all(n == 16 for g, n in sizes[:first_a]), sizes[:first_a]  # B alone: full batches
    a_at = [i for i, (g, _) in enumerate(sizes) if g == "A"]
    assert len(a_at) == 12 and a_at[-1] < last_a
    between = sizes[a_at[0] + 1:a_at[-1]]
    assert all(n <= 8 for g, n in between if g == "B"), between  # cut to about A's batch time
    assert all(j - i <= 3 for i, j in itertools.pairwise(a_at)), a_at  # A waits behind a short batch or two a question
    assert all(g == "B" and n == 16 for g, n in sizes[-4:-1]), sizes[-4:]  # A gone: B's full batches again


def test_a_group_back_from_idle_brings_no_credit():
    """An index that had the engine to itself (8 closed-loop clients) is not made to wait, when a busy index comes
    back with a long queue, for the busy one's engine seconds to catch up with its own: its questions go within a
    batch or two of the busy index's from the start (without the lift it waited behind many full batches)."""

    class PerQuestion(Recorder):
        def __call__(self, key, questions):
            time.sleep(0.004 * len(questions))
            return super().__call__(key, questions)

    rec = PerQuestion()

    async def main():
        b = Batcher(rec, max_batch_size=16, max_wait_ms=0, group=lambda key: key[0])
        b.start()
        stop = asyncio.Event()

        async def client(i):  # one of A's closed-loop clients
            k = 0
            while not stop.is_set():
                await b.submit(("A", "cfg"), [f"a{i}-{k}"])
                k += 1

        clients = [asyncio.ensure_future(client(i)) for i in range(8)]
        while len(rec.batches) < 40:  # A alone: ~1.3 s of engine time to its name
            await asyncio.sleep(0.01)
        b_from = len(rec.batches)
        busy = [asyncio.ensure_future(b.submit(("B", "cfg"), [f"b{i}"])) for i in range(400)]
        while len([1 for k, _ in rec.batches[b_from:] if k[0] == "B"]) < 12:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*clients)
        await asyncio.gather(*busy)
        await b.stop()
        return b_from

    b_from = run(main())
    after = [k[0] for k, _ in rec.batches[b_from:]]
    first_b = after.index("B")
    runs_of_b, n = [], 0
    for g in after[first_b:]:
        if g == "B":
            n += 1
        else:
            runs_of_b.append(n)
            n = 0
    assert runs_of_b and max(runs_of_b[:6]) <= 2, after[:40]  # A's clients wait behind a batch or two of B's
