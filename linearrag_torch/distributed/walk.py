"""A shard's part of the PageRank operator (eq. 6) for pagerank.personalized_pagerank: the loop, its stop rule and
the reset's normalisation are the single-process ones; what differs is the step, whose sums over the entities
that several ranks' passages touch, over the dangling nodes and over the L1 change are all-reduced."""
from __future__ import annotations

import time

import torch

from ..retrieval.pagerank import WalkCall
from .shard import Shard


class ShardWalk:
    """The walk of eq. 6 on one shard (Shard.to_passages, Shard.to_entities): its passages, its private entity
    rows and every shared one (the same list on every rank). ``log``: when a list, each step appends (bytes sent,
    compute seconds, collective seconds)."""

    def __init__(self, shard: Shard, comm, log: list | None = None):
        self.shard, self.comm, self.log = shard, comm, log
        self.to_passages, self.to_entities = shard.matrix("to_passages"), shard.matrix("to_entities")
        self.dangling_passages = shard.dangling_passages  # (StepLog reads its device)

    def column_totals(self, x: torch.Tensor) -> torch.Tensor:
        self.comm.phase = "ppr_setup"
        return self.comm.all_reduce(x.sum(0))

    def walk_rows(self, e: torch.Tensor) -> torch.Tensor:
        """The walk row of each global entity id on this shard: private rows first, then the shared; -1 where
        the entity's row is on another rank."""
        sh = self.shard
        n_priv, n_sh = sh.walk_private.numel(), sh.walk_shared.numel()
        loc = sh.local_entity(e)
        row = torch.full_like(e, -1)
        if n_priv:
            pos = torch.searchsorted(sh.walk_private, loc.clamp(min=0)).clamp_(max=n_priv - 1)
            row = torch.where((loc >= 0) & (sh.walk_private[pos] == loc), pos, row)
        if n_sh:
            pos = torch.searchsorted(sh.walk_shared, e).clamp_(max=n_sh - 1)
            row = torch.where(sh.walk_shared[pos] == e, n_priv + pos, row)
        return row

    def for_call(self, e: torch.Tensor, col: torch.Tensor, ev: torch.Tensor, rp: torch.Tensor) -> WalkCall:
        """The call's entity reset on this shard's walk rows, and the reset's mass on the dangling nodes (every
        dangling walk row is private: held by one rank), summed over the ranks in one collective."""
        sh = self.shard
        B = rp.shape[1]
        row = self.walk_rows(e)
        h = row >= 0
        re = torch.zeros(self.to_entities.shape[0], B, dtype=rp.dtype, device=rp.device).index_put_(
            (row[h], col[h]), ev[h].to(rp.dtype), accumulate=True)
        self.comm.phase = "ppr_setup"
        mass = self.comm.all_reduce(torch.stack([rp.index_select(0, sh.dangling_passages).sum(0),
                                                 re.index_select(0, sh.dangling_walk).sum(0)]))
        return WalkCall(_ShardCall(self, mass[0].clone(), mass[1].clone(), mass[1].clone()), re)


class _ShardCall:
    """ShardWalk's operator for one call. The dangling mass g of the iterate is kept per call column (``cols``
    of ppr_step): its passage part g_p comes with each step's collective; a dangling entity row has no edge, so
    after a step it holds its reset times that step's entity coefficient, and the entities' part g_e is the
    reset's dangling entity mass r_de times it (x_0 = r: g_e = r_de)."""

    def __init__(self, walk: ShardWalk, g_p: torch.Tensor, g_e: torch.Tensor, r_de: torch.Tensor):
        self.w, self.g_p, self.g_e, self.r_de = walk, g_p, g_e, r_de
        self.dangling_passages = walk.dangling_passages

    def ppr_step(self, xp, xe, rp, re, damping: float, out_p, out_e, joint=None, cols=None) -> torch.Tensor:
        """kernels.ppr_step's block Gauss-Seidel step on the shard: two collectives, [shared rows + 1, B] (the
        shared entities' partial W_ep p' and the new passages' dangling mass) and the L1 change [B]."""
        w, d = self.w, float(damping)
        sh, comm = w.shard, w.comm
        cols = torch.arange(xp.shape[1], device=xp.device) if cols is None else cols
        n_priv, n_sh = sh.walk_private.numel(), sh.walk_shared.numel()
        t0 = time.perf_counter()
        g_e = self.g_e.index_select(0, cols)
        torch.mul(rp, (1.0 - d) + d * (self.g_p.index_select(0, cols) + g_e), out=out_p)
        if w.to_passages.shape[1]:
            out_p.addmm_(w.to_passages, xe, alpha=d)
        y = torch.mm(w.to_entities, out_p) if w.to_entities.shape[0] else xe.new_zeros(xe.shape)
        buf = torch.cat([y[n_priv:], out_p.index_select(0, sh.dangling_passages).sum(0)[None]])
        t1 = time.perf_counter()
        comm.phase = "ppr"
        comm.all_reduce(buf)
        t2 = time.perf_counter()
        g_p = buf[n_sh]
        coef_e = (1.0 - d) + d * (g_p + g_e)  # g' over (p', xe)
        torch.mul(re, coef_e, out=out_e)
        out_e[:n_priv] += d * y[:n_priv]
        out_e[n_priv:] += d * buf[:n_sh]
        change = xp.sub_(out_p).abs_().sum(0).add_(xe[:n_priv].sub_(out_e[:n_priv]).abs_().sum(0))
        if sh.rank == 0:  # the shared rows are the same on every rank: counted once
            change.add_(xe[n_priv:].sub_(out_e[n_priv:]).abs_().sum(0))
        t3 = time.perf_counter()
        comm.all_reduce(change)
        t4 = time.perf_counter()
        self.g_p[cols], self.g_e[cols] = g_p, self.r_de.index_select(0, cols) * coef_e
        if w.log is not None:
            sent = (buf.numel() * buf.element_size() + change.numel() * change.element_size()) if comm.world > 1 else 0
            w.log.append((sent, (t1 - t0) + (t3 - t2), (t2 - t1) + (t4 - t3)))
        return change
