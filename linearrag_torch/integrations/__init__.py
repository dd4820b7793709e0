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

from ..client import SearchClient


class HitSource:
    """Hits from a loaded LinearRAG, an index folder, or a server: what every adapter searches through.

    Parameters
    ----------
    rag : LinearRAG, optional
        A loaded index, searched in this process.
    index_dir : str or os.PathLike, optional
        An index folder, loaded on first use (thread-safe).
    url : str, optional
        A `linearrag serve` server, searched through ``SearchClient``.
    api_key : str, optional
        The server's key (with ``url``).
    timeout : float, default 30.0
        Seconds per request (with ``url``).
    device : str, default "auto"
        Where an ``index_dir`` index is loaded.
    settings : dict, optional
        Retrieval settings for every call (``{"mode": "paper", "delta": 0.3}``, ...).

    Raises
    ------
    ValueError
        Not exactly one of ``rag``, ``index_dir`` and ``url``.

    Examples
    --------
    >>> from linearrag_torch.integrations import HitSource
    >>> source = HitSource(rag, settings={"mode": "paper"})
    >>> [[hit.id for hit in hits] for hits in source.search(["Who directed Blue River?"], top_k=1)]
    [['p1']]
    """

    def __init__(self, rag=None, *, index_dir=None, url: str | None = None, api_key: str | None = None,
                 timeout: float = 30.0, device: str = "auto", settings: dict | None = None):
        if sum(x is not None for x in (rag, index_dir, url)) != 1:
            raise ValueError("give exactly one of rag= (a LinearRAG), index_dir= (an index folder) or url= (a server)")
        self._rag, self.index_dir, self.url, self.device = rag, index_dir, url, device
        self.settings = dict(settings or {})
        self._lock = threading.Lock()
        self.client = None
        if url is not None:
            self.client = SearchClient(url, api_key=api_key, timeout=timeout)

    @property
    def rag(self):
        """The LinearRAG searched in process (an ``index_dir`` one is loaded here, once), or None with ``url``."""
        with self._lock:
            if self._rag is None and self.index_dir is not None:
                from ..api import LinearRAG  # deferred: imports torch; the adapters over url= stay torch-free

                self._rag = LinearRAG.load(self.index_dir, device=self.device)
            return self._rag

    def search(self, questions: list[str], top_k: int) -> list[list]:
        """Hits for a list of questions: one engine call (or one HTTP request) for the whole list.

        Parameters
        ----------
        questions : list of str
            The questions.
        top_k : int
            Passages per question.

        Returns
        -------
        list of list of Hit
            One list per question, best first (with their text, also from a server).
        """
        if not questions:
            return []
        if self.client is not None:
            return self.client.search(list(questions), top_k=top_k, include_text=True, **self.settings)
        return self.rag.search(list(questions), top_k=top_k, **self.settings)

    async def asearch(self, questions: list[str], top_k: int) -> list[list]:
        """``search`` for asyncio: the engine call in a worker thread, or one async HTTP request.

        Parameters
        ----------
        questions, top_k
            As for ``search``.

        Returns
        -------
        list of list of Hit
            As for ``search``.
        """
        if not questions:
            return []
        if self.client is not None:
            return await self.client.asearch(list(questions), top_k=top_k, include_text=True, **self.settings)
        return await asyncio.to_thread(self.search, list(questions), top_k)


def hit_metadata(hit) -> dict:
    """The metadata every adapter attaches: corpus id, score, title (and the index row in process).

    Parameters
    ----------
    hit : Hit
        A hit.

    Returns
    -------
    dict
        {"id", "score", "title"} and, for a hit found in process, "row".
    """
    meta = {"id": hit.id, "score": float(hit.score), "title": hit.title}
    if getattr(hit, "row", -1) is not None and hit.row >= 0:
        meta["row"] = int(hit.row)
    return meta
