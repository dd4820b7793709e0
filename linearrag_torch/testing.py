"""Plain (dense, allocating, unfused) forms of the query path's steps: what the tests and benchmarks
compare the engine's index-list and fused forms with. Nothing in the library's query path calls them
(as torch_scatter/testing.py is to torch_scatter).

| here | the live form it checks |
|---|---|
| sigma_pair (a dense [S, B] sigma as (sentence_emb, query_emb)) | the activation's sigma argument |
| seed_entities (dense [E, B] seeds, eq. 3) | activation.seed_pairs |
| propagate_reference (dense [E, B] in and out) | activation.propagate_reference_pairs |
| passage_reset (eq. 7 from dense act/tier) | pagerank.passage_reset_entries |
| ppr_step_reference (one plain PageRank step) | kernels.ppr_step |
"""
from __future__ import annotations

import torch

from .retrieval.activation import Activation, ColumnEntries, dense_seeds, propagate_reference_pairs, seed_pairs
from .config import RetrievalConfig
from .retrieval.pagerank import PPRGraph, _finish_reset, passage_reset_entries
from .index.csr import Csr


def sigma_pair(sigma: torch.Tensor):
    """A dense [S, B] sigma in the one form the activation takes, (sentence_emb, query_emb):
    (sigma, I_B), whose dot products are sigma's entries exactly."""
    return sigma, torch.eye(sigma.shape[1], dtype=sigma.dtype, device=sigma.device)


def seed_entities(entity_emb: torch.Tensor, query_entity_emb: torch.Tensor, owner: torch.Tensor, batch: int):
    """Eq. 3: each question entity seeds its most cosine-similar graph entity with that cosine.

    Returns (seeds [E, B], is_seed [E, B] bool). A graph entity seeded by several entities of one
    question keeps the largest cosine; ties between graph entities go to the lowest index.
    """
    keys, vals = seed_pairs(entity_emb, query_entity_emb, owner, batch)
    return dense_seeds(keys, vals, entity_emb.shape[0], batch)


def propagate_reference(M_crow, M_col, MT_crow, MT_col, sigma, seeds, is_seed, cfg: RetrievalConfig) -> Activation:
    """propagate_reference_pairs on dense [E, B] seeds (seeds where is_seed); returns dense Activation."""
    B = seeds.shape[1]
    keys = torch.nonzero(is_seed.reshape(-1)).flatten()
    out = propagate_reference_pairs(M_crow, M_col, MT_crow, MT_col, sigma, keys, seeds.reshape(-1)[keys], B, cfg)
    return out.dense()


def passage_reset(sim: torch.Tensor, N_log, act: torch.Tensor, tier: torch.Tensor, cfg: RetrievalConfig,
                  N_logT: Csr | None = None) -> torch.Tensor:
    """Eq. 7: I0(p) = (lam * minmax(sim)(p) + ln(1 + sum_e act_e * ln(1 + N[p,e]) / L_e)) * W_p.

    sim [P, B] cosines; N_log [P, E] sparse CSR holding ln(1 + N); act, tier [E, B] (tier 0 = inactive).
    With ``N_logT`` (the Csr of N_logᵀ on sim's device) the sum walks only the active entities' columns
    of N_log (pagerank.passage_reset_entries, what the engine runs) instead of a full SpMM.
    """
    if N_logT is None:
        v = torch.where(tier > 0, act / tier.clamp(min=1).to(act.dtype), torch.zeros_like(act))
        return _finish_reset(sim, N_log @ v, cfg)
    e, b = torch.nonzero(tier > 0, as_tuple=True)
    return passage_reset_entries(sim, N_logT, ColumnEntries(e, b, act[e, b] / tier[e, b].to(act.dtype), act.shape), cfg)


def ppr_step_reference(graph: PPRGraph, xp, xe, rp, re, damping):
    """kernels.ppr_step written plainly (allocating, unfused): one block Gauss-Seidel step, the passages
    from (xp, xe), then the entities from the new passages; returns (p', e', change)."""
    d = damping
    new_p = graph.to_passages @ xe
    if graph.between_passages is not None:
        new_p = new_p + graph.between_passages @ xp
    g = xp[graph.dangling_passages].sum(0) + xe[graph.dangling_entities].sum(0)
    np_ = (1 - d) * rp + d * (new_p + g * rp)
    new_e = graph.to_entities @ np_
    g = np_[graph.dangling_passages].sum(0) + xe[graph.dangling_entities].sum(0)
    ne_ = (1 - d) * re + d * (new_e + g * re)
    change = (np_ - xp).abs().sum(0) + (ne_ - xe).abs().sum(0)
    return np_, ne_, change
