"""Answers: retrieve passages, ask a chat model, parse its marked final answer; and the judge of answers.

    from linearrag_torch.answers.generation import LLM, answer_batch
    llm = LLM(base_url="http://localhost:8000/v1", model="qwen2.5-7b-instruct")   # or from the environment
    for a in answer_batch(rag, ["Who directed X?"], llm, top_k=5):
        print(a.answer, [p.id for p in a.passages])

The parts, each in its module: the endpoint and its settings, retries and errors (``LLM``, ``LLMError``:
answers/chat.py), the replies' disk cache (``ResponseCache``: answers/cache.py), the prompts and how replies are
read (answers/prompts.py). Their names are importable from here too, as they always were.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .cache import ResponseCache
from .chat import DEFAULT_CACHE, ENV_API_KEY, ENV_BASE_URL, ENV_CACHE, ENV_MODEL, LLM, ChatReply, LLMError, require_gen_extra
from .prompts import JUDGE_PROMPT, SYSTEM_PROMPT, build_messages, parse_answer, parse_verdict, passage_field

__all__ = ["DEFAULT_CACHE", "DEFAULT_TOP_K", "ENV_API_KEY", "ENV_BASE_URL", "ENV_CACHE", "ENV_MODEL", "JUDGE_PROMPT",
           "LLM", "SYSTEM_PROMPT", "Answer", "ChatReply", "LLMError", "ResponseCache", "aanswer_batch", "answer_batch",
           "as_llm", "build_messages", "judge_batch", "parse_answer", "parse_verdict", "require_gen_extra"]

DEFAULT_TOP_K = 5


@dataclass
class Answer:
    question: str
    answer: str  # the parsed final answer
    reply: str  # the model's whole reply
    passages: list  # the passages shown to the model, best first (Hit objects, or the dicts given)
    marker_found: bool  # False: no "Answer:" line, so answer is the whole reply
    usage: dict = field(default_factory=dict)  # token counts of the reply (as stored, for cached ones too)
    cached: bool = False  # True: the reply came from the cache (no tokens spent)

    def to_dict(self, include_text: bool = True) -> dict:
        ps = []
        for p in self.passages:
            d = {"id": passage_field(p, "id"), "score": passage_field(p, "score"), "title": passage_field(p, "title") or ""}
            if include_text:
                d["text"] = passage_field(p, "text") or ""
            ps.append(d)
        return {"question": self.question, "answer": self.answer, "reply": self.reply,
                "marker_found": self.marker_found, "cached": self.cached, "usage": self.usage, "passages": ps}


def as_llm(llm) -> LLM:
    """An LLM from an LLM (returned as is), None (everything from the environment) or a dict of LLM kwargs."""
    if isinstance(llm, LLM):
        return llm
    if llm is None:
        return LLM()
    if isinstance(llm, dict):
        return LLM(**llm)
    raise TypeError(f"llm must be an LLM, a dict of LLM arguments or None, got {type(llm).__name__}")


def answer_batch(rag_or_hits, questions, llm=None, top_k: int = DEFAULT_TOP_K, **overrides) -> list[Answer]:
    """Answer every question from its top-k passages.

    rag_or_hits: a LinearRAG (one batched ``rag.search(questions, top_k, **overrides)`` call) or, for
    callers that searched already, one list of hits per question (Hit objects, or dicts with "id",
    "score", "title", "text"; only the first top_k of each are used). llm: an LLM, a dict of LLM
    arguments, or None (the environment). Returns one Answer per question, in order; raises LLMError
    (one line: URL and status) when the endpoint fails after its retries.
    """
    questions = [questions] if isinstance(questions, str) else list(questions)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if hasattr(rag_or_hits, "search"):
        hits = rag_or_hits.search(questions, top_k=top_k, **overrides) if questions else []
    else:
        hits = [list(h)[:top_k] for h in rag_or_hits]
        if len(hits) != len(questions):
            raise ValueError(f"{len(questions)} questions but {len(hits)} hit lists")
    if not questions:
        return []
    model = as_llm(llm)
    replies = model.chat_many([build_messages(q, h) for q, h in zip(questions, hits)])
    out = []
    for q, h, r in zip(questions, hits, replies):
        ans, found = parse_answer(r.text)
        out.append(Answer(q, ans, r.text, h, found, r.usage, r.cached))
    return out


async def aanswer_batch(rag_or_hits, questions, llm=None, top_k: int = DEFAULT_TOP_K, **overrides) -> list[Answer]:
    """answer_batch in a worker thread (for an asyncio server)."""
    return await asyncio.to_thread(answer_batch, rag_or_hits, questions, llm, top_k, **overrides)


def judge_batch(llm, questions, golds, predictions) -> tuple[list[bool | None], list[ChatReply]]:
    """(verdicts, replies): per question True (correct), False (incorrect) or None (the judge's reply was
    neither word), and the judge's ChatReply (usage, cached). ``golds``: one list of aliases per question."""
    model = as_llm(llm)
    convs = []
    for q, g, p in zip(questions, golds, predictions):
        gold = " | ".join(str(a) for a in (g or [])) or "(none)"
        convs.append([{"role": "system", "content": JUDGE_PROMPT},
                      {"role": "user", "content": f"Question: {q}\nGold answer(s): {gold}\nPredicted answer: {p}\n"
                                                  "Is the predicted answer correct? Reply correct or incorrect."}])
    replies = model.chat_many(convs, max_tokens=8)
    return [parse_verdict(r.text) for r in replies], replies
