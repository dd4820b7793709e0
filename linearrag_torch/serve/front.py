"""The HTTP front of the server: request validation, admission (limits, 429/503/504), the routes of a FastAPI
APIRouter, and the metrics of requests. It answers searches through an engine host (serve/engine_host.py:
LocalEngineHost in this process, or ray_app.RayEngineHost in front of Ray Serve replicas).

Routes (relative to the router's prefix): POST /v1/search, POST /v1/answer (with a chat model), GET /health,
GET /info, GET /metrics, POST /admin/reload. Every route but /health needs 'Authorization: Bearer KEY' when
settings.api_key is set.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from .engine_host import ReloadRefused
from .metrics import CONTENT_TYPE_LATEST
from .schemas import SearchResponse, cut_echo, hit_dict, search_request_model

log = logging.getLogger("linearrag.serve")


class HTTPError(Exception):
    def __init__(self, status: int, detail, reason: str | None = None, headers: dict | None = None):
        self.status, self.detail, self.reason, self.headers = status, detail, reason, headers or {}


class HTTPFront:
    """The routes (``router``) and admission of one engine host. ``llm``: a generation.LLM for POST /v1/answer
    (None: that route answers 503). ``lifespan`` starts and stops the host."""

    def __init__(self, host, llm=None):
        self.host = host
        self.settings = host.settings
        self.metrics = host.metrics
        self.llm = llm
        self.in_flight = 0
        self.SearchRequest = search_request_model(self.settings)
        self.router = self._make_router()

    @property
    def lifespan(self):
        return self.host.lifespan

    # ------------------------------------------------------------------ requests
    async def search(self, body: dict) -> dict:
        """Validate a /v1/search body, answer it through the batcher (used by the route; callable directly)."""
        req = self._validate(body)
        questions, hits = await self._admitted(self._hits, req)
        return {"results": [
            {"question": q, "hits": [hit_dict(h, req.include_text) for h in hs]} for q, hs in zip(questions, hits)]}

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
        top_k = req.top_k or self.host.default_top_k
        hits = await asyncio.wait_for(self.host.hits(self.batch_key(req), [(q, top_k) for q in questions]),
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
            self.metrics.queued.set(self.host.queued)

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
                cut_echo(e)
            raise HTTPError(422, jsonable_encoder(errors), "invalid") from None

    def _check_ready(self) -> None:
        host = self.host
        if not host.ready:
            detail = f"the index failed to load: {host.load_error}" if host.load_error else "the index is loading"
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

    async def info(self) -> dict:
        """GET /info: the engine host's description with the front's own figures."""
        return {**await self.host.info(),
                "llm": {"base_url": self.llm.base_url, "model": self.llm.model} if self.llm is not None else None,
                "in_flight": self.in_flight}

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
            host = svc.host
            if host.ready:
                return JSONResponse({"status": "ok", "fingerprint": host.fingerprint})
            status = "failed" if host.load_error else "loading"
            return JSONResponse({"status": status, "detail": host.load_error}, status_code=503)

        @router.get("/info", summary="index counts, settings, device, version, memory")
        async def info(request: Request):
            async def work():
                return await svc.info()
            return await guarded("/info", request, work)

        @router.get("/metrics", summary="Prometheus metrics")
        async def metrics(request: Request):
            async def work():
                svc.metrics.queued.set(svc.host.queued)
                return Response(svc.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
            return await guarded("/metrics", request, work)

        @router.post("/admin/reload", summary="load INDEX_DIR again and swap it in with no failed request",
                     responses={"409": {"description": "the new index was refused; the old one keeps serving"}})
        async def reload(request: Request):
            async def work():
                try:
                    return await svc.host.reload()
                except ReloadRefused as exc:
                    raise HTTPError(409, f"reload refused, still serving the previous index: {exc}") from None
            return await guarded("/admin/reload", request, work)

        return router
