"""Answers: retrieve passages, ask a chat model, parse its marked final answer.

    from linearrag_torch.answers.generation import LLM, answer_batch
    llm = LLM(base_url="http://localhost:8000/v1", model="qwen2.5-7b-instruct")   # or from the environment
    for a in answer_batch(rag, ["Who directed X?"], llm, top_k=5):
        print(a.answer, [p.id for p in a.passages])

The model is any OpenAI-compatible chat-completions endpoint, called through the official ``openai``
client (``pip install "linearrag_torch[gen]"``). Settings come from the arguments, else from the
environment: LINEARRAG_LLM_BASE_URL (or OPENAI_BASE_URL), LINEARRAG_LLM_MODEL, LINEARRAG_LLM_API_KEY (or
OPENAI_API_KEY), LINEARRAG_LLM_CACHE (a file path, or "off"). The key is never logged or printed.

Every reply is cached in SQLite (default ~/.cache/linearrag_torch/llm_cache.sqlite), keyed on the model,
the messages and the generation settings (temperature, max_tokens), so a rerun costs no tokens. Requests
run ``concurrency`` at a time; 429, 5xx, timeouts and connection failures are retried with exponential
backoff (honouring Retry-After); any other failure raises LLMError with one line naming the URL and
the HTTP status.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import sqlite3
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from .. import env

ENV_BASE_URL = env.LLM_BASE_URL.name
ENV_MODEL = env.LLM_MODEL.name
ENV_API_KEY = env.LLM_API_KEY.name
ENV_CACHE = env.LLM_CACHE.name
DEFAULT_CACHE = Path(env.LLM_CACHE.default)
DEFAULT_TOP_K = 5
_DEFAULT = object()  # "cache argument not given"

SYSTEM_PROMPT = (
    "You answer questions from the numbered passages you are given. Some passages may be irrelevant, and "
    "a question may need facts from two or more passages combined (for example: first find who directed "
    "a film, then where that person was born). Reason briefly, in at most a few short sentences, citing "
    "passage numbers. Then end your reply with one final line of exactly this form:\n"
    "Answer: <the answer>\n"
    "The answer is as short as possible: a name, a place, a date, a number, or yes / no; not a sentence. "
    "If the passages do not settle the question, give your best guess on that line anyway."
)

JUDGE_PROMPT = (
    "You grade answers to questions. You are given a question, the gold answer(s) (any one of them is "
    "right) and a predicted answer. The prediction is correct when it means the same as a gold answer, "
    "even if it is worded differently, longer or shorter (e.g. 'NYC' for 'New York City', "
    "'Obama' for 'Barack Obama'), and incorrect when it names something else, is vague, or hedges between "
    "several answers. Reply with exactly one word: correct or incorrect."
)


class LLMError(RuntimeError):
    """A failed chat-completions call (after retries where retrying made sense), or a missing setting.
    ``str(exc)`` is one line naming the endpoint URL and, where there was one, the HTTP status."""

    def __init__(self, message: str, status: int | None = None, url: str | None = None):
        super().__init__(message)
        self.status = status
        self.url = url


# ----------------------------------------------------------------------------------------- cache
class ResponseCache:
    """Chat replies on disk (SQLite), keyed on sha256 of model + messages + settings. Thread-safe;
    several processes may share a file (WAL journal, writes retried while another holds the lock)."""

    def __init__(self, path):
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._conn = None

    @staticmethod
    def key(model: str, messages: list[dict], settings: dict) -> str:
        blob = json.dumps({"model": model, "messages": messages, "settings": settings}, sort_keys=True,
                          ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, model TEXT NOT NULL, "
                         "reply TEXT NOT NULL, usage TEXT NOT NULL, created REAL NOT NULL)")
            conn.commit()
            self._conn = conn
        return self._conn

    def get(self, key: str) -> dict | None:
        with self._lock:
            row = self._db().execute("SELECT reply, usage FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else {"text": row[0], "usage": json.loads(row[1])}

    def put(self, key: str, model: str, text: str, usage: dict) -> None:
        with self._lock:
            db = self._db()
            db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?)",
                       (key, model, text, json.dumps(usage), time.time()))
            db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db().execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# ----------------------------------------------------------------------------------------- client
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


# ----------------------------------------------------------------------------------------- answers
_MARKER_LINE = re.compile(r"^[\s>*_#-]*(?:final\s+)?answer\s*[*_]*\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_MARKER_ANY = re.compile(r"\b(?:final\s+)?answer\s*[*_]*\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)


def build_messages(question: str, passages) -> list[dict]:
    """The chat messages for one question and its passages (Hit objects or dicts with title/text)."""
    blocks = []
    for i, p in enumerate(passages, 1):
        title, text = _get(p, "title") or "", _get(p, "text") or ""
        blocks.append(f"[{i}] {title}\n{text}".strip() if title else f"[{i}] {text}")
    context = "\n\n".join(blocks) if blocks else "(no passage was found)"
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Passages:\n\n{context}\n\nQuestion: {question}"}]


def parse_answer(reply: str) -> tuple[str, bool]:
    """(answer, marker_found): the text after the last "Answer:" marker (a line starting with it, else
    anywhere; markdown emphasis and quotes stripped; the next line when the marker's line is empty),
    or the whole reply, stripped, when there is no marker."""
    reply = reply or ""
    matches = list(_MARKER_LINE.finditer(reply)) or list(_MARKER_ANY.finditer(reply))
    if not matches:
        return reply.strip(), False
    m = matches[-1]
    ans = m.group(1).strip()
    if not ans:
        rest = [ln.strip() for ln in reply[m.end():].splitlines() if ln.strip()]
        ans = rest[0] if rest else ""
    ans = ans.strip(" \t*_`\"'“”‘’")
    return ans, True


@dataclass
class Answer:
    question: str
    answer: str  # the parsed final answer
    reply: str  # the model's whole reply
    passages: list  # the passages shown to the model, best first (Hit objects, or the dicts given)
    marker_found: bool  # False: no "Answer:" line, so answer is the whole reply
    usage: dict = field(default_factory=dict)  # token counts of the reply (as stored, for cached ones too)
    cached: bool = False  # True: the reply came from the cache (no tokens spent)

    def to_dict(self, include_text: bool = True) -> dict:
        ps = []
        for p in self.passages:
            d = {"id": _get(p, "id"), "score": _get(p, "score"), "title": _get(p, "title") or ""}
            if include_text:
                d["text"] = _get(p, "text") or ""
            ps.append(d)
        return {"question": self.question, "answer": self.answer, "reply": self.reply,
                "marker_found": self.marker_found, "cached": self.cached, "usage": self.usage, "passages": ps}


def _get(p, name):
    return p.get(name) if isinstance(p, dict) else getattr(p, name, None)


def as_llm(llm) -> LLM:
    """An LLM from an LLM (returned as is), None (everything from the environment) or a dict of LLM kwargs."""
    if isinstance(llm, LLM):
        return llm
    if llm is None:
        return LLM()
    if isinstance(llm, dict):
        return LLM(**llm)
    raise TypeError(f"llm must be an LLM, a dict of LLM arguments or None, got {type(llm).__name__}")


def answer_batch(rag_or_hits, questions, llm=None, top_k: int = DEFAULT_TOP_K, **overrides) -> list[Answer]:
    """Answer every question from its top-k passages.

    rag_or_hits: a LinearRAG (one batched ``rag.search(questions, top_k, **overrides)`` call) or, for
    callers that searched already, one list of hits per question (Hit objects, or dicts with "id",
    "score", "title", "text"; only the first top_k of each are used). llm: an LLM, a dict of LLM
    arguments, or None (the environment). Returns one Answer per question, in order; raises LLMError
    (one line: URL and status) when the endpoint fails after its retries.
    """
    questions = [questions] if isinstance(questions, str) else list(questions)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if hasattr(rag_or_hits, "search"):
        hits = rag_or_hits.search(questions, top_k=top_k, **overrides) if questions else []
    else:
        hits = [list(h)[:top_k] for h in rag_or_hits]
        if len(hits) != len(questions):
            raise ValueError(f"{len(questions)} questions but {len(hits)} hit lists")
    if not questions:
        return []
    model = as_llm(llm)
    replies = model.chat_many([build_messages(q, h) for q, h in zip(questions, hits)])
    out = []
    for q, h, r in zip(questions, hits, replies):
        ans, found = parse_answer(r.text)
        out.append(Answer(q, ans, r.text, h, found, r.usage, r.cached))
    return out


async def aanswer_batch(rag_or_hits, questions, llm=None, top_k: int = DEFAULT_TOP_K, **overrides) -> list[Answer]:
    """answer_batch in a worker thread (for an asyncio server)."""
    return await asyncio.to_thread(answer_batch, rag_or_hits, questions, llm, top_k, **overrides)


def judge_batch(llm, questions, golds, predictions) -> tuple[list[bool | None], list[ChatReply]]:
    """(verdicts, replies): per question True (correct), False (incorrect) or None (the judge's reply was
    neither word), and the judge's ChatReply (usage, cached). ``golds``: one list of aliases per question."""
    model = as_llm(llm)
    convs = []
    for q, g, p in zip(questions, golds, predictions):
        gold = " | ".join(str(a) for a in (g or [])) or "(none)"
        convs.append([{"role": "system", "content": JUDGE_PROMPT},
                      {"role": "user", "content": f"Question: {q}\nGold answer(s): {gold}\nPredicted answer: {p}\n"
                                                  "Is the predicted answer correct? Reply correct or incorrect."}])
    replies = model.chat_many(convs, max_tokens=8)
    return [parse_verdict(r.text) for r in replies], replies


def parse_verdict(text: str) -> bool | None:
    """"correct" -> True, "incorrect" -> False (first word, case and punctuation ignored), else None."""
    words = re.findall(r"[a-z]+", (text or "").lower())
    if not words:
        return None
    if words[0] in ("correct", "incorrect"):
        return words[0] == "correct"
    if "incorrect" in words or "not correct" in " ".join(words):
        return False
    return True if "correct" in words else None
