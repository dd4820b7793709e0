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
    """Top-k LinearRAG passages as NodeWithScore. Give exactly one of ``rag``, ``index_dir`` or ``url``
    (with ``api_key`` if the server has one); ``search_settings``: retrieval settings for every call."""

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
        """Nodes for every query (strings or QueryBundles) from one engine call or HTTP request."""
        texts = [q.query_str if isinstance(q, QueryBundle) else q for q in queries]
        return [self._nodes(h) for h in self._source.search(texts, self.top_k)]

    async def aretrieve_batch(self, queries) -> list[list[NodeWithScore]]:
        texts = [q.query_str if isinstance(q, QueryBundle) else q for q in queries]
        return [self._nodes(h) for h in await self._source.asearch(texts, self.top_k)]
