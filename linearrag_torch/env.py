"""One home for what the package reads from its surroundings: the environment variables (``VARIABLES``: name,
default, what it does, who reads it) and the hardware checks (the device "auto" means, native bf16 / half
arithmetic, the device of a shard's rank). The modules that read a variable import it from here; the
table in docs/environment.md is ``markdown_table()`` (``python -m linearrag_torch.env``; a test keeps the two
equal).

torch is imported inside the checks, not here: the HTTP client and the server's settings read their
variables without loading it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Variable:
    """An environment variable the package reads. ``default``: the value used when it is unset or empty
    (None: no value; what happens then is in ``doc``)."""

    name: str
    default: Optional[str]
    doc: str
    read_by: str  # the modules that read it

    def get(self) -> Optional[str]:
        """The variable's value, else ``default``; an empty value counts as unset."""
        return os.environ.get(self.name) or self.default


# ----------------------------------------------------------------------------------------- the package's own
MEMORY_BUDGET = Variable(
    "LINEARRAG_MEMORY_BUDGET", None,
    "working memory of one engine call (a query batch runs in chunks of questions that fit), e.g. `2G`, `512M`; "
    "unset: half the free GPU memory on CUDA; on the CPU chunks of 256 MiB (at least 64 questions) within a quarter "
    "of the available RAM (at most 4 GiB); "
    "`--memory-budget` of `linearrag serve` overrides it",
    "retrieval/memory.py")
THREADS = Variable(
    "LINEARRAG_THREADS", None,
    "torch's intra-op threads for the process (unset: torch's default, one per core); 1 holds up best when "
    "other busy processes share the cores; `--threads` overrides it",
    "runtime/threads.py")
KERNELS = Variable(
    "LINEARRAG_KERNELS", "auto",
    "the fused operations of the query path: `auto` (Triton kernels on CUDA tensors when Triton imports, "
    "the local PageRank's compiled numba push on CPU tensors when numba imports, torch elsewhere), `torch` (always the torch implementations), `triton` (also on CPU tensors, with "
    "`TRITON_INTERPRET=1`)",
    "kernels/backends.py")
CACHE = Variable(
    "LINEARRAG_CACHE", "~/.cache/linearrag_torch",
    "folder of what the package caches: the demo's index (`linearrag demo`), the ONNX export of the question "
    "encoder (`onnx/`)",
    "cli/demo.py, models/onnx_encoder.py")
API_KEY = Variable(
    "LINEARRAG_API_KEY", None,
    "the server requires `Authorization: Bearer KEY` on every route but /health (`--api-key` overrides it); "
    "the HTTP client sends it",
    "serve/settings.py, client.py")
LLM_BASE_URL = Variable(
    "LINEARRAG_LLM_BASE_URL", None,
    "the OpenAI-compatible chat endpoint of `linearrag answer`, `rag.answer`, `linearrag serve` (POST /answer) "
    "when `--llm-base-url` / `base_url=` is not given; unset: `$OPENAI_BASE_URL`",
    "answers/chat.py, cli/serve.py")
LLM_MODEL = Variable(
    "LINEARRAG_LLM_MODEL", None,
    "the chat model's name when `--llm-model` / `model=` is not given",
    "answers/chat.py")
LLM_API_KEY = Variable(
    "LINEARRAG_LLM_API_KEY", None,
    "the chat endpoint's key when `api_key=` is not given; unset: `$OPENAI_API_KEY`, else `EMPTY`",
    "answers/chat.py")
LLM_CACHE = Variable(
    "LINEARRAG_LLM_CACHE", "~/.cache/linearrag_torch/llm_cache.sqlite",
    "the disk cache of chat replies (`off` or `none`: no cache) when `cache=` is not given",
    "answers/chat.py")
SHARD_TIMEOUT = Variable(
    "LINEARRAG_SHARD_TIMEOUT", "3600",
    "seconds `linearrag query --shards N` waits for its processes",
    "distributed/launch.py")
TEST_PAUSE_BEFORE_COMMIT = Variable(
    "LINEARRAG_TEST_PAUSE_BEFORE_COMMIT", None,
    "for tests: seconds an index write pauses before it replaces index.json (the commit point)",
    "index/storage.py")
TEST_WRITE_STEP_PAUSE = Variable(
    "LINEARRAG_TEST_WRITE_STEP_PAUSE", None,
    "for tests: seconds an index write pauses after each of its steps, which it prints to stderr "
    "(benchmarks/write_crash.py kills the writer between them)",
    "index/storage.py")

# ----------------------------------------------------------------------------------------- other tools' variables
OPENAI_BASE_URL = Variable("OPENAI_BASE_URL", None, "the chat endpoint when `LINEARRAG_LLM_BASE_URL` is unset",
                           "answers/chat.py")
OPENAI_API_KEY = Variable("OPENAI_API_KEY", None, "the chat endpoint's key when `LINEARRAG_LLM_API_KEY` is unset",
                          "answers/chat.py")
TRITON_INTERPRET = Variable(
    "TRITON_INTERPRET", None,
    "`1`: Triton's CPU interpreter; with `LINEARRAG_KERNELS=triton` the Triton kernels then run on CPU tensors "
    "(tests)", "kernels/backends.py")
RANK = Variable("RANK", "0", "this process's rank (torchrun's)", "distributed/__main__.py")
WORLD_SIZE = Variable("WORLD_SIZE", "1", "the number of ranks, the shard count (torchrun's)", "distributed/__main__.py")
LOCAL_RANK = Variable(
    "LOCAL_RANK", None,
    "this process's rank on its machine (torchrun's); a CUDA rank runs on GPU LOCAL_RANK mod the GPU count "
    "(unset: the rank)", "env.py (device_for)")
RAY_ADDRESS = Variable(
    "RAY_ADDRESS", None,
    "the Ray cluster of `--ray` without an address (Ray's); unset: a running local cluster, else a new local one",
    "indexing/ray_build.py")
HF_HUB_OFFLINE = Variable(
    "HF_HUB_OFFLINE", "1",
    "set to 1 by `linearrag` and the torchrun entry point unless already set: models load from local folders "
    "and pip packages, nothing is downloaded", "cli/__init__.py, distributed/__main__.py (offline_by_default)")
TRANSFORMERS_OFFLINE = Variable("TRANSFORMERS_OFFLINE", "1", "as `HF_HUB_OFFLINE`",
                                "cli/__init__.py, distributed/__main__.py (offline_by_default)")

VARIABLES = (MEMORY_BUDGET, THREADS, KERNELS, CACHE, API_KEY, LLM_BASE_URL, LLM_MODEL, LLM_API_KEY, LLM_CACHE,
             SHARD_TIMEOUT, TEST_PAUSE_BEFORE_COMMIT, TEST_WRITE_STEP_PAUSE, OPENAI_BASE_URL, OPENAI_API_KEY,
             TRITON_INTERPRET, RANK, WORLD_SIZE, LOCAL_RANK, RAY_ADDRESS, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE)


def cache_dir() -> Path:
    """The package's cache folder: ``$LINEARRAG_CACHE``, else ~/.cache/linearrag_torch."""
    return Path(CACHE.get()).expanduser()


def offline_by_default() -> None:
    """HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 unless set (the command-line entry points call it first)."""
    for var in (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE):
        os.environ.setdefault(var.name, var.default)


def markdown_table() -> str:
    """``VARIABLES`` as the Markdown table of docs/environment.md."""
    rows = ["| variable | default | what it does | read by |", "|---|---|---|---|"]
    for v in VARIABLES:
        default = f"`{v.default}`" if v.default is not None else "unset"
        rows.append(f"| `{v.name}` | {default} | {v.doc} | {v.read_by} |")
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------------------- hardware checks
def _auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: "str | torch.device" = "auto") -> "torch.device":
    """The torch device a ``device`` argument names.

    Parameters
    ----------
    device : str or torch.device, default "auto"
        "auto" (CUDA when torch sees it, else the CPU), or anything ``torch.device`` takes ("cpu", "cuda:1").

    Returns
    -------
    torch.device
        The device. "cuda" without a CUDA device raises ``ValueError``.

    Examples
    --------
    >>> from linearrag_torch import resolve_device
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    import torch

    if str(device) == "auto":
        return torch.device(_auto_device())
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device (use --device cpu or auto)")
    return dev


def device_for(rank: int, device: str = "auto") -> "torch.device":
    """The device of a shard's rank: cuda:(local rank mod GPUs) when CUDA is present (device auto or cuda),
    else cpu; the local rank is ``$LOCAL_RANK`` (torchrun), else ``rank`` (local processes)."""
    import torch

    if device == "auto":
        device = _auto_device()
    if device == "cuda":
        local = int(LOCAL_RANK.get() or rank)
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device(device)


def shards_device(device: str, shards: int) -> str:
    """The device of `linearrag query --shards N`'s processes: "cuda" ("auto" with CUDA present, or any
    cuda device: NCCL puts one rank on each GPU, ValueError when there are fewer than ``shards``), else
    ``device`` ("cpu" for "auto")."""
    import torch

    dev = _auto_device() if device == "auto" else device
    if dev.startswith("cuda"):
        n = torch.cuda.device_count()
        if shards > n:
            raise ValueError(f"--shards {shards} on CUDA needs {shards} GPUs (NCCL puts one rank on each), "
                             f"torch sees {n}; use --device cpu (gloo) or fewer shards")
        return "cuda"
    return dev


def _cpu_capabilities() -> Optional[dict]:
    """torch.cpu.get_capabilities(), or None on an older torch without it."""
    import torch

    try:
        return torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):
        return None


def native_bf16(device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively (fast): CUDA with bf16 support, or a CPU
    with AMX-BF16 or AVX512-BF16. Elsewhere torch emulates bf16 on the CPU, slower than float32."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if dev.type != "cpu":
        return False
    if not _avx512_dispatch():
        return False
    caps = _cpu_capabilities()
    if caps is None:  # older torch
        probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        return bool(probe and probe())
    return bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))


def _avx512_dispatch() -> bool:
    """Whether torch dispatches its CPU kernels to AVX-512 (``torch.backends.cpu.get_cpu_capability()``): not
    where ATEN_CPU_CAPABILITY caps it at avx2 or below, which then runs bf16 by emulation whatever the CPU has
    (so ``ATEN_CPU_CAPABILITY=avx2`` makes a bf16 CPU choose what an AVX2-only one does: docs/tuning.md)."""
    import torch

    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return get is None or "AVX512" in str(get()).upper()


def native_half(dtype: "torch.dtype", device) -> bool:
    """Whether ``device`` multiplies ``dtype`` (float16 / bfloat16) natively, as fast as float32 or faster:
    CUDA (bfloat16 where supported), a CPU with AMX-BF16 or AVX512-BF16 for bfloat16 and with AVX512-FP16
    or AMX-FP16 for float16. Elsewhere torch emulates it, slower than float32."""
    import torch

    if dtype == torch.bfloat16:
        return native_bf16(device)  # the encoder's autocast asks the same question
    dev = torch.device(device)
    if dev.type == "cuda":
        return dtype == torch.float16
    if dev.type != "cpu":
        return False
    caps = _cpu_capabilities()
    return _avx512_dispatch() and caps is not None and any(bool(caps.get(f)) for f in ("amx_fp16", "avx512_fp16"))


if __name__ == "__main__":
    print(markdown_table(), end="")
