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
"""
from __future__ import annotations

from contextlib import contextmanager

from .api import Hit


class SearchError(RuntimeError):
    """A failed search request: ``str(exc)`` names the URL, the HTTP status (if any) and the detail."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _httpx():
    try:
        import httpx
    except ImportError:
        raise ImportError('SearchClient needs httpx: pip install "linearrag_torch[serve]"') from None
    return httpx


class SearchClient:
    """Client of a `linearrag serve` server. base_url: e.g. "http://127.0.0.1:8000" (the "/v1/search"
    path is added). api_key: sent as "Authorization: Bearer KEY" (default: $LINEARRAG_API_KEY if set).
    timeout: seconds per request. One httpx.Client is kept (call close(), or use ``with``)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0):
        import os

        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1/search"):
            self.base_url = self.base_url[: -len("/v1/search")]
        self.url = self.base_url + "/v1/search"
        self._api_key = api_key if api_key is not None else os.environ.get("LINEARRAG_API_KEY")
        self.timeout = timeout
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
        with self._transport_errors():
            resp = self._client.post(self.url, json=self.payload(qs, top_k, include_text, settings), headers=self.headers)
        out = self._parse(resp, len(qs))
        return out[0] if single else out

    async def asearch(self, questions, top_k: int | None = None, include_text: bool = True,
                      **settings) -> list[list[Hit]]:
        """search() with httpx.AsyncClient (a client per call: safe across event loops)."""
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        httpx = _httpx()
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            with self._transport_errors():
                resp = await client.post(self.url, json=self.payload(qs, top_k, include_text, settings),
                                         headers=self.headers)
        out = self._parse(resp, len(qs))
        return out[0] if single else out

    @contextmanager
    def _transport_errors(self):
        """A timeout or a failed connection as one SearchError line naming the URL."""
        httpx = _httpx()
        try:
            yield
        except httpx.TimeoutException:
            raise SearchError(f"linearrag server {self.url}: no reply within the {self.timeout:g} s timeout") from None
        except httpx.HTTPError as exc:
            raise SearchError(f"linearrag server {self.url}: request failed ({type(exc).__name__}: {exc})") from None

    def _parse(self, resp, n: int) -> list[list[Hit]]:
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
            raise SearchError(f"linearrag server {self.url}: HTTP {resp.status_code}: {detail}", resp.status_code)
        try:
            results = resp.json()["results"]
            if len(results) != n:
                raise ValueError(f"{len(results)} results for {n} questions")
            return [[Hit(h["id"], float(h["score"]), h.get("title") or "", h.get("text") or "", -1)
                     for h in r["hits"]] for r in results]
        except (ValueError, KeyError, TypeError) as exc:
            raise SearchError(f"linearrag server {self.url}: malformed reply ({type(exc).__name__}: {exc})",
                              resp.status_code) from None
