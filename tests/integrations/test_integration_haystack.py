"""The Haystack 2.x component in process, in a Pipeline, serialised, and over HTTP."""
import asyncio
import os

import pytest

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # haystack would post anonymous usage data (posthog) from a thread

pytest.importorskip("haystack")
pytest.importorskip("httpx")

from haystack import Document, Pipeline  # noqa: E402
from haystack.utils import Secret  # noqa: E402

from linearrag_torch.integrations.haystack import LinearRAGRetriever  # noqa: E402

from scripted_servers import FakeSearchServer, running  # noqa: E402

QS = ["Which country the composer of film Thunder On The Hill is from?", "Where did Sylvia Burka's husband die?"]


def check(docs, hits, in_process=True):
    assert all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == [str(h.id) for h in hits]
    assert [d.content for d in docs] == [h.text for h in hits]
    assert [d.score for d in docs] == pytest.approx([h.score for h in hits], rel=1e-4)  # batch noise
    assert [d.meta["title"] for d in docs] == [h.title for h in hits]
    assert all(("row" in d.meta) == in_process for d in docs)


def test_in_process_and_in_a_pipeline(small_rag):
    comp = LinearRAGRetriever(rag=small_rag, top_k=3)
    check(comp.run(query=QS[0])["documents"], small_rag.search(QS[0], top_k=3))
    check(comp.run(query=QS[0], top_k=2)["documents"], small_rag.search(QS[0], top_k=2))
    check(asyncio.run(comp.run_async(query=QS[1]))["documents"], small_rag.search(QS[1], top_k=3))
    pipe = Pipeline()
    pipe.add_component("retriever", comp)
    out = pipe.run({"retriever": {"query": QS[1], "top_k": 4}})
    check(out["retriever"]["documents"], small_rag.search(QS[1], top_k=4))
    with pytest.raises(TypeError, match="cannot be serialised"):
        comp.to_dict()


def test_over_http_and_serialisation(small_rag, monkeypatch):
    monkeypatch.setenv("LINEARRAG_API_KEY", "hk")
    with running(FakeSearchServer(small_rag.search, api_key="hk")) as server:
        comp = LinearRAGRetriever(url=server.url, top_k=2)
        check(comp.run(query=QS[0])["documents"], small_rag.search(QS[0], top_k=2), in_process=False)
        assert server.requests[-1]["headers"]["authorization"] == "Bearer hk"
        data = comp.to_dict()
        assert data["init_parameters"]["url"] == server.url
        assert data["init_parameters"]["api_key"] == {"type": "env_var", "env_vars": ["LINEARRAG_API_KEY"], "strict": False}
        assert "hk" not in str(data)
        again = LinearRAGRetriever.from_dict(data)
        check(asyncio.run(again.run_async(query=QS[1]))["documents"], small_rag.search(QS[1], top_k=2),
              in_process=False)
        pipe = Pipeline()
        pipe.add_component("retriever", LinearRAGRetriever(url=server.url, api_key=Secret.from_token("hk")))
        out = pipe.run({"retriever": {"query": QS[0]}})
        check(out["retriever"]["documents"], small_rag.search(QS[0], top_k=5), in_process=False)
