"""Loading what an index is built and queried with, in one place: the passages of a corpus (a JSONL path or a
list), the spaCy model, and the encoder (for passages in the index's precision; for questions in float32 or as
``quantize`` asks). LinearRAG, the Ray build, the sharded engine and the build's defaults all load through
these functions (tests stand in their own models by patching ``models.load_nlp`` / ``models.load_encoder``)."""
from __future__ import annotations

import dataclasses
import warnings

import torch

from . import env
from .config import IndexConfig
from .corpus import Passage, as_passages, check_new_ids, read_corpus


def is_path(corpus) -> bool:
    return isinstance(corpus, (str, bytes)) or hasattr(corpus, "__fspath__")


def read_passages(corpus, first_id: int = 0, existing_ids=()) -> list[Passage]:
    """The passages of ``corpus`` (a JSONL path, or a list of Passage / dicts), their ids checked new: not
    repeated and not in ``existing_ids`` (corpus.check_new_ids: InputError naming the file's line). The one
    check of the ids on the way into an index: callers pass ``ids_checked=True`` to build.add_passages."""
    passages = read_corpus(corpus, first_id=first_id) if is_path(corpus) else as_passages(corpus, first_id=first_id)
    check_new_ids(passages, existing_ids, source=corpus if is_path(corpus) else None)
    return passages


def load_nlp(cfg: IndexConfig):
    from .indexing.nlp import load_spacy

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
                      f"so the question encoder runs in float32 (emulated bf16 measured 5.8x slower)", RuntimeWarning,
                      stacklevel=3)
    cfg = dataclasses.replace(cfg, encoder_precision="auto" if quantize == "bfloat16" else "float32")
    int8 = quantize if quantize in ("int8", "int8-all") else None
    extra = {"quantize": int8} if int8 else {}  # (tests stand in a 2-argument loader)
    if backend != "torch":
        extra["backend"] = backend
    return load_encoder(cfg, device, **extra)


def load_encoder(cfg: IndexConfig, device, quantize: str | None = None, backend: str = "torch"):
    from .indexing.encoding import Encoder

    return Encoder(cfg.encoder, device=str(device), max_length=cfg.max_length, batch_size=cfg.batch_size,
                   quantize=quantize, precision=cfg.encoder_precision, backend=backend)
