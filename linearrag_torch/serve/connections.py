"""The connections of `linearrag serve`: slow, idle and unread ones bounded in time, their number capped below the
process's open-file limit.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 past ``limit_concurrency``
once a request's head has arrived, but it sets no deadline on the head or the body: a client that sends part of
a request head and then a byte every few seconds holds its connection, a file descriptor, for ever, and enough of
them exhaust the process's open-file limit, after which every new client is refused by the kernel. The HTTP
protocol class of ``uvicorn_config`` is uvicorn's own (httptools', else h11's: ``auto``) with its timers added the
way uvicorn arms its keep-alive timer (``loop.call_later`` on the connection):

- head: a request's head (request line and headers) must be complete ``header_timeout`` s after its first byte
  (after the connection opened, for a new connection); else 408 (nothing when no byte came) and the connection is
  closed. A head over ``max_header_bytes`` gets 431 and the connection is closed (counted as it arrives, up to its
  blank line, before the parser sees it: httptools has no limit of its own, h11 only one on incomplete heads);
- body: a request's body must be complete ``body_timeout`` s after its head; the routes that read it answer 408
  then (serve/front.py) and close the connection, and BODY_GRACE_S later it is closed whatever the route did;
- unread responses: a connection whose client leaves its responses unread for ``send_timeout`` s (the
  transport's write buffer stays over its high-water mark: uvicorn pauses the response) is aborted, its buffered
  bytes dropped;
- number: at most ``max_connections`` open at once. Past it, a new connection takes the place of a slow or idle
  one, the newest first: of the connections whose request head or body has been pending SLOW_AFTER_S or more (a
  well-behaved client sends its head within milliseconds of connecting), the most recent, which gets 503 with
  ``Connection: close``; else of the keep-alive connections idle SLOW_AFTER_S or more, the one idle the shortest
  time, closed (a closed-loop client between two requests is idle for milliseconds). With
  neither, the new connection itself gets the 503 and is closed at once: the connections at work keep their
  place. So a flood of slow connections churns among itself while new well-behaved clients get in, and the
  slow ones leave by the timeouts above anyway. The default cap keeps an eighth of the open-file limit (at least
  64) for the index's files, logs and pipes, so that the process never reaches the limit (past it the event loop
  stops accepting for a second at a time).

Idle keep-alive connections are closed after ``keep_alive_timeout`` s (uvicorn's own timer). Each closing is
counted in /metrics (``linearrag_connections_closed_total{reason}``), beside the open connections
(``linearrag_open_connections``).
"""
from __future__ import annotations

from collections import OrderedDict

BODY_GRACE_S = 1.0  # after body_timeout, the route's own 408 goes out first; the connection is closed this later
ABORT_AFTER_S = 1.0  # a closed connection whose last bytes the client does not read is aborted this much later
SLOW_AFTER_S = 1.0  # a head or body pending this long makes its connection slow (the first to give way at the cap)
CLOSE_REASONS = ("header_timeout", "body_timeout", "send_timeout", "header_too_large", "over_cap", "evicted")


def open_file_limit() -> int | None:
    """The process's soft open-file limit (RLIMIT_NOFILE), None where unknown or unlimited."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def default_max_connections(file_limit: int | None = None) -> int:
    """Open connections at most: the open-file limit less an eighth of it (at least 64 kept for files), at least
    16; 10,000 where the limit is unknown."""
    limit = open_file_limit() if file_limit is None else file_limit
    if limit is None:
        return 10_000
    return max(16, limit - max(64, limit // 8))


def raw_response(status: int, phrase: str, detail: str, headers: tuple = ()) -> bytes:
    """A whole HTTP/1.1 response with a JSON ``{"detail": ...}`` body and ``Connection: close`` (written by the
    protocol itself, where no ASGI request exists)."""
    body = ('{"detail": "%s"}' % detail.replace('"', "'")).encode()
    lines = [f"HTTP/1.1 {status} {phrase}", "content-type: application/json", f"content-length: {len(body)}",
             "connection: close", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def guarded_protocol(settings, metrics=None, base: type | None = None) -> type:
    """uvicorn's HTTP protocol class (``base``, default uvicorn's ``auto``: httptools', else h11's) with the
    deadlines and the connection cap of ``settings`` (serve/settings.ServeSettings); closings counted in
    ``metrics`` (serve/metrics.Metrics) when given."""
    from uvicorn.protocols.http.flow_control import service_unavailable

    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    cap = settings.max_connections or default_max_connections()
    head_s, body_s, send_s = settings.header_timeout, settings.body_timeout, settings.send_timeout
    max_head = settings.max_header_bytes
    refusal = raw_response(503, "Service Unavailable", f"more than {cap} open connections; retry later",
                           (("retry-after", "1"),))
    too_slow = raw_response(408, "Request Timeout", f"request head not received within {head_s:g} s")
    too_large = raw_response(431, "Request Header Fields Too Large", f"request head over {max_head} bytes")

    def count(reason: str) -> None:
        if metrics is not None:
            metrics.connections_closed.labels(reason).inc()

    class GuardedProtocol(base):
        __doc__ = f"uvicorn's {base.__name__} with the deadlines and cap of serve/connections.py."

        # the connections that may give way at the cap, each in the order it entered its state (the server's
        # connections are this class's: one class per server, guarded_protocol): a pending head or body, and idle
        # keep-alive, each young until SLOW_AFTER_S has passed
        _young: OrderedDict = OrderedDict()
        _slow: OrderedDict = OrderedDict()
        _idle_young: OrderedDict = OrderedDict()
        _idle: OrderedDict = OrderedDict()

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._phase = None  # ("head", counting) / ("body", cycle id) / ("busy", cycle id): see _phase_now
            self._timer = None  # the deadline of the phase
            self._stall = None  # the deadline of a paused write
            self._fresh = True  # no response sent yet on this connection
            self._head_bytes = 0  # bytes received while the current request's head is incomplete
            self._tail = b""  # their last 3 bytes (a blank line split between two reads)
            # uvicorn's limit_concurrency answers 503 (its service_unavailable app) when its connections or its
            # tasks reach the limit: idle and slow connections would trip it, and they are the cap's; here it
            # counts the requests at work (tasks) only
            limit, self.limit_concurrency = self.limit_concurrency, None
            if limit is not None:
                app, tasks = self.app, self.tasks

                def app_within_limit(scope, receive, send):
                    return (service_unavailable if len(tasks) > limit else app)(scope, receive, send)

                self.app = app_within_limit

        # ------------------------------------------------------------------ the connection
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._gauge()
            if len(self.connections) > cap:
                victim = self._victim()
                if victim is None:  # every other connection is at work: this one, the newest, is refused
                    count("over_cap")
                    self._close(refusal)
                    return
                count("evicted")
                victim._close(b"" if victim._phase == ("head", False) else refusal)
            self._update()

        def _victim(self):
            """The newest slow connection, else the newest idle one, else None (module docstring)."""
            now = self.loop.time()
            for young, old in ((self._young, self._slow), (self._idle_young, self._idle)):
                while young:  # (in the order they came: the old ones are at the front)
                    p, since = next(iter(young.items()))
                    if now - since < SLOW_AFTER_S:
                        break
                    del young[p]
                    old[p] = since
            for pool in (self._slow, self._idle):
                while pool:
                    p, _ = pool.popitem(last=True)
                    if not p.transport.is_closing():
                        return p
            return None

        def _unlist(self) -> None:
            for pool in (self._young, self._slow, self._idle_young, self._idle):
                pool.pop(self, None)

        def connection_lost(self, exc) -> None:
            for timer in (self._timer, self._stall):
                if timer is not None:
                    timer.cancel()
            self._timer = self._stall = None
            self._unlist()
            super().connection_lost(exc)
            self._gauge()

        def data_received(self, data: bytes) -> None:
            if self._phase_now()[0] == "head":  # the head's size, up to its blank line, before the parser sees it
                seen = self._tail + data
                end = seen.find(b"\r\n\r\n")
                size = self._head_bytes + (len(data) if end < 0 else end + 4 - len(self._tail))
                if size > max_head:
                    count("header_too_large")
                    self._close(too_large)
                    return
                self._head_bytes += len(data)
                self._tail = seen[-3:]
            super().data_received(data)
            if not self.transport.is_closing():
                self._update()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._fresh = False
            if not self.transport.is_closing():
                self._update()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall is None:
                self._stall = self.loop.call_later(send_s, self._stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None

        # ------------------------------------------------------------------ the deadlines
        def _phase_now(self) -> tuple:
            """("body", cycle) while a request's body is incomplete; ("busy", cycle) while the app works on it or
            sends its response; else ("head", counting): between requests, where ``counting`` (a deadline runs)
            on a new connection or once a byte of the next request came (an idle keep-alive connection is
            uvicorn's to close)."""
            c = self.cycle
            if c is not None and c.more_body and not c.disconnected:
                return ("body", id(c))
            if c is not None and not c.response_complete:
                return ("busy", id(c))
            return ("head", self._fresh or self._head_bytes > 0)

        def _update(self) -> None:
            key = self._phase_now()
            if key == self._phase:
                return
            self._phase = key
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if key[0] != "head":
                self._head_bytes, self._tail = 0, b""
            self._unlist()
            if key == ("head", False):
                self._idle_young[self] = self.loop.time()
            elif key[0] != "busy":
                self._young[self] = self.loop.time()
            if key == ("head", True):
                self._timer = self.loop.call_later(head_s, self._expired, key)
            elif key[0] == "body":
                self._timer = self.loop.call_later(body_s + BODY_GRACE_S, self._expired, key)

        def _expired(self, key: tuple) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self._phase_now() != key:  # (a state change no callback reported: re-arm for the new one)
                self._phase = None
                self._update()
                return
            if key[0] == "head":
                count("header_timeout")
                self._close(too_slow if self._head_bytes else b"")
            else:
                count("body_timeout")
                self._close(b"")

        def _stalled(self) -> None:
            self._stall = None
            if not self.transport.is_closing():
                count("send_timeout")
            self.transport.abort()

        def _close(self, response: bytes) -> None:
            if response:
                self.transport.write(response)
            self.transport.close()
            if self.transport.get_write_buffer_size():  # bytes the client may never read: not held for ever
                self.loop.call_later(ABORT_AFTER_S, self.transport.abort)

        def _gauge(self) -> None:
            if metrics is not None:
                metrics.open_connections.set(len(self.connections))

    return GuardedProtocol


def uvicorn_config(app, settings, metrics=None, base: type | None = None, **config):
    """The uvicorn.Config of ``app`` served with ``settings``: the guarded protocol (over ``base``, see
    guarded_protocol), keep-alive timeout, h11's head limit; ``config``: more uvicorn.Config arguments (host and
    port default to the settings')."""
    import uvicorn

    config.setdefault("host", settings.host)
    config.setdefault("port", settings.port)
    return uvicorn.Config(app, http=guarded_protocol(settings, metrics, base),
                          timeout_keep_alive=settings.keep_alive_timeout,
                          h11_max_incomplete_event_size=settings.max_header_bytes, **config)


__all__ = ["default_max_connections", "guarded_protocol", "open_file_limit", "uvicorn_config"]
