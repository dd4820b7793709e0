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
proportion to its weight, so it does not pull in its whole neighbourhood for a little mass). The rounds run in
kernels/push.py: on CPU tensors with numba, one compiled loop per question over arrays of the nodes kept between
calls and reset at the nodes it touched; elsewhere (a GPU) one table of the batch's touched (question, node) pairs
sorted by key ``b * N + node`` (N = P + E), with no loop over questions. Either way a question's work is its
pushes, not the corpus. When no
residual exceeds its threshold (r_u <= eps str(u) for every u), for every node v

    0 <= y_v - p_v <= eps * str(v),    sum_v (y_v - p_v) = sum_u r_u

(the walk is reversible: str(u) PPR_u(v) = str(v) PPR_v(u)); a passage has strength 1 (C's rows sum to 1;
plus its adjacent passages' weights), so every passage score is within eps / (1 - d r(dangling)) of eq. 6's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import RetrievalConfig
from ..index.csr import Csr
from ..kernels.push import coalesce, forward_push


@dataclass
class PushGraph:
    """The walk of eq. 6 as one CSR over the P + E nodes (passages first), for the forward push.

    crow, col [N + 1], [nnz]: each node's neighbours; val [nnz] float32: w[u, v] / str(u) (row u);
    strength [N] float32: str(u) (0 for an isolated node, which is always pushed); workspace: what the push keeps
    between calls (kernels.push.forward_push)."""

    crow: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    strength: torch.Tensor
    num_passages: int
    workspace: dict = field(default_factory=dict, repr=False, compare=False)

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
    keys, r = coalesce(keys, vals)
    col = torch.div(keys, N, rounding_mode="floor")
    total = torch.zeros(batch, dtype=torch.float32, device=dev).index_add_(0, col, r)
    valid = total > 0
    r.div_(torch.where(valid, total, torch.ones_like(total))[col])
    node = keys - col * N
    # eq. 6's x = y / (1 - d * reset mass on isolated nodes): their walk returns to the reset
    isolated = graph.strength.index_select(0, node) == 0
    lost = torch.zeros(batch, dtype=torch.float32, device=dev).index_add_(0, col[isolated], r[isolated])
    scale = 1.0 / (1.0 - d * lost)
    indices, values, (rounds, touched, touched_passages, pushed) = forward_push(
        graph.crow, graph.col, graph.val, graph.strength, keys, r, P, batch, d, float(cfg.ppr_eps),
        int(cfg.ppr_max_iter), k, graph.workspace)
    values.mul_(scale[:, None])
    if stats is not None:
        stats.append(PushStats(rounds, touched, touched_passages, pushed, batch))
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
