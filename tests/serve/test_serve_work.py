"""Admission by work (issue 39, section 3): a request's cost in work units computed by hand, the work budget and
its heavy share (unit), the batcher's parts by work queued behind what came meanwhile, and a real server on
127.0.0.1 where heavy requests borrow the light share until a light request is refused, and the next heavy one
is refused with 429 and Retry-After."""
import asyncio
import math
import threading
import time
from types import SimpleNamespace

import pytest

from linearrag_torch.serve.admission import Admission, question_cost, request_cost
from linearrag_torch.serve.batcher import Batcher


def test_a_requests_cost_by_hand():
    assert question_cost(100, 5, False) == 1.0  # the light request: one short question, top_k 5
    assert question_cost(300, 5, False) == 2.0  # 300 / 150 characters
    assert question_cost(150, 100, False) == 2.0  # top_k 100 / 50
    assert question_cost(75, 5, True) == 21.0  # 1 + RERANK_WEIGHT 20
    assert question_cost(600, 100, True) == 4 * 2 * 21
    assert request_cost(["a" * 300, "b" * 10], 10, False) == 3.0
    assert request_cost(["q" * 1000] * 16, 100, False) == pytest.approx(16 * (1000 / 150) * 2)
    # rerank in proportion to the pairs the reranker reads (10 by default: 5 in the chain round, 5 at the end)
    assert question_cost(75, 5, True, pairs=32) == 1 + 20 * 3.2
    assert question_cost(75, 5, False, pairs=32) == 1.0


def test_the_engine_host_counts_the_reranker_pairs_of_a_requests_settings():
    pytest.importorskip("prometheus_client")  # the engine host's metrics: the serve extra
    from linearrag_torch.config import RetrievalConfig
    from linearrag_torch.serve.admission import rerank_pairs
    from linearrag_torch.serve.engine_host import LocalEngineHost

    assert rerank_pairs(RetrievalConfig()) == 10  # the defaults: 5 + 5 x 1 round
    assert rerank_pairs(RetrievalConfig(rerank_candidates=27, chain_rounds=2)) == 27 + 5 * 2
    assert rerank_pairs(RetrievalConfig(chain_passages=0, rerank_candidates=7)) == 7  # no chain, no loop
    host = LocalEngineHost(rag=SimpleNamespace(config=RetrievalConfig()))
    assert host.question_cost((), ("q", 5)) == 1.0
    assert host.question_cost((("rerank", True),), ("q", 5)) == 21.0
    assert host.question_cost((("rerank", True), ("rerank_candidates", 27)), ("q", 5)) == pytest.approx(1 + 20 * 3.2)
    assert host.question_cost((("rerank", True), ("rerank_candidates", 27), ("reranker", "x")), ("q", 5)) == \
        pytest.approx(1 + 20 * 3.2)  # a setting that does not change the pairs


def test_places_beyond_max_concurrent_are_kept_only_by_heavy_requests():
    """Light clients answered fast and back at once take every place that frees: the heavy requests' places
    beyond max_concurrent (heavy_share of it) are taken before the body is read, and a request whose body shows it
    light goes on only while fewer than max_concurrent light ones are in (a heavy request in one of the first
    max_concurrent places leaves a heavy place to a light one: it cost the light ones a place each in the mix)."""
    a = Admission(max_concurrent=4, max_work=64, heavy_share=0.5)  # 2 heavy places beyond the 4
    assert a.heavy_places == 2
    tickets = []
    for _ in range(3):  # three light requests in
        a.in_flight += 1
        assert a.refusal(30.0, 1.0, admitted=True, cost=1.0) is None
        tickets.append(a.take(1.0))
    assert a.light_in_flight == 3
    a.in_flight += 1  # the 4th place: a heavy request's
    assert a.refusal(30.0, 10.0, admitted=True, cost=10.0) is None
    heavy = a.take(10.0)
    assert a.refusal(30.0) is None  # the 5th place, taken before the body
    a.in_flight += 1  # ... by a light request, the 4th light one: it goes on
    assert a.refusal(30.0, 1.0, admitted=True, cost=1.0) is None
    tickets.append(a.take(1.0))
    a.in_flight += 1  # the 6th: a 5th light request gives it back
    why, _ = a.refusal(30.0, 1.0, admitted=True, cost=1.0)
    assert "more than 4 requests in flight" in why
    assert a.refusal(30.0, 10.0, admitted=True, cost=10.0) is None  # ... a heavy one keeps it
    why, _ = a.refusal(30.0)  # 4 + 2 places taken: refused before the body
    assert "more than 4 requests in flight" in why
    a.give_back(tickets.pop())
    assert a.light_in_flight == 3 and a.refusal(30.0, 1.0, admitted=True, cost=1.0) is None
    a.give_back(heavy)
    assert a.work == {"light": 3.0, "heavy": 0.0}
    assert Admission(max_concurrent=4, heavy_share=0.0).heavy_places == 0


def test_heavy_requests_hold_their_share_and_light_ones_borrow_it_until_heavy_ones_want_it(monkeypatch):
    from linearrag_torch.serve import admission

    clock = [1000.0]
    monkeypatch.setattr(admission.time, "monotonic", lambda: clock[0])
    a = Admission(max_concurrent=64, max_work=64, heavy_share=0.25)  # heavy share 16 units, light 48
    for _ in range(8):
        a.on_batch(SimpleNamespace(size=4, work=8.0, engine_s=0.4, error=None))  # 0.05 s per unit
    assert a.seconds_per_question() == pytest.approx(0.05)
    heavy = [a.take(10.0)]  # 10 units: heavy
    assert a.kind(10.0) == "heavy" and a.kind(8.0) == "light"
    lights = []
    for _ in range(54):  # the light ones fill the rest of the budget, borrowing the heavy share's free 6 units
        assert a.refusal(30.0, 1.0, admitted=True, cost=1.0) is None
        lights.append(a.take(1.0))
    assert a.work == {"light": 54.0, "heavy": 10.0}
    why, after = a.refusal(30.0, 1.0, admitted=True, cost=1.0)
    assert "budget is full" in why and after == 1
    for t in heavy + lights[:4]:
        a.give_back(t)  # 50 light units inside
    why, _ = a.refusal(30.0, 20.0, admitted=True, cost=20.0)  # counts as the whole share, 16: 50 + 16 > 64
    assert "budget is full" in why
    why, _ = a.refusal(30.0, 1.0, admitted=True, cost=1.0)  # a heavy one waits: the light ones stop borrowing
    assert "light requests' share" in why
    for t in lights[4:6]:
        a.give_back(t)  # 48: their own share, all of it
    assert a.refusal(30.0, 1.0, admitted=True, cost=1.0) is not None
    assert a.refusal(30.0, 20.0, admitted=True, cost=20.0) is None  # 48 + 16 = 64: the heavy one gets in
    big = a.take(500.0)
    assert big == ("heavy", 16.0) and a.work["heavy"] == 16.0
    clock[0] += admission.CROWD_WINDOW_S + 1  # no heavy request refused lately: the light ones may borrow again
    a.give_back(big)
    assert a.refusal(30.0, 1.0, admitted=True, cost=1.0) is None


def test_heavy_requests_alone_fill_the_budget_and_give_the_light_share_back_when_light_ones_want_it(monkeypatch):
    """Heavy requests alone were refused past their share with the engine idle (4 clients of 24 questions got 18
    refusals in 24 requests on Ray Serve): each class borrows the other's share while the other is not refused."""
    from linearrag_torch.serve import admission

    clock = [1000.0]
    monkeypatch.setattr(admission.time, "monotonic", lambda: clock[0])
    a = Admission(max_concurrent=64, max_work=64, heavy_share=0.25)  # heavy share 16 units, light 48
    heavy = []
    for _ in range(4):  # four heavy requests, each as large as the share: the whole budget, none refused
        assert a.refusal(30.0, 24.0, admitted=True, cost=24.0) is None
        heavy.append(a.take(24.0))
    assert a.work == {"light": 0.0, "heavy": 64.0}
    why, _ = a.refusal(30.0, 24.0, admitted=True, cost=24.0)
    assert "budget is full" in why
    why, _ = a.refusal(30.0, 1.0, admitted=True, cost=1.0)  # a light one, within its share: the heavy ones stop
    assert "budget is full" in why  # borrowing
    a.give_back(heavy.pop())  # 48 heavy units inside, 16 free
    why, _ = a.refusal(30.0, 24.0, admitted=True, cost=24.0)  # the free units are the light share's now
    assert "heavy requests' share" in why
    assert a.refusal(30.0, 1.0, admitted=True, cost=1.0) is None
    light = a.take(1.0)
    clock[0] += admission.CROWD_WINDOW_S + 1  # no light request refused lately: the heavy ones borrow again
    assert a.refusal(30.0, 15.0, admitted=True, cost=15.0) is None
    a.give_back(light)


def test_a_heavy_requests_parts_go_by_work_behind_the_light_ones_that_came_meanwhile():
    batches = []

    def run_batch(key, questions):
        batches.append(list(questions))
        time.sleep(0.05)
        return questions

    async def main():
        b = Batcher(run_batch, max_batch_size=8, cost=lambda key, q: 4.0 if q.startswith("heavy") else 1.0)
        b.start()
        heavy = asyncio.ensure_future(b.submit((), [f"heavy{i}" for i in range(6)]))  # 3 parts of 2 (8 units)
        await asyncio.sleep(0.02)  # its first part is on the engine
        lights = [asyncio.ensure_future(b.submit((), [f"light{i}"])) for i in range(3)]
        out = await asyncio.gather(heavy, *lights)
        await b.stop()
        return out

    out = asyncio.run(main())
    assert out[0] == [f"heavy{i}" for i in range(6)]
    assert batches[0] == ["heavy0", "heavy1"]  # the lights came during it: they go before its second part
    assert batches[1] == ["light0", "light1", "light2"]
    assert batches[2:] == [["heavy2", "heavy3"], ["heavy4", "heavy5"]]


def test_while_both_classes_wait_the_batch_starts_from_the_one_below_its_share_of_the_work():
    """With heavy_share 0.25, a batch starts from the oldest heavy part only while the heavy requests have run
    less than a quarter of the recent work, else from the oldest light request (the heavy part is older in both
    cases); the engine's seconds of each batch are counted per class, decaying."""
    from linearrag_torch.serve.batcher import SERVED_TAU_S, _Entry

    loop = asyncio.new_event_loop()
    try:
        b = Batcher(lambda key, qs: qs, max_batch_size=8, cost=lambda key, q: 1.0, heavy_share=0.25, heavy_cost=8)
        heavy = _Entry((), ["h"] * 8, loop.create_future(), 8.0, heavy=True)
        light = _Entry((), ["l"], loop.create_future(), 1.0)
        b._served = {False: 3.0, True: 1.5}  # heavy 33% > 25%: the light one first, alone (8 + 1 > 8)
        b._queue.extend([heavy, light])
        b._waiting = 9
        assert b._take() == [light] and list(b._queue) == [heavy]
        b._served = {False: 3.0, True: 0.5}  # heavy 14% < 25%: the heavy part
        b._queue.append(light)
        assert b._take() == [heavy]
        # a heavy part small enough to ride in a light batch rides only while the heavy ones are below their share
        # (one heavy question in every light batch took a third of the engine in the heavy mix)
        small = _Entry((), ["h"], loop.create_future(), 4.0, heavy=True)
        b._queue.clear()
        b._queue.extend([light, small])
        b._served = {False: 3.0, True: 1.5}
        assert b._take() == [light] and list(b._queue) == [small]
        b._queue.append(light)
        b._served = {False: 3.0, True: 0.5}
        assert b._take() == [small, light]
        b._queue.clear()
        b._queue.extend([heavy, light])
        b.heavy_share = None  # without a share: the oldest, as before
        assert b._take() == [heavy]
    finally:
        loop.close()
    served = []

    def run(key, qs):
        time.sleep(0.02 * len(qs))
        return qs

    async def main():
        c = Batcher(run, max_batch_size=8, cost=lambda key, q: 4.0 if q == "h" else 1.0,
                    heavy_share=0.25, heavy_cost=7)
        c.start()
        await asyncio.gather(c.submit((), ["h", "h"]), c.submit((), ["l"]))  # one heavy part of 8 units, 1 light
        served.append(dict(c._served))
        await c.stop()

    asyncio.run(main())
    # nothing served yet: the heavy part is not below its share (0 < 0), the light one goes first, then the heavy;
    # each counts the engine's seconds of its batch (the sleeps: at least this long), the light one's decayed by the
    # heavy batch's seconds
    assert served[0][True] >= 0.04 and served[0][False] >= 0.02 * math.exp(-1.0 / SERVED_TAU_S)


def test_served_seconds_decay_with_engine_time_and_heavy_parts_shrink_to_a_light_batchs_time():
    """A decay per batch let one heavy part of seconds weigh as little as a light batch of a tenth of that (the heavy
    requests took ~70% of the engine with a 25% share): the decay runs on engine seconds. A heavy request's parts,
    while light batches run, hold what the engine runs in a light batch's time at the heavy parts' measured pace."""
    from linearrag_torch.serve.batcher import PACE_WEIGHT, SERVED_TAU_S, _Entry

    loop = asyncio.new_event_loop()
    try:
        b = Batcher(lambda key, qs: qs, max_batch_size=8, cost=lambda key, q: 4.0, heavy_share=0.25, heavy_cost=7)
        assert list(b._parts(["a", "b", "c"], [4.0, 4.0, 4.0], True)) == [(["a", "b"], 8.0, False), (["c"], 4.0, True)]
        b._served = {False: 2.0, True: 1.0}
        b._account([_Entry((), ["h", "h"], loop.create_future(), 8.0, heavy=True)], 10.0, True)
        e = math.exp(-10.0 / SERVED_TAU_S)
        assert b._served[True] == pytest.approx(1.0 * e + 10.0) and b._served[False] == pytest.approx(2.0 * e)
        assert b._heavy_pace == pytest.approx(10.0 / 8)  # seconds per unit
        assert b._part_units(True) == 8.0  # no light batch yet: a whole batch of units
        b._account([_Entry((), ["l"], loop.create_future(), 1.0)], 0.5, True)
        b._account([_Entry((), ["l"], loop.create_future(), 1.0)], 1.0, True)
        assert b._light_batch_s == pytest.approx((1 - PACE_WEIGHT) * 0.5 + PACE_WEIGHT * 1.0)
        assert b._part_units(True) == pytest.approx(b._light_batch_s / 1.25) and b._part_units(False) == 8.0
        assert list(b._parts(["a", "b", "c"], [4.0, 4.0, 4.0], True)) == [
            (["a"], 4.0, False), (["b"], 4.0, False), (["c"], 4.0, True)]
        assert list(b._parts(["a", "b", "c"], [0.2, 0.2, 0.2], True)) == [(["a", "b"], 0.4, False), (["c"], 0.2, True)]
        b._account([_Entry((), ["h"], loop.create_future(), 8.0, heavy=True)], 4.0, False)  # a failed batch: no pace
        assert b._heavy_pace == pytest.approx(10.0 / 8)
    finally:
        loop.close()


def test_a_server_lends_the_light_share_to_heavy_requests_until_a_light_one_is_refused(small_rag):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from test_serve import TIMEOUT, slow_serving

    heavy = {"questions": ["Who directed the film " + "x" * 280] * 5}  # 5 x 2 units: heavy, over its share of 8
    with slow_serving(small_rag, 1.5, max_work=16, heavy_share=0.5, max_batch_size=64, refusal_delay=0.0) as (
            url, service):
        answers = []

        def post(body):
            t = threading.Thread(target=lambda: answers.append(httpx.post(url + "/v1/search", json=body,
                                                                          timeout=TIMEOUT)))
            t.start()
            return t

        def wait_for_heavy_work(units):
            deadline = time.monotonic() + TIMEOUT
            while service.front.admission.work["heavy"] < units:
                assert time.monotonic() < deadline
                time.sleep(0.01)

        first = post(heavy)
        wait_for_heavy_work(8)  # the heavy share, all of it
        second = post(heavy)  # no light request refused: it borrows the light share (the engine is on the first for
        wait_for_heavy_work(16)  # 1.5 s, then on it for 1.5 s)
        refused = httpx.post(url + "/v1/search", json={"question": "Who directed it?"}, timeout=TIMEOUT)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "budget is full" in refused.json()["detail"]
        first.join(TIMEOUT)  # 8 units free: the light ones want their share back, no heavy request borrows it
        third = httpx.post(url + "/v1/search", json=heavy, timeout=TIMEOUT)
        assert third.status_code == 429 and "heavy requests' share" in third.json()["detail"]
        light = httpx.post(url + "/v1/search", json={"question": "Who directed it?"}, timeout=TIMEOUT)
        assert light.status_code == 200
        second.join(TIMEOUT)
        assert [a.status_code for a in answers] == [200, 200]
        assert all(len(a.json()["results"]) == 5 for a in answers)
        assert service.front.admission.work == {"light": 0.0, "heavy": 0.0}
        info = httpx.get(url + "/info", timeout=TIMEOUT).json()["admission"]
        assert info["max_work"] == 16 and info["work_inside"] == {"light": 0.0, "heavy": 0.0}
        # the engine's seconds by class: each call here sleeps 1.5 s; two heavy requests and one light one answered
        # (the light one in a call of its own, or in a heavy one's with its share of that call's units)
        from prometheus_client.parser import text_string_to_metric_families

        seconds = {s.labels["class"]: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                   if f.name == "linearrag_engine_class_seconds" for s in f.samples if s.name.endswith("_total")}
        assert seconds["heavy"] > seconds["light"] > 0 and seconds["heavy"] + seconds["light"] >= 2 * 1.5, seconds



def test_a_heavy_request_into_an_idle_heavy_class_brings_no_credit():
    """After a spell of light batches only, the heavy class's decayed seconds are far below its share: the first
    heavy request after it ran part after part (2 s of them in the reranked heavy mix) while light ones waited.
    It comes in at its share of the light seconds instead; one that comes while another is inside is not lifted."""
    b = Batcher(lambda key, qs: qs, max_batch_size=8, cost=lambda key, q: 1.0, heavy_share=0.25, heavy_cost=7)
    b._served = {False: 9.0, True: 0.5}
    b._arrives_heavy()
    assert b._served[True] == pytest.approx(0.25 / 0.75 * 9.0) and not b._heavy_below_share()
    b._served[True] = 1.0  # it ran, time passed: a second heavy request while the first is inside keeps the count
    b._arrives_heavy()
    assert b._served[True] == 1.0 and b._heavy_inside == 2
    b._heavy_inside = 0
    b._served = {False: 1.0, True: 5.0}  # above its share already: unchanged
    b._arrives_heavy()
    assert b._served[True] == 5.0

    async def main():  # the count of heavy requests inside comes back to 0, answered or cancelled
        c = Batcher(lambda key, qs: (time.sleep(0.05), qs)[1], max_batch_size=2, heavy_share=0.25, heavy_cost=3,
                    cost=lambda key, q: 1.0)
        c.start()
        await c.submit((), ["a", "b", "c", "d"])
        assert c._heavy_inside == 0
        task = asyncio.ensure_future(c.submit((), ["a", "b", "c", "d"]))
        await asyncio.sleep(0.01)
        assert c._heavy_inside == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c._heavy_inside == 0
        await c.stop()

    asyncio.run(main())
