"""Which implementation each operation runs, and every switch that changes it: the one place to look.

| switch | where | effect |
|---|---|---|
| ``LINEARRAG_KERNELS`` (environment) | ``use_triton`` | ``auto`` (default): Triton for CUDA tensors when Triton imports; ``torch``: the pure-torch fallbacks everywhere (to compare on a GPU); ``triton``: also CPU tensors, in Triton's interpreter, when ``TRITON_INTERPRET=1`` (the equivalence tests) |
| ``TRITON_INTERPRET=1`` (environment) | ``use_triton`` | read by Triton itself; with ``LINEARRAG_KERNELS=triton`` sends CPU tensors to the kernels |
| numba installed | ``use_numba`` | the local PageRank's forward push on CPU tensors runs one compiled loop per question (push.py) instead of the torch table; ``LINEARRAG_KERNELS=torch`` keeps the table |
| torch-scatter installed | ``use_torch_scatter`` | ``segment_argmax`` on CPU tensors uses ``torch_scatter.segment_max_csr`` (one pass) |
| ``SCIPY_CSR`` (this module) | ``use_scipy_csr`` | CPU CSR building and transposes in ``index.csr.Csr`` go through scipy's linear-time conversions (tests switch it off to check the torch path) |

``kernels_mode(mode)`` sets ``LINEARRAG_KERNELS`` for a ``with`` block (benchmarks, tests).
A new backend adds its availability check and its ``use_*`` predicate here; the operations ask these
predicates and nothing else.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os

import torch

from .. import env

KERNELS_ENV = env.KERNELS.name  # auto | torch | triton
SCIPY_CSR = True  # index.csr.Csr: scipy's counting-sort conversions for CPU tensors (see use_scipy_csr)


@functools.lru_cache(maxsize=None)
def _imports(*modules: str) -> bool:
    """Whether every module imports (cached: an import failure is not retried). Any exception counts as absent:
    an ImportError, or a build that does not match this torch or numpy."""
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception:
        return False
    return True


def triton_available() -> bool:
    """Whether ``import triton`` works (cached: an import failure is not retried).

    Returns
    -------
    bool
        True when Triton and triton.language import.
    """
    return _imports("triton", "triton.language")


def torch_scatter_available() -> bool:
    """Whether the optional torch-scatter package imports (pip install torch-scatter: compiles from source).

    Returns
    -------
    bool
        True when torch_scatter imports (cached).
    """
    return _imports("torch_scatter")


def numba_available() -> bool:
    """Whether the optional numba package imports (pip install 'linearrag_torch[numba]').

    Returns
    -------
    bool
        True when numba imports (cached).
    """
    return _imports("numba")


def faiss_available() -> bool:
    """Whether FAISS imports (pip install 'linearrag_torch[ann]': faiss-cpu), for the ANN stage (retrieval/ann.py).

    Returns
    -------
    bool
        True when faiss imports (cached).
    """
    return _imports("faiss")


def kernels_setting() -> str:
    """The value of ``LINEARRAG_KERNELS`` (``auto`` when unset).

    Returns
    -------
    str
        "auto", "torch" or "triton".
    """
    return env.KERNELS.get()


def use_triton(t: torch.Tensor) -> bool:
    """Whether the operations run their Triton implementation on a tensor.

    Parameters
    ----------
    t : torch.Tensor
        A tensor the operation works on.

    Returns
    -------
    bool
        True for a CUDA tensor when Triton imports (unless ``LINEARRAG_KERNELS=torch``), and for a CPU tensor
        with ``LINEARRAG_KERNELS=triton`` and ``TRITON_INTERPRET=1`` (Triton's interpreter).

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch.kernels.backends import kernels_mode, use_triton
    >>> with kernels_mode("torch"):
    ...     use_triton(torch.zeros(1))
    False
    """
    mode = kernels_setting()
    if mode == "torch":
        return False
    if t.is_cuda:
        return triton_available()
    return mode == "triton" and env.TRITON_INTERPRET.get() == "1" and triton_available()


def use_torch_scatter(t: torch.Tensor) -> bool:
    """Whether ``segment_argmax`` uses torch-scatter on a tensor.

    Parameters
    ----------
    t : torch.Tensor
        The values.

    Returns
    -------
    bool
        True when torch-scatter is installed and ``t`` is on the CPU, where its argmax is the first maximum and
        it is faster (docs/benchmarks/kernels.md).
    """
    return t.device.type == "cpu" and torch_scatter_available()


def use_numba(t: torch.Tensor) -> bool:
    """Whether the local PageRank's forward push (push.py) runs its compiled numba loop on a tensor.

    Parameters
    ----------
    t : torch.Tensor
        A tensor of the push.

    Returns
    -------
    bool
        True for a CPU tensor when numba imports, unless ``LINEARRAG_KERNELS=torch``.
    """
    return t.device.type == "cpu" and kernels_setting() != "torch" and numba_available()


def use_scipy_csr(t: torch.Tensor) -> bool:
    """Whether ``index.csr.Csr`` converts a tensor's matrix with scipy.

    Parameters
    ----------
    t : torch.Tensor
        A tensor of the matrix.

    Returns
    -------
    bool
        True for CPU tensors while ``SCIPY_CSR`` is on.
    """
    return t.device.type == "cpu" and SCIPY_CSR


@contextlib.contextmanager
def kernels_mode(mode: str):
    """Set ``LINEARRAG_KERNELS`` for the ``with`` block (benchmarks, tests), then restore it.

    Parameters
    ----------
    mode : str
        "auto", "torch" or "triton" (see the module's table).

    Examples
    --------
    >>> from linearrag_torch.kernels.backends import kernels_mode, kernels_setting
    >>> with kernels_mode("torch"):
    ...     kernels_setting()
    'torch'
    """
    old = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = old
