"""Reference-mode sentence choice: the k best unused sentences of each frontier entity, by sigma.

For every frontier pair (entity e, question b) the candidates are the CSR row e of Mᵀ (the sentences
that mention e). Unfused, torch expands every row into (pair, sentence) entries, gathers sigma for
each (a dot product per entry), tests membership in the used set,
and sorts everything twice. The Triton kernel (kernels/triton/segment_topk.py) walks each row in
blocks, computes sigma as a dot product on the fly, looks the used set up by binary search and keeps
the running best in registers: nothing of size (entries x D) or [S, B] is materialised.
"""
from __future__ import annotations

import torch

from .backends import use_torch_scatter, use_triton

NONE = -1  # marks "no sentence left" in the [n, k] output


def segment_positions(crow: torch.Tensor, rows: torch.Tensor):
    """The stored entries of some rows of a CSR matrix, as flat index vectors.

    Parameters
    ----------
    crow : torch.Tensor
        The CSR row pointer [R + 1].
    rows : torch.Tensor
        int64 [n]: the rows asked (repeats allowed).

    Returns
    -------
    owner : torch.Tensor
        int64 [m]: for entry i, its row's position in ``rows``.
    pos : torch.Tensor
        int64 [m]: its storage position in the CSR's column and value arrays.
    offsets : torch.Tensor
        int64 [n]: where the entries of ``rows[j]`` start among the m.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels import segment_positions
    >>> segment_positions(torch.tensor([0, 2, 3, 5]), torch.tensor([2, 0]))
    (tensor([0, 0, 1, 1]), tensor([3, 4, 0, 1]), tensor([0, 2]))
    """
    # few dispatches: at one question a retrieval calls this about 15 times on a handful of rows
    starts = crow.index_select(0, rows).to(torch.int64)
    lens = crow.index_select(0, rows + 1).to(torch.int64).sub_(starts)
    owner = torch.repeat_interleave(lens)  # i repeated lens[i] times
    offsets = torch.cumsum(lens, 0).sub_(lens)
    pos = torch.arange(owner.numel(), device=rows.device).add_((starts - offsets).index_select(0, owner))
    return owner, pos, offsets


# pairs per chunk of gather_sigma: on the CPU few enough to keep the gathered rows in cache; elsewhere (CUDA)
# as many as fit a bounded buffer, so that a large batch is a few launches and not one per 1024 pairs
CPU_SIGMA_CHUNK = 1024
DEVICE_SIGMA_CHUNK = 1 << 16


def gather_sigma(sigma, s: torch.Tensor, b: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """sigma[s, b] = <sentence_emb[s], query_emb[b]> (eq. 4) for the asked (sentence, question) pairs only.

    Each pair's value is its own row product, whatever the chunk or the other pairs (a question's sigma does
    not depend on its batch). On the CPU, chunks of 1024 pairs keep the gathered rows in cache (measured:
    docs/benchmarks/kernels.md, "Figures behind the code's choices").

    Parameters
    ----------
    sigma : tuple of torch.Tensor
        (sentence_emb [S, D], query_emb [B, D]) (``testing.sigma_pair`` writes a dense [S, B] sigma in this form).
    s, b : torch.Tensor
        int64 [n]: the sentence and the question of each pair.
    chunk : int, optional
        Pairs per product (None: CPU_SIGMA_CHUNK on the CPU, DEVICE_SIGMA_CHUNK elsewhere).

    Returns
    -------
    torch.Tensor
        [n]: sigma of each pair. Half-precision sentence vectors and float32 questions give float32 sigma (the
        products are formed in float32).

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels import gather_sigma
    >>> sigma = (torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]), torch.tensor([[0.8, 0.6]]))
    >>> gather_sigma(sigma, torch.tensor([0, 2]), torch.tensor([0, 0]))
    tensor([0.8000, 0.9600])
    """
    sentence_emb, query_emb = sigma
    if chunk is None:
        chunk = CPU_SIGMA_CHUNK if s.device.type == "cpu" else DEVICE_SIGMA_CHUNK
    if s.numel() <= chunk:  # one chunk: the same products, fewer dispatches
        return (sentence_emb.index_select(0, s) * query_emb.index_select(0, b)).sum(dim=1)
    out = torch.empty(s.numel(), dtype=torch.promote_types(sentence_emb.dtype, query_emb.dtype),
                      device=sentence_emb.device)
    for i in range(0, s.numel(), chunk):
        j = min(i + chunk, s.numel())
        out[i:j] = (sentence_emb[s[i:j]] * query_emb[b[i:j]]).sum(dim=1)
    return out


def segment_topk_sigma(crow: torch.Tensor, col: torch.Tensor, rows: torch.Tensor, qcols: torch.Tensor,
                       sigma, used: torch.Tensor, batch: int, k: int) -> torch.Tensor:
    """For each pair i = (row r = rows[i], question q = qcols[i]) of a CSR matrix (crow, col):

        out[i] = the k columns s of row r with the largest sigma[s, q], best first, ties to the lower s,
                 among those whose key s * batch + q is not in ``used`` (a sorted int64 tensor);
                 NONE (-1) where the row has fewer than k such columns.

    Triton on CUDA tensors (``backends.use_triton``): sigma as a dot product on the fly, the used set by binary
    search, the running best in registers; else torch.

    Parameters
    ----------
    crow, col : torch.Tensor
        The CSR pointer and column indices (Mᵀ: the sentences that mention each entity).
    rows, qcols : torch.Tensor
        int64 [n]: the row (entity) and the question of each pair.
    sigma : tuple of torch.Tensor
        (sentence_emb [S, D], query_emb [B, D]) as in ``gather_sigma``.
    used : torch.Tensor
        Sorted int64 keys s * batch + q of the (sentence, question) pairs already used.
    batch : int
        B, the number of questions (the keys' stride).
    k : int
        Columns kept per pair.

    Returns
    -------
    torch.Tensor
        int64 [n, k]: the chosen columns, best first; NONE (-1) past the last.

    Examples
    --------
    Entity 0 is in sentences 0, 1 and 2; sentence 1 is used already:

    >>> import torch
    >>> from linearrag_torch.kernels import segment_topk_sigma
    >>> sigma = (torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]), torch.tensor([[0.8, 0.6]]))
    >>> crow, col = torch.tensor([0, 3]), torch.tensor([0, 1, 2])
    >>> one = torch.tensor([0])
    >>> segment_topk_sigma(crow, col, one, one, sigma, used=torch.tensor([1]), batch=1, k=2)
    tensor([[2, 0]])
    """
    n = rows.numel()
    if n == 0:
        return torch.full((0, k), NONE, dtype=torch.int64, device=rows.device)
    if use_triton(rows):
        from .triton import segment_topk as triton_segment_topk  # deferred: the optional triton

        return triton_segment_topk.segment_topk_sigma(crow, col, rows, qcols, sigma[0], sigma[1], used, batch, k)
    return _segment_topk_torch(crow, col, rows, qcols, sigma, used, batch, k)


def _segment_topk_torch(crow, col, rows, qcols, sigma, used, batch, k):
    owner, pos, offsets = segment_positions(crow, rows)
    s = col[pos].to(torch.int64)
    b = qcols[owner]
    sig = gather_sigma(sigma, s, b)
    if used.numel():
        sig = torch.where(torch.isin(s * batch + b, used), torch.full_like(sig, float("-inf")), sig)
    out = torch.full((rows.numel(), k), NONE, dtype=torch.int64, device=rows.device)
    if k == 1:
        first = segment_argmax(sig, owner, rows.numel())
        ok = first >= 0
        out[ok, 0] = s[first[ok]]
        return out
    chosen = top_k_per_segment(sig, owner, offsets, k)  # positions, grouped by owner, best first
    o = owner[chosen]
    counts = torch.bincount(o, minlength=rows.numel())
    rank = torch.arange(chosen.numel(), device=rows.device) - (torch.cumsum(counts, 0) - counts)[o]
    out[o, rank] = s[chosen]
    return out


def sorted_offsets(owner: torch.Tensor, n: int) -> torch.Tensor:
    """The CSR pointer [n + 1] of segments given as a sorted owner vector."""
    ptr = torch.zeros(n + 1, dtype=torch.int64, device=owner.device)
    torch.cumsum(torch.bincount(owner, minlength=n), 0, out=ptr[1:])
    return ptr


def segment_argmax(values: torch.Tensor, owner: torch.Tensor, n: int, use_scatter: bool | None = None) -> torch.Tensor:
    """Per segment, the position of its largest finite value, the first one among ties.

    Parameters
    ----------
    values : torch.Tensor
        [m] floats.
    owner : torch.Tensor
        int64 [m], sorted: the segment of each entry (segment j: the entries with owner == j, contiguous).
    n : int
        The number of segments.
    use_scatter : bool, optional
        Use torch_scatter.segment_max_csr (one pass) instead of two native scatter_reduce passes; None: as
        ``backends.use_torch_scatter`` decides (installed, CPU tensors). True/False choose explicitly (the
        tests and benchmarks compare both).

    Returns
    -------
    torch.Tensor
        int64 [n]: a position in ``values`` per segment; -1 for a segment without a finite value.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels import segment_argmax
    >>> values = torch.tensor([0.1, 0.5, 0.5, float("-inf"), 0.3])
    >>> segment_argmax(values, torch.tensor([0, 0, 0, 1, 2]), 3)
    tensor([ 1, -1,  4])
    """
    if use_scatter is None:
        use_scatter = use_torch_scatter(values)
    if use_scatter:
        import torch_scatter

        _, arg = torch_scatter.segment_max_csr(values, sorted_offsets(owner, n))
        # empty segments and segments of -inf only come back with an out-of-range or foreign argmax
        a = arg.clamp(0, max(values.numel() - 1, 0))
        ok = (arg >= 0) & (arg < values.numel())
        if values.numel():
            ok &= torch.isfinite(values[a]) & (owner[a] == torch.arange(n, device=owner.device))
        return torch.where(ok, arg, torch.full_like(arg, -1))
    best = torch.full((n,), float("-inf"), dtype=values.dtype, device=values.device)
    best.scatter_reduce_(0, owner, values, "amax")
    idx = torch.arange(values.numel(), device=values.device)
    hit = (values == best[owner]) & torch.isfinite(values)
    big = values.numel()
    first = torch.full((n,), big, dtype=torch.int64, device=values.device)
    first.scatter_reduce_(0, owner, torch.where(hit, idx, torch.full_like(idx, big)), "amin")
    return torch.where(first < big, first, torch.full_like(first, -1))


def top_k_per_segment(values: torch.Tensor, owner: torch.Tensor, offsets: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k largest finite values of each segment.

    Parameters
    ----------
    values : torch.Tensor
        [m] floats.
    owner : torch.Tensor
        int64 [m], sorted: the segment of each entry (segments are contiguous runs).
    offsets : torch.Tensor
        int64 [n]: where each segment starts.
    k : int
        Positions kept per segment.

    Returns
    -------
    torch.Tensor
        int64: positions in ``values``, grouped by segment, best first; ties keep the earlier position.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels import top_k_per_segment
    >>> values = torch.tensor([0.1, 0.5, 0.3, 0.9, 0.2])
    >>> top_k_per_segment(values, torch.tensor([0, 0, 0, 1, 1]), torch.tensor([0, 3]), 2)
    tensor([1, 2, 3, 4])
    """
    order = torch.argsort(-values, stable=True)
    order = order[torch.argsort(owner[order], stable=True)]
    rank = torch.arange(order.numel(), device=values.device) - offsets[owner[order]]
    keep = (rank < k) & torch.isfinite(values[order])
    return order[keep]
