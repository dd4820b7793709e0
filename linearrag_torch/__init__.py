"""linearrag_torch: LinearRAG graph retrieval (arXiv 2510.10114) as a batched torch engine.

    from linearrag_torch import LinearRAG
    rag = LinearRAG.build("corpus.jsonl")
    hits = rag.search(["Who is the father of the director of film X?"], top_k=5)

The names below load their modules (and torch) on first use, so that `linearrag --help` and the torch-free
parts (the HTTP client, the adapters' imports, ``linearrag_torch.data``) start without importing torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Hit": ".corpus", "LinearRAG": ".api", "resolve_device": ".env",
    "IndexConfig": ".config", "RetrievalConfig": ".config",
    "InputError": ".corpus", "Passage": ".corpus", "read_corpus": ".corpus",
    "IndexFormatError": ".index", "IndexLockedError": ".index", "TriGraphIndex": ".index",
    "EncodedQueries": ".queries", "Retrieved": ".queries",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and the API reference (griffe) see
    from .api import LinearRAG
    from .config import IndexConfig, RetrievalConfig
    from .corpus import Hit, InputError, Passage, read_corpus
    from .env import resolve_device
    from .index import IndexFormatError, IndexLockedError, TriGraphIndex
    from .queries import EncodedQueries, Retrieved


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next access is a plain global
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
