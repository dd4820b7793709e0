"""The HTTP front of the server: request validation, admission (limits, 429/503/504), the routes of a FastAPI
APIRouter, and the metrics of requests. It answers searches through an engine host (serve/engine_host.py:
LocalEngineHost in this process, or ray_app.RayEngineHost in front of Ray Serve replicas).

Routes (relative to the router's prefix): POST /v1/search, POST /v1/explain (the search with how each hit was
reached; an engine host in this process), POST /v1/answer (only with a chat model), GET /health, GET /info,
GET /metrics, POST /admin/reload; and GET / (the page, serve/page.py). Every route but /health needs 'Authorization: Bearer KEY' when
settings.api_key is set.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import time
from typing import Any

from fastapi import APIRouter, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from ..answers.chat import LLMError
from ..answers.generation import aanswer_batch
from . import schemas
from .admission import Admission, request_cost
from .engine_host import ReloadRefused
from .metrics import CONTENT_TYPE_LATEST
from .schemas import AnswerResponse, HealthOut, ReloadOut, SearchResponse, cut_echo, hit_dict, search_request_model

log = logging.getLogger("linearrag.serve")


class HTTPError(Exception):
    def __init__(self, status: int, detail, reason: str | None = None, headers: dict | None = None):
        self.status, self.detail, self.reason, self.headers = status, detail, reason, headers or {}


class Overloaded(HTTPError):
    """A 429: ``why`` the request was refused, and the seconds it should wait (Retry-After); held before it is sent
    (HTTPFront.hold_refusal)."""

    def __init__(self, why: str, retry_after: int):
        super().__init__(429, f"{why}; retry after {retry_after} s", "overloaded", {"Retry-After": str(retry_after)})


REQUEST_ID_HEADER = schemas.REQUEST_ID_HEADER.lower()  # X-Request-ID: the client's (printable, <= 64 chars) or new
DEADLINE_HEADER = schemas.DEADLINE_HEADER.lower()  # X-Request-Timeout: seconds the client waits for its answer
SEARCH_ROUTES = ("/v1/search", "/v1/explain", "/v1/answer")
# a server without a chat model does not offer /v1/answer (absent from its OpenAPI document): a POST there is a
# 404 that says why, not a 5xx that clients would retry
NO_CHAT_MODEL = ("this server has no chat model, so no /v1/answer: start it with --llm-base-url and --llm-model "
                 "(or LINEARRAG_LLM_BASE_URL / LINEARRAG_LLM_MODEL)")
NO_EXPLAIN = "this server's engine host cannot explain its hits (Ray Serve replicas): use /v1/search"
_ADMITTED = "linearrag.admitted"  # scope["state"] key: the request's place, taken by EarlyAdmission
_REQUEST_ID = "linearrag.request_id"


def request_id(scope) -> str:
    """The request's id: the one EarlyAdmission gave it, else the client's X-Request-ID if sane, else a new one."""
    state = scope.setdefault("state", {})
    rid = state.get(_REQUEST_ID)
    if rid is None:
        given = _header(scope, REQUEST_ID_HEADER.encode())
        rid = given.decode("ascii") if given and len(given) <= 64 and all(33 <= c < 127 for c in given) \
            else os.urandom(16).hex()
        state[_REQUEST_ID] = rid
    return rid


def _header(scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return v
    return None


class Place:
    """A request's place among the ``max_concurrent`` in flight; ``release()`` gives it back (once)."""

    __slots__ = ("front", "deadline", "held")

    def __init__(self, front: "HTTPFront", deadline: float):
        self.front, self.deadline, self.held = front, deadline, True
        front.admission.in_flight += 1
        front.metrics.in_flight.inc()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.front.admission.in_flight -= 1
            self.front.metrics.in_flight.dec()


class HTTPFront:
    """The routes (``router``) and admission of one engine host. ``llm``: a generation.LLM for POST /v1/answer
    (None: that route answers 503). ``lifespan`` starts and stops the host."""

    def __init__(self, host, llm=None):
        self.host = host
        self.settings = host.settings
        self.metrics = host.metrics
        self.llm = llm
        self.admission = Admission(getattr(host, "max_in_flight", self.settings.max_concurrent),
                                   engines=getattr(host, "engines", 1), max_work=self.settings.max_work,
                                   heavy_share=self.settings.heavy_share)
        self.metrics.batch_listeners.append(self.admission.on_batch)
        self._latency_of = {}  # (route, status) -> its child of request_seconds (labels() costs ~5 us a call)
        self.SearchRequest = search_request_model(self.settings)
        self.router = self._make_router()

    @property
    def lifespan(self):
        return self.host.lifespan

    @property
    def in_flight(self) -> int:
        return self.admission.in_flight

    # ------------------------------------------------------------------ admission
    def deadline(self, scope) -> float:
        """Seconds the request may take: its X-Request-Timeout when it gives one (a positive number), at most
        the server's --timeout."""
        given = _header(scope, DEADLINE_HEADER.encode()) if scope is not None else None
        if given is None:
            return self.settings.timeout
        try:
            value = float(given)
        except ValueError:
            value = float("nan")
        if not value > 0 or math.isinf(value):
            raise HTTPError(422, [{"type": "value_error", "loc": ["header", DEADLINE_HEADER],
                                   "msg": "X-Request-Timeout must be a positive number of seconds"}], "invalid")
        return min(value, self.settings.timeout)

    def admit(self, deadline: float) -> Place:
        """A place for one more request, or HTTPError: 503 before the index is ready, 429 with Retry-After past
        max_concurrent or when the queue would hold it past ``deadline`` (admission.py)."""
        self._check_ready()
        refused = self.admission.refusal(deadline)
        if refused is not None:
            raise Overloaded(*refused)
        return Place(self, deadline)

    async def hold_refusal(self, deadline: float | None = None) -> None:
        """Hold a 429 ``refusal_delay`` seconds before it is sent, at most a tenth of the request's deadline (an
        asyncio timer: no CPU; the request holds no place meanwhile). A closed-loop client that sends again at once
        after a refusal then sends a request every hold instead of hundreds a second, and the engine keeps the
        cores (issue 28). Every 429 is held, the early one (before the body) and the late one (its body showed a
        light request in a heavy place, or over its class's share): a late refusal held nothing let aggressive
        clients cycle through the heavy places, each turn a body read and validated (issue 47)."""
        hold = min(self.settings.refusal_delay, (deadline or self.settings.timeout) / 10)
        if hold > 0:
            await asyncio.sleep(hold)

    # ------------------------------------------------------------------ requests
    async def search(self, body: dict, place: Place | None = None, rid: str | None = None) -> dict:
        """Validate a /v1/search body, answer it through the engine host (used by the route; callable directly,
        when it takes a place among the requests in flight itself)."""
        req = self._validate(body)
        questions, hits = await self._admitted(self._hits, req, place, rid)
        return {"results": [
            {"question": q, "hits": [hit_dict(h, req.include_text) for h in hs]} for q, hs in zip(questions, hits)]}

    async def explain(self, body: dict, place: Place | None = None, rid: str | None = None) -> dict:
        """/v1/explain: the /v1/search body; per question its hits with how each was reached (LinearRAG.explain as
        JSON, schemas.explanation_json), run with the request's retrieval settings on the engine thread."""
        req = self._validate(body)
        if not hasattr(self.host, "explain"):
            raise HTTPError(404, NO_EXPLAIN, "no_explain")

        async def work(r, deadline):
            top_k = r.top_k or self.host.default_top_k
            return await asyncio.wait_for(self.host.explain(self.batch_key(r), self._questions(r), top_k), deadline)

        return {"results": await self._admitted(work, req, place, rid)}

    async def answer(self, body: dict, place: Place | None = None, rid: str | None = None) -> dict:
        """/v1/answer: the /v1/search body; the questions' hits (batched as for search) go to the chat model."""
        req = self._validate(body)
        if self.llm is None:
            raise HTTPError(404, NO_CHAT_MODEL, "no_chat_model")

        async def work(r, deadline):
            questions, hits = await self._hits(r, deadline)
            try:
                return await aanswer_batch(hits, questions, self.llm, top_k=max(1, max(map(len, hits), default=1)))
            except LLMError as exc:
                raise HTTPError(502, str(exc), "llm_error") from None

        answers = await self._admitted(work, req, place, rid)
        return {"results": [a.to_dict(include_text=req.include_text) for a in answers]}

    @staticmethod
    def _questions(req) -> list:
        return req.questions if req.questions is not None else [req.question]

    async def _hits(self, req, deadline: float):
        """(questions, hits per question) of a validated request, through the engine host, within ``deadline``."""
        questions = self._questions(req)
        top_k = req.top_k or self.host.default_top_k
        units = self.cost(req)
        heavy = units if self.admission.kind(units) == "heavy" else 0.0
        self.admission.questions += units
        self.admission.heavy_questions += heavy
        try:
            hits = await asyncio.wait_for(self.host.hits(self.batch_key(req), [(q, top_k) for q in questions]),
                                          deadline)
        finally:
            self.admission.questions -= units
            self.admission.heavy_questions -= heavy
        return questions, hits

    def cost(self, req) -> float:
        """The work units of a validated request (serve/admission.py), as the engine host counts them (rerank as
        it will run: the request's, else the server's)."""
        questions, top_k = self._questions(req), req.top_k or self.host.default_top_k
        of = getattr(self.host, "question_cost", None)
        if of is not None:
            key = self.batch_key(req)
            return sum(of(key, (q, top_k)) for q in questions)
        return request_cost(questions, top_k, bool(getattr(req, "rerank", None) or self.settings.rerank))

    @staticmethod
    def batch_key(req) -> tuple:
        """The request's retrieval settings as a hashable key: only questions with the same key share a batch."""
        return tuple(sorted((k, getattr(req, k)) for k in type(req).model_fields
                            if k not in ("question", "questions", "top_k", "include_text") and getattr(req, k) is not None))

    async def _admitted(self, work, req, place: Place | None = None, rid: str | None = None):
        """Run ``work(req, deadline)`` as one request in flight (in ``place``, else in a place taken here): 429
        when its questions would wait past its deadline, 504 when they are not answered within it (the chat
        model has its own timeouts), 500 naming the request id when the engine fails."""
        own = place is None
        if own:
            place = self.admit(self.settings.timeout)
        ticket = None
        try:
            cost = self.cost(req)
            refused = self.admission.refusal(place.deadline, cost, admitted=True, cost=cost)
            if refused is not None:
                raise Overloaded(*refused)
            ticket = self.admission.take(cost)
            return await work(req, place.deadline)
        except asyncio.TimeoutError:
            raise HTTPError(504, f"not answered within {place.deadline:g} s", "timeout") from None
        except HTTPError:
            raise
        except Exception as exc:  # noqa: BLE001
            rid = rid or os.urandom(16).hex()
            log.error("engine error (request %s): %s: %s", rid, type(exc).__name__, exc, exc_info=exc)
            raise HTTPError(500, f"engine error (request {rid}): {type(exc).__name__}: {exc}",
                            "engine_error") from None
        finally:
            if ticket is not None:
                self.admission.give_back(ticket)
            if own:
                place.release()
            self.metrics.queued.set(self.host.queued)

    def _validate(self, body):
        try:
            req = self.SearchRequest.model_validate(body)
        except ValidationError as exc:
            errors = [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors(include_url=False)]
            for e in errors:
                e.pop("ctx", None)
                cut_echo(e)
            raise HTTPError(422, jsonable_encoder(errors), "invalid") from None
        self._check_with_index(req)
        return req

    def _check_with_index(self, req) -> None:
        """422 for settings the index's own make invalid (a rule of config.CROSS_FIELD_RULES, one field from the
        request and the other from the index: question_ner "off" on an index of lexicon_seeds false), which the
        engine would otherwise fail on (a 500). The request schema says so in those fields' descriptions."""
        base = getattr(self.host, "retrieval_config", None)  # the index's settings, where the host knows them
        overrides = dict(self.batch_key(req))
        if base is None or not overrides:
            return
        try:
            base.replace(**overrides)
        except ValueError as exc:
            msg = str(exc)
            name = min((k for k in overrides if k in msg), key=msg.index, default=None)
            raise HTTPError(422, [{"type": "value_error", "loc": ["body", *([name] if name else [])],
                                   "msg": f"with the index's settings: {msg}",
                                   "input": overrides.get(name)}], "invalid") from None

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
        chunks = []

        async def read():
            n = 0
            async for chunk in request.stream():
                n += len(chunk)
                if n > limit:
                    raise HTTPError(413, f"request body is over the limit of {limit} bytes", "body_too_large")
                chunks.append(chunk)

        try:  # a client sending its body slowly holds its place at most this long
            await asyncio.wait_for(read(), self.settings.body_timeout)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"request body not received within {self.settings.body_timeout:g} s",
                            "body_timeout", {"Connection": "close"}) from None  # (its rest cannot be read)
        except ClientDisconnect:  # gone while sending its body: nobody reads this answer; counted
            raise HTTPError(499, "the client disconnected while sending its body", "client_gone") from None
        try:
            return json.loads(b"".join(chunks))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else \
                "nested too deeply" if isinstance(exc, RecursionError) else "not UTF-8"
            raise HTTPError(422, [{"type": "json_invalid", "loc": ["body"], "msg": f"invalid JSON: {msg}"}],
                            "invalid") from None

    async def info(self) -> dict:
        """GET /info: the engine host's description with the front's own figures."""
        a = self.admission
        spq = a.seconds_per_question()
        return {**await self.host.info(),
                "llm": {"base_url": self.llm.base_url, "model": self.llm.model} if self.llm is not None else None,
                "in_flight": self.in_flight,
                "admission": {"max_in_flight": a.max_concurrent, "questions_inside": a.questions,
                              "work_inside": {k: round(v, 2) for k, v in a.work.items()}, "max_work": a.max_work,
                              "seconds_per_question": None if spq is None else round(spq, 6),
                              "expected_wait_s": round(a.expected_wait(1), 4), "refused_recently": a.crowd()}}

    # ------------------------------------------------------------------ routes
    def authorized(self, scope) -> bool:
        key = self.settings.api_key
        if not key:
            return True
        scheme, _, token = (_header(scope, b"authorization") or b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode())

    def _auth(self, request: Request) -> None:
        if not self.authorized(request.scope):
            raise HTTPError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "unauthorized",
                            {"WWW-Authenticate": "Bearer"})

    def observe(self, route: str, status: int, seconds: float) -> None:
        """A response of ``route`` with ``status`` after ``seconds`` (request_duration_seconds)."""
        child = self._latency_of.get((route, status))
        if child is None:
            child = self._latency_of[(route, status)] = self.metrics.request_seconds.labels(route, str(status))
        child.observe(seconds)

    def _respond(self, route: str, t0: float, payload=None, error: HTTPError | None = None, raw: Response | None = None):
        if error is not None:
            if error.reason:
                self.metrics.failure(error.reason)
            resp = JSONResponse({"detail": error.detail}, status_code=error.status, headers=error.headers)
        else:
            resp = raw if raw is not None else JSONResponse(payload)
        self.observe(route, resp.status_code, time.perf_counter() - t0)
        return resp

    def _make_router(self) -> APIRouter:
        router = APIRouter()
        svc = self

        async def guarded(route: str, request: Request, work):
            t0 = time.perf_counter()
            try:
                svc._auth(request)
                result = await work()
            except HTTPError as err:
                resp = svc._respond(route, t0, error=err)
            else:
                resp = svc._respond(route, t0, raw=result) if isinstance(result, Response) else \
                    svc._respond(route, t0, result)
            resp.headers[REQUEST_ID_HEADER] = request_id(request.scope)
            return resp

        async def admitted(request: Request, work):
            """``work(body, place, request id)`` in the place EarlyAdmission took for the request, else in one
            taken here (a router mounted in another app), before the body is read."""
            place = request.scope.get("state", {}).get(_ADMITTED)
            own = place is None
            if own:
                place = svc.admit(svc.deadline(request.scope))
            try:
                return await work(await svc.read_json(request), place, request_id(request.scope))
            except Overloaded:  # refused once its body said what it costs: held as an early refusal is, without
                place.release()  # its place (see hold_refusal)
                await svc.hold_refusal(place.deadline)
                raise
            finally:
                if own:
                    place.release()

        s = self.settings
        # the OpenAPI document says what the routes do (schemas.py; tests/serve/test_openapi_contract.py fuzzes the
        # server against it): the body's rule and limits, every status with its body and headers, the real media
        # types. With an API key, the routes declare HTTP bearer security: the dependency only documents it
        # (auto_error=False: it refuses nothing; _auth checks the key, in constant time)
        secured = {"dependencies": [Security(HTTPBearer(auto_error=False, description="the server's --api-key"))]} \
            if s.api_key else {}
        body = {"requestBody": {"required": True, "description": f"at most {s.max_body_bytes} bytes of JSON (413)",
                                "content": {"application/json": {"schema": schemas.request_schema(self.SearchRequest)}}},
                "parameters": schemas.request_parameters(s)}
        described = {"description": schemas.search_description(s), "openapi_extra": body}

        @router.post("/v1/search", response_model=SearchResponse, summary="Top-k passages for each question",
                     responses=schemas.responses("search", s), **described, **secured)
        async def search(request: Request):
            return await guarded("/v1/search", request, lambda: admitted(request, svc.search))

        @router.post("/v1/explain", response_model=dict[str, Any], summary="The search, each hit with how it was "
                     "reached: seeds, sentences, entities, chain rounds (what the page at / draws)",
                     responses=schemas.responses("search", s), include_in_schema=hasattr(self.host, "explain"),
                     **described, **secured)
        async def explain(request: Request):
            return await guarded("/v1/explain", request, lambda: admitted(request, svc.explain))

        if self.llm is not None:
            @router.post("/v1/answer", response_model=AnswerResponse,
                         summary="An answer from the chat model over each question's top-k passages",
                         responses=schemas.responses("answer", s), **described, **secured)
            async def answer(request: Request):
                return await guarded("/v1/answer", request, lambda: admitted(request, svc.answer))
        else:
            @router.post("/v1/answer", include_in_schema=False)
            async def no_answer(request: Request):
                async def work():
                    raise HTTPError(404, NO_CHAT_MODEL, "no_chat_model")
                return await guarded("/v1/answer", request, work)

        @router.get("/health", response_model=HealthOut, summary="200 when the index and models are loaded, else 503",
                    responses={"503": {"model": HealthOut, "description": "the index is loading, or failed to load"}})
        async def health():
            host = svc.host
            if host.ready:
                return JSONResponse({"status": "ok", "fingerprint": host.fingerprint})
            status = "failed" if host.load_error else "loading"
            return JSONResponse({"status": status, "detail": host.load_error}, status_code=503)

        @router.get("/info", response_model=dict[str, Any], summary="index counts, settings, device, version, memory",
                    responses=schemas.responses("info", s), **secured)
        async def info(request: Request):
            async def work():
                return await svc.info()
            return await guarded("/info", request, work)

        @router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
                    description=f"the Prometheus text exposition format ({CONTENT_TYPE_LATEST})",
                    responses=schemas.responses("metrics", s), **secured)
        async def metrics(request: Request):
            async def work():
                svc.metrics.queued.set(svc.host.queued)
                return Response(svc.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
            return await guarded("/metrics", request, work)

        @router.post("/admin/reload", response_model=ReloadOut,
                     summary="load INDEX_DIR again and swap it in with no failed request",
                     responses=schemas.responses("reload", s), **secured)
        async def reload(request: Request):
            async def work():
                try:
                    return await svc.host.reload()
                except ReloadRefused as exc:
                    raise HTTPError(409, f"reload refused, still serving the previous index: {exc}") from None
            return await guarded("/admin/reload", request, work)

        return router


# ---------------------------------------------------------------------------------------------- early admission
class EarlyAdmission:
    """Pure ASGI middleware in front of the app (``create_app`` adds it): a POST to /v1/search or /v1/answer is
    admitted or refused (429 with Retry-After, 503 before the index is ready) from its headers alone, before
    its body is read and before FastAPI routes it or pydantic sees it, so that under overload a refusal costs
    the server little. An admitted request keeps its place until its response is sent; if its client goes away
    before then, its work is cancelled (questions still queued leave the queue without costing the engine) and
    counted as linearrag_failures_total{reason="client_gone"}. Open connections are bounded by uvicorn itself
    (``limit_concurrency``: 503)."""

    def __init__(self, app, front: HTTPFront):
        self.app, self.front = app, front

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in SEARCH_ROUTES or (
                scope["path"] == "/v1/answer" and self.front.llm is None):
            return await self.app(scope, receive, send)
        if not self.front.authorized(scope):
            return await self.app(scope, receive, send)  # the route answers 401
        await self.admitted(scope, receive, send)

    async def admitted(self, scope, receive, send) -> None:
        """The app for a search or answer request its caller has let through (route, key): admitted by the front
        or refused from its headers (a store's middleware, serve/store.py, calls this with each index's front)."""
        front = self.front
        rid = request_id(scope)
        t0 = time.perf_counter()
        deadline = None
        try:
            deadline = front.deadline(scope)
            place = front.admit(deadline)
        except HTTPError as err:
            return await self._refuse(scope, send, err, rid, t0, deadline)
        scope["state"][_ADMITTED] = place
        try:
            await self._watched(scope, receive, send, place)
        finally:
            place.release()

    async def _refuse(self, scope, send, err: HTTPError, rid: str, t0: float, deadline: float | None = None) -> None:
        """Answer a refusal; a 429 is held first (HTTPFront.hold_refusal)."""
        front = self.front
        if err.reason:
            front.metrics.failure(err.reason)
        if isinstance(err, Overloaded):
            await front.hold_refusal(deadline)
        body = json.dumps({"detail": err.detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"x-request-id", rid.encode()),
                   *((k.lower().encode(), str(v).encode()) for k, v in err.headers.items())]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        front.observe(scope["path"], err.status, time.perf_counter() - t0)

    async def _watched(self, scope, receive, send, place: Place) -> None:
        """The app, cancelled if the client disconnects before the response is sent. Once the app has read the
        whole body it does not call receive() again, so the middleware listens for the disconnect itself. The
        place is given back as the response's last bytes go out (a closed-loop client's next request may come
        in before this task runs again)."""
        body_read = asyncio.Event()
        sent = False

        async def receive_body():
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                body_read.set()
            return message

        async def send_marked(message):
            nonlocal sent
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                sent = True
                place.release()
            await send(message)

        app = asyncio.ensure_future(self.app(scope, receive_body, send_marked))
        waiter = asyncio.ensure_future(body_read.wait())
        listener, gone = None, False
        try:
            await asyncio.wait((app, waiter), return_when=asyncio.FIRST_COMPLETED)
            if not app.done():
                listener = asyncio.ensure_future(receive())
                await asyncio.wait((app, listener), return_when=asyncio.FIRST_COMPLETED)
                if not app.done() and not sent and listener.result()["type"] == "http.disconnect":
                    gone = True
                    app.cancel()
                    self.front.metrics.failure("client_gone")
            try:
                await app
            except asyncio.CancelledError:
                if not gone:
                    raise
        finally:
            for t in (waiter, listener):
                if t is not None and not t.done():
                    t.cancel()
            if not app.done():
                app.cancel()
