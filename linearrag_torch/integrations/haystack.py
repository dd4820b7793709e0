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
    """Give exactly one of ``url`` (a `linearrag serve` server), ``index_dir`` or ``rag``."""

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
        """{"documents": the top_k (default: the component's) passages for ``query``, best first}."""
        return {"documents": self._documents(self._source.search([query], top_k or self.top_k)[0])}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, top_k: Optional[int] = None):
        return {"documents": self._documents((await self._source.asearch([query], top_k or self.top_k))[0])}

    def to_dict(self) -> dict:
        if self._in_process:
            raise TypeError("a LinearRAGRetriever made with rag= cannot be serialised; make it with index_dir= or url=")
        return default_to_dict(self, url=self.url, api_key=self.api_key.to_dict() if self.api_key else None,
                               index_dir=None if self.index_dir is None else str(self.index_dir), top_k=self.top_k,
                               timeout=self.timeout, device=self.device, search_settings=self.search_settings)

    @classmethod
    def from_dict(cls, data: dict) -> "LinearRAGRetriever":
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)
