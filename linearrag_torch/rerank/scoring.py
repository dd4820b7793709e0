"""Rescoring the graph's top candidates with the cross-encoder, batched on the engine's device.

``Reranker.rerank`` takes the graph's ranking of a batch (``Retrieved``, best first) and the questions'
token ids, builds every (question, candidate) pair on the device (``pair_inputs``: gathers, no host
copy), scores them in passes of one fixed shape (``Reranker.rows_per_pass`` pairs of ``max_length`` tokens, the
last pass filled with copies of its first pair), fuses each logit with the graph's rank and score
(RerankerSettings) and sorts each question's candidates by the fused score (stable: ties keep the graph's order).
Every pair has the same length and every pass the same shape, so a pair's logit does not depend on the pairs
beside it, bit for bit, in any precision: with passes of any number of pairs, the kernels a pass takes depend on
its size (on an AMX Xeon in bf16, a pair's logit scored alone differed by up to 0.02 from the same pair's in a
pass of 42, and one in 120 pairs differed in passes of 7 or 31; in float32 by up to 5e-6).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import env
from ..config import RERANKER_PRECISIONS
from ..models.encoding import quantize_int8
from ..models.reranker import CrossEncoder, RerankerSettings, load_model


@dataclass
class PassageTokens:
    """Every passage's token ids (title, newline, text; no special tokens), cut to ``ids.shape[1]`` tokens."""

    ids: torch.Tensor  # [P, Lp] int64, 0-padded
    lengths: torch.Tensor  # [P] int64

    def score_pairs(self, reranker: "Reranker", q: "QuestionTokens", q_of_pair: torch.Tensor, rows: torch.Tensor,
                    context: torch.Tensor | None, vectors: bool = False, **passes):
        """Reranker.pair_logits of the pairs (question q_of_pair[i], passage rows[i], context row context[i]):
        every passage is held here, so every pair is scored here. (A shard of the sharded engine holds only its
        passages: distributed/engine.py's scores there the pairs it holds and sums the logits over the ranks.)
        ``vectors``: (logits, the pairs' pooled vectors) (the set reader's input, rerank/set_reader.py).
        ``passes``: pair_logits' ``pair_tokens`` and ``length_step``."""
        return reranker.pair_logits(q, self, q_of_pair, rows, context, **({"vectors": True} if vectors else {}),
                                    **passes)


class QuestionTokens(NamedTuple):
    """The questions' token ids with [CLS] and [SEP] (cut to RerankerSettings.question_tokens)."""

    ids: torch.Tensor  # [B, Lq] int64, 0-padded
    lengths: torch.Tensor  # [B] int64

    def select(self, rows: torch.Tensor) -> "QuestionTokens":
        return QuestionTokens(self.ids.index_select(0, rows.to(self.ids.device)),
                              self.lengths.index_select(0, rows.to(self.lengths.device)))

    def to(self, device) -> "QuestionTokens":
        return QuestionTokens(self.ids.to(device), self.lengths.to(device))


class Reranked(NamedTuple):
    """The candidates of each question in the fused order: passage rows, fused scores, and for each the
    cross-encoder's logit and the graph's score and rank (0-based) it came with."""

    indices: torch.Tensor  # [B, K] int64
    scores: torch.Tensor  # [B, K] float32 (fused)
    logits: torch.Tensor  # [B, K] float32
    graph_scores: torch.Tensor  # [B, K] float32
    graph_ranks: torch.Tensor  # [B, K] int64
    contexts: torch.Tensor | None = None  # [B, K] int64: each candidate's context row (-1: none); None: plain pairs
    vectors: torch.Tensor | None = None  # [B, K, H] float32: each pair's pooled vector (kept for the set reader)
    known: torch.Tensor | None = None  # [B, K] bool: the pair's logit was taken from an earlier rerank of the batch

    def join(self, other: "Reranked") -> "Reranked":
        """The candidates of both, side by side (the pairs a batch has scored so far: Reranker.rerank's ``known``)."""
        return Reranked(*(None if a is None or b is None else torch.cat([a, b.to(a.device)], 1)
                          for a, b in zip(self, other)))


def tokenize_questions(tokenizer, questions: list[str], settings: RerankerSettings) -> QuestionTokens:
    """The questions' ids with [CLS] and [SEP], cut to settings.question_tokens (on the CPU)."""
    enc = tokenizer(list(questions), truncation=True, max_length=settings.question_tokens, padding=True,
                    return_tensors="pt")
    return QuestionTokens(enc["input_ids"].to(torch.int64), enc["attention_mask"].sum(1))


def tokenize_passages(tokenizer, texts: list[str], settings: RerankerSettings) -> PassageTokens:
    """The passages' ids without special tokens, cut to what a pair leaves them (on the CPU)."""
    cap = settings.max_length - 4  # a pair has [CLS] [SEP] before, [SEP] and one padding after the passage
    rows = tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=cap)["input_ids"] if texts else []
    ids = torch.zeros(len(rows), cap, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
    return PassageTokens(ids, torch.tensor([len(r) for r in rows], dtype=torch.int64))


def pair_ends(q: QuestionTokens, p: PassageTokens, q_of_pair: torch.Tensor, passage_of_pair: torch.Tensor,
              length: int, context_of_pair: torch.Tensor | None = None, context_tokens: int = 0) -> torch.Tensor:
    """The position of each pair's closing [SEP] when laid out at ``length`` tokens (pair_inputs' ``end``, [n]):
    the pair's own tokens are ``end + 1``, and it fits any layout of at least ``end + 2`` tokens (its last
    position padding) with the same tokens."""
    start = q.lengths.index_select(0, q_of_pair)
    part_end = start
    if context_of_pair is not None and context_tokens > 0:
        cl = p.lengths.index_select(0, context_of_pair.clamp(min=0)).clamp(max=context_tokens - 1)
        part_end = start + torch.where((context_of_pair >= 0) & (cl > 0), cl + 1, 0)
    return torch.clamp(part_end + p.lengths.index_select(0, passage_of_pair), max=length - 2)


def pair_inputs(q: QuestionTokens, p: PassageTokens, q_of_pair: torch.Tensor, passage_of_pair: torch.Tensor,
                length: int, sep_id: int, pad_id: int = 0, context_of_pair: torch.Tensor | None = None,
                context_tokens: int = 0):
    """input_ids, attention_mask, token_type_ids [n, length] of n pairs ``[CLS] question [SEP] passage [SEP]``
    (the passage cut to fit, then padding), built on the tensors' device without a host copy. The last
    position is always padding: a pass whose mask were all ones would take another attention kernel
    (transformers drops such a mask), and a pair's score would then depend on the pairs beside it.

    Chain-aware pairs (``context_tokens`` > 0 and ``context_of_pair`` given): the passage row in
    ``context_of_pair`` (-1: none) is read after the question, cut to ``context_tokens - 1`` tokens and
    closed by [SEP]: ``[CLS] question [SEP] context [SEP] passage [SEP]``; the context has the question's
    token type."""
    n = q_of_pair.numel()
    dev = q.ids.device
    pos = torch.arange(length, device=dev).expand(n, length)
    sep = torch.full((n, length), sep_id, dtype=torch.int64, device=dev)
    start = q.lengths.index_select(0, q_of_pair).unsqueeze(1)  # where the segment after the question begins
    ids = q.ids.index_select(0, q_of_pair).gather(1, pos.clamp(max=q.ids.shape[1] - 1))
    if context_of_pair is not None and context_tokens > 0:
        has = (context_of_pair >= 0).unsqueeze(1)
        rows = context_of_pair.clamp(min=0)
        cl = torch.where(has, p.lengths.index_select(0, rows).unsqueeze(1).clamp(max=context_tokens - 1), 0)
        c_part = p.ids.index_select(0, rows).gather(1, (pos - start).clamp(0, p.ids.shape[1] - 1))
        ids = torch.where((pos >= start) & (pos < start + cl), c_part, ids)
        ids = torch.where((pos == start + cl) & (cl > 0), sep, ids)
        question_part_end = start + torch.where(cl > 0, cl + 1, 0)
    else:
        question_part_end = start
    pl = p.lengths.index_select(0, passage_of_pair).unsqueeze(1)
    end = torch.minimum(question_part_end + pl, torch.full_like(start, length - 2))  # where the closing [SEP] goes
    p_part = p.ids.index_select(0, passage_of_pair).gather(1, (pos - question_part_end).clamp(0, p.ids.shape[1] - 1))
    ids = torch.where(pos >= question_part_end, p_part, ids)
    ids = torch.where(pos == end, sep, ids)
    valid = pos <= end
    ids = torch.where(valid, ids, torch.full_like(ids, pad_id))
    return ids, valid.to(torch.int64), ((pos >= question_part_end) & valid).to(torch.int64)


def _known_logits(indices: torch.Tensor, contexts: torch.Tensor | None, known: Reranked):
    """For candidates ``indices`` [B, K] with their ``contexts`` (None: plain pairs): the logit of each pair that
    ``known`` holds (the same question, passage and context; anything where it holds none), a [B, K] bool, True
    where it holds none, and the pairs' vectors from ``known`` ([B, K, H]; None where it keeps none)."""
    same = indices.unsqueeze(2) == known.indices.to(indices.device).unsqueeze(1)  # [B, K, K']
    if contexts is not None:
        same &= contexts.unsqueeze(2) == known.contexts.to(indices.device).unsqueeze(1)
    where = same.to(torch.uint8).argmax(2)
    vecs = None
    if known.vectors is not None:
        v = known.vectors.to(indices.device)
        vecs = v.gather(1, where.unsqueeze(2).expand(-1, -1, v.shape[2]))
    return known.logits.to(indices.device).gather(1, where), ~same.any(2), vecs


def _filled(x: torch.Tensor, fill: int) -> torch.Tensor:
    """``x`` followed by ``fill`` copies of its first element (a pass's filling pairs)."""
    return torch.cat([x, x[:1].expand(fill)])


def chain_context(indices: torch.Tensor) -> torch.Tensor:
    """Each candidate's context passage in chain-aware pairs ([B, K] -> [B, K], -1: none): the question's top
    graph candidate, and for that candidate itself the second (a second hop is relevant through the first)."""
    first = indices[:, :1].expand_as(indices)
    second = indices[:, 1:2].expand_as(indices) if indices.shape[1] > 1 else torch.full_like(indices, -1)
    ctx = torch.where(indices == first, second, first)
    return ctx.masked_fill(indices < 0, -1)


def fuse(settings: RerankerSettings, logits: torch.Tensor, graph_scores: torch.Tensor) -> torch.Tensor:
    """The fused score of each candidate (columns in graph order): RerankerSettings' formula."""
    K = logits.shape[1]
    ranks = torch.arange(K, device=logits.device, dtype=logits.dtype).expand_as(logits)
    top = graph_scores[:, :1]
    ratio = torch.where(top > 0, graph_scores / top.clamp(min=1e-30), torch.zeros_like(graph_scores))
    return (settings.w_model * logits + settings.w_rank * torch.log1p(ranks)
            + settings.w_score * torch.log(ratio.clamp(min=1e-6, max=1.0)))


# what "auto" runs the reranker in on a CPU without native bf16 (int8 measured against float32 on the three dev
# sets: docs/tuning.md, "Which CPU gets which precision")
AUTO_WITHOUT_BF16 = "float32"


def resolve_precision(precision: str, device) -> str:
    """What the cross-encoder runs in on ``device``: "float32"; "bfloat16" (autocast; on CUDA float16 where
    bf16 is not native); "int8" (dynamically quantised Linear layers, CPU only: float32 elsewhere); "auto":
    bfloat16 where the device computes it natively (env.native_bf16: CUDA, AMX or AVX512-BF16), else
    AUTO_WITHOUT_BF16 on a CPU and float32 on another device."""
    if precision not in RERANKER_PRECISIONS:
        raise ValueError(f"reranker precision must be one of {RERANKER_PRECISIONS}, got {precision!r}")
    dev = torch.device(device)
    if precision == "auto":
        if env.native_bf16(dev):
            return "bfloat16"
        return AUTO_WITHOUT_BF16 if dev.type == "cpu" else "float32"
    if precision == "bfloat16" and dev.type == "cuda" and not env.native_bf16(dev):
        return "float16"
    if precision == "int8" and dev.type != "cpu":
        return "float32"
    return precision


CPU_ROWS_PER_PASS = 8  # pairs a forward pass on a CPU: as fast per pair as 42 (bf16, AMX Xeon), and a lone
# question's 5 pairs pad to 8, not 42
GPU_ROWS_PER_PASS = 128  # ... on a GPU (not measured: no GPU lent)


class Reranker:
    """A loaded cross-encoder on a device: ``rerank`` for the engine's batches, ``predict`` for pairs of text.

    ``tokens_per_pass``: the tokens of one forward pass, its pairs (rows_per_pass) this over the pair length
    (default: CPU_ROWS_PER_PASS pairs on a CPU, GPU_ROWS_PER_PASS on a GPU). ``precision``: what the model runs in
    (resolve_precision).
    """

    def __init__(self, model, tokenizer, settings: RerankerSettings, device="cpu", tokens_per_pass: int | None = None,
                 folder=None, precision: str = "float32"):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.settings = settings
        self.folder = folder
        rows = GPU_ROWS_PER_PASS if self.device.type == "cuda" else CPU_ROWS_PER_PASS
        self.tokens_per_pass = tokens_per_pass or rows * settings.max_length
        self._passages = {}  # id(index) -> (weak reference to the index, its PassageTokens)
        self.precision = resolve_precision(precision, self.device)
        # take the logits of pairs scored before in the batch (rerank's ``known``) rather than score them again:
        # on a CPU, where the pairs are the cost and reading their count back is a memory read; a GPU would
        # wait for the device to read it, for passes it runs in a fraction of the graph's time
        self.reuse_logits = self.device.type == "cpu"
        # the set reader (rerank/set_reader.py) shipped beside the model in its folder, when there is one
        self.set_reader = None
        self._autocast = None
        if self.precision == "int8":  # in a copy: the caller's model stays as it is
            self.model = CrossEncoder(quantize_int8(self.model.bert), self.model.head).eval()
        elif self.precision in ("bfloat16", "float16"):
            # autocast, not the encoder's weights cast to bf16: those round the residual sums and LayerNorm's
            # input too, a little faster but a dev question's top 2 moved, where autocast's recall equals
            # float32's (docs/reranker.md, "What the reranker costs")
            self._autocast = getattr(torch, self.precision)

    @classmethod
    def load(cls, folder=None, device="cpu", tokens_per_pass: int | None = None, precision: str = "float32") -> "Reranker":
        """From a reranker folder (default: the one shipped with the package); see models.reranker.load_model.
        ``precision``: RERANKER_PRECISIONS (resolve_precision)."""
        model, tok, settings = load_model(folder)
        out = cls(model, tok, settings, device, tokens_per_pass, folder, precision)
        from .set_reader import load_set_reader  # deferred: set_reader imports this module

        out.set_reader = load_set_reader(folder, out.device)
        return out

    # ----------------------------------------------------------------- tokens
    def question_tokens(self, questions: list[str]) -> QuestionTokens:
        return tokenize_questions(self.tokenizer, questions, self.settings).to(self.device)

    def passage_tokens(self, index) -> PassageTokens:
        """Every passage of ``index`` tokenised once (cached while the index object lives)."""
        ref, got = self._passages.get(id(index), (None, None))
        if ref is None or ref() is not index:
            got = self.tokenize_passages([index.passage_text(i) for i in range(index.num_passages)])
            self._passages = {k: v for k, v in self._passages.items() if v[0]() is not None}  # drop dead indexes
            self._passages[id(index)] = (weakref.ref(index), got)
        return got

    def tokenize_passages(self, texts: list[str]) -> PassageTokens:
        p = tokenize_passages(self.tokenizer, texts, self.settings)
        return PassageTokens(p.ids.to(self.device), p.lengths.to(self.device))

    # ----------------------------------------------------------------- scoring
    def pair_length(self, pair_tokens: int = 0) -> int:
        """The tokens a pair is laid out in: the model's ``max_length``, or ``pair_tokens`` where that is set
        (RetrievalConfig.rerank_pair_tokens: a shorter pair cuts its passage, the question and the context keep
        their shares). It is kept within what the model reads: at most its ``max_length``, at least its
        ``question_tokens + context_tokens + 5`` (77 for the shipped model), so that a request's setting cannot
        fail a batch of the server's."""
        L = self.settings.max_length
        if not pair_tokens:
            return L
        return min(L, max(pair_tokens, self.settings.question_tokens + self.settings.context_tokens + 5))

    @torch.inference_mode()
    def pair_logits(self, q: QuestionTokens, p: PassageTokens, q_of_pair: torch.Tensor,
                    passage_of_pair: torch.Tensor, context_of_pair: torch.Tensor | None = None, vectors: bool = False,
                    pair_tokens: int = 0, length_step: int = 0):
        """The cross-encoder's logit of each (question, passage) pair, in passes of rows_per_pass pairs each, the
        last filled with copies of its first pair (the module's docstring) (``context_of_pair``: each pair's
        context passage row, -1 none, for a chain-aware model). ``vectors``: (logits, each pair's pooled vector
        [n, hidden] float32), the vectors the logits are read from.

        ``pair_tokens``: the pairs' length (pair_length; 0: the model's). ``length_step`` (0: off): each pair is
        laid out at its own length (its tokens and one padding) rounded up to a multiple of ``length_step``, at most
        the pairs' length, and the pairs of one length are scored together in passes of rows_per_pass pairs of
        that length (the last filled with copies of its first). A pair's length depends on its own tokens only and
        each length has one pass shape, so a pair's logit still does not depend on the pairs beside it; it moves
        in the last bits from its logit at the full length (another shape: the padding it drops was masked)."""
        L = self.pair_length(pair_tokens)
        n = q_of_pair.numel()
        H = self.model.head.weight.shape[1]
        if length_step and n:
            # each pair's layout length; the distinct lengths are read back (on a CPU a memory read; a GPU syncs)
            need = pair_ends(q, p, q_of_pair, passage_of_pair, L, context_of_pair, self.settings.context_tokens) + 2
            lengths = torch.clamp(-(-need // length_step) * length_step, max=L)
            out = torch.empty(n, dtype=torch.float32, device=self.device)
            vecs = torch.empty(n, H, dtype=torch.float32, device=self.device) if vectors else None
            for b in torch.unique(lengths).tolist():
                i = torch.nonzero(lengths == b).squeeze(1)
                got = self._passes(q, p, q_of_pair[i], passage_of_pair[i],
                                   None if context_of_pair is None else context_of_pair[i], int(b), vectors)
                if vectors:
                    out[i], vecs[i] = got
                else:
                    out[i] = got
            return (out, vecs) if vectors else out
        return self._passes(q, p, q_of_pair, passage_of_pair, context_of_pair, L, vectors)

    def _passes(self, q: QuestionTokens, p: PassageTokens, q_of_pair: torch.Tensor, passage_of_pair: torch.Tensor,
                context_of_pair: torch.Tensor | None, L: int, vectors: bool):
        """pair_logits of pairs laid out at ``L`` tokens, in passes of rows_per_pass pairs."""
        n = q_of_pair.numel()
        per_pass = self.rows_per_pass
        out = torch.empty(-(-n // per_pass) * per_pass, dtype=torch.float32, device=self.device)
        vecs = torch.empty(out.numel(), self.model.head.weight.shape[1], dtype=torch.float32,
                           device=self.device) if vectors else None
        if n == 0:
            return (out, vecs) if vectors else out
        sep = self.tokenizer.sep_token_id
        fill = out.numel() - n  # (sizes from shapes: no host copy)
        if fill:
            q_of_pair, passage_of_pair = _filled(q_of_pair, fill), _filled(passage_of_pair, fill)
            context_of_pair = None if context_of_pair is None else _filled(context_of_pair, fill)
        for s in range(0, out.numel(), per_pass):
            ctx = None if context_of_pair is None else context_of_pair[s:s + per_pass]
            ids, mask, types = pair_inputs(q, p, q_of_pair[s:s + per_pass], passage_of_pair[s:s + per_pass], L, sep,
                                           self.tokenizer.pad_token_id or 0, ctx, self.settings.context_tokens)
            with torch.autocast(self.device.type, dtype=self._autocast, enabled=self._autocast is not None):
                if vectors:
                    pooled = self.model.pooled(ids, mask, types)
                    out[s:s + per_pass] = self.model.score(pooled).float()
                    vecs[s:s + per_pass] = pooled.float()
                else:
                    out[s:s + per_pass] = self.model(ids, mask, types).float()
        return (out[:n], vecs[:n]) if vectors else out[:n]

    @property
    def rows_per_pass(self) -> int:
        """Pairs in every forward pass (tokens_per_pass over the pair length, at least one)."""
        return max(1, self.tokens_per_pass // self.settings.max_length)

    def rerank(self, q: QuestionTokens, p: PassageTokens, indices: torch.Tensor, scores: torch.Tensor,
               known: Reranked | None = None, vectors: bool = False, read: torch.Tensor | None = None,
               set_reader=None, pair_tokens: int = 0, length_step: int = 0) -> Reranked:
        """Reorder each question's candidates (``indices``/``scores`` [B, K], the graph's order) by the fused
        score. A candidate row of -1 (no passage) stays last. ``p``: the passages' tokens (PassageTokens, or a
        shard's, which scores the pairs it holds: PassageTokens.score_pairs). ``known``: pairs of the same
        questions scored before (the chain rounds' reranks of this batch); where ``reuse_logits`` is set, a pair
        read there with the same context takes its logit from there instead of a pass (the same bits: every pass
        has one shape).

        The set reader (rerank/set_reader.py): ``vectors`` keeps each pair's pooled vector in the result (for a
        later rerank of the batch that reads the set); ``read`` [B, K] bool: the candidates to score (the others
        are not read and follow the read ones in the graph's order; None: all); ``set_reader``: a SetReader whose
        score, over each question's read candidates together, orders them instead of the pointwise fused score.
        ``pair_tokens``, ``length_step``: how the pairs are laid out (pair_logits; RetrievalConfig.rerank_pair_tokens
        and rerank_length_step)."""
        B, K = indices.shape
        passes = {k: v for k, v in (("pair_tokens", pair_tokens), ("length_step", length_step)) if v}
        q = q.to(self.device)
        indices, scores = indices.to(self.device), scores.to(self.device, torch.float32)
        q_of_pair = torch.arange(B, device=self.device).repeat_interleave(K)
        missing = indices < 0
        vectors = vectors or set_reader is not None
        ctx = chain_context(indices) if self.settings.context_tokens else None
        rows, flat_ctx = indices.clamp(min=0).reshape(-1), None if ctx is None else ctx.reshape(-1)
        from_loop, vecs = None, None
        if known is not None and (self.reuse_logits or vectors):
            logits, new, known_vecs = _known_logits(indices, ctx, known)
            from_loop = ~new & ~missing
            if not self.reuse_logits or (vectors and known_vecs is None):
                new = torch.ones_like(new)
        else:
            logits, new, known_vecs = torch.zeros(B, K, device=self.device), torch.ones_like(missing), None
        if read is not None:
            read = read.to(self.device) & ~missing
            new = new & read
        if known is not None and self.reuse_logits or read is not None:
            new = torch.nonzero(new.reshape(-1)).squeeze(1)  # the pairs not scored before (their count: a host read)
            got = p.score_pairs(self, q, q_of_pair[new], rows[new], None if ctx is None else flat_ctx[new],
                                **({"vectors": True} if vectors else {}), **passes)
            if vectors:
                got, got_vecs = got
                vecs = (torch.zeros(B * K, got_vecs.shape[1], device=self.device) if known_vecs is None
                        else known_vecs.reshape(B * K, -1)).index_put((new,), got_vecs).view(B, K, -1)
            logits = logits.reshape(-1).index_put((new,), got).view(B, K)
        else:
            got = p.score_pairs(self, q, q_of_pair, rows, flat_ctx, **({"vectors": True} if vectors else {}), **passes)
            if vectors:
                got, vecs = got[0], got[1].view(B, K, -1)
            logits = got.view(B, K)
        unread = missing if read is None else ~read
        fused = fuse(self.settings, logits, scores).masked_fill(unread, float("-inf"))
        if set_reader is not None:
            fused = set_reader.score(vecs, logits, fused, scores, from_loop, ~unread)
        if read is not None:  # the candidates not read: after the read ones, in the graph's order (a stable sort)
            floor = fused.masked_fill(unread, float("inf")).amin(1, keepdim=True)
            fused = torch.where(unread & ~missing, torch.where(torch.isfinite(floor), floor, 0.0) - 1.0, fused)
        order = torch.sort(fused, dim=1, descending=True, stable=True).indices
        ranks = torch.arange(K, device=self.device).expand(B, K)

        def sort(x):
            return None if x is None else x.gather(1, order if x.dim() == 2 else order.unsqueeze(2).expand_as(x))

        return Reranked(indices.gather(1, order), fused.gather(1, order), logits.gather(1, order),
                        scores.gather(1, order), ranks.gather(1, order), sort(ctx), sort(vecs), sort(from_loop))

    def predict(self, pairs: list[tuple[str, str]], contexts: list[str | None] | None = None) -> list[float]:
        """The cross-encoder's logit of each (question, passage text) pair (like sentence-transformers'
        CrossEncoder.predict); a chain-aware model reads each pair's context text (None: none) after the
        question."""
        if not pairs:
            return []
        q = self.question_tokens([a for a, _ in pairs])
        idx = torch.arange(len(pairs), device=self.device)
        if not (contexts and self.settings.context_tokens):
            return self.pair_logits(q, self.tokenize_passages([b for _, b in pairs]), idx, idx).tolist()
        if len(contexts) != len(pairs):
            raise ValueError(f"{len(contexts)} contexts for {len(pairs)} pairs")
        p = self.tokenize_passages([b for _, b in pairs] + [c or "" for c in contexts])
        ctx = torch.tensor([len(pairs) + i if c else -1 for i, c in enumerate(contexts)], device=self.device)
        return self.pair_logits(q, p, idx, idx, ctx).tolist()
