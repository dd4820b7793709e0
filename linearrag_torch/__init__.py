"""linearrag_torch: LinearRAG graph retrieval (arXiv 2510.10114) as a batched torch engine.

    from linearrag_torch import LinearRAG
    rag = LinearRAG.build("corpus.jsonl")
    hits = rag.search(["Who is the father of the director of film X?"], top_k=5)
"""
from .api import Hit, LinearRAG, resolve_device
from .config import IndexConfig, RetrievalConfig
from .corpus import InputError, Passage, read_corpus
from .index import IndexFormatError, IndexLockedError, TriGraphIndex
from .queries import EncodedQueries, Retrieved

__all__ = [
    "EncodedQueries", "Hit", "IndexConfig", "IndexFormatError", "IndexLockedError", "InputError", "LinearRAG", "Passage",
    "RetrievalConfig", "Retrieved", "TriGraphIndex", "read_corpus", "resolve_device",
]
__version__ = "0.1.0"
