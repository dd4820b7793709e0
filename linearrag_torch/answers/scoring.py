"""Answer metrics (SQuAD-style exact match and token F1, containment) and passage recall.

All answer metrics compare a prediction with a list of gold aliases and keep the best alias. Both
sides are first normalised by ``normalize_answer`` (the SQuAD v1.1 evaluation script's): lower case,
ASCII punctuation removed, the articles a / an / the removed as whole words, whitespace collapsed.
The exact definitions are in benchmarks/README.md ("Answer quality").
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower-case, strip punctuation, drop the articles a/an/the, squeeze whitespace (SQuAD style)."""
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_in_context(answers, context_norm: str) -> bool:
    """Any non-empty normalised answer is a substring of the normalised context (retrieval's AiC)."""
    for a in answers or ():
        na = normalize_answer(a)
        if na and na in context_norm:
            return True
    return False


def _aliases(answers) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    return [str(a) for a in (answers or ())]


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals some normalised alias, else 0.0 (0.0 without aliases)."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in _aliases(answers)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # SQuAD v2: two empty answers agree, one empty one scores 0
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answers: Iterable[str]) -> float:
    """The best token F1 over the aliases: tokens are the whitespace-separated words of the normalised
    strings, overlap counts repeated tokens at most as often as both sides hold them (multiset
    intersection), F1 = 2PR / (P + R). Empty against empty is 1.0, empty against non-empty 0.0."""
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(a).split()) for a in _aliases(answers)), default=0.0)


def containment(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if some non-empty normalised alias is a substring of the normalised prediction, else 0.0: the
    containment accuracy the LinearRAG paper reports ("york" is in "yorkshire"; "no" is in "north").
    containment_words is the stricter whole-word variant."""
    pred = normalize_answer(prediction)
    for a in _aliases(answers):
        gold = normalize_answer(a)
        if gold and gold in pred:
            return 1.0
    return 0.0


def containment_words(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if some non-empty normalised alias occurs in the normalised prediction as a run of whole
    words ("paris" is in "paris france"; "no" is not in "north"), else 0.0."""
    pred = f" {normalize_answer(prediction)} "
    for a in _aliases(answers):
        gold = normalize_answer(a)
        if gold and f" {gold} " in pred:
            return 1.0
    return 0.0


def recall_at_k(ranked_ids, gold_ids, k: int) -> float | None:
    """|gold ∩ top-k| / |gold| with ids compared as strings; None when there is no gold."""
    gold = {str(g) for g in (gold_ids or ())}
    if not gold:
        return None
    return len(gold.intersection(str(r) for r in list(ranked_ids)[:k])) / len(gold)


def answer_scores(prediction: str, answers) -> dict:
    """{"em", "f1", "contains", "contains_words"} of one prediction against its aliases."""
    return {"em": exact_match(prediction, answers), "f1": token_f1(prediction, answers),
            "contains": containment(prediction, answers), "contains_words": containment_words(prediction, answers)}
