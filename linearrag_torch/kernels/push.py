"""The forward push of the local PageRank (retrieval/local_ppr.py): rounds of pushes for a batch, and each
question's top k passages among the nodes it touched.

A round pushes, for every question, every node u whose residual exceeds ``eps * str(u)``: (1 - d) r_u goes to
u's estimate (kept for passages only: the answer ranks passages) and d r_u w[u, v] / str(u) to the residual of
each neighbour v; the nodes over their threshold after the round are the next round's. Both implementations run
these rounds (the same pushes in the same rounds; sums may differ in the last float bits):

- torch (any device; what a GPU runs): one table of the batch's touched (question, node) pairs sorted by key
  ``b * N + node``, merged with each round's contributions by binary search: a few dozen tensor passes a round.
- numba (CPU tensors when numba imports: ``backends.use_numba``): one compiled loop per question over a
  residual array of the corpus's nodes, reset at the touched nodes after each question (so a question's work is
  its pushes, not N), the batch split over ``torch.get_num_threads()`` threads (the loop holds no GIL). About
  10x fewer passes over memory than the torch table (docs/benchmarks/scaling.md).
"""
from __future__ import annotations

import threading

import torch

from .backends import use_numba
from .segment_topk import segment_positions


def coalesce(keys: torch.Tensor, *values: torch.Tensor):
    """Sorted distinct keys and each value summed over equal keys.

    Parameters
    ----------
    keys : torch.Tensor
        int64 [n].
    *values : torch.Tensor
        [n] each.

    Returns
    -------
    tuple of torch.Tensor
        The distinct keys (ascending), then each value's sums over them.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels.push import coalesce
    >>> coalesce(torch.tensor([3, 1, 3]), torch.tensor([1.0, 2.0, 4.0]))
    (tensor([1, 3]), tensor([2., 5.]))
    """
    uniq, inv = torch.unique(keys, return_inverse=True)
    return (uniq, *(torch.zeros(uniq.numel(), dtype=v.dtype, device=v.device).index_add_(0, inv, v)
                    for v in values))


def forward_push(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, strength: torch.Tensor,
                 keys: torch.Tensor, residual: torch.Tensor, num_passages: int, batch: int, damping: float,
                 eps: float, max_rounds: int, k: int, workspace: dict | None = None):
    """Rounds of forward pushes from each question's reset, and its top ``k`` passages (module docstring).

    Parameters
    ----------
    crow, col, val : torch.Tensor
        The walk as a CSR over the N nodes: int64 [N + 1], int64 [nnz], float32 [nnz] (w[u, v] / str(u)).
    strength : torch.Tensor
        float32 [N]: str(u); 0 for an isolated node (its threshold is 0: pushed while it holds any residual).
    keys : torch.Tensor
        int64 [n], ascending and distinct: ``b * N + u`` for each reset entry (question b, node u).
    residual : torch.Tensor
        float32 [n]: the reset's weight at each key (the starting residual).
    num_passages : int
        P: nodes [0, P) are passages, ranked in the answer.
    batch : int
        Questions.
    damping : float
        d.
    eps : float
        The residual threshold per unit of strength.
    max_rounds : int
        A cap on the rounds.
    k : int
        Passages returned per question.
    workspace : dict, optional
        Kept by the caller with the walk's tensors: the numba path keeps its per-thread arrays of the N nodes
        there between calls (allocated once, left zeroed), so that a call costs its pushes, not N.

    Returns
    -------
    indices : torch.Tensor
        int64 [batch, k]: each question's touched passages by descending estimate, equal ones by lower index;
        -1 past those it touched.
    values : torch.Tensor
        float32 [batch, k]: their estimates p (0 past the end).
    stats : tuple of int
        (rounds: the most rounds of any question, touched: (question, node) pairs touched, touched passages,
        pushed: neighbour updates), summed over the batch.

    Examples
    --------
    A path 0 - 1 - 2 (node 1 is a passage too, with P = 3), one question whose reset is node 0:

    >>> import torch
    >>> from linearrag_torch.kernels import forward_push
    >>> crow, col = torch.tensor([0, 1, 3, 4]), torch.tensor([1, 0, 2, 1])
    >>> val, strength = torch.tensor([1.0, 0.5, 0.5, 1.0]), torch.tensor([1.0, 2.0, 1.0])
    >>> i, v, stats = forward_push(crow, col, val, strength, torch.tensor([0]), torch.tensor([1.0]), 3, 1,
    ...                            0.5, 1e-9, 200, 3)
    >>> i.tolist(), [round(x, 4) for x in v[0].tolist()]
    ([[0, 1, 2]], [0.5833, 0.3333, 0.0833])
    """
    if use_numba(keys) and k > 0:  # (k = 0: nothing to rank, and the loop indexes its k-th entry)
        return _numba_push(crow, col, val, strength, keys, residual, num_passages, batch, damping, eps,
                           max_rounds, k, {} if workspace is None else workspace)
    return _torch_push(crow, col, val, strength, keys, residual, num_passages, batch, damping, eps, max_rounds, k)


def _merge(table: list, ck: torch.Tensor, cv: torch.Tensor, N: int, strength: torch.Tensor, eps: float) -> list:
    """Add the residuals ``cv`` at keys ``ck`` to the sorted table [keys, r, p, thr]: summed at
    the keys already there, the new keys merged in by their ranks (one sort of the contributions, binary
    searches of sorted keys and a running count; no sort of the table). Returns the table (new arrays when
    it grew)."""
    keys, r, p, thr = table
    ck, cv = coalesce(ck, cv)
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


def _torch_push(crow, col, val, strength, keys, residual, P, batch, d, eps, max_rounds, k):
    """forward_push in tensor passes (any device): the sorted table of touched pairs (module docstring)."""
    dev = keys.device
    N = strength.numel()
    table = [keys, residual.clone(), torch.zeros_like(residual), strength.index_select(0, keys % N) * eps]
    rounds = pushed = 0
    for _ in range(max_rounds):
        keys, r, p, thr = table
        act = torch.nonzero(r > thr).flatten()
        # what a round reads back to the host (a sync on a GPU): how many (question, node) pairs it pushes; the
        # merge's index lists add two more; none of them grows with the batch
        if act.numel() == 0:
            break
        rounds += 1
        ar = r.index_select(0, act)
        p.index_add_(0, act, ar * (1.0 - d))
        r.index_fill_(0, act, 0.0)
        ak = keys.index_select(0, act)
        acol = torch.div(ak, N, rounding_mode="floor")
        owner, pos, _ = segment_positions(crow, ak - acol * N)
        if pos.numel():
            pushed += pos.numel()
            ck = acol.index_select(0, owner) * N + col.index_select(0, pos)
            cv = ar.index_select(0, owner).mul_(val.index_select(0, pos)).mul_(d)
            table = _merge(table, ck, cv, N, strength, eps)
    keys, r, p, thr = table
    qcol = torch.div(keys, N, rounding_mode="floor")
    node = keys - qcol * N
    # the top k passages of each question among those it touched
    is_p = node < P
    pc, pn, ps = qcol[is_p], node[is_p], p[is_p]
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
    return indices, values, (rounds, keys.numel(), pc.numel(), pushed)


def _scratch(workspace: dict, N: int, P: int):
    """A thread's arrays for the compiled push, from the workspace's free list (or new): the residual and round
    mark of the N nodes side by side, [N, 2] float32 (0 and -1 when free), and the P passages' estimates."""
    import numpy as np

    with workspace.setdefault("push_lock", threading.Lock()):
        free = workspace.setdefault("push_scratch", [])
        while free:
            rm, p = free.pop()
            if rm.shape[0] == N and p.shape[0] == P:  # (arrays of another walk are dropped)
                return rm, p
    rm = np.zeros((N, 2), np.float32)
    rm[:, 1] = -1.0
    return rm, np.zeros(P, np.float32)


def _release(workspace: dict, scratch) -> None:
    with workspace["push_lock"]:
        workspace["push_scratch"].append(scratch)


def _numba_push(crow, col, val, strength, keys, residual, P, batch, d, eps, max_rounds, k, workspace):
    """forward_push in compiled loops over numpy views of CPU tensors (module docstring)."""
    import concurrent.futures

    N = strength.numel()
    q = torch.div(keys, N, rounding_mode="floor")
    qptr = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(q, minlength=batch), 0, out=qptr[1:])
    args = (crow.contiguous().numpy(), col.contiguous().numpy(), val.contiguous().float().numpy(),
            strength.contiguous().float().numpy(), qptr.numpy(), (keys - q * N).numpy(),
            residual.contiguous().float().numpy())
    indices = torch.full((batch, k), -1, dtype=torch.int64)
    values = torch.zeros((batch, k), dtype=torch.float32)
    stats = torch.zeros((batch, 4), dtype=torch.int64)
    out = (indices.numpy(), values.numpy(), stats.numpy())
    from .numba.push import push_block as kernel  # imports numba: only once use_numba said yes

    threads = max(1, min(torch.get_num_threads(), batch))
    bounds = [batch * i // threads for i in range(threads + 1)]
    def block(lo, hi):
        scratch = _scratch(workspace, N, P)
        kernel(*args, lo, hi, P, d, eps, max_rounds, *scratch, *out)
        _release(workspace, scratch)  # not on an error: the arrays may be left dirty

    if threads == 1:
        block(0, batch)
    else:  # contiguous blocks of questions, one thread each (the compiled loop releases the GIL)
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for job in [pool.submit(block, bounds[i], bounds[i + 1]) for i in range(threads)]:
                job.result()
    s = stats.sum(0).tolist()
    return indices, values, (int(stats[:, 0].max()) if batch else 0, s[1], s[2], s[3])
