"""Stage 2, global importance aggregation: passage reset weights (eq. 7) and personalized
PageRank (eq. 6) by batched block Gauss-Seidel iteration over the passage-entity graph."""
from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .. import kernels
from ..config import RetrievalConfig
from ..index.csr import Csr
from .activation import ColumnEntries


def minmax(x: torch.Tensor, comm=None) -> torch.Tensor:
    """Min-max normalise each column of [P, B] to [0, 1] (a constant column becomes 0). ``comm``
    (runtime.comm.Comm): the extremes over every rank's rows (the part's passages of a sharded index)."""
    # amin / amax, not min / max: those also find the indices, which on a CPU made the pass along the strided
    # passage axis 17x slower (7.5 against 0.44 ms a question at 1M passages, 1 thread)
    lo, hi = x.amin(dim=0, keepdim=True), x.amax(dim=0, keepdim=True)
    if comm is not None and comm.world > 1:
        ext = comm.all_reduce(torch.cat([-lo, hi]), "max")
        lo, hi = -ext[:1], ext[1:]
    span = hi - lo
    return torch.where(span > 0, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(x))


def passage_reset_entries(sim: torch.Tensor, N_logT: Csr, act_over_tier: ColumnEntries, cfg: RetrievalConfig,
                          comm=None):
    """Eq. 7 from the active (entity, question) pairs with their act_e / L_e (kernels.spmm_sparse_rhs); with
    cfg.reset_passages, the dense term only on each question's top passages (top_passages). ``comm``: the
    min-max over every rank's passages (a shard's ``sim`` holds its own; one process: None or the identity)."""
    z = torch.zeros_like(sim)
    a = act_over_tier
    kernels.spmm_sparse_rhs(N_logT.crow, N_logT.col, N_logT.val, a.row, a.col, a.val, z)
    return _finish_reset(sim, z, cfg, comm)


def _finish_reset(sim, z, cfg, comm=None):
    """Eq. 7 from the cosines (or a later round's prior) and z = sum_e act_e ln(1 + N_ep) / L_e."""
    if cfg.reset_passages:
        idx, val = top_passages(sim, cfg.reset_passages, cfg.reset_minmax)
        dense = torch.zeros_like(sim).scatter_(0, idx, val)
        return (cfg.lam * dense + torch.log1p_(z)) * cfg.passage_node_weight
    return (cfg.lam * minmax(sim, comm) + torch.log1p_(z)) * cfg.passage_node_weight


def top_passages(sim: torch.Tensor, m: int, norm: str = "global"):
    """Eq. 7's min-max normalised cosine on each question's ``m`` passages of highest cosine only (the sparse
    reset, RetrievalConfig.reset_passages): one top-k over the [P, B] cosines.

    Parameters
    ----------
    sim : torch.Tensor
        [P, B] cosines (or a later round's prior).
    m : int
        Passages kept per question (at most P).
    norm : {"global", "top"}
        Min-max over all passages, or over the kept ones (the m-th then gets 0).

    Returns
    -------
    indices : torch.Tensor
        int64 [min(m, P), B]: the passages, by descending cosine.
    values : torch.Tensor
        [min(m, P), B]: their normalised cosines, in [0, 1] (0 in a column whose cosines are all equal).
    """
    m = min(int(m), sim.shape[0])
    # each question's cosines made contiguous first: a top-k along the strided passage axis took 11.3 ms a
    # question at 1M passages (1 thread), the copy and a top-k along rows 5.6 (the same passages, ties alike)
    top, idx = torch.topk(sim.T.contiguous(), m, dim=1)
    top, idx = top.T.contiguous(), idx.T.contiguous()
    hi = top[:1]
    lo = top[-1:] if norm == "top" else sim.amin(dim=0, keepdim=True)
    span = hi - lo
    ok = span > 0
    val = torch.where(ok, (top - lo) / torch.where(ok, span, torch.ones_like(span)), torch.zeros_like(top))
    return idx, val


def sparse_reset_entries(sim: torch.Tensor, N_logT: Csr, act_over_tier: ColumnEntries, cfg: RetrievalConfig,
                         at_least: int = 0) -> ColumnEntries:
    """Eq. 7 as index lists, for the local PageRank: the dense term on each question's top
    max(cfg.reset_passages, at_least) passages (every passage when reset_passages is 0), the entity term on
    the passages holding its active entities (entries repeat a passage: the consumer sums them; the sum is
    eq. 7's value, the two terms being added after the logarithm). Nothing of size [P, B] but ``sim``."""
    P, B = sim.shape
    m = max(cfg.reset_passages, at_least) if cfg.reset_passages else P
    idx, val = top_passages(sim, m, cfg.reset_minmax if cfg.reset_passages else "global")
    cols = torch.arange(B, device=sim.device).expand(idx.shape[0], B)
    zp, zb, zv = entity_reset_terms(N_logT, act_over_tier, P, cfg, sim.dtype)
    w = cfg.passage_node_weight
    return ColumnEntries(torch.cat([idx.reshape(-1), zp]), torch.cat([cols.reshape(-1), zb]),
                         torch.cat([(cfg.lam * w) * val.reshape(-1), zv]), (P, B))


def entity_reset_terms(N_logT: Csr, act_over_tier: ColumnEntries, P: int, cfg: RetrievalConfig, dtype):
    """Eq. 7's entity term as index lists: (passage, question, W_p * ln(1 + sum_e ln(1 + N[p, e]) * act_e / L_e))
    on the passages of each question's active entities, one entry per (passage, question)."""
    a = act_over_tier
    owner, pos, _ = kernels.segment_positions(N_logT.crow, a.row)
    keys = a.col.index_select(0, owner) * P + N_logT.col.index_select(0, pos).to(torch.int64)
    z = N_logT.val.index_select(0, pos).to(dtype) * a.val.to(dtype).index_select(0, owner)
    zk, inv = torch.unique(keys, return_inverse=True)
    zv = torch.zeros(zk.numel(), dtype=dtype, device=keys.device).index_add_(0, inv, z)
    return zk % P, torch.div(zk, P, rounding_mode="floor"), torch.log1p_(zv).mul_(cfg.passage_node_weight)


@dataclass
class Leaves:
    """The entities of degree 1 (one passage, weight > 0), merged into one node per passage.

    A leaf entity e of passage p only trades mass with p: it receives d * w[p, e] / str(p) * x_p and
    gives all of its mass back to p. Its passage sees only the sum of its leaves' mass, so the walk runs
    on one "bucket" node per passage holding that sum (to_entities weight share_p = sum of the leaves'
    w / str(p), to_passages weight 1). In a call, the leaves with reset mass get rows of their own
    (_SplitLeaves); the others' values and their part of the L1 change follow exactly from the bucket.
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

    def column_totals(self, x: torch.Tensor) -> torch.Tensor:
        """Each column's sum over the passages [B] (a sharded walk sums over every rank's)."""
        return x.sum(0)

    def for_call(self, e: torch.Tensor, col: torch.Tensor, ev: torch.Tensor, rp: torch.Tensor) -> "WalkCall":
        """The operator of one personalized_pagerank call with the entity reset entries (entity ``e``, column
        ``col``, normalised value ``ev``): with leaves, those carrying reset mass split out of their buckets
        (_SplitLeaves); the entity reset on the operator's rows."""
        lv, split, walk, rows = self.leaves, None, self, e
        if lv is not None:
            rows = lv.row.index_select(0, e)
            with_reset = lv.is_leaf.index_select(0, e) & (ev > 0)
            # leaves with reset mass get rows of their own; which operator to run is read once per call
            if bool(with_reset.any()):
                split = _SplitLeaves(self, e[with_reset])
                rows[with_reset] = split.rows_of_given
                walk = split.walk
        re = torch.zeros(walk.to_entities.shape[0], rp.shape[1], dtype=rp.dtype, device=rp.device).index_put_(
            (rows, col), ev.to(rp.dtype), accumulate=True)
        expand = None if lv is None else (lambda x: _expand_entities(lv, x, split))
        return WalkCall(walk, re, expand)

    def ppr_step(self, xp, xe, rp, re, damping: float, out_p, out_e, joint: tuple | None = None,
                 cols: torch.Tensor | None = None) -> torch.Tensor:
        """kernels.ppr_step on this operator's tensors (see there); returns the L1 change per column. ``cols``
        (the call's column of each working column) is for walks that keep per-column state; unused here."""
        return kernels.ppr_step(self.to_passages, self.to_entities, self.between_passages, self.dangling_passage_idx,
                                self.dangling_entity_idx, xp, xe, rp, re, damping, out_p, out_e, self.workspace, joint)


@dataclass
class WalkCall:
    """What one personalized_pagerank call runs on (PPRGraph.for_call, or a shard's walk): ``walk`` has ppr_step,
    ``re`` is the entity reset on its rows [R, B], ``expand`` maps the final entity rows to [E, B] entity scores
    (None: the rows are the entities)."""

    walk: object
    re: torch.Tensor
    expand: object = None

    def entity_scores(self, re: torch.Tensor) -> torch.Tensor:
        return re if self.expand is None else self.expand(re)


@dataclass
class PPRStep:
    """One step of a personalized_pagerank call (StepLog)."""

    walk: PPRGraph  # the operator it ran on: the call's graph, or its copy with the reset's leaves split out
    columns: torch.Tensor  # [n] int64: the call's batch column of each working column (stopped ones have left)
    change: torch.Tensor  # [n]: the step's L1 change per working column, that of the full graph
    start: object  # time.perf_counter() seconds, or a torch.cuda.Event on a GPU
    end: object


class StepLog:
    """The steps of the personalized_pagerank calls it is passed to (``steps=``), in order: what engine.retrieve
    returns in Trace.ppr_steps (every graph round of a batch), and what tests read the changes from. Recording
    reads nothing back to the host: a step's marks are time.perf_counter() on the CPU, CUDA events on a GPU."""

    def __init__(self):
        self.steps: list[PPRStep] = []
        self.pushes: list = []  # local_ppr.PushStats of every local PageRank call (ppr_mode="local")
        self.stage_s: dict = {}  # seconds per part of a graph round (round.one_chunk; host clock, no sync)

    @contextmanager
    def stage(self, name: str):
        """Add the block's seconds to stage_s[name] (time.perf_counter: on a GPU, the launches' time)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.stage_s[name] = self.stage_s.get(name, 0.0) + time.perf_counter() - t

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    def step(self, walk: PPRGraph, cols: torch.Tensor, *args) -> torch.Tensor:
        """walk.ppr_step(*args), recorded with its time marks; returns the L1 change."""
        cuda = walk.dangling_passages.device.type == "cuda"
        start = _mark(cuda)
        change = walk.ppr_step(*args, cols)
        self.steps.append(PPRStep(walk, cols, change, start, _mark(cuda)))
        return change

    def seconds(self) -> list:
        """Each step's seconds (on a GPU, this waits for the device)."""
        out = []
        for st in self.steps:
            if isinstance(st.start, float):
                out.append(st.end - st.start)
            else:
                st.end.synchronize()
                out.append(st.start.elapsed_time(st.end) / 1e3)
        return out

    def changes(self, batch: int) -> list:
        """Each step's L1 change as a [batch] tensor over the call's columns (NaN for the columns no longer
        iterated)."""
        out = []
        for st in self.steps:
            full = torch.full((batch,), float("nan"), dtype=st.change.dtype, device=st.change.device)
            out.append(full.index_copy_(0, st.columns, st.change))
        return out


def _mark(cuda: bool):
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


class _SplitLeaves:
    """The walk of one call with the leaves that carry reset mass (in any column) taken out of their
    passage buckets, each on a row of its own after the graph's rows (R + j, ordered by passage).

    Every leaf left in a bucket has no reset in any column, so after the first step it holds
    d * share * x_p in each column (x_p the step's new passage value): the leaves of a bucket move together, and the bucket row holds
    exactly their mass. The walk, its L1 change (sum of |change| over the rows) and the entity scores
    are then those of the full graph with no per-step correction; the operator is built once per call.
    """

    def __init__(self, graph: PPRGraph, leaf_entities: torch.Tensor):
        lv = graph.leaves
        tp, te = graph.to_passages, graph.to_entities
        P, R = tp.shape[0], te.shape[0]
        dev = leaf_entities.device
        uniq, inv = torch.unique(leaf_entities, return_inverse=True)
        order = torch.argsort(lv.passage[uniq], stable=True)
        rank = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel(), device=dev))
        self.rows_of_given = R + rank[inv]  # the walk row of each entry of leaf_entities
        e = self.e = uniq[order]  # the split leaves, by passage
        k = self.k = e.numel()
        self.R = R
        p, share, bucket = lv.passage[e], lv.share[e], lv.row[e]
        # what stays in each touched bucket: its other leaves' shares (by_passage), 0 when all are split
        self.buckets, first = torch.unique(bucket, return_inverse=True)
        bp = torch.empty(self.buckets.numel(), dtype=torch.int64, device=dev).index_copy_(0, first, p)
        owner, pos, _ = kernels.segment_positions(lv.by_passage.crow, bp)
        stays = ~torch.isin(lv.by_passage.col[pos], e)
        self.rest = torch.zeros(self.buckets.numel(), dtype=lv.share.dtype, device=dev).index_add_(
            0, owner[stays], lv.by_passage.val[pos][stays].to(lv.share.dtype))
        # to_entities: a bucket row has one entry (its passage), now the rest; then one row per split leaf
        crow, col, val = te.crow_indices(), te.col_indices(), te.values().clone()
        val[crow[self.buckets].long()] = self.rest.to(val.dtype)
        ar = torch.arange(1, k + 1, device=dev)
        to_entities = _csr(torch.cat([crow, crow[-1] + ar.to(crow.dtype)]), torch.cat([col, p.to(col.dtype)]),
                           torch.cat([val, share.to(val.dtype)]), (R + k, P))
        # to_passages: each passage's split leaves appended to its row (column R + j, weight 1)
        crow, col, val = tp.crow_indices(), tp.col_indices(), tp.values()
        key = ("split_leaves", "to_passages rows")
        if key not in graph.workspace:
            graph.workspace[key] = torch.repeat_interleave(torch.arange(P, device=dev), (crow[1:] - crow[:-1]).long())
        before = torch.zeros(P + 1, dtype=torch.int64, device=dev)
        torch.cumsum(torch.bincount(p, minlength=P), 0, out=before[1:])  # new entries in the rows before
        pos_old = torch.arange(col.numel(), device=dev) + before[graph.workspace[key]]
        pos_new = crow[p + 1].long() + torch.arange(k, device=dev)
        col2 = torch.empty(col.numel() + k, dtype=col.dtype, device=dev)
        col2[pos_old], col2[pos_new] = col, (R + ar - 1).to(col.dtype)
        val2 = torch.empty(col.numel() + k, dtype=val.dtype, device=dev)
        val2[pos_old], val2[pos_new] = val, 1.0
        to_passages = _csr(crow + before.to(crow.dtype), col2, val2, (P, R + k))
        self.walk = PPRGraph(to_passages, to_entities, graph.between_passages, graph.dangling_passages,
                             torch.cat([graph.dangling_entities, graph.dangling_entities.new_zeros(k)]),
                             graph.dangling_passage_idx, graph.dangling_entity_idx)


def _csr(crow, col, val, shape) -> torch.Tensor:
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, size=shape)


def _expand_entities(lv: Leaves, xe_rows: torch.Tensor, split: _SplitLeaves | None) -> torch.Tensor:
    """Entity scores [E, B] from the walk's entity rows: a split leaf has its own row; a leaf left in
    its passage's bucket gets the bucket's mass in proportion to its share among the leaves left there."""
    out = xe_rows.index_select(0, lv.row)
    leaf = torch.nonzero(lv.is_leaf).flatten()
    left = lv.bucket_share
    if split is not None:
        left = left.clone()
        left[split.buckets] = split.rest
    scale = torch.where(left > 0, 1.0 / left, torch.zeros_like(left))
    out[leaf] *= (lv.share[leaf] * scale[lv.row[leaf]])[:, None]
    if split is not None:
        out[split.e] = xe_rows[split.R:split.R + split.k]
    return out


# The stop rule's second test: a column whose L1 change stops shrinking while below this sits at the float
# rounding floor (a tolerance below it would otherwise run to ppr_max_iter). Only there: a Gauss-Seidel
# step's change need not shrink while it is large (on random graphs with dangling nodes or adjacent passages
# it grew at changes of 8e-3 to 0.4, early on; from 1e-3 down to 1e-6 it never did, over 600 random
# graphs: tests/retrieval/test_equations.py), unlike the power iteration's, which shrinks by d per step.
FLOOR_RULE_BELOW = 1e-4


def personalized_pagerank(graph: PPRGraph, reset_p: torch.Tensor, reset_e: torch.Tensor, cfg: RetrievalConfig,
                          entity_scores: bool = True, steps: StepLog | None = None):
    """Eq. 6, batched: the fixed point of x = (1 - d) r + d (walk(x) + dangling(x) r), by block Gauss-Seidel
    steps (kernels.ppr_step: the passages, then the entities from the new passage values; about half the
    steps of the power iteration for the same tolerance).

    A question stops when its L1 change is below cfg.ppr_tol, or when the change stops shrinking below
    FLOOR_RULE_BELOW (a tolerance below the dtype's rounding floor would otherwise run to ppr_max_iter); it keeps the
    iterate of that step. Each step is kernels.ppr_step on the working columns (recorded in ``steps``,
    a StepLog, when given); a column that stops is
    written out at once and dropped from the working set at the next compaction (when a quarter of it
    has stopped), so late iterations cost only what is left. With graph.leaves the walk runs on the
    merged leaf buckets, the leaves with reset mass on rows of their own (_SplitLeaves, built once per
    call, so a step is kernels.ppr_step alone); the change and (with ``entity_scores``) the entity
    scores are those of the full graph (see Leaves).

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
    total = graph.column_totals(rp).index_add_(0, reset_e.col, ev)
    valid = total > 0
    norm = torch.where(valid, total, torch.ones_like(total))
    rp.div_(norm)
    call = graph.for_call(reset_e.row, reset_e.col, ev / norm[reset_e.col], rp)
    walk, re = call.walk, call.re  # the operator the steps run on, and the entity reset on its rows
    d = cfg.damping
    # working set: the reset (wrp, wre), the iterate (xp, xe) and an output buffer pair, columns `cols`
    cols = torch.arange(B, device=rp.device)
    wrp, wre = rp, re
    if B == 1:  # one question: the same stop rule on Python floats (no tensor bookkeeping per step)
        x = _one_column(walk, rp, re, d, cfg, steps)
        rp, re = x[:rp.shape[0]], x[rp.shape[0]:]
        return rp, call.entity_scores(re) if entity_scores else None, valid
    xp, xe = rp.clone(), re.clone()
    bp, be = torch.empty_like(xp), torch.empty_like(xe)
    last = torch.full_like(total, float("inf"))
    running = torch.ones_like(valid)  # over the working columns
    n_run = B
    for _ in range(cfg.ppr_max_iter):
        change = _step(walk, cols, xp, xe, wrp, wre, d, bp, be, None, steps)
        xp, bp, xe, be = bp, xp, be, xe  # the new iterate; the old one is scratch
        # below FLOOR_RULE_BELOW a change that stops shrinking means the column sits at the float rounding
        # floor (about 1e-7 in float32), where more steps change nothing (see FLOOR_RULE_BELOW)
        stop = (change < cfg.ppr_tol).logical_or_((change >= last).logical_and_(change < FLOOR_RULE_BELOW))
        stop.logical_and_(running)
        last = change
        still = running & ~stop
        # the convergence test: the one value a step reads back to the host (columns still running)
        n_still = int(still.sum())
        if n_still == n_run:
            continue
        # a finished column's reset is no longer needed: its slot takes the result. Until the next
        # compaction the column keeps being iterated (on that slot); what it computes is ignored.
        done = cols[stop]
        rp[:, done] = xp[:, stop]
        re[:, done] = xe[:, stop]
        running, n_run = still, n_still
        if n_run == 0:
            break
        if n_run <= 3 * running.numel() // 4:  # compact once a quarter of the working set has finished
            k = torch.nonzero(running).flatten()
            wrp, wre = wrp.index_select(1, k), wre.index_select(1, k)  # copies: rp, re slots get written
            # the kept columns move into the scratch buffers' storage; the old iterate's becomes scratch
            xp, bp = torch.index_select(xp, 1, k, out=_head(bp, n_run)), _head(xp, n_run)
            xe, be = torch.index_select(xe, 1, k, out=_head(be, n_run)), _head(xe, n_run)
            cols, last, running = cols[k], last[k], running[k]
    else:
        rp[:, cols[running]] = xp[:, running]  # ppr_max_iter reached
        re[:, cols[running]] = xe[:, running]
    return rp, call.entity_scores(re) if entity_scores else None, valid


def _one_column(walk: PPRGraph, rp, re, d: float, cfg: RetrievalConfig, steps: StepLog | None = None) -> torch.Tensor:
    """personalized_pagerank's loop for a batch of one column: the step and the stop rule are the same (the
    tolerance compared in the iterate's dtype, as the tensor comparison does), decided on Python floats.
    The iterate and its buffer each hold the passages and then the entity rows, so that a step takes its L1
    change in one pass (kernels.ppr_step's ``joint``). Returns the final iterate [P + E', 1]."""
    P = rp.shape[0]
    tol = float(torch.tensor(cfg.ppr_tol, dtype=rp.dtype))
    cols = torch.zeros(1, dtype=torch.int64, device=rp.device)
    x = torch.cat([rp, re])
    buf = torch.empty_like(x)
    xs, bs = (x, x[:P], x[P:]), (buf, buf[:P], buf[P:])  # (whole, passages, entities)
    last = float("inf")
    for _ in range(cfg.ppr_max_iter):
        change = _step(walk, cols, xs[1], xs[2], rp, re, d, bs[1], bs[2], (xs[0], bs[0]), steps)
        xs, bs = bs, xs
        c = float(change)
        if c < tol or (c >= last and c < FLOOR_RULE_BELOW):
            break
        last = c
    return xs[0]


def _step(walk: PPRGraph, cols, xp, xe, rp, re, d: float, bp, be, joint=None, steps: StepLog | None = None):
    """walk.ppr_step (into bp, be), recorded in ``steps`` when given; returns the L1 change."""
    if steps is None:
        return walk.ppr_step(xp, xe, rp, re, d, bp, be, joint, cols)
    return steps.step(walk, cols, xp, xe, rp, re, d, bp, be, joint)


def _head(buf: torch.Tensor, cols: int) -> torch.Tensor:
    """A contiguous [rows, cols] view on the start of ``buf``'s storage (rows = buf.shape[0])."""
    return buf.view(-1)[: buf.shape[0] * cols].view(buf.shape[0], cols)
