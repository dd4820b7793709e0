"""An OpenAI-compatible chat-completions endpoint, called through the official ``openai`` client
(``pip install "linearrag_torch[gen]"``): ``LLM`` with its settings from the arguments, else from the environment
(LINEARRAG_LLM_BASE_URL or OPENAI_BASE_URL, LINEARRAG_LLM_MODEL, LINEARRAG_LLM_API_KEY or OPENAI_API_KEY,
LINEARRAG_LLM_CACHE: a file path, or "off"; the key is never logged or printed). Requests run ``concurrency`` at a
time; 429, 5xx, timeouts and connection failures are retried with exponential backoff (honouring Retry-After); any
other failure raises ``LLMError`` with one line naming the URL and the HTTP status. Replies are cached on disk
(answers/cache.py)."""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from .. import env
from .cache import ResponseCache

ENV_BASE_URL = env.LLM_BASE_URL.name
ENV_MODEL = env.LLM_MODEL.name
ENV_API_KEY = env.LLM_API_KEY.name
ENV_CACHE = env.LLM_CACHE.name
DEFAULT_CACHE = Path(env.LLM_CACHE.default)
_DEFAULT = object()  # "cache argument not given"


class LLMError(RuntimeError):
    """A failed chat-completions call (after retries where retrying made sense), or a missing setting.
    ``str(exc)`` is one line naming the endpoint URL and, where there was one, the HTTP status."""

    def __init__(self, message: str, status: int | None = None, url: str | None = None):
        super().__init__(message)
        self.status = status
        self.url = url



@dataclass
class ChatReply:
    text: str
    usage: dict  # prompt_tokens, completion_tokens, total_tokens (as the endpoint reported them; 0 if not)
    cached: bool  # True: read from the cache, no tokens spent now
    attempts: int = 0  # HTTP requests made (0 for a cached reply)


def _resolve_cache(cache):
    if cache is _DEFAULT:
        cache = env.LLM_CACHE.get()
    if cache is None or cache is False or (isinstance(cache, str) and cache.lower() in ("off", "none", "")):
        return None
    return cache if isinstance(cache, ResponseCache) else ResponseCache(cache)


def require_gen_extra() -> None:
    """LLMError in one line when the ``openai`` package (the ``gen`` extra) is not installed."""
    import importlib.util

    if importlib.util.find_spec("openai") is None:
        raise LLMError("answers need the 'gen' extra: pip install 'linearrag_torch[gen]'")


class LLM:
    """An OpenAI-compatible chat-completions endpoint with retries, bounded concurrency and a disk cache.

    base_url, model, api_key: arguments, else the environment (module docstring). timeout: seconds per
    request. max_retries: further attempts after a 429 / 5xx / timeout / connection failure (waits
    backoff * 2**attempt seconds with jitter, at most max_backoff, or the server's Retry-After).
    concurrency: requests in flight at once in chat_many. cache: a path, a ResponseCache, None/"off"
    (no cache) or, by default, $LINEARRAG_LLM_CACHE or ~/.cache/linearrag_torch/llm_cache.sqlite. notify: called
    with one line before a retry's wait (what failed, how long the wait and the waits left are), once per
    failure and attempt however many requests meet it; `linearrag answer` prints it, so that a refused
    connection is not a silent pause of up to ``backoff * (2**max_retries - 1)`` seconds.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None, *,
                 timeout: float = 60.0, max_retries: int = 4, concurrency: int = 8, temperature: float = 0.0,
                 max_tokens: int | None = 512, cache=_DEFAULT, backoff: float = 1.0, max_backoff: float = 30.0,
                 notify=None):
        require_gen_extra()  # before any work: `linearrag answer` names the missing extra, not a traceback later
        self.base_url = base_url or env.LLM_BASE_URL.get() or env.OPENAI_BASE_URL.get()
        self.model = model or env.LLM_MODEL.get()
        if not self.base_url:
            raise LLMError(f"no LLM endpoint: pass --llm-base-url / base_url= or set {ENV_BASE_URL}")
        if not self.model:
            raise LLMError(f"no LLM model: pass --llm-model / model= or set {ENV_MODEL}")
        self._api_key = api_key or env.LLM_API_KEY.get() or env.OPENAI_API_KEY.get() or "EMPTY"
        if timeout <= 0 or max_retries < 0 or concurrency < 1:
            raise ValueError("LLM: timeout must be > 0, max_retries >= 0 and concurrency >= 1")
        self.timeout, self.max_retries, self.concurrency = float(timeout), int(max_retries), int(concurrency)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.settings = {"temperature": temperature, "max_tokens": max_tokens}
        self.cache = _resolve_cache(cache)
        self.url = self.base_url.rstrip("/") + "/chat/completions"
        self._client = None
        self._client_lock = threading.Lock()
        self.notify = notify
        self._notified: set = set()  # (failure, attempt) already reported through notify

    def __repr__(self) -> str:  # never shows the key
        return f"LLM(base_url={self.base_url!r}, model={self.model!r}, cache={getattr(self.cache, 'path', None)!s})"

    def with_model(self, model: str | None = None, base_url: str | None = None) -> "LLM":
        """The same endpoint settings, key and cache for another model (and/or URL), e.g. a judge."""
        return LLM(base_url or self.base_url, model or self.model, self._api_key, timeout=self.timeout,
                   max_retries=self.max_retries, concurrency=self.concurrency, cache=self.cache,
                   backoff=self.backoff, max_backoff=self.max_backoff, notify=self.notify, **self.settings)

    @property
    def client(self):
        with self._client_lock:
            if self._client is None:
                require_gen_extra()
                import openai

                self._client = openai.OpenAI(base_url=self.base_url, api_key=self._api_key, timeout=self.timeout,
                                             max_retries=0)  # retries are ours (backoff, Retry-After, messages)
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ------------------------------------------------------------------ one request
    def chat(self, messages: list[dict], **settings) -> ChatReply:
        """One chat completion (from the cache when it holds the same model + messages + settings)."""
        settings = {**self.settings, **settings}
        key = ResponseCache.key(self.model, messages, settings) if self.cache is not None else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return ChatReply(hit["text"], hit["usage"], cached=True)
        text, usage, attempts = self._request(messages, settings)
        if key is not None:
            self.cache.put(key, self.model, text, usage)
        return ChatReply(text, usage, cached=False, attempts=attempts)

    def _request(self, messages, settings) -> tuple[str, dict, int]:
        import openai

        client = self.client
        kwargs = {k: v for k, v in settings.items() if v is not None}
        attempt = 0
        t0 = time.monotonic()
        while True:
            attempt += 1
            retry_after = None
            try:
                resp = client.chat.completions.create(model=self.model, messages=messages, **kwargs)
            except openai.APITimeoutError:
                problem = f"no reply within the {self.timeout:g} s timeout"
                status = None
            except openai.APIConnectionError as exc:
                problem = f"connection failed ({_cause(exc)})"
                status = None
            except openai.APIStatusError as exc:
                status = exc.status_code
                problem = f"HTTP {status}{_detail(exc, None if self._api_key == 'EMPTY' else self._api_key)}"
                if status != 429 and status < 500:
                    raise LLMError(f"LLM endpoint {self.url}: {problem}", status, self.url) from None
                retry_after = _retry_after(exc.response)
            except (ValueError, TypeError) as exc:  # a 200 whose body is not JSON
                raise LLMError(f"LLM endpoint {self.url}: malformed reply (HTTP 200, body is not a chat "
                               f"completion: {_short(str(exc))})", 200, self.url) from None
            else:
                return (*_parse_completion(resp, self.url), attempt)
            if attempt > self.max_retries:
                hint = ""
                if problem.startswith("connection failed"):
                    hint = (f"; nothing answers at {self.base_url}: start the server there, or give another URL "
                            f"(--llm-base-url or ${ENV_BASE_URL})")
                raise LLMError(f"LLM endpoint {self.url}: {problem} (gave up after {attempt} "
                               f"attempt{'' if attempt == 1 else 's'} in {time.monotonic() - t0:.0f} s){hint}", status, self.url)
            delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            if retry_after is not None:
                delay = min(self.max_backoff, max(delay, retry_after))
            self._tell(problem, attempt, delay)
            time.sleep(delay)

    def _tell(self, problem: str, attempt: int, delay: float) -> None:
        """notify(one line) before the wait of retry ``attempt``, once per failure and attempt."""
        if self.notify is None:
            return
        with self._client_lock:
            if (problem, attempt) in self._notified:
                return
            self._notified.add((problem, attempt))
        later = sum(min(self.max_backoff, self.backoff * 2 ** (a - 1)) for a in range(attempt + 1, self.max_retries + 1))
        self.notify(f"LLM endpoint {self.url}: {problem}; attempt {attempt + 1} of {self.max_retries + 1} in "
                    f"{delay:.1f} s" + (f" (then waits of up to {later:.0f} s more before giving up)" if later else
                                        " (the last)"))

    # ------------------------------------------------------------------ many requests
    def chat_many(self, conversations: list[list[dict]], **settings) -> list[ChatReply]:
        """chat() for every conversation, at most ``concurrency`` requests in flight; replies in input
        order. Cached ones are read first and make no request. The first failure raises (LLMError)."""
        replies: list[ChatReply | None] = [None] * len(conversations)
        settings = {**self.settings, **settings}
        todo = []
        for i, msgs in enumerate(conversations):
            if self.cache is not None:
                hit = self.cache.get(ResponseCache.key(self.model, msgs, settings))
                if hit is not None:
                    replies[i] = ChatReply(hit["text"], hit["usage"], cached=True)
                    continue
            todo.append(i)
        if len(todo) == 1 or self.concurrency == 1:
            for i in todo:
                replies[i] = self.chat(conversations[i], **settings)
        elif todo:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(todo))) as pool:
                futures = {pool.submit(self.chat, conversations[i], **settings): i for i in todo}
                done, pending = wait(futures, return_when=FIRST_EXCEPTION)
                for f in pending:
                    f.cancel()
                for f in done:
                    if f.exception() is not None:
                        pool.shutdown(wait=True, cancel_futures=True)
                        raise f.exception()
                for f, i in futures.items():
                    replies[i] = f.result()
        return replies  # type: ignore[return-value]


def _parse_completion(resp, url: str) -> tuple[str, dict]:
    try:
        text = resp.choices[0].message.content
    except (AttributeError, IndexError, TypeError, KeyError):
        text = None
    if not isinstance(text, str):
        raise LLMError(f"LLM endpoint {url}: malformed reply (HTTP 200 without choices[0].message.content)",
                       200, url)
    u = getattr(resp, "usage", None)
    usage = {k: int(getattr(u, k, 0) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return text, usage


def _short(text: str, n: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _detail(exc, api_key: str | None) -> str:
    """The endpoint's error message (JSON "error.message" / "detail", else the body), one short line, with
    the API key masked should the endpoint echo it."""
    body = getattr(exc, "body", None)
    msg = None
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err
        msg = msg or body.get("detail")
    if not msg:
        try:
            msg = exc.response.text
        except Exception:  # noqa: BLE001
            msg = ""
    msg = _short(str(msg or "")).replace(api_key, "***") if api_key else _short(str(msg or ""))
    return f": {msg}" if msg else ""


def _cause(exc) -> str:
    c = exc.__cause__ or exc.__context__
    return _short(str(c) or type(c).__name__, 120) if c is not None else "unknown error"


def _retry_after(response) -> float | None:
    try:
        value = float(response.headers.get("retry-after"))
    except (AttributeError, TypeError, ValueError):
        return None
    return value if value >= 0 else None
