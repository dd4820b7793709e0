"""`linearrag serve` and its library pieces, on real uvicorn servers on 127.0.0.1 with the small index.

Results are checked against LinearRAG.search in process; every limit and error path of the HTTP API; a
reload under concurrent load; SIGTERM drain of the real command; mounting into another FastAPI app.
"""
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app  # noqa: E402

TIMEOUT = 60  # seconds any single wait in these tests may take


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_in_thread(server) -> threading.Thread:
    """Run a uvicorn.Server in a daemon thread; returns once it has started."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    return thread


def wait_healthy(proc, url: str, seconds: float) -> None:
    """Until the server process ``proc`` answers GET /health with 200 (fails if it exits or takes longer)."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.2)


@contextmanager
def running(app):
    """Serve ``app`` with uvicorn on 127.0.0.1 in a thread; yields the base URL; stops it afterwards."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = start_in_thread(server)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


def wait_ready(url, headers=None):
    deadline = time.monotonic() + TIMEOUT
    while True:
        r = httpx.get(url + "/health", headers=headers)
        if r.status_code == 200:
            return r.json()
        assert time.monotonic() < deadline, f"not ready: {r.text}"
        time.sleep(0.05)


@contextmanager
def serving(small_rag, index_dir=None, **settings):
    service = LinearRAGService(index_dir, ServeSettings(**settings), rag=small_rag)
    with running(create_app(service)) as url:
        wait_ready(url)
        yield url, service


def as_pairs(hits):
    return [(h["id"], h["title"], h["score"]) for h in hits]


def expected(rag, questions, top_k=5, **overrides):
    return [[(h.id, h.title, h.score) for h in hs] for hs in rag.search(questions, top_k=top_k, **overrides)]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [x[:2] for x in g] == [x[:2] for x in w]
        assert all(abs(a[2] - b[2]) < 1e-5 for a, b in zip(g, w))


# ------------------------------------------------------------------------------------------ results
def test_results_equal_rag_search(small_rag, small_questions):
    qs = [q["question"] for q in small_questions]
    with serving(small_rag) as (url, _):
        r = httpx.post(url + "/v1/search", json={"questions": qs, "top_k": 4, "include_text": True}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert [x["question"] for x in res] == qs
        assert_same([as_pairs(x["hits"]) for x in res], expected(small_rag, qs, top_k=4))
        texts = {h.id: h.text for hs in small_rag.search(qs, top_k=4) for h in hs}
        assert all(h["text"] == texts[h["id"]] for x in res for h in x["hits"])
        one = httpx.post(url + "/v1/search", json={"question": qs[0]}, timeout=TIMEOUT).json()["results"]
        assert len(one) == 1 and "text" not in one[0]["hits"][0]
        assert len(one[0]["hits"]) == small_rag.config.top_k
        paper = httpx.post(url + "/v1/search", json={"question": qs[1], "mode": "paper", "delta": 0.3},
                           timeout=TIMEOUT).json()["results"]
        assert_same([as_pairs(paper[0]["hits"])], expected(small_rag, [qs[1]], mode="paper", delta=0.3))


def test_ner_worker_processes_give_the_same_results(small_rag):
    """--ner-processes 2: a batch of 40 questions has its NER split over two worker processes, with the hits of
    NER on the engine thread; the service stops the processes when it stops."""
    from conftest import demo_questions

    qs = [q["question"] for q in demo_questions()]
    want = expected(small_rag, qs, top_k=3)  # before the service starts the pool on small_rag
    with serving(small_rag, ner_processes=2) as (url, service):
        pool = small_rag.ner_pool
        assert pool is not None and pool.running and pool.processes == 2 and not pool.caller_part
        r = httpx.post(url + "/v1/search", json={"questions": qs, "top_k": 3}, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert_same([as_pairs(x["hits"]) for x in r.json()["results"]], want)
        assert httpx.get(url + "/info", timeout=TIMEOUT).json()["server"]["ner_processes"] == 2
    assert not pool.running and small_rag.ner_pool is None


def test_an_answer_does_not_depend_on_the_batch_it_rode_in(small_rag, small_questions):
    qs = [q["question"] for q in small_questions]
    alone = [expected(small_rag, [q], top_k=5)[0] for q in qs]
    with serving(small_rag, max_wait_ms=300, max_batch_size=64) as (url, service):
        async def burst():
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                # different top_k per request: they still share the batch (top-k is a prefix)
                rs = await asyncio.gather(*(client.post(url + "/v1/search", json={"question": q, "top_k": 3 + i % 3})
                                            for i, q in enumerate(qs)))
                return [r.json()["results"][0]["hits"] for r in rs]

        got = asyncio.run(burst())
        batch_sizes = service.metrics.batch_size.collect()[0].samples
        largest = max(s.value for s in batch_sizes if s.name.endswith("_sum"))
    for i, (g, a) in enumerate(zip(got, alone)):
        assert_same([as_pairs(g)], [a[:3 + i % 3]])
    assert largest > 1, "the concurrent requests were not batched together"


# ------------------------------------------------------------------------------------------ limits
@pytest.mark.parametrize("body, field", [
    ({"questions": []}, "questions"),
    ({"question": ""}, "question"),
    ({"question": "   "}, "blank"),
    ({"question": "x" * 201}, "question"),
    ({"questions": ["q"] * 6}, "questions"),
    ({"question": "q", "top_k": 0}, "top_k"),
    ({"question": "q", "top_k": 11}, "top_k"),
    ({"question": "q", "foo": 1}, "foo"),
    ({"question": "q", "damping": 1.5}, "damping"),
    ({"question": "q", "mode": "fast"}, "mode"),
    ({"question": "q", "ppr_max_iter": 10 ** 9}, "ppr_max_iter"),
    ({"question": "q", "chain_rounds": 50}, "chain_rounds"),
    ({"question": "q", "ann": "hnsw"}, "ann"),  # the operator's (an index build per request)
    ({"question": "q", "ann_cache": "/tmp"}, "ann_cache"),
    ({"question": "q", "ann_probe": 10 ** 6}, "ann_probe"),
    ({"question": "q", "questions": ["r"]}, "exactly one"),
    ({}, "exactly one"),
    (["q"], "body"),
])
def test_invalid_bodies_get_422_naming_the_field(small_rag, body, field, limited_server):
    r = httpx.post(limited_server + "/v1/search", json=body, timeout=TIMEOUT)
    assert r.status_code == 422, r.text
    assert field in r.text


@pytest.fixture(scope="module")
def limited_server(small_rag):
    with serving(small_rag, max_questions=5, max_question_chars=200, max_top_k=10, max_body_bytes=4096) as (url, _):
        yield url


def test_bad_json_and_large_bodies(limited_server):
    r = httpx.post(limited_server + "/v1/search", content=b'{"question": ', timeout=TIMEOUT)
    assert r.status_code == 422 and "invalid JSON" in r.text
    r = httpx.post(limited_server + "/v1/search", json={"question": "q" * 5000}, timeout=TIMEOUT)
    assert r.status_code == 413 and "4096" in r.text

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(10):
            yield b" " * 1000

    r = httpx.post(limited_server + "/v1/search", content=chunks(), timeout=TIMEOUT)
    assert r.status_code == 413
    r = httpx.post(limited_server + "/v1/search", json={"question": "still fine?"}, timeout=TIMEOUT)
    assert r.status_code == 200


class SlowService(LinearRAGService):
    """The real service whose engine call takes ``delay`` s longer (to hold requests in flight)."""

    delay = 0.0

    def _run_batch(self, key, questions):
        time.sleep(self.delay)
        return super()._run_batch(key, questions)


@contextmanager
def slow_serving(rag, delay: float, **settings):
    """A running SlowService (ready) whose engine calls then take ``delay`` s longer: (url, service)."""
    service = SlowService(None, ServeSettings(**settings), rag=rag)
    with running(create_app(service)) as url:
        wait_ready(url)
        service.delay = delay
        yield url, service


def test_overload_gets_429_with_retry_after_and_timeouts_504(small_rag):
    with slow_serving(small_rag, 0.4, max_concurrent=2, max_batch_size=1, timeout=0.5) as (url, service):

        async def burst():
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                return await asyncio.gather(*(client.post(url + "/v1/search", json={"question": f"Who is {i}?"})
                                              for i in range(6)))

        rs = asyncio.run(burst())
        codes = sorted(r.status_code for r in rs)
        assert codes.count(429) >= 3 and set(codes) <= {200, 429, 504}, codes
        assert all(r.headers.get("retry-after") == "1" for r in rs if r.status_code == 429)
        assert codes.count(504) >= 1  # the second admitted request waits 0.4 s + its own 0.4 s > 0.5 s
        assert all("within 0.5 s" in r.text for r in rs if r.status_code == 504)
        service.delay = 0.0
        time.sleep(0.5)
        ok = httpx.post(url + "/v1/search", json={"question": "Who directed it?"}, timeout=TIMEOUT)
        assert ok.status_code == 200
        metrics = httpx.get(url + "/metrics").text
        assert 'linearrag_failures_total{reason="overloaded"}' in metrics
        overloaded = [ln for ln in metrics.splitlines() if ln.startswith('linearrag_failures_total{reason="overloaded"}')]
        assert float(overloaded[0].split()[-1]) == codes.count(429)


def test_a_full_server_refuses_before_reading_the_body(small_rag):
    """Past max_concurrent the 429 comes before the body is read or checked (a refusal costs the least)."""
    with slow_serving(small_rag, 1.0, max_concurrent=1, max_batch_size=1, timeout=10) as (url, service):

        async def go():
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                held = asyncio.create_task(client.post(url + "/v1/search", json={"question": "Who is held?"}))
                while service.in_flight < 1:
                    await asyncio.sleep(0.01)
                bad = await client.post(url + "/v1/search", content=b'{"question": ')  # invalid JSON
                return await held, bad

        held, bad = asyncio.run(go())
        service.delay = 0.0
        assert held.status_code == 200
        assert bad.status_code == 429 and bad.headers["retry-after"] == "1" and "in flight" in bad.text
        r = httpx.post(url + "/v1/search", content=b'{"question": ', timeout=TIMEOUT)
        assert r.status_code == 422  # with room again, the same body is read and refused for what it is


def test_a_refusal_is_held_refusal_delay_at_most_a_tenth_of_the_deadline(small_rag):
    """A 429 is sent refusal_delay seconds after the request came (serve/front.py EarlyAdmission._refuse), or
    a tenth of the request's own deadline when that is shorter; the held refusal takes no place."""
    with slow_serving(small_rag, 3.0, max_concurrent=1, max_batch_size=1, timeout=20, refusal_delay=0.8) as (url, service):

        async def go():
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                held = asyncio.create_task(client.post(url + "/v1/search", json={"question": "Who is held?"}))
                while service.in_flight < 1:
                    await asyncio.sleep(0.01)

                async def timed(headers):
                    t0 = time.perf_counter()
                    r = await client.post(url + "/v1/search", json={"question": "Who else?"}, headers=headers)
                    return r, time.perf_counter() - t0

                plain, short = await asyncio.gather(timed({}), timed({"X-Request-Timeout": "2"}))
                in_flight = service.in_flight
                service.delay = 0.0
                return plain, short, in_flight, await held

        (plain, plain_s), (short, short_s), in_flight, held = asyncio.run(go())
        assert plain.status_code == short.status_code == 429 and held.status_code == 200
        assert 0.8 <= plain_s < 1.5, plain_s  # held refusal_delay, once (the held request still runs for 3 s)
        assert 0.2 <= short_s < 0.7, short_s  # a tenth of its 2 s deadline
        assert in_flight == 1  # the refusals held no place


def test_api_key_guards_every_route_but_health(small_rag):
    with serving(small_rag, api_key="s3cret") as (url, _):
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.get(url + "/health").status_code == 200
        for method, path in [("post", "/v1/search"), ("post", "/v1/explain"), ("get", "/info"), ("get", "/metrics"),
                             ("get", "/docs"), ("get", "/openapi.json"), ("post", "/admin/reload")]:
            for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                r = httpx.request(method, url + path, headers=headers, json={"question": "q"}, timeout=TIMEOUT)
                assert r.status_code == 401, (path, headers, r.status_code)
        r = httpx.post(url + "/v1/search", headers=good, json={"question": "Who?"}, timeout=TIMEOUT)
        assert r.status_code == 200
        assert httpx.get(url + "/info", headers=good).json()["server"]["api_key"] == "set"  # never the key itself
        assert httpx.get(url + "/openapi.json", headers=good).status_code == 200
        # the page and its files hold no data: served without a key (what the page asks for carries the key)
        for path, kind in (("/", "text/html"), ("/page/page.js", "javascript"), ("/page/page.css", "text/css")):
            r = httpx.get(url + path)
            assert r.status_code == 200 and kind in r.headers["content-type"], (path, r.headers)


def test_explain_route_equals_rag_explain_with_the_requests_settings(small_rag, small_questions):
    """POST /v1/explain: LinearRAG.explain as JSON, with the request's top_k and retrieval settings (what the page
    at / draws); each hit's paths end in the passage's entities."""
    qs = [q["question"] for q in small_questions[:2]]
    with serving(small_rag) as (url, _):
        for body, kw in (({"questions": qs}, {}), ({"questions": qs, "top_k": 3, "mode": "paper", "delta": 0.3},
                                                   {"mode": "paper", "delta": 0.3})):
            r = httpx.post(url + "/v1/explain", json=body, timeout=TIMEOUT)
            assert r.status_code == 200, r.text
            want = small_rag.explain(qs, top_k=body.get("top_k", 5), **kw)
            for got, ex in zip(r.json()["results"], want):
                assert [(h["id"], h["title"]) for h in got["hits"]] == [(h.id, h.title) for h, _ in ex["hits"]]
                assert [h["score"] for h in got["hits"]] == pytest.approx([h.score for h, _ in ex["hits"]], rel=1e-5)
                assert got["seeds"] == [[n, pytest.approx(w, rel=1e-5)] for n, w in ex["seeds"]]
                assert len(got["paths"]) == len(got["hits"])
                for h, paths, (_, ents) in zip(got["hits"], got["paths"], ex["hits"]):
                    assert {p["nodes"][-1]["name"] for p in paths if p["via"] == "activation"} == {n for n, _, _ in ents}
                    for p in paths:
                        assert p["via"] != "activation" or p["nodes"][0]["kind"] == "seed", p
        r = httpx.post(url + "/v1/explain", json={"question": " "}, timeout=TIMEOUT)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "question"]


def test_health_is_503_until_the_index_is_loaded(small_rag, small_index_dir, monkeypatch):
    gate = threading.Event()

    class Gated(LinearRAGService):
        def _load_rag(self, like):
            assert gate.wait(TIMEOUT)
            return small_rag

    service = Gated(small_index_dir, ServeSettings())
    with running(create_app(service)) as url:
        assert httpx.get(url + "/health").status_code == 503
        r = httpx.post(url + "/v1/search", json={"question": "Who?"})
        assert r.status_code == 503 and "loading" in r.text and r.headers["retry-after"] == "1"
        gate.set()
        assert wait_ready(url)["status"] == "ok"


def test_info_and_metrics(small_rag):
    with serving(small_rag) as (url, _):
        httpx.post(url + "/v1/search", json={"questions": ["Who?", "Where?"]}, timeout=TIMEOUT)
        info = httpx.get(url + "/info").json()
        assert info["index"] == small_rag.index.summary()
        assert info["settings"]["top_k"] == small_rag.config.top_k and info["device"] == "cpu"
        mem = info["memory"]
        assert mem["rss_bytes"] > 0 and mem["rss_anonymous_bytes"] > 0 and mem["rss_file_bytes"] >= 0
        assert mem["index_bytes_by_part"] == small_rag.index.nbytes_by_part()
        assert mem["index_bytes_by_part"]["entity_vectors"] == small_rag.index.entity_emb.numel() * 4
        assert mem["index_tensors_bytes"] == (sum(mem["index_bytes_by_part"].values())
                                              + sum(mem["engine_bytes_by_part"].values()))
        assert info["server"]["max_batch_size"] == 64
        text = httpx.get(url + "/metrics").text
        for name in ("linearrag_request_duration_seconds_bucket", "linearrag_queue_wait_seconds_bucket",
                     "linearrag_batch_size_questions_bucket", "linearrag_engine_seconds_bucket",
                     "linearrag_in_flight_requests", "linearrag_failures_total"):
            assert name in text
        assert "linearrag_questions_total 2.0" in text  # these two (the warm-up is not a request)


# ------------------------------------------------------------------------------------------ reloads
def copy_index(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_reload_under_load_has_no_failed_request(small_rag, small_index_dir, small_questions, tmp_path):
    folder = copy_index(small_index_dir, tmp_path / "index")
    qs = [q["question"] for q in small_questions]
    victim = small_rag.search(qs[0], top_k=1)[0].id  # the best passage of the first question
    with serving(small_rag, folder, max_wait_ms=2) as (url, service):
        before = service.fingerprint
        stop, statuses, seen = threading.Event(), [], []

        def client(i):
            with httpx.Client(timeout=TIMEOUT) as c:
                for n in range(200):  # bounded
                    if stop.is_set():
                        return
                    r = c.post(url + "/v1/search", json={"question": qs[(i + n) % len(qs)], "top_k": 3})
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        seen.append(r.json()["results"][0]["hits"][0]["id"])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        updated = LinearRAG(small_rag.index, "cpu").delete([victim])
        updated.save(folder)
        r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
        time.sleep(0.3)  # more requests on the new index
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["index"]["passages"] == small_rag.index.num_passages - 1
        assert service.fingerprint != before
        assert statuses and set(statuses) == {200}, f"failed requests during reload: {statuses}"
        after = httpx.post(url + "/v1/search", json={"question": qs[0], "top_k": 10}, timeout=TIMEOUT).json()
        assert victim not in [h["id"] for h in after["results"][0]["hits"]]


def test_a_corrupt_index_is_refused_and_the_old_one_keeps_serving(small_rag, small_index_dir, tmp_path):
    folder = copy_index(small_index_dir, tmp_path / "index")
    with serving(small_rag, folder) as (url, service):
        before = service.fingerprint
        data = next(p for p in folder.iterdir() if p.name.startswith("tensors-"))
        raw = bytearray(data.read_bytes())
        raw[-1] ^= 0xFF  # same size, wrong sha256
        data.write_bytes(bytes(raw))
        r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
        assert r.status_code == 409, r.text
        assert "still serving the previous index" in r.text and "checksum" in r.text and data.name in r.text
        assert service.fingerprint == before and httpx.get(url + "/health").json()["fingerprint"] == before
        ok = httpx.post(url + "/v1/search", json={"question": "Who?"}, timeout=TIMEOUT)
        assert ok.status_code == 200
        assert 'linearrag_reloads_total{result="refused"} 1.0' in httpx.get(url + "/metrics").text


def test_watch_follows_a_committed_update(small_rag, small_index_dir, tmp_path):
    """(With NER worker processes: the reloaded index, of the same spaCy model, keeps them.)"""
    folder = copy_index(small_index_dir, tmp_path / "index")
    with serving(small_rag, folder, watch=0.1, ner_processes=1) as (url, service):
        before, pool = service.fingerprint, service.rag.ner_pool
        LinearRAG(small_rag.index, "cpu").delete([small_rag.index.passage_ids[0]]).save(folder)
        deadline = time.monotonic() + TIMEOUT
        while httpx.get(url + "/health").json()["fingerprint"] == before:
            assert time.monotonic() < deadline, "the watcher did not reload"
            time.sleep(0.1)
        assert httpx.get(url + "/info").json()["index"]["passages"] == small_rag.index.num_passages - 1
        assert service.rag is not small_rag and service.rag.ner_pool is pool and pool.running
        assert small_rag.ner_pool is None  # handed over
    assert not pool.running  # stopped with the service


# ------------------------------------------------------------------------------------------ embedding
def test_mounted_into_another_fastapi_app(small_rag, small_questions):
    service = LinearRAGService(None, ServeSettings(), rag=small_rag)
    gateway = FastAPI(lifespan=service.lifespan)

    @gateway.get("/gateway/ping")
    def ping():
        return {"pong": True}

    gateway.include_router(service.router, prefix="/rag")
    q = small_questions[2]["question"]
    with running(gateway) as url:
        wait_ready(url + "/rag")
        assert httpx.get(url + "/gateway/ping").json() == {"pong": True}
        r = httpx.post(url + "/rag/v1/search", json={"question": q}, timeout=TIMEOUT)
        assert r.status_code == 200
        assert_same([as_pairs(r.json()["results"][0]["hits"])], expected(small_rag, [q]))


# ------------------------------------------------------------------------------------------ the command
def test_serve_command_drains_on_sigterm_and_exits_0(small_index_dir, small_questions):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "linearrag_torch.cli", "serve", str(small_index_dir),
                             "--port", str(port), "--device", "cpu", "--log-level", "warning", "--max-concurrent", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, 120)
        # uvicorn's limit (32 x --max-concurrent + 64 = 96) counts requests at work, not open connections: 96
        # idle connections (--max-connections' business: serve/connections.py) leave the server answering
        from linearrag_torch.serve.app import connection_limit

        assert connection_limit(ServeSettings(max_concurrent=1)) == 96
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(96)]
        time.sleep(0.5)
        assert httpx.get(url + "/health").status_code == 200
        for sock in idle:
            sock.close()
        many = [q["question"] + f" ({i})" for i in range(40) for q in small_questions][:240]
        result = {}

        def slow_request():
            result["r"] = httpx.post(url + "/v1/search", json={"questions": many}, timeout=120)

        t = threading.Thread(target=slow_request)
        t.start()
        time.sleep(0.3)  # the request is in flight (240 questions take seconds on 2 cores)
        proc.send_signal(signal.SIGTERM)
        t.join(120)
        assert proc.wait(120) == 0
        assert result["r"].status_code == 200 and len(result["r"].json()["results"]) == len(many)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_command_refuses_a_folder_without_an_index(tmp_path):
    from linearrag_torch.cli import main

    assert main(["serve", str(tmp_path)]) == 2


def test_serve_benchmark_end_to_end(small_index_dir, small_questions, tmp_path):
    """benchmarks.serve on tiny phases: both server modes, overload and recovery, JSON and plot."""
    pytest.importorskip("aiohttp")  # its clients
    from conftest import write_jsonl

    qfile = write_jsonl(tmp_path / "questions.jsonl", small_questions)
    out = tmp_path / "serve.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.serve", "--index", str(small_index_dir), "--questions",
                           str(qfile), "--json", str(out), "--concurrency", "1", "2", "--duration", "1",
                           "--overload-clients", "12", "--client-processes", "2"], cwd=root, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    for mode in ("batching", "no_batching"):
        rows = res["modes"][mode]["rows"]
        assert [r["clients"] for r in rows] == [1, 2] and res["modes"][mode]["exit_code"] == 0
        assert all(r["ok"] > 0 and set(r["statuses"]) == {"200"} and r["p99_ms"] >= r["p50_ms"] for r in rows)
        assert all(0 < r["second_half"]["ok"] < r["ok"] for r in rows)
        assert [r.get("client_processes", 1) for r in rows] == [1, 2]  # 1 client: one process
        assert all(r["rss_bytes"] > 0 and r["children_rss_bytes"] >= 0 for r in rows)
        for r in rows:  # the server's own histograms saw each answered search and its queue wait
            srv = r["server"]
            assert srv["request"]["count"] == r["ok"] and srv["queue"]["count"] >= r["ok"]
            assert 0 < srv["request"]["mean_ms"] <= r["mean_ms"] and srv["request"]["p99_le_ms"] >= srv["request"]["p50_le_ms"]
    assert all(r["mean_batch_size"] == 1.0 for r in res["modes"]["no_batching"]["rows"])
    assert res["overload"]["only_200_and_429"] and res["overload"]["recovered"]
    assert "429" in res["overload"]["overload"]["statuses"]  # 12 clients against --max-concurrent 2
    assert out.with_suffix(".png").stat().st_size > 0


# ------------------------------------------------------------------------------------------ answers
def test_answer_route_uses_the_batched_hits_and_the_chat_model(small_rag, small_questions, tmp_path):
    pytest.importorskip("openai")
    from scripted_servers import ScriptedChatServer
    from scripted_servers import running as chat_running

    from linearrag_torch.answers.generation import LLM

    qs = [q["question"] for q in small_questions[:2]]
    chat = ScriptedChatServer(lambda body: ("reply", "The passages say so.\nAnswer: Paris"))
    with chat_running(chat):
        llm = LLM(chat.base_url, "scripted-model", "chat-key", cache=tmp_path / "cache.sqlite", max_retries=0)
        service = LinearRAGService(None, ServeSettings(), rag=small_rag, llm=llm)
        with running(create_app(service)) as url:
            wait_ready(url)
            r = httpx.post(url + "/v1/answer", json={"questions": qs, "top_k": 3}, timeout=TIMEOUT)
            assert r.status_code == 200, r.text
            res = r.json()["results"]
            assert [a["question"] for a in res] == qs and all(a["answer"] == "Paris" and a["marker_found"] for a in res)
            assert_same([[(p["id"], p["title"], p["score"]) for p in a["passages"]] for a in res],
                        expected(small_rag, qs, top_k=3))
            assert all("text" not in p for a in res for p in a["passages"])
            # each prompt holds its question's passages
            prompts = [json.dumps(c["body"]["messages"]) for c in chat.chat_requests]
            for q, hits in zip(qs, small_rag.search(qs, top_k=3)):
                prompt = next(p for p in prompts if json.dumps(q)[1:-1] in p)
                assert all(json.dumps(h.title)[1:-1] in prompt for h in hits)
            assert httpx.get(url + "/info").json()["llm"] == {"base_url": chat.base_url, "model": "scripted-model"}
            chat.script.append(("status", 401))  # a failure of the endpoint: 502 naming its URL and status
            r = httpx.post(url + "/v1/answer", json={"question": "Who founded the company?"}, timeout=TIMEOUT)
            assert r.status_code == 502 and chat.base_url in r.text and "401" in r.text


def test_a_server_without_a_chat_model_offers_no_answer_route(small_rag):
    """Issue 47: not a 503 (a 5xx for a permanent condition, which clients retry): the route is absent from the
    OpenAPI document and a POST there is a 404 that names the flags, before any admission."""
    with serving(small_rag, max_concurrent=1) as (url, _):
        assert "/v1/answer" not in httpx.get(url + "/openapi.json").json()["paths"]
        assert "/v1/search" in httpx.get(url + "/openapi.json").json()["paths"]
        for body in ({"question": "Who?"}, {"not": "a search body"}):
            r = httpx.post(url + "/v1/answer", json=body, timeout=TIMEOUT)
            assert r.status_code == 404 and "--llm-base-url" in r.json()["detail"], r.text
        assert 'linearrag_failures_total{reason="no_chat_model"} 2.0' in httpx.get(url + "/metrics").text


def test_mcp_on_one_index_s_server_is_a_404_that_says_where_it_is(small_rag):
    """Issue 60: MCP is a store's (docs/serving.md); on one index's server /mcp/ says so, not a bare Not Found."""
    with serving(small_rag) as (url, _):
        r = httpx.post(url + "/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=TIMEOUT)
        assert r.status_code == 404 and "--store" in r.json()["detail"], r.text


def test_memory_budget_and_every_setting_reach_the_command_line(small_rag, capsys):
    from dataclasses import fields

    from linearrag_torch.cli import main
    from linearrag_torch.retrieval.memory import parse_bytes

    with serving(small_rag, memory_budget="3M") as (url, _):
        assert httpx.get(url + "/info").json()["memory"]["memory_budget_bytes"] == parse_bytes("3M") == 3 << 20
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for f in fields(ServeSettings):
        assert "--" + f.name.replace("_", "-") in text
    assert "--llm-base-url" in text


def test_bad_server_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        ServeSettings(max_batch_size=0)
    with pytest.raises(ValueError, match="timeout"):
        ServeSettings(timeout=0)


def test_torch_work_stays_on_the_engine_thread(small_index_dir, tmp_path, monkeypatch):
    """The first load runs on the engine thread (torch's OpenMP threads belong to the thread that runs an
    operation; a second thread's parallel work slows the engine's down for good), and a reload's load, beside
    the engine, with one torch thread, the count restored afterwards."""
    import torch

    folder = copy_index(small_index_dir, tmp_path / "index")
    seen = []
    real = LinearRAGService._load_rag

    def load(self, like):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return real(self, like)

    monkeypatch.setattr(LinearRAGService, "_load_rag", load)
    threads = torch.get_num_threads()
    service = LinearRAGService(folder, ServeSettings())
    with running(create_app(service)) as url:
        wait_ready(url)
        assert seen == [(service.batcher._executor._thread_name_prefix + "_0", threads)]
        r = httpx.post(url + "/admin/reload", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert len(seen) == 2 and not seen[1][0].startswith("linearrag-engine") and seen[1][1] == 1
        assert torch.get_num_threads() == threads
