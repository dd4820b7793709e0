"""Local personalized PageRank (eq. 6, ``RetrievalConfig.ppr_mode="local"``): a batched forward push
(Andersen, Chung and Lang 2006) over the undirected passage-entity graph, whose work per question is
bounded by its residual threshold, not by the corpus; and eq. 7's sparse passage reset, as index lists.

The walk is the one of pagerank.py (and scipy_backend.transition_matrix): nodes are the P passages and then
the E entities; w[p, e] = C[p, e] (and weight 1 between passages i and i + 1 with adjacent_passages); the
walk from u to v has probability w[u, v] / str(u), str(u) the sum of u's weights; a node of strength 0
(isolated: dangling) sends its walk back to the reset r. Eq. 6's fixed point x = (1 - d) r + d (W x +
(sum of x over dangling nodes) r) is then y / (1 - d * r(dangling)), y the PageRank of the walk without the
dangling term, y = (1 - d) (I - d W)^-1 r (docs/METHOD.md, beside eq. 6): the push computes y.

A push of node u in question b moves (1 - d) r_u into the estimate p_u and d r_u w[u, v] / str(u) into the
residual of each neighbour v; a round pushes, for every question at once, every node whose residual
exceeds ``eps * str(u)`` (degree-normalised: a hub entity is pushed only once its residual is large in
proportion to its weight, so it does not pull in its whole neighbourhood for a little mass). The state of
a batch is one table sorted by key ``b * N + node`` (N = P + E) with the residual and the estimate of each
(question, node) pair touched: no array of the corpus's size per question, no loop over questions. When no
residual exceeds its threshold (r_u <= eps str(u) for every u), for every node v

    0 <= y_v - p_v <= eps * str(v),    sum_v (y_v - p_v) = sum_u r_u

(the walk is reversible: str(u) PPR_u(v) = str(v) PPR_v(u)); a passage has strength 1 (C's rows sum to 1;
plus its adjacent passages' weights), so every passage score is within eps / (1 - d r(dangling)) of eq. 6's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import RetrievalConfig
from ..index.csr import Csr
from ..kernels import segment_positions


@dataclass
class PushGraph:
    """The walk of eq. 6 as one CSR over the P + E nodes (passages first), for the forward push.

    crow, col [N + 1], [nnz]: each node's neighbours; val [nnz] float32: w[u, v] / str(u) (row u);
    strength [N] float32: str(u) (0 for an isolated node, which is always pushed)."""

    crow: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    strength: torch.Tensor
    num_passages: int

    @property
    def num_nodes(self) -> int:
        """P + E."""
        return self.strength.numel()

    @staticmethod
    def build(C: Csr, adjacent_passages: bool = False, device="cpu") -> "PushGraph":
        """The walk of the passage-entity graph ``C`` [P, E] (and of passage i to i + 1 with
        ``adjacent_passages``), as pagerank.PPRGraph.build and scipy_backend.transition_matrix define it.

        Parameters
        ----------
        C : Csr
            The index's passage-entity weights (TriGraphIndex.C).
        adjacent_passages : bool
            Also link passage i to passage i + 1 with weight 1.
        device : str or torch.device
            Where the tensors live.

        Returns
        -------
        PushGraph
            The walk, on ``device``.
        """
        C = C.to("cpu")
        P, E = C.shape
        rows = C.row_index()
        r = [rows, C.col + P]
        c = [C.col + P, rows]
        v = [C.val.double(), C.val.double()]
        if adjacent_passages and P > 1:
            i = torch.arange(P - 1)
            r += [i, i + 1]
            c += [i + 1, i]
            v += [torch.ones(P - 1, dtype=torch.float64)] * 2
        r, c, v = torch.cat(r), torch.cat(c), torch.cat(v)
        strength = torch.zeros(P + E, dtype=torch.float64).index_add_(0, r, v)
        inv = torch.where(strength > 0, 1.0 / strength, torch.zeros_like(strength))
        A = Csr.from_coo(r, c, (v * inv[r]).float(), (P + E, P + E))
        return PushGraph(A.crow.to(device), A.col.to(device), A.val.to(device), strength.float().to(device), P)


@dataclass
class PushStats:
    """What one local_pagerank call did: ``rounds`` of pushes, ``touched`` (question, node) pairs in its table
    at the end, ``pushed`` neighbour updates over all rounds, for ``columns`` questions (host numbers: sizes
    of tensors, read without a device sync)."""

    rounds: int
    touched: int
    touched_passages: int
    pushed: int
    columns: int


def _coalesce(keys: torch.Tensor, *values: torch.Tensor):
    """Sorted distinct keys and each value summed over equal keys."""
    uniq, inv = torch.unique(keys, return_inverse=True)
    return (uniq, *(torch.zeros(uniq.numel(), dtype=v.dtype, device=v.device).index_add_(0, inv, v)
                    for v in values))


def _merge(table: list, ck: torch.Tensor, cv: torch.Tensor, N: int, strength: torch.Tensor, eps: float) -> list:
    """Add the residuals ``cv`` at keys ``ck`` to the sorted table [keys, r, p, thr]: summed at
    the keys already there, the new keys merged in by their ranks (one sort of the contributions, binary
    searches of sorted keys and a running count; no sort of the table). Returns the table (new arrays when
    it grew)."""
    keys, r, p, thr = table
    ck, cv = _coalesce(ck, cv)
    T = keys.numel()
    if T:
        pos = torch.searchsorted(keys, ck)
        found = keys.index_select(0, pos.clamp(max=T - 1)) == ck
        hit = torch.nonzero(found).flatten()
        r.index_add_(0, pos.index_select(0, hit), cv.index_select(0, hit))
        fresh = torch.nonzero(~found).flatten()
        if fresh.numel() == 0:
            return table
        nk, nv, ins = ck.index_select(0, fresh), cv.index_select(0, fresh), pos.index_select(0, fresh)
    else:
        nk, nv, ins = ck, cv, torch.zeros_like(ck)
    n = nk.numel()
    dev = keys.device
    # a new key goes before the old key at its insertion point; an old key moves by the new keys before it
    at_new = torch.arange(n, device=dev) + ins
    at_old = torch.arange(T, device=dev) + torch.cumsum(torch.bincount(ins, minlength=T + 1)[:T], 0)
    out = []
    for old, new in ((keys, nk), (r, nv), (p, torch.zeros_like(nv)), (thr, strength.index_select(0, nk % N) * eps)):
        t = torch.empty(T + n, dtype=old.dtype, device=dev)
        t[at_old], t[at_new] = old, new
        out.append(t)
    return out


def local_pagerank(graph: PushGraph, reset_p, reset_e, batch: int, cfg: RetrievalConfig, k: int,
                   stats: list | None = None):
    """Eq. 6 for a batch by forward push, and each question's top ``k`` passages (module docstring).

    Parameters
    ----------
    graph : PushGraph
        The walk.
    reset_p, reset_e : ColumnEntries
        The reset's passage and entity entries (row: passage or entity, col: question in [0, batch), val:
        weight); NaN and negatives count as 0, repeats are summed, each question's reset is normalised to sum 1.
    batch : int
        Questions (columns).
    cfg : RetrievalConfig
        ``damping``, ``ppr_eps`` (the threshold per unit of strength) and ``ppr_max_iter`` (a cap on rounds).
    k : int
        Passages returned per question (at most the passages the question touched; see Returns).
    stats : list or None
        A PushStats of the call is appended when given.

    Returns
    -------
    indices : torch.Tensor
        int64 [batch, k]: each question's passages by descending score, equal scores by lower index; -1 past
        the passages it touched.
    values : torch.Tensor
        float32 [batch, k]: their scores, eq. 6's x_p within the bound of the module docstring (0 past the end).
    valid : torch.Tensor
        bool [batch]: False where the reset sums to 0 (the caller falls back to dense retrieval).
    """
    dev = graph.crow.device
    N, P = graph.num_nodes, graph.num_passages
    d = float(cfg.damping)
    keys = torch.cat([reset_p.col * N + reset_p.row, reset_e.col * N + (reset_e.row + P)])
    vals = torch.nan_to_num(torch.cat([reset_p.val.float(), reset_e.val.float()]), nan=0.0).clamp_(min=0)
    keys, r = _coalesce(keys, vals)
    col = torch.div(keys, N, rounding_mode="floor")
    total = torch.zeros(batch, dtype=torch.float32, device=dev).index_add_(0, col, r)
    valid = total > 0
    r.div_(torch.where(valid, total, torch.ones_like(total))[col])
    node = keys - col * N
    # eq. 6's x = y / (1 - d * reset mass on isolated nodes): their walk returns to the reset
    isolated = graph.strength.index_select(0, node) == 0
    lost = torch.zeros(batch, dtype=torch.float32, device=dev).index_add_(0, col[isolated], r[isolated])
    scale = 1.0 / (1.0 - d * lost)
    table = [keys, r, torch.zeros_like(r), graph.strength.index_select(0, node) * cfg.ppr_eps]
    rounds = pushed = 0
    for rounds in range(1, cfg.ppr_max_iter + 1):
        keys, r, p, thr = table
        act = torch.nonzero(r > thr).flatten()
        # what a round reads back to the host (a sync on a GPU): how many (question, node) pairs it pushes; the
        # merge's index lists add two more; none of them grows with the batch
        if act.numel() == 0:
            break
        ar = r.index_select(0, act)
        p.index_add_(0, act, ar * (1.0 - d))
        r.index_fill_(0, act, 0.0)
        ak = keys.index_select(0, act)
        acol = torch.div(ak, N, rounding_mode="floor")
        owner, pos, _ = segment_positions(graph.crow, ak - acol * N)
        if pos.numel():
            pushed += pos.numel()
            ck = acol.index_select(0, owner) * N + graph.col.index_select(0, pos)
            cv = ar.index_select(0, owner).mul_(graph.val.index_select(0, pos)).mul_(d)
            table = _merge(table, ck, cv, N, graph.strength, cfg.ppr_eps)
    else:
        rounds = cfg.ppr_max_iter
    keys, r, p, thr = table
    col = torch.div(keys, N, rounding_mode="floor")
    node = keys - col * N
    # the top k passages of each question among those it touched
    is_p = node < P
    pc, pn = col[is_p], node[is_p]
    ps = p[is_p] * scale.index_select(0, pc)
    order = torch.argsort(ps, descending=True, stable=True)  # entries are by (question, passage): ties keep it
    order = order.index_select(0, torch.argsort(pc.index_select(0, order), stable=True))
    pc, pn, ps = pc.index_select(0, order), pn.index_select(0, order), ps.index_select(0, order)
    count = torch.bincount(pc, minlength=batch)
    rank = torch.arange(pc.numel(), device=dev) - (torch.cumsum(count, 0) - count).index_select(0, pc)
    keep = rank < k
    indices = torch.full((batch, k), -1, dtype=torch.int64, device=dev)
    values = torch.zeros((batch, k), dtype=torch.float32, device=dev)
    indices[pc[keep], rank[keep]] = pn[keep]
    values[pc[keep], rank[keep]] = ps[keep]
    if stats is not None:
        stats.append(PushStats(rounds, keys.numel(), pc.numel(), pushed, batch))
    return indices, values, valid


def local_scores(graph: PushGraph, reset, batch: int, cfg: RetrievalConfig) -> torch.Tensor:
    """Dense [P + E, batch] scores of the push for every node (eq. 6's normalisation): for tests and small
    graphs only (it forms the corpus-sized matrix the push avoids).

    Parameters
    ----------
    graph : PushGraph
        The walk.
    reset : ColumnEntries
        The whole reset over the P + E nodes (row: node, passages first; col: question; val: weight).
    batch : int
        Questions.
    cfg : RetrievalConfig
        As for local_pagerank.

    Returns
    -------
    torch.Tensor
        float32 [P + E, batch] (zeros in a column whose reset sums to 0).
    """
    from .activation import ColumnEntries

    n = graph.num_nodes
    every = PushGraph(graph.crow, graph.col, graph.val, graph.strength, n)  # every node ranked like a passage
    none = ColumnEntries(reset.row[:0], reset.col[:0], reset.val[:0], (0, batch))
    idx, val, _ = local_pagerank(every, reset, none, batch, cfg, n)
    dense = torch.zeros(n, batch, dtype=torch.float32, device=graph.crow.device)
    b = torch.arange(batch, device=dense.device)[:, None].expand_as(idx)
    ok = idx >= 0
    dense[idx[ok], b[ok]] = val[ok]
    return dense
