"""One iteration of personalized PageRank (eq. 6), fused: SpMM + reset mix + L1 change. An iteration is a
block Gauss-Seidel step (passages, then entities from the new passage values; ppr_step).

Unfused, an iteration is two SpMMs followed by about a dozen element-wise passes over the
(passages + entities) x B state (scale, add, mix in the reset, subtract, abs, sum, select the columns
still running), each allocating a new tensor. The Triton path reads each CSR entry once, then one
fused pass writes the new iterate and accumulates the column's L1 change; the torch fallback gets the same
result with ``addmm`` into preallocated buffers and in-place ops (4 passes instead of ~12, no fresh
allocation per step, which on CPU is what costs: page faults on every new large tensor).
On CUDA the step is two Triton kernels per side (kernels/triton/ppr.py).

The operation takes the walk operator as plain tensors (what pagerank.PPRGraph holds) and an
optional ``workspace`` dict that the caller keeps with those tensors (cached rows of ones, the Triton
work lists).
"""
from __future__ import annotations

import torch

from .backends import use_triton


def dangling_mass(dangling_passage_idx: torch.Tensor, dangling_entity_idx: torch.Tensor, xp: torch.Tensor,
                  xe: torch.Tensor) -> torch.Tensor:
    """The iterate's mass on the dangling nodes (strength 0), per column.

    Parameters
    ----------
    dangling_passage_idx, dangling_entity_idx : torch.Tensor
        int64 [n_p], [n_e]: the passage rows and the entity rows of strength 0.
    xp, xe : torch.Tensor
        The iterate's passage block [P, B] and entity block [E, B].

    Returns
    -------
    torch.Tensor
        g [B]: the sum of ``xp`` over the dangling passage rows plus that of ``xe`` over the dangling entity rows.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels import dangling_mass
    >>> xp, xe = torch.tensor([[0.2, 0.5], [0.3, 0.1]]), torch.tensor([[0.4, 0.4]])
    >>> dangling_mass(torch.tensor([1]), torch.tensor([0]), xp, xe)
    tensor([0.7000, 0.5000])
    """
    g = xp.new_zeros(xp.shape[1])
    if dangling_passage_idx.numel():
        g += xp.index_select(0, dangling_passage_idx).sum(0)
    if dangling_entity_idx.numel():
        g += xe.index_select(0, dangling_entity_idx).sum(0)
    return g


def ppr_step(to_passages: torch.Tensor, to_entities: torch.Tensor, between_passages: torch.Tensor | None,
             dangling_passage_idx: torch.Tensor, dangling_entity_idx: torch.Tensor,
             xp: torch.Tensor, xe: torch.Tensor, rp: torch.Tensor, re: torch.Tensor, damping: float,
             out_p: torch.Tensor, out_e: torch.Tensor, workspace: dict | None = None,
             joint: tuple | None = None) -> torch.Tensor:
    """One block Gauss-Seidel step of x = (1 - d) r + d (walk(x) + g(x) r) on B columns at once: the
    passages first, then the entities from the new passage values:

        g       = sum of (xp, xe) over the dangling nodes (strength 0)                [B]
        p'      = d (W_pe xe + W_pp xp) + (1 - d + d g) rp                            [P, B]
        g'      = sum of (p', xe) over the dangling nodes                             [B]
        e'      = d W_ep p' + (1 - d + d g') re                                       [E, B]
        change  = sum_p |p' - xp| + sum_e |e' - xe|                                   [B]

    The fixed point is eq. 6's (the power iteration's); on the bipartite passage-entity graph a step does
    the work of two power-iteration steps (each half uses the other's newest values), so about half as
    many steps reach a tolerance. Triton on CUDA tensors (``backends.use_triton``), else torch.

    Parameters
    ----------
    to_passages : torch.Tensor
        W_pe [P, E], torch CSR.
    to_entities : torch.Tensor
        W_ep [E, P], torch CSR.
    between_passages : torch.Tensor or None
        W_pp [P, P], torch CSR, or None (no passage-passage edges).
    dangling_passage_idx, dangling_entity_idx : torch.Tensor
        int64: the passage rows and entity rows of strength 0.
    xp, xe : torch.Tensor
        The iterate [P, B] and [E, B]; used as scratch: they hold garbage afterwards.
    rp, re : torch.Tensor
        The reset (personalisation) [P, B] and [E, B].
    damping : float
        d, the probability of following an edge.
    out_p, out_e : torch.Tensor
        [P, B] and [E, B], distinct from every input: p' and e' are written here.
    workspace : dict, optional
        Kept with the matrices across steps (caches derived from them); None: no caching.
    joint : tuple of torch.Tensor, optional
        (x, out) when xp, xe are the row blocks of one contiguous [P + E, B] tensor x and out_p, out_e those
        of ``out``: the torch path then takes the change in one pass over the whole (three dispatches instead
        of seven); its float sum may differ from the two-part one in the last bit.

    Returns
    -------
    torch.Tensor
        change [B]: the L1 change of each column.

    Examples
    --------
    Two passages and two entities; entity 0 is in both passages, entity 1 in passage 1 only:

    >>> import torch
    >>> from linearrag_torch.kernels import ppr_step
    >>> W_pe = torch.tensor([[0.5, 0.0], [0.5, 1.0]]).to_sparse_csr()
    >>> W_ep = torch.tensor([[1.0, 0.5], [0.0, 0.5]]).to_sparse_csr()
    >>> none = torch.empty(0, dtype=torch.int64)
    >>> rp, re = torch.tensor([[1.0], [0.0]]), torch.zeros(2, 1)
    >>> out_p, out_e = torch.empty(2, 1), torch.empty(2, 1)
    >>> change = ppr_step(W_pe, W_ep, None, none, none, rp.clone(), re.clone(), rp, re, 0.5, out_p, out_e)
    >>> out_p.flatten().tolist(), out_e.flatten().tolist(), change.tolist()
    ([0.5, 0.0], [0.25, 0.0], [0.75])
    """
    d = float(damping)
    workspace = {} if workspace is None else workspace
    dangling = bool(dangling_passage_idx.numel() or dangling_entity_idx.numel())

    def entity_coef(new_p):  # (1 - d + d g') per column, g' over (p', xe)
        return (1.0 - d) + d * dangling_mass(dangling_passage_idx, dangling_entity_idx, new_p, xe)

    if use_triton(xp):
        from .triton import ppr as triton_ppr  # deferred: the optional triton

        coef = (1.0 - d) + d * dangling_mass(dangling_passage_idx, dangling_entity_idx, xp, xe)
        return triton_ppr.ppr_step(to_passages, to_entities, between_passages, xp, xe, rp, re, d, coef, out_p, out_e,
                                   workspace, entity_coef if dangling else (lambda new_p: coef))
    return _ppr_step_torch(to_passages, to_entities, between_passages, dangling_passage_idx, dangling_entity_idx,
                           dangling, xp, xe, rp, re, d, out_p, out_e, workspace, joint)


def _ppr_step_torch(to_passages, to_entities, between_passages, dangling_passage_idx, dangling_entity_idx,
                    dangling: bool, xp, xe, rp, re, d, out_p, out_e, workspace, joint=None):
    if dangling:  # the reset's weight per column: one pass writes it, the SpMM adds on
        torch.mul(rp, (1.0 - d) + d * dangling_mass(dangling_passage_idx, dangling_entity_idx, xp, xe), out=out_p)
        out_p.addmm_(to_passages, xe, alpha=d)
        if between_passages is not None:
            out_p.addmm_(between_passages, xp, alpha=d)
        torch.mul(re, (1.0 - d) + d * dangling_mass(dangling_passage_idx, dangling_entity_idx, out_p, xe), out=out_e)
        out_e.addmm_(to_entities, out_p, alpha=d)
    else:  # nothing dangles: g is 0 and the reset's weight is 1 - d (no pass for it)
        torch.addmm(rp, to_passages, xe, beta=1.0 - d, alpha=d, out=out_p)
        if between_passages is not None:
            out_p.addmm_(between_passages, xp, alpha=d)
        torch.addmm(re, to_entities, out_p, beta=1.0 - d, alpha=d, out=out_e)
    if joint is not None:
        return joint[0].sub_(joint[1]).abs_().sum(0)
    dp, de = xp.sub_(out_p).abs_(), xe.sub_(out_e).abs_()
    if xp.shape[1] < GEMV_MIN_COLUMNS:  # a few columns: each is (nearly) contiguous, sum(0) is one cheap pass
        return dp.sum(0).add_(de.sum(0))
    # column sums of |x' - x| as |x' - x|^T ones: a GEMV reads the rows faster than sum(0) on CPU
    change = torch.mv(dp.T, _ones(workspace, xp))
    return change.addmv_(de.T, _ones(workspace, xe))


# below this many columns the L1 change is summed with sum(0), from it on by a GEMV (CPU timings on
# [2056, B] float32, one thread: sum(0) 2.4 us at B = 1 against 6.7 for the GEMV; 225 against 39 at B = 256)
GEMV_MIN_COLUMNS = 16


def _ones(workspace: dict, x: torch.Tensor) -> torch.Tensor:
    """A vector of ones for x's rows, cached in the workspace."""
    key = ("ones", x.shape[0], x.device, x.dtype)
    if key not in workspace:
        workspace[key] = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
    return workspace[key]
