"""Question entities found by matching the question against the index's own entity lexicon.

spaCy's small NER misses or cuts entity names in short questions ("Thunder On The Hill" -> "Hill").
The index already knows every entity string of the corpus, so the question text is scanned for them
(case-insensitive, whole words, longest match first, one Aho-Corasick pass per question). The matched
strings join the NER strings as question entities and go through eq. 3 unchanged (an exact match
seeds its own entity with cosine 1).
"""
from __future__ import annotations

import re

import ahocorasick

_WORD = re.compile(r"\w", re.UNICODE)


class EntityLexicon:
    """Lower-cased entity strings of an index, searchable in a question in time linear in its length."""

    def __init__(self, entities, min_chars: int = 3):
        self.automaton = ahocorasick.Automaton()
        for name in entities:
            key = name.strip().lower()
            if len(key) >= min_chars and _WORD.search(key):
                self.automaton.add_word(key, key)
        self.empty = len(self.automaton) == 0
        if not self.empty:
            self.automaton.make_automaton()

    def match(self, question: str) -> list[str]:
        """Entity strings (lower-cased) occurring in ``question`` as whole words; where matches overlap
        the longest wins (then the leftmost)."""
        if self.empty:
            return []
        text = question.lower()
        found = []
        for end, key in self.automaton.iter(text):
            start = end - len(key) + 1
            before = text[start - 1] if start > 0 else " "
            after = text[end + 1] if end + 1 < len(text) else " "
            if not (_WORD.match(before) and _WORD.match(key[0])) and not (_WORD.match(after) and _WORD.match(key[-1])):
                found.append((start, end, key))
        found.sort(key=lambda m: (-(m[1] - m[0]), m[0]))
        taken, out = [], []
        for start, end, key in found:
            if all(end < s or start > e for s, e in taken):
                taken.append((start, end))
                out.append(key)
        return out
