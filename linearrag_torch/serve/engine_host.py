"""The single-process engine host: an index in this process, one engine thread, the dynamic batcher of
serve/batcher.py. It satisfies serve/host.EngineHost, the interface the HTTP front (serve/front.py) drives;
``serve/ray_app.RayEngineHost`` is the other one (its engine replicas each run a LocalEngineHost with Ray's
batching).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import Callable

from .. import __version__
from ..config import RetrievalConfig
from ..retrieval.memory import parse_bytes, release_freed_memory, status_bytes
from .admission import HEAVY_COST, question_cost, rerank_pairs
from .batcher import Batcher
from .host import Lifespan, cancel_tasks
from .metrics import Metrics
from .settings import ServeSettings

log = logging.getLogger("linearrag.serve")

WARMUP_QUESTION = "Who directed the film and where was the director born?"


class ReloadRefused(Exception):
    """A new index that cannot be served (unreadable, failed verification, other models); the old one stays."""


def index_fingerprint(index_dir: Path) -> str | None:
    try:
        return hashlib.sha256((index_dir / "index.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return None


class LocalEngineHost(Lifespan):
    """One index served in this process (a serve/host.EngineHost). ``rag``: an already loaded LinearRAG (else it is loaded from
    ``index_dir`` when the host starts; ``ready`` is False until then). ``batcher``: a function of the engine
    call (``run_batch(key, questions)``) returning the batcher to use (default: serve/batcher.Batcher with the
    settings' batching; the Ray engine replicas pass Ray Serve's)."""

    def __init__(self, index_dir=None, settings: ServeSettings | None = None, rag=None,
                 metrics: Metrics | None = None, batcher: Callable | None = None):
        if index_dir is None and rag is None:
            raise ValueError("give an index folder or a loaded LinearRAG")
        self._pairs = {}  # reranker pairs a question by retrieval settings (question_cost)
        self.settings = settings or ServeSettings()
        self.index_dir = Path(index_dir) if index_dir is not None else None
        self.rag = rag
        self._started_ner_processes = False  # --ner-processes: stopped with the host
        self.metrics = metrics or Metrics()
        if batcher is None:
            self.batcher = Batcher(self._run_batch, self.settings.max_batch_size, self.settings.max_wait_ms,
                                   on_batch=self.metrics.on_batch, gather_ms=self.settings.gather_ms,
                                   cost=self.question_cost, heavy_share=self.settings.heavy_share,
                                   heavy_cost=HEAVY_COST)
        else:
            self.batcher = batcher(self._run_batch)
        self.ready = False
        self.load_error: str | None = None
        self.fingerprint: str | None = None
        self.loaded_at: float | None = None
        self.on_fatal = None  # called with the error when the first load fails (the CLI stops the server)
        self._reload_lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ what the front uses
    @property
    def default_top_k(self) -> int:
        return self.rag.config.top_k

    @property
    def queued(self) -> int:
        return self.batcher.queued

    @property
    def retrieval_config(self):
        """The index's retrieval settings (None while none is loaded): the front checks a request's against them."""
        return self.rag.config if self.rag is not None else None

    async def hits(self, key: tuple, items: list) -> list:
        """Hits for each (question, top_k) with the retrieval settings ``key``, through the batcher."""
        return await self.batcher.submit(key, items)

    async def explain(self, key: tuple, questions: list, top_k: int) -> list:
        """LinearRAG.explain of ``questions`` with the retrieval settings ``key``, as JSON (schemas.explanation_json),
        on the engine thread between two batches (a traced call of its own: it rides in no batch)."""
        return await self.batcher.call(self._explain, key, questions, top_k)

    def _explain(self, key: tuple, questions: list, top_k: int) -> list:
        from .schemas import explanation_json

        return [explanation_json(e) for e in self.rag.explain(list(questions), top_k, **self._overrides(key))]

    def question_cost(self, key: tuple, item) -> float:
        """Work units of one (question, top_k) with the retrieval settings ``key`` (serve/admission.py): with
        rerank, over the pairs the reranker will read, the settings taken as the engine takes them (_run_batch)."""
        got = self._pairs.get(key)
        if got is None:  # (once per settings: the batcher asks for every question; a bounded memo)
            if len(self._pairs) >= 256:
                self._pairs.clear()
            cfg = (self.rag.config if self.rag is not None else RetrievalConfig()).replace(**self._overrides(key))
            got = self._pairs[key] = (cfg.rerank, rerank_pairs(cfg))
        return question_cost(len(item[0]), item[1], *got)

    async def info(self) -> dict:
        return self.describe()

    def describe(self) -> dict:
        """Index counts, settings, device, memory, queue (GET /info without the front's own fields)."""
        import torch

        rag = self.rag if self.ready else None
        # RssFile: pages of mapped files (an index's tensors are mapped from its folder), which the kernel can drop
        memory = {"rss_bytes": status_bytes("VmRSS"), "rss_anonymous_bytes": status_bytes("RssAnon"),
                  "rss_file_bytes": status_bytes("RssFile")}
        if rag is not None:
            index_parts, graph_parts = rag.index.nbytes_by_part(), rag.graph.nbytes_by_part()
            # the index's tensors (mapped where read from a folder) and what the engine made from them
            memory["index_tensors_bytes"] = sum(index_parts.values()) + sum(graph_parts.values())
            memory["index_bytes_by_part"], memory["engine_bytes_by_part"] = index_parts, graph_parts
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
            "torch_threads": torch.get_num_threads(),
            "memory": memory,
            "queued_questions": self.batcher.queued,
        }

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the batcher and load the index in the background (the routes answer 503 until ready)."""
        self._reload_lock = asyncio.Lock()
        if self.settings.threads is not None:
            from ..runtime.threads import set_threads  # deferred: imports torch (as below)

            set_threads(self.settings.threads)  # process-wide: only when asked for
        self.batcher.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._first_load(), name="linearrag-load"))
        if self.settings.watch > 0 and self.index_dir is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._watch(), name="linearrag-watch"))

    async def stop(self) -> None:
        """Stop watching, answer what is queued, stop the engine thread."""
        await cancel_tasks(self._tasks)
        await self.batcher.stop()
        if self.rag is not None and self._started_ner_processes:
            self.rag.close()  # the NER worker processes this service started

    async def _first_load(self) -> None:
        try:
            if self.rag is None:  # on the engine thread: see _load_beside
                self.rag, self.fingerprint = await self._fingerprinted(self.batcher.call(self._load_rag, None))
            else:
                if self.index_dir is not None:
                    self.fingerprint = index_fingerprint(self.index_dir)
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
        # deferred: import torch; the HTTP front (front.py, the Ray ingress) imports this module torch-free
        from ..api import LinearRAG
        from ..index import TriGraphIndex

        index = TriGraphIndex.load(self.index_dir, device="cpu", verify=True)
        rag = LinearRAG(index, self.settings.device, quantize=self.settings.quantize,
                        encoder_backend=self.settings.encoder_backend)
        if like is not None:
            rag.share_models_from(like)
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
        operations slow down for good (measured: docs/benchmarks/serve.md, the results on the Xeon with AMX).
        So the
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

    def _overrides(self, key) -> dict:
        """The retrieval settings of a batch: the operator's defaults under the request's own (``key``)."""
        return {**self._defaults(), **dict(key)}

    def _warm(self, rag) -> None:
        """Load the models (the reranker too when it is on) and build the PageRank operator before the first
        request (engine thread)."""
        rag.search([WARMUP_QUESTION], **self._defaults())

    def _run_batch(self, key, questions: list) -> list:
        """Engine thread: one search for the batch at the largest top_k asked; each question keeps its own k
        (the engine's top-k is a prefix: ties go to the lower row whatever k is)."""
        overrides = self._overrides(key)
        k = max(q[1] for q in questions)
        timings = {}
        hits = self.rag.search([q[0] for q in questions], top_k=k, timings=timings, **overrides)
        self.metrics.on_stages(timings)
        return [h[:kq] for h, (_, kq) in zip(hits, questions)]

    def _swap(self, rag) -> None:
        """Engine thread, between two batches: warm ``rag`` and serve it; the old index is dropped and its
        memory given back to the system (the CLI's keep_freed_memory would otherwise keep it in the heap, and
        each reload would grow the process by the part of an index that the next one cannot reuse)."""
        self._warm(rag)
        old, self.rag = self.rag, rag
        self._pairs = {}  # the index's settings may have changed
        if old is not None and old.ner_pool is not None:
            if old.ner_pool is rag.ner_pool:
                old.models.detach_ner_pool()  # the NER worker processes now belong to the new index
            else:
                old.close()  # its NER worker processes load another spaCy model
        del old
        release_freed_memory()

    # ------------------------------------------------------------------ reload
    async def reload(self) -> dict:
        """Load INDEX_DIR again, verify it, warm it and swap it in between two batches. A failure raises
        ReloadRefused and the old index keeps serving. Requests keep being answered meanwhile."""
        if self.index_dir is None:
            raise ReloadRefused("this service was given an index in memory, not a folder")
        if not self.ready:
            raise ReloadRefused("the first index is not loaded yet")
        async with self._reload_lock:
            t0 = time.perf_counter()
            rag = None
            try:
                rag, fingerprint = await self._fingerprinted(asyncio.to_thread(self._load_beside, self.rag))
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

    async def _fingerprinted(self, loading) -> tuple:
        """(the index that ``await loading`` loaded from INDEX_DIR, the fingerprint of the index.json it read): the
        folder's fingerprint before and after the load, or None when a writer committed meanwhile (each commit
        writes an index.json of its own: which of the two was read is then unknown, and the watcher reloads)."""
        before = index_fingerprint(self.index_dir)
        rag = await loading
        return rag, before if index_fingerprint(self.index_dir) == before else None

    async def _watch(self) -> None:
        """Reload when index.json changes (a committed `linearrag add` / `delete`)."""
        while True:
            await asyncio.sleep(self.settings.watch)
            if not self.ready or self._reload_lock.locked():
                continue
            current = index_fingerprint(self.index_dir)
            if current is not None and current != self.fingerprint:
                try:
                    await self.reload()
                except ReloadRefused:
                    self.fingerprint = current  # logged; do not retry the same bad index every tick

