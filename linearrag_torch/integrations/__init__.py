"""Retrievers for LangChain, LlamaIndex and Haystack over a LinearRAG index.

Each adapter takes its hits from one of three sources (``HitSource``): a loaded ``LinearRAG`` (``rag=``),
an index folder loaded on first use (``index_dir=``), or a `linearrag serve` server (``url=``, optional
``api_key=``) through ``linearrag_torch.client.SearchClient``. Import the adapter module you need:

    from linearrag_torch.integrations.langchain import LinearRAGRetriever     # langchain-core
    from linearrag_torch.integrations.llamaindex import LinearRAGRetriever    # llama-index-core
    from linearrag_torch.integrations.haystack import LinearRAGRetriever      # haystack-ai 2.x
"""
from __future__ import annotations

import asyncio
import threading


class HitSource:
    """Hits from a loaded LinearRAG, an index folder, or a server. ``settings``: retrieval settings for
    every call (mode="paper", delta=0.3, ...). Exactly one of rag, index_dir, url."""

    def __init__(self, rag=None, *, index_dir=None, url: str | None = None, api_key: str | None = None,
                 timeout: float = 30.0, device: str = "auto", settings: dict | None = None):
        if sum(x is not None for x in (rag, index_dir, url)) != 1:
            raise ValueError("give exactly one of rag= (a LinearRAG), index_dir= (an index folder) or url= (a server)")
        self._rag, self.index_dir, self.url, self.device = rag, index_dir, url, device
        self.settings = dict(settings or {})
        self._lock = threading.Lock()
        self.client = None
        if url is not None:
            from ..client import SearchClient

            self.client = SearchClient(url, api_key=api_key, timeout=timeout)

    @property
    def rag(self):
        with self._lock:
            if self._rag is None and self.index_dir is not None:
                from ..api import LinearRAG

                self._rag = LinearRAG.load(self.index_dir, device=self.device)
            return self._rag

    def search(self, questions: list[str], top_k: int) -> list[list]:
        """One engine call (or one HTTP request) for the whole list; one list of Hit per question."""
        if not questions:
            return []
        if self.client is not None:
            return self.client.search(list(questions), top_k=top_k, include_text=True, **self.settings)
        return self.rag.search(list(questions), top_k=top_k, **self.settings)

    async def asearch(self, questions: list[str], top_k: int) -> list[list]:
        if not questions:
            return []
        if self.client is not None:
            return await self.client.asearch(list(questions), top_k=top_k, include_text=True, **self.settings)
        return await asyncio.to_thread(self.search, list(questions), top_k)


def hit_metadata(hit) -> dict:
    """The metadata every adapter attaches: corpus id, score, title (and the index row in process)."""
    meta = {"id": hit.id, "score": float(hit.score), "title": hit.title}
    if getattr(hit, "row", -1) is not None and hit.row >= 0:
        meta["row"] = int(hit.row)
    return meta
