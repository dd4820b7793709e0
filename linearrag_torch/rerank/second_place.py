"""The second place (`linearrag train-reranker --second-place`): the reader's own mistakes after a gold first hop.

On most multi-hop questions the graph's top candidate is already a gold passage (94% of 2wiki's two-gold dev
questions) and the reranker reads every other candidate after it (rerank.scoring.chain_context); what it gets
wrong is the second place: a passage it scores above the gold second hop. Those mistakes are the reader's own,
not the graph's, so they are mined with the reader itself (the ``--init`` model), on the training questions only:
each question's first hop (the gold passage whose title the question names, else the one whose title shares the
most words with it) is the context, and the reader scores the question's other paragraphs after it. The
paragraphs above its weakest other gold passage are its mistakes there. Training then adds, for each question
with a mistake, one listwise group: its other gold passages against its hardest paragraphs (the mistakes first),
all read after the first hop; the question's ordinary group (rerank.train._group) stays beside it, so that the
rest of what the reader does is trained too.

``mine_engine_second_place`` (``--second-place engine``) mines where the engine decides instead: over the
engine's own top candidates of a question (rerank.train.mine, the mining index), when its top one is gold, that one
is the context (as chain_context makes it) and the other candidates are ordered by the fused score of the init
model (its logit, the graph's rank and score, its fusion weights); the candidates fused above a gold one are the
mistakes.

``second_place_counts`` is the measure on held-out questions: of those with two or more gold passages, how many
have a gold passage first among the other paragraphs read after the first hop.
"""
from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass

import torch

from .scoring import PassageTokens, QuestionTokens, pair_inputs

_WORD = re.compile(r"\w+")


@dataclass
class SecondPlace:
    """One question's second place as the reader saw it: the first hop read as context, the other gold
    passages, the negatives ordered by the reader's logit (hardest first), and how many of them it put above
    its weakest other gold passage (its mistakes)."""

    context: str
    positives: list
    ranked: list
    mistakes: int
    first_is_gold: bool  # the reader's best paragraph after the first hop is a gold one


def first_hop(question: str, positives: list, passages: dict) -> str:
    """The gold passage that a question starts from: the one whose title the question names first, else the
    one whose title shares the most words with the question (ties: the first listed)."""
    q = question.lower()
    named = []
    for n, k in enumerate(positives):
        title = passages[k][0].strip().lower()
        at = q.find(title) if title else -1
        if at >= 0:
            named.append((at, -len(title), n, k))
    if named:
        return min(named)[3]
    words = set(_WORD.findall(q))
    overlap = [(-len(words & set(_WORD.findall(passages[k][0].lower()))), n, k) for n, k in enumerate(positives)]
    return min(overlap)[2]


def mine_second_place(model, questions: list, positions: list, passages: dict, q_tok: QuestionTokens,
                      p_tok: PassageTokens, row_of: dict, settings, sep: int, pad: int, pairs_per_pass: int = 64,
                      progress: bool = True) -> dict:
    """{question position: SecondPlace} for the questions at ``positions`` with two or more gold passages:
    each of its other paragraphs scored by ``model`` after its first hop."""
    jobs, golds = [], []
    for i in positions:
        q = questions[i]
        if len(q.positives) < 2:
            continue
        ctx = first_hop(q.question, q.positives, passages)
        others = [k for k in q.positives if k != ctx]
        jobs.append((i, ctx, others + [k for k in q.negatives if k != ctx]))
        golds.append(set(others))
    logits = _pair_logits(model, jobs, q_tok, p_tok, row_of, settings, sep, pad, pairs_per_pass, progress)
    return {i: _judge(ctx, keys, lg, gold) for (i, ctx, keys), lg, gold in zip(jobs, logits, golds)}


def mine_engine_second_place(model, questions: list, positions: list, q_tok: QuestionTokens, p_tok: PassageTokens,
                             row_of: dict, settings, fusion, candidates: int, sep: int, pad: int,
                             pairs_per_pass: int = 64, progress: bool = True) -> dict:
    """{question position: SecondPlace} for the questions at ``positions`` whose mined top candidate is gold and
    whose next ``candidates - 1`` hold another gold passage: each of those read after the top one, in the order of
    ``fusion``'s fused score (a RerankerSettings with the init model's weights)."""
    from .scoring import fuse

    jobs, tops = [], []
    for i in positions:
        q = questions[i]
        gold = set(q.positives)
        top = q.mined[:candidates]
        if len(top) < 2 or top[0][0] not in gold or not any(k in gold for k, _ in top[1:]):
            continue
        jobs.append((i, top[0][0], [k for k, _ in top[1:]]))
        tops.append(top)
    logits = _pair_logits(model, jobs, q_tok, p_tok, row_of, settings, sep, pad, pairs_per_pass, progress)
    out = {}
    for (i, ctx, keys), lg, top in zip(jobs, logits, tops):
        # the top one's own logit does not enter the order of the others: a 0 in its column keeps their ranks
        fused = fuse(fusion, torch.tensor([[0.0] + lg]), torch.tensor([[sc for _, sc in top]]))[0, 1:].tolist()
        out[i] = _judge(ctx, keys, fused, set(questions[i].positives))
    return out


@torch.no_grad()
def _pair_logits(model, jobs: list, q_tok: QuestionTokens, p_tok: PassageTokens, row_of: dict, settings, sep: int,
                 pad: int, pairs_per_pass: int, progress: bool) -> list:
    """For each job (question position, context key, candidate keys), ``model``'s logit of each candidate read after
    the context, in passes of ``pairs_per_pass`` pairs; the model's training mode is left as it was found."""
    from tqdm.auto import tqdm

    dev = q_tok.ids.device
    qs = torch.tensor([i for i, _, c in jobs for _ in c], dtype=torch.int64, device=dev)
    rows = torch.tensor([row_of[k] for _, _, c in jobs for k in c], dtype=torch.int64, device=dev)
    ctxs = torch.tensor([row_of[x] for _, x, c in jobs for _ in c], dtype=torch.int64, device=dev)
    ends = list(itertools.accumulate(len(c) for _, _, c in jobs))  # each job's last pair, plus one
    was_training = model.training
    model.eval()
    parts = []
    bar = tqdm(total=len(jobs), desc="second place", unit="question", disable=not progress)
    for s in range(0, qs.numel(), pairs_per_pass):
        sl = slice(s, s + pairs_per_pass)
        ids, mask, types = pair_inputs(q_tok, p_tok, qs[sl], rows[sl], settings.max_length, sep, pad, ctxs[sl],
                                       settings.context_tokens)
        keep = int(mask.sum(1).max())
        parts.append(model(ids[:, :keep], mask[:, :keep], types[:, :keep]).float().cpu())
        bar.n = bisect.bisect_right(ends, s + pairs_per_pass)
        bar.refresh()
    bar.close()
    model.train(was_training)
    flat = torch.cat(parts).tolist() if parts else []
    return [flat[e - len(c):e] for (_, _, c), e in zip(jobs, ends)]


def _judge(context: str, keys: list, scores: list, gold: set) -> SecondPlace:
    """The SecondPlace of candidates ``keys`` with ``scores`` read after ``context``: the gold ones in their order,
    the others by score (hardest first, ties in their order), and those above the weakest gold one counted."""
    g = [v for k, v in zip(keys, scores) if k in gold]
    negs = sorted(((v, j) for j, (k, v) in enumerate(zip(keys, scores)) if k not in gold), key=lambda t: (-t[0], t[1]))
    return SecondPlace(context, [k for k in keys if k in gold], [keys[j] for _, j in negs],
                       sum(1 for v, _ in negs if v > min(g)), max(g) >= (negs[0][0] if negs else float("-inf")))


def second_place_group(sp: SecondPlace, row_of: dict, negatives: int) -> tuple[list, int, list]:
    """(passage rows: the other gold passages first, then the ``negatives`` hardest paragraphs; the number of
    gold ones; each row's context, the first hop) for one training step."""
    pos = sp.positives[:3]
    keys = pos + sp.ranked[:negatives]
    return [row_of[k] for k in keys], len(pos), [row_of[sp.context]] * len(keys)


def second_place_counts(mined: dict) -> dict:
    """Of the questions mined, how many have a gold passage first after the first hop, and how many paragraphs
    stand above their weakest gold second hop in all."""
    return {"questions": len(mined), "gold_first_after_first_hop": sum(sp.first_is_gold for sp in mined.values()),
            "with_a_mistake": sum(1 for sp in mined.values() if sp.mistakes), "mistakes": sum(sp.mistakes for sp in
                                                                                            mined.values())}
