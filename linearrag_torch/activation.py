"""Stage 1, entity activation by semantic bridging (eqs. 3-5), batched over B questions.

All state is dense (entities x B) / (sentences x B); sparse products are torch.sparse_csr SpMM.
See docs/METHOD.md for the exact semantics of both modes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import RetrievalConfig


@dataclass
class Activation:
    """Result of stage 1 for a batch (all [E, B]).

    act     activation used in eq. 7 (a_final in paper mode, the last recorded score in reference mode)
    tier    hop level L_e (1 = seed, t + 1 = activated at step t, 0 = inactive)
    reset   entity part of the PPR reset (a_final, or the accumulated weights in reference mode)
    """

    act: torch.Tensor
    tier: torch.Tensor
    reset: torch.Tensor
    steps: int = 0


def seed_entities(entity_emb: torch.Tensor, query_entity_emb: torch.Tensor, owner: torch.Tensor, batch: int):
    """Eq. 3: each question entity seeds its most cosine-similar graph entity with that cosine.

    Returns (seeds [E, B], is_seed [E, B] bool). A graph entity seeded by several entities of one
    question keeps the largest cosine; ties between graph entities go to the lowest index.
    """
    E = entity_emb.shape[0]
    seeds = torch.zeros(E * batch, dtype=entity_emb.dtype, device=entity_emb.device)
    is_seed = torch.zeros(E * batch, dtype=torch.bool, device=entity_emb.device)
    if query_entity_emb.shape[0] and E:
        best, arg = (query_entity_emb @ entity_emb.T).max(dim=1)  # [Q]; max returns the first maximum
        idx = arg * batch + owner
        # a cosine can be <= 0: reduce from -inf, not from the zeros of non-seeds
        seeds = seeds.fill_(float("-inf")).scatter_reduce_(0, idx, best, "amax")
        is_seed[idx] = True
        seeds = torch.where(is_seed, seeds, torch.zeros_like(seeds))
    return seeds.view(E, batch), is_seed.view(E, batch)


def sentence_relevance(sentence_emb: torch.Tensor, query_emb: torch.Tensor) -> torch.Tensor:
    """Eq. 4: sigma[s, b] = cos(q_b, s), as [S, B]."""
    return sentence_emb @ query_emb.T


def propagate_paper(M, MT, sigma, seeds, is_seed, cfg: RetrievalConfig) -> Activation:
    """Eq. 5 with dynamic pruning: a_t = max(Mᵀ(sigma ⊙ M(a ⊙ [a >= delta])) pruned at delta, a_{t-1}).

    M [S, E] and MT [E, S] are sparse CSR; a question stops (keeps a_{t-1}) at the first step that
    activates no new entity.
    """
    a = seeds.clone()
    tier = is_seed.to(torch.int64)
    live = torch.ones(a.shape[1], dtype=torch.bool, device=a.device)
    steps = 0
    for t in range(1, cfg.max_iterations):
        active = a * (a >= cfg.delta)
        y = MT @ (sigma * (M @ active))
        y = y * (y >= cfg.delta)
        a_new = torch.maximum(y, a)
        newly = (a_new >= cfg.delta) & (tier == 0)
        live = live & newly.any(dim=0)
        if not bool(live.any()):
            break
        steps = t
        a = torch.where(live, a_new, a)
        tier = torch.where(newly & live, t + 1, tier)
    return Activation(act=a, tier=tier, reset=a, steps=steps)


def _segment_positions(crow: torch.Tensor, rows: torch.Tensor):
    """For a list of CSR rows, the owner (position in ``rows``) and storage position of every entry."""
    starts = crow[rows]
    lens = crow[rows + 1] - starts
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), lens)
    offsets = torch.cumsum(lens, 0) - lens
    pos = torch.arange(owner.numel(), device=rows.device) - offsets[owner] + starts[owner]
    return owner, pos, offsets


def top_k_per_segment(values: torch.Tensor, owner: torch.Tensor, offsets: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k largest finite values of each segment (segments are contiguous runs of
    ``owner``; ties keep the earlier position)."""
    order = torch.argsort(-values, stable=True)
    order = order[torch.argsort(owner[order], stable=True)]
    rank = torch.arange(order.numel(), device=values.device) - offsets[owner[order]]
    keep = (rank < k) & torch.isfinite(values[order])
    return order[keep]


def propagate_reference(M_crow, M_col, MT_crow, MT_col, sigma, seeds, is_seed, cfg: RetrievalConfig) -> Activation:
    """The reference code's breadth-first activation, for a batch, in the order-free form of METHOD.md.

    Each frontier entity (score >= delta) takes its top_k_sentence unused sentences by sigma; every
    entity of a taken sentence gets candidate score(e) * sigma[s]; candidates >= delta add to its
    accumulated weight and re-activate it (score = largest candidate, tier = t + 1).
    """
    E, B = seeds.shape
    device = seeds.device
    score = seeds.clone()
    weight = seeds.clone()
    tier = is_seed.to(torch.int64)
    frontier = torch.where(is_seed, seeds, torch.zeros_like(seeds))
    frontier_mask = is_seed.clone()
    used = torch.empty(0, dtype=torch.int64, device=device)  # sorted keys s * B + b
    steps = 0
    for t in range(1, cfg.max_iterations):
        e_idx, b_idx = torch.nonzero(frontier_mask & (frontier >= cfg.delta), as_tuple=True)
        if e_idx.numel() == 0:
            break
        steps = t
        f = frontier[e_idx, b_idx]
        # candidate sentences: the CSR rows of Mᵀ of the frontier entities
        owner, pos, offsets = _segment_positions(MT_crow, e_idx)
        s = MT_col[pos]
        b = b_idx[owner]
        sig = sigma[s, b]
        keys = s * B + b
        avail = ~torch.isin(keys, used) if used.numel() else torch.ones_like(keys, dtype=torch.bool)
        chosen = top_k_per_segment(torch.where(avail, sig, torch.full_like(sig, float("-inf"))), owner, offsets, cfg.top_k_sentence)
        used = torch.unique(torch.cat([used, keys[chosen]]))
        base = f[owner[chosen]] * sig[chosen]  # score(e) * sigma[s] for each taken (e, s)
        cs, cb = s[chosen], b[chosen]
        # every entity of each taken sentence receives the candidate
        owner2, pos2, _ = _segment_positions(M_crow, cs)
        e2 = M_col[pos2]
        b2 = cb[owner2]
        cand = base[owner2]
        ok = cand >= cfg.delta
        e2, b2, cand = e2[ok], b2[ok], cand[ok]
        flat = e2 * B + b2
        weight.view(-1).index_add_(0, flat, cand)
        new = torch.full((E * B,), float("-inf"), dtype=seeds.dtype, device=device)
        new.scatter_reduce_(0, flat, cand, "amax")
        trig = torch.zeros(E * B, dtype=torch.bool, device=device)
        trig[flat] = True
        new, trig = new.view(E, B), trig.view(E, B)
        score = torch.where(trig, new, score)
        tier = torch.where(trig, t + 1, tier)
        frontier = torch.where(trig, new, torch.zeros_like(new))
        frontier_mask = trig
    return Activation(act=score, tier=tier, reset=weight, steps=steps)
