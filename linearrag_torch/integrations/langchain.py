"""LangChain retriever (langchain-core ``BaseRetriever``) over a LinearRAG index or server.

    from linearrag_torch.integrations.langchain import LinearRAGRetriever
    retriever = LinearRAGRetriever(rag=rag, top_k=5)                        # in process
    retriever = LinearRAGRetriever(url="http://127.0.0.1:8000", api_key=KEY)  # over HTTP
    docs = retriever.invoke("Who directed X?")
    docs_per_question = retriever.batch(["q1", "q2", "q3"])   # ONE engine call / request for the batch

Documents: ``page_content`` = passage text, ``id`` = str(corpus id), ``metadata`` = {"id", "score",
"title"} (plus "row", the index position, in process).
"""
from __future__ import annotations

from typing import Any, Optional

from .. import extras

extras.require("langchain", "langchain_core", what="the LangChain retriever")  # one line naming the extra, not a ModuleNotFoundError

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import get_config_list
from pydantic import ConfigDict, Field, PrivateAttr

from . import HitSource, hit_metadata


class LinearRAGRetriever(BaseRetriever):
    """Top-k LinearRAG passages as LangChain Documents. Give exactly one of ``rag`` (a loaded
    LinearRAG), ``index_dir`` (loaded on first use) or ``url`` (a `linearrag serve` server, with
    ``api_key`` if it has one). ``search_kwargs``: retrieval settings for every call (e.g. mode, delta)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rag: Any = None
    index_dir: Optional[str] = None
    url: Optional[str] = None
    api_key: Optional[str] = Field(default=None, repr=False)
    top_k: int = 5
    timeout: float = 30.0
    device: str = "auto"
    search_kwargs: dict = Field(default_factory=dict)
    _source: HitSource = PrivateAttr()

    def model_post_init(self, __context: Any) -> None:
        self._source = HitSource(self.rag, index_dir=self.index_dir, url=self.url, api_key=self.api_key,
                                 timeout=self.timeout, device=self.device, settings=self.search_kwargs)

    # ------------------------------------------------------------------ documents
    @staticmethod
    def _documents(hits) -> list[Document]:
        return [Document(page_content=h.text, metadata=hit_metadata(h), id=str(h.id)) for h in hits]

    def _get_relevant_documents(self, query: str, *, run_manager) -> list[Document]:
        return self._documents(self._source.search([query], self.top_k)[0])

    async def _aget_relevant_documents(self, query: str, *, run_manager) -> list[Document]:
        return self._documents((await self._source.asearch([query], self.top_k))[0])

    # ------------------------------------------------------------------ one engine call per batch
    def _start_runs(self, inputs, config, kwargs, manager_cls):
        configs = get_config_list(config, len(inputs))
        starts = []
        for query, cfg in zip(inputs, configs):
            manager = manager_cls.configure(
                cfg.get("callbacks"), None, verbose=kwargs.get("verbose", False),
                inheritable_tags=cfg.get("tags"), local_tags=self.tags,
                inheritable_metadata={**(cfg.get("metadata") or {}), **self._get_ls_params(**kwargs)},
                local_metadata=self.metadata,
            )
            starts.append((manager, query, cfg))
        return starts

    def batch(self, inputs: list[str], config=None, *, return_exceptions: bool = False, **kwargs: Any) -> list:
        """Documents for every query, from ONE engine call (or one HTTP request) for the whole batch;
        callbacks see one retriever run per query, as with invoke."""
        if not inputs:
            return []
        runs = [m.on_retriever_start(None, q, name=cfg.get("run_name") or self.get_name(), run_id=cfg.get("run_id"))
                for m, q, cfg in self._start_runs(inputs, config, kwargs, CallbackManager)]
        try:
            results = [self._documents(h) for h in self._source.search(list(inputs), self.top_k)]
        except Exception as exc:
            for run in runs:
                run.on_retriever_error(exc)
            if return_exceptions:
                return [exc] * len(inputs)
            raise
        for run, docs in zip(runs, results):
            run.on_retriever_end(docs)
        return results

    async def abatch(self, inputs: list[str], config=None, *, return_exceptions: bool = False, **kwargs: Any) -> list:
        """batch() for asyncio: one engine call (in a worker thread) or one async HTTP request."""
        if not inputs:
            return []
        runs = [await m.on_retriever_start(None, q, name=cfg.get("run_name") or self.get_name(), run_id=cfg.get("run_id"))
                for m, q, cfg in self._start_runs(inputs, config, kwargs, AsyncCallbackManager)]
        try:
            results = [self._documents(h) for h in await self._source.asearch(list(inputs), self.top_k)]
        except Exception as exc:
            for run in runs:
                await run.on_retriever_error(exc)
            if return_exceptions:
                return [exc] * len(inputs)
            raise
        for run, docs in zip(runs, results):
            await run.on_retriever_end(docs)
        return results
