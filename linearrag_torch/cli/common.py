"""What the commands, and the sharded launcher (distributed/), share: the retrieval settings given as flags, the
index folder checks, the read-modify-write of `add` / `delete`, the questions of `query` / `answer`, and how hits and
counts are printed."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..runtime.words import count, sizes  # noqa: F401 - the commands' counts (runtime/: the Ray parts print them too)


def retrieval_settings(args) -> dict:
    """The RetrievalConfig fields given as flags (None: not given)."""
    return {name: getattr(args, name) for name in args.retrieval_fields}


def open_index_dir(index_dir: str):
    """The index folder as a Path, after checking that it holds an index (a clear error otherwise)."""
    from ..index import TriGraphIndex  # deferred: imports torch; --help imports this module

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


def update_index(index_dir: str, device: str, change, verb: str, preposition: str) -> int:
    """Load INDEX_DIR under its writer lock, apply change(rag), save atomically, report the sizes
    ("<verb> N passages (+S sentences, +E entities) <preposition> INDEX_DIR: now ...")."""
    from ..api import LinearRAG  # deferred (both): import torch; --help imports this module
    from ..index import index_lock

    t0 = time.perf_counter()
    path = open_index_dir(index_dir)
    with index_lock(path):  # held for the whole read-modify-write
        rag = LinearRAG.load(path, device=device)
        before = rag.index.summary()
        change(rag)
        rag.save(path)
    after = rag.index.summary()
    growth = ", ".join(f"{'+' if d >= 0 else '-'}{count(abs(d), noun, plural)}" for d, noun, plural in (
        (after["sentences"] - before["sentences"], "sentence", None),
        (after["entities"] - before["entities"], "entity", "entities")))
    n = abs(after["passages"] - before["passages"])
    print(f"{verb} {count(n, 'passage')} ({growth}) {preposition} {index_dir}: now {sizes(after)} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def require_encoder_backend(backend: str) -> None:
    """--encoder-backend onnx without the [onnx] extra: one line naming it, before the index loads."""
    if backend == "onnx":
        from ..extras import require  # deferred: --help imports this module

        require("onnx", "onnxruntime", "onnx", what="--encoder-backend onnx")


def question_items(args) -> list[dict]:
    """The questions of `query` / `answer`: the QUESTION arguments, then those of --questions FILE.jsonl."""
    from ..corpus import read_questions  # deferred: --help imports this module

    items = [{"id": i, "question": q} for i, q in enumerate(args.question)]
    if args.questions:
        items += read_questions(args.questions)
    if not items:
        raise ValueError("no question given (pass QUESTION arguments or --questions FILE.jsonl)")
    return items


def order_note(cfg) -> str | None:
    """Which stages set the first places, for RetrievalConfig ``cfg``, printed where the scores are out of
    order (which would otherwise look like a bug). Two stages reorder without rescoring: the chain rounds
    (chain.py) keep each earlier round's top ``chain_keep`` passages, with that round's scores, ahead of the next
    round's ranking (a PageRank of other seeds, on its own scale), and the pair rerank (pairs.py) gives places
    1-2 to the best pair of the top ``pair_candidates`` and leaves each its own score. None where neither runs
    (the learned rerank orders by the fused scores it prints)."""
    if cfg is None or cfg.rerank or cfg.mode != "reference":
        return None
    parts = []
    if cfg.chain_passages > 0:
        kept = cfg.chain_keep * cfg.chain_rounds
        places = "place 1" if kept == 1 else f"places 1-{kept}"
        parts.append(f"{places} kept from the first round{'s' if cfg.chain_rounds > 1 else ''} ahead of the last "
                     "round's ranking")
    if cfg.pair_candidates >= 2:
        parts.append(f"then places 1-2 the pair rerank's best pair of the top {cfg.pair_candidates}")
    if not parts:
        return None
    return "order: " + "; ".join(parts) + "; each score is its own round's, so a lower one can come first"


def print_hits(items: list, results: list, as_json: bool, note: str | None = None) -> None:
    """What `linearrag query` prints: per question its hits (api.Hit), as text or JSON lines. ``note``
    (order_note): printed under a question whose scores are out of order, which would otherwise look like a bug."""
    for it, hits in zip(items, results):
        if as_json:
            print(json.dumps({"id": it["id"], "question": it["question"],
                              "hits": [{"id": h.id, "score": h.score, "title": h.title} for h in hits]}, ensure_ascii=False))
        else:
            print(f"Q {it['id']}: {it['question']}")
            for rank, h in enumerate(hits, 1):
                print(f"  {rank}. [{h.id}] {h.title or snippet(h.text, 60)}  score {h.score:.4g}")
            if note and any(a.score < b.score for a, b in zip(hits, hits[1:])):
                print(f"     ({note})")


def print_explanations(items: list, explanations: list) -> None:
    """What `linearrag query --explain` prints: per question one JSON line, LinearRAG.explain's dict with each
    hit as {"id", "score", "title", "entities": [[name, tier, activation], ...]} (the activated entities the
    passage contains)."""
    for it, ex in zip(items, explanations):
        hits = [{"id": h.id, "score": h.score, "title": h.title, "entities": [list(e) for e in ents]}
                for h, ents in ex["hits"]]
        print(json.dumps({"id": it["id"], **ex, "hits": hits}, ensure_ascii=False))


def snippet(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
