"""Replicas with Ray Serve (extra ``ray``): the same HTTP API as `linearrag serve`, answered by N engine replicas.

Two deployments, one application (``build_app``):

* ``LinearRAGEngine`` -- each replica loads the index and the models once (one GPU per replica when the
  cluster has GPUs) and answers ``search(key, [(question, top_k), ...])``. Concurrent calls are coalesced by
  Ray Serve's own ``@serve.batch`` (``--max-batch-size`` questions or ``--max-wait-ms``, from ServeSettings)
  into one engine call on the replica's engine thread: ``RayBatcher`` below has the interface of the
  single-process ``Batcher``, so the replica runs the single-process engine host (``LocalEngineHost``:
  loading, warm-up, ``--watch`` reloads, the engine thread) with Ray's batching in place of ours.
* ``LinearRAGIngress`` -- the HTTP front of the single-process server (``HTTPFront``: the same request and
  response schema, validation, limits, API key, /health, /info, /metrics) over a second engine host,
  ``RayEngineHost``, whose searches go to the engine replicas through a DeploymentHandle. The engine deployment's ``max_queued_requests``
  (``--max-queued``) bounds the requests waiting for a replica; one more is Ray's ``BackPressureError``,
  answered 429 with Retry-After. A search whose replica dies mid-request is sent to another replica (a
  search changes nothing, so it is safe to repeat) up to ``--ray-retries`` times, then answered 503 with
  Retry-After; no request is lost without the client seeing a status it can retry.

Each engine response carries the statistics of the batches its replica ran since its last response, so the
ingress's /metrics has the same series as the single-process server, over all replicas.

Run it with ``linearrag serve INDEX_DIR --ray [--replicas N | --autoscale MIN,MAX]``, or with Ray's CLI on
an existing cluster::

    serve run linearrag_torch.serve.ray_app:app_builder index_dir=/data/my_index replicas=4 max_batch_size=64

(the arguments are ServeSettings and RaySettings fields; Serve's own config sets the HTTP host and port).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Callable, Hashable, Sequence

from ..runtime.words import count
from ..config import RetrievalConfig, _f
from .batcher import BatchStats
from .host import Lifespan
from .settings import ServeSettings

log = logging.getLogger("linearrag.serve.ray")

APP_NAME = "linearrag"
ENGINE = "LinearRAGEngine"
INGRESS = "LinearRAGIngress"
MAX_PENDING_STATS = 4096  # batch statistics a replica keeps for the ingress at most (the oldest are dropped)


@dataclass
class RaySettings:
    """How `linearrag serve --ray` places and scales the engine replicas (with ServeSettings for the rest:
    --max-batch-size / --max-wait-ms are @serve.batch's, --max-concurrent is each replica's
    max_ongoing_requests)."""

    ray: bool = _f(False, "serve with Ray Serve: engine replicas behind one HTTP ingress (pip install "
                          "'linearrag_torch[ray]'); same routes and schema. Give --max-wait-ms (e.g. 20 on a CPU): "
                          "Ray's @serve.batch closes a batch that long after its first question even while the "
                          "engine is busy, so 0 means batches of about one question")
    replicas: int | None = _f(None, "engine replicas, each loading the index (default: one per GPU of the Ray "
                                    "cluster, else 1)", type=int)
    autoscale: str | None = _f(None, "MIN,MAX: Ray Serve scales the engine replicas between MIN and MAX by load "
                                     "(instead of --replicas)", type=str)
    target_ongoing: int = _f(16, "with --autoscale: requests in flight per replica the autoscaler aims at")
    max_queued: int = _f(256, "requests waiting for a free engine replica (Ray's max_queued_requests); one more "
                              "gets 429 with Retry-After")
    replica_cpus: float = _f(1.0, "CPUs reserved for each engine replica (also its torch threads unless --threads)")
    replica_gpus: float | None = _f(None, "GPUs per engine replica (default: 1 when the Ray cluster has GPUs, "
                                          "else 0)", type=float)
    ingress_replicas: int = _f(1, "HTTP ingress replicas (routes, validation, limits, metrics; no models)")
    ray_retries: int = _f(2, "times a search whose replica died mid-request is sent to another replica before "
                             "the client gets 503 with Retry-After")
    ray_address: str | None = _f(None, "Ray cluster to run on: auto (the one this machine belongs to), "
                                       "ray://HOST:10001, or local (a new one on this machine); default: the Ray "
                                       "started on this machine with `ray start` if any, else a new local one",
                        type=str)

    def __post_init__(self) -> None:
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.replicas is not None and self.autoscale:
            raise ValueError("give either --replicas or --autoscale, not both")
        self.autoscale_bounds()  # checks the format
        for name in ("target_ongoing", "max_queued", "ingress_replicas"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ray_retries < 0 or self.replica_cpus < 0 or (self.replica_gpus or 0) < 0:
            raise ValueError("ray_retries, replica_cpus and replica_gpus must be >= 0")

    def autoscale_bounds(self) -> tuple[int, int] | None:
        if not self.autoscale:
            return None
        try:
            lo, hi = (int(x) for x in self.autoscale.split(","))
        except ValueError:
            raise ValueError(f"autoscale must be MIN,MAX (two integers), got {self.autoscale!r}") from None
        if not 0 <= lo <= hi or hi < 1:
            raise ValueError(f"autoscale needs 0 <= MIN <= MAX and MAX >= 1, got {self.autoscale!r}")
        return lo, hi


# ---------------------------------------------------------------------------------------------- batching
@dataclass
class _Item:
    key: Hashable
    question: object  # (text, top_k)
    enqueued: float
    request: int  # the submit call it came from
    taken: bool = False


class RayBatcher:
    """The single-process Batcher's interface (start, stop, submit, call, queued) on Ray Serve's
    ``@serve.batch``: each question is one batch item, so a batch holds up to ``max_batch_size`` questions
    and forms after ``max_wait_ms`` (0: what queued while the engine was busy). Items with different
    settings keys in one Ray batch become one engine call per key. ``run_batch`` and ``call`` run on one
    engine thread, as with Batcher."""

    def __init__(self, run_batch: Callable[[Hashable, list], list], max_batch_size: int = 64,
                 max_wait_ms: float = 0.0, on_batch: Callable[[BatchStats], None] | None = None):
        from ray import serve

        self.run_batch = run_batch
        self.on_batch = on_batch
        self.max_batch_size = max_batch_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="linearrag-engine")
        self._waiting = 0
        self._requests = 0
        self._running = False
        # one Ray batch queue per batcher (decorating the bound method here, not the class's function)
        self._submit_one = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_wait_ms / 1000.0,
                                       max_concurrent_batches=1)(self._run_items)

    def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        """Refuse new questions, let the queued ones be answered (up to 60 s), stop the engine thread."""
        self._running = False
        deadline = time.monotonic() + 60
        while self._waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._executor.shutdown(wait=True)

    @property
    def queued(self) -> int:
        return self._waiting

    @property
    def running(self) -> bool:
        """Between start() and stop(): questions are taken."""
        return self._running

    async def submit(self, key: Hashable, questions: Sequence) -> list:
        if not self._running:
            raise RuntimeError("the batcher is not running")
        self._requests += 1
        now = time.perf_counter()
        items = [_Item(key, q, now, self._requests) for q in questions]
        self._waiting += len(items)
        try:
            outcomes = await asyncio.gather(*(self._submit_one(it) for it in items))
        except BaseException:
            self._waiting -= sum(not it.taken for it in items)  # cancelled before a batch took them
            for it in items:
                it.taken = True
            raise
        for ok, value in outcomes:
            if not ok:
                raise value
        return [value for _, value in outcomes]

    async def call(self, fn: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _run_items(self, items: list) -> list:
        """The @serve.batch function: one (ok, result-or-exception) per item."""
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        for it in items:
            if not it.taken:
                it.taken = True
                self._waiting -= 1
        groups: dict = {}
        for i, it in enumerate(items):
            groups.setdefault(it.key, []).append(i)
        out: list = [None] * len(items)
        for key, idx in groups.items():
            t0 = time.perf_counter()
            error = None
            try:
                results = await loop.run_in_executor(self._executor, self.run_batch, key,
                                                     [items[i].question for i in idx])
                if len(results) != len(idx):
                    raise RuntimeError(f"the engine returned {len(results)} results for {len(idx)} questions")
                for i, r in zip(idx, results):
                    out[i] = (True, r)
            except Exception as exc:  # noqa: BLE001 (each question of the group gets it)
                error = exc
                for i in idx:
                    out[i] = (False, exc)
            if self.on_batch is not None:
                first: dict = {}
                for i in idx:
                    first.setdefault(items[i].request, items[i].enqueued)
                self.on_batch(BatchStats(len(idx), len(first), [now - t for t in first.values()],
                                         time.perf_counter() - t0, error))
        return out


# ---------------------------------------------------------------------------------------------- the engine
def _replica_id() -> str | None:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 (outside a replica)
        return None


class LinearRAGEngine:
    """One engine replica: a LocalEngineHost (index, models, engine thread, --watch reloads) whose batching is
    Ray Serve's. Ray makes it a deployment in ``build_app``."""

    async def __init__(self, index_dir: str, settings: dict):
        # deferred (this module's .engine_host, .metrics, .front, .app): the 'serve' extra, which
        # `linearrag serve --help` (it imports this module) does not need
        from .engine_host import LocalEngineHost

        s = ServeSettings(**settings)
        self._stats: list[BatchStats] = []
        self.host = LocalEngineHost(index_dir, s, batcher=lambda run_batch: RayBatcher(
            run_batch, s.max_batch_size, s.max_wait_ms, on_batch=self._on_batch))
        await self.host.start()
        while not self.host.ready:  # the replica takes requests once the index is loaded and warm
            if self.host.load_error:
                await self.host.stop()
                raise RuntimeError(f"cannot serve {index_dir}: {self.host.load_error}")
            await asyncio.sleep(0.05)

    def _on_batch(self, stats: BatchStats) -> None:
        err = stats.error
        self._stats.append(dataclasses.replace(stats, error=None if err is None else f"{type(err).__name__}: {err}"))
        del self._stats[:-MAX_PENDING_STATS]

    async def search(self, key: tuple, questions: list) -> dict:
        """Hits for each (question, top_k) with the retrieval settings ``key`` (HTTPFront.batch_key), and the
        statistics of the batches this replica ran since its last answer."""
        hits = await self.host.hits(key, questions)
        stats, self._stats = self._stats, []
        return {"hits": [[tuple(h) for h in hs] for hs in hits], "batches": stats, "replica": _replica_id()}

    async def describe(self) -> dict:
        return {**self.host.describe(), "replica": _replica_id()}

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine thread is gone is replaced."""
        if not self.host.ready or not self.host.batcher.running:
            raise RuntimeError("the engine is not running")

    async def __del__(self):
        await self.host.stop()


# ---------------------------------------------------------------------------------------------- the ingress
class RayEngineHost(Lifespan):
    """The engine host of the ingress (a serve/host.EngineHost): its searches go to the engine
    deployment through a DeploymentHandle; it holds no index and no models. The engine replicas report the
    statistics of their batches with each answer, so /metrics has the single-process server's series."""

    def __init__(self, settings: ServeSettings, engine, ray_settings: RaySettings):
        from prometheus_client import Counter

        from .metrics import Metrics  # deferred: the 'serve' extra

        self.settings = settings
        self.engine = engine
        self.ray_settings = ray_settings
        self.metrics = Metrics()
        self.retries = Counter("replica_retries_total", "Searches sent to another engine replica after theirs "
                               "died mid-request", namespace="linearrag", registry=self.metrics.registry)
        self.ready = False
        self.load_error: str | None = None
        self.fingerprint: str | None = None
        self.loaded_at: float | None = None
        self.default_top_k = 5
        self.retrieval_config = None  # the replicas' index's settings (the front checks a request's against them)
        bounds = ray_settings.autoscale_bounds()
        self.engines = ray_settings.replicas or (bounds[1] if bounds else 1)  # replicas answering in parallel
        # the front admits what the replicas take at once and Ray queues; Ray's backpressure stays the backstop
        self.max_in_flight = self.engines * settings.max_concurrent + ray_settings.max_queued
        self.queued = 0  # the questions wait in Ray's queues (each replica's /info: queued_questions)

    async def start(self) -> None:
        info = await self.engine.describe.remote()  # waits for an engine replica
        self.default_top_k = info["settings"]["top_k"]
        self.retrieval_config = RetrievalConfig.from_dict(info["settings"])
        self.fingerprint = info["fingerprint"]
        self.loaded_at = time.time()
        self.ready = True

    async def stop(self) -> None:
        """Nothing to stop here: Ray Serve stops the engine replicas."""

    async def hits(self, key: tuple, items: list) -> list:
        from ..corpus import Hit  # deferred: `linearrag serve --help` imports this module

        out = await self._remote_search(key, items)
        for stats in out["batches"]:
            self.metrics.on_batch(stats)
        return [[Hit(*h) for h in hs] for hs in out["hits"]]

    async def _remote_search(self, key, items) -> dict:
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

        from .front import HTTPError  # deferred: the 'serve' extra

        last = None
        for attempt in range(self.ray_settings.ray_retries + 1):
            try:
                return await self.engine.search.remote(key, items)
            except BackPressureError as exc:
                raise HTTPError(429, f"all engine replicas are busy and {exc.message}; retry shortly",
                                "overloaded", {"Retry-After": "1"}) from None
            except (RayActorError, DeploymentUnavailableError) as exc:
                last = exc  # the replica died mid-request: a search changes nothing, ask another one
                self.retries.inc()
                log.warning("engine replica lost during a search (attempt %d): %s", attempt + 1,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise HTTPError(503, f"the engine replica answering this request was lost ({type(last).__name__}); "
                             "retry shortly", "replica_lost", {"Retry-After": "1"})

    async def reload(self) -> dict:
        from .engine_host import ReloadRefused  # deferred: the 'serve' extra

        raise ReloadRefused("with --ray each engine replica reloads itself: start it with --watch SECONDS "
                            "(replicas check index.json and swap with no failed request), or redeploy")

    async def info(self) -> dict:
        engine = await asyncio.wait_for(self.engine.describe.remote(), self.settings.timeout)
        try:
            replicas = await asyncio.wait_for(asyncio.to_thread(_replica_states), 10)
        except Exception as exc:  # noqa: BLE001
            replicas = f"unknown: {type(exc).__name__}: {exc}"
        engine.update({
            "server": self.settings.public(),
            "ray": {**dataclasses.asdict(self.ray_settings), "ray": True, "replicas": replicas,
                    "ingress_replica": _replica_id(), "answered_by": engine.pop("replica")},
        })
        return engine


def _replica_states() -> dict:
    """Replica states per deployment of this application (serve.status())."""
    from ray import serve

    app = serve.status().applications.get(APP_NAME)
    if app is None:
        return {}
    return {name: dict(d.replica_states) for name, d in app.deployments.items()}


class LinearRAGIngress:
    """The HTTP routes of `linearrag serve` (serve/front.HTTPFront) in front of the engine deployment."""

    def __init__(self, engine, index_dir: str, settings: dict, ray_settings: dict, llm_factory=None):
        from .front import HTTPFront  # deferred: the 'serve' extra

        self.host = RayEngineHost(ServeSettings(**settings), engine, RaySettings(**ray_settings))
        self.front = HTTPFront(self.host, llm=llm_factory() if llm_factory is not None else None)

    def __serve_build_asgi_app__(self):
        from .app import create_app  # deferred: the 'serve' extra

        return create_app(self.front)


# ---------------------------------------------------------------------------------------------- the application
def _gpus_in_cluster() -> float:
    try:
        import ray

        return float(ray.cluster_resources().get("GPU", 0)) if ray.is_initialized() else 0.0
    except Exception:  # noqa: BLE001
        return 0.0


def deployment_options(settings: ServeSettings, ray_settings: RaySettings) -> tuple[dict, dict]:
    """The Ray Serve options of the engine and the ingress deployments."""
    from ray.serve.config import BackpressureConfig

    gpus = ray_settings.replica_gpus
    cluster_gpus = _gpus_in_cluster()
    if gpus is None:
        gpus = 1.0 if cluster_gpus > 0 else 0.0
    backpressure = BackpressureConfig(status_code=429, retry_after_s=1)
    engine = {
        "name": ENGINE,
        "ray_actor_options": {"num_cpus": ray_settings.replica_cpus, "num_gpus": gpus},
        "max_ongoing_requests": settings.max_concurrent,
        "max_queued_requests": ray_settings.max_queued,
        "backpressure_config": backpressure,
        "graceful_shutdown_timeout_s": settings.graceful_timeout,
        "health_check_period_s": 5,
    }
    bounds = ray_settings.autoscale_bounds()
    if bounds:
        engine["autoscaling_config"] = {"min_replicas": bounds[0], "max_replicas": bounds[1],
                                        "initial_replicas": max(bounds[0], 1),
                                        "target_ongoing_requests": ray_settings.target_ongoing}
        most = bounds[1]
    else:
        most = ray_settings.replicas or (max(1, int(cluster_gpus)) if gpus > 0 else 1)
        engine["num_replicas"] = most
    # every request the engine can hold (in flight + queued), plus probes, fits in the ingress, and as many
    # again may wait at Ray's proxy for the ingress to take them (Ray counts a request as queued until a
    # replica has taken it, which under a burst is most of them): the engine's max_queued is the limit that
    # answers 429, these two only bound memory
    ingress_limit = most * settings.max_concurrent + ray_settings.max_queued + 64
    ingress = {
        "name": INGRESS,
        "num_replicas": ray_settings.ingress_replicas,
        "ray_actor_options": {"num_cpus": 0},
        "max_ongoing_requests": ingress_limit,
        "max_queued_requests": ingress_limit,
        "backpressure_config": backpressure,
        "graceful_shutdown_timeout_s": settings.graceful_timeout,
    }
    return engine, ingress


def build_app(index_dir, settings: ServeSettings | None = None, ray_settings: RaySettings | None = None,
              llm_factory: Callable | None = None):
    """The Ray Serve application (engine + ingress) serving ``index_dir``; run it with ``serve.run``.
    ``llm_factory``: a picklable zero-argument callable returning a generation.LLM (for /v1/answer), called
    in the ingress replica."""
    from ray import serve

    settings = settings or ServeSettings()
    ray_settings = ray_settings or RaySettings()
    index_dir = os.path.abspath(os.fspath(index_dir))
    engine_opts, ingress_opts = deployment_options(settings, ray_settings)
    engine_settings = dataclasses.asdict(settings)
    if engine_settings["threads"] is None and not engine_opts["ray_actor_options"]["num_gpus"]:
        engine_settings["threads"] = max(1, int(ray_settings.replica_cpus))  # torch threads = the CPUs reserved
    engine = serve.deployment(**engine_opts)(LinearRAGEngine).bind(index_dir, engine_settings)
    ingress_cls = serve.deployment(**ingress_opts)(serve.ingress()(LinearRAGIngress))
    return ingress_cls.bind(engine, index_dir, dataclasses.asdict(settings), dataclasses.asdict(ray_settings),
                            llm_factory)


def _coerce(cls, args: dict) -> dict:
    """``serve run`` passes strings: convert them to the field types of ``cls``."""
    out = {}
    for f in fields(cls):
        if f.name not in args:
            continue
        v = args[f.name]
        if isinstance(v, str):
            typ = f.metadata.get("type") or type(f.default)
            if typ is bool:
                v = v.strip().lower() in ("1", "true", "yes", "on")
            elif v.strip().lower() in ("none", "null", ""):
                v = None
            elif typ in (int, float):
                v = typ(v)
        out[f.name] = v
    return out


def app_builder(args: dict):
    """``serve run linearrag_torch.serve.ray_app:app_builder index_dir=DIR [field=value ...]``: any
    ServeSettings or RaySettings field (host and port are Serve's own: its config file or --address)."""
    args = dict(args)
    if "index_dir" not in args:
        raise ValueError("give index_dir=DIR")
    index_dir = args.pop("index_dir")
    known = {f.name for f in fields(ServeSettings)} | {f.name for f in fields(RaySettings)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(known)}")
    return build_app(index_dir, ServeSettings(**_coerce(ServeSettings, args)),
                     RaySettings(**_coerce(RaySettings, args)))


# ---------------------------------------------------------------------------------------------- `linearrag serve --ray`
def serve_ray(index_dir, settings: ServeSettings, ray_settings: RaySettings, llm_factory=None) -> int:
    """Start (or join) Ray, deploy the application at http://HOST:PORT/ and keep it until SIGINT/SIGTERM;
    then take it down (the replicas finish the requests in flight). 0 on a clean stop, 1 when it could
    not be deployed."""
    import ray
    from ray import serve

    from ..indexing.ray_build import cluster_line, init_quietly, starts_new_cluster  # deferred: tqdm, +50 ms on serve --help

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    own_cluster = starts_new_cluster(ray, ray_settings.ray_address)
    init_quietly(ray, ray_settings.ray_address, own_cluster)
    print(cluster_line(ray, own_cluster), file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # Serve's own actors (controller, proxies) and its driver-side logger at WARNING unless --log-level
        # debug: their start-up INFO lines are noise; the replicas log at --log-level (their access lines)
        system_level = "DEBUG" if settings.log_level == "debug" else "WARNING"
        logging.getLogger("ray.serve").setLevel(system_level)
        serve.start(http_options={"host": settings.host, "port": settings.port},
                    logging_config={"log_level": system_level})
        try:
            serve.run(build_app(index_dir, settings, ray_settings, llm_factory), name=APP_NAME, route_prefix="/")
        except Exception as exc:  # noqa: BLE001 (the deployment failed: the replicas' error is in the message)
            print(f"linearrag serve: error: cannot serve {index_dir} with Ray: {exc}", file=sys.stderr)
            return 1
        replicas = _replica_states().get(ENGINE, {})
        print(f"serving {index_dir} at http://{settings.host}:{settings.port}/ with Ray Serve "
              f"({count(replicas.get('RUNNING', 0), 'engine replica')} running); Ctrl-C stops", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
        print("stopping: the replicas finish the requests in flight", file=sys.stderr, flush=True)
        if own_cluster:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
        return 0
    finally:
        ray.shutdown()


__all__ = ["LinearRAGEngine", "LinearRAGIngress", "RayBatcher", "RayEngineHost", "RaySettings", "app_builder", "build_app",
           "deployment_options", "serve_ray"]
