"""Substring counts of many patterns in many texts (N of eq. 7), with one Aho-Corasick automaton.

count[i, j] = texts[i].count(patterns[j]): non-overlapping occurrences scanned left to right.
The automaton reports every (possibly overlapping) match; per (text, pattern) we keep greedily the
matches that start at or after the end of the previously kept one, which is exactly what str.count
does. Time is linear in the total text length plus the number of matches.
"""
from __future__ import annotations

from typing import Sequence

import ahocorasick
import torch


def count_occurrences(patterns: Sequence[str], texts: Sequence[str]):
    """(rows, cols, counts) int64 tensors of the nonzero texts[row].count(patterns[col]), sorted by (row, col).

    Empty patterns are skipped; equal patterns each get their counts.
    """
    by_pattern: dict[str, list[int]] = {}  # distinct pattern -> the columns that hold it
    for j, p in enumerate(patterns):
        if p:
            by_pattern.setdefault(p, []).append(j)
    rows: list[int] = []
    cols: list[int] = []
    counts: list[int] = []
    if by_pattern:
        automaton = ahocorasick.Automaton()
        for k, p in enumerate(by_pattern):
            automaton.add_word(p, (k, len(p)))
        automaton.make_automaton()
        columns = list(by_pattern.values())
        for i, text in enumerate(texts):
            state: dict[int, list[int]] = {}  # distinct pattern -> [count, end of the last kept match]
            for end, (k, length) in automaton.iter(text):  # matches come in order of their end
                start = end - length + 1
                s = state.get(k)
                if s is None:
                    state[k] = [1, end + 1]
                elif start >= s[1]:
                    s[0] += 1
                    s[1] = end + 1
            found = sorted((j, s[0]) for k, s in state.items() for j in columns[k])
            rows.extend([i] * len(found))
            cols.extend(j for j, _ in found)
            counts.extend(c for _, c in found)
    return _as_tensors(rows, cols, counts)


def count_occurrences_naive(patterns: Sequence[str], texts: Sequence[str]):
    """The same result by a double loop over str.count (the test oracle)."""
    rows, cols, counts = [], [], []
    for i, text in enumerate(texts):
        for j, p in enumerate(patterns):
            c = text.count(p) if p else 0
            if c:
                rows.append(i)
                cols.append(j)
                counts.append(c)
    return _as_tensors(rows, cols, counts)


def _as_tensors(rows, cols, counts):
    return (
        torch.tensor(rows, dtype=torch.int64),
        torch.tensor(cols, dtype=torch.int64),
        torch.tensor(counts, dtype=torch.int64),
    )
