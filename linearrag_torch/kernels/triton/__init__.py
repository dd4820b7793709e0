"""The Triton kernels of the fused operations, one module per operation, kernels at module level.

Each module imports ``triton`` at import time, so the torch-side entry points (``kernels/<op>.py``)
import it only after ``backends.use_triton`` said yes. A module holds the ``@triton.jit`` kernels and
one launcher taking plain tensors, with the same contract as the entry point's torch fallback; the
tests compare the two in Triton's interpreter (tests/kernels/test_kernels.py).
"""


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
