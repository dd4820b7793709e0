"""SearchClient (linearrag_torch.client) against a real HTTP server speaking `linearrag serve`'s
/v1/search schema, backed by the small index."""
import asyncio
import time

import pytest

pytest.importorskip("httpx")

from linearrag_torch.client import SearchClient, SearchError, retry_after_seconds  # noqa: E402

from scripted_servers import FakeSearchServer, running  # noqa: E402

QS = ["Which country the composer of film Thunder On The Hill is from?", "Where did Sylvia Burka's husband die?"]


@pytest.fixture(scope="module")
def server(small_rag):
    with running(FakeSearchServer(small_rag.search)) as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server(small_rag):
    with running(FakeSearchServer(small_rag.search, api_key="k-123")) as s:
        yield s


def same_hits(remote, local, text=True):
    assert [[h.id for h in hs] for hs in remote] == [[h.id for h in hs] for hs in local]
    for rh, lh in zip(remote, local):
        for r, h in zip(rh, lh):
            assert r.score == pytest.approx(h.score, rel=1e-6) and r.title == h.title and r.row == -1
            assert r.text == (h.text if text else "")


def test_search_matches_in_process(server, small_rag):
    n0 = len(server.requests)
    with SearchClient(server.url) as client:
        remote = client.search(QS, top_k=3)
    assert len(server.requests) == n0 + 1  # one request for the list
    assert server.requests[-1]["body"] == {"questions": QS, "include_text": True, "top_k": 3}
    same_hits(remote, small_rag.search(QS, top_k=3))
    assert "authorization" not in server.requests[-1]["headers"]


def test_single_question_settings_and_no_text(server, small_rag):
    client = SearchClient(server.url + "/v1/search/")  # the full route is accepted too
    hits = client.search(QS[0], top_k=2, include_text=False, mode="paper", delta=0.3)
    assert server.requests[-1]["body"] == {"questions": [QS[0]], "include_text": False, "top_k": 2,
                                           "mode": "paper", "delta": 0.3}
    same_hits([hits], [small_rag.search(QS[0], top_k=2, mode="paper", delta=0.3)], text=False)
    assert client.search([]) == []


def test_async_search(server, small_rag):
    remote = asyncio.run(SearchClient(server.url).asearch(QS, top_k=4))
    same_hits(remote, small_rag.search(QS, top_k=4))


def test_api_key(keyed_server, monkeypatch):
    monkeypatch.delenv("LINEARRAG_API_KEY", raising=False)
    with pytest.raises(SearchError) as info:
        SearchClient(keyed_server.url).search(QS, top_k=1)
    assert str(info.value) == f"linearrag server {keyed_server.url}/v1/search: HTTP 401: missing or wrong API key"
    assert info.value.status == 401
    assert len(SearchClient(keyed_server.url, api_key="k-123").search(QS, top_k=1)) == 2
    assert keyed_server.requests[-1]["headers"]["authorization"] == "Bearer k-123"
    monkeypatch.setenv("LINEARRAG_API_KEY", "k-123")
    client = SearchClient(keyed_server.url)
    assert len(client.search(QS, top_k=1)) == 2 and "k-123" not in repr(client)
    with pytest.raises(SearchError, match="HTTP 401"):
        asyncio.run(SearchClient(keyed_server.url, api_key="wrong").asearch(QS))


def test_errors_are_one_clear_line(server):
    client = SearchClient(server.url)
    with pytest.raises(SearchError, match=r"HTTP 400: unknown retrieval setting\(s\): \['bogus'\]"):
        client.search(QS, bogus=1)
    with pytest.raises(SearchError, match=r'HTTP 422: \[\{"loc": \["body", "top_k"\], "msg": "Input should be'):
        client.search(QS, top_k=0)
    with pytest.raises(SearchError, match="HTTP 404: Not Found"):
        SearchClient(server.url + "/nope").search(QS)


def test_retry_after_header_forms():
    assert retry_after_seconds("1") == 1.0 and retry_after_seconds(" 0.25 ") == 0.25
    assert retry_after_seconds("-3") == 0.0  # never a negative wait
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    now = 1_000_000_000.0  # 2001-09-09 01:46:40 UTC
    assert retry_after_seconds("Sun, 09 Sep 2001 01:46:50 GMT", now=now) == pytest.approx(10.0)
    assert retry_after_seconds("Sun, 09 Sep 2001 01:46:30 GMT", now=now) == 0.0  # already past


def test_busy_server_is_retried_after_its_retry_after(small_rag):
    """429 and 503 are sent again after the server's Retry-After; the answer is the one that finally came."""
    refusals = [(429, {"Retry-After": "0"}), (503, {"Retry-After": "0.3"})]
    with running(FakeSearchServer(small_rag.search, refusals=refusals)) as busy:
        t0 = time.perf_counter()
        with SearchClient(busy.url) as client:
            remote = client.search(QS, top_k=3)
        waited = time.perf_counter() - t0
        assert len(busy.requests) == 3 and all(r["body"] == busy.requests[0]["body"] for r in busy.requests)
    same_hits(remote, small_rag.search(QS, top_k=3))
    assert waited >= 0.3  # the 503's Retry-After was honoured
    refusals = [(429, {}), (429, {"Retry-After": "0"})]  # no Retry-After: its own backoff (0.5 s)
    with running(FakeSearchServer(small_rag.search, refusals=refusals)) as busy:
        t0 = time.perf_counter()
        remote = asyncio.run(SearchClient(busy.url).asearch(QS, top_k=2))
        assert time.perf_counter() - t0 >= 0.5 and len(busy.requests) == 3
    same_hits(remote, small_rag.search(QS, top_k=2))


def test_retries_are_bounded(small_rag):
    refusals = [(429, {"Retry-After": "0"})] * 5
    with running(FakeSearchServer(small_rag.search, refusals=refusals)) as busy:
        with pytest.raises(SearchError) as info:
            SearchClient(busy.url, retries=2).search(QS)
        assert str(info.value) == f"linearrag server {busy.url}/v1/search: HTTP 429: scripted 429 (after 3 attempts)"
        assert info.value.status == 429 and len(busy.requests) == 3
        with pytest.raises(SearchError, match=r"HTTP 429: scripted 429$"):
            SearchClient(busy.url, retries=0).search(QS)  # retries off: one request
        assert len(busy.requests) == 4
    with running(FakeSearchServer(small_rag.search, refusals=[(503, {"Retry-After": "120"})])) as loading:
        t0 = time.perf_counter()
        with pytest.raises(SearchError, match=r"HTTP 503: scripted 503 \(Retry-After '120' is longer than "
                                              r"max_retry_wait 10 s\)$"):
            SearchClient(loading.url).search(QS)
        assert time.perf_counter() - t0 < 5 and len(loading.requests) == 1  # not waited
    with running(FakeSearchServer(small_rag.search, refusals=[(500, {"Retry-After": "0"})])) as broken:
        with pytest.raises(SearchError, match="HTTP 500"):
            SearchClient(broken.url).search(QS)  # other statuses are not retried
        assert len(broken.requests) == 1
    with pytest.raises(ValueError, match="retries"):
        SearchClient("http://127.0.0.1:1", retries=-1)


def test_connection_closed_without_reply_is_retried(small_rag):
    with running(FakeSearchServer(small_rag.search, refusals=["hang up"])) as flaky:
        remote = SearchClient(flaky.url).search(QS, top_k=3)
        assert len(flaky.requests) == 2
    same_hits(remote, small_rag.search(QS, top_k=3))
    with running(FakeSearchServer(small_rag.search, refusals=["hang up"] * 3)) as dead:
        with pytest.raises(SearchError, match=r"request failed \(RemoteProtocolError: .*\) \(after 2 attempts\)$"):
            asyncio.run(SearchClient(dead.url, retries=1).asearch(QS))
        assert len(dead.requests) == 2


def test_timeout_and_refused_connection(small_rag):
    with running(FakeSearchServer(small_rag.search, delay=1.0)) as slow:
        with pytest.raises(SearchError, match=r"/v1/search: no reply within the 0\.2 s timeout"):
            SearchClient(slow.url, timeout=0.2).search(QS)
    with pytest.raises(SearchError, match=r"request failed \(ConnectError: .*\) \(after 3 attempts\)"):
        SearchClient(slow.url, timeout=1).search(QS)  # the server is gone


def test_against_the_real_server(small_rag):
    """The same client against `linearrag serve`'s own app (uvicorn in a thread), with an API key."""
    for mod in ("fastapi", "uvicorn", "prometheus_client"):
        pytest.importorskip(mod)
    import socket
    import threading
    import time

    import uvicorn

    from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = LinearRAGService(None, ServeSettings(api_key="real-key"), rag=small_rag)
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        client = SearchClient(url, api_key="real-key", timeout=10)
        while True:  # until the service has loaded (503 meanwhile)
            try:
                remote = client.search(QS, top_k=3, mode="paper")
                break
            except SearchError as exc:
                assert time.monotonic() < deadline, str(exc)
                time.sleep(0.05)
        same_hits(remote, small_rag.search(QS, top_k=3, mode="paper"))
        same_hits(asyncio.run(client.asearch(QS, top_k=2, include_text=False)), small_rag.search(QS, top_k=2),
                  text=False)
        with pytest.raises(SearchError, match=r"/v1/search: HTTP 401: missing or wrong API key"):
            SearchClient(url, api_key="nope").search(QS)
        with pytest.raises(SearchError, match=r"HTTP 422"):
            client.search(QS, top_k=0)
    finally:
        server.should_exit = True
        thread.join(60)


def test_backoff_is_jittered_exponential_and_at_least_retry_after():
    import random

    from linearrag_torch.client import CONNECTION_BACKOFF_S, JITTER, STATUS_BACKOFF_S, backoff

    rng = random.Random(0)
    for attempt in range(5):
        waits = [backoff(attempt, None, rng=rng) for _ in range(200)]
        lo = STATUS_BACKOFF_S * 2 ** attempt
        assert all(lo <= w < lo * (1 + JITTER) for w in waits) and len(set(waits)) == 200  # spread, not a herd
        waits = [backoff(attempt, 2.0, rng=rng) for _ in range(200)]  # never before the server's Retry-After
        lo = max(2.0, CONNECTION_BACKOFF_S * 2 ** attempt)
        assert all(lo <= w < lo * (1 + JITTER) for w in waits)


def test_the_retry_budget_stops_retrying_a_server_that_keeps_refusing(small_rag):
    """gRPC's retry throttling: 10 tokens, a refusal takes one, no retry at 5 or fewer; an answer gives 0.1
    back. A client refused again and again stops multiplying its requests; the error says why."""
    from linearrag_torch.client import RetryBudget

    budget = RetryBudget()
    assert [budget.on_failure() for _ in range(6)] == [True] * 4 + [False] * 2
    budget.on_success()
    assert budget.tokens == pytest.approx(4.1)
    refusals = [(429, {"Retry-After": "0"})] * 20
    with running(FakeSearchServer(small_rag.search, refusals=refusals)) as busy:
        client = SearchClient(busy.url, retries=10)
        with pytest.raises(SearchError, match=r"HTTP 429: scripted 429 \(retry budget spent.*\(after 5 attempts\)$"):
            client.search(QS)
        assert len(busy.requests) == 5
        with pytest.raises(SearchError, match=r"retry budget spent"):
            asyncio.run(client.asearch(QS))  # the same budget: one attempt, no retry
        assert len(busy.requests) == 6
        assert busy.requests[0]["headers"]["x-request-timeout"] == "30"  # the client's own deadline
