"""LlamaIndex retriever (llama-index-core ``BaseRetriever``) over a LinearRAG index or server.

    from linearrag_torch.integrations.llamaindex import LinearRAGRetriever
    retriever = LinearRAGRetriever(rag=rag, top_k=5)                          # in process
    retriever = LinearRAGRetriever(url="http://127.0.0.1:8000", api_key=KEY)  # over HTTP
    nodes = retriever.retrieve("Who directed X?")            # list[NodeWithScore]
    per_question = retriever.retrieve_batch(["q1", "q2"])    # one engine call / request

Nodes: ``TextNode(id_=str(corpus id), text=passage text, metadata={"id", "score", "title"[, "row"]})``
with the LinearRAG score. Usable wherever LlamaIndex takes a retriever (e.g.
``RetrieverQueryEngine.from_args(retriever, llm=...)``).
"""
from __future__ import annotations

from .. import extras

extras.require("llamaindex", "llama_index.core", what="the LlamaIndex retriever")  # one line naming the extra, not a ModuleNotFoundError

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from . import HitSource, hit_metadata


class LinearRAGRetriever(BaseRetriever):
    """Top-k LinearRAG passages as LlamaIndex NodeWithScore (a llama-index-core ``BaseRetriever``).

    Give exactly one of ``rag``, ``index_dir`` or ``url``. A node is ``TextNode(id_=str(corpus id),
    text=passage text, metadata={"id", "score", "title"[, "row"]})`` with the LinearRAG score.

    Parameters
    ----------
    rag, index_dir, url, api_key, timeout, device
        Where the nodes come from (``HitSource``): exactly one of ``rag`` (a loaded LinearRAG, searched in
        this process), ``index_dir`` (an index folder, loaded on first use on ``device``) or ``url`` (a
        `linearrag serve` server, with ``api_key`` if it has one and ``timeout`` seconds per request).
    top_k : int, default 5
        Nodes per query.
    search_settings : dict, optional
        Retrieval settings for every call (e.g. ``{"mode": "paper"}``).
    callback_manager : CallbackManager, optional
        LlamaIndex's callback manager.
    verbose : bool, default False
        LlamaIndex's verbose flag.

    Examples
    --------
    >>> from linearrag_torch.integrations.llamaindex import LinearRAGRetriever
    >>> retriever = LinearRAGRetriever(rag=rag, top_k=2)
    >>> [node.node.id_ for node in retriever.retrieve("Who directed Blue River?")]
    ['p1', 'p2']
    """

    def __init__(self, rag=None, *, index_dir=None, url: str | None = None, api_key: str | None = None,
                 top_k: int = 5, timeout: float = 30.0, device: str = "auto", search_settings: dict | None = None,
                 callback_manager=None, verbose: bool = False):
        self.top_k = top_k
        self._source = HitSource(rag, index_dir=index_dir, url=url, api_key=api_key, timeout=timeout, device=device,
                                 settings=search_settings)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @staticmethod
    def _nodes(hits) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_=str(h.id), text=h.text, metadata=hit_metadata(h)), score=float(h.score))
                for h in hits]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes(self._source.search([query_bundle.query_str], self.top_k)[0])

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes((await self._source.asearch([query_bundle.query_str], self.top_k))[0])

    def retrieve_batch(self, queries) -> list[list[NodeWithScore]]:
        """Nodes for every query from one engine call or HTTP request.

        Parameters
        ----------
        queries : list of str or QueryBundle
            The queries.

        Returns
        -------
        list of list of NodeWithScore
            One list per query, best first.

        Examples
        --------
        >>> per_query = retriever.retrieve_batch(["Who directed Blue River?", "Where was Karl Berg born?"])
        >>> [nodes[0].node.metadata["title"] for nodes in per_query]
        ['Blue River', 'Karl Berg']
        """
        texts = [q.query_str if isinstance(q, QueryBundle) else q for q in queries]
        return [self._nodes(h) for h in self._source.search(texts, self.top_k)]

    async def aretrieve_batch(self, queries) -> list[list[NodeWithScore]]:
        """``retrieve_batch`` for asyncio: the same queries and nodes (one engine call in a worker thread, or one
        async HTTP request).

        Parameters
        ----------
        queries : list of str or QueryBundle
            As for ``retrieve_batch``.

        Returns
        -------
        list of list of NodeWithScore
            As for ``retrieve_batch``.
        """
        texts = [q.query_str if isinstance(q, QueryBundle) else q for q in queries]
        return [self._nodes(h) for h in await self._source.asearch(texts, self.top_k)]
