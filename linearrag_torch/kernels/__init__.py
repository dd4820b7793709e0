"""Fused operations of the query path: one entry point per operation, over plain tensors.

Each operation is a typed function whose docstring states its formula, with its pure-torch fallback
beside it in the same module (what the CPU runs, and what the tests compare the Triton kernels with, in
Triton's interpreter). Its Triton kernel lives at module level in ``kernels/triton/<op>.py``, imported
only when ``backends.use_triton`` says so; every availability check and switch (LINEARRAG_KERNELS,
torch-scatter, scipy conversions) is in ``backends.py``. Operations take tensors, never the library's
own classes; a cache that belongs with the caller's tensors comes in as a ``workspace`` dict.

| operation | module | Triton | replaces |
|---|---|---|---|
| ppr_step, dangling_mass | ppr.py | triton/ppr.py | one PageRank iteration: 2 SpMM + ~12 element-wise passes |
| propagate_step | propagate.py | - | eq. 5: SpMM, sigma product, SpMM, threshold, max over dense [S, B] / [E, B] |
| segment_topk_sigma | segment_topk.py | triton/segment_topk.py | reference mode: per-entity top-k unused sentences by sigma |
| gather_sigma | segment_topk.py | - | eq. 4 for the (sentence, question) pairs asked only |
| segment_argmax, top_k_per_segment, segment_positions | segment_topk.py | - | segmented reductions over CSR rows (torch-scatter on CPU when installed) |
| spmm_sparse_rhs | sparse_rhs.py | - | eq. 7's N_log @ V for a V with few active entities per question |
| topk_columns | topk.py | - | a stable descending sort of [B, P] for the final top-k |
| forward_push | push.py | - (numba/push.py on the CPU) | the local PageRank's rounds of pushes and top-k: a sorted table merged a few dozen passes a round |

Adding a CUDA kernel: write ``kernels/triton/<op>.py`` (kernels + a launcher over tensors), call it from
the op's entry point under ``if use_triton(t):``, and add the equivalence case to tests/kernels/test_kernels.py's
interpreter script and, for timing, benchmarks/fused_ops.py's ``run_cases``. A numba loop for CPU tensors goes in
``kernels/numba/<op>.py`` (functions at module level, ``cache=True``) behind ``backends.use_numba``.
"""
from . import backends
from .ppr import dangling_mass, ppr_step
from .propagate import propagate_step
from .push import forward_push
from .segment_topk import gather_sigma, segment_argmax, segment_positions, segment_topk_sigma, top_k_per_segment
from .sparse_rhs import spmm_sparse_rhs
from .topk import topk_columns

__all__ = [
    "backends", "dangling_mass", "forward_push", "gather_sigma", "ppr_step", "propagate_step", "segment_argmax", "segment_positions",
    "segment_topk_sigma", "spmm_sparse_rhs", "top_k_per_segment", "topk_columns",
]
