"""Fused operations of the query path, one small module per operation.

Each operation is a typed function whose docstring states its formula. It dispatches on the tensors it
is given: the Triton kernel when they are on CUDA and Triton imports, else a pure-torch fallback
(what the CPU runs, and what the tests compare the Triton kernels with, in Triton's interpreter).

| operation | module | replaces |
|---|---|---|
| ppr_step | ppr.py | one PageRank iteration: 2 SpMM + ~12 element-wise passes |
| propagate_step | propagate.py | eq. 5: SpMM, sigma product, SpMM, threshold, max over dense [S, B] / [E, B] |
| segment_topk_sigma | segment_topk.py | reference mode: per-entity top-k unused sentences by sigma |
| spmm_sparse_rhs | sparse_rhs.py | eq. 7's N_log @ V for a V with few active entities per question |
| topk_columns | topk.py | a stable descending sort of [B, P] for the final top-k |
"""
from ._dispatch import triton_available, use_triton
from .ppr import dangling_mass, ppr_step, ppr_step_reference
from .propagate import propagate_step
from .segment_topk import gather_sigma, segment_argmax, segment_positions, segment_topk_sigma, top_k_per_segment
from .sparse_rhs import spmm_sparse_rhs
from .topk import topk_columns

__all__ = [
    "dangling_mass", "gather_sigma", "ppr_step", "ppr_step_reference", "propagate_step", "segment_argmax", "segment_positions",
    "segment_topk_sigma", "spmm_sparse_rhs", "top_k_per_segment", "topk_columns", "triton_available", "use_triton",
]
