"""SearchClient (linearrag_torch.client) against a real HTTP server speaking `linearrag serve`'s
/v1/search schema, backed by the small index."""
import asyncio

import pytest

pytest.importorskip("httpx")

from linearrag_torch.client import SearchClient, SearchError  # noqa: E402

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


def test_timeout_and_refused_connection(small_rag):
    with running(FakeSearchServer(small_rag.search, delay=1.0)) as slow:
        with pytest.raises(SearchError, match=r"/v1/search: no reply within the 0\.2 s timeout"):
            SearchClient(slow.url, timeout=0.2).search(QS)
    with pytest.raises(SearchError, match="request failed"):
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
