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


@torch.no_grad()
def mine_second_place(model, questions: list, positions: list, passages: dict, q_tok: QuestionTokens,
                      p_tok: PassageTokens, row_of: dict, settings, sep: int, pad: int, pairs_per_pass: int = 64,
                      progress: bool = True) -> dict:
    """{question position: SecondPlace} for the questions at ``positions`` with two or more gold passages:
    each of its other paragraphs scored by ``model`` after its first hop."""
    from tqdm.auto import tqdm

    jobs = []
    for i in positions:
        q = questions[i]
        if len(q.positives) < 2:
            continue
        ctx = first_hop(q.question, q.positives, passages)
        others = [k for k in q.positives if k != ctx]
        jobs.append((i, ctx, others, others + [k for k in q.negatives if k != ctx]))
    dev = q_tok.ids.device
    qs = torch.tensor([i for i, _, _, c in jobs for _ in c], dtype=torch.int64, device=dev)
    rows = torch.tensor([row_of[k] for _, _, _, c in jobs for k in c], dtype=torch.int64, device=dev)
    ctxs = torch.tensor([row_of[x] for _, x, _, c in jobs for _ in c], dtype=torch.int64, device=dev)
    was_training = model.training
    model.eval()
    logits = []
    ends = list(itertools.accumulate(len(c) for _, _, _, c in jobs))  # each question's last pair, plus one
    bar = tqdm(total=len(jobs), desc="second place", unit="question", disable=not progress)
    for s in range(0, qs.numel(), pairs_per_pass):
        sl = slice(s, s + pairs_per_pass)
        ids, mask, types = pair_inputs(q_tok, p_tok, qs[sl], rows[sl], settings.max_length, sep, pad, ctxs[sl],
                                       settings.context_tokens)
        keep = int(mask.sum(1).max())
        logits.append(model(ids[:, :keep], mask[:, :keep], types[:, :keep]).float().cpu())
        bar.n = bisect.bisect_right(ends, s + pairs_per_pass)
        bar.refresh()
    bar.close()
    model.train(was_training)
    lg = torch.cat(logits).tolist() if logits else []
    out, at = {}, 0
    for i, ctx, others, cands in jobs:
        mine = lg[at:at + len(cands)]
        at += len(cands)
        worst_gold = min(mine[:len(others)])
        negs = sorted(zip(mine[len(others):], range(len(cands) - len(others))), key=lambda t: (-t[0], t[1]))
        ranked = [cands[len(others) + j] for _, j in negs]
        out[i] = SecondPlace(ctx, others, ranked, sum(1 for v, _ in negs if v > worst_gold),
                             max(mine[:len(others)]) >= (negs[0][0] if negs else float("-inf")))
    return out


@torch.no_grad()
def mine_engine_second_place(model, questions: list, positions: list, q_tok: QuestionTokens, p_tok: PassageTokens,
                             row_of: dict, settings, fusion, candidates: int, sep: int, pad: int,
                             progress: bool = True) -> dict:
    """{question position: SecondPlace} for the questions at ``positions`` whose mined top candidate is gold and
    whose next ``candidates - 1`` hold another gold passage: each of those read after the top one, in the order of
    ``fusion``'s fused score (a RerankerSettings with the init model's weights)."""
    from tqdm.auto import tqdm

    from .scoring import fuse

    jobs = []
    for i in positions:
        q = questions[i]
        gold = set(q.positives)
        top = q.mined[:candidates]
        if len(top) < 2 or top[0][0] not in gold or not any(k in gold for k, _ in top[1:]):
            continue
        jobs.append((i, top))
    dev = q_tok.ids.device
    out = {}
    was_training = model.training
    model.eval()
    for s in tqdm(range(0, len(jobs), 16), desc="second place (engine)", unit="batch", disable=not progress):
        part = jobs[s:s + 16]
        qs = torch.tensor([i for i, top in part for _ in top[1:]], dtype=torch.int64, device=dev)
        rows = torch.tensor([row_of[k] for _, top in part for k, _ in top[1:]], dtype=torch.int64, device=dev)
        ctxs = torch.tensor([row_of[top[0][0]] for _, top in part for _ in top[1:]], dtype=torch.int64, device=dev)
        ids, mask, types = pair_inputs(q_tok, p_tok, qs, rows, settings.max_length, sep, pad, ctxs,
                                       settings.context_tokens)
        keep = int(mask.sum(1).max())
        lg = model(ids[:, :keep], mask[:, :keep], types[:, :keep]).float().cpu().tolist()
        at = 0
        for i, top in part:
            n = len(top) - 1
            logits = torch.tensor([[0.0] + lg[at:at + n]])  # the top one's own logit does not enter the order below
            at += n
            fused = fuse(fusion, logits, torch.tensor([[sc for _, sc in top]]))[0, 1:].tolist()
            gold = set(questions[i].positives)
            keys = [k for k, _ in top[1:]]
            g = [f for k, f in zip(keys, fused) if k in gold]
            negs = sorted(((f, j) for j, (k, f) in enumerate(zip(keys, fused)) if k not in gold), key=lambda t: (-t[0], t[1]))
            out[i] = SecondPlace(top[0][0], [k for k in keys if k in gold], [keys[j] for _, j in negs],
                                 sum(1 for f, _ in negs if f > min(g)), max(g) >= (negs[0][0] if negs else float("-inf")))
    model.train(was_training)
    return out


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
