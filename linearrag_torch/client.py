"""A small HTTP client for `linearrag serve` (``POST /v1/search``), shared by the framework adapters.

    from linearrag_torch.client import SearchClient
    client = SearchClient("http://127.0.0.1:8000", api_key=None, timeout=30.0)
    for hits in client.search(["Who directed X?", "Where was Y born?"], top_k=5):
        print([(h.id, h.title, round(h.score, 4)) for h in hits])
    hits = await client.asearch(["..."], top_k=5)       # the same, with httpx.AsyncClient

Hits are ``linearrag_torch.Hit`` tuples (id, score, title, text, row) as from ``LinearRAG.search``, with
``row = -1`` (the server does not say where a passage sits in its index) and ``text = ""`` unless
include_text. Needs httpx (``pip install "linearrag_torch[serve]"``). Errors raise SearchError with one
line naming the URL and the HTTP status and the server's "detail".

A search only reads, so sending it again is safe. Up to ``retries`` times, the client sends it again after
a 429 or 503 (the server is busy, or still loading its index), waiting what the server's Retry-After says
(a wait longer than ``max_retry_wait`` is not waited: the error is raised at once), and after a connection
that failed or closed without a reply (a short backoff). Timeouts and every other status are raised at once.
"""
from __future__ import annotations

import asyncio
import email.utils
import time

from .results import Hit

RETRY_STATUSES = (429, 503)
CONNECTION_BACKOFF_S = 0.1  # the wait after a failed connection, doubled on each further attempt
STATUS_BACKOFF_S = 0.5  # the wait after a 429 / 503 without a Retry-After, doubled likewise


class SearchError(RuntimeError):
    """A failed search request: ``str(exc)`` names the URL, the HTTP status (if any) and the detail."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header in seconds: delta-seconds ("1"; "0.5" is accepted too) or an HTTP date (seconds
    from ``now``, default the clock). None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _httpx():
    try:
        import httpx
    except ImportError:
        raise ImportError('SearchClient needs httpx: pip install "linearrag_torch[serve]"') from None
    return httpx


class SearchClient:
    """Client of a `linearrag serve` server. base_url: e.g. "http://127.0.0.1:8000" (the "/v1/search"
    path is added). api_key: sent as "Authorization: Bearer KEY" (default: $LINEARRAG_API_KEY if set).
    timeout: seconds per request. retries: further attempts after a 429 / 503 or a failed connection (0:
    none); max_retry_wait: the longest Retry-After it waits, in seconds. One httpx.Client is kept (call
    close(), or use ``with``)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0, retries: int = 2,
                 max_retry_wait: float = 10.0):
        import os

        if retries < 0 or max_retry_wait < 0:
            raise ValueError(f"SearchClient: retries ({retries}) and max_retry_wait ({max_retry_wait}) must be >= 0")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1/search"):
            self.base_url = self.base_url[: -len("/v1/search")]
        self.url = self.base_url + "/v1/search"
        self._api_key = api_key if api_key is not None else os.environ.get("LINEARRAG_API_KEY")
        self.timeout = timeout
        self.retries, self.max_retry_wait = int(retries), float(max_retry_wait)
        self._client = None

    def __repr__(self) -> str:  # never shows the key
        return f"SearchClient({self.base_url!r}, api_key={'***' if self._api_key else None})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def payload(self, questions, top_k: int | None, include_text: bool, settings: dict) -> dict:
        body = {"questions": list(questions), "include_text": bool(include_text)}
        if top_k is not None:
            body["top_k"] = int(top_k)
        body.update({k: v for k, v in settings.items() if v is not None})
        return body

    def search(self, questions, top_k: int | None = None, include_text: bool = True, **settings) -> list[list[Hit]]:
        """Top-k hits per question (one request for the whole list; a string gives one list of hits).
        ``settings``: retrieval settings sent as top-level fields (mode="paper", delta=0.3, ...)."""
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        httpx = _httpx()
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        body = self.payload(qs, top_k, include_text, settings)
        attempt = 0
        while True:
            resp, exc = None, None
            try:
                resp = self._client.post(self.url, json=body, headers=self.headers)
            except httpx.TransportError as e:
                exc = e
            wait = self._next_wait(attempt, resp, exc)
            if wait is None:
                break
            time.sleep(wait)
            attempt += 1
        out = self._result(resp, exc, len(qs), attempt)
        return out[0] if single else out

    async def asearch(self, questions, top_k: int | None = None, include_text: bool = True,
                      **settings) -> list[list[Hit]]:
        """search() with httpx.AsyncClient (a client per call: safe across event loops)."""
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        httpx = _httpx()
        body = self.payload(qs, top_k, include_text, settings)
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            attempt = 0
            while True:
                resp, exc = None, None
                try:
                    resp = await client.post(self.url, json=body, headers=self.headers)
                except httpx.TransportError as e:
                    exc = e
                wait = self._next_wait(attempt, resp, exc)
                if wait is None:
                    break
                await asyncio.sleep(wait)
                attempt += 1
        out = self._result(resp, exc, len(qs), attempt)
        return out[0] if single else out

    def _next_wait(self, attempt: int, resp, exc) -> float | None:
        """Seconds to wait before sending again, or None: this attempt's reply (or error) is the result."""
        if attempt >= self.retries:
            return None
        if exc is not None:
            return None if isinstance(exc, _httpx().TimeoutException) else CONNECTION_BACKOFF_S * 2 ** attempt
        if resp.status_code not in RETRY_STATUSES:
            return None
        wait = retry_after_seconds(resp.headers.get("retry-after"))
        wait = STATUS_BACKOFF_S * 2 ** attempt if wait is None else wait
        return wait if wait <= self.max_retry_wait else None

    def _result(self, resp, exc, n: int, attempt: int) -> list[list[Hit]]:
        """The hits of the last attempt, or its failure as one SearchError line (naming the attempts made)."""
        tries = f" (after {attempt + 1} attempts)" if attempt else ""
        if exc is not None:
            if isinstance(exc, _httpx().TimeoutException):
                raise SearchError(f"linearrag server {self.url}: no reply within the {self.timeout:g} s timeout{tries}")
            raise SearchError(f"linearrag server {self.url}: request failed ({type(exc).__name__}: {exc}){tries}")
        if resp.status_code in RETRY_STATUSES and attempt < self.retries:  # a Retry-After longer than we wait
            tries = (f" (Retry-After {resp.headers.get('retry-after')!r} is longer than max_retry_wait "
                     f"{self.max_retry_wait:g} s){tries}")
        return self._parse(resp, n, tries)

    def _parse(self, resp, n: int, tries: str = "") -> list[list[Hit]]:
        if resp.status_code != 200:
            try:
                detail = resp.json().get("detail")
            except Exception:  # noqa: BLE001 - not JSON
                detail = None
            if detail is None:
                detail = " ".join(resp.text.split())[:200]
            elif not isinstance(detail, str):
                import json

                detail = json.dumps(detail, ensure_ascii=False)[:300]
            raise SearchError(f"linearrag server {self.url}: HTTP {resp.status_code}: {detail}{tries}",
                              resp.status_code)
        try:
            results = resp.json()["results"]
            if len(results) != n:
                raise ValueError(f"{len(results)} results for {n} questions")
            return [[Hit(h["id"], float(h["score"]), h.get("title") or "", h.get("text") or "", -1)
                     for h in r["hits"]] for r in results]
        except (ValueError, KeyError, TypeError) as exc:
            raise SearchError(f"linearrag server {self.url}: malformed reply ({type(exc).__name__}: {exc})",
                              resp.status_code) from None
