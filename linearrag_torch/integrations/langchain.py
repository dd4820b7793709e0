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
    """Top-k LinearRAG passages as LangChain Documents (a langchain-core ``BaseRetriever``).

    Give exactly one of ``rag``, ``index_dir`` or ``url``. ``batch`` and ``abatch`` make ONE engine call (or
    request) for the whole batch. A Document's ``page_content`` is the passage text, its ``id`` str(corpus id),
    its ``metadata`` {"id", "score", "title"} (plus "row", the index position, in process).

    Parameters
    ----------
    rag, index_dir, url, api_key, timeout, device
        Where the hits come from, as for ``HitSource``: exactly one of a loaded LinearRAG (``rag``,
        searched in this process), an index folder loaded on first use on ``device`` (``index_dir``) or a
        `linearrag serve` server (``url``, with ``api_key`` if it has one, ``timeout`` seconds per request).
    top_k : int, default 5
        Passages per query.
    search_kwargs : dict, optional
        Retrieval settings for every call (e.g. ``{"mode": "paper", "delta": 0.3}``).
    **kwargs
        LangChain's own retriever fields (``tags``, ``metadata``).

    Examples
    --------
    >>> from linearrag_torch.integrations.langchain import LinearRAGRetriever
    >>> retriever = LinearRAGRetriever(rag=rag, top_k=2)
    >>> [doc.id for doc in retriever.invoke("Who directed Blue River?")]
    ['p1', 'p2']
    >>> remote = LinearRAGRetriever(url="http://127.0.0.1:8000", api_key="KEY")  # doctest: +SKIP
    """

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

    def __init__(self, rag: Any = None, *, index_dir: Optional[str] = None, url: Optional[str] = None,
                 api_key: Optional[str] = None, top_k: int = 5, timeout: float = 30.0, device: str = "auto",
                 search_kwargs: Optional[dict] = None, **kwargs: Any) -> None:
        # the fields spelled out (pydantic's own signature is ``**data``), so that the reference shows them
        super().__init__(rag=rag, index_dir=index_dir, url=url, api_key=api_key, top_k=top_k, timeout=timeout,
                         device=device, search_kwargs=dict(search_kwargs or {}), **kwargs)

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
        """Documents for every query, from ONE engine call (or one HTTP request) for the whole batch.

        Callbacks see one retriever run per query, as with ``invoke``.

        Parameters
        ----------
        inputs : list of str
            The queries.
        config : RunnableConfig or list of RunnableConfig, optional
            LangChain's run configuration (callbacks, tags, metadata, run names), one or one per query.
        return_exceptions : bool, default False
            On a failure, return the exception for every query instead of raising it.
        **kwargs
            Passed to the callbacks' configuration (``verbose``, ...).

        Returns
        -------
        list of list of Document
            One list per query, best first (or the exceptions, with ``return_exceptions``).

        Examples
        --------
        >>> batch = retriever.batch(["Who directed Blue River?", "Where was Karl Berg born?"])
        >>> [docs[0].metadata["title"] for docs in batch]
        ['Blue River', 'Karl Berg']
        """
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
        """``batch`` for asyncio: one engine call (in a worker thread) or one async HTTP request.

        Parameters
        ----------
        inputs, config, return_exceptions
            As for ``batch``.
        **kwargs
            As for ``batch``.

        Returns
        -------
        list of list of Document
            As for ``batch``.

        Examples
        --------
        >>> batch = await retriever.abatch(["Who directed Blue River?"])  # doctest: +SKIP
        """
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
