"""Slow, hostile and careless connections (issue 39, section 2), on a real uvicorn server on 127.0.0.1 with the
small index, run with `linearrag serve`'s own uvicorn configuration (serve/connections.uvicorn_config) and short
deadlines: a head or a body dribbled a byte at a time is closed within its deadline, an oversized head gets 4xx,
bodies that lie about their length or stop mid-way and responses never read disturb nobody else, the cap on
open connections refuses the newest while the clients already connected are answered. Both of uvicorn's HTTP
protocol classes (httptools', h11's) are held to the deadlines. Every wait is bounded.
"""
import socket
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from test_serve import TIMEOUT, free_port, start_in_thread, wait_ready  # noqa: E402
from test_serve_overload import metric, raw_request, read_response  # noqa: E402

from linearrag_torch.serve import LinearRAGService, ServeSettings, create_app  # noqa: E402
from linearrag_torch.serve.connections import (  # noqa: E402
    BODY_GRACE_S, default_max_connections, guarded_protocol, uvicorn_config)

SHORT = {"header_timeout": 1.0, "body_timeout": 1.0, "send_timeout": 1.0, "keep_alive_timeout": 1.0}
SLACK = 1.5  # seconds a closing may come after its deadline on a loaded 2-core machine


def bases():
    from uvicorn.protocols.http.h11_impl import H11Protocol

    out = [pytest.param(H11Protocol, id="h11")]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra
        return out
    return [pytest.param(HttpToolsProtocol, id="httptools")] + out


@contextmanager
def guarded(small_rag, base=None, limit_concurrency=None, **settings):
    """The small index served as `linearrag serve` serves it (its uvicorn configuration), in a thread: (url,
    service)."""
    s = ServeSettings(**{**SHORT, **settings})
    service = LinearRAGService(None, s, rag=small_rag)
    config = uvicorn_config(create_app(service), s, service.metrics, base=base, port=free_port(),
                            log_level="warning", access_log=False, limit_concurrency=limit_concurrency)
    server = uvicorn.Server(config)
    thread = start_in_thread(server)
    url = f"http://127.0.0.1:{config.port}"
    try:
        wait_ready(url)
        yield url, service
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


def connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.rsplit("/", 1)[-1].split(":")
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(TIMEOUT)
    s.connect((host, int(port)))
    return s


def dribble_until_closed(s: socket.socket, every: float, limit: float) -> tuple[float, bytes]:
    """Send one byte every ``every`` s until the server closes the connection (or ``limit`` s): (seconds until
    it closed, what it sent)."""
    t0, got = time.monotonic(), b""
    s.settimeout(every)
    while time.monotonic() - t0 < limit:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            try:
                s.send(b"a")
            except OSError:  # reset: closed
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return time.monotonic() - t0, got


def ok(url: str) -> bool:
    return httpx.post(url + "/v1/search", json={"question": "Who directed it?"}, timeout=TIMEOUT).status_code == 200


def closed(url: str, reason: str) -> float:
    return metric(url, f'linearrag_connections_closed_total{{reason="{reason}"}}')


def test_the_default_cap_keeps_an_eighth_of_the_file_limit():
    assert default_max_connections(4096) == 3584 and default_max_connections(1024) == 896
    assert default_max_connections(100) == 36 and default_max_connections(50) == 16
    with pytest.raises(ValueError, match="header_timeout"):
        ServeSettings(header_timeout=0)
    assert guarded_protocol(ServeSettings()).__name__ == "GuardedProtocol"


@pytest.mark.parametrize("base", bases())
def test_a_dribbled_head_and_a_silent_connection_are_closed_within_header_timeout(small_rag, base):
    with guarded(small_rag, base) as (url, _):
        s = connect(url)
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # then a byte every 0.2 s
        took, got = dribble_until_closed(s, 0.2, 10)
        s.close()
        assert 1.0 - 0.1 <= took <= 1.0 + SLACK and got.startswith(b"HTTP/1.1 408"), (took, got)
        silent = connect(url)
        t0 = time.monotonic()
        assert silent.recv(100) == b""  # nothing sent, nothing answered: closed
        assert time.monotonic() - t0 <= 1.0 + SLACK
        silent.close()
        assert closed(url, "header_timeout") == 2 and ok(url)


@pytest.mark.parametrize("base", bases())
def test_a_dribbled_body_is_closed_within_body_timeout(small_rag, base):
    with guarded(small_rag, base) as (url, service):
        s = raw_request(url, b'{"question": "Who', declared=400)  # the search route reads it: 408, closed
        took, got = dribble_until_closed(s, 0.2, 10)
        s.close()
        assert took <= 1.0 + SLACK and got.startswith(b"HTTP/1.1 408") and b"connection: close" in got.lower()
        s = connect(url)  # a route that never reads its body (405): the connection is closed all the same
        s.sendall(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n{")
        took, got = dribble_until_closed(s, 0.2, 10)
        s.close()
        assert took <= 1.0 + BODY_GRACE_S + SLACK and got.startswith(b"HTTP/1.1 405"), (took, got)
        assert closed(url, "body_timeout") == 1 and service.in_flight == 0 and ok(url)


@pytest.mark.parametrize("base", bases())
def test_an_oversized_head_gets_4xx_and_the_server_goes_on(small_rag, base):
    with guarded(small_rag, base, max_header_bytes=8192) as (url, _):
        s = connect(url)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        status, _, _ = read_response(s)
        assert status in (400, 431)
        assert s.recv(100) == b""  # and closed
        s.close()
        fine = connect(url)  # a head under the limit is served
        fine.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Fine: " + b"a" * 4000 + b"\r\n\r\n")
        assert read_response(fine)[0] == 200
        fine.close()
        assert ok(url)


def test_bodies_that_lie_or_stop_disturb_nobody(small_rag):
    """A Content-Length larger than what is sent, then close; a connection closed mid-body; neither holds a place,
    and the next normal request is answered."""
    with guarded(small_rag) as (url, service):
        for _ in range(5):
            s = raw_request(url, b'{"question": "Who lies?"}', declared=10_000)
            s.close()
            s = raw_request(url, b'{"question": "Who st', declared=40)
            s.close()
        assert ok(url)
        deadline = time.monotonic() + TIMEOUT
        while service.in_flight:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_responses_never_read_block_nobody_and_are_dropped_after_send_timeout(small_rag):
    with guarded(small_rag) as (url, _):
        size = len(httpx.get(url + "/openapi.json", timeout=TIMEOUT).content)
        n = 2 + (16 << 20) // size  # more than the kernel's socket buffers hold
        deaf = connect(url, rcvbuf=4096)
        deaf.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * n)  # pipelined, never read
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # others are served while its responses pile up
            assert ok(url)
        deadline = time.monotonic() + TIMEOUT
        while closed(url, "send_timeout") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        got = 0
        deaf.settimeout(TIMEOUT)
        try:
            while chunk := deaf.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:  # aborted: its buffered bytes dropped
            pass
        deaf.close()
        assert got < n * size and ok(url)


def test_the_connection_cap_gives_slow_places_to_new_clients_and_answers_the_connected(small_rag):
    with guarded(small_rag, max_connections=12, header_timeout=3.0, keep_alive_timeout=30.0) as (url, _):
        with httpx.Client(timeout=TIMEOUT) as kept:  # connected before the flood: keeps its place
            assert kept.post(url + "/v1/search", json={"question": "Who came first?"}).status_code == 200
            t0 = time.monotonic()
            slow = [connect(url) for _ in range(20)]  # send nothing: 11 fit beside `kept`
            refused = 0
            for s in slow[11:]:  # the others find no connection slow yet (all younger than 1 s): refused
                status, headers, _ = read_response(s)
                refused += status == 503 and headers.get("connection") == "close"
                s.close()
            assert refused == 9
            for _ in range(5):  # the full server answers the client already connected
                assert kept.post(url + "/v1/search", json={"question": "Who is kept?"}).status_code == 200
            text = kept.get(url + "/metrics").text
            assert 'linearrag_connections_closed_total{reason="over_cap"} 9.0' in text
            assert "linearrag_open_connections 12.0" in text
            time.sleep(max(0.0, t0 + 1.2 - time.monotonic()))  # now they are slow: a new client takes the place
            assert ok(url)  # of the newest of them, slow[10], which gets 503 and is closed
            status, headers, _ = read_response(slow[10])
            assert status == 503 and slow[10].recv(100) == b""
            assert 'connections_closed_total{reason="evicted"} 1.0' in kept.get(url + "/metrics").text
            for s in slow[:10]:  # the other slow ones leave by header_timeout, and the cap frees
                assert s.recv(100) == b""
                s.close()
            assert time.monotonic() - t0 <= 3.0 + SLACK
            slow[10].close()
        assert ok(url)
        assert metric(url, "linearrag_open_connections") <= 2


@pytest.mark.parametrize("base", bases())
def test_uvicorns_limit_counts_requests_at_work_not_slow_connections(small_rag, base):
    """uvicorn's limit_concurrency (`linearrag serve` sets it) counted every open connection: a few slow ones made
    it answer 503 to every request. Here it counts the requests at work."""
    with guarded(small_rag, base, limit_concurrency=4, header_timeout=5.0) as (url, _):
        slow = [connect(url) for _ in range(10)]
        for s in slow:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        assert ok(url)
        for s in slow:
            s.close()


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_timeout(small_rag):
    with guarded(small_rag) as (url, _):
        s = connect(url)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[0] == 200
        t0 = time.monotonic()
        assert s.recv(100) == b""
        assert 1.0 - 0.1 <= time.monotonic() - t0 <= 1.0 + SLACK
        s.close()
