"""The serving pieces as a library: a LinearRAGService holds one index (swappable while serving), the
batcher, the limits and the metrics, and offers its routes as a FastAPI APIRouter.

    service = LinearRAGService("my_index", ServeSettings(max_batch_size=32))
    app = FastAPI(lifespan=service.lifespan)        # or await service.start() / stop() in your own lifespan
    app.include_router(service.router, prefix="/rag")

Routes (relative to the router's prefix): POST /v1/search, POST /v1/answer (with a chat model), GET /health,
GET /info, GET /metrics, POST /admin/reload. Every route but /health needs 'Authorization: Bearer KEY' when settings.api_key is set.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Literal, Optional

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from .. import __version__
from ..config import MODES, RetrievalConfig
from ..retrieval.memory import status_bytes
from .batcher import Batcher
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .settings import ServeSettings

log = logging.getLogger("linearrag.serve")

WARMUP_QUESTION = "Who directed the film and where was the director born?"
# upper bounds a client may set for the settings that multiply the engine's work
SETTING_BOUNDS = {"max_iterations": (1, 16), "top_k_sentence": (1, 64), "ppr_max_iter": (1, 1000),
                  "chain_passages": (0, 16), "chain_sentences": (1, 16), "chain_keep": (0, 16), "chain_rounds": (1, 4),
                  "pair_candidates": (0, 16), "rerank_candidates": (1, 50)}
# settings only the operator chooses (`linearrag serve --reranker DIR`): a request may not name a folder to load
SERVER_ONLY_SETTINGS = ("reranker",)


class ReloadRefused(Exception):
    """A new index that cannot be served (unreadable, failed verification, other models); the old one stays."""


# ---------------------------------------------------------------------------------------------- schemas
class HitOut(BaseModel):
    id: int | str
    score: float
    title: str
    text: Optional[str] = Field(None, description="only when the request set include_text")


class SearchResult(BaseModel):
    question: str
    hits: list[HitOut]


class SearchResponse(BaseModel):
    results: list[SearchResult]


def search_request_model(s: ServeSettings) -> type[BaseModel]:
    """The POST /v1/search body, with this server's limits (shown on the OpenAPI page). Retrieval settings
    are the RetrievalConfig fields, as top-level optional fields; anything else is refused."""
    Question = Annotated[str, Field(min_length=1, max_length=s.max_question_chars)]
    settings = {}
    for f in fields(RetrievalConfig):
        if f.name == "top_k" or f.name in SERVER_ONLY_SETTINGS:
            continue
        typ = type(f.default)
        if f.name == "mode":
            typ = Literal[MODES]  # type: ignore[valid-type]
        lo_hi = SETTING_BOUNDS.get(f.name)
        extra = {"ge": lo_hi[0], "le": lo_hi[1]} if lo_hi else {}
        settings[f.name] = (Optional[typ], Field(None, description=f"retrieval setting (default: the index's)", **extra))

    def check(self):
        if (self.question is None) == (self.questions is None):
            raise ValueError("give exactly one of 'question' (a string) or 'questions' (a list of strings)")
        for q in self.questions or [self.question]:
            if not q.strip():
                raise ValueError("a question is blank")
        overrides = {k: getattr(self, k) for k in settings if getattr(self, k) is not None}
        RetrievalConfig().replace(**overrides)  # its own checks (damping in (0, 1), ...), message names the field
        return self

    return create_model(
        "SearchRequest",
        __config__=ConfigDict(extra="forbid", strict=False),
        __validators__={"check": model_validator(mode="after")(check)},
        question=(Optional[Question], Field(None, description="one question")),
        questions=(Optional[list[Question]], Field(None, min_length=1, max_length=s.max_questions,
                                                   description="several questions")),
        top_k=(Optional[int], Field(None, ge=1, le=s.max_top_k, description="passages per question")),
        include_text=(bool, Field(False, description="return each passage's text")),
        **settings,
    )


class HTTPError(Exception):
    def __init__(self, status: int, detail, reason: str | None = None, headers: dict | None = None):
        self.status, self.detail, self.reason, self.headers = status, detail, reason, headers or {}


ECHO_CHARS = 80  # a 422 shows at most this much of the value it refused


def _cut_echo(error: dict) -> None:
    """A validation error names its field (``loc``) and says what is wrong (``msg``); of the value it refused it
    keeps a short one, the first ECHO_CHARS characters of a long string, and of a list or an object only its size
    (a 2,400-character question or 300 questions are not sent back)."""
    if "input" not in error:
        return
    value = error["input"]
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        error["input"] = value[:ECHO_CHARS] + f"... ({len(value)} characters)"
    elif isinstance(value, (list, dict)):
        error["input"] = f"({'a list' if isinstance(value, list) else 'an object'} of {len(value)} items)"


def _index_fingerprint(index_dir: Path) -> str | None:
    try:
        return hashlib.sha256((index_dir / "index.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _hit_dict(h, include_text: bool) -> dict:
    d = {"id": h.id, "score": h.score, "title": h.title}
    if include_text:
        d["text"] = h.text
    return d


# ---------------------------------------------------------------------------------------------- the service
class LinearRAGService:
    """One served index. ``rag``: an already loaded LinearRAG (else it is loaded from ``index_dir`` when
    the service starts, while /health answers 503). ``llm``: a generation.LLM for POST /v1/answer."""

    def __init__(self, index_dir=None, settings: ServeSettings | None = None, rag=None, llm=None):
        if index_dir is None and rag is None:
            raise ValueError("give an index folder or a loaded LinearRAG")
        self.settings = settings or ServeSettings()
        self.index_dir = Path(index_dir) if index_dir is not None else None
        self.rag = rag
        self.llm = llm  # a generation.LLM for /v1/answer (None: that route answers 503)
        self._started_ner_processes = False  # --ner-processes: stopped with the service
        self.metrics = Metrics()
        self.batcher = Batcher(self._run_batch, self.settings.max_batch_size, self.settings.max_wait_ms,
                               on_batch=self.metrics.on_batch, gather_ms=self.settings.gather_ms)
        self.ready = False
        self.load_error: str | None = None
        self.fingerprint: str | None = None
        self.loaded_at: float | None = None
        self.in_flight = 0
        self.on_fatal = None  # called with the error when the first load fails (the CLI stops the server)
        self._reload_lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task] = []
        self.SearchRequest = search_request_model(self.settings)
        self.router = self._make_router()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the batcher and load the index in the background (the routes answer 503 until ready)."""
        self._reload_lock = asyncio.Lock()
        if self.settings.threads is not None:
            from ..retrieval.pipeline import set_threads

            set_threads(self.settings.threads)  # process-wide: only when asked for
        self.batcher.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._first_load(), name="linearrag-load"))
        if self.settings.watch > 0 and self.index_dir is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._watch(), name="linearrag-watch"))

    async def stop(self) -> None:
        """Stop watching, answer what is queued, stop the engine thread."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        await self.batcher.stop()
        if self.rag is not None and self._started_ner_processes:
            self.rag.close()  # the NER worker processes this service started

    @asynccontextmanager
    async def lifespan(self, app=None):
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def _first_load(self) -> None:
        try:
            if self.rag is None:  # on the engine thread: see _load_beside
                self.rag = await self.batcher.call(self._load_rag, None)  # configured there
                self.fingerprint = _index_fingerprint(self.index_dir)
            else:
                if self.index_dir is not None:
                    self.fingerprint = _index_fingerprint(self.index_dir)
                await self.batcher.call(self._configure, self.rag)
            await self.batcher.call(self._warm, self.rag)
            self.loaded_at = time.time()
            self.ready = True
            log.info("serving %s: %s", self.index_dir or "an index in memory", self.rag.index.summary())
        except Exception as exc:  # noqa: BLE001 (reported, and the server stops)
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("cannot serve %s: %s", self.index_dir, self.load_error)
            if self.on_fatal is not None:
                self.on_fatal(exc)

    # ------------------------------------------------------------------ the engine thread
    def _load_rag(self, like):
        """Load the index folder (verified); reuse the models of ``like`` when the new index uses the same."""
        from ..api import LinearRAG
        from ..index import TriGraphIndex

        index = TriGraphIndex.load(self.index_dir, device="cpu", verify=True)
        rag = LinearRAG(index, self.settings.device, quantize=self.settings.quantize,
                        encoder_backend=self.settings.encoder_backend)
        if like is not None:
            old, new = like.index.index_config, index.index_config
            if (old.encoder, old.max_length) == (new.encoder, new.max_length) and str(rag.device) == str(like.device):
                rag._encoder = like._encoder
            if (old.spacy_model, tuple(old.dropped_labels)) == (new.spacy_model, tuple(new.dropped_labels)):
                rag._nlp = like._nlp
            if old.spacy_model == new.spacy_model:
                rag._ner_pool = like.ner_pool  # the NER worker processes load the model by name
        try:
            self._configure(rag)
            rag.graph  # noqa: B018 (device tensors prepared here, not in the first batch)
        except BaseException:
            self._drop(rag, like)
            raise
        return rag

    @staticmethod
    def _drop(rag, keep) -> None:
        """A loaded index that will not serve: stop NER worker processes it started, not those of ``keep``."""
        if rag.ner_pool is not None and (keep is None or rag.ner_pool is not keep.ner_pool):
            rag.close()

    def _load_beside(self, like):
        """_load_rag on a thread beside the engine's (a reload: batches keep running), with one torch thread.

        torch's OpenMP threads belong to the thread that runs an operation: once a second thread has run
        parallel torch work (loading an index and preparing its graph is enough), the engine thread's
        operations slow down for good (2wiki, one question at a time, 2-core CPU: 47 against 28 ms). So the
        first load runs on the engine thread itself, and a reload's load here with torch set to one thread
        (while it lasts, the engine's BLAS calls may run on one thread too)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._load_rag(like)
        finally:
            torch.set_num_threads(threads)

    def _configure(self, rag) -> None:
        """The settings that apply to a loaded index (on the engine thread, or beside it for a reload): the
        memory budget, and --ner-processes workers unless ``rag`` has some (handed over by _load_rag). The
        workers take all of a batch's NER: the engine thread waits for them without the interpreter lock,
        which the event loop then has to itself (with the engine thread taking a part, as LinearRAG does by
        default, the server gained less: benchmarks/README.md)."""
        if self.settings.memory_budget:
            from ..retrieval.memory import parse_bytes

            rag.graph.memory_budget = parse_bytes(self.settings.memory_budget)
        if self.settings.ner_processes and rag.ner_pool is None:
            rag.start_ner_processes(self.settings.ner_processes, caller_part=False)
            self._started_ner_processes = True

    def _defaults(self) -> dict:
        """The operator's retrieval settings (--rerank, --reranker) under every request's own."""
        d = {"rerank": True} if self.settings.rerank else {}
        if self.settings.reranker:
            d["reranker"] = self.settings.reranker
        return d

    def _warm(self, rag) -> None:
        """Load the models (the reranker too when it is on) and build the PageRank operator before the first
        request (engine thread)."""
        rag.search([WARMUP_QUESTION], **self._defaults())

    def _run_batch(self, key, questions: list) -> list:
        """Engine thread: one search for the batch at the largest top_k asked; each question keeps its own k
        (the engine's top-k is a prefix: ties go to the lower row whatever k is)."""
        overrides = {**self._defaults(), **dict(key)}
        k = max(q[1] for q in questions)
        timings = {}
        hits = self.rag.search([q[0] for q in questions], top_k=k, timings=timings, **overrides)
        self.metrics.on_stages(timings)
        return [h[:kq] for h, (_, kq) in zip(hits, questions)]

    def _swap(self, rag) -> None:
        self._warm(rag)
        old, self.rag = self.rag, rag
        if old is not None and old.ner_pool is not None:
            if old.ner_pool is rag.ner_pool:
                old._ner_pool = None  # the NER worker processes now belong to the new index
            else:
                old.close()  # its NER worker processes load another spaCy model

    # ------------------------------------------------------------------ reload
    async def reload(self) -> dict:
        """Load INDEX_DIR again, verify it, warm it and swap it in between two batches. A failure raises
        ReloadRefused and the old index keeps serving. Requests keep being answered meanwhile."""
        if self.index_dir is None:
            raise ReloadRefused("this service was given an index in memory, not a folder")
        if not self.ready:
            raise ReloadRefused("the first index is not loaded yet")
        async with self._reload_lock:
            fingerprint = _index_fingerprint(self.index_dir)
            t0 = time.perf_counter()
            rag = None
            try:
                rag = await asyncio.to_thread(self._load_beside, self.rag)
                await self.batcher.call(self._swap, rag)
            except Exception as exc:  # noqa: BLE001
                if rag is not None and self.rag is not rag:
                    self._drop(rag, self.rag)
                reason = f"{type(exc).__name__}: {exc}"
                self.metrics.reloads.labels("refused").inc()
                log.error("reload of %s refused, still serving the previous index: %s", self.index_dir, reason)
                raise ReloadRefused(reason) from None
            self.fingerprint = fingerprint
            self.loaded_at = time.time()
            self.metrics.reloads.labels("ok").inc()
            log.info("reloaded %s in %.2f s: %s", self.index_dir, time.perf_counter() - t0, rag.index.summary())
            return {"status": "reloaded", "fingerprint": fingerprint, "index": rag.index.summary(),
                    "seconds": round(time.perf_counter() - t0, 3)}

    async def _watch(self) -> None:
        """Reload when index.json changes (a committed `linearrag add` / `delete`)."""
        while True:
            await asyncio.sleep(self.settings.watch)
            if not self.ready or self._reload_lock.locked():
                continue
            current = _index_fingerprint(self.index_dir)
            if current is not None and current != self.fingerprint:
                try:
                    await self.reload()
                except ReloadRefused:
                    self.fingerprint = current  # logged; do not retry the same bad index every tick

    # ------------------------------------------------------------------ requests
    async def search(self, body: dict) -> dict:
        """Validate a /v1/search body, answer it through the batcher (used by the route; callable directly)."""
        req = self._validate(body)
        questions, hits = await self._admitted(self._hits, req)
        return {"results": [
            {"question": q, "hits": [_hit_dict(h, req.include_text) for h in hs]} for q, hs in zip(questions, hits)]}

    async def answer(self, body: dict) -> dict:
        """/v1/answer: the /v1/search body; the questions' hits (batched as for search) go to the chat model."""
        from ..answers.generation import LLMError, aanswer_batch

        req = self._validate(body)
        if self.llm is None:
            raise HTTPError(503, "no chat model configured: start the server with --llm-base-url and --llm-model "
                                 "(or LINEARRAG_LLM_BASE_URL / LINEARRAG_LLM_MODEL)", "llm_error")

        async def work(r):
            questions, hits = await self._hits(r)
            try:
                return await aanswer_batch(hits, questions, self.llm, top_k=max(1, max(map(len, hits), default=1)))
            except LLMError as exc:
                raise HTTPError(502, str(exc), "llm_error") from None

        answers = await self._admitted(work, req)
        return {"results": [a.to_dict(include_text=req.include_text) for a in answers]}

    async def _hits(self, req):
        """(questions, hits per question) of a validated request, through the batcher."""
        questions = req.questions if req.questions is not None else [req.question]
        top_k = req.top_k or self.rag.config.top_k
        hits = await asyncio.wait_for(self.batcher.submit(self.batch_key(req), [(q, top_k) for q in questions]),
                                      self.settings.timeout)
        return questions, hits

    @staticmethod
    def batch_key(req) -> tuple:
        """The request's retrieval settings as a hashable key: only questions with the same key share a batch."""
        return tuple(sorted((k, getattr(req, k)) for k in type(req).model_fields
                            if k not in ("question", "questions", "top_k", "include_text") and getattr(req, k) is not None))

    async def _admitted(self, work, req):
        """Run ``work(req)`` as one request in flight: 503 before the index is ready, 429 past max_concurrent,
        504 when its search is not answered within the timeout (the chat model has its own timeouts)."""
        self.refuse_if_busy()
        self.in_flight += 1
        self.metrics.in_flight.inc()
        try:
            return await work(req)
        except asyncio.TimeoutError:
            raise HTTPError(504, f"not answered within {self.settings.timeout} s", "timeout") from None
        except HTTPError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.exception("engine error")
            raise HTTPError(500, f"engine error: {type(exc).__name__}: {exc}", "engine_error") from None
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            self.metrics.queued.set(self.batcher.queued)

    def refuse_if_busy(self) -> None:
        """503 before the index is ready, 429 (Retry-After: 1) while max_concurrent requests are in flight. The
        routes call it before reading the body too, so that a refused request costs the least."""
        self._check_ready()
        if self.in_flight >= self.settings.max_concurrent:
            raise HTTPError(429, f"more than {self.settings.max_concurrent} requests in flight; retry shortly",
                            "overloaded", {"Retry-After": "1"})

    def _validate(self, body):
        try:
            return self.SearchRequest.model_validate(body)
        except ValidationError as exc:
            errors = [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors(include_url=False)]
            for e in errors:
                e.pop("ctx", None)
                _cut_echo(e)
            raise HTTPError(422, jsonable_encoder(errors), "invalid") from None

    def _check_ready(self) -> None:
        if not self.ready:
            detail = f"the index failed to load: {self.load_error}" if self.load_error else "the index is loading"
            raise HTTPError(503, detail, "not_ready", {"Retry-After": "1"})

    async def read_json(self, request: Request):
        """The request body as JSON, refusing bodies over max_body_bytes (413) before reading them whole."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"request body of {declared} bytes is over the limit of {limit}", "body_too_large")
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise HTTPError(413, f"request body is over the limit of {limit} bytes", "body_too_large")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise HTTPError(422, [{"type": "json_invalid", "loc": ["body"], "msg": f"invalid JSON: {msg}"}],
                            "invalid") from None

    async def ainfo(self) -> dict:
        """GET /info (a service answering from elsewhere, such as the Ray ingress, overrides this)."""
        return self.info()

    def info(self) -> dict:
        import torch

        rag = self.rag if self.ready else None
        memory = {"rss_bytes": status_bytes("VmRSS")}
        if rag is not None:
            memory["index_tensors_bytes"] = rag.graph.nbytes()
            memory["memory_budget_bytes"] = rag.graph.memory_budget
            if rag.device.type == "cuda":
                memory["cuda_allocated_bytes"] = torch.cuda.memory_allocated(rag.device)
        return {
            "version": __version__,
            "ready": self.ready,
            "index_dir": str(self.index_dir) if self.index_dir else None,
            "fingerprint": self.fingerprint,
            "loaded_at": self.loaded_at,
            "index": rag.index.summary() if rag else None,
            "settings": rag.config.to_dict() if rag else None,
            "index_config": rag.index.index_config.to_dict() if rag else None,
            "device": str(rag.device) if rag else self.settings.device,
            "server": self.settings.public(),
            "llm": {"base_url": self.llm.base_url, "model": self.llm.model} if self.llm is not None else None,
            "torch_threads": torch.get_num_threads(),
            "memory": memory,
            "queued_questions": self.batcher.queued,
            "in_flight": self.in_flight,
        }

    # ------------------------------------------------------------------ routes
    def _auth(self, request: Request) -> None:
        key = self.settings.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise HTTPError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "unauthorized",
                            {"WWW-Authenticate": "Bearer"})

    def _respond(self, route: str, t0: float, payload=None, error: HTTPError | None = None, raw: Response | None = None):
        if error is not None:
            if error.reason:
                self.metrics.failures.labels(error.reason).inc()
            resp = JSONResponse({"detail": error.detail}, status_code=error.status, headers=error.headers)
        else:
            resp = raw if raw is not None else JSONResponse(payload)
        self.metrics.request_seconds.labels(route, str(resp.status_code)).observe(time.perf_counter() - t0)
        return resp

    def _make_router(self) -> APIRouter:
        router = APIRouter()
        svc = self
        auth_doc = {"401": {"description": "missing or wrong API key"}} if self.settings.api_key else {}

        async def guarded(route: str, request: Request, work):
            t0 = time.perf_counter()
            try:
                svc._auth(request)
                result = await work()
            except HTTPError as err:
                return svc._respond(route, t0, error=err)
            if isinstance(result, Response):
                return svc._respond(route, t0, raw=result)
            return svc._respond(route, t0, result)

        @router.post("/v1/search", response_model=SearchResponse, summary="Top-k passages for each question",
                     openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                         "schema": self.SearchRequest.model_json_schema()}}}},
                     responses={**auth_doc, "413": {"description": "body too large"},
                                "422": {"description": "invalid body (the field is named)"},
                                "429": {"description": "too many requests in flight (see Retry-After)"},
                                "503": {"description": "index not loaded yet"},
                                "504": {"description": "not answered within the timeout"}})
        async def search(request: Request):
            async def work():
                svc.refuse_if_busy()
                return await svc.search(await svc.read_json(request))
            return await guarded("/v1/search", request, work)

        @router.post("/v1/answer", summary="An answer from the chat model over each question's top-k passages",
                     openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                         "schema": self.SearchRequest.model_json_schema()}}}},
                     responses={**auth_doc, "502": {"description": "the chat model's endpoint failed (URL and status)"},
                                "503": {"description": "index not loaded yet, or no chat model configured"}})
        async def answer(request: Request):
            async def work():
                svc.refuse_if_busy()
                return await svc.answer(await svc.read_json(request))
            return await guarded("/v1/answer", request, work)

        @router.get("/health", summary="200 when the index and models are loaded, else 503")
        async def health():
            if svc.ready:
                return JSONResponse({"status": "ok", "fingerprint": svc.fingerprint})
            status = "failed" if svc.load_error else "loading"
            return JSONResponse({"status": status, "detail": svc.load_error}, status_code=503)

        @router.get("/info", summary="index counts, settings, device, version, memory")
        async def info(request: Request):
            async def work():
                return await svc.ainfo()
            return await guarded("/info", request, work)

        @router.get("/metrics", summary="Prometheus metrics")
        async def metrics(request: Request):
            async def work():
                svc.metrics.queued.set(svc.batcher.queued)
                return Response(svc.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
            return await guarded("/metrics", request, work)

        @router.post("/admin/reload", summary="load INDEX_DIR again and swap it in with no failed request",
                     responses={"409": {"description": "the new index was refused; the old one keeps serving"}})
        async def reload(request: Request):
            async def work():
                try:
                    return await svc.reload()
                except ReloadRefused as exc:
                    raise HTTPError(409, f"reload refused, still serving the previous index: {exc}") from None
            return await guarded("/admin/reload", request, work)

        return router
