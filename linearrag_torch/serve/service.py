"""The serving pieces as a library: a LinearRAGService is one index served in this process (the engine host,
serve/engine_host.py: loading, warm-up, reloads, the batcher) with its HTTP front (serve/front.py: schemas,
admission, metrics of requests, the routes as a FastAPI APIRouter).

    service = LinearRAGService("my_index", ServeSettings(max_batch_size=32))
    app = FastAPI(lifespan=service.lifespan)        # or await service.start() / stop() in your own lifespan
    app.include_router(service.router, prefix="/rag")

Routes (relative to the router's prefix): POST /v1/search, POST /v1/answer (with a chat model), GET /health,
GET /info, GET /metrics, POST /admin/reload. Every route but /health needs 'Authorization: Bearer KEY' when
settings.api_key is set.
"""
from __future__ import annotations

from .engine_host import WARMUP_QUESTION, LocalEngineHost, ReloadRefused, index_fingerprint  # noqa: F401
from .front import HTTPError, HTTPFront  # noqa: F401
from .schemas import REQUEST_MAX, SERVER_ONLY_SETTINGS, search_request_model  # noqa: F401
from .settings import ServeSettings


class LinearRAGService(LocalEngineHost):
    """One served index. ``rag``: an already loaded LinearRAG (else it is loaded from ``index_dir`` when
    the service starts, while /health answers 503). ``llm``: a generation.LLM for POST /v1/answer.

    The engine host's methods are its own (start, stop, lifespan, reload, hits, ...); ``router``, ``search``,
    ``answer`` and ``in_flight`` are its HTTP front's (``front``)."""

    def __init__(self, index_dir=None, settings: ServeSettings | None = None, rag=None, llm=None):
        super().__init__(index_dir, settings, rag=rag)
        self.front = HTTPFront(self, llm=llm)

    @property
    def router(self):
        return self.front.router

    @property
    def SearchRequest(self):  # noqa: N802 (the model class)
        return self.front.SearchRequest

    @property
    def llm(self):
        return self.front.llm

    @property
    def in_flight(self) -> int:
        return self.front.in_flight

    async def search(self, body: dict) -> dict:
        """Validate a /v1/search body and answer it (the route's work; callable directly)."""
        return await self.front.search(body)

    async def answer(self, body: dict) -> dict:
        """/v1/answer's work: the /v1/search body; the questions' hits go to the chat model."""
        return await self.front.answer(body)


__all__ = ["HTTPError", "LinearRAGService", "ReloadRefused"]
