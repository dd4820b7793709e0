"""`linearrag mcp PATH...`: the indexes' search, explain and answer as MCP tools over stdio (serve/mcp_tools.py)."""
from __future__ import annotations

from ..serve.settings import ServeSettings
from .common import require_encoder_backend
from .flags import add_flags, add_llm_flags

# the server settings that mean something without HTTP
ENGINE_FLAGS = ("device", "max_batch_size", "max_wait_ms", "max_questions", "max_question_chars", "max_top_k",
                "timeout", "memory_budget", "threads", "quantize", "encoder_backend", "ner_processes", "rerank",
                "reranker", "log_level")


def add_parser(sub) -> None:
    m = sub.add_parser("mcp", help="serve indexes as MCP tools over stdio (for an assistant)",
                       description="Serve the indexes in PATH... (index folders, or folders of index folders) as "
                                   "Model Context Protocol tools over stdin/stdout: list_indexes, search, explain, "
                                   "answer (with a chat model), each taking the index's name. For an assistant "
                                   "that starts the server itself; `linearrag serve` offers the same tools over "
                                   "streamable HTTP at /mcp/. Needs pip install 'linearrag_torch[mcp]'.")
    m.add_argument("index_dir", metavar="PATH", nargs="+")
    add_flags(m.add_argument_group("engine settings"), ServeSettings,
              skip=tuple(f for f in ServeSettings.__dataclass_fields__ if f not in ENGINE_FLAGS))
    add_llm_flags(m)


def run(args) -> int:
    from ..extras import require

    require("mcp", "mcp", what="linearrag mcp")
    from ..serve.mcp_tools import run_stdio
    from ..serve.store import discover
    from .serve import _llm

    require_encoder_backend(getattr(args, "encoder_backend", "torch"))
    found, _ = discover(args.index_dir)
    if not found:
        raise ValueError(f"no index folder in {' '.join(args.index_dir)}")
    settings = ServeSettings(**{name: getattr(args, name) for name in ENGINE_FLAGS})
    import logging

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_stdio(args.index_dir, settings, _llm(args))
