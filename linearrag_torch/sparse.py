"""Compressed sparse rows as plain tensors, and the few operations the index needs on them.

torch's CSR support on CPU lacks transpose-as-CSR, index_select and row sums, so the index keeps
(crow, col, val) triples and builds torch.sparse_csr tensors (and pre-transposed copies) from them.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


@dataclass
class Csr:
    """A rows x cols sparse matrix: row r holds col[crow[r]:crow[r+1]] with values val[...]."""

    crow: torch.Tensor  # int64 [rows + 1]
    col: torch.Tensor  # int64 [nnz]
    val: torch.Tensor  # float32 [nnz]
    shape: tuple

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    @staticmethod
    def from_rows(rows, ncols: int, values=None) -> "Csr":
        """Build from a list of column lists (and optionally a parallel list of value lists)."""
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        crow = torch.zeros(len(rows) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=crow[1:])
        col = torch.tensor([c for r in rows for c in r], dtype=torch.int64)
        if values is None:
            val = torch.ones(col.numel(), dtype=torch.float32)
        else:
            val = torch.tensor([v for r in values for v in r], dtype=torch.float32)
        return Csr(crow, col, val, (len(rows), ncols)).sorted()

    @staticmethod
    def from_coo(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape) -> "Csr":
        """Build from coordinates (duplicates are summed)."""
        nrows, ncols = shape
        key = row.to(torch.int64) * max(ncols, 1) + col.to(torch.int64)
        key, inv = torch.unique(key, sorted=True, return_inverse=True)
        v = torch.zeros(key.numel(), dtype=torch.float32, device=val.device).index_add_(0, inv, val.float())
        r = key // max(ncols, 1)
        crow = torch.zeros(nrows + 1, dtype=torch.int64, device=row.device)
        crow[1:] = torch.cumsum(torch.bincount(r, minlength=nrows), 0)
        return Csr(crow, key % max(ncols, 1), v, (nrows, ncols))

    def row_index(self) -> torch.Tensor:
        """The row of every stored entry (the COO row vector)."""
        return torch.repeat_interleave(
            torch.arange(self.shape[0], device=self.crow.device), self.crow.diff()
        )

    def sorted(self) -> "Csr":
        """Columns sorted within each row, duplicates summed."""
        return Csr.from_coo(self.row_index(), self.col, self.val, self.shape)

    def transpose(self) -> "Csr":
        """The transpose as a real CSR (not torch's CSC view)."""
        return Csr.from_coo(self.col, self.row_index(), self.val, (self.shape[1], self.shape[0]))

    def with_values(self, val: torch.Tensor) -> "Csr":
        return Csr(self.crow, self.col, val, self.shape)

    def row_sums(self) -> torch.Tensor:
        out = torch.zeros(self.shape[0], dtype=self.val.dtype, device=self.val.device)
        return out.index_add_(0, self.row_index(), self.val)

    def to(self, device) -> "Csr":
        return Csr(self.crow.to(device), self.col.to(device), self.val.to(device), self.shape)

    def torch(self, device=None, dtype=torch.float32, index_dtype=torch.int64) -> torch.Tensor:
        """A torch.sparse_csr_tensor of this matrix on ``device``.

        ``index_dtype=torch.int32`` (see compact_index_dtype) halves the index memory, and on CPU saves
        the int64 -> int32 copy of both index arrays that MKL's SpMM otherwise makes on every product.
        """
        d = device if device is not None else self.crow.device
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                self.crow.to(device=d, dtype=index_dtype), self.col.to(device=d, dtype=index_dtype),
                self.val.to(device=d, dtype=dtype), size=self.shape,
                check_invariants=False,  # check() validates loaded indexes once
            )

    def compact_index_dtype(self) -> torch.dtype:
        """int32 when every index of this matrix fits in it, else int64."""
        fits = max(self.nnz, *self.shape) < 2**31 - 1
        return torch.int32 if fits else torch.int64

    def scipy(self):
        import scipy.sparse as sp

        return sp.csr_matrix(
            (self.val.cpu().numpy(), self.col.cpu().numpy(), self.crow.cpu().numpy()), shape=self.shape
        )

    def check(self, name: str) -> None:
        """Raise ValueError naming ``name`` unless this is a well-formed CSR."""
        rows, cols = self.shape
        if self.crow.dtype != torch.int64 or self.col.dtype != torch.int64:
            raise ValueError(f"{name}: index arrays must be int64")
        if self.crow.numel() != rows + 1:
            raise ValueError(f"{name}: row pointer has {self.crow.numel()} entries, expected {rows + 1}")
        if int(self.crow[0]) != 0 or int(self.crow[-1]) != self.col.numel() or self.val.numel() != self.col.numel():
            raise ValueError(f"{name}: row pointer does not match the {self.col.numel()} stored entries")
        if rows and bool((self.crow.diff() < 0).any()):
            raise ValueError(f"{name}: row pointer is not monotone")
        if self.col.numel() and (int(self.col.min()) < 0 or int(self.col.max()) >= cols):
            raise ValueError(f"{name}: column index out of range [0, {cols})")
