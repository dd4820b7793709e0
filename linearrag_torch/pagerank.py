"""Stage 2, global importance aggregation: passage reset weights (eq. 7) and personalized
PageRank (eq. 6) by batched power iteration over the passage-entity graph."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import RetrievalConfig
from .sparse import Csr


def minmax(x: torch.Tensor) -> torch.Tensor:
    """Min-max normalise each column of [P, B] to [0, 1] (a constant column becomes 0)."""
    lo = x.min(dim=0, keepdim=True).values
    span = x.max(dim=0, keepdim=True).values - lo
    return torch.where(span > 0, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(x))


def passage_reset(sim: torch.Tensor, N_log, act: torch.Tensor, tier: torch.Tensor, cfg: RetrievalConfig) -> torch.Tensor:
    """Eq. 7: I0(p) = (lam * minmax(sim)(p) + ln(1 + sum_e act_e * ln(1 + N[p,e]) / L_e)) * W_p.

    sim [P, B] cosines; N_log [P, E] sparse CSR holding ln(1 + N); act, tier [E, B] (tier 0 = inactive).
    """
    v = torch.where(tier > 0, act / tier.clamp(min=1).to(act.dtype), torch.zeros_like(act))
    return (cfg.lam * minmax(sim) + torch.log1p(N_log @ v)) * cfg.passage_node_weight


@dataclass
class PPRGraph:
    """The random-walk operator of the undirected passage-entity graph, as pre-normalised CSR.

    to_passages [P, E]: w[p, e] / str(e);  to_entities [E, P]: w[p, e] / str(p);
    between_passages [P, P] or None: adjacency / str(source);  dangling_*: nodes of strength 0.
    """

    to_passages: torch.Tensor
    to_entities: torch.Tensor
    between_passages: torch.Tensor | None
    dangling_passages: torch.Tensor
    dangling_entities: torch.Tensor

    @staticmethod
    def build(C: Csr, adjacent_passages: bool = False, device="cpu") -> "PPRGraph":
        P, E = C.shape
        C = C.to("cpu")
        strength_p = C.row_sums().double()
        strength_e = torch.zeros(E, dtype=torch.float64).index_add_(0, C.col, C.val.double())
        adj = None
        if adjacent_passages and P > 1:
            i = torch.arange(P - 1)
            adj = Csr.from_coo(torch.cat([i, i + 1]), torch.cat([i + 1, i]), torch.ones(2 * (P - 1)), (P, P))
            strength_p = strength_p + adj.row_sums().double()
        inv_p = torch.where(strength_p > 0, 1.0 / strength_p, torch.zeros_like(strength_p))
        inv_e = torch.where(strength_e > 0, 1.0 / strength_e, torch.zeros_like(strength_e))
        to_passages = C.with_values((C.val.double() * inv_e[C.col]).float())
        CT = C.transpose()
        to_entities = CT.with_values((CT.val.double() * inv_p[CT.col]).float())
        between = None
        if adj is not None:
            between = adj.with_values((adj.val.double() * inv_p[adj.col]).float()).torch(device)
        return PPRGraph(
            to_passages=to_passages.torch(device),
            to_entities=to_entities.torch(device),
            between_passages=between,
            dangling_passages=(strength_p == 0).to(device),
            dangling_entities=(strength_e == 0).to(device),
        )

    def step(self, xp: torch.Tensor, xe: torch.Tensor):
        """One walk step: mass arriving at passages and at entities, and the dangling mass [B]."""
        new_p = self.to_passages @ xe
        if self.between_passages is not None:
            new_p = new_p + self.between_passages @ xp
        new_e = self.to_entities @ xp
        dangling = xp[self.dangling_passages].sum(0) + xe[self.dangling_entities].sum(0)
        return new_p, new_e, dangling


def personalized_pagerank(graph: PPRGraph, reset_p: torch.Tensor, reset_e: torch.Tensor, cfg: RetrievalConfig):
    """Eq. 6 by power iteration, batched: x <- (1 - d) r + d (walk(x) + dangling(x) r).

    A question stops when its L1 change is below cfg.ppr_tol, or when the change stops shrinking
    (a tolerance below the dtype's rounding floor would otherwise run to ppr_max_iter).

    reset_p [P, B], reset_e [E, B] are cleaned (NaN and negatives -> 0) and normalised per column.
    Returns (passage scores [P, B], entity scores [E, B], valid [B]); a column whose reset sums to 0
    is not valid (the caller falls back to dense retrieval) and holds zeros.
    """
    rp = torch.nan_to_num(reset_p, nan=0.0).clamp(min=0)
    re = torch.nan_to_num(reset_e, nan=0.0).clamp(min=0)
    total = rp.sum(0) + re.sum(0)
    valid = total > 0
    norm = torch.where(valid, total, torch.ones_like(total))
    rp, re = rp / norm, re / norm
    d = cfg.damping
    xp, xe = rp, re
    running = torch.ones_like(valid)
    last = torch.full_like(total, float("inf"))
    for _ in range(cfg.ppr_max_iter):
        new_p, new_e, dangling = graph.step(xp, xe)
        np_ = (1 - d) * rp + d * (new_p + dangling * rp)
        ne_ = (1 - d) * re + d * (new_e + dangling * re)
        change = (np_ - xp).abs().sum(0) + (ne_ - xe).abs().sum(0)
        xp = torch.where(running, np_, xp)  # a converged question keeps its iterate, as it would alone
        xe = torch.where(running, ne_, xe)
        # the L1 change shrinks by at least d per step in exact arithmetic; once it stops shrinking the
        # column sits at the float rounding floor (about 1e-7 in float32), where more steps change nothing
        running = running & (change >= cfg.ppr_tol) & (change < last)
        last = change
        if not bool(running.any()):
            break
    return xp, xe, valid
