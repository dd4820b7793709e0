"""Haystack 2.x component over a LinearRAG index or server.

    from haystack import Pipeline
    from linearrag_torch.integrations.haystack import LinearRAGRetriever
    retriever = LinearRAGRetriever(url="http://127.0.0.1:8000")     # or index_dir="my_index", or rag=rag
    retriever.run(query="Who directed X?", top_k=5)["documents"]    # list[haystack.Document]
    pipe = Pipeline(); pipe.add_component("retriever", retriever)   # then a PromptBuilder, a generator, ...

Documents: ``id`` = str(corpus id), ``content`` = passage text, ``score`` = the LinearRAG score,
``meta`` = {"id", "score", "title"[, "row"]}. A component made with ``url=`` or ``index_dir=``
serialises with the pipeline (to_dict / from_dict; the API key as a haystack Secret, by default the
environment variable LINEARRAG_API_KEY); one made with ``rag=`` (a loaded object) does not.
"""
from __future__ import annotations

from typing import Any, Optional

from .. import extras

extras.require("haystack", "haystack", what="the Haystack retriever")  # one line naming the extra, not a ModuleNotFoundError

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace

from . import HitSource, hit_metadata


@component
class LinearRAGRetriever:
    """Top-k LinearRAG passages as Haystack Documents (a Haystack 2.x component).

    Give exactly one of ``url``, ``index_dir`` or ``rag``. A Document's ``id`` is str(corpus id), ``content``
    the passage text, ``score`` the LinearRAG score, ``meta`` {"id", "score", "title"[, "row"]}. A component
    made with ``url`` or ``index_dir`` serialises with its pipeline (``to_dict`` / ``from_dict``); one made
    with ``rag`` does not.

    Parameters
    ----------
    url, index_dir, rag, timeout, device
        Where the hits come from (``HitSource``): exactly one of ``url`` (a `linearrag serve` server, ``timeout``
        seconds per request), ``index_dir`` (an index folder, loaded on first use on ``device``) or ``rag`` (a
        loaded LinearRAG, searched in this process; such a component does not serialise).
    api_key : haystack.utils.Secret, optional
        The server's key (default: the environment variable LINEARRAG_API_KEY, if set).
    top_k : int, default 5
        Passages per query, unless ``run`` says otherwise.
    search_settings : dict, optional
        Retrieval settings for every call (e.g. ``{"mode": "paper"}``).

    Examples
    --------
    >>> from linearrag_torch.integrations.haystack import LinearRAGRetriever
    >>> retriever = LinearRAGRetriever(rag=rag, top_k=2)
    >>> [doc.id for doc in retriever.run(query="Who directed Blue River?")["documents"]]
    ['p1', 'p2']
    >>> from haystack import Pipeline
    >>> pipe = Pipeline()
    >>> _ = pipe.add_component("retriever", LinearRAGRetriever(url="http://127.0.0.1:8000"))
    >>> list(pipe.to_dict()["components"])  # it serialises with the pipeline
    ['retriever']
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[Secret] = Secret.from_env_var("LINEARRAG_API_KEY", strict=False),
                 index_dir: Optional[str] = None, top_k: int = 5, timeout: float = 30.0, device: str = "auto",
                 search_settings: Optional[dict] = None, rag: Any = None):
        self.url, self.api_key, self.index_dir = url, api_key, index_dir
        self.top_k, self.timeout, self.device = top_k, timeout, device
        self.search_settings = dict(search_settings or {})
        self._in_process = rag is not None
        key = api_key.resolve_value() if isinstance(api_key, Secret) and url is not None else None
        self._source = HitSource(rag, index_dir=index_dir, url=url, api_key=key, timeout=timeout, device=device,
                                 settings=self.search_settings)

    @staticmethod
    def _documents(hits) -> list[Document]:
        return [Document(id=str(h.id), content=h.text, meta=hit_metadata(h), score=float(h.score)) for h in hits]

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: Optional[int] = None):
        """The top passages for a query.

        Parameters
        ----------
        query : str
            The question.
        top_k : int, optional
            Passages (default: the component's ``top_k``).

        Returns
        -------
        dict
            {"documents": list of Document, best first}.

        Examples
        --------
        >>> retriever.run(query="Where was Karl Berg born?", top_k=1)["documents"][0].meta["title"]
        'Karl Berg'
        """
        return {"documents": self._documents(self._source.search([query], top_k or self.top_k)[0])}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, top_k: Optional[int] = None):
        """``run`` for Haystack's async pipelines: the same arguments and result.

        Parameters
        ----------
        query, top_k
            As for ``run``.

        Returns
        -------
        dict
            As for ``run``.
        """
        return {"documents": self._documents((await self._source.asearch([query], top_k or self.top_k))[0])}

    def to_dict(self) -> dict:
        """The component as Haystack serialises it (the API key as a Secret, never its value).

        Returns
        -------
        dict
            Its type and init parameters. A component made with ``rag`` raises ``TypeError``.

        Examples
        --------
        >>> LinearRAGRetriever(url="http://127.0.0.1:8000").to_dict()["init_parameters"]["url"]
        'http://127.0.0.1:8000'
        """
        if self._in_process:
            raise TypeError("a LinearRAGRetriever made with rag= cannot be serialised; make it with index_dir= or url=")
        return default_to_dict(self, url=self.url, api_key=self.api_key.to_dict() if self.api_key else None,
                               index_dir=None if self.index_dir is None else str(self.index_dir), top_k=self.top_k,
                               timeout=self.timeout, device=self.device, search_settings=self.search_settings)

    @classmethod
    def from_dict(cls, data: dict) -> "LinearRAGRetriever":
        """The component of a ``to_dict`` dict.

        Parameters
        ----------
        data : dict
            What ``to_dict`` wrote.

        Returns
        -------
        LinearRAGRetriever
            The component.

        Examples
        --------
        >>> data = LinearRAGRetriever(url="http://127.0.0.1:8000", top_k=3).to_dict()
        >>> LinearRAGRetriever.from_dict(data).top_k
        3
        """
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)
