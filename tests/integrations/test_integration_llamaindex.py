"""The LlamaIndex retriever (llama-index-core BaseRetriever) in process and over HTTP."""
import asyncio

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("httpx")

from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402

from linearrag_torch.integrations.llamaindex import LinearRAGRetriever  # noqa: E402

from scripted_servers import FakeSearchServer, counting_search, running  # noqa: E402

QS = ["Which country the composer of film Thunder On The Hill is from?", "Where did Sylvia Burka's husband die?"]


def check(nodes, hits, in_process=True):
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    assert [n.node.id_ for n in nodes] == [str(h.id) for h in hits]
    assert [n.node.get_content() for n in nodes] == [h.text for h in hits]
    assert [n.score for n in nodes] == pytest.approx([h.score for h in hits], rel=1e-4)  # batch noise
    assert [n.node.metadata["title"] for n in nodes] == [h.title for h in hits]
    assert all(("row" in n.node.metadata) == in_process for n in nodes)


def test_in_process(small_rag, monkeypatch):
    r = LinearRAGRetriever(small_rag, top_k=3)
    assert isinstance(r, BaseRetriever)
    hits = small_rag.search(QS, top_k=3)
    check(r.retrieve(QS[0]), hits[0])
    check(r.retrieve(QueryBundle(QS[1])), hits[1])
    check(asyncio.run(r.aretrieve(QS[0])), hits[0])
    calls = []
    monkeypatch.setattr(small_rag, "search", counting_search(small_rag, calls))
    batch = r.retrieve_batch(QS)
    assert calls == [QS]
    for nodes, hs in zip(batch, hits):
        check(nodes, hs)


def test_over_http(small_rag):
    with running(FakeSearchServer(small_rag.search)) as server:
        r = LinearRAGRetriever(url=server.url, top_k=2, search_settings={"mode": "paper"})
        hits = small_rag.search(QS, top_k=2, mode="paper")
        check(r.retrieve(QS[0]), hits[0], in_process=False)
        check(asyncio.run(r.aretrieve(QS[1])), hits[1], in_process=False)
        batch = asyncio.run(r.aretrieve_batch(QS))
        assert server.requests[-1]["body"]["questions"] == QS and server.requests[-1]["body"]["mode"] == "paper"
        for nodes, hs in zip(batch, hits):
            check(nodes, hs, in_process=False)
