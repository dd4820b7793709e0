"""What the `linearrag` command line and the sharded launcher (distributed/) share: the retrieval settings given
as flags, the index folder check, the questions of `query` / `answer`, and how hits are printed."""
from __future__ import annotations

import json
from pathlib import Path


def retrieval_settings(args) -> dict:
    """The RetrievalConfig fields given as flags (None: not given)."""
    return {name: getattr(args, name) for name in args.retrieval_fields}


def open_index_dir(index_dir: str):
    """The index folder as a Path, after checking that it holds an index (a clear error otherwise)."""
    from .index import TriGraphIndex

    path = Path(index_dir)
    if not (path / "index.json").is_file():
        TriGraphIndex.load(path)  # raises IndexFormatError naming the problem
    return path


def check_output_dir(path) -> None:
    """A clear error (ValueError) before any work when folder ``path`` cannot be written: it, or a folder above
    it, is a file, or its nearest existing folder is read-only. Checked before indexing, not when the index is
    saved after minutes of work."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        what = "is a file" if p == Path(path) else f"cannot be made: {p} is a file"
        raise ValueError(f"{path} {what}, not a folder (give a new folder, or an index folder to replace)")
    import os

    if not os.access(p if p.exists() else ".", os.W_OK | os.X_OK):
        raise ValueError(f"{path}: cannot write to {p} (permission denied)")


def question_items(args) -> list[dict]:
    """The questions of `query` / `answer`: the QUESTION arguments, then those of --questions FILE.jsonl."""
    from .corpus import read_questions

    items = [{"id": i, "question": q} for i, q in enumerate(args.question)]
    if args.questions:
        items += read_questions(args.questions)
    if not items:
        raise ValueError("no question given (pass QUESTION arguments or --questions FILE.jsonl)")
    return items


def print_hits(items: list, results: list, as_json: bool) -> None:
    """What `linearrag query` prints: per question its hits (api.Hit), as text or JSON lines."""
    for it, hits in zip(items, results):
        if as_json:
            print(json.dumps({"id": it["id"], "question": it["question"],
                              "hits": [{"id": h.id, "score": h.score, "title": h.title} for h in hits]}, ensure_ascii=False))
        else:
            print(f"Q {it['id']}: {it['question']}")
            for rank, h in enumerate(hits, 1):
                print(f"  {rank}. [{h.id}] {h.title or snippet(h.text, 60)}  score {h.score:.4g}")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 passage", "2 passages", "1 entity" (with ``plural`` "entities"): the counts the commands print."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def sizes(summary: dict) -> str:
    """"N passages, N sentences, N entities" of an index summary (TriGraphIndex.summary)."""
    return ", ".join(count(summary[k], k[:-1] if k != "entities" else "entity", k) for k in ("passages", "sentences", "entities"))


def snippet(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
