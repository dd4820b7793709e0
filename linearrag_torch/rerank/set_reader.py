"""The set reader: a small attention head that reads a question's reranked candidates together.

The cross-encoder (scoring.py) scores each (question, context, candidate) pair alone. The set reader takes, for
each question, the pooled vectors the cross-encoder computed for its candidates (the vectors its head reads) and
features the engine has for free (the cross-encoder's logit, the pointwise fused score and its gap to the
question's best, the pointwise rank, the graph's rank and score, whether the pair was read in the chain rounds'
rerank, the number of candidates read), and lets the candidates attend to each other (``layers`` layers of
multi-head attention across a question's candidates, the padding masked); a linear read-out gives each candidate a
correction added to its pointwise fused score: ``fused + alpha * delta`` (``alpha`` fitted on held-out training
questions). A question's candidates are ordered by that score.

A reach classifier (a logistic regression on the question's embedding, the one the graph already computed)
picks the questions whose candidate list is read further (``RetrievalConfig.rerank_reach`` candidates instead of
``rerank_candidates``): comparisons and long chains, whose third and fourth passages sit lower in the graph's list.

Stored beside the cross-encoder in its folder: ``set_reader.safetensors`` (the head and the classifier, float32)
and ``set_reader.json`` (its shape, ``alpha``, the classifier's threshold and the training facts); the model card
is ``SET_READER.md``. Trained by ``linearrag train-set-reader`` (set_train.py). Nothing is pickled.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

SET_READER_WEIGHTS = "set_reader.safetensors"
SET_READER_SETTINGS = "set_reader.json"
SET_READER_CARD = "SET_READER.md"
FEATURES = ("logit", "fused", "fused_gap", "pointwise_rank", "graph_rank", "graph_score", "from_loop", "read")


def candidate_features(logits: torch.Tensor, fused: torch.Tensor, graph_scores: torch.Tensor,
                       from_loop: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
    """[B, K, len(FEATURES)] float32 features of each question's candidates (columns in the graph's order;
    ``fused``: the pointwise fused score, -inf where not read; ``valid``: the candidates read)."""
    B, K = logits.shape
    dev = logits.device
    f = torch.where(valid, fused, 0.0)
    best = fused.masked_fill(~valid, float("-inf")).amax(1, keepdim=True)
    gap = torch.where(valid, fused - torch.where(torch.isfinite(best), best, 0.0), 0.0)
    # the pointwise rank: how many read candidates have a higher fused score, ties to the earlier graph rank
    cols = torch.arange(K, device=dev)
    fa, fb = fused.unsqueeze(2), fused.unsqueeze(1)
    above = (fb > fa) | ((fb == fa) & (cols.view(1, 1, K) < cols.view(1, K, 1)))
    prank = (above & valid.unsqueeze(1)).sum(2).to(torch.float32)
    top = graph_scores[:, :1]
    ratio = torch.where(top > 0, graph_scores / top.clamp(min=1e-30), torch.zeros_like(graph_scores))
    gscore = torch.log(ratio.clamp(min=1e-6, max=1.0))
    loop = torch.zeros(B, K, device=dev) if from_loop is None else from_loop.to(torch.float32)
    n_read = valid.sum(1, keepdim=True).to(torch.float32).expand(B, K) / 10.0
    out = torch.stack([torch.where(valid, logits, 0.0), f, gap, torch.log1p(prank),
                       torch.log1p(cols.to(torch.float32)).expand(B, K), gscore, loop, n_read], 2)
    return out * valid.unsqueeze(2)


class SetAttention(torch.nn.Module):
    """One pre-norm layer: multi-head attention across a question's candidates (the padding masked), then a
    feed-forward block, both residual."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.ff = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        B, K, D = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).view(B, K, 3, h, D // h).permute(2, 0, 3, 1, 4)  # each [B, h, K, d]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D // h)
        att = att.masked_fill(~valid[:, None, None, :], float("-inf")).softmax(-1)
        att = torch.nan_to_num(att)  # a question with nothing read
        y = (att @ v).transpose(1, 2).reshape(B, K, D)
        x = x + self.drop(self.out(y))
        return x + self.drop(self.ff(self.norm2(x)))


class SetReader(torch.nn.Module):
    """The set head (module docstring) and the reach classifier.

    Parameters
    ----------
    hidden : int
        Size of the cross-encoder's pooled pair vectors.
    dim, heads, layers : int
        Width, attention heads and attention layers of the head.
    """

    def __init__(self, hidden: int = 384, dim: int = 64, heads: int = 4, layers: int = 1, dropout: float = 0.1,
                 query_dim: int = 384):
        super().__init__()
        self.shape = {"hidden": hidden, "dim": dim, "heads": heads, "layers": layers, "query_dim": query_dim}
        self.proj = torch.nn.Linear(hidden, dim)
        self.feat = torch.nn.Linear(len(FEATURES), dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.layers = torch.nn.ModuleList(SetAttention(dim, heads, dropout) for _ in range(layers))
        self.read_out = torch.nn.Sequential(torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 1))
        self.reach = torch.nn.Linear(query_dim, 1)
        torch.nn.init.zeros_(self.read_out[1].weight)  # starts as the pointwise order
        torch.nn.init.zeros_(self.read_out[1].bias)
        self.alpha = 1.0
        self.reach_threshold = 1.0  # probability above which a question is read further (> 1: never)
        self.facts: dict = {}

    def delta(self, vectors: torch.Tensor, features: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[B, K] correction of each candidate's pointwise fused score (0 where not read)."""
        x = self.norm(self.proj(vectors) + self.feat(features))
        for layer in self.layers:
            x = layer(x, valid)
        return self.read_out(x).squeeze(-1) * valid

    @torch.inference_mode()
    def score(self, vectors: torch.Tensor, logits: torch.Tensor, fused: torch.Tensor, graph_scores: torch.Tensor,
              from_loop: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
        """The set reader's score of each question's candidates ([B, K], -inf where not read): the pointwise
        ``fused`` score plus ``alpha`` times the head's correction. Runs in float32 on the tensors' device."""
        feats = candidate_features(logits, fused, graph_scores, from_loop, valid)
        d = self.delta(vectors.float(), feats, valid)
        return torch.where(valid, fused + self.alpha * d, float("-inf"))

    @torch.inference_mode()
    def wants_reach(self, query_emb: torch.Tensor) -> torch.Tensor:
        """[B] bool: the questions (their embeddings [B, query_dim]) whose candidates are read further."""
        return torch.sigmoid(self.reach(query_emb.float()).squeeze(-1)) > self.reach_threshold

    def settings(self) -> dict:
        return {**self.shape, "features": list(FEATURES), "alpha": self.alpha, "reach_threshold": self.reach_threshold,
                "format_version": 1, "extra": self.facts}


class SetReaderLoadError(RuntimeError):
    """A set reader's files that are incomplete or damaged (the message names the file)."""


def save_set_reader(reader: SetReader, folder, card: str | None = None) -> None:
    """Write set_reader.safetensors and set_reader.json (and SET_READER.md) into the reranker folder ``folder``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in reader.state_dict().items()}
    tmp = folder / (SET_READER_WEIGHTS + ".tmp")
    save_file(state, str(tmp))
    tmp.replace(folder / SET_READER_WEIGHTS)
    (folder / SET_READER_SETTINGS).write_text(json.dumps(reader.settings(), indent=2) + "\n")
    if card is not None:
        (folder / SET_READER_CARD).write_text(card)


def load_set_reader(folder=None, device="cpu") -> SetReader | None:
    """The set reader stored in the reranker folder ``folder`` (None: the packaged one), or None when it holds
    none; a damaged one raises SetReaderLoadError naming the file."""
    from ..models.reranker import packaged_reranker_folder

    folder = Path(folder) if folder else packaged_reranker_folder()
    js, wt = folder / SET_READER_SETTINGS, folder / SET_READER_WEIGHTS
    if not js.is_file():
        return None
    try:
        s = json.loads(js.read_text())
        reader = SetReader(s["hidden"], s["dim"], s["heads"], s["layers"], query_dim=s["query_dim"])
        if s.get("features") != list(FEATURES):
            raise SetReaderLoadError(f"{js}: field 'features' {s.get('features')} is not this version's {list(FEATURES)}")
        reader.alpha, reader.reach_threshold, reader.facts = float(s["alpha"]), float(s["reach_threshold"]), \
            s.get("extra", {})
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SetReaderLoadError(f"{js}: not a set reader's settings ({exc!r})") from exc
    if not wt.is_file():
        raise SetReaderLoadError(f"{wt}: missing (its settings are in {js.name})")
    from safetensors.torch import load_file

    try:
        reader.load_state_dict(load_file(str(wt)))
    except Exception as exc:  # safetensors and load_state_dict raise several kinds for a damaged file
        raise SetReaderLoadError(f"{wt}: cannot load the set reader's weights ({exc})") from exc
    return reader.to(device).eval()
