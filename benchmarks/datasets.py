"""The evaluation sets of the README's table, converted from the public releases into `corpus.jsonl` and
`questions.jsonl` (the format `python -m benchmarks.quality --data DIR` reads). Deterministic: the same release
files give the same bytes. Standard library only; nothing is downloaded.

    python -m benchmarks.datasets 2wiki --corpus 2wikimultihopqa_corpus.json --questions questions.json --out DIR
    python -m benchmarks.datasets hotpotqa --corpus hotpotqa_train_corpus.json --questions hotpotqa_train.json --out DIR
    python -m benchmarks.datasets musique --questions musique_ans_v1.0_dev.jsonl --out DIR [--ids FILE]

- ``2wiki``: HippoRAG's 2WikiMultiHopQA corpus (`OSU-NLP-Group/HippoRAG`, `reproduce/dataset/
  2wikimultihopqa_corpus.json`: a JSON list of {"title", "text"}) and the LinearRAG release's questions
  (Hugging Face `Zly0523/linear-rag`, `2wikimultihop/questions.json`: a JSON list of {"id", "question_type",
  "question", "answer", "evidence"}). A question's gold passages are those of the distinct subjects of its
  evidence triples (`gold_passages`): the passage whose title is the subject, else the best fuzzy match.
- ``hotpotqa``: HippoRAG v1's HotpotQA files (branch `legacy`, `data/hotpotqa_train_corpus.json`: a dict title
  -> sentences, and `data/hotpotqa_train.json`: HotpotQA rows with `supporting_facts`); gold: the distinct
  titles of `supporting_facts`.
- ``musique``: MuSiQue-Ans rows (JSON Lines, as in `musique_ans_v1.0_dev.jsonl` of the official release, or
  a JSON list), with the 20 paragraphs each; the corpus is the union of their paragraphs with equal (title,
  text) merged, in order of first appearance; gold: the supporting paragraphs in the order of the question's
  decomposition (one a hop). ``--ids FILE`` keeps the questions listed there (one id a line), in that order:
  `benchmarks/musique_dev200_ids.txt` is the README's 200 (docs/benchmarks/quality.md, "Data sets").

Every output question has "id", "question", "answers", "supporting_ids" (corpus ids), "supporting_titles",
"type" and "gold_quality" ("exact", "heuristic" or "partial"); 2wiki's keep "evidence" too.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

MUSIQUE_DEV200_IDS = Path(__file__).with_name("musique_dev200_ids.txt")


# ------------------------------------------------------------------ reading and writing
def read_json_or_lines(path: Path):
    """A JSON document, or JSON Lines read as a list."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_set(out: Path, corpus: list[dict], questions: list[dict]) -> None:
    """``out``/corpus.jsonl and ``out``/questions.jsonl, one JSON object a line (keys in a fixed order)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("corpus.jsonl", corpus), ("questions.jsonl", questions)):
        with open(out / name, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def quality(found: int, wanted: int, fuzzy: bool) -> str:
    return "partial" if found < wanted else "heuristic" if fuzzy else "exact"


# ------------------------------------------------------------------ 2WikiMultiHopQA
WINDOW = 12  # passages either side of a question's exact matches that count as its neighbourhood


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def _strip_parenthetical(title: str) -> str:
    return re.sub(r"\s*\([^)]*\)\s*$", "", title)


def _whole_words_in(a: str, b: str) -> bool:
    return bool(a) and re.search(rf"(?<!\w){re.escape(a)}(?!\w)", b) is not None


def name_similarity(subject: str, passage: dict) -> float:
    """How well a passage's title (with or without its parenthetical) or its text's start names ``subject``:
    difflib's ratio, at least 0.85 when one contains the other as whole words."""
    s = _norm(subject)
    title = _norm(passage["title"])
    candidates = [title, _norm(_strip_parenthetical(passage["title"])), _norm(passage["text"][:len(subject)])]
    best = max(difflib.SequenceMatcher(None, s, c).ratio() for c in candidates)
    if any(_whole_words_in(s, c) or _whole_words_in(c, s) for c in candidates[:2]):
        best = max(best, 0.85)
    return best


def evidence_subjects(evidence: list) -> list[tuple[str, str]]:
    """(subject, object of its first triple) of each distinct entity that is a subject of the evidence triples,
    in order. A subject that is the subject and the object of an earlier triple ("David Pigot" -father-> "David
    Pigot") is a second entity of that name."""
    out, seen = [], set()
    for k, (s, _, o) in enumerate(evidence):
        key = (s, any(es == s and eo == s for es, _, eo in evidence[:k]))
        if key not in seen:
            seen.add(key)
            out.append((s, o))
    return out


def gold_passages(question: dict, corpus: list[dict], by_title: dict, window: range) -> tuple[list[int], bool]:
    """The corpus ids of a 2Wiki question's gold passages, one per distinct subject of its evidence triples, and
    whether any was found by the fuzzy rule. A subject that is exactly a title takes that passage. Otherwise every
    passage is scored: ``name_similarity`` + 0.3 if it lies in the question's ``window`` of the corpus + 0.3 if
    its text contains the triple's object + 0.2 if its title occurs in the question; the best counts when its
    score is at least 1.0 (ties: the lowest id). The second entity of a name (``evidence_subjects``) takes
    another passage than the first."""
    ids, fuzzy = [], False
    q = _norm(question["question"])
    for s, o in evidence_subjects(question["evidence"]):
        exact = by_title.get(s)
        if exact is not None and exact not in ids:
            ids.append(exact)
            continue
        best, best_id = 0.0, None
        for i, p in enumerate(corpus):
            if i in ids:
                continue
            score = name_similarity(s, p) + 0.3 * (i in window) + 0.3 * (_norm(o) in _norm(p["text"])) \
                + 0.2 * _whole_words_in(_norm(_strip_parenthetical(p["title"])), q)
            if score > best:
                best, best_id = score, i
        if best_id is not None and best >= 1.0:
            ids.append(best_id)
            fuzzy = True
    return ids, fuzzy


def convert_2wiki(corpus_rows: list[dict], question_rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(corpus, questions) of 2WikiMultiHopQA from HippoRAG's corpus list and LinearRAG's question list."""
    corpus = [{"id": i, "title": p["title"], "text": p["text"]} for i, p in enumerate(corpus_rows)]
    by_title = {}
    for p in corpus:
        by_title.setdefault(p["title"], p["id"])
    # a question's window: around its exact matches, or (none) between its neighbours' matches
    exact = [[by_title[s] for s, _, _ in q["evidence"] if s in by_title] for q in question_rows]
    windows = []
    for k, hits in enumerate(exact):
        if hits:
            windows.append(range(max(0, min(hits) - WINDOW), max(hits) + WINDOW + 1))
            continue
        before = next((max(h) for h in reversed(exact[:k]) if h), 0)
        after = next((min(h) for h in exact[k + 1:] if h), len(corpus) - 1)
        windows.append(range(before, after + 1))
    questions = []
    for q, window in zip(question_rows, windows):
        ids, fuzzy = gold_passages(q, corpus, by_title, window)
        questions.append({"id": q["id"], "question": q["question"], "answers": [q["answer"]],
                          "supporting_ids": ids, "supporting_titles": [corpus[i]["title"] for i in ids],
                          "type": q.get("question_type") or q.get("type"),
                          "gold_quality": quality(len(ids), len(evidence_subjects(q["evidence"])), fuzzy),
                          "evidence": q["evidence"]})
    return corpus, questions


# ------------------------------------------------------------------ HotpotQA (HippoRAG v1)
def convert_hotpotqa(corpus_dict: dict, question_rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(corpus, questions) from HippoRAG v1's corpus (title -> sentences, in its order; the text is the sentences
    joined as HippoRAG joins them, with nothing between) and HotpotQA rows."""
    corpus = [{"id": i, "title": t, "text": "".join(sents) if isinstance(sents, list) else sents}
              for i, (t, sents) in enumerate(corpus_dict.items())]
    by_title = {p["title"]: p["id"] for p in corpus}
    questions = []
    for q in question_rows:
        titles = list(dict.fromkeys(t for t, _ in q["supporting_facts"]))
        ids = [by_title[t] for t in titles if t in by_title]
        questions.append({"id": q.get("_id", q.get("id")), "question": q["question"], "answers": [q["answer"]],
                          "supporting_ids": ids, "supporting_titles": [corpus[i]["title"] for i in ids],
                          "type": q.get("type"), "gold_quality": quality(len(ids), len(titles), False)})
    return corpus, questions


# ------------------------------------------------------------------ MuSiQue
def convert_musique(rows: list[dict], ids: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(corpus, questions) from MuSiQue-Ans rows; ``ids``: keep these questions, in this order (each must be
    there)."""
    if ids is not None:
        by_id = {r["id"]: r for r in rows}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise SystemExit(f"musique: {len(missing)} listed id(s) not in the input, e.g. {missing[0]!r}")
        rows = [by_id[i] for i in ids]
    corpus: list[dict] = []
    index: dict = {}
    questions = []
    for r in rows:
        local = []
        for p in r["paragraphs"]:
            key = (p["title"], p["paragraph_text"])
            if key not in index:
                index[key] = len(corpus)
                corpus.append({"id": len(corpus), "title": p["title"], "text": p["paragraph_text"]})
            local.append(index[key])
        by_idx = {p["idx"]: k for k, p in enumerate(r["paragraphs"])} if all("idx" in p for p in r["paragraphs"]) \
            else {k: k for k in range(len(r["paragraphs"]))}
        chain = [local[by_idx[h["paragraph_support_idx"]]] for h in r.get("question_decomposition", [])
                 if h.get("paragraph_support_idx") is not None]
        flagged = [local[k] for k, p in enumerate(r["paragraphs"]) if p.get("is_supporting")]
        gold = list(dict.fromkeys(chain + [i for i in flagged if i not in chain]))
        questions.append({"id": r["id"], "question": r["question"],
                          "answers": [r["answer"], *r.get("answer_aliases", [])],
                          "supporting_ids": gold, "supporting_titles": [corpus[i]["title"] for i in gold],
                          "type": r["id"].split("__")[0], "gold_quality": quality(len(gold), len(flagged), False)})
    return corpus, questions


# ------------------------------------------------------------------ the program
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.datasets", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", choices=["2wiki", "hotpotqa", "musique"])
    ap.add_argument("--corpus", type=Path, help="the release's corpus file (2wiki, hotpotqa)")
    ap.add_argument("--questions", type=Path, required=True, help="the release's question file")
    ap.add_argument("--out", type=Path, required=True, help="the folder to write corpus.jsonl and questions.jsonl to")
    ap.add_argument("--ids", type=Path, default=None,
                    help=f"musique: keep the questions listed in this file (one id a line), in its order; "
                         f"'dev200': {MUSIQUE_DEV200_IDS.name}, the README's 200 dev questions")
    args = ap.parse_args(argv)
    if args.set != "musique" and args.corpus is None:
        ap.error(f"{args.set} needs --corpus")
    if args.set == "2wiki":
        corpus, questions = convert_2wiki(read_json_or_lines(args.corpus), read_json_or_lines(args.questions))
    elif args.set == "hotpotqa":
        corpus, questions = convert_hotpotqa(read_json_or_lines(args.corpus), read_json_or_lines(args.questions))
    else:
        ids = None
        if args.ids is not None:
            path = MUSIQUE_DEV200_IDS if str(args.ids) == "dev200" else args.ids
            ids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        corpus, questions = convert_musique(read_json_or_lines(args.questions), ids)
    write_set(args.out, corpus, questions)
    kinds: dict = {}
    for q in questions:
        kinds[q["gold_quality"]] = kinds.get(q["gold_quality"], 0) + 1
    print(f"{args.out}: {len(corpus)} passages, {len(questions)} questions (gold: "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
