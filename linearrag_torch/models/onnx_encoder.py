"""The encoder's transformer on ONNX Runtime (``Encoder(backend="onnx")``, extra ``[onnx]``): float32, on the CPU.

The transformer is exported once per model folder and torch version (torch.onnx's TorchScript exporter, eager
attention so that the padding mask is part of the graph, dynamic batch and length) to
``$LINEARRAG_CACHE/onnx/`` (default ``~/.cache/linearrag_torch/onnx/``), checked against torch on a padded probe
batch before it is kept (atomic rename), and loaded from there afterwards. Pooling and normalisation stay in
torch (encoding.Encoder). ONNX Runtime fuses the attention, layer norms and GELU and calls far fewer kernels
than torch's eager modules: a short question costs a fraction of the torch forward pass, while long batches
(indexing) are matrix products either way. Vectors equal torch's float32 ones to float noise (measured:
docs/tuning.md, "ONNX Runtime question encoder").

The session's threads are fixed when it is made: torch's thread count at that time (linearrag_torch.retrieval.pipeline
.set_threads / --threads before the first question). Its threads do not spin while they wait: spinning made
the encoder alone faster, but its threads then compete with torch's for the cores and the graph stage that
follows slowed down more than that, so end to end it lost (measured: docs/benchmarks/throughput.md, "Question
encoders compared: exact, bf16, ONNX Runtime").
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path

import torch

from .. import env, extras

EXPORT_VERSION = 1  # bump when the export changes: old files are then exported again
PROBE_TOLERANCE = 1e-4  # largest |onnx - torch| of a hidden state accepted from a fresh export


def cache_dir() -> Path:
    return env.cache_dir() / "onnx"


def _runtime():
    extras.require("onnx", "onnxruntime", what="the onnx encoder backend")
    import onnxruntime

    return onnxruntime


def model_digest(folder: Path) -> str:
    """A key of the model's files (names, sizes and contents of config and weights) and the torch version."""
    h = hashlib.sha256(f"{EXPORT_VERSION}\0{torch.__version__}".encode())
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".txt"):
            h.update(f"\0{f.name}\0{f.stat().st_size}\0".encode())
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
    return h.hexdigest()[:20]


def exported_model(folder: Path) -> Path:
    """The ONNX file of the transformer in ``folder``: from the cache, else exported, checked and cached."""
    folder = Path(folder)
    out = cache_dir() / f"{folder.name}-{model_digest(folder)}.onnx"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".onnx.tmp", dir=out.parent)
    os.close(fd)
    try:
        _export(folder, Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp's file is private; the cache is not
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class _LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=torch.zeros_like(input_ids)).last_hidden_state


def _export(folder: Path, path: Path) -> None:
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar
    try:
        model = AutoModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager").eval()
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    wrapped = _LastHidden(model)
    # a probe with padding, so that the mask's path is traced and checked
    ids = torch.tensor([[101, 2054, 2003, 1996, 3007, 1997, 2605, 1029, 102], [101, 3000, 102, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).to(torch.int64)
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "hidden": {0: "batch", 1: "tokens"}}
    with torch.no_grad():
        want = wrapped(ids, mask)  # before the export, which may leave the module changed
    with warnings.catch_warnings(), torch.no_grad():  # tracer warnings about python branches on shapes
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                          output_names=["hidden"], dynamic_axes=axes, opset_version=17, dynamo=False)
    got = hidden_states(session(path, threads=1), ids, mask)
    keep = mask.bool()
    err = float((got[keep] - want[keep]).abs().max())
    if not err <= PROBE_TOLERANCE:
        raise RuntimeError(f"the ONNX export of {folder} differs from torch by {err:.2e} (> {PROBE_TOLERANCE}); "
                           f"use the torch encoder backend")


def session(path: Path, threads: int | None = None):
    """An ONNX Runtime CPU session on ``path`` with ``threads`` intra-op threads (default torch's), no spinning."""
    ort = _runtime()
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads or torch.get_num_threads())
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # a damaged cache file: say which
        raise RuntimeError(f"ONNX Runtime cannot load {path} ({exc}); delete it to export again") from None


def hidden_states(sess, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The transformer's last hidden states [batch, tokens, dim] (float32, CPU) for int64 ids and mask."""
    feed = {"input_ids": input_ids.to("cpu", torch.int64).numpy(),
            "attention_mask": attention_mask.to("cpu", torch.int64).numpy()}
    return torch.from_numpy(sess.run(None, feed)[0])
