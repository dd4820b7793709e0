"""The standalone server: a FastAPI app around one HTTP front (a LinearRAGService, or an HTTPFront over another
engine host such as Ray's), run by uvicorn (`linearrag serve`)."""
from __future__ import annotations

import hmac
import importlib.util
import logging
import signal
import sys
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .. import __version__
from .connections import uvicorn_config
from .front import EarlyAdmission, HTTPFront
from .service import LinearRAGService
from .settings import ServeSettings

DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
DOC_ASSETS = "/docs/assets"  # Swagger UI's and ReDoc's scripts and styles, served here (no CDN: /docs works offline)


class _DocsAuth:
    """ASGI middleware: the OpenAPI pages need the API key too (the service's routes check it themselves)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] in DOC_PATHS:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                resp = JSONResponse({"detail": "missing or wrong API key (send 'Authorization: Bearer KEY')"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(service: LinearRAGService | HTTPFront, early_admission: bool = True) -> FastAPI:
    """A FastAPI app serving ``service`` (a LinearRAGService, or an HTTPFront) at the root; its lifespan starts
    and stops the engine host. ``early_admission``: with the EarlyAdmission middleware inside the app (False:
    the caller wraps the app in it, outside FastAPI, as ``serve`` does: a refusal then skips FastAPI's own call
    too)."""
    local_docs = importlib.util.find_spec("fastapi_offline") is not None  # else FastAPI's pages (assets from a CDN)
    app = FastAPI(title="linearrag_torch", version=__version__, lifespan=service.lifespan,
                  description="LinearRAG graph retrieval: POST /v1/search with dynamic batching. "
                              "Limits: see GET /info (server).",
                  **({"docs_url": None, "redoc_url": None} if local_docs else {}))
    if local_docs:
        add_doc_pages(app)
    add_page(app)
    add_mcp_off(app, "one index's server has none: serve the folder as a store (linearrag serve INDEX_DIR --store)")
    app.include_router(service.router)
    if early_admission:
        app.add_middleware(EarlyAdmission, front=getattr(service, "front", service))
    if service.settings.api_key:
        app.add_middleware(_DocsAuth, key=service.settings.api_key)
    app.state.linearrag = service
    return app


def add_doc_pages(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc with their scripts and styles served by this server from the copies that the
    fastapi-offline package ships (extra [serve]), so that the pages work without internet access; FastAPI's own
    pages load them from a CDN."""
    import fastapi_offline
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    app.mount(DOC_ASSETS, StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static"), name="doc-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
                                   swagger_js_url=f"{root}{DOC_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{DOC_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{DOC_ASSETS}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOC_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOC_ASSETS}/favicon.png", with_google_fonts=False)


PAGE_DIR = Path(__file__).parent / "page"  # index.html, page.js, page.css: shipped in the package (setup.py)


def add_page(app: FastAPI) -> None:
    """The page at / (docs/serving.md, "The page"): a question's hits and the paths that reached them, drawn from
    the explain route's answer by page/page.js; its files under /page/. Static and public like /health: it holds
    no data, and what it asks of the API carries the key typed into it."""
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    app.mount("/page", StaticFiles(directory=PAGE_DIR), name="page")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(PAGE_DIR / "index.html", media_type="text/html")


def add_mcp_off(app: FastAPI, why: str) -> None:
    """/mcp and /mcp/... where the MCP endpoint is not served: a 404 whose detail says why (the extra not installed,
    with the pip command, or --no-mcp), not a bare "Not Found"."""
    detail = f"the MCP endpoint is not served here: {why}"

    async def mcp_off(request: Request) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=404)

    for path in ("/mcp", "/mcp/{rest:path}"):
        app.add_api_route(path, mcp_off, methods=["GET", "POST", "DELETE"], include_in_schema=False)


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that SIGTERM is a normal stop: after the drain the process exits 0
        (uvicorn re-raises a captured signal once it has shut down, which would end it with -15)."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    return Server


class RefusalLogSampler(logging.Filter):
    """On uvicorn's access log: of the 429s and 503s (refusals) at most one line a second, the next one saying
    how many were not logged. Under overload thousands of refusals a second would each cost a log line, CPU the
    engine needs; /metrics counts every one (linearrag_failures_total)."""

    def __init__(self, every_s: float = 1.0):
        super().__init__()
        self.every_s, self.last, self.skipped = every_s, float("-inf"), 0

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and args[4] in (429, 503):
            now = time.monotonic()
            if now - self.last < self.every_s:
                self.skipped += 1
                return False
            self.last = now
            if self.skipped:
                record.msg = f"{record.msg} (and {self.skipped} more refusals not logged)"
                self.skipped = 0
        return True


def connection_limit(settings: ServeSettings) -> int:
    """Requests at work (uvicorn's tasks) before uvicorn answers 503 itself: room for the refusals held
    ``refusal_delay`` seconds beside the admitted requests (idle and slow connections do not count: they are
    --max-connections', serve/connections.py)."""
    return 32 * settings.max_concurrent + 64


def serve(index_dir, settings: ServeSettings, llm=None) -> int:
    """Run the server until SIGINT/SIGTERM (requests in flight are answered first); 0 on a clean stop,
    1 when the index could not be loaded."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = LinearRAGService(index_dir, settings, llm=llm)
    app = EarlyAdmission(create_app(service, early_admission=False), service.front)  # outermost: refusals cost least
    # connections are bounded in number (--max-connections, below the open-file limit) and in time (the head,
    # the body, unread responses, idle keep-alive: serve/connections.py); past 32x --max-concurrent (+64 for
    # probes) requests at work uvicorn answers 503, and the kernel's queue of connections not yet accepted is as
    # long (uvicorn's backlog); one access log line per request at --log-level info (the default) or debug,
    # refusals sampled (RefusalLogSampler)
    return run_server(app, service, settings, f"cannot serve {index_dir}")


def run_server(app, service, settings: ServeSettings, failure: str) -> int:
    """Run ``app`` under uvicorn until it stops (``service``: what holds the metrics and reports a fatal error
    through ``on_fatal``, a LinearRAGService or a Store); 1 with "linearrag serve: error: FAILURE: the error" on
    stderr when the service failed, else 0."""
    limit = connection_limit(settings)
    config = uvicorn_config(app, settings, service.metrics, log_level=settings.log_level,
                            timeout_graceful_shutdown=settings.graceful_timeout, access_log=True,
                            limit_concurrency=limit, backlog=min(2048, limit))
    server = _server_class()(config)
    logging.getLogger("uvicorn.access").addFilter(RefusalLogSampler())
    failed = []

    def fatal(exc):
        failed.append(exc)
        server.should_exit = True

    service.on_fatal = fatal
    server.run()
    if failed:
        print(f"linearrag serve: error: {failure}: {failed[0]}", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_page", "create_app", "serve"]
