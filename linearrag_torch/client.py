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
a 429 or 503 (the server is busy, or still loading its index) and after a connection that failed or closed
without a reply, with jittered exponential backoff: it waits at least what the server's Retry-After says (a
wait longer than ``max_retry_wait`` is not waited: the error is raised at once), at least 0.1 s x 2^attempt
(0.5 s x 2^attempt after a 429 / 503 without Retry-After), times a random factor in [1, 1.5) so that clients
refused together do not come back together. A retry budget (gRPC's retry throttling: 10 tokens, a retryable
failure takes one, an answer gives 0.1 back, no retry at 5 or fewer) keeps a client from multiplying its load on
a server that keeps refusing. Timeouts and every other status are raised at once. Each request tells the server
how long the client waits (``X-Request-Timeout``), so that a server that could not answer in time refuses at
once rather than after the wait.
"""
from __future__ import annotations

import asyncio
import email.utils
import random
import threading
import time

from .corpus import Hit

RETRY_STATUSES = (429, 503)
CONNECTION_BACKOFF_S = 0.1  # the least wait before attempt n+1: this x 2^n (after a failed connection, or a Retry-After)
STATUS_BACKOFF_S = 0.5  # the wait after a 429 / 503 without a Retry-After: this x 2^n
JITTER = 0.5  # each wait is multiplied by a random factor in [1, 1 + JITTER)


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


def backoff(attempt: int, retry_after: float | None = None, failed_connection: bool = False,
            rng: random.Random | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: at least the server's Retry-After and 0.1 s x 2^attempt
    (0.5 s x 2^attempt after a refusal without Retry-After), times a random factor in [1, 1 + JITTER)."""
    if retry_after is not None or failed_connection:
        base = max(retry_after or 0.0, CONNECTION_BACKOFF_S * 2 ** attempt)
    else:
        base = STATUS_BACKOFF_S * 2 ** attempt
    return base * (1.0 + JITTER * (rng or random).random())


class RetryBudget:
    """gRPC's retry throttling: ``max_tokens`` tokens; a retryable failure takes one, an answer gives ``ratio``
    back; a retry is allowed only while more than half are left. Thread-safe; one per client."""

    def __init__(self, max_tokens: float = 10.0, ratio: float = 0.1):
        if max_tokens <= 0 or ratio < 0:
            raise ValueError(f"RetryBudget: max_tokens ({max_tokens}) must be > 0 and ratio ({ratio}) >= 0")
        self.max_tokens, self.ratio, self.tokens = float(max_tokens), float(ratio), float(max_tokens)
        self._lock = threading.Lock()

    def on_failure(self) -> bool:
        """A retryable failure: True when a retry is still allowed."""
        with self._lock:
            self.tokens = max(0.0, self.tokens - 1.0)
            return self.tokens > self.max_tokens / 2

    def on_success(self) -> None:
        with self._lock:
            self.tokens = min(self.max_tokens, self.tokens + self.ratio)


def _httpx():
    try:
        import httpx
    except ImportError:
        raise ImportError('SearchClient needs httpx: pip install "linearrag_torch[serve]"') from None
    return httpx


class SearchClient:
    """Client of a `linearrag serve` server: one ``POST /v1/search`` per batch of questions.

    Needs httpx (extra ``[serve]``). One httpx.Client is kept: call ``close()``, or use ``with``. A search
    only reads, so it is sent again, with jittered exponential backoff, after a 429 or 503 and after a
    failed connection (the module docstring has the rules); every failure raises ``SearchError`` naming the
    URL, the HTTP status and the server's detail.

    Parameters
    ----------
    base_url : str
        The server, e.g. "http://127.0.0.1:8000" (the "/v1/search" path is added).
    api_key : str, optional
        Sent as "Authorization: Bearer KEY" (default: ``$LINEARRAG_API_KEY`` if set). Never shown by ``repr``.
    timeout : float, default 30.0
        Seconds per request; also sent as ``X-Request-Timeout``, so that a server that cannot answer in time
        refuses at once.
    retries : int, default 2
        Further attempts after a 429 / 503 or a failed connection (0: none).
    max_retry_wait : float, default 10.0
        The longest Retry-After it waits, in seconds; a longer one raises at once.
    retry_budget : RetryBudget, optional
        The budget its retries draw on (default: its own).

    Examples
    --------
    >>> from linearrag_torch.client import SearchClient
    >>> with SearchClient("http://127.0.0.1:8000", timeout=10.0) as client:  # doctest: +SKIP
    ...     for hits in client.search(["Who directed Blue River?", "Where was Karl Berg born?"], top_k=5):
    ...         print([(hit.id, hit.title, round(hit.score, 4)) for hit in hits])
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0, retries: int = 2,
                 max_retry_wait: float = 10.0, retry_budget: RetryBudget | None = None):
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
        self.retry_budget = retry_budget or RetryBudget()
        self._client = None

    def __repr__(self) -> str:  # never shows the key
        return f"SearchClient({self.base_url!r}, api_key={'***' if self._api_key else None})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Close the kept connection pool (a later ``search`` opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def headers(self) -> dict:
        """The headers of each request: X-Request-Timeout, and Authorization when there is a key."""
        h = {"X-Request-Timeout": f"{self.timeout:g}"}
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def payload(self, questions, top_k: int | None, include_text: bool, settings: dict) -> dict:
        """The JSON body of a search request.

        Parameters
        ----------
        questions : list of str
            The questions.
        top_k : int or None
            Passages per question (None: the server's default).
        include_text : bool
            Ask for the passages' text.
        settings : dict
            Retrieval settings, sent as top-level fields; None values are left out.

        Returns
        -------
        dict
            The body.

        Examples
        --------
        >>> SearchClient("http://127.0.0.1:8000").payload(["q"], 3, False, {"delta": 0.3, "mode": None})
        {'questions': ['q'], 'include_text': False, 'top_k': 3, 'delta': 0.3}
        """
        body = {"questions": list(questions), "include_text": bool(include_text)}
        if top_k is not None:
            body["top_k"] = int(top_k)
        body.update({k: v for k, v in settings.items() if v is not None})
        return body

    def search(self, questions, top_k: int | None = None, include_text: bool = True, **settings) -> list[list[Hit]]:
        """Top-k hits per question, from one request for the whole list.

        Parameters
        ----------
        questions : str or list of str
            One question, or a batch.
        top_k : int, optional
            Passages per question (default: the server's index's).
        include_text : bool, default True
            Ask for the passages' text (else ``Hit.text`` is "").
        **settings
            Retrieval settings sent as top-level fields (``mode="paper"``, ``delta=0.3``, ...).

        Returns
        -------
        list of Hit, or list of list of Hit
            For a string its hits; for a list one list per question. ``Hit.row`` is -1 (the server does not
            say where a passage sits in its index).

        Raises
        ------
        SearchError
            The request failed (after its retries), naming the URL, the status and the server's detail.

        Examples
        --------
        >>> client = SearchClient("http://127.0.0.1:8000")
        >>> hits = client.search("Who directed Blue River?", top_k=2, mode="paper")  # doctest: +SKIP
        >>> [hit.id for hit in hits]  # doctest: +SKIP
        ['p1', 'p2']
        """
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        httpx = _httpx()
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        body = self.payload(qs, top_k, include_text, settings)
        attempts = self._attempts()
        next(attempts)
        while True:
            try:
                outcome = (self._client.post(self.url, json=body, headers=self.headers), None)
            except httpx.TransportError as e:
                outcome = (None, e)
            try:
                wait = attempts.send(outcome)
            except StopIteration as done:
                out = self._result(*done.value, len(qs))
                return out[0] if single else out
            time.sleep(wait)

    async def asearch(self, questions, top_k: int | None = None, include_text: bool = True,
                      **settings) -> list[list[Hit]]:
        """``search`` with httpx.AsyncClient (a client per call: safe across event loops).

        Parameters
        ----------
        questions, top_k, include_text
            As for ``search``.
        **settings
            As for ``search``.

        Returns
        -------
        list of Hit, or list of list of Hit
            As for ``search``.

        Examples
        --------
        >>> hits = await client.asearch(["Who directed Blue River?"], top_k=2)  # doctest: +SKIP
        """
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        httpx = _httpx()
        body = self.payload(qs, top_k, include_text, settings)
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            attempts = self._attempts()
            next(attempts)
            while True:
                try:
                    outcome = (await client.post(self.url, json=body, headers=self.headers), None)
                except httpx.TransportError as e:
                    outcome = (None, e)
                try:
                    wait = attempts.send(outcome)
                except StopIteration as done:
                    out = self._result(*done.value, len(qs))
                    return out[0] if single else out
                await asyncio.sleep(wait)

    def _attempts(self):
        """The retry loop of search() and asearch(), written once, as a generator they drive: each sends it the
        outcome of an attempt, ``(response, None)`` or ``(None, transport error)``, and gets back the seconds to
        wait before the next attempt, or StopIteration whose value is ``(response, error, attempt, note)``, the
        outcome to report (``note``: why it was not retried further, or "")."""
        attempt = 0
        resp, exc = yield None  # started with next()
        while True:
            wait, note = self._next_wait(attempt, resp, exc)
            if wait is None:
                return resp, exc, attempt, note
            resp, exc = yield wait
            attempt += 1

    def _next_wait(self, attempt: int, resp, exc) -> tuple[float | None, str]:
        """(seconds to wait before sending again, "") or (None, why not): this attempt's outcome is the result."""
        if exc is None and resp.status_code not in RETRY_STATUSES:
            if resp.status_code == 200:
                self.retry_budget.on_success()
            return None, ""
        if exc is not None and isinstance(exc, _httpx().TimeoutException):
            return None, ""
        allowed = self.retry_budget.on_failure()
        if attempt >= self.retries:
            return None, ""
        if not allowed:
            return None, " (retry budget spent: this client has been refused too often; not retried)"
        if exc is not None:
            return backoff(attempt, failed_connection=True), ""
        given = retry_after_seconds(resp.headers.get("retry-after"))
        if given is not None and given > self.max_retry_wait:
            return None, (f" (Retry-After {resp.headers.get('retry-after')!r} is longer than max_retry_wait "
                          f"{self.max_retry_wait:g} s)")
        return min(backoff(attempt, given), max(self.max_retry_wait, given or 0.0)), ""

    def _result(self, resp, exc, attempt: int, note: str, n: int) -> list[list[Hit]]:
        """The hits of the last attempt, or its failure as one SearchError line (naming the attempts made)."""
        tries = f"{note} (after {attempt + 1} attempts)" if attempt else note
        if exc is not None:
            if isinstance(exc, _httpx().TimeoutException):
                raise SearchError(f"linearrag server {self.url}: no reply within the {self.timeout:g} s timeout{tries}")
            raise SearchError(f"linearrag server {self.url}: request failed ({type(exc).__name__}: {exc}){tries}")
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
