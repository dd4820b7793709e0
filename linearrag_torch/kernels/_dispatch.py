"""Which implementation a kernel runs: Triton for CUDA tensors when Triton imports, else pure torch.

``LINEARRAG_KERNELS`` overrides the choice: ``torch`` forces the fallbacks everywhere (to compare on a
GPU), ``triton`` also sends CPU tensors to the Triton kernels when ``TRITON_INTERPRET=1`` is set (the
interpreter runs them with numpy; the equivalence tests use this on tiny inputs).
"""
from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether ``import triton`` works (cached: an import failure is not retried)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a triton that does not match this torch
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """True when the kernels should run their Triton implementation on tensor ``t``."""
    mode = os.environ.get("LINEARRAG_KERNELS", "auto")
    if mode == "torch":
        return False
    if t.is_cuda:
        return triton_available()
    return mode == "triton" and os.environ.get("TRITON_INTERPRET") == "1" and triton_available()


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
