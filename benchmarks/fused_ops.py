"""What each fused operation of linearrag_torch/kernels gains over the unfused torch it replaces.

    python -m benchmarks.fused_ops [--passages 100000] [--batch 64] [--device cpu] [--json OUT]

Every case first checks that the fused and unfused results agree (max_abs_diff in the JSON), then
times both (median of --repeat runs after a warm-up; CUDA events on a GPU). On CUDA the fused ops run
their Triton kernels and, as a third row, their pure-torch fallbacks (LINEARRAG_KERNELS=torch).
benchmarks/gpu_check.py runs the same cases on a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from benchmarks.common import kernel_backends, make_graph, timed
from linearrag_torch import kernels
from linearrag_torch.retrieval.activation import nearest_entities
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.kernels.backends import kernels_mode, torch_scatter_available, triton_available
from linearrag_torch.retrieval.pagerank import PPRGraph, personalized_pagerank
from linearrag_torch.synthetic import random_queries
from linearrag_torch.testing import passage_reset, ppr_step_reference, propagate_reference, seed_entities, sigma_pair

DATE = "2026-11-30"


def _diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_diff(x, y) for x, y in zip(a, b))
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max()) if a.numel() else 0.0


# ----------------------------------------------------------------------------------------- unfused baselines
def ppr_unfused(graph, reset_p, reset_e, cfg):
    """The PageRank loop before kernels/: unfused step, torch.where on every column every iteration."""
    rp = torch.nan_to_num(reset_p, nan=0.0).clamp(min=0)
    re = torch.nan_to_num(reset_e, nan=0.0).clamp(min=0)
    total = rp.sum(0) + re.sum(0)
    valid = total > 0
    norm = torch.where(valid, total, torch.ones_like(total))
    rp, re = rp / norm, re / norm
    xp, xe = rp, re
    running = torch.ones_like(valid)
    last = torch.full_like(total, float("inf"))
    for _ in range(cfg.ppr_max_iter):
        np_, ne_, change = ppr_step_reference(graph, xp, xe, rp, re, cfg.damping)
        xp = torch.where(running, np_, xp)
        xe = torch.where(running, ne_, xe)
        running = running & (change >= cfg.ppr_tol) & (change < last)
        last = change
        if not bool(running.any()):
            break
    return xp, xe, valid


def topk_by_sort(scores, k):
    """The final top-k before kernels/: a stable descending sort of every column."""
    vals, idx = torch.sort(scores.T, dim=1, descending=True, stable=True)
    return idx[:, :k], vals[:, :k]


def propagate_step_dense(M, MT, a, sigma_dense, delta):
    """Eq. 5, one step, as matrices: SpMM, sigma product, SpMM, threshold mask, element-wise max."""
    y = MT @ (sigma_dense * (M @ (a * (a >= delta))))
    return torch.maximum(y * (y >= delta), a)


def propagate_reference_dense(M_crow, M_col, MT_crow, MT_col, sigma, seeds, is_seed, cfg):
    """Reference-mode activation before kernels/: dense [S, B] sigma, [E, B] masks and full-size
    temporaries every step, sort-based top-k (the same results)."""
    E, B = seeds.shape
    device = seeds.device
    score, weight = seeds.clone(), seeds.clone()
    tier = is_seed.to(torch.int64)
    frontier = torch.where(is_seed, seeds, torch.zeros_like(seeds))
    frontier_mask = is_seed.clone()
    used = torch.empty(0, dtype=torch.int64, device=device)
    for t in range(1, cfg.max_iterations):
        e_idx, b_idx = torch.nonzero(frontier_mask & (frontier >= cfg.delta), as_tuple=True)
        if e_idx.numel() == 0:
            break
        f = frontier[e_idx, b_idx]
        owner, pos, offsets = kernels.segment_positions(MT_crow, e_idx)
        s = MT_col[pos]
        b = b_idx[owner]
        sig = sigma[s, b]
        keys = s * B + b
        avail = ~torch.isin(keys, used) if used.numel() else torch.ones_like(keys, dtype=torch.bool)
        chosen = kernels.top_k_per_segment(torch.where(avail, sig, torch.full_like(sig, float("-inf"))), owner,
                                           offsets, cfg.top_k_sentence)
        used = torch.unique(torch.cat([used, keys[chosen]]))
        base = f[owner[chosen]] * sig[chosen]
        cs, cb = s[chosen], b[chosen]
        owner2, pos2, _ = kernels.segment_positions(M_crow, cs)
        e2, b2, cand = M_col[pos2], cb[owner2], base[owner2]
        ok = cand >= cfg.delta
        e2, b2, cand = e2[ok], b2[ok], cand[ok]
        flat = e2 * B + b2
        weight.view(-1).index_add_(0, flat, cand)
        new = torch.full((E * B,), float("-inf"), dtype=seeds.dtype, device=device)
        new.scatter_reduce_(0, flat, cand, "amax")
        trig = torch.zeros(E * B, dtype=torch.bool, device=device)
        trig[flat] = True
        new, trig = new.view(E, B), trig.view(E, B)
        score = torch.where(trig, new, score)
        tier = torch.where(trig, t + 1, tier)
        frontier = torch.where(trig, new, torch.zeros_like(new))
        frontier_mask = trig
    return score, tier, weight


# ----------------------------------------------------------------------------------------- cases
def run_cases(passages: int, batch: int, device: torch.device, repeat: int, dim: int = 64, log=print,
              argmax_size: int = 1 << 21) -> list:
    index, graph = make_graph(passages, dim, device)
    g = graph.ppr_graph(False)  # the walk on merged leaf buckets (pagerank.Leaves)
    g_full = PPRGraph.build(index.C, False, device, collapse_leaves=False)  # the walk as it was
    P, E, S = index.num_passages, index.num_entities, index.num_sentences
    Ew = g.to_entities.shape[0]
    cfg = RetrievalConfig(delta=0.2)  # a lower threshold than the default: activation reaches further
    q = random_queries(index, batch, seed=5).to(device)
    seeds, is_seed = seed_entities(graph.entity_emb, q.entity_emb, q.entity_owner, batch)
    sim = graph.passage_emb @ q.query_emb.T
    rows = []
    cuda = device.type == "cuda"

    def row(op, impl, ms, ref_ms, diff, **extra):
        r = {"op": op, "impl": impl, "device": str(device), "passages": P, "batch": batch, "ms": ms,
             "speedup_vs_unfused": ref_ms / ms if ms else None, "max_abs_diff_vs_unfused": diff, **extra}
        rows.append(r)
        log(f"  {op:<22} {impl:<28} {ms:10.2f} ms  x{r['speedup_vs_unfused']:.2f}  diff {diff:.2e}")

    def variants(fused):
        """(impl name, callable) of the fused op: auto (Triton on CUDA) and, on CUDA, the torch fallback."""
        out = [("fused (triton)" if cuda and triton_available() else "fused (torch)", fused)]
        if cuda:
            def fallback():
                with kernels_mode("torch"):
                    return fused()
            out.append(("fused (torch fallback)", fallback))
        return out

    # 1. one PageRank step (on the merged graph: the kernel alone)
    rp = torch.rand(P, batch, device=device)
    re = torch.rand(Ew, batch, device=device)
    tot = rp.sum(0) + re.sum(0)
    rp, re = rp / tot, re / tot
    xp, xe = rp * 0.9 + 0.1 / P, re * 0.9
    want = ppr_step_reference(g, xp, xe, rp, re, 0.5)
    ref_ms = timed(lambda: ppr_step_reference(g, xp, xe, rp, re, 0.5), device, repeat)
    row("ppr_step", "unfused torch", ref_ms, ref_ms, 0.0)
    bp, be, sp, se = torch.empty_like(xp), torch.empty_like(xe), xp.clone(), xe.clone()

    def step():
        sp.copy_(xp)
        se.copy_(xe)
        return bp, be, g.ppr_step(sp, se, rp, re, 0.5, bp, be)

    copy_ms = timed(lambda: (sp.copy_(xp), se.copy_(xe)), device, repeat)  # the bench's own copies, subtracted
    for name, fn in variants(step):
        got = fn()
        row("ppr_step", name, max(timed(fn, device, repeat) - copy_ms, 1e-6), ref_ms, _diff(got, want))

    # 2. the whole PageRank (steps + convergence handling): the unfused loop on the full graph, then
    # the fused steps on the full graph, then on merged leaf buckets
    reset_e = torch.where(is_seed, seeds, torch.zeros_like(seeds))
    reset_p = passage_reset(sim, graph.N_log, seeds, is_seed.long(), cfg)
    want = ppr_unfused(g_full, reset_p, reset_e, cfg)
    ref_ms = timed(lambda: ppr_unfused(g_full, reset_p, reset_e, cfg), device, max(1, repeat // 2))
    row("personalized_pagerank", "unfused loop, full graph", ref_ms, ref_ms, 0.0, entity_rows=E)
    for graph_name, gg in (("full graph", g_full), ("leaf buckets", g)):
        for name, fn in variants(lambda gg=gg: personalized_pagerank(gg, reset_p, reset_e, cfg, entity_scores=False)):
            got = fn()
            row("personalized_pagerank", f"{name}, {graph_name}", timed(fn, device, max(1, repeat // 2)), ref_ms,
                _diff(got[0], want[0]), entity_rows=gg.to_entities.shape[0])

    # 3. final top-k
    scores = torch.rand(P, batch, device=device)
    want = topk_by_sort(scores, 10)
    ref_ms = timed(lambda: topk_by_sort(scores, 10), device, max(1, repeat // 2))
    row("top-k passages", "stable sort", ref_ms, ref_ms, 0.0)
    got = kernels.topk_columns(scores, 10)
    row("top-k passages", "topk_columns", timed(lambda: kernels.topk_columns(scores, 10), device, repeat), ref_ms,
        float(max(_diff(got[1], want[1]), float((got[0] != want[0]).sum()))))

    # 4. reference-mode activation (per-entity top-k sentences over CSR rows, lazy sigma)
    sigma_dense_fn = lambda: graph.sentence_emb @ q.query_emb.T  # noqa: E731
    args = (graph.M_crow, graph.M_col, graph.MT_crow, graph.MT_col)

    def dense_ref():
        return propagate_reference_dense(*args, sigma_dense_fn(), seeds, is_seed, cfg)

    want = dense_ref()
    ref_ms = timed(dense_ref, device, repeat)
    row("reference activation", "dense sigma + masks", ref_ms, ref_ms, 0.0, sigma_bytes=S * batch * 4)
    lazy = (graph.sentence_emb, q.query_emb)
    for name, fn in variants(lambda: propagate_reference(*args, lazy, seeds, is_seed, cfg)):
        a = fn()
        row("reference activation", name, timed(fn, device, repeat), ref_ms, _diff((a.act, a.reset), (want[0], want[2])))

    # 4b. the per-entity top-k alone, on the seeds' rows: argmax paths
    e_idx, b_idx = torch.nonzero(is_seed, as_tuple=True)
    used = torch.empty(0, dtype=torch.int64, device=device)
    sig_dense = sigma_dense_fn()
    sig_pair = sigma_pair(sig_dense)  # the precomputed [S, B] sigma in the pair form (one-hot query side)

    def dense_sort():  # the torch path, as before the Triton kernel
        with kernels_mode("torch"):
            return kernels.segment_topk_sigma(graph.MT_crow, graph.MT_col, e_idx, b_idx, sig_pair, used, batch, 2)

    want = dense_sort()
    ref_ms = timed(dense_sort, device, repeat)
    row("segment top-2 sentences", "dense sigma, sort", ref_ms, ref_ms, 0.0, pairs=int(e_idx.numel()))
    for name, fn in variants(lambda: kernels.segment_topk_sigma(graph.MT_crow, graph.MT_col, e_idx, b_idx, lazy, used,
                                                                batch, 2)):
        got = fn()
        row("segment top-2 sentences", name + ", lazy sigma", timed(fn, device, repeat), ref_ms,
            float((got != want).sum()), pairs=int(e_idx.numel()))

    # 5. paper-mode step
    a0 = torch.where(is_seed, seeds, torch.zeros_like(seeds))
    want = propagate_step_dense(graph.M, graph.MT, a0, sig_dense, cfg.delta)
    ref_ms = timed(lambda: propagate_step_dense(graph.M, graph.MT, a0, sigma_dense_fn(), cfg.delta), device, repeat)
    row("paper propagate_step", "dense SpMM chain", ref_ms, ref_ms, 0.0, sigma_bytes=S * batch * 4)
    got = kernels.propagate_step(graph.M, graph.MT, a0, lazy, cfg.delta)
    row("paper propagate_step", "touched entries", timed(lambda: kernels.propagate_step(graph.M, graph.MT, a0, lazy,
                                                                                     cfg.delta), device, repeat),
        ref_ms, _diff(got, want))

    # 6. eq. 7 with a sparse right-hand side
    act, tier = seeds, is_seed.long()
    want = passage_reset(sim, graph.N_log, act, tier, cfg)
    ref_ms = timed(lambda: passage_reset(sim, graph.N_log, act, tier, cfg), device, repeat)
    row("passage_reset (eq. 7)", "SpMM over all of N", ref_ms, ref_ms, 0.0)
    got = passage_reset(sim, graph.N_log, act, tier, cfg, N_logT=graph.N_logT)
    row("passage_reset (eq. 7)", "spmm_sparse_rhs", timed(lambda: passage_reset(sim, graph.N_log, act, tier, cfg,
                                                                             N_logT=graph.N_logT), device, repeat),
        ref_ms, _diff(got, want))

    # 7. seeds: the Q x E similarity in blocks
    full = lambda: (q.entity_emb @ graph.entity_emb.T).max(dim=1)  # noqa: E731
    want = full()
    ref_ms = timed(full, device, repeat)
    row("seeds (eq. 3)", "full Q x E matrix", ref_ms, ref_ms, 0.0, matrix_bytes=q.entity_emb.shape[0] * E * 4)
    got = nearest_entities(graph.entity_emb, q.entity_emb)
    row("seeds (eq. 3)", "blocked nearest_entities", timed(lambda: nearest_entities(graph.entity_emb, q.entity_emb),
                                                          device, repeat), ref_ms,
        float((got[1] != want.indices).sum()))

    # 8. the segmented argmax (top-1 sentence) with and without torch-scatter
    n, groups = argmax_size, max(1, argmax_size // 20)
    name = f"segment_argmax {n}/{groups}"
    owner = torch.sort(torch.randint(0, groups, (n,), device=device)).values
    vals = torch.rand(n, device=device)
    want = kernels.segment_argmax(vals, owner, groups, use_scatter=False)
    ref_ms = timed(lambda: kernels.segment_argmax(vals, owner, groups, use_scatter=False), device, repeat)
    row(name, "native scatter_reduce", ref_ms, ref_ms, 0.0)
    ix = kernels.segment_topk.sorted_offsets(owner, groups)
    ref2 = timed(lambda: kernels.top_k_per_segment(vals, owner, ix[:-1], 1), device, repeat)
    row(name, "two stable argsorts", ref2, ref_ms, 0.0)
    if torch_scatter_available():
        got = kernels.segment_argmax(vals, owner, groups, use_scatter=True)
        row(name, "torch_scatter.segment_max_csr",
            timed(lambda: kernels.segment_argmax(vals, owner, groups, use_scatter=True), device, repeat), ref_ms,
            float((got != want).sum()))
    return rows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None, help="bar chart of the speed-ups (default: the JSON path with .png)")
    return ap.parse_args(argv)


def report(rows: list, args, device: torch.device, argv=None) -> None:
    """The JSON result file and its bar chart (when --json or --png is given)."""
    if args.json:
        out = {"benchmark": "kernels", "date": DATE, "torch": torch.__version__, "device": str(device),
               "threads": args.threads, "cpu_count": os.cpu_count(), **kernel_backends(),
               "command": " ".join(["python", "-m", "benchmarks.fused_ops"] + (argv or sys.argv[1:])), "rows": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    if args.png or args.json:
        plot(rows, args.png or args.json.with_suffix(".png"), f"{device}, {args.passages:,} passages, batch {args.batch}")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = run_cases(args.passages, args.batch, device, args.repeat)
    report(rows, args, device, argv)
    return 0


def plot(rows: list, png: Path, title: str) -> None:
    """One horizontal bar per (op, implementation): speed-up over the unfused torch it replaces (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("speedup_vs_unfused")]
    fig, ax = plt.subplots(figsize=(10.5, 0.32 * len(rows) + 1.2))
    labels = [f"{r['op']}: {r['impl']}" for r in rows]
    ax.barh(range(len(rows)), [r["speedup_vs_unfused"] for r in rows],
            color=["0.7" if r["speedup_vs_unfused"] == 1.0 else "tab:blue" for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set(xlabel="speed-up over the unfused torch (grey: the baseline row)", title=f"linearrag_torch kernels, {title}")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
