"""Triton: the k best unused sentences of each (entity, question) pair (kernels/segment_topk.py's
segment_topk_sigma with lazy sigma). One program per pair walks the CSR row in blocks, computes sigma
as a dot product on the fly, looks the used set up by binary search and keeps the running best in
registers: nothing of size (entries x D) or [S, B] is materialised."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import next_power_of_2

NONE = -1  # "no sentence left", as kernels.segment_topk.NONE


@triton.jit
def row_topk(crow, col, rows, qcols, emb, qemb, used, out, n_used, search_steps, batch, D, K,
             BLOCK: tl.constexpr, DP: tl.constexpr):
    # one program per pair; K passes, pass j finds the best entry strictly below pick j - 1
    # in the order (sigma descending, s ascending)
    i = tl.program_id(0)
    r = tl.load(rows + i).to(tl.int64)
    q = tl.load(qcols + i).to(tl.int64)
    start = tl.load(crow + r).to(tl.int64)
    end = tl.load(crow + r + 1).to(tl.int64)
    dofs = tl.arange(0, DP)
    dmask = dofs < D
    qv = tl.load(qemb + q * D + dofs, mask=dmask, other=0.0)
    prev_v = tl.full([], float("inf"), tl.float32)
    prev_s = tl.full([], -1, tl.int64)
    for j in range(K):
        best_v = tl.full([], float("-inf"), tl.float32)
        best_s = tl.full([], -1, tl.int64)
        for b0 in range(start, end, BLOCK):
            offs = b0 + tl.arange(0, BLOCK)
            m = offs < end
            s = tl.load(col + offs, mask=m, other=0).to(tl.int64)
            e = tl.load(emb + s[:, None] * D + dofs[None, :], mask=m[:, None] & dmask[None, :], other=0.0)
            v = tl.sum(e * qv[None, :], axis=1)
            # used-set membership by binary search on the sorted keys
            key = s * batch + q
            lo = tl.zeros([BLOCK], dtype=tl.int64)
            hi = tl.zeros([BLOCK], dtype=tl.int64) + n_used
            for _ in range(search_steps):
                mid = (lo + hi) // 2
                go = lo < hi
                kv = tl.load(used + mid, mask=go & m, other=0)
                lo = tl.where(go & (kv < key), mid + 1, lo)
                hi = tl.where(go & (kv >= key), mid, hi)
            found = tl.load(used + lo, mask=m & (lo < n_used), other=-1) == key
            below = (v < prev_v) | ((v == prev_v) & (s > prev_s))
            ok = m & (~found) & below
            v = tl.where(ok, v, -float("inf"))
            bv = tl.max(v, axis=0)
            bs = tl.min(tl.where(ok & (v == bv), s, 9223372036854775807), axis=0)
            better = (bv > best_v) | ((bv == best_v) & (bs < best_s) & (bv > -float("inf")))
            best_s = tl.where(better & (bv > -float("inf")), bs, best_s)
            best_v = tl.where(better, bv, best_v)
        tl.store(out + i * K + j, best_s)
        prev_v = best_v  # -inf when nothing was left: the later passes then find nothing either
        prev_s = best_s


def segment_topk_sigma(crow, col, rows, qcols, sentence_emb, query_emb, used, batch: int, k: int) -> torch.Tensor:
    """kernels.segment_topk.segment_topk_sigma's contract for lazy sigma = (sentence_emb, query_emb)."""
    n = rows.numel()
    out = torch.full((n, k), NONE, dtype=torch.int64, device=rows.device)
    D = sentence_emb.shape[1]
    used = used.contiguous() if used.numel() else torch.full((1,), -1, dtype=torch.int64, device=rows.device)
    n_used = used.numel()
    steps = max(1, int(n_used).bit_length())
    row_topk[(n,)](crow, col, rows.contiguous(), qcols.contiguous(), sentence_emb.contiguous(),
                   query_emb.contiguous(), used, out, n_used, steps, batch, D, k,
                   BLOCK=32, DP=next_power_of_2(D))
    return out
