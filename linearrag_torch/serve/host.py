"""The engine host: what stands behind the HTTP front (serve/front.py) and answers its searches, declared once.

An engine host loads the index and the models, warms them, reloads them, and runs the batches. The front
(schemas, admission, routes) talks to it through ``EngineHost`` only. Two hosts satisfy it:
``serve/engine_host.LocalEngineHost`` (an index in this process, one engine thread, the dynamic batcher of
serve/batcher.py) and ``serve/ray_app.RayEngineHost`` (the searches go to Ray Serve engine replicas, each of
which runs a LocalEngineHost with Ray's batching). A host may also say how many questions the front admits at
once (``max_in_flight``) and over how many engines (``engines``); the front reads both with defaults.
"""
from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, runtime_checkable


@runtime_checkable
class EngineHost(Protocol):
    """The interface between the HTTP front and the engine (``isinstance(host, EngineHost)`` checks the members
    are there)."""

    settings: object  # serve/settings.ServeSettings
    metrics: object  # serve/metrics.Metrics
    ready: bool  # False until the index is loaded and warm
    load_error: str | None  # why the first load failed, if it did
    fingerprint: str | None  # of the index served (its index.json)

    @property
    def default_top_k(self) -> int:
        """The top_k of a request that gives none."""

    @property
    def queued(self) -> int:
        """Questions waiting for a batch."""

    async def start(self) -> None:
        """Load (or reach) the engine; ``ready`` after it."""

    async def stop(self) -> None:
        """Stop what start() started."""

    def lifespan(self, app=None) -> AbstractAsyncContextManager:
        """start() on entry, stop() on exit (the ASGI lifespan)."""

    async def hits(self, key: tuple, items: list) -> list:
        """One list of Hit per (question, top_k) of ``items``, with the retrieval settings ``key`` (a hashable,
        sorted tuple of (setting, value))."""

    async def reload(self) -> dict:
        """Load the index again and swap it in (a dict on success; serve/engine_host.ReloadRefused otherwise)."""

    async def info(self) -> dict:
        """What GET /info shows of the engine."""


class Lifespan:
    """``lifespan``: start() on entry, stop() on exit (the ASGI lifespan), for a class with both (the engine hosts,
    the store)."""

    @asynccontextmanager
    async def lifespan(self, app=None):
        await self.start()
        try:
            yield
        finally:
            await self.stop()


async def cancel_tasks(tasks: list) -> None:
    """Cancel the background tasks of ``tasks``, wait for each to end (whatever it raised), and empty the list."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        try:
            await t
        except (asyncio.CancelledError, Exception):
            pass
    tasks.clear()
