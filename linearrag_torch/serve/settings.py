"""The server's settings: one dataclass, the help text beside each field (cli/serve.py makes the flags from it)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import env
from ..config import ENCODER_BACKENDS, _f
from .admission import HEAVY_SHARE

API_KEY_ENV = env.API_KEY.name


@dataclass
class ServeSettings:
    """How `linearrag serve` (or a LinearRAGService mounted in another app) batches, limits and reloads."""

    host: str = _f("127.0.0.1", "address to bind (0.0.0.0 exposes the server to the network)")
    port: int = _f(8000, "TCP port (0: any free port)")
    device: str = _f("auto", "auto (CUDA when present), cpu, cuda or cuda:N")
    max_batch_size: int = _f(64, "most questions in one engine call (1 turns dynamic batching off)")
    max_wait_ms: float = _f(0.0, "longest a question waits for others to join its batch, in ms; with 0 a batch is "
                                 "what queued while the engine was busy (on CPU that measured best, see "
                                 "benchmarks/README.md); a fast GPU engine may gain from 1-5")
    gather_ms: float = _f(50.0, "after an engine call, wait up to this many ms (and at most a quarter of that "
                                "call's time) for the clients it answered to send their next questions, while "
                                "fewer are queued than were in the server at once over the last second (0: off)")
    max_concurrent: int = _f(256, "requests answered at once; one more gets 429 with Retry-After")
    max_work: int | None = _f(None, "work budget of the requests in flight, in units (a unit is a question of up to "
                                     "150 characters at top_k <= 50 without rerank; a longer question, a larger top_k "
                                     "and rerank count more: serve/admission.py); past it 429 (default: 4x "
                                     "--max-concurrent)", type=int)
    heavy_share: float = _f(HEAVY_SHARE, "share of --max-work, and of the engine's work while light requests wait, "
                                  "guaranteed to heavy requests (over 8 units), the rest to the light ones; light "
                                  "requests borrow the heavy share while no heavy one is refused, heavy ones the "
                                  "light share while no light one comes")
    timeout: float = _f(30.0, "seconds a request may take before it gets 504")
    refusal_delay: float = _f(1.0, "seconds a 429 is held before it is sent (a timer: no CPU, no engine place), so "
                                    "that clients retrying at once after a refusal cannot make refusals the server's "
                                    "main work; well-behaved clients wait Retry-After (>= 1 s) anyway (0: at once)")
    body_timeout: float = _f(10.0, "seconds a client may take to send its request body after its head; a slower one "
                                   "gets 408 and its connection is closed")
    header_timeout: float = _f(10.0, "seconds a client may take to send a request's head (request line and headers), "
                                     "from its first byte (from the connection's opening for a new connection); a "
                                     "slower one gets 408 and its connection is closed")
    keep_alive_timeout: float = _f(5.0, "seconds an idle keep-alive connection stays open")
    send_timeout: float = _f(30.0, "seconds a client may leave its responses unread (the server's write buffer "
                                   "full) before its connection is dropped")
    max_header_bytes: int = _f(16384, "largest request head (request line and headers); a larger one gets 431 and "
                                      "its connection is closed")
    max_connections: int | None = _f(None, "open connections at most; past it a new connection takes the place of "
                                           "the newest slow one (head or body pending 1 s or more: 503), else of the "
                                           "newest one idle 1 s or more, else gets 503 itself (default: the "
                                           "process's open-file limit less an eighth of it, at least 64 kept for "
                                           "files)",
                                     type=int)
    max_body_bytes: int = _f(1 << 20, "largest request body; a larger one gets 413")
    max_questions: int = _f(256, "most questions in one request")
    max_question_chars: int = _f(2000, "longest question, in characters")
    max_top_k: int = _f(100, "largest top_k a request may ask for")
    api_key: str | None = _f(None, f"require 'Authorization: Bearer KEY' on every route but /health "
                                   f"(default: ${API_KEY_ENV} if set)", type=str)
    watch: float = _f(0.0, "check INDEX_DIR/index.json every this many seconds and reload when it changes "
                           "(0: only POST /admin/reload)")
    memory_budget: str | None = _f(None, "working memory of one engine call, e.g. 2G (default: "
                                         "$LINEARRAG_MEMORY_BUDGET, else half the free GPU memory / a quarter of RAM "
                                         "up to 4G); set it when another process shares the GPU", type=str)
    threads: int | None = _f(None, "torch threads of the process (default: $LINEARRAG_THREADS, else one per core); "
                                   "1 holds up best when other busy processes share the cores", type=int)
    quantize: str | None = _f(None, "the question encoder: bfloat16 (bf16 autocast where native: faster, but a "
                                    "question's scores then depend on its batch by ~1e-4) or int8 / int8-all "
                                    "(dynamically quantised, CPU only; recall in benchmarks/README.md) (default: "
                                    "none, the exact float32 encoder: answers independent of the batch)",
                              type=str, choices=("bfloat16", "int8", "int8-all"))
    encoder_backend: str = _f("torch", "where the question encoder runs: torch, or onnx (float32 on ONNX Runtime, "
                                       "CPU only, extra [onnx]: the same vectors to float noise, its encoder stage "
                                       "faster: docs/tuning.md)", choices=ENCODER_BACKENDS)
    ner_processes: int = _f(0, "run the questions' spaCy NER in this many worker processes (a batch of 16 or more "
                               "questions is split over them; ~340 MB each): for cores that idle while NER runs, "
                               "as on a GPU server (0: NER on the engine thread)")
    rerank: bool = _f(False, "answer with the learned reranker unless a request sets rerank false (default: the "
                             "index's setting, off unless it was built with --rerank)")
    reranker: str | None = _f(None, "reranker folder from `linearrag train-reranker` (default: the model shipped with "
                                    "the package); requests cannot choose a folder", type=str)
    store: bool = _f(False, "serve the index folders as a store even when one is given: each under its folder's name "
                            "at /v1/indexes/NAME/..., passages added and deleted over HTTP, the admin routes (implied "
                            "by several folders, a folder of index folders, or --keys-file; docs/serving.md)")
    keys_file: str | None = _f(None, "a JSON file of hashed API keys, each scoped to indexes with a role (read, write, "
                                     "admin): serve/keys.py, docs/serving.md; --api-key stays an admin key over every "
                                     "index", type=str)
    max_write_passages: int = _f(64, "store: most passages (or ids) in one write request")
    max_passage_chars: int = _f(20000, "store: longest passage text (and title) a write may send, in characters")
    max_indexes: int = _f(32, "store: most indexes served at once (loaded or created)")
    mcp: bool = _f(True, "store: the MCP endpoint (streamable HTTP) at /mcp/ when the mcp package is installed "
                         "(extra [mcp])")
    graceful_timeout: float = _f(30.0, "on SIGTERM, seconds to let requests in flight finish")
    log_level: str = _f("info", "uvicorn log level", choices=("critical", "error", "warning", "info", "debug"))

    def __post_init__(self) -> None:
        if self.api_key is None:
            self.api_key = env.API_KEY.get()
        for name in ("max_batch_size", "max_concurrent", "max_body_bytes", "max_questions", "max_question_chars",
                     "max_top_k", "max_header_bytes", "max_write_passages", "max_passage_chars", "max_indexes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_wait_ms", "gather_ms", "watch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.ner_processes < 0:
            raise ValueError(f"ner_processes must be >= 0, got {self.ner_processes}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        for name in ("timeout", "body_timeout", "header_timeout", "keep_alive_timeout", "send_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.graceful_timeout < 0:
            raise ValueError(f"graceful_timeout must be >= 0, got {self.graceful_timeout}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.max_work is not None and self.max_work < 1:
            raise ValueError(f"max_work must be >= 1, got {self.max_work}")
        if not 0 < self.heavy_share < 1:
            raise ValueError(f"heavy_share must be in (0, 1), got {self.heavy_share}")
        if not 0 <= self.refusal_delay <= 10:
            raise ValueError(f"refusal_delay must be in [0, 10] seconds, got {self.refusal_delay}")

    def public(self) -> dict:
        """The settings without secrets (for /info and logs)."""
        d = dataclasses.asdict(self)
        d["api_key"] = "set" if self.api_key else None
        d["keys_file"] = "set" if self.keys_file else None
        return d

