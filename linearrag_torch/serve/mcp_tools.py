"""MCP (Model Context Protocol) tools over a store's indexes, on the official ``mcp`` Python SDK (extra [mcp]).

Tools: ``list_indexes``; ``search``, ``explain`` and ``answer`` (with a chat model), each with the index's name as an
argument. They go through each index's front as the HTTP routes do (validation, admission, the shared batcher),
so an assistant's questions are batched with everyone else's. Served two ways:

* on the server (`linearrag serve` as a store): streamable HTTP at ``/mcp/``; the request's
  ``Authorization: Bearer KEY`` scopes the tools as it scopes the routes (an index the key may not see is
  answered as one that does not exist);
* `linearrag mcp DIR...`: over stdio, for an assistant that starts the server itself (no keys: the local user).

A tool's error (an unknown index, an invalid question, overload) is an MCP tool error whose text says why.
"""
# (no `from __future__ import annotations`: the SDK reads the tools' annotations, Context among them)
import asyncio
import logging
from typing import Optional

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError  # the SDK's: an error result with this text

from .front import HTTPError
from .keys import OPEN
from .store import Store

log = logging.getLogger("linearrag.serve")

INSTRUCTIONS = ("LinearRAG graph retrieval over named indexes of passages. Call list_indexes to see the indexes, "
                "then search (top passages for a question), explain (how each passage was reached: the question's "
                "entities, the graph's activation) or answer (an answer from the server's chat model).")


def _principal(store: Store, ctx: Optional[Context]):
    request = None
    try:
        request = ctx.request_context.request if ctx is not None else None
    except ValueError:  # no request context (a direct call)
        request = None
    if request is None:  # stdio, or in process: the user who started the process sees every index
        return OPEN
    headers = getattr(request, "headers", None)
    auth = headers.get("authorization") if headers is not None else None
    who = store.principal(auth)
    if who is None:
        raise ToolError("missing or wrong API key (send 'Authorization: Bearer KEY')")
    return who


def _front(store: Store, ctx, index: str):
    who = _principal(store, ctx)
    try:
        host = store.host(who, index, "read")
        return host, store.ready_front(host)
    except HTTPError as exc:
        raise ToolError(_text(exc)) from None


def _text(exc: HTTPError) -> str:
    detail = exc.detail
    if isinstance(detail, list):  # 422: one item per field
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}" for d in detail)
    return f"{exc.status}: {detail}"


async def _call(coro):
    try:
        return await coro
    except HTTPError as exc:
        raise ToolError(_text(exc)) from None


def make_mcp_server(store: Store, name: str = "linearrag") -> MCPServer:
    """An MCPServer whose tools answer from ``store``'s indexes (the module's docstring)."""
    from .. import __version__

    server = MCPServer(name, instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")

    @server.tool(description="The indexes this server holds (those your key may use), with their passage counts.")
    async def list_indexes(ctx: Context) -> dict:
        who = _principal(store, ctx)
        return {"indexes": [h.summary() for h in store.visible(who)]}

    @server.tool(description="The passages of an index that best answer a question (multi-hop: passages reached "
                             "through the entities they share are found too), best first, with their text.")
    async def search(index: str, question: str, ctx: Context, top_k: int = 5) -> dict:
        _, front = _front(store, ctx, index)
        out = await _call(front.search({"question": question, "top_k": top_k, "include_text": True}))
        return out["results"][0]

    @server.tool(description="As search, and for each passage how it was reached: the question's entities, the "
                             "seeds, the entities activated in it, the chain round that found it.")
    async def explain(index: str, question: str, ctx: Context, top_k: int = 5) -> dict:
        host, front = _front(store, ctx, index)
        req = await _call(_validated(front, {"question": question, "top_k": top_k}))

        async def work(r, deadline):
            return await asyncio.wait_for(store.explain(host, [question], top_k), deadline)

        return (await _call(front._admitted(work, req)))[0]

    if store.llm is not None:
        @server.tool(description="An answer to a question from the server's chat model, over the index's top "
                                 "passages (given with the answer).")
        async def answer(index: str, question: str, ctx: Context, top_k: int = 5) -> dict:
            _, front = _front(store, ctx, index)
            out = await _call(front.answer({"question": question, "top_k": top_k, "include_text": True}))
            return out["results"][0]

    return server


async def _validated(front, body):
    return front._validate(body)


def run_stdio(paths, settings, llm=None) -> int:
    """`linearrag mcp DIR...`: the tools over stdio until the client closes the connection."""
    import anyio

    store = Store(paths, settings, llm=llm)
    server = make_mcp_server(store)

    async def main():
        async with store.lifespan():
            while any(not t.done() for t in store._tasks):  # the indexes load before the first tool call
                await asyncio.sleep(0.05)
            failed = [h for h in store.hosts.values() if h.status == "failed"]
            for h in failed:
                log.error("index %r not served: %s", h.name, h.load_error)
            await server.run_stdio_async()

    anyio.run(main)
    return 0


__all__ = ["make_mcp_server", "run_stdio"]
