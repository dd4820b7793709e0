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
    """For a list of CSR rows: (owner, pos, offsets) with owner[i] the position in ``rows`` of entry i,
    pos[i] its storage position in the CSR arrays, offsets[j] where row j's entries start."""
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
    """sigma[s, b] for index vectors s, b. ``sigma`` is the pair (sentence_emb [S, D], query_emb [B, D]):
    sigma[s, b] = <sentence_emb[s], query_emb[b]> (eq. 4) is computed for the asked pairs only, ``chunk``
    pairs at a time (None: CPU_SIGMA_CHUNK on the CPU, DEVICE_SIGMA_CHUNK elsewhere; testing.sigma_pair writes
    a dense [S, B] sigma in this form). Half-precision sentence vectors and float32 questions give float32
    sigma (the products are formed in float32).
    Each pair's value is its own row product, whatever the chunk or the other pairs (a question's sigma does
    not depend on its batch). Chunks of 1024 pairs keep the gathered rows in cache: 55,000 pairs on 2wiki's
    sentences took 37 ms against 119 ms in chunks of 65,536 (2-core CPU)."""
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

    ``sigma`` is (sentence_emb, query_emb) as in gather_sigma. Returns [n, k] int64.
    """
    n = rows.numel()
    if n == 0:
        return torch.full((0, k), NONE, dtype=torch.int64, device=rows.device)
    if use_triton(rows):
        from .triton import segment_topk as triton_segment_topk

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
    """Per segment j (the entries i with owner[i] = j, contiguous): the position of its largest finite
    value, the first one among ties; -1 for a segment without a finite value.

    ``use_scatter``: use torch_scatter.segment_max_csr (one pass) instead of two native scatter_reduce
    passes; None = as backends.use_torch_scatter decides (installed, CPU tensors). True/False choose
    explicitly (the tests and benchmarks compare both).
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
    """Positions of the k largest finite values of each segment (segments are contiguous runs of
    ``owner``), grouped by segment, best first; ties keep the earlier position."""
    order = torch.argsort(-values, stable=True)
    order = order[torch.argsort(owner[order], stable=True)]
    rank = torch.arange(order.numel(), device=values.device) - offsets[owner[order]]
    keep = (rank < k) & torch.isfinite(values[order])
    return order[keep]
