"""What the chat model is told and how its replies are read: the answering prompt (``build_messages``) and its
marked final line (``parse_answer``), the judge's prompt and its one-word verdict (``parse_verdict``)."""
from __future__ import annotations

import re

SYSTEM_PROMPT = (
    "You answer questions from the numbered passages you are given. Some passages may be irrelevant, and "
    "a question may need facts from two or more passages combined (for example: first find who directed "
    "a film, then where that person was born). Reason briefly, in at most a few short sentences, citing "
    "passage numbers. Then end your reply with one final line of exactly this form:\n"
    "Answer: <the answer>\n"
    "The answer is as short as possible: a name, a place, a date, a number, or yes / no; not a sentence. "
    "If the passages do not settle the question, give your best guess on that line anyway."
)

JUDGE_PROMPT = (
    "You grade answers to questions. You are given a question, the gold answer(s) (any one of them is "
    "right) and a predicted answer. The prediction is correct when it means the same as a gold answer, "
    "even if it is worded differently, longer or shorter (e.g. 'NYC' for 'New York City', "
    "'Obama' for 'Barack Obama'), and incorrect when it names something else, is vague, or hedges between "
    "several answers. Reply with exactly one word: correct or incorrect."
)

_MARKER_LINE = re.compile(r"^[\s>*_#-]*(?:final\s+)?answer\s*[*_]*\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_MARKER_ANY = re.compile(r"\b(?:final\s+)?answer\s*[*_]*\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)


def passage_field(p, name):
    """A passage's ``name`` (title, text, id, score) whether it is a Hit or a dict; None where it has none."""
    return p.get(name) if isinstance(p, dict) else getattr(p, name, None)


def build_messages(question: str, passages) -> list[dict]:
    """The chat messages for one question and its passages (Hit objects or dicts with title/text)."""
    blocks = []
    for i, p in enumerate(passages, 1):
        title, text = passage_field(p, "title") or "", passage_field(p, "text") or ""
        blocks.append(f"[{i}] {title}\n{text}".strip() if title else f"[{i}] {text}")
    context = "\n\n".join(blocks) if blocks else "(no passage was found)"
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Passages:\n\n{context}\n\nQuestion: {question}"}]


def parse_answer(reply: str) -> tuple[str, bool]:
    """(answer, marker_found): the text after the last "Answer:" marker (a line starting with it, else
    anywhere; markdown emphasis and quotes stripped; the next line when the marker's line is empty),
    or the whole reply, stripped, when there is no marker."""
    reply = reply or ""
    matches = list(_MARKER_LINE.finditer(reply)) or list(_MARKER_ANY.finditer(reply))
    if not matches:
        return reply.strip(), False
    m = matches[-1]
    ans = m.group(1).strip()
    if not ans:
        rest = [ln.strip() for ln in reply[m.end():].splitlines() if ln.strip()]
        ans = rest[0] if rest else ""
    ans = ans.strip(" \t*_`\"'“”‘’")
    return ans, True


def parse_verdict(text: str) -> bool | None:
    """"correct" -> True, "incorrect" -> False (first word, case and punctuation ignored), else None."""
    words = re.findall(r"[a-z]+", (text or "").lower())
    if not words:
        return None
    if words[0] in ("correct", "incorrect"):
        return words[0] == "correct"
    if "incorrect" in words or "not correct" in " ".join(words):
        return False
    return True if "correct" in words else None
