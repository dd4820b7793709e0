"""The rerank stage of a batch (``RetrievalConfig.rerank``): the graph's top candidates rescored by the
learned cross-encoder (linearrag_torch/rerank) and ordered by its score fused with the graph's.

The graph ranks max(rerank_candidates, top_k) passages per question (every setting of the graph stage
applies: chain rounds, the pair rerank); its first ``rerank_candidates`` are rescored and reordered by
the fused score (RerankerSettings), which their hits carry; hits after them (top_k larger than
rerank_candidates) keep the graph's order and score. So a question's top k is a prefix of its top k + 1,
as without the rerank. Batched on the engine's device: one call for the whole batch, the pairs
built by gathers from token ids prepared before (the questions' on the question path, the passages'
once per index), no host copy. Without ``rerank`` nothing here runs and results are the graph's.
"""
from __future__ import annotations

import torch

from ..config import RetrievalConfig
from ..queries import EncodedQueries, Retrieved


def enabled(cfg: RetrievalConfig) -> bool:
    return bool(cfg.rerank)


def graph_config(cfg: RetrievalConfig) -> RetrievalConfig:
    """The settings of the graph stage under a rerank: no rerank, and deep enough for the candidates."""
    return cfg.replace(rerank=False, top_k=max(cfg.top_k, cfg.rerank_candidates))


def apply(reranker, passage_tokens, queries: EncodedQueries, graph_out: Retrieved, cfg: RetrievalConfig):
    """(Retrieved in the fused order with the fused scores, the Reranked detail) for the graph's ranking
    ``graph_out`` of ``queries`` (which must carry their reranker tokens: LinearRAG.encode_queries does so
    when its config has rerank)."""
    tokens = queries.rerank_tokens
    if tokens is None:
        raise ValueError("rerank=True needs the questions' reranker tokens: encode the questions with "
                         "LinearRAG.encode_queries(questions, config) where config.rerank is True")
    if tokens.ids.shape[0] != graph_out.indices.shape[0]:
        raise ValueError(f"reranker tokens for {tokens.ids.shape[0]} questions, a ranking of "
                         f"{graph_out.indices.shape[0]}")
    K = min(cfg.rerank_candidates, graph_out.indices.shape[1])
    rr = reranker.rerank(tokens, passage_tokens, graph_out.indices[:, :K], graph_out.scores[:, :K])
    tail = graph_out.indices[:, K:].to(rr.indices.device), graph_out.scores[:, K:].to(rr.scores.device, torch.float32)
    out = Retrieved(torch.cat([rr.indices, tail[0]], 1), torch.cat([rr.scores, tail[1]], 1))
    return out.head(cfg.top_k), rr
