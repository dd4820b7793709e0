"""The models an index is built and queried with, and their loaders: the spaCy pipeline and NER (nlp.py), the
encoder (encoding.py: for passages in the index's precision, for questions in float32 or as ``quantize`` asks; its
lean BERT forward, bert_forward.py; its ONNX Runtime form, onnx_encoder.py) and the learned reranker's network and
folder (reranker.py; the one shipped with the package lies in ``linearrag_torch/data/reranker/``, scored by
rerank/). LinearRAG, the Ray build, the sharded engine and the build's defaults load through these functions
(tests stand in their own models by patching ``models.load_nlp`` / ``models.load_encoder``). This package imports
none of indexing/, retrieval/ or rerank/: they use it."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch

from .. import env
from ..config import IndexConfig
from .encoding import Encoder


def load_nlp(cfg: IndexConfig):
    from .nlp import load_spacy  # deferred: imports spaCy (~1.4 s), needed only when NER runs

    return load_spacy(cfg.spacy_model)


def with_precision(encoder, precision: str):
    """``encoder`` (an encoding.Encoder) in ``precision``, sharing its model; a stand-in or int8 one as it is."""
    if getattr(encoder, "quantize", "stand-in") is None and encoder.precision != precision:
        return encoder.with_precision(precision)
    return encoder


def load_question_encoder(cfg: IndexConfig, device, quantize: str | None = None, backend: str = "torch"):
    """The question encoder of an index made with ``cfg``: its model, in float32 whatever the index was
    encoded in, or as ``quantize`` asks, on ``backend`` (LinearRAG.__init__)."""
    if quantize == "bfloat16" and not env.native_bf16(device):
        warnings.warn(f"quantize='bfloat16': {torch.device(device)} has no native bf16 (AMX-BF16, AVX512-BF16 or CUDA), "
                      f"so the question encoder runs in float32 (emulated bf16 is far slower: docs/tuning.md, "
                      f"'Encoder precision')", RuntimeWarning,
                      stacklevel=3)
    cfg = dataclasses.replace(cfg, encoder_precision="auto" if quantize == "bfloat16" else "float32")
    int8 = quantize if quantize in ("int8", "int8-all") else None
    extra = {"quantize": int8} if int8 else {}  # (tests stand in a 2-argument loader)
    if backend != "torch":
        extra["backend"] = backend
    return load_encoder(cfg, device, **extra)


def load_encoder(cfg: IndexConfig, device, quantize: str | None = None, backend: str = "torch"):
    return Encoder(cfg.encoder, device=str(device), max_length=cfg.max_length, batch_size=cfg.batch_size,
                   quantize=quantize, precision=cfg.encoder_precision, backend=backend)


@dataclass
class IndexModels:
    """What building an index loads, once: the spaCy model, the passage encoder (the index's precision) and the
    question encoder (the same model in float32, unless the caller chose the encoder)."""

    nlp: object
    passage_encoder: object
    question_encoder: object


def for_index(cfg: IndexConfig, device, nlp=None, encoder=None) -> IndexModels:
    """The models of a build with ``cfg`` on ``device``; ``nlp``, ``encoder``: the caller's own, used as they are."""
    nlp = nlp if nlp is not None else load_nlp(cfg)
    if encoder is not None:
        return IndexModels(nlp, encoder, encoder)
    encoder = load_encoder(cfg, device)
    return IndexModels(nlp, encoder, with_precision(encoder, "float32"))

