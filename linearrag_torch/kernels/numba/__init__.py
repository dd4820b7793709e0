"""The numba-compiled CPU loops of the fused operations, one module per operation, functions at module level
(so that numba's disk cache finds them again in the next process). Each module imports ``numba`` at import time:
the entry points (``kernels/<op>.py``) import it only after ``backends.use_numba`` said yes."""
