"""The fused operations of linearrag_torch/kernels against plain formulas, on CPU tensors.

The pure-torch fallbacks run here always; the Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, CPU tensors, in a subprocess) when triton is installed, and are skipped otherwise.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from linearrag_torch import kernels
from linearrag_torch.retrieval.activation import nearest_entities
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.retrieval.pagerank import PPRGraph
from linearrag_torch.index.csr import Csr
from linearrag_torch.synthetic import random_index
from linearrag_torch.testing import passage_reset, ppr_step_reference, sigma_pair


def _graph(seed=0, P=30, E=40, adjacent=False, dangling=True):
    index = random_index(P, E, dim=8, seed=seed)  # unused entities are dangling nodes
    C = index.C
    if not dangling:  # drop the unused entities
        used = torch.unique(C.col)
        remap = torch.full((E,), -1, dtype=torch.int64)
        remap[used] = torch.arange(used.numel())
        C = Csr(C.crow, remap[C.col], C.val, (P, used.numel()))
    return index, PPRGraph.build(C, adjacent)


@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("dangling", [False, True])
def test_ppr_step_fallback_matches_the_plain_step(adjacent, dangling):
    _, g = _graph(1, adjacent=adjacent, dangling=dangling)
    P, E = g.to_passages.shape
    gen = torch.Generator().manual_seed(0)
    rp, re = torch.rand(P, 5, generator=gen), torch.rand(E, 5, generator=gen)
    tot = rp.sum(0) + re.sum(0)
    rp, re = rp / tot, re / tot
    xp, xe = torch.rand(P, 5, generator=gen) / P, torch.rand(E, 5, generator=gen) / E
    want_p, want_e, want_c = ppr_step_reference(g, xp, xe, rp, re, 0.3)
    out_p, out_e = torch.empty_like(xp), torch.empty_like(xe)
    change = g.ppr_step(xp.clone(), xe.clone(), rp, re, 0.3, out_p, out_e)
    torch.testing.assert_close(out_p, want_p, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(out_e, want_e, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(change, want_c, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("dangling", [False, True])
@pytest.mark.parametrize("B", [1, 3])
def test_ppr_step_on_joint_buffers_matches_the_plain_step(adjacent, dangling, B):
    """With ``joint`` (the passages and entities as row blocks of one buffer, as the one-question loop keeps
    them), the step writes the same iterate and takes the L1 change in one pass."""
    _, g = _graph(1, adjacent=adjacent, dangling=dangling)
    P, E = g.to_passages.shape
    gen = torch.Generator().manual_seed(1)
    rp, re = torch.rand(P, B, generator=gen), torch.rand(E, B, generator=gen)
    tot = rp.sum(0) + re.sum(0)
    rp, re = rp / tot, re / tot
    x = torch.cat([torch.rand(P, B, generator=gen) / P, torch.rand(E, B, generator=gen) / E])
    want_p, want_e, want_c = ppr_step_reference(g, x[:P], x[P:], rp, re, 0.3)
    out = torch.empty_like(x)
    change = g.ppr_step(x[:P], x[P:], rp, re, 0.3, out[:P], out[P:], (x, out))
    torch.testing.assert_close(out[:P], want_p, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(out[P:], want_e, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(change, want_c, rtol=1e-5, atol=1e-8)


def test_topk_columns_is_a_stable_descending_sort():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (50, 7), generator=gen).float()  # many ties
    scores[:, 3] = 1.0  # a constant column
    scores[5, 4] = float("nan")
    for k in (1, 3, 10, 50):
        idx, vals = kernels.topk_columns(scores, k)
        want_v, want_i = torch.sort(scores.T, dim=1, descending=True, stable=True)
        assert torch.equal(idx, want_i[:, :k])
        torch.testing.assert_close(vals, want_v[:, :k], equal_nan=True)
        for b in range(scores.shape[1]):  # one column alone (its own path)
            idx, vals = kernels.topk_columns(scores[:, b:b + 1], k)
            assert torch.equal(idx, want_i[b:b + 1, :k])
            torch.testing.assert_close(vals, want_v[b:b + 1, :k], equal_nan=True)


def _brute_topk(crow, col, rows, qcols, sigma, used, B, k):
    used = set(used.tolist())
    out = []
    for r, q in zip(rows.tolist(), qcols.tolist()):
        cand = [int(s) for s in col[crow[r]:crow[r + 1]].tolist() if int(s) * B + q not in used]
        cand.sort(key=lambda s: (-float(sigma[s, q]), s))
        out.append((cand[:k] + [-1] * k)[:k])
    return torch.tensor(out, dtype=torch.int64).view(-1, k)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("lazy", [False, True])
def test_segment_topk_sigma_matches_brute_force(k, lazy):
    index = random_index(40, 30, dim=8, seed=2)
    MT = index.M.transpose()
    B = 4
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, 8, generator=gen)
    sigma = index.sentence_emb @ q.T
    sigma[3, :] = sigma[4, :]  # a tie between two sentences
    rows = torch.randint(0, 30, (25,), generator=gen)
    qcols = torch.randint(0, B, (25,), generator=gen)
    used = torch.unique(torch.randint(0, index.num_sentences * B, (20,), generator=gen))
    arg = (index.sentence_emb, q) if lazy else sigma_pair(sigma)
    got = kernels.segment_topk_sigma(MT.crow, MT.col, rows, qcols, arg, used, B, k)
    if lazy:  # the brute force sees the very values the lazy path computes
        ss, bb = torch.meshgrid(torch.arange(index.num_sentences), torch.arange(B), indexing="ij")
        sigma = kernels.gather_sigma(arg, ss.flatten(), bb.flatten()).view(-1, B)
    want = _brute_topk(MT.crow, MT.col, rows, qcols, sigma, used, B, k)
    assert torch.equal(got, want)


@pytest.mark.parametrize("use_scatter", [False, True])
def test_segment_argmax_first_maximum(use_scatter):
    if use_scatter and not kernels.backends.torch_scatter_available():
        pytest.skip("torch-scatter is not installed (optional)")
    values = torch.tensor([1.0, 3.0, 3.0, float("-inf"), 2.0, 5.0, float("-inf")])
    owner = torch.tensor([0, 0, 0, 1, 1, 2, 4])  # segment 3 is empty, segment 4 has no finite value
    got = kernels.segment_argmax(values, owner, 5, use_scatter=use_scatter)
    assert got.tolist() == [1, 4, 5, -1, -1]


def test_spmm_sparse_rhs_equals_the_dense_product():
    gen = torch.Generator().manual_seed(3)
    A = (torch.rand(12, 9, generator=gen) < 0.3).float() * torch.rand(12, 9, generator=gen)
    AT = Csr.from_coo(*torch.nonzero(A.T, as_tuple=True), A.T[A.T != 0], (9, 12))
    V = (torch.rand(9, 4, generator=gen) < 0.4).float() * torch.rand(9, 4, generator=gen)
    r, c = torch.nonzero(V, as_tuple=True)
    for chunk in (1, 3, 1 << 20):  # several pairs per chunk, and one pair at a time
        out = kernels.spmm_sparse_rhs(AT.crow, AT.col, AT.val, r, c, V[r, c], torch.zeros(12, 4), max_entries=chunk)
        torch.testing.assert_close(out, A @ V)


@pytest.mark.parametrize("delta", [0.3, 0.0, -0.2])
def test_propagate_step_equals_the_matrix_form(delta):
    index = random_index(30, 25, dim=8, seed=4)
    M = index.M.torch()
    MT = index.M.transpose().torch()
    gen = torch.Generator().manual_seed(5)
    a = torch.where(torch.rand(25, 3, generator=gen) < 0.3, torch.rand(25, 3, generator=gen) * 1.6 - 0.3,
                    torch.zeros(25, 3))
    sigma = torch.rand(index.num_sentences, 3, generator=gen) * 2 - 0.5
    y = MT @ (sigma * (M @ (a * (a >= delta))))
    want = torch.maximum(y * (y >= delta), a)
    torch.testing.assert_close(kernels.propagate_step(M, MT, a, sigma_pair(sigma), delta), want, rtol=1e-5, atol=1e-6)


def test_sparse_passage_reset_equals_the_spmm_form():
    index = random_index(30, 25, dim=8, seed=6)
    N = index.N
    N_log = N.with_values(torch.log1p(N.val))
    gen = torch.Generator().manual_seed(7)
    tier = torch.randint(0, 3, (25, 4), generator=gen) * (torch.rand(25, 4, generator=gen) < 0.3)
    act = torch.rand(25, 4, generator=gen)
    sim = torch.rand(30, 4, generator=gen)
    cfg = RetrievalConfig()
    want = passage_reset(sim, N_log.torch(), act, tier, cfg)
    got = passage_reset(sim, N_log.torch(), act, tier, cfg, N_logT=N_log.transpose())
    torch.testing.assert_close(got, want)


def test_nearest_entities_in_blocks_equals_one_product():
    gen = torch.Generator().manual_seed(8)
    ents = torch.nn.functional.normalize(torch.randn(1000, 8, generator=gen), dim=1)
    ents[700] = ents[3]  # a tie across blocks: the lower index wins
    q = torch.cat([ents[3:4] * 2, torch.randn(20, 8, generator=gen)])
    best, arg = nearest_entities(ents, q, rows=7, cols=64)
    want = (q @ ents.T).max(dim=1)
    assert torch.equal(arg, want.indices) and arg[0] == 3
    torch.testing.assert_close(best, want.values)


def test_gather_sigma_is_each_pairs_own_product_whatever_the_chunk():
    """kernels.gather_sigma: a pair's value does not depend on the chunk or on the other pairs (so not on the
    batch), and is the dot product (float64 check)."""
    gen = torch.Generator().manual_seed(11)
    sent, q = torch.randn(500, 16, generator=gen), torch.randn(9, 16, generator=gen)
    s, b = torch.randint(0, 500, (3000,), generator=gen), torch.randint(0, 9, (3000,), generator=gen)
    want = (sent.double()[s] * q.double()[b]).sum(1)
    whole = kernels.gather_sigma((sent, q), s, b, chunk=1 << 16)
    torch.testing.assert_close(whole.double(), want, rtol=1e-5, atol=1e-5)
    for chunk in (1, 7, 1024):
        assert torch.equal(kernels.gather_sigma((sent, q), s, b, chunk=chunk), whole)
    alone = kernels.gather_sigma((sent, q[3:4]), s[b == 3], torch.zeros(int((b == 3).sum()), dtype=torch.int64))
    assert torch.equal(alone, whole[b == 3])  # one question alone: its values in the batch


def test_nearest_memo_scans_only_the_rows_after_the_last_calls(monkeypatch):
    """activation.NearestMemo: the answer of nearest_entities; a call that begins with the last call's rows
    (equal vectors and known rows) scans only the rest; anything else scans everything."""
    from linearrag_torch.retrieval import activation

    gen = torch.Generator().manual_seed(9)
    ents = torch.nn.functional.normalize(torch.randn(300, 8, generator=gen), dim=1)
    own = torch.randn(3, 8, generator=gen)
    extra = torch.cat([ents[5:6] * 0.5, torch.randn(2, 8, generator=gen)])
    scanned = []
    real = activation.nearest_entities

    def counting(e, q, *a, **k):
        scanned.append(q.shape[0])
        return real(e, q, *a, **k)

    monkeypatch.setattr(activation, "nearest_entities", counting)
    memo = activation.NearestMemo()
    first = memo(ents, own)
    both = torch.cat([own, extra])
    second = memo(ents, both)  # a later round: the question's entities, then the chain seeds
    want = real(ents, both)
    assert scanned == [3, 3]
    assert torch.equal(first[1], want[1][:3]) and torch.equal(second[1], want[1])
    torch.testing.assert_close(second[0], want[0])
    again = memo(ents, both, torch.full((6,), -1))  # the same rows, known rows -1 (= scan): no scan at all
    assert len(scanned) == 2 and torch.equal(again[1], second[1])
    memo(ents, both, torch.tensor([-1, -1, -1, 5, -1, -1]))  # a known row differs: everything (its own call)
    assert scanned[2] == 6
    n = len(scanned)
    other = own.clone()
    other[1, 0] += 1e-3
    memo(ents, other)  # other vectors: everything again
    assert scanned[n:] == [3]
    memo(ents, other[:2])  # fewer rows than last time: no reuse
    assert scanned[-1] == 2


def test_passage_cosines_keep_the_last_answer():
    """DeviceGraph.passage_cosines: emb @ qᵀ; within keeping_last (a chain's rounds) the same questions again get
    the kept answer; afterwards nothing is kept."""
    from linearrag_torch.retrieval.engine import DeviceGraph, cosines
    from linearrag_torch.synthetic import random_index

    graph = DeviceGraph(random_index(30, 40, dim=8, seed=4))
    gen = torch.Generator().manual_seed(5)
    q = torch.nn.functional.normalize(torch.randn(3, 8, generator=gen), dim=1)
    outside = graph.passage_cosines(q)
    assert torch.equal(outside, cosines(graph.passage_emb, q))
    assert graph.passage_cosines(q) is not outside  # outside keeping_last nothing is kept
    with graph.keeping_last():
        first = graph.passage_cosines(q)
        assert torch.equal(first, outside)
        assert graph.passage_cosines(q.clone()) is first  # equal vectors: kept
        other = q.clone()
        other[2, 0] += 1e-3
        second = graph.passage_cosines(other)
        assert second is not first and torch.equal(second, cosines(graph.passage_emb, other))
        assert graph.passage_cosines(q[:2]) is not second  # other shape: computed
        graph.nearest_memo(graph.entity_emb, q)
        assert graph.nearest_memo._last is not None
    assert graph._last_cosines is None and graph.nearest_memo._last is None  # dropped after the block
    with graph.keeping_last(False):  # a chunked batch: nothing kept
        graph.passage_cosines(q)
        assert graph._last_cosines is None


# ----------------------------------------------------------------------------------------- Triton, interpreted
TRITON_SCRIPT = textwrap.dedent(
    """
    import torch
    from linearrag_torch import kernels
    from linearrag_torch.kernels import ppr, segment_topk
    from linearrag_torch.kernels.triton import ppr as triton_ppr
    from linearrag_torch.retrieval.pagerank import PPRGraph
    from linearrag_torch.synthetic import random_index
    assert kernels.backends.use_triton(torch.zeros(1)), "the interpreter path is not selected"
    # one PageRank step, with the adjacent-passage operator and dangling nodes; PIECE = 2 splits
    # most CSR rows into pieces, so the atomic path runs too
    index = random_index(9, 12, dim=8, seed=0)
    for adjacent, triton_ppr.PIECE in ((False, 512), (True, 512), (False, 2), (True, 2)):
        g = PPRGraph.build(index.C, adjacent)
        gen = torch.Generator().manual_seed(1)
        P, E = g.to_passages.shape
        rp, re = torch.rand(P, 3, generator=gen), torch.rand(E, 3, generator=gen)
        xp, xe = torch.rand(P, 3, generator=gen), torch.rand(E, 3, generator=gen)
        wp, we = torch.empty_like(xp), torch.empty_like(xe)
        want = ppr._ppr_step_torch(g.to_passages, g.to_entities, g.between_passages, g.dangling_passage_idx,
                                   g.dangling_entity_idx, bool(g.dangling_passage_idx.numel() or g.dangling_entity_idx.numel()),
                                   xp.clone(), xe.clone(), rp, re, 0.4, wp, we, {})
        op, oe = torch.empty_like(xp), torch.empty_like(xe)
        change = g.ppr_step(xp.clone(), xe.clone(), rp, re, 0.4, op, oe)
        torch.testing.assert_close(op, wp, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(oe, we, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(change, want, rtol=1e-5, atol=1e-7)
    # per-entity top-k sentences with lazy sigma and a used set
    index = random_index(12, 10, dim=8, seed=2)
    MT = index.M.transpose()
    q = torch.randn(3, 8, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5])
    qcols = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 2, 2])
    used = torch.unique(torch.tensor([0, 4, 7, 11, 20, 30]))
    for k in (1, 2, 3):
        got = kernels.segment_topk_sigma(MT.crow, MT.col, rows, qcols, (index.sentence_emb, q), used, 3, k)
        want = segment_topk._segment_topk_torch(MT.crow, MT.col, rows, qcols, (index.sentence_emb, q), used, 3, k)
        assert torch.equal(got, want), (k, got, want)
    print("TRITON-INTERPRETER-OK")
    """
)


def test_triton_kernels_in_the_interpreter_match_the_fallbacks():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", LINEARRAG_KERNELS="triton")
    proc = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "TRITON-INTERPRETER-OK" in proc.stdout, proc.stdout + proc.stderr


def test_kernels_dispatch_to_torch_on_cpu_by_default(monkeypatch):
    monkeypatch.delenv("LINEARRAG_KERNELS", raising=False)
    assert not kernels.backends.use_triton(torch.zeros(1))
    monkeypatch.setenv("LINEARRAG_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels.backends.use_triton(torch.zeros(1))  # CPU tensors reach Triton only in the interpreter
