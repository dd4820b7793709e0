"""One power iteration of personalized PageRank (eq. 6), fused: SpMM + reset mix + L1 change.

Unfused, an iteration is two SpMMs followed by about a dozen element-wise passes over the
(passages + entities) x B state (scale, add, mix in the reset, subtract, abs, sum, select the columns
still running), each allocating a new tensor. The Triton path reads each CSR entry once, then one
fused pass writes the new iterate and accumulates the column's L1 change; the torch fallback gets the same
result with ``addmm`` into preallocated buffers and in-place ops (4 passes instead of ~12, no fresh
allocation per step, which on CPU is what costs: page faults on every new large tensor).
On CUDA the step is two Triton kernels per side (see below).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._dispatch import next_power_of_2, use_triton

if TYPE_CHECKING:
    from ..pagerank import PPRGraph


def dangling_mass(graph: "PPRGraph", xp: torch.Tensor, xe: torch.Tensor) -> torch.Tensor:
    """g [B]: the iterate's mass on the nodes of strength 0 (passages and entity rows), per column."""
    g = xp.new_zeros(xp.shape[1])
    if graph.dangling_passage_idx.numel():
        g += xp.index_select(0, graph.dangling_passage_idx).sum(0)
    if graph.dangling_entity_idx.numel():
        g += xe.index_select(0, graph.dangling_entity_idx).sum(0)
    return g


def ppr_step(graph: "PPRGraph", xp: torch.Tensor, xe: torch.Tensor, rp: torch.Tensor, re: torch.Tensor,
             damping: float, out_p: torch.Tensor, out_e: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    """One step of x <- (1 - d) r + d (walk(x) + g(x) r) on B columns at once:

        g       = sum of x over the dangling nodes (strength 0)                      [B]
        p'      = d (W_pe xe + W_pp xp) + (1 - d + d g) rp                            [P, B]
        e'      = d W_ep xp + (1 - d + d g) re                                        [E, B]
        change  = sum_p |p' - xp| + sum_e |e' - xe|                                   [B]

    W_pe = graph.to_passages, W_ep = graph.to_entities, W_pp = graph.between_passages (or none).
    Writes p', e' into ``out_p``, ``out_e`` (distinct from every input) and returns ``change``;
    ``xp`` and ``xe`` are used as scratch and hold garbage afterwards. ``g``: dangling_mass(graph, xp, xe)
    if the caller already has it.
    """
    d = float(damping)
    if g is None:
        g = dangling_mass(graph, xp, xe)
    coef = (1.0 - d) + d * g
    if use_triton(xp):
        return _ppr_step_triton(graph, xp, xe, rp, re, d, coef, out_p, out_e)
    return _ppr_step_torch(graph, xp, xe, rp, re, d, g, out_p, out_e)


def _ppr_step_torch(graph, xp, xe, rp, re, d, g, out_p, out_e):
    if graph.dangling_passage_idx.numel() or graph.dangling_entity_idx.numel():
        coef = (1.0 - d) + d * g  # the reset's weight per column: one pass writes it, the SpMM adds on
        torch.mul(rp, coef, out=out_p)
        out_p.addmm_(graph.to_passages, xe, alpha=d)
        torch.mul(re, coef, out=out_e)
        out_e.addmm_(graph.to_entities, xp, alpha=d)
    else:
        torch.addmm(rp, graph.to_passages, xe, beta=1.0 - d, alpha=d, out=out_p)
        torch.addmm(re, graph.to_entities, xp, beta=1.0 - d, alpha=d, out=out_e)
    if graph.between_passages is not None:
        out_p.addmm_(graph.between_passages, xp, alpha=d)
    # column sums of |x' - x| as ones @ |x' - x|: a GEMM reads the rows faster than sum(0) on CPU
    ones_p, ones_e = _ones(graph, xp), _ones(graph, xe)
    change = torch.mm(ones_p, xp.sub_(out_p).abs_())
    return change.addmm_(ones_e, xe.sub_(out_e).abs_()).view(-1)


def _ones(graph, x: torch.Tensor) -> torch.Tensor:
    """A [1, rows] row of ones for x's rows, cached on the graph object."""
    cache = graph.__dict__.setdefault("_ones", {})
    key = (x.shape[0], x.device, x.dtype)
    if key not in cache:
        cache[key] = torch.ones(1, x.shape[0], dtype=x.dtype, device=x.device)
    return cache[key]


def ppr_step_reference(graph: "PPRGraph", xp, xe, rp, re, damping):
    """The same step written plainly (allocating, unfused): the equivalence tests' and benchmarks' baseline."""
    d = damping
    new_p = graph.to_passages @ xe
    if graph.between_passages is not None:
        new_p = new_p + graph.between_passages @ xp
    new_e = graph.to_entities @ xp
    g = xp[graph.dangling_passages].sum(0) + xe[graph.dangling_entities].sum(0)
    np_ = (1 - d) * rp + d * (new_p + g * rp)
    ne_ = (1 - d) * re + d * (new_e + g * re)
    change = (np_ - xp).abs().sum(0) + (ne_ - xe).abs().sum(0)
    return np_, ne_, change


# ----------------------------------------------------------------------------------------- Triton
# Two kernels per side: an SpMM over nnz-balanced pieces of the CSR rows (a row of a hub entity has
# hundreds of thousands of entries: split into pieces of PIECE entries, each a program, so no program
# walks a whole hub row; pieces of split rows add atomically), then one fused epilogue pass over
# [rows, B] tiles: new = d acc + coef r, stored, and sum |new - x| added to the column's change.
PIECE = 512
_KERNELS = None


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        import triton
        import triton.language as tl

        @triton.jit
        def spmm_pieces(piece_row, piece_start, piece_end, piece_split, col, val, x, acc, B, always_add,
                        BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
            # acc[row, cols] (+)= sum over the piece's entries j of val[j] * x[col[j], cols]
            p = tl.program_id(0)
            cols = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
            cmask = cols < B
            row = tl.load(piece_row + p).to(tl.int64)
            start = tl.load(piece_start + p)
            end = tl.load(piece_end + p)
            total = tl.zeros([BLOCK_B], dtype=tl.float32)
            for j0 in range(start, end, BLOCK_N):
                j = j0 + tl.arange(0, BLOCK_N)
                jm = j < end
                k = tl.load(col + j, mask=jm, other=0).to(tl.int64)
                v = tl.load(val + j, mask=jm, other=0.0)
                xt = tl.load(x + k[:, None] * B + cols[None, :], mask=jm[:, None] & cmask[None, :], other=0.0)
                total += tl.sum(v[:, None] * xt, axis=0)
            dst = acc + row * B + cols
            if (tl.load(piece_split + p) != 0) | (always_add != 0):
                tl.atomic_add(dst, total, mask=cmask)
            else:
                tl.store(dst, total, mask=cmask)

        @triton.jit
        def epilogue(acc, r, x, out, coef, change, n_rows, B, d,
                     BLOCK_R: tl.constexpr, BLOCK_B: tl.constexpr):
            # out = d * acc + coef * r;  change[cols] += sum over rows of |out - x|
            rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
            cols = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
            m = (rows < n_rows)[:, None] & (cols < B)[None, :]
            off = rows.to(tl.int64)[:, None] * B + cols[None, :]
            c = tl.load(coef + cols, mask=cols < B, other=0.0)
            new = d * tl.load(acc + off, mask=m, other=0.0) + c[None, :] * tl.load(r + off, mask=m, other=0.0)
            tl.store(out + off, new, mask=m)
            diff = tl.where(m, tl.abs(new - tl.load(x + off, mask=m, other=0.0)), 0.0)
            tl.atomic_add(change + cols, tl.sum(diff, axis=0), mask=cols < B)

        _KERNELS = (spmm_pieces, epilogue)
    return _KERNELS


def _pieces(graph, name: str):
    """The nnz-balanced work list of the CSR matrix graph.<name> (cached on the graph object)."""
    cache = graph.__dict__.setdefault("_triton_pieces", {})
    if name not in cache:
        mat = getattr(graph, name)
        crow = mat.crow_indices().to(torch.int64)
        lens = crow.diff()
        n = (lens + PIECE - 1) // PIECE
        row = torch.repeat_interleave(torch.arange(lens.numel(), device=crow.device), n)
        k = torch.arange(row.numel(), device=crow.device) - (torch.cumsum(n, 0) - n)[row]
        start = crow[row] + k * PIECE
        end = torch.minimum(start + PIECE, crow[row + 1])
        cache[name] = (row.to(torch.int32), start, end, (n[row] > 1).to(torch.int8))
    return cache[name]


def _spmm(graph, name, x, acc, always_add: bool = False):
    """acc += mat @ x (acc zeroed by the caller; the rows without entries stay 0). A row held by one
    piece is stored, not added, unless ``always_add`` (acc already holds another product)."""
    mat = getattr(graph, name)
    row, start, end, split = _pieces(graph, name)
    if row.numel() == 0:
        return
    B = x.shape[1]
    block_b = min(128, next_power_of_2(B))
    spmm = _kernels()[0]
    spmm[(row.numel(), (B + block_b - 1) // block_b)](row, start, end, split, mat.col_indices(), mat.values(), x,
                                                      acc, B, int(always_add), BLOCK_N=16, BLOCK_B=block_b)


def _epilogue(acc, r, x, out, coef, change, d):
    rows, B = out.shape
    if rows == 0:
        return
    block_b = min(128, next_power_of_2(B))
    block_r = max(1, 4096 // block_b)
    _kernels()[1][((rows + block_r - 1) // block_r, (B + block_b - 1) // block_b)](
        acc, r, x, out, coef, change, rows, B, d, BLOCK_R=block_r, BLOCK_B=block_b)


def _ppr_step_triton(graph, xp, xe, rp, re, d, coef, out_p, out_e):
    for t in (xp, xe, rp, re, out_p, out_e):
        assert t.is_contiguous() and t.dtype == torch.float32
    coef = coef.float().contiguous()
    change = torch.zeros(xp.shape[1], dtype=torch.float32, device=xp.device)
    acc = torch.zeros_like(xp)
    _spmm(graph, "to_passages", xe, acc)
    if graph.between_passages is not None:
        _spmm(graph, "between_passages", xp, acc, always_add=True)
    _epilogue(acc, rp, xp, out_p, coef, change, d)
    acc = torch.zeros_like(xe)
    _spmm(graph, "to_entities", xp, acc)
    _epilogue(acc, re, xe, out_e, coef, change, d)
    return change
