"""The result type of a search (LinearRAG.search, the sharded engine, the HTTP client, the adapters), apart from
the engine so that what only reads results does not import it (``linearrag_torch.api`` re-exports it)."""
from __future__ import annotations

from typing import NamedTuple


class Hit(NamedTuple):
    id: object  # the corpus id
    score: float
    title: str
    text: str
    row: int  # position in the index
