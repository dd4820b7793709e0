"""benchmarks.datasets: the README's evaluation sets from the public releases, on small hand-made inputs in each
release's format: corpus ids, gold passages (exact, fuzzy, missing), the MuSiQue merge and selection, and the
program's output read back by the package's own readers, byte for byte the same on a second run."""
import json

import pytest

from benchmarks import datasets
from linearrag_torch.corpus import read_corpus, read_questions

WIKI_CORPUS = [  # HippoRAG's 2wikimultihopqa_corpus.json: a list of {"title", "text"}
    {"title": "Thunder on the Hill", "text": "Thunder on the Hill is a 1951 film. Its music is by Hans J. Salter."},
    {"title": "Hans J. Salter", "text": "Hans J. Salter was an Austrian-American film composer."},
    {"title": "Maurice, Prince of Orange", "text": "Maurice of Nassau was stadtholder. His father was William."},
    {"title": "William the Silent", "text": "William the Silent died in Delft."},
    {"title": "David Pigot", "text": "David Pigot was an Irish judge."},
    {"title": "David Pigot (Master of the Rolls)", "text": "David Richard Pigot was the son of David Pigot."},
    {"title": "Blue River", "text": "Blue River is a river."},
]
WIKI_QUESTIONS = [  # the LinearRAG release's 2wikimultihop/questions.json
    {"id": "q-exact", "question_type": "compositional", "answer": "Austrian",
     "question": "Which country the composer of film Thunder On The Hill is from?",
     "evidence": [["Thunder on the Hill", "composer", "Hans J. Salter"],
                  ["Hans J. Salter", "country of citizenship", "Austrian"]]},
    {"id": "q-fuzzy", "question_type": "compositional", "answer": "Delft",
     "question": "Where was the place of death of Maurice, Prince Of Orange's father?",
     "evidence": [["Maurice of Nassau", "father", "William the Silent"],
                  ["William the Silent", "place of death", "Delft"]]},
    {"id": "q-twice", "question_type": "inference", "answer": "David Pigot",
     "question": "Who is the paternal grandfather of David Pigot?",
     "evidence": [["David Pigot", "father", "David Pigot"], ["David Pigot", "father", "Someone"]]},
    {"id": "q-missing", "question_type": "comparison", "answer": "no",
     "question": "Are Zzyzx Road and Blue River in the same country?",
     "evidence": [["Zzyzx Road", "country", "United States"], ["Blue River", "country", "Canada"]]},
]


def test_2wiki_gold_exact_fuzzy_second_entity_and_missing():
    corpus, questions = datasets.convert_2wiki(WIKI_CORPUS, WIKI_QUESTIONS)
    assert [p["id"] for p in corpus] == list(range(len(WIKI_CORPUS)))
    assert [(p["title"], p["text"]) for p in corpus] == [(p["title"], p["text"]) for p in WIKI_CORPUS]
    got = {q["id"]: q for q in questions}
    assert got["q-exact"]["supporting_ids"] == [0, 1] and got["q-exact"]["gold_quality"] == "exact"
    assert got["q-exact"]["answers"] == ["Austrian"] and got["q-exact"]["type"] == "compositional"
    # "Maurice of Nassau" is no title: the fuzzy rule finds "Maurice, Prince of Orange"
    assert got["q-fuzzy"]["supporting_titles"] == ["Maurice, Prince of Orange", "William the Silent"]
    assert got["q-fuzzy"]["gold_quality"] == "heuristic"
    # the father of the same name is a second entity: a second passage
    assert got["q-twice"]["supporting_ids"] == [4, 5] and got["q-twice"]["gold_quality"] == "heuristic"
    # a subject no passage names is left out, and says so
    assert got["q-missing"]["supporting_ids"] == [6] and got["q-missing"]["gold_quality"] == "partial"
    assert got["q-missing"]["evidence"] == WIKI_QUESTIONS[3]["evidence"]


def test_the_evidence_subjects_count_a_namesake_twice():
    assert datasets.evidence_subjects([["A", "r", "B"], ["B", "r", "C"], ["A", "s", "D"]]) == [("A", "B"), ("B", "C")]
    assert datasets.evidence_subjects([["A", "father", "A"], ["A", "father", "C"]]) == [("A", "A"), ("A", "C")]


def test_hotpotqa_titles_of_the_supporting_facts():
    corpus_dict = {"Alû": ["Alû is a demon.", " It has no mouth."], "Lilu (mythology)": ["Lilu is a spirit."],
                   "Other": ["Nothing."]}
    rows = [{"_id": "5a77", "question": "If Gallu is a demon Lilu is what?", "answer": "a spirit", "type": "bridge",
             "supporting_facts": [["Alû", 0], ["Lilu (mythology)", 0], ["Alû", 1]]},
            {"_id": "5a78", "question": "Gone?", "answer": "no", "type": "comparison",
             "supporting_facts": [["Other", 0], ["Not in the corpus", 0]]}]
    corpus, questions = datasets.convert_hotpotqa(corpus_dict, rows)
    assert corpus[0] == {"id": 0, "title": "Alû", "text": "Alû is a demon. It has no mouth."}  # joined as HippoRAG does
    assert questions[0] == {"id": "5a77", "question": "If Gallu is a demon Lilu is what?", "answers": ["a spirit"],
                            "supporting_ids": [0, 1], "supporting_titles": ["Alû", "Lilu (mythology)"],
                            "type": "bridge", "gold_quality": "exact"}
    assert questions[1]["supporting_ids"] == [2] and questions[1]["gold_quality"] == "partial"


def musique_row(qid, paragraphs, support, answer="x", aliases=()):
    """A MuSiQue-Ans row: ``paragraphs`` [(title, text)], ``support`` the supporting paragraphs' idx in hop
    order."""
    return {"id": qid, "question": f"question {qid}?", "answer": answer, "answer_aliases": list(aliases),
            "answerable": True,
            "paragraphs": [{"idx": k, "title": t, "paragraph_text": x, "is_supporting": k in support}
                           for k, (t, x) in enumerate(paragraphs)],
            "question_decomposition": [{"id": k, "question": "hop", "answer": "a", "paragraph_support_idx": i}
                                       for k, i in enumerate(support)]}


ROWS = [musique_row("2hop__1_2", [("A", "a."), ("B", "b."), ("C", "c.")], [2, 0], "Stanley", ["Stan"]),
        musique_row("3hop1__3_4_5", [("C", "c."), ("B", "b, other text."), ("D", "d.")], [1, 2, 0]),
        musique_row("2hop__6_7", [("E", "e."), ("A", "a.")], [1, 0])]


def test_musique_merges_equal_paragraphs_keeps_hop_order_and_selects_by_id():
    corpus, questions = datasets.convert_musique(ROWS)
    # equal (title, text) merged, in order of first appearance; the same title with other text is another passage
    assert [(p["id"], p["title"], p["text"]) for p in corpus] == [
        (0, "A", "a."), (1, "B", "b."), (2, "C", "c."), (3, "B", "b, other text."), (4, "D", "d."), (5, "E", "e.")]
    assert [q["supporting_ids"] for q in questions] == [[2, 0], [3, 4, 2], [0, 5]]  # along the hop chain
    assert questions[0]["answers"] == ["Stanley", "Stan"] and questions[1]["type"] == "3hop1"
    assert all(q["gold_quality"] == "exact" for q in questions)
    # a selection: those questions, in the list's order, and only their paragraphs
    corpus, questions = datasets.convert_musique(ROWS, ids=["2hop__6_7", "2hop__1_2"])
    assert [q["id"] for q in questions] == ["2hop__6_7", "2hop__1_2"]
    assert [p["title"] for p in corpus] == ["E", "A", "B", "C"] and questions[1]["supporting_ids"] == [3, 1]
    with pytest.raises(SystemExit, match="not in the input"):
        datasets.convert_musique(ROWS, ids=["2hop__404"])


def test_the_readme_musique_selection_is_200_distinct_dev_ids():
    ids = datasets.MUSIQUE_DEV200_IDS.read_text(encoding="utf-8").split()
    assert len(ids) == len(set(ids)) == 200
    assert all(i.split("__")[0] in {"2hop", "3hop1", "3hop2", "4hop1", "4hop2", "4hop3"} for i in ids)


def test_the_program_writes_what_the_package_reads_the_same_bytes_twice(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "corpus.json").write_text(json.dumps(WIKI_CORPUS), encoding="utf-8")
    (raw / "questions.json").write_text(json.dumps(WIKI_QUESTIONS), encoding="utf-8")
    (raw / "musique.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    (raw / "ids.txt").write_text("2hop__6_7\n2hop__1_2\n", encoding="utf-8")
    outs = []
    for run in ("a", "b"):
        assert datasets.main(["2wiki", "--corpus", str(raw / "corpus.json"), "--questions",
                              str(raw / "questions.json"), "--out", str(tmp_path / run / "2wiki")]) == 0
        assert datasets.main(["musique", "--questions", str(raw / "musique.jsonl"), "--ids", str(raw / "ids.txt"),
                              "--out", str(tmp_path / run / "musique")]) == 0
        outs.append({p.relative_to(tmp_path / run): p.read_bytes() for p in sorted((tmp_path / run).rglob("*.jsonl"))})
    assert outs[0] == outs[1] and len(outs[0]) == 4
    err = capsys.readouterr().err
    assert "7 passages, 4 questions (gold: exact 1, heuristic 2, partial 1)" in err, err
    passages = read_corpus(tmp_path / "a" / "2wiki" / "corpus.jsonl")
    assert [p.title for p in passages] == [p["title"] for p in WIKI_CORPUS]
    questions = read_questions(tmp_path / "a" / "musique" / "questions.jsonl")
    assert [q["question"] for q in questions] == ["question 2hop__6_7?", "question 2hop__1_2?"]
    with pytest.raises(SystemExit):
        datasets.main(["2wiki", "--questions", str(raw / "questions.json"), "--out", str(tmp_path / "x")])
