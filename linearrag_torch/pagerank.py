"""Stage 2, global importance aggregation: passage reset weights (eq. 7) and personalized
PageRank (eq. 6) by batched power iteration over the passage-entity graph."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from . import kernels
from .config import RetrievalConfig
from .sparse import ColumnEntries, Csr


def minmax(x: torch.Tensor) -> torch.Tensor:
    """Min-max normalise each column of [P, B] to [0, 1] (a constant column becomes 0)."""
    lo = x.min(dim=0, keepdim=True).values
    span = x.max(dim=0, keepdim=True).values - lo
    return torch.where(span > 0, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(x))


def passage_reset_entries(sim: torch.Tensor, N_logT: Csr, act_over_tier: ColumnEntries, cfg: RetrievalConfig):
    """Eq. 7 from the active (entity, question) pairs with their act_e / L_e (kernels.spmm_sparse_rhs)."""
    z = torch.zeros_like(sim)
    a = act_over_tier
    kernels.spmm_sparse_rhs(N_logT.crow, N_logT.col, N_logT.val, a.row, a.col, a.val, z)
    return _finish_reset(sim, z, cfg)


def _finish_reset(sim, z, cfg):
    return (cfg.lam * minmax(sim) + torch.log1p_(z)) * cfg.passage_node_weight


@dataclass
class Leaves:
    """The entities of degree 1 (one passage, weight > 0), merged into one node per passage.

    A leaf entity e of passage p only trades mass with p: it receives d * w[p, e] / str(p) * x_p and
    gives all of its mass back to p. Its passage sees only the sum of its leaves' mass, so the walk runs
    on one "bucket" node per passage holding that sum (to_entities weight share_p = sum of the leaves'
    w / str(p), to_passages weight 1); the leaves' own values and their part of the L1 change are
    recovered exactly from the bucket (see personalized_pagerank).
    """

    row: torch.Tensor  # [E] int64: row of each entity in the walk's entity space (a leaf: its bucket)
    is_leaf: torch.Tensor  # [E] bool
    passage: torch.Tensor  # [E] int64: a leaf's passage (-1 otherwise)
    share: torch.Tensor  # [E] float32: a leaf's w[p, e] / str(p) (0 otherwise)
    bucket_share: torch.Tensor  # [entity rows] float32: a bucket's sum of shares (0 for other rows)
    by_passage: Csr  # [P, E] the leaves of each passage (values: share)


@dataclass
class PPRGraph:
    """The random-walk operator of the undirected passage-entity graph, as pre-normalised CSR.

    to_passages [P, E']: w[p, e] / str(e);  to_entities [E', P]: w[p, e] / str(p);
    between_passages [P, P] or None: adjacency / str(source);  dangling_*: nodes of strength 0.
    With ``leaves`` (the default of build), the entity space E' holds the entities of degree >= 2 and
    one bucket per passage with leaf entities (Leaves); else E' = E.
    ``workspace``: what kernels.ppr_step caches about these matrices (rows of ones, Triton work lists).
    """

    to_passages: torch.Tensor
    to_entities: torch.Tensor
    between_passages: torch.Tensor | None
    dangling_passages: torch.Tensor
    dangling_entities: torch.Tensor
    dangling_passage_idx: torch.Tensor | None = None  # the same nodes as index lists
    dangling_entity_idx: torch.Tensor | None = None
    leaves: Leaves | None = None
    workspace: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.dangling_passage_idx is None:
            self.dangling_passage_idx = torch.nonzero(self.dangling_passages).flatten()
        if self.dangling_entity_idx is None:
            self.dangling_entity_idx = torch.nonzero(self.dangling_entities).flatten()

    @property
    def num_entities(self) -> int:
        """Entities of the index (not rows of the walk's entity space)."""
        return self.leaves.row.numel() if self.leaves is not None else self.to_entities.shape[0]

    @staticmethod
    def build(C: Csr, adjacent_passages: bool = False, device="cpu", collapse_leaves: bool = True) -> "PPRGraph":
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
        rows = C.row_index()
        to_p_val = C.val.double() * inv_e.index_select(0, C.col)  # w / str(e)
        to_e_val = C.val.double() * inv_p.index_select(0, rows)  # w / str(p), on C's entries
        leaves = None
        if collapse_leaves:
            degree = torch.bincount(C.col, minlength=E)
            is_leaf = (degree == 1) & (strength_e > 0)
            leaf_entry = is_leaf.index_select(0, C.col)
            keep = ~is_leaf
            n_keep = int(keep.sum())
            row = torch.full((E,), -1, dtype=torch.int64)
            row[keep] = torch.arange(n_keep)
            has_leaf = torch.zeros(P, dtype=torch.bool)
            has_leaf[rows[leaf_entry]] = True
            bucket = torch.full((P,), -1, dtype=torch.int64)
            bucket[has_leaf] = n_keep + torch.arange(int(has_leaf.sum()))
            passage = torch.full((E,), -1, dtype=torch.int64)
            passage[C.col[leaf_entry]] = rows[leaf_entry]
            share = torch.zeros(E, dtype=torch.float64)
            share[C.col[leaf_entry]] = to_e_val[leaf_entry]
            row[is_leaf] = bucket[passage[is_leaf]]
            n_rows = n_keep + int(has_leaf.sum())
            bucket_share = torch.zeros(n_rows, dtype=torch.float64).index_add_(0, row[is_leaf], share[is_leaf])
            lp = torch.nonzero(has_leaf).flatten()
            # to_passages: the non-leaf entries, and weight 1 from each bucket to its passage
            to_passages = Csr.from_coo(torch.cat([rows[~leaf_entry], lp]), torch.cat([row[C.col[~leaf_entry]], bucket[lp]]),
                                       torch.cat([to_p_val[~leaf_entry], torch.ones(lp.numel(), dtype=torch.float64)]).float(),
                                       (P, n_rows))
            # to_entities: the non-leaf entries, and each bucket's share (duplicates are summed)
            to_entities = Csr.from_coo(row.index_select(0, C.col), rows, to_e_val.float(), (n_rows, P))
            dangling_e = torch.cat([strength_e[keep] == 0, torch.zeros(n_rows - n_keep, dtype=torch.bool)])
            by_passage = Csr.from_coo(passage[is_leaf], torch.nonzero(is_leaf).flatten(), share[is_leaf].float(), (P, E))
            leaves = Leaves(row.to(device), is_leaf.to(device), passage.to(device), share.float().to(device),
                            bucket_share.float().to(device), by_passage.to(device))
        else:
            to_passages = C.with_values(to_p_val.float())
            CT = C.transpose()
            to_entities = CT.with_values((CT.val.double() * inv_p[CT.col]).float())
            dangling_e = strength_e == 0
        between = None
        if adj is not None:
            between = adj.with_values((adj.val.double() * inv_p[adj.col]).float())
            between = between.torch(device, index_dtype=between.compact_index_dtype())
        return PPRGraph(
            to_passages=to_passages.torch(device, index_dtype=to_passages.compact_index_dtype()),
            to_entities=to_entities.torch(device, index_dtype=to_entities.compact_index_dtype()),
            between_passages=between,
            dangling_passages=(strength_p == 0).to(device),
            dangling_entities=dangling_e.to(device),
            leaves=leaves,
        )

    def dangling_mass(self, xp: torch.Tensor, xe: torch.Tensor) -> torch.Tensor:
        """The iterate's mass on the nodes of strength 0, per column [B] (kernels.dangling_mass)."""
        return kernels.dangling_mass(self.dangling_passage_idx, self.dangling_entity_idx, xp, xe)

    def ppr_step(self, xp, xe, rp, re, damping: float, out_p, out_e, g=None) -> torch.Tensor:
        """kernels.ppr_step on this operator's tensors (see there); returns the L1 change per column."""
        return kernels.ppr_step(self.to_passages, self.to_entities, self.between_passages, self.dangling_passage_idx,
                                self.dangling_entity_idx, xp, xe, rp, re, damping, out_p, out_e, g, self.workspace)


class StepObserver:
    """Watches the power-iteration steps of personalized_pagerank (register with ``observe_steps``).

    before_step(graph, columns): right before a step; ``columns`` [n] int64 holds the batch column of
    each of the n working columns (stopped columns leave the working set as the loop compacts it).
    after_step(graph, columns, change): right after it (kernels.ppr_step and, with leaf buckets, the
    tracked leaves' correction); ``change`` [n] is the step's L1 change per working column.
    Benchmarks time and count the steps with it; tests read the changes. The defaults do nothing.
    """

    def before_step(self, graph: PPRGraph, columns: torch.Tensor) -> None:
        pass

    def after_step(self, graph: PPRGraph, columns: torch.Tensor, change: torch.Tensor) -> None:
        pass


_OBSERVERS: list = []


@contextmanager
def observe_steps(observer: StepObserver):
    """Call ``observer`` around every PageRank step of this process (any caller, the engine's included)
    for the ``with`` block; yields the observer."""
    _OBSERVERS.append(observer)
    try:
        yield observer
    finally:
        _OBSERVERS.remove(observer)



class _ActiveLeaves:
    """The leaves with reset mass, tracked one by one (pairs (leaf e, column b)); every other leaf of
    a passage moves in step with its bucket. Adds their exact share of the L1 change to each step."""

    def __init__(self, lv: Leaves, re: ColumnEntries):
        m = lv.is_leaf[re.row] & (re.val > 0)
        self.e = re.row[m]
        self.col = re.col[m]  # original column
        self.p = lv.passage[self.e]
        self.bucket = lv.row[self.e]
        self.share = lv.share[self.e]
        self.r = re.val[m]
        self.x = self.r.clone()  # x_e^0 = r_e
        self.final = self.x.clone()
        # pairs grouped by (bucket, column): the leaves of one passage in one question
        key = self.bucket * re.shape[1] + self.col
        _, self.group = torch.unique(key, return_inverse=True)
        self.n_groups = int(self.group.max()) + 1 if self.group.numel() else 0


def _expand_entities(lv: Leaves, xe_rows: torch.Tensor, active: _ActiveLeaves | None) -> torch.Tensor:
    """Entity scores [E, B] from the walk's entity rows: a leaf not tracked gets its passage bucket's
    mass in proportion to its share, after the tracked leaves of that passage took theirs."""
    out = xe_rows.index_select(0, lv.row)
    leaf = torch.nonzero(lv.is_leaf).flatten()
    scale = torch.where(lv.bucket_share > 0, 1.0 / lv.bucket_share, torch.zeros_like(lv.bucket_share))
    out[leaf] *= (lv.share[leaf] * scale[lv.row[leaf]])[:, None]
    if active is not None and active.e.numel():
        # per (bucket, column) with tracked leaves: the untracked leaves share (bucket - tracked mass)
        g = active.group
        tracked_x = torch.zeros(active.n_groups, device=out.device).index_add_(0, g, active.final)
        tracked_s = torch.zeros(active.n_groups, device=out.device).index_add_(0, g, active.share)
        first = torch.full((active.n_groups,), -1, dtype=torch.int64, device=out.device)
        first[g] = torch.arange(g.numel(), device=out.device)
        p, col, bucket = active.p[first], active.col[first], active.bucket[first]
        rest_s = lv.bucket_share[bucket] - tracked_s
        per_share = torch.where(rest_s > 0, (xe_rows[bucket, col] - tracked_x) / torch.where(rest_s > 0, rest_s, 1.0),
                                torch.zeros_like(rest_s))
        owner, pos, _ = kernels.segment_positions(lv.by_passage.crow, p)
        e = lv.by_passage.col[pos]
        out[e, col[owner]] = lv.by_passage.val[pos] * per_share[owner]
        out[active.e, active.col] = active.final
    return out


def personalized_pagerank(graph: PPRGraph, reset_p: torch.Tensor, reset_e: torch.Tensor, cfg: RetrievalConfig,
                          entity_scores: bool = True):
    """Eq. 6 by power iteration, batched: x <- (1 - d) r + d (walk(x) + dangling(x) r).

    A question stops when its L1 change is below cfg.ppr_tol, or when the change stops shrinking
    (a tolerance below the dtype's rounding floor would otherwise run to ppr_max_iter); it keeps the
    iterate of that step. Each step is kernels.ppr_step on the working columns (watched by the
    observers of ``observe_steps``); a column that stops is
    written out at once and dropped from the working set at the next compaction (when a quarter of it
    has stopped), so late iterations cost only what is left. With graph.leaves the walk runs on the
    merged leaf buckets; the change and (with ``entity_scores``) the entity scores are those of the
    full graph (see Leaves).

    reset_p [P, B] and reset_e ([E, B], or its nonzero entries as ColumnEntries) are cleaned (NaN and
    negatives -> 0) and normalised per column.
    Returns (passage scores [P, B], entity scores [E, B] or None, valid [B]); a column whose reset sums
    to 0 is not valid (the caller falls back to dense retrieval) and holds zeros.
    """
    if not isinstance(reset_e, ColumnEntries):
        reset_e = ColumnEntries.from_dense(reset_e)
    rp = torch.nan_to_num(reset_p, nan=0.0).clamp_(min=0)
    B = rp.shape[1]
    ev = torch.nan_to_num(reset_e.val.to(rp.dtype), nan=0.0).clamp_(min=0)
    total = rp.sum(0).index_add_(0, reset_e.col, ev)
    valid = total > 0
    norm = torch.where(valid, total, torch.ones_like(total))
    rp.div_(norm)
    ev = ev / norm[reset_e.col]
    lv = graph.leaves
    active = None
    rows = graph.to_entities.shape[0]  # rows of the walk's entity space
    e_rows = reset_e.row
    if lv is not None:
        active = _ActiveLeaves(lv, ColumnEntries(reset_e.row, reset_e.col, ev, (rows, B)))
        e_rows = lv.row[e_rows]
    re = torch.zeros(rows, B, dtype=rp.dtype, device=rp.device).index_put_((e_rows, reset_e.col), ev, accumulate=True)
    d = cfg.damping
    # working set: the reset (wrp, wre), the iterate (xp, xe) and an output buffer pair, columns `cols`
    cols = torch.arange(B, device=rp.device)
    work_of = torch.arange(B, device=rp.device)  # original column -> working column (-1: compacted away)
    wrp, wre = rp, re
    xp, xe = rp.clone(), re.clone()
    bp, be = torch.empty_like(xp), torch.empty_like(xe)
    last = torch.full_like(total, float("inf"))
    running = torch.ones_like(valid)  # over the working columns
    tracked = active is not None and active.e.numel() > 0
    pairs = _LivePairs(active, work_of) if tracked else None
    for _ in range(cfg.ppr_max_iter):
        g = None
        if tracked:
            g = graph.dangling_mass(xp, xe)
            c = (1.0 - d) + d * g
            xp_at = xp[pairs.p, pairs.w]  # gathered before the step scratches xp, xe
            L_old = xe[pairs.bucket, pairs.w]
        for observer in _OBSERVERS:
            observer.before_step(graph, cols)
        change = graph.ppr_step(xp, xe, wrp, wre, d, bp, be, g)
        if tracked:
            change = change + _leaf_correction(active, pairs, xp_at, L_old, be, c, running, d)
        for observer in _OBSERVERS:
            observer.after_step(graph, cols, change)
        xp, bp, xe, be = bp, xp, be, xe  # the new iterate; the old one is scratch
        # the L1 change shrinks by at least d per step in exact arithmetic; once it stops shrinking the
        # column sits at the float rounding floor (about 1e-7 in float32), where more steps change nothing
        stop = running & ((change < cfg.ppr_tol) | (change >= last))
        last = change
        if not bool(stop.any()):
            continue
        # a finished column's reset is no longer needed: its slot takes the result. Until the next
        # compaction the column keeps being iterated (on that slot); what it computes is ignored.
        done = cols[stop]
        rp[:, done] = xp[:, stop]
        re[:, done] = xe[:, stop]
        running = running & ~stop
        n_run = int(running.sum())
        if n_run == 0:
            break
        if n_run <= 3 * running.numel() // 4:  # compact once a quarter of the working set has finished
            k = torch.nonzero(running).flatten()
            wrp, wre = wrp.index_select(1, k), wre.index_select(1, k)  # copies: rp, re slots get written
            # the kept columns move into the scratch buffers' storage; the old iterate's becomes scratch
            xp, bp = torch.index_select(xp, 1, k, out=_head(bp, n_run)), _head(xp, n_run)
            xe, be = torch.index_select(xe, 1, k, out=_head(be, n_run)), _head(xe, n_run)
            work_of.fill_(-1)
            work_of[cols[k]] = torch.arange(n_run, device=rp.device)
            cols, last, running = cols[k], last[k], running[k]
            if tracked:
                pairs = _LivePairs(active, work_of)
    else:
        rp[:, cols[running]] = xp[:, running]  # ppr_max_iter reached
        re[:, cols[running]] = xe[:, running]
    if not entity_scores:
        return rp, None, valid
    if lv is None:
        return rp, re, valid
    return rp, _expand_entities(lv, re, active), valid


class _LivePairs:
    """The tracked leaf pairs whose column is still in the working set, and the grouping the leaf
    correction needs: fixed between two compactions, so computed once per compaction, not per step."""

    def __init__(self, active: _ActiveLeaves, work_of: torch.Tensor):
        w = work_of[active.col]
        live = w >= 0
        self.index = torch.nonzero(live).flatten()  # positions among the tracked pairs
        self.w = w[live]  # working column of each live pair
        self.p, self.bucket = active.p[live], active.bucket[live]
        self.share, self.r = active.share[live], active.r[live]
        self.group = active.group[live]
        first = torch.full((active.n_groups,), -1, dtype=torch.int64, device=w.device)
        first[self.group] = torch.arange(self.group.numel(), device=w.device)
        self.has = first >= 0  # groups with a live pair
        self.rep = first[self.has]  # one live pair of each such group
        self.rep_w = self.w[self.rep]


def _leaf_correction(active: _ActiveLeaves, pairs: _LivePairs, xp_at, L_old, out_e, c, running, d):
    """Per working column: the tracked leaves' part of the L1 change that the bucket rows miss,

        sum over (passage, column) with tracked leaves A of  sum_A |dx_e| + |dL - sum_A dx_e| - |dL|

    (the untracked leaves of a passage all move with sign(dL - sum_A dx_e)); advances the tracked x_e."""
    keep = running[pairs.w]  # columns that already stopped keep their leaves' values
    x_new = d * pairs.share * xp_at + c[pairs.w] * pairs.r
    dx = x_new - active.x[pairs.index]
    dL = out_e[pairs.bucket, pairs.w] - L_old
    n = active.n_groups
    sum_dx = torch.zeros(n, dtype=dx.dtype, device=dx.device).index_add_(0, pairs.group, dx)
    sum_abs = torch.zeros(n, dtype=dx.dtype, device=dx.device).index_add_(0, pairs.group, dx.abs())
    dLg = dL[pairs.rep]
    corr = sum_abs[pairs.has] + (dLg - sum_dx[pairs.has]).abs() - dLg.abs()
    change = torch.zeros(running.numel(), dtype=dx.dtype, device=dx.device).index_add_(0, pairs.rep_w, corr)
    idx = pairs.index[keep]
    active.x[idx] = x_new[keep]
    active.final[idx] = x_new[keep]
    return change


def _head(buf: torch.Tensor, cols: int) -> torch.Tensor:
    """A contiguous [rows, cols] view on the start of ``buf``'s storage (rows = buf.shape[0])."""
    return buf.view(-1)[: buf.shape[0] * cols].view(buf.shape[0], cols)
