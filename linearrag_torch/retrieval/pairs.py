"""The first two places go to the best pair of passages (``RetrievalConfig.pair_candidates``).

A multi-hop question is answered by passages that are each only part of it: "Who is the spouse of the
Green performer?" needs the passage about "Green" (which names its performer) and the one about the
performer (which names the spouse). Ranked one by one, the second is often outranked by a passage that
matches the question better on its own. So after the ranking (one round or the chain's), the top
``pair_candidates`` (N) passages of a question are taken in pairs, and the pair (i, j) with the largest

    cos(q, v_i + v_j) + pair_rank_weight * (s_i + s_j) + pair_link_weight * link(i, j)

takes the first two places, in their ranked order; the other passages follow in theirs. Here v is a
passage's stored vector, s_i = score_i / score_1 its score as a share of the top one, and link(i, j) = 1 when
the two passages contain a common entity (C's structure) that occurs in at most ``pair_link_max_passages``
passages of the index (a rarer entity is a bridge; a common one links everything). Ties go to the pair
first in the order (0, 1), (0, 2), ..., (1, 2), ... Scores stay each passage's own, so the first two places
need not hold the two largest scores. The set of the top N passages is unchanged: recall@N and beyond are
exactly as before. Questions answered by dense retrieval (no question entity) keep their ranking, and so
does a question whose top score is not positive.

Both backends and the sharded engine run this: ``rerank`` on torch tensors (engine, shards: every question of
a batch at once on the device, nothing read back to the host), and the reference implementation on numpy
(reference.pair_rerank). docs/QUALITY.md, mechanism 5, has the measurements and the choice of the settings.
"""
from __future__ import annotations

import torch

from ..config import RetrievalConfig
from ..kernels import segment_positions
from ..queries import Retrieved


def enabled(cfg: RetrievalConfig) -> bool:
    """Whether a retrieval reranks its top pair: pair_candidates >= 2 in reference mode (paper mode stays
    the paper's ranking, as it stays one round: chain.enabled)."""
    return cfg.pair_candidates >= 2 and cfg.mode == "reference"


def link_entities(passages_with: torch.Tensor, max_passages: int) -> torch.Tensor:
    """bool per entity: the entities that link a pair, those found in 1 .. max_passages passages of the index
    (``passages_with``: each entity's passage count, e.g. torch.bincount of C's columns)."""
    return (passages_with >= 1) & (passages_with <= max_passages)


def candidate_entities(C_crow, C_col, linking: torch.Tensor, cand: torch.Tensor):
    """(question, slot, entity) of every linking entity in the candidate passages cand [B, N] (-1: none)."""
    B, N = cand.shape
    flat = cand.reshape(-1)
    ok = torch.nonzero(flat >= 0).flatten()
    owner, pos, _ = segment_positions(C_crow, flat[ok])
    ent = C_col[pos].to(torch.int64)
    keep = linking[ent]
    at = ok[owner[keep]]
    return at // N, at % N, ent[keep]


def linked(question: torch.Tensor, slot: torch.Tensor, entity: torch.Tensor, B: int, N: int) -> torch.Tensor:
    """[B, N, N] bool: slots i != j of question b hold passages sharing an entity, from the (question, slot,
    entity) triples of candidate_entities (each triple once)."""
    out = torch.zeros(B * N * N, dtype=torch.int32, device=slot.device)
    n = entity.numel()
    if n:
        # the triples grouped by (question, entity): a group holds at most N slots, laid out as a row of a
        # [groups, N] table (-1: none); every two slots of a row are linked
        order = torch.argsort(entity, stable=True)
        order = order[torch.argsort(question[order], stable=True)]
        question, entity, slot = question[order], entity[order], slot[order]
        starts = torch.ones(n, dtype=torch.bool, device=slot.device)
        starts[1:] = (question[1:] != question[:-1]) | (entity[1:] != entity[:-1])
        group = torch.cumsum(starts, 0) - 1
        first = torch.nonzero(starts).flatten()  # each group's first triple
        table = torch.full((first.numel(), N), -1, dtype=torch.int64, device=slot.device)
        table[group, torch.arange(n, device=slot.device) - first[group]] = slot
        pi, pj = torch.triu_indices(N, N, offset=1, device=slot.device)
        i, j = table[:, pi], table[:, pj]  # [groups, pairs]
        both = ((i >= 0) & (j >= 0)).to(torch.int32)
        base = question[first][:, None] * N
        out.index_add_(0, ((base + i.clamp(min=0)) * N + j.clamp(min=0)).flatten(), both.flatten())
        out.index_add_(0, ((base + j.clamp(min=0)) * N + i.clamp(min=0)).flatten(), both.flatten())
    return (out > 0).view(B, N, N)


def rerank(out: Retrieved, query_emb: torch.Tensor, cand_emb: torch.Tensor, link: torch.Tensor,
           active: torch.Tensor, cfg: RetrievalConfig) -> Retrieved:
    """The module docstring's rerank of ``out`` (at least pair_candidates columns): cand_emb [B, N, D] the
    vectors of out's first N passages (N = min(pair_candidates, columns)), link [B, N, N] bool from
    ``linked``, active [B] bool the questions it applies to."""
    idx, scores = out.indices, out.scores
    B, K = idx.shape
    N = min(cfg.pair_candidates, K)
    if N < 2 or B == 0:
        return out
    dev = idx.device
    pi, pj = torch.triu_indices(N, N, offset=1, device=dev)  # the pairs i < j in the order (0, 1), (0, 2), ...
    q = query_emb.to(dev, torch.float32)
    v = cand_emb.to(dev, torch.float32)
    s = scores[:, :N].to(torch.float32)
    top = s[:, :1]
    share = s / torch.where(top > 0, top, torch.ones_like(top))
    pair = v[:, pi] + v[:, pj]  # [B, pairs, D]
    # row by row (not a batched matmul, whose kernel may change with the batch): a question's pair values do
    # not depend on the other questions of its batch
    cos = (pair * q[:, None, :]).sum(dim=2) / pair.norm(dim=2).clamp(min=1e-12)
    value = cos + cfg.pair_rank_weight * (share[:, pi] + share[:, pj]) \
        + cfg.pair_link_weight * link[:, pi, pj].to(torch.float32)
    valid = (idx[:, pi] >= 0) & (idx[:, pj] >= 0)
    value = torch.where(valid, value, torch.full_like(value, float("-inf")))
    best = value.argmax(dim=1)  # the first of the largest: ties to the earliest pair
    use = active.to(dev) & (top.squeeze(1) > 0) & valid.any(dim=1)
    # new order: the pair's two slots, then the other columns in their order
    first, second = pi[best], pj[best]
    cols = torch.arange(K, device=dev).expand(B, K)
    rest = (cols != first[:, None]) & (cols != second[:, None])
    rank = torch.where(rest, cols + 2, torch.where(cols == first[:, None], 0, 1))
    order = torch.argsort(rank, dim=1)
    order = torch.where(use[:, None], order, cols)
    return Retrieved(torch.gather(idx, 1, order), torch.gather(scores, 1, order))


def ranks_before(before: Retrieved, after: Retrieved) -> list:
    """Per question the 1-based ranks in ``before`` of the first two passages of ``after`` (None where ``after``
    lists fewer than two): (1, 2) when the rerank kept the order."""
    out = []
    for b_row, a_row in zip(before.indices.cpu().tolist(), after.indices.cpu().tolist()):
        first = [p for p in a_row[:2] if p >= 0]
        out.append(tuple(b_row.index(p) + 1 for p in first) if len(first) == 2 else None)
    return out
