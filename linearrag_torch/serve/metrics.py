"""Prometheus metrics of the server (prometheus-client), in a registry of their own per service so that
several services (or tests) in one process do not collide; ``GET /metrics`` exposes it."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the route)

from .connections import CLOSE_REASONS

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# failure reasons counted by linearrag_failures_total
REASONS = ("body_too_large", "invalid", "unauthorized", "overloaded", "timeout", "engine_error", "not_ready",
           "llm_error", "no_chat_model", "client_gone", "body_timeout")


class Metrics:
    def __init__(self, namespace: str = "linearrag"):
        r = self.registry = CollectorRegistry()
        self.request_seconds = Histogram("request_duration_seconds", "Time from request to response, by route",
                                         ["route", "status"], namespace=namespace, registry=r,
                                         buckets=LATENCY_BUCKETS)
        self.queue_seconds = Histogram("queue_wait_seconds", "Time a request's questions waited for a batch",
                                       namespace=namespace, registry=r, buckets=LATENCY_BUCKETS)
        self.batch_size = Histogram("batch_size_questions", "Questions per engine call", namespace=namespace,
                                    registry=r, buckets=BATCH_BUCKETS)
        self.engine_seconds = Histogram("engine_seconds", "Time of one engine call (NER, encoder, graph)",
                                        namespace=namespace, registry=r, buckets=LATENCY_BUCKETS)
        self.stage_seconds = Histogram("stage_seconds", "Time of one stage of an engine call (ner, lexicon, encoder, "
                                       "graph, rerank)", ["stage"], namespace=namespace, registry=r,
                                       buckets=LATENCY_BUCKETS)
        self.class_seconds = Counter("engine_class_seconds", "Engine seconds by request class (light, heavy: over 8 "
                                     "work units, serve/admission.py); a batch holding both shares its seconds in "
                                     "proportion to their work units", ["class"], namespace=namespace, registry=r)
        self._class_child = {c: self.class_seconds.labels(c) for c in ("light", "heavy")}
        self.in_flight = Gauge("in_flight_requests", "Requests being answered now", namespace=namespace, registry=r)
        self.queued = Gauge("queued_questions", "Questions waiting for a batch", namespace=namespace, registry=r)
        self.questions = Counter("questions_total", "Questions answered", namespace=namespace, registry=r)
        self.failures = Counter("failures_total", "Requests that failed, by reason", ["reason"],
                                namespace=namespace, registry=r)
        self.engine_errors = Counter("engine_errors_total", "Engine calls (batches) that raised: their requests got 500",
                                     namespace=namespace, registry=r)
        self.open_connections = Gauge("open_connections", "HTTP connections open now (serve/connections.py)",
                                      namespace=namespace, registry=r)
        self.connections_closed = Counter("connections_closed_total", "Connections the server closed on its own, by "
                                          "reason (serve/connections.py)", ["reason"], namespace=namespace, registry=r)
        self.reloads = Counter("reloads_total", "Index reloads, by result", ["result"], namespace=namespace,
                               registry=r)
        self.batch_listeners = []  # more callbacks of on_batch (the front's admission: the engine's pace)
        self._failure_of = {reason: self.failures.labels(reason) for reason in REASONS}  # present at 0 from the
        # start, so rates are defined; kept, as labels() costs ~5 us a call
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)
        for result in ("ok", "refused"):
            self.reloads.labels(result)

    def failure(self, reason: str) -> None:
        """One more failed request for ``reason`` (linearrag_failures_total)."""
        child = self._failure_of.get(reason)
        if child is None:
            child = self._failure_of[reason] = self.failures.labels(reason)
        child.inc()

    def on_batch(self, stats) -> None:
        """Batcher callback (runs on the event loop)."""
        self.batch_size.observe(stats.size)
        self.engine_seconds.observe(stats.engine_s)
        for w in stats.queue_waits:
            self.queue_seconds.observe(w)
        heavy = stats.heavy_work / stats.work if stats.work else 0.0
        self._class_child["heavy"].inc(stats.engine_s * heavy)
        self._class_child["light"].inc(stats.engine_s * (1.0 - heavy))
        if stats.error is None:
            self.questions.inc(stats.size)
        else:
            self.engine_errors.inc()
        for listener in self.batch_listeners:
            listener(stats)

    def on_stages(self, timings: dict) -> None:
        """Seconds of each stage of one engine call (LinearRAG.search's ``timings``; thread-safe)."""
        for stage, seconds in timings.items():
            self.stage_seconds.labels(stage).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
