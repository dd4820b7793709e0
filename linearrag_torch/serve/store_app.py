"""The HTTP routes of a store (serve/store.py): many indexes by name, writes, the admin API, keys by index and role.

    GET    /v1/indexes                          the indexes the key sees, with their counts
    POST   /v1/indexes                          {"name": ...}: create an empty index in the store's folder (admin)
    GET    /v1/indexes/{name}                   one index's counts, settings, admission, memory
    POST   /v1/indexes/{name}/search            as POST /v1/search, on that index
    POST   /v1/indexes/{name}/answer            as POST /v1/answer (with a chat model)
    POST   /v1/indexes/{name}/explain           the search body; each hit with how it was reached
    POST   /v1/indexes/{name}/passages          {"passages": [{"id", "title", "text"}, ...]} added (write)
    POST   /v1/indexes/{name}/passages/delete   {"ids": [...]} deleted (write)
    POST   /v1/indexes/{name}/load | /unload    serve an unloaded index again / stop serving it (admin)
    DELETE /v1/indexes/{name}                   unload and delete an index of the store's folder (admin)
    GET    /health, /info, /metrics             the server's; /info and /metrics only of the indexes the key sees
    POST   /v1/search, /v1/explain, /v1/answer, /admin/reload   with one index: the single-index routes, on it
    /mcp/                                       the MCP endpoint (streamable HTTP; serve/mcp_tools.py)

Statuses: 401 without a known key, 404 for an index that does not exist or that the key may not see (the same
answer), 403 for a route above the key's role, 409 for a state that forbids it (unloaded, locked by another writer,
exists), 413/408/422 for a body too large, too slow or invalid (422 names the field; nothing is written), 429 past
the index's admission.
"""
from __future__ import annotations

import importlib.util
import logging
import re
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer

from .. import __version__
from ..extras import install_hint
from . import schemas
from .front import _ADMITTED, REQUEST_ID_HEADER, EarlyAdmission, HTTPError, HTTPFront, Overloaded, request_id
from .metrics import CONTENT_TYPE_LATEST
from .schemas import AnswerResponse, ErrorOut, SearchResponse
from .store import Store, unauthorized
from .store_schemas import (DropOut, IndexList, IndexSummary, StoreHealth, WriteOut, _BodyReader, _duplicates,  # noqa: F401
                            _items, _responses, _validate, inline_refs, write_models)

log = logging.getLogger("linearrag.serve")

INDEX_ROUTE = re.compile(r"^/v1/indexes/([^/]+)/(search|answer|explain)$")


# ---------------------------------------------------------------------------------------------- the app
def store_router(store: Store) -> APIRouter:
    """The store's routes (the module's docstring)."""
    s = store.settings
    keyed = not store.keys.open
    router = APIRouter()
    secured = {"dependencies": [Security(HTTPBearer(auto_error=False, description="an API key (serve/keys.py)"))]} \
        if keyed else {}
    reader = _BodyReader(s)
    Add, Delete, Create = write_models(s)
    single = next(iter(store.hosts)) if len(store.hosts) == 1 else None  # the single-index form's index

    def principal(request: Request):
        got = store.principal(request.headers.get("authorization"))
        if got is None:
            raise unauthorized()
        return got

    async def guarded(route: str, request: Request, work, status: int = 200):
        t0 = time.perf_counter()
        try:
            result = await work()
        except HTTPError as err:
            if err.reason:
                store.metrics.failure(err.reason)
            resp = JSONResponse({"detail": err.detail}, status_code=err.status, headers=err.headers)
        else:
            resp = result if isinstance(result, Response) else JSONResponse(jsonable_encoder(result),
                                                                            status_code=status)
        store.metrics.request_seconds.labels(route, str(resp.status_code)).observe(time.perf_counter() - t0)
        resp.headers[REQUEST_ID_HEADER] = request_id(request.scope)
        return resp

    async def admitted(front: HTTPFront, request: Request, work):
        """``work(body, place, request id)`` in the place the middleware took for the request (else one here)."""
        place = request.scope.get("state", {}).get(_ADMITTED)
        own = place is None
        if own:
            place = front.admit(front.deadline(request.scope))
        try:
            return await work(await front.read_json(request), place, request_id(request.scope))
        except Overloaded:
            place.release()
            await front.hold_refusal(place.deadline)
            raise
        finally:
            if own:
                place.release()

    def reading(request: Request, name: str):
        host = store.host(principal(request), name, "read")
        return host, store.ready_front(host)

    read_codes = ("401", "404", "408", "409", "413", "422", "429", "500", "503", "504")

    def body_of(model, schema=None):
        if schema is None:
            schema = inline_refs(model.model_json_schema())
            for item in _items(schema):  # a passage's text is not blank: the pattern the search's questions have
                if "text" in item.get("properties", {}):
                    item["properties"]["text"]["pattern"] = schemas.NOT_BLANK
        return {"requestBody": {"required": True, "description": f"at most {s.max_body_bytes} bytes of JSON (413)",
                                "content": {"application/json": {"schema": schema}}}}

    search_body = body_of(None, schemas.request_schema(schemas.search_request_model(s)))

    # ---------------------------------------------------------------- listing
    @router.get("/v1/indexes", response_model=IndexList, summary="The indexes this key sees, with their counts",
                responses=_responses(s, keyed, "401"), **secured)
    async def list_indexes(request: Request):
        async def work():
            return {"indexes": [h.summary() for h in store.visible(principal(request))]}
        return await guarded("/v1/indexes", request, work)

    @router.post("/v1/indexes", response_model=IndexSummary, status_code=201,
                 summary="Create an empty index in the store's folder (admin)", openapi_extra=body_of(Create),
                 responses=_responses(s, keyed, "401", "403", "408", "409", "413", "422"), **secured)
    async def create(request: Request):
        async def work():
            who = principal(request)
            if not who.may("admin"):
                raise HTTPError(403, f"this key's role ({who.role}) may not create indexes (admin needed)",
                                "forbidden")
            req = _validate(Create, await reader.read_json(request))
            if not who.sees(req.name):
                raise HTTPError(403, f"this key may not create an index named {req.name!r}", "forbidden")
            return await store.create(req.name)
        return await guarded("/v1/indexes", request, work, status=201)

    @router.get("/v1/indexes/{name}", response_model=dict[str, Any],
                summary="One index: counts, settings, admission, memory",
                responses=_responses(s, keyed, "401", "404"), **secured)
    async def index_info(name: str, request: Request):
        async def work():
            host = store.host(principal(request), name, "read")
            if host.status != "ready":
                return host.describe()
            return await host.front.info()
        return await guarded("/v1/indexes/{name}", request, work)

    # ---------------------------------------------------------------- read
    @router.post("/v1/indexes/{name}/search", response_model=SearchResponse, summary="Top-k passages of the index "
                 "for each question", description=schemas.search_description(s), openapi_extra=search_body,
                 responses=_responses(s, keyed, *read_codes, retry=True), **secured)
    async def search(name: str, request: Request):
        async def work():
            _, front = reading(request, name)
            return await admitted(front, request, front.search)
        return await guarded("/v1/indexes/{name}/search", request, work)

    @router.post("/v1/indexes/{name}/explain", response_model=dict[str, Any],
                 summary="The search body; each hit with the entities and rounds that reached it",
                 description=schemas.search_description(s), openapi_extra=search_body,
                 responses=_responses(s, keyed, *read_codes, retry=True), **secured)
    async def explain(name: str, request: Request):
        async def work():
            _, front = reading(request, name)
            return await admitted(front, request, front.explain)
        return await guarded("/v1/indexes/{name}/explain", request, work)

    if store.llm is not None:
        @router.post("/v1/indexes/{name}/answer", response_model=AnswerResponse,
                     summary="An answer from the chat model over each question's top-k passages of the index",
                     description=schemas.search_description(s), openapi_extra=search_body,
                     responses={**_responses(s, keyed, *read_codes, retry=True),
                      "502": {"model": ErrorOut, "description": "the chat model's endpoint failed"}}, **secured)
        async def answer(name: str, request: Request):
            async def work():
                _, front = reading(request, name)
                return await admitted(front, request, front.answer)
            return await guarded("/v1/indexes/{name}/answer", request, work)

    # ---------------------------------------------------------------- writes
    write_codes = ("401", "403", "404", "408", "409", "413", "422", "429", "503")

    @router.post("/v1/indexes/{name}/passages", response_model=WriteOut,
                 summary="Add passages (incremental: only they are analysed and encoded); on disk before the 200",
                 openapi_extra=body_of(Add), responses=_responses(s, keyed, *write_codes, retry=True), **secured)
    async def add(name: str, request: Request):
        async def work():
            host = store.host(principal(request), name, "write")
            store.ready_front(host)
            req = _validate(Add, await reader.read_json(request))
            passages = [p.model_dump(exclude_none=True) for p in req.passages]
            _duplicates([p.get("id") for p in passages], "passages")
            return await _held(host, store.add(host, passages))
        return await guarded("/v1/indexes/{name}/passages", request, work)

    @router.post("/v1/indexes/{name}/passages/delete", response_model=WriteOut,
                 summary="Delete passages by id (with the sentences and entities no other passage has)",
                 openapi_extra=body_of(Delete), responses=_responses(s, keyed, *write_codes, retry=True), **secured)
    async def delete(name: str, request: Request):
        async def work():
            host = store.host(principal(request), name, "write")
            store.ready_front(host)
            req = _validate(Delete, await reader.read_json(request))
            _duplicates(req.ids, "ids")
            return await _held(host, store.delete(host, req.ids))
        return await guarded("/v1/indexes/{name}/passages/delete", request, work)

    async def _held(host, writing):
        try:
            return await writing
        except Overloaded:
            await host.front.hold_refusal()
            raise

    # ---------------------------------------------------------------- admin
    admin_codes = ("401", "403", "404", "409")

    @router.post("/v1/indexes/{name}/load", response_model=IndexSummary,
                 summary="Serve an unloaded index again (a loaded one: load its folder again and swap it in)",
                 responses=_responses(s, keyed, *admin_codes), **secured)
    async def load(name: str, request: Request):
        async def work():
            return await store.load(store.host(principal(request), name, "admin"))
        return await guarded("/v1/indexes/{name}/load", request, work)

    @router.post("/v1/indexes/{name}/unload", response_model=IndexSummary,
                 summary="Stop serving an index and give its memory back (its folder stays)",
                 responses=_responses(s, keyed, *admin_codes), **secured)
    async def unload(name: str, request: Request):
        async def work():
            return await store.unload(store.host(principal(request), name, "admin"))
        return await guarded("/v1/indexes/{name}/unload", request, work)

    @router.delete("/v1/indexes/{name}", response_model=DropOut,
                   summary="Unload an index of the store's folder and delete its folder",
                   responses=_responses(s, keyed, *admin_codes), **secured)
    async def drop(name: str, request: Request):
        async def work():
            return await store.drop(store.host(principal(request), name, "admin"))
        return await guarded("/v1/indexes/{name}", request, work)

    # ---------------------------------------------------------------- the server's
    @router.get("/health", response_model=StoreHealth, summary="200 once the indexes given at start are loaded",
                responses={"503": {"model": StoreHealth, "description": "the indexes are loading"}})
    async def health():
        loading = any(h.status == "loading" for h in store.hosts.values()) or \
            any(not t.done() for t in store._tasks)
        return JSONResponse({"status": "loading" if loading else "ok"}, status_code=503 if loading else 200)

    @router.get("/info", response_model=dict[str, Any], summary="version, settings and the indexes this key sees",
                responses=_responses(s, keyed, "401"), **secured)
    async def info(request: Request):
        async def work():
            return store.info(principal(request))
        return await guarded("/info", request, work)

    @router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
                description=f"the Prometheus text exposition format ({CONTENT_TYPE_LATEST}); each index's samples "
                            "labelled index=NAME, only those of the indexes this key sees",
                responses=_responses(s, keyed, "401"), **secured)
    async def metrics(request: Request):
        async def work():
            return Response(store.exposition(principal(request)), media_type=CONTENT_TYPE_LATEST)
        return await guarded("/metrics", request, work)

    if single is not None:  # today's routes, on the one index
        @router.post("/v1/search", response_model=SearchResponse, summary="Top-k passages for each question (the "
                     "single-index form of /v1/indexes/{name}/search)", description=schemas.search_description(s),
                     openapi_extra=search_body, responses=_responses(s, keyed, *read_codes, retry=True), **secured)
        async def single_search(request: Request):
            async def work():
                _, front = reading(request, single)
                return await admitted(front, request, front.search)
            return await guarded("/v1/search", request, work)

        @router.post("/v1/explain", response_model=dict[str, Any], summary="The search, each hit with how it was "
                     "reached (the single-index form of /v1/indexes/{name}/explain)",
                     description=schemas.search_description(s), openapi_extra=search_body,
                     responses=_responses(s, keyed, *read_codes, retry=True), **secured)
        async def single_explain(request: Request):
            async def work():
                _, front = reading(request, single)
                return await admitted(front, request, front.explain)
            return await guarded("/v1/explain", request, work)

        if store.llm is not None:
            @router.post("/v1/answer", response_model=AnswerResponse, summary="An answer from the chat model (the "
                         "single-index form of /v1/indexes/{name}/answer)", description=schemas.search_description(s),
                         openapi_extra=search_body,
                         responses={**_responses(s, keyed, *read_codes, retry=True),
                                    "502": {"model": ErrorOut, "description": "the chat model's endpoint failed"}},
                         **secured)
            async def single_answer(request: Request):
                async def work():
                    _, front = reading(request, single)
                    return await admitted(front, request, front.answer)
                return await guarded("/v1/answer", request, work)

        @router.post("/admin/reload", response_model=IndexSummary, summary="Load the index's folder again and swap "
                     "it in with no failed request (admin)", responses=_responses(s, keyed, *admin_codes), **secured)
        async def single_reload(request: Request):
            async def work():
                return await store.load(store.host(principal(request), single, "admin"))
            return await guarded("/admin/reload", request, work)

    return router


class StoreAdmission:
    """Pure ASGI middleware: a search, answer or explain request on an index is admitted or refused by that index's
    front from its headers alone (serve/front.EarlyAdmission), once its key may read the index; anything else goes
    to the app (which answers 401, 404, 409 itself)."""

    def __init__(self, app, store: Store):
        self.app, self.store = app, store
        self._early: dict = {}
        self.single = next(iter(store.hosts)) if len(store.hosts) == 1 else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        path = scope["path"]
        m = INDEX_ROUTE.match(path)
        if m is not None:
            name, what = m.group(1), m.group(2)
        elif path in ("/v1/search", "/v1/explain", "/v1/answer") and self.single is not None:
            name, what = self.single, path.rsplit("/", 1)[1]
        else:
            return await self.app(scope, receive, send)
        store = self.store
        host = store.hosts.get(name)
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        who = store.principal(auth)
        if host is None or who is None or not who.sees(name) or host.status != "ready" or (
                what == "answer" and store.llm is None):
            return await self.app(scope, receive, send)
        early = self._early.get(name)
        if early is None or early.front is not host.front:
            early = self._early[name] = EarlyAdmission(self.app, host.front)
        await early.admitted(scope, receive, send)


class _MethodGate:
    """405 with every method of the path in Allow: Starlette answers a method no route of a path takes with the
    methods of the first such route only (``/v1/indexes`` has GET and POST, ``/v1/indexes/{name}`` GET and
    DELETE, each a route of its own)."""

    def __init__(self, app, routes):
        self.app = app
        self.routes = [(r.path_regex, set(r.methods)) for r in routes if getattr(r, "methods", None)]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            allowed = set()
            for regex, methods in self.routes:
                if regex.match(scope["path"]):
                    allowed |= methods
            if allowed and scope["method"] not in allowed:
                resp = JSONResponse({"detail": "Method Not Allowed"}, status_code=405,
                                    headers={"Allow": ", ".join(sorted(allowed))})
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class _KeyGate:
    """The OpenAPI pages and the MCP endpoint need a known key too (any role; the MCP tools then check its scope)."""

    def __init__(self, app, store: Store):
        self.app, self.store = app, store

    async def __call__(self, scope, receive, send):
        from .app import DOC_PATHS

        if scope["type"] == "http" and (scope["path"] in DOC_PATHS or scope["path"] == "/mcp"
                                        or scope["path"].startswith("/mcp/")):
            auth = dict(scope["headers"]).get(b"authorization")
            if self.store.principal(auth) is None:
                err = unauthorized()
                resp = JSONResponse({"detail": err.detail}, status_code=401, headers=err.headers)
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def mcp_installed() -> bool:
    """Whether the MCP SDK imports (imported, not looked up: a test hides it with sys.modules["mcp"] = None)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


def create_store_app(store: Store, early_admission: bool = True, mcp: bool | None = None) -> FastAPI:
    """A FastAPI app serving ``store``; its lifespan starts and stops it (and the MCP endpoint's session manager).
    ``mcp``: mount the MCP endpoint at /mcp/ (default: settings.mcp, when the mcp package is installed)."""
    from contextlib import asynccontextmanager

    from .app import add_doc_pages, add_mcp_off, add_page

    use_mcp = store.settings.mcp if mcp is None else mcp
    mcp_off = None if use_mcp else "turned off (--no-mcp)"  # why /mcp/ is not served, said at startup and at /mcp/
    if use_mcp and not mcp_installed():
        use_mcp, mcp_off = False, f"the 'mcp' extra is not installed: {install_hint('mcp')}"
    mcp_server = None
    if use_mcp:
        from .mcp_tools import make_mcp_server

        mcp_server = make_mcp_server(store)
        mcp_app = mcp_server.streamable_http_app(streamable_http_path="/", stateless_http=True, json_response=True,
                                                 host=store.settings.host)

    @asynccontextmanager
    async def lifespan(app):
        async with store.lifespan():
            if mcp_server is None:
                yield
            else:
                async with mcp_server.session_manager.run():
                    yield

    local_docs = importlib.util.find_spec("fastapi_offline") is not None
    app = FastAPI(title="linearrag_torch", version=__version__, lifespan=lifespan,
                  description="LinearRAG graph retrieval as a store: many indexes by name, passages added and "
                              "deleted over HTTP, keys by index and role (docs/serving.md).",
                  **({"docs_url": None, "redoc_url": None} if local_docs else {}))
    if local_docs:
        add_doc_pages(app)
    add_page(app)
    router = store_router(store)
    app.include_router(router)
    if mcp_server is not None:
        app.mount("/mcp", mcp_app)
    else:
        log.info("the MCP endpoint /mcp/ is off: %s", mcp_off)
        add_mcp_off(app, mcp_off)
    app.add_middleware(_MethodGate, routes=list(router.routes))
    if early_admission:
        app.add_middleware(StoreAdmission, store=store)
    if not store.keys.open:
        app.add_middleware(_KeyGate, store=store)
    app.state.linearrag = store
    return app


def serve_store(paths, settings, llm=None) -> int:
    """`linearrag serve PATH... ` as a store: run until SIGINT/SIGTERM; 0 on a clean stop, 1 when no index loaded."""
    from .app import run_server

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = Store(paths, settings, llm=llm)
    app = StoreAdmission(create_store_app(store, early_admission=False), store)
    return run_server(app, store, settings, "no index could be served")


__all__ = ["StoreAdmission", "create_store_app", "serve_store", "store_router", "write_models"]
