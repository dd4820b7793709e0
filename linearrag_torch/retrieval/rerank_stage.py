"""The rerank stage of a batch (``RetrievalConfig.rerank``): the graph's top candidates rescored by the
learned cross-encoder (linearrag_torch/rerank) and ordered by its score fused with the graph's.

The graph ranks max(rerank_candidates, top_k) passages per question (every setting of the graph stage
applies: chain rounds, the pair rerank); its first ``rerank_candidates`` are rescored and reordered by
the fused score (RerankerSettings), which their hits carry; hits after them (top_k larger than
rerank_candidates) keep the graph's order and score. With ``rerank_loop_candidates`` > 0 the reranker also
reorders each chain round's top candidates but the last's (``loop_order``; the stage list: stages.py). So a question's top k is a prefix of its top k + 1,
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


def passes(cfg: RetrievalConfig) -> dict:
    """apply's pair layout settings from ``cfg`` (rerank_pair_tokens, rerank_length_step)."""
    return {"pair_tokens": cfg.rerank_pair_tokens, "length_step": cfg.rerank_length_step}


def reach(cfg: RetrievalConfig) -> int:
    """Candidates read for the questions the set reader's reach classifier picks (0: no reach)."""
    return cfg.rerank_reach if cfg.rerank_set_reader and cfg.rerank_reach > cfg.rerank_candidates else 0


def apply(reranker, passage_tokens, queries: EncodedQueries, graph_out: Retrieved, candidates: int, known=None,
          vectors: bool = False, set_reader: bool = False, reach: int = 0, pair_tokens: int = 0, length_step: int = 0):
    """(Retrieved in the fused order with the fused scores, the Reranked detail) for the graph's ranking
    ``graph_out`` of ``queries`` (which must carry their reranker tokens: LinearRAG.encode_queries does so
    when its config has rerank): its first ``candidates`` reordered, the rest as they are. ``known``: the
    Reranked pairs of the batch's earlier reranks (Reranker.rerank takes their logits again). ``vectors``: keep
    the pairs' pooled vectors (for a later set reader). ``set_reader``: order the candidates by the reranker's set
    reader (rerank/set_reader.py), which reads ``reach`` candidates (> ``candidates``; 0: none) for the questions
    its reach classifier picks. ``pair_tokens``, ``length_step``: how the pairs are laid out
    (RetrievalConfig.rerank_pair_tokens, rerank_length_step; passes(cfg) gives them)."""
    tokens = queries.rerank_tokens
    if tokens is None:
        raise ValueError("rerank=True needs the questions' reranker tokens: encode the questions with "
                         "LinearRAG.encode_queries(questions, config) where config.rerank is True")
    if tokens.ids.shape[0] != graph_out.indices.shape[0]:
        raise ValueError(f"reranker tokens for {tokens.ids.shape[0]} questions, a ranking of "
                         f"{graph_out.indices.shape[0]}")
    sr, read = None, None
    if set_reader:
        sr = reranker.set_reader
        if sr is None:
            raise ValueError(f"rerank_set_reader=True: the reranker folder {reranker.folder or '(the packaged one)'} "
                             "holds no set reader (set_reader.json)")
        if reach > candidates and graph_out.indices.shape[1] > candidates:
            K = min(reach, graph_out.indices.shape[1])
            wants = sr.wants_reach(queries.query_emb.to(reranker.device))  # [B] bool
            cols = torch.arange(K, device=reranker.device)
            read = (cols < candidates) | wants.unsqueeze(1)
            candidates = K
    K = min(candidates, graph_out.indices.shape[1])
    rr = reranker.rerank(tokens, passage_tokens, graph_out.indices[:, :K], graph_out.scores[:, :K], known,
                         vectors=vectors, read=None if read is None else read[:, :K], set_reader=sr,
                         pair_tokens=pair_tokens, length_step=length_step)
    tail = graph_out.indices[:, K:].to(rr.indices.device), graph_out.scores[:, K:].to(rr.scores.device, torch.float32)
    return Retrieved(torch.cat([rr.indices, tail[0]], 1), torch.cat([rr.scores, tail[1]], 1)), rr


def loop_order(round_out: Retrieved, rr) -> Retrieved:
    """A round's ranking after the reranker in the loop (``rr``: rerank.Reranked of its first K candidates): those
    K in the fused order, each scored ``s0 * exp(fused - fused of the first)`` (s0: the round's top graph score),
    so that the chain reads the reranker's confidence as a share of the top (chain.chain_seeds), then the rest in
    the graph's order and scores."""
    K = rr.indices.shape[1]
    top_fused = rr.scores[:, :1]
    ok = (rr.indices >= 0) & torch.isfinite(top_fused)
    s0 = round_out.scores[:, :1].to(rr.scores.device, torch.float32)
    share = torch.exp(torch.where(ok, rr.scores - torch.where(ok[:, :1], top_fused, 0.0), float("-inf")))
    idx = torch.cat([rr.indices, round_out.indices[:, K:].to(rr.indices.device)], 1)
    scores = torch.cat([s0 * share, round_out.scores[:, K:].to(rr.scores.device, torch.float32)], 1)
    return Retrieved(idx, scores.to(round_out.scores.dtype))
