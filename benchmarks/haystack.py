"""The real-text haystack of issue 49: the 2wiki dev corpus merged with every other corpus of the project, so that
2wiki's questions are asked among about four times as many passages (distractors) as their own corpus has.

    python -m benchmarks.haystack --datasets ../shared/datasets --out HAYSTACK_DIR
    linearrag index HAYSTACK_DIR/corpus.jsonl HAYSTACK_IDX
    python -m benchmarks.local_ppr --data HAYSTACK_DIR HAYSTACK_IDX ../shared/datasets/2wiki 2WIKI_IDX --json OUT ...

HAYSTACK_DIR/corpus.jsonl holds 2wiki's passages with their own ids (so its questions' supporting_ids still name
them), then musique_dev200's, hotpotqa_train100's and medical's as ``NAME:ID``, then the paragraphs of
train_multihop's questions as ``train:QUESTION_ID:I``; a passage whose (title, text) is already in is left out.
HAYSTACK_DIR/questions.jsonl is 2wiki's questions.jsonl, unchanged.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

OTHERS = ("musique_dev200", "hotpotqa_train100", "medical")


def _jsonl(path: Path):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SystemExit(f"{path}:{n}: not JSON ({exc.msg})") from None


def haystack(datasets: Path) -> list[dict]:
    """The merged corpus (module docstring)."""
    seen, out = set(), []

    def add(pid, title, text):
        key = (title, text)
        if key not in seen:
            seen.add(key)
            out.append({"id": pid, "title": title, "text": text})

    for p in _jsonl(datasets / "2wiki" / "corpus.jsonl"):
        add(p["id"], p["title"], p["text"])
    for name in OTHERS:
        for p in _jsonl(datasets / name / "corpus.jsonl"):
            add(f"{name}:{p['id']}", p.get("title", ""), p["text"])
    for q in _jsonl(datasets / "train_multihop" / "questions.jsonl"):
        for i, p in enumerate(q.get("paragraphs", [])):
            add(f"train:{q['id']}:{i}", p.get("title", ""), p["text"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", type=Path, required=True, help="the folder of 2wiki, musique_dev200, ... and "
                    "train_multihop")
    ap.add_argument("--out", type=Path, required=True, help="the folder to write corpus.jsonl and questions.jsonl")
    args = ap.parse_args(argv)
    corpus = haystack(args.datasets)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for p in corpus:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    shutil.copyfile(args.datasets / "2wiki" / "questions.jsonl", args.out / "questions.jsonl")
    print(f"{len(corpus):,} passages -> {args.out / 'corpus.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
