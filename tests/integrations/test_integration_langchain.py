"""The LangChain retriever (langchain-core BaseRetriever) in process and over HTTP."""
import asyncio

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("httpx")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402

from linearrag_torch.client import SearchError  # noqa: E402
from linearrag_torch.integrations.langchain import LinearRAGRetriever  # noqa: E402

from scripted_servers import FakeSearchServer, counting_search, running  # noqa: E402

QS = ["Which country the composer of film Thunder On The Hill is from?", "Where did Sylvia Burka's husband die?",
      "Who was born first, Hywel Teifi Edwards or Felix Schuster?"]


@pytest.fixture(scope="module")
def server(small_rag):
    with running(FakeSearchServer(small_rag.search, api_key="secret")) as s:
        yield s


class Recorder(BaseCallbackHandler):
    def __init__(self):
        self.events = []

    def on_retriever_start(self, serialized, query, **kw):
        self.events.append(("start", query))

    def on_retriever_end(self, documents, **kw):
        self.events.append(("end", len(documents)))


def test_invoke_in_process(small_rag):
    r = LinearRAGRetriever(rag=small_rag, top_k=3)
    assert isinstance(r, BaseRetriever)
    docs = r.invoke(QS[0])
    hits = small_rag.search(QS[0], top_k=3)
    assert all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == [str(h.id) for h in hits]
    assert [d.page_content for d in docs] == [h.text for h in hits]
    assert [d.metadata for d in docs] == [{"id": h.id, "score": h.score, "title": h.title, "row": h.row} for h in hits]


def test_batch_is_one_engine_call_with_callbacks_per_query(small_rag, monkeypatch):
    calls = []
    monkeypatch.setattr(small_rag, "search", counting_search(small_rag, calls))
    r = LinearRAGRetriever(rag=small_rag, top_k=2, search_kwargs={"mode": "paper"})
    rec = Recorder()
    out = r.batch(QS, config={"callbacks": [rec]})
    assert calls == [QS]
    assert [[d.id for d in docs] for docs in out] == [[str(h.id) for h in hs]
                                                      for hs in small_rag.search(QS, top_k=2, mode="paper")]
    assert sorted(e for e in rec.events if e[0] == "start") == sorted(("start", q) for q in QS)
    assert [e for e in rec.events if e[0] == "end"] == [("end", 2)] * 3
    calls.clear()
    out2 = asyncio.run(r.abatch(QS))
    assert calls == [QS] and out2 == out
    assert [d.id for d in asyncio.run(r.ainvoke(QS[1]))] == [d.id for d in out[1]]  # scores: batch noise
    assert r.batch([]) == []


def test_over_http(server, small_rag):
    r = LinearRAGRetriever(url=server.url, api_key="secret", top_k=3)
    n0 = len(server.requests)
    out = r.batch(QS)
    assert len(server.requests) == n0 + 1 and server.requests[-1]["body"]["questions"] == QS
    local = small_rag.search(QS, top_k=3)
    for docs, hits in zip(out, local):
        assert [d.id for d in docs] == [str(h.id) for h in hits]
        assert [d.page_content for d in docs] == [h.text for h in hits]
        assert [d.metadata["score"] for d in docs] == pytest.approx([h.score for h in hits], rel=1e-4)
        assert all("row" not in d.metadata for d in docs)
    assert asyncio.run(r.abatch(QS)) == out and len(server.requests) == n0 + 2
    assert [d.id for d in r.invoke(QS[0])] == [d.id for d in out[0]]
    assert "secret" not in repr(r)


def test_errors_over_http(server):
    r = LinearRAGRetriever(url=server.url, api_key="wrong")
    with pytest.raises(SearchError, match="HTTP 401"):
        r.invoke(QS[0])
    out = r.batch(QS, return_exceptions=True)
    assert len(out) == 3 and all(isinstance(e, SearchError) for e in out)


def test_needs_exactly_one_source(small_rag):
    with pytest.raises(ValueError, match="exactly one"):
        LinearRAGRetriever()
    with pytest.raises(ValueError, match="exactly one"):
        LinearRAGRetriever(rag=small_rag, url="http://x")


def test_index_dir_source(small_index_dir, small_rag, nlp, encoder, monkeypatch):
    from linearrag_torch import models

    monkeypatch.setattr(models, "load_nlp", lambda cfg, *a, **k: nlp)
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, *a, **k: encoder)
    r = LinearRAGRetriever(index_dir=str(small_index_dir), device="cpu", top_k=2)
    assert [d.id for d in r.invoke(QS[2])] == [str(h.id) for h in small_rag.search(QS[2], top_k=2)]
