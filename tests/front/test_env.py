"""env.py: every environment variable the package reads is in its table, read through it, and listed in the
docs; the hardware checks and their old import paths."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from linearrag_torch import env

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "linearrag_torch"
# read the environment themselves: the HTTP client (torch-free, its own module; LINEARRAG_API_KEY is in the table)
# and kernels_mode, which sets LINEARRAG_KERNELS for a block
OWN_READERS = {"env.py", "client.py", "kernels/backends.py"}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8")


def test_every_linearrag_variable_named_in_the_package_is_in_the_table():
    names = {v.name for v in env.VARIABLES}
    used = {m for _, text in _sources() for m in re.findall(r"\bLINEARRAG_[A-Z_]*[A-Z]\b", text)}  # not LINEARRAG_LLM_*
    assert used and used <= names, sorted(used - names)
    assert len(names) == len(env.VARIABLES)


def test_only_env_reads_the_environment():
    readers = {rel for rel, text in _sources() if re.search(r"os\.environ|os\.getenv|getenv\(", text)}
    assert readers <= OWN_READERS, sorted(readers - OWN_READERS)


def test_the_docs_table_is_the_generated_one():
    page = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    assert env.markdown_table() in page, "docs/environment.md: paste `python -m linearrag_torch.env` into the table"


def test_get_reads_the_value_else_the_default(monkeypatch):
    monkeypatch.setenv(env.KERNELS.name, "torch")
    assert env.KERNELS.get() == "torch"
    monkeypatch.setenv(env.KERNELS.name, "")  # empty counts as unset
    assert env.KERNELS.get() == "auto"
    monkeypatch.delenv(env.MEMORY_BUDGET.name, raising=False)
    assert env.MEMORY_BUDGET.get() is None
    monkeypatch.setenv(env.CACHE.name, "/tmp/somewhere")
    assert env.cache_dir() == Path("/tmp/somewhere")
    monkeypatch.delenv(env.CACHE.name)
    assert env.cache_dir() == Path.home() / ".cache" / "linearrag_torch"


def test_offline_by_default_keeps_a_value_that_is_set(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    env.offline_by_default()
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "0"


def test_old_import_paths_are_the_same_functions():
    import linearrag_torch
    from linearrag_torch import api, distributed
    from linearrag_torch.answers import generation
    from linearrag_torch.index import PAUSE_ENV
    from linearrag_torch.models import encoding
    from linearrag_torch.kernels import backends
    from linearrag_torch.retrieval import engine, memory
    from linearrag_torch.runtime import threads
    from linearrag_torch.serve import settings

    assert linearrag_torch.resolve_device is api.resolve_device is env.resolve_device
    assert engine.native_half is env.native_half and encoding.native_bf16 is env.native_bf16
    assert distributed.device_for is env.device_for
    assert (memory.MEMORY_BUDGET_ENV, threads.THREADS_ENV, backends.KERNELS_ENV, settings.API_KEY_ENV, PAUSE_ENV,
            generation.ENV_CACHE) == (env.MEMORY_BUDGET.name, env.THREADS.name, env.KERNELS.name, env.API_KEY.name,
                                      env.TEST_PAUSE_BEFORE_COMMIT.name, env.LLM_CACHE.name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answers of a machine without CUDA")
def test_devices_without_cuda():
    assert env.resolve_device("auto") == torch.device("cpu") == env.resolve_device("cpu")
    with pytest.raises(ValueError, match="no CUDA device"):
        env.resolve_device("cuda")
    assert env.device_for(3, "auto") == torch.device("cpu")
    assert env.shards_device("auto", 4) == "cpu"
    with pytest.raises(ValueError, match="--shards 2 on CUDA needs 2 GPUs"):
        env.shards_device("cuda:0", 2)
    assert env.native_bf16("cuda") is False


def test_native_arithmetic_follows_the_cpu_capabilities(monkeypatch):
    caps = {"amx_bf16": False, "avx512_bf16": True, "amx_fp16": False, "avx512_fp16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    dispatch = ["AVX512"]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: dispatch[0])
    assert env.native_bf16("cpu") and env.native_half(torch.bfloat16, "cpu")
    assert not env.native_half(torch.float16, "cpu")
    caps["amx_fp16"] = True
    assert env.native_half(torch.float16, "cpu")
    assert env.native_half(torch.float16, "meta") is False and env.native_bf16("meta") is False
    # torch's kernels capped at AVX2 (ATEN_CPU_CAPABILITY=avx2, or a CPU without AVX-512): bf16 is emulated there
    dispatch[0] = "AVX2"
    assert not env.native_bf16("cpu") and not env.native_half(torch.bfloat16, "cpu")
    assert not env.native_half(torch.float16, "cpu")


def test_aten_cpu_capability_avx2_makes_a_bf16_cpu_choose_float32():
    """In a fresh process, as a user would set it: ATEN_CPU_CAPABILITY=avx2 caps torch's kernels at AVX2, so the
    encoder's and the reranker's `auto` precision is float32 whatever the CPU (an AVX2-only CPU's choice)."""
    import os
    import subprocess
    import sys

    code = ("import torch; from linearrag_torch import env; from linearrag_torch.models.encoding import "
            "resolve_precision; print(torch.backends.cpu.get_cpu_capability(), env.native_bf16('cpu'), "
            "resolve_precision('auto', 'cpu'))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["AVX2", "False", "float32"], out
