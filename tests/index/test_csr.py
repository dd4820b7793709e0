"""Csr construction and transpose: the scipy path (CPU) and the torch path (other devices) against a
dense reference and against each other, on random coordinates with repeats, in any order."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from linearrag_torch.kernels import backends
from linearrag_torch.index.csr import Csr


def _dense(a: Csr) -> torch.Tensor:
    out = torch.zeros(a.shape, dtype=torch.float64)
    out.index_put_((a.row_index(), a.col), a.val.double(), accumulate=True)
    return out


def _canonical(a: Csr) -> bool:
    rows = a.row_index()
    same_row = rows[1:] == rows[:-1]
    return bool((a.col[1:][same_row] > a.col[:-1][same_row]).all())


@pytest.fixture(params=[True, False], ids=["scipy", "torch"])
def path(request, monkeypatch):
    monkeypatch.setattr(backends, "SCIPY_CSR", request.param)
    return request.param


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 7), cols=st.integers(1, 9), n=st.integers(0, 60), seed=st.integers(0, 2**31 - 1))
def test_from_coo_and_transpose_match_dense_on_both_paths(rows, cols, n, seed):
    g = torch.Generator().manual_seed(seed)
    if rows == 0:
        n = 0
    r = torch.randint(0, max(rows, 1), (n,), generator=g)
    c = torch.randint(0, cols, (n,), generator=g)
    v = torch.randint(1, 5, (n,), generator=g).float()
    want = torch.zeros(rows, cols, dtype=torch.float64).index_put_((r, c), v.double(), accumulate=True)
    results = []
    for use_scipy in (True, False):
        backends.SCIPY_CSR = use_scipy
        try:
            a = Csr.from_coo(r, c, v, (rows, cols))
            t = a.transpose()
        finally:
            backends.SCIPY_CSR = True
        a.check("a")
        t.check("t")
        assert _canonical(a) and _canonical(t)
        assert a.crow.dtype == torch.int64 and a.val.dtype == torch.float32
        assert torch.equal(_dense(a), want) and torch.equal(_dense(t), want.T)
        results.append((a, t))
    (a1, t1), (a2, t2) = results
    for x, y in ((a1, a2), (t1, t2)):  # the same arrays, not only the same matrix
        assert torch.equal(x.crow, y.crow) and torch.equal(x.col, y.col) and torch.equal(x.val, y.val)


def test_transpose_of_a_non_canonical_csr_sums_repeats(path):
    # row 0 holds column 2 twice and out of order
    a = Csr(torch.tensor([0, 3, 4]), torch.tensor([2, 0, 2, 1]), torch.tensor([1.0, 2.0, 3.0, 4.0]), (2, 3))
    t = a.transpose()
    assert t.shape == (3, 2)
    assert torch.equal(_dense(t), torch.tensor([[2.0, 0.0], [0.0, 4.0], [4.0, 0.0]], dtype=torch.float64))
    assert t.nnz == 3



def test_csr_building_blocks_of_index_updates():
    top = Csr.ragged([[2, 0, 2], []], 3)  # order and repeats kept
    assert top.row_lists() == [[2, 0, 2], []] and top.shape == (2, 3)
    both = top.vstack(Csr.ragged([[1]], 4))
    assert both.row_lists() == [[2, 0, 2], [], [1]] and both.shape == (3, 4)
    ones = Csr.ones([0, 0, 1], [1, 1, 0], (2, 2), base=Csr.ones([1], [1], (2, 2)))
    assert ones.row_lists() == [[1], [0, 1]] and ones.val.tolist() == [1.0, 1.0, 1.0]
    m = Csr.from_rows([[0, 2], [1], [0, 1, 2]], 3, [[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]])
    sub = m.submatrix(torch.tensor([0, 2]), torch.tensor([0, 2]))
    assert sub.row_lists() == [[0, 1], [0, 1]] and sub.val.tolist() == [1.0, 2.0, 4.0, 6.0]
