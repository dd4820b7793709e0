"""Top-k rows of every column with ties to the lowest row, without sorting whole columns.

A stable descending sort of [B, P] (what a tie rule naturally asks for) costs O(P log P) per
question (seconds for 100k passages x 64 questions on a CPU: docs/benchmarks/kernels.md). ``torch.topk``
finds the k-th value in one pass, but its order among equal values is unspecified; we keep its k-th value
as a cut and order only the entries at or above it.
"""
from __future__ import annotations

import torch


def topk_columns(scores: torch.Tensor, k: int):
    """The top k rows of every column, best first, equal values by lower row (a stable descending sort's order):

        indices[b] = the k rows p of largest scores[p, b], best first, equal values by lower p

    NaN ranks above every number, as in torch.sort.

    Parameters
    ----------
    scores : torch.Tensor
        [P, B]: a passage per row, a question per column.
    k : int
        Rows kept per column (at most P).

    Returns
    -------
    indices : torch.Tensor
        int64 [B, min(k, P)].
    values : torch.Tensor
        [B, min(k, P)], the scores of those rows.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels import topk_columns
    >>> scores = torch.tensor([[0.1, 0.9], [0.5, 0.2], [0.5, 0.9], [0.3, 0.1]])
    >>> indices, values = topk_columns(scores, 2)
    >>> indices
    tensor([[1, 2],
            [0, 2]])
    >>> values
    tensor([[0.5000, 0.5000],
            [0.9000, 0.9000]])
    """
    P, B = scores.shape
    k = min(int(k), P)
    if k == 0 or B == 0:
        return (torch.zeros(B, k, dtype=torch.int64, device=scores.device),
                torch.zeros(B, k, dtype=scores.dtype, device=scores.device))
    # each question's scores made contiguous first: along the strided passage axis the top-k and the comparison
    # took 14.8 ms a question at 1M passages (1 thread), on the copy 7
    by_question = scores.T.contiguous()  # [B, P]
    cut = torch.topk(by_question, k, dim=1).values[:, -1:]  # [B, 1]: the k-th largest value (NaN counts as largest)
    # every entry that may be in the top k: not below the cut (NaN is never below, and a NaN cut keeps all)
    keep = torch.lt(by_question, cut).logical_not_()
    b, p = keep.nonzero(as_tuple=True)  # row-major: p ascending within each column
    v = by_question[b, p]
    key = torch.where(torch.isnan(v), torch.full_like(v, float("inf")), v)
    order = torch.argsort(-key, stable=True)  # value descending, p ascending among ties
    if B == 1:  # one column: nothing to group (11 dispatches fewer, what a question alone pays for)
        take = order[:k]
        return p[take].view(1, k), v[take].view(1, k)
    order = order[torch.argsort(b[order], stable=True)]  # then grouped by column
    counts = torch.bincount(b, minlength=B)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel(), device=scores.device) - first[b[order]]
    take = order[rank < k]
    return p[take].view(B, k), v[take].view(B, k)
