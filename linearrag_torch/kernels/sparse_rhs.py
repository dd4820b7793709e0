"""A sparse matrix times a sparse right-hand side, into a dense [rows, B] output.

Eq. 7's sum_e act_e ln(1 + N[p, e]) / L_e is N_log @ V with V [E, B] holding a few active entities
per question. A CSR SpMM reads all of N_log for every question (O(nnz(N) B)); walking only the
columns of N_log that V selects (the rows of its transpose) costs O(sum of their lengths).
"""
from __future__ import annotations

import torch

from .segment_topk import segment_positions


def spmm_sparse_rhs(AT_crow: torch.Tensor, AT_col: torch.Tensor, AT_val: torch.Tensor, rows: torch.Tensor,
                    cols: torch.Tensor, vals: torch.Tensor, out: torch.Tensor, max_entries: int = 1 << 22) -> torch.Tensor:
    """out += A V in place, for out [n, B], A given by the CSR of its transpose Aᵀ (AT_crow, AT_col, AT_val),
    and V sparse with V[rows[i], cols[i]] = vals[i]:

        out[p, cols[i]] += Aᵀ[rows[i], p] * vals[i]      for every stored (rows[i], p) of Aᵀ

    Parameters
    ----------
    AT_crow, AT_col, AT_val : torch.Tensor
        The CSR arrays of Aᵀ [E, n].
    rows, cols, vals : torch.Tensor
        V's entries: row (int64), column (int64) and value of each.
    out : torch.Tensor
        [n, B], added to in place.
    max_entries : int, default 1 << 22
        Products formed at a time (bounds the working memory).

    Returns
    -------
    torch.Tensor
        ``out``.

    Examples
    --------
    Aᵀ has row 0 = (1 at column 0, 2 at column 2) and row 1 = (3 at column 1); V[0, 0] = 0.5, V[1, 1] = 1:

    >>> import torch
    >>> from linearrag_torch.kernels import spmm_sparse_rhs
    >>> AT = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), torch.tensor([1.0, 2.0, 3.0])
    >>> V = torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0.5, 1.0])
    >>> spmm_sparse_rhs(*AT, *V, out=torch.zeros(3, 2)).tolist()
    [[0.5, 0.0], [0.0, 3.0], [1.0, 0.0]]
    """
    if rows.numel() == 0:
        return out
    B = out.shape[1]
    flat = out.view(-1)
    ends = torch.cumsum((AT_crow[rows + 1] - AT_crow[rows]).to(torch.int64), 0)
    n, start = rows.numel(), 0
    while start < n:  # the pairs [start, stop) hold at most max_entries products (at least one pair)
        # a block's end is a size read back to the host: once per block (one block per call up to max_entries)
        base = int(ends[start - 1]) if start else 0
        stop = min(max(int(torch.searchsorted(ends, base + max_entries, right=True)), start + 1), n)
        owner, pos, _ = segment_positions(AT_crow, rows[start:stop])
        p = AT_col[pos].to(torch.int64)
        flat.index_add_(0, p * B + cols[start:stop][owner], AT_val[pos] * vals[start:stop][owner])
        start = stop
    return out
