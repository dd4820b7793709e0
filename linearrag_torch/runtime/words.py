"""Counts in English, as every part of the package prints them ("1 passage", "2,000 entities"): below the command
line, so that the Ray build and the Ray server print them too without importing it."""
from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 passage", "2 passages", "1 entity" (with ``plural`` "entities"): the counts the commands print."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def sizes(summary: dict) -> str:
    """"N passages, N sentences, N entities" of an index summary (TriGraphIndex.summary)."""
    return ", ".join(count(summary[k], k[:-1] if k != "entities" else "entity", k) for k in ("passages", "sentences", "entities"))
