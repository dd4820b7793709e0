"""Triton: one PageRank step (kernels/ppr.py's ppr_step), two kernels per side.

An SpMM over nnz-balanced pieces of the CSR rows (a row of a hub entity has hundreds of thousands of
entries: split into pieces of PIECE entries, each a program, so no program walks a whole hub row;
pieces of split rows add atomically), then one fused epilogue pass over [rows, B] tiles:
new = d acc + coef r, stored, and sum |new - x| added to the column's change.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import next_power_of_2

PIECE = 512


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


def csr_pieces(mat: torch.Tensor):
    """The nnz-balanced work list of torch CSR ``mat``: (row int32, start, end, split int8) per piece."""
    crow = mat.crow_indices().to(torch.int64)
    lens = crow.diff()
    n = (lens + PIECE - 1) // PIECE
    row = torch.repeat_interleave(torch.arange(lens.numel(), device=crow.device), n)
    k = torch.arange(row.numel(), device=crow.device) - (torch.cumsum(n, 0) - n)[row]
    start = crow[row] + k * PIECE
    end = torch.minimum(start + PIECE, crow[row + 1])
    return row.to(torch.int32), start, end, (n[row] > 1).to(torch.int8)


def _spmm(mat, pieces, x, acc, always_add: bool = False):
    """acc += mat @ x (acc zeroed by the caller; the rows without entries stay 0). A row held by one
    piece is stored, not added, unless ``always_add`` (acc already holds another product)."""
    row, start, end, split = pieces
    if row.numel() == 0:
        return
    B = x.shape[1]
    block_b = min(128, next_power_of_2(B))
    spmm_pieces[(row.numel(), (B + block_b - 1) // block_b)](row, start, end, split, mat.col_indices(), mat.values(), x,
                                                            acc, B, int(always_add), BLOCK_N=16, BLOCK_B=block_b)


def _epilogue(acc, r, x, out, coef, change, d):
    rows, B = out.shape
    if rows == 0:
        return
    block_b = min(128, next_power_of_2(B))
    block_r = max(1, 4096 // block_b)
    epilogue[((rows + block_r - 1) // block_r, (B + block_b - 1) // block_b)](
        acc, r, x, out, coef, change, rows, B, d, BLOCK_R=block_r, BLOCK_B=block_b)


def ppr_step(to_passages, to_entities, between_passages, xp, xe, rp, re, d: float, coef, out_p, out_e,
             workspace: dict, entity_coef) -> torch.Tensor:
    """kernels.ppr.ppr_step's contract (block Gauss-Seidel: the entities from the new passage values),
    ``coef`` = (1 - d) + d * g of the passage half given, ``entity_coef(out_p)`` that of the entity half;
    ``workspace`` caches the work lists of the three matrices (keyed by role)."""
    for t in (xp, xe, rp, re, out_p, out_e):
        assert t.is_contiguous() and t.dtype == torch.float32

    def pieces(name, mat):
        key = ("triton_pieces", name)
        if key not in workspace:
            workspace[key] = csr_pieces(mat)
        return workspace[key]

    coef = coef.float().contiguous()
    change = torch.zeros(xp.shape[1], dtype=torch.float32, device=xp.device)
    acc = torch.zeros_like(xp)
    _spmm(to_passages, pieces("to_passages", to_passages), xe, acc)
    if between_passages is not None:
        _spmm(between_passages, pieces("between_passages", between_passages), xp, acc, always_add=True)
    _epilogue(acc, rp, xp, out_p, coef, change, d)
    acc = torch.zeros_like(xe)
    _spmm(to_entities, pieces("to_entities", to_entities), out_p, acc)
    _epilogue(acc, re, xe, out_e, entity_coef(out_p).float().contiguous(), change, d)
    return change
