"""Serving: dynamic batching, limits, metrics and index reloads over HTTP (extra ``serve``:
fastapi, uvicorn, prometheus-client). See docs/serving.md."""
from .batcher import Batcher, BatchStats
from .settings import ServeSettings

__all__ = ["Batcher", "BatchStats", "LinearRAGService", "ServeSettings", "create_app"]


def __getattr__(name):  # deferred: the FastAPI pieces import fastapi (the 'serve' extra) only when asked for
    if name == "LinearRAGService":
        from .service import LinearRAGService

        return LinearRAGService
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
