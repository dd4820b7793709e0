"""Compressed sparse rows (Csr) as plain tensors, the layout of the index's matrices, and the few operations
the index and the engine need on them.

torch's CSR support on CPU lacks transpose-as-CSR, index_select and row sums, so the index keeps
(crow, col, val) triples and builds torch.sparse_csr tensors (and pre-transposed copies) from them.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..kernels.backends import use_scipy_csr

# On the CPU, building a CSR from unsorted coordinates and transposing one go through scipy.sparse, whose
# conversions are counting sorts (linear in the entries; 2-3x faster than a torch argsort at 20M entries,
# and the gap grows with size). The torch paths (argsort) serve other devices; tests compare the two
# (the switch: kernels.backends.SCIPY_CSR).


def _scipy_coo_to_csr(row, col, val, shape) -> "Csr":
    import scipy.sparse as sp

    m = sp.coo_matrix((val.numpy(), (row.numpy(), col.numpy())), shape=shape).tocsr()
    m.sum_duplicates()  # canonical: columns ascending within rows, repeats summed (float32, as the torch path)
    return Csr(torch.from_numpy(m.indptr).long(), torch.from_numpy(m.indices).long(),
               torch.from_numpy(m.data).float(), tuple(shape))


def _scipy_transpose(a: "Csr") -> "Csr":
    import scipy.sparse as sp

    m = sp.csr_matrix((a.val.float().numpy(), a.col.numpy(), a.crow.numpy()), shape=a.shape).T.tocsr()
    return Csr(torch.from_numpy(m.indptr).long(), torch.from_numpy(m.indices).long(),
               torch.from_numpy(m.data).float(), (a.shape[1], a.shape[0]))


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
    def ones(rows, cols, shape, base: "Csr | None" = None) -> "Csr":
        """The 0/1 matrix with ones at (rows[i], cols[i]) and at ``base``'s entries (repeats count once)."""
        r = torch.as_tensor(rows, dtype=torch.int64)
        c = torch.as_tensor(cols, dtype=torch.int64)
        if base is not None:
            r, c = torch.cat([base.row_index(), r]), torch.cat([base.col, c])
        m = Csr.from_coo(r, c, torch.ones(r.numel(), dtype=torch.float32), shape)
        return m.with_values(torch.ones(m.nnz, dtype=torch.float32))

    @staticmethod
    def ragged(rows, ncols: int) -> "Csr":
        """From a list of column lists kept in the given order (not sorted, repeats kept; values 1): the
        layout of the index's NER record."""
        crow = torch.zeros(len(rows) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor([len(r) for r in rows], dtype=torch.int64), 0, out=crow[1:])
        col = torch.tensor([c for r in rows for c in r], dtype=torch.int64)
        return Csr(crow, col, torch.ones(col.numel(), dtype=torch.float32), (len(rows), ncols))

    def vstack(self, bottom: "Csr") -> "Csr":
        """Rows of this matrix then rows of ``bottom``, with bottom's column count (ours come first)."""
        crow = torch.cat([self.crow, self.crow[-1] + bottom.crow[1:]])
        return Csr(crow, torch.cat([self.col, bottom.col]), torch.cat([self.val, bottom.val]),
                   (self.shape[0] + bottom.shape[0], bottom.shape[1]))

    def row_lists(self) -> list:
        """Each row's columns as a Python list, in storage order."""
        crow, col = self.crow.tolist(), self.col.tolist()
        return [col[crow[r]:crow[r + 1]] for r in range(self.shape[0])]

    def submatrix(self, rows: torch.Tensor, cols: torch.Tensor) -> "Csr":
        """self[rows][:, cols] (both index lists in increasing order of the new numbering)."""
        row_map = torch.full((self.shape[0],), -1, dtype=torch.int64)
        row_map[rows] = torch.arange(rows.numel())
        col_map = torch.full((self.shape[1],), -1, dtype=torch.int64)
        col_map[cols] = torch.arange(cols.numel())
        r, c = row_map[self.row_index()], col_map[self.col]
        keep = (r >= 0) & (c >= 0)
        return Csr.from_coo(r[keep], c[keep], self.val[keep], (rows.numel(), cols.numel()))

    @staticmethod
    def from_coo(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape) -> "Csr":
        """Build from coordinates (duplicates are summed)."""
        nrows, ncols = shape
        v = val.float()
        scipy_path = use_scipy_csr(row)
        if scipy_path and row.numel() > 1 and not bool((row[1:] >= row[:-1]).all()):
            return _scipy_coo_to_csr(row, col, v, shape)  # rows out of order: no need to form the keys
        key = row.to(torch.int64) * max(ncols, 1) + col.to(torch.int64)
        if key.numel() > 1 and not bool((key[1:] > key[:-1]).all()):  # unless sorted without duplicates
            if scipy_path:
                return _scipy_coo_to_csr(row, col, v, shape)
            order = torch.argsort(key, stable=True)
            key, v = key.index_select(0, order), v.index_select(0, order)
            first = torch.ones(key.numel(), dtype=torch.bool, device=key.device)
            first[1:] = key[1:] != key[:-1]
            if not bool(first.all()):  # duplicates: sum each run of equal keys
                v = torch.zeros(int(first.sum()), dtype=torch.float32, device=v.device).index_add_(
                    0, torch.cumsum(first, 0) - 1, v)
                key = key[first]
        v = v.clone() if v is val else v
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
        """The transpose as a real CSR (not torch's CSC view). A stable sort of the entries by column
        keeps each new row's columns (the old rows) ascending; duplicates, if any, are summed."""
        rows = self.row_index()
        if self.nnz > 1 and bool(((rows[1:] == rows[:-1]) & (self.col[1:] <= self.col[:-1])).any()):
            # not a canonical CSR (columns unsorted or repeated within a row): the general path sums repeats
            return Csr.from_coo(self.col, rows, self.val, (self.shape[1], self.shape[0]))
        if use_scipy_csr(self.col):
            return _scipy_transpose(self)
        small = self.shape[1] < 2**31 - 1
        order = torch.argsort(self.col.to(torch.int32) if small else self.col, stable=True)  # int32 sorts faster
        crow = torch.zeros(self.shape[1] + 1, dtype=torch.int64, device=self.col.device)
        torch.cumsum(torch.bincount(self.col, minlength=self.shape[1]), 0, out=crow[1:])
        return Csr(crow, rows.index_select(0, order), self.val.float().index_select(0, order),
                   (self.shape[1], self.shape[0]))

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
