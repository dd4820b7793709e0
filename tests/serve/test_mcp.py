"""The MCP tools (issue 51) with the official SDK's client: over streamable HTTP at /mcp/ on a real store server on
127.0.0.1 (scoped by the request's key), and over stdio from `linearrag mcp` (a real process). Results checked
against LinearRAG.search in this process."""
import asyncio
import json
import os
import sys

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from linearrag_torch.serve.keys import Keys, hash_key  # noqa: E402

from test_store import Served, hits_of, make_root  # noqa: E402
from test_serve import TIMEOUT  # noqa: E402


def payload(result) -> dict:
    """A tool's result as JSON (its structured content, else its text)."""
    if getattr(result, "structured_content", None):
        return result.structured_content
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


async def _session(url, key, work):
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return await work(client)


def test_the_tools_over_streamable_http_scoped_by_the_key(small_rag, small_index_dir, small_questions, tmp_path):
    root = tmp_path / "root"
    alpha, beta = make_root(small_rag, small_index_dir, root)
    q = small_questions[0]["question"]
    keys = Keys({hash_key("reader-a"): __import__("linearrag_torch.serve.keys", fromlist=["Principal"]).Principal(
        "reader", "read", frozenset({"alpha"}))}, api_key="admin-key")
    with Served([root], keys=keys, models=small_rag, mcp=True) as srv:
        url = srv.url + "/mcp/"

        async def work(client):
            tools = {t.name for t in (await client.list_tools()).tools}
            listed = payload(await client.call_tool("list_indexes", {}))
            found = payload(await client.call_tool("search", {"index": "alpha", "question": q, "top_k": 3}))
            explained = payload(await client.call_tool("explain", {"index": "alpha", "question": q, "top_k": 2}))
            hidden = await client.call_tool("search", {"index": "beta", "question": q})
            invalid = await client.call_tool("search", {"index": "alpha", "question": " "})
            return tools, listed, found, explained, hidden, invalid

        tools, listed, found, explained, hidden, invalid = asyncio.run(_session(url, "reader-a", work))
        assert tools == {"list_indexes", "search", "explain"}  # no chat model: no answer tool
        assert [x["name"] for x in listed["indexes"]] == ["alpha"]
        assert [h["id"] for h in found["hits"]] == hits_of(alpha, [q], top_k=3)[0]
        assert found["hits"][0]["text"]
        assert [h["id"] for h in explained["hits"]] == hits_of(alpha, [q], top_k=2)[0]
        assert "question_entities" in explained
        assert "no index named 'beta'" in error_text(hidden)  # as if it did not exist
        assert "question" in error_text(invalid)
        # the admin key sees both; no key gets no session at all (401 before MCP)
        found_b = asyncio.run(_session(url, "admin-key", lambda c: c.call_tool(
            "search", {"index": "beta", "question": q, "top_k": 3})))
        assert [h["id"] for h in payload(found_b)["hits"]] == hits_of(beta, [q], top_k=3)[0]
        assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401


def test_linearrag_mcp_over_stdio(small_rag, small_index_dir, small_questions, tmp_path):
    root = tmp_path / "root"
    alpha, beta = make_root(small_rag, small_index_dir, root)
    q = small_questions[1]["question"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "linearrag_torch.cli", "mcp", str(root),
                                                                 "--device", "cpu"], env=env)

    async def work():
        async with Client(params, read_timeout_seconds=TIMEOUT * 2) as client:
            a = await client.call_tool("search", {"index": "alpha", "question": q, "top_k": 4})
            b = await client.call_tool("search", {"index": "beta", "question": q, "top_k": 4})
            return payload(a), payload(b)

    a, b = asyncio.run(asyncio.wait_for(work(), TIMEOUT * 3))
    assert [h["id"] for h in a["hits"]] == hits_of(alpha, [q], top_k=4)[0]
    assert [h["id"] for h in b["hits"]] == hits_of(beta, [q], top_k=4)[0]
