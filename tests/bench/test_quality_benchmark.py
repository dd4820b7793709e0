"""benchmarks.quality: per-hop recall by hand, and one run over several --data folders."""
import json

import pytest

from benchmarks import quality
from conftest import two_data_folders


def test_per_hop_recall_by_position_in_supporting_ids():
    ranked = ["7", "3", "9", "1", "4", "8"]
    m = quality.per_question_metrics(ranked, [3, 8, 5], ["x"], lambda pid: "")
    # hop 1 (id 3) is 2nd, hop 2 (id 8) 6th, hop 3 (id 5) missing
    assert (m["hop1@2"], m["hop1@5"], m["hop1@10"]) == (1.0, 1.0, 1.0)
    assert (m["hop2@2"], m["hop2@5"], m["hop2@10"]) == (0.0, 0.0, 1.0)
    assert (m["hop3@2"], m["hop3@5"], m["hop3@10"]) == (0.0, 0.0, 0.0)
    assert "hop4@5" not in m
    assert m["recall@5"] == pytest.approx(1 / 3) and m["recall@10"] == pytest.approx(2 / 3)
    agg = quality.aggregate([m, quality.per_question_metrics(ranked, [8], [], lambda pid: "")])
    assert agg["hop1@10"] == 100.0 and agg["hop2@10"] == 100.0  # hop 2 only in the first question


def test_one_run_over_two_data_folders(tmp_path, small_corpus, small_questions, small_rag, capsys):
    cache, (set_a, set_b) = two_data_folders(tmp_path, small_corpus, small_questions, small_rag)
    out = tmp_path / "multi.json"
    rc = quality.main(["--data", str(set_a), str(set_b), "--cache", str(cache),
                       "--modes", "no_chain", "chain", "dense", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["datasets"]) == {"setA", "setB"}
    assert res["datasets"]["setA"]["n_questions"] == 3 and res["datasets"]["setB"]["n_questions"] == 3
    for name in ("setA", "setB"):
        overall = res["datasets"][name]["systems"]["chain"]["overall"]
        assert "hop1@5" in overall and "hop2@5" in overall
        assert res["summary"]["chain"][name]["recall@5"] == overall["recall@5"]
    printed = capsys.readouterr().out
    assert "summary: recall@2 / @5 / @10" in printed, printed[-3000:]
    assert "per hop" in printed


def test_without_data_it_says_where_the_data_sets_are(capsys):
    """No --data: not argparse's bare "required", but one line saying what the data are and where the docs say how
    to get them (the README's benchmark line points there too); exit 2."""
    import re
    from pathlib import Path

    from benchmarks import quality

    with pytest.raises(SystemExit) as info:
        quality.main([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    message = err.strip().splitlines()[-1]
    assert "--data" in message and "corpus.jsonl and questions.jsonl" in message and "docs/benchmarks/quality.md" in message
    root = Path(__file__).resolve().parents[2]
    assert "### Data sets" in (root / "docs/benchmarks/quality.md").read_text()
    readme = (root / "README.md").read_text()
    assert re.search(r"python -m benchmarks\.quality[^\n]*\n(.*\n){0,3}.*docs/benchmarks/quality\.md#data-sets", readme)
