"""benchmarks.rerank_headroom: the reorderings by hand, and a run on the small corpus."""
import json

import pytest

from benchmarks import rerank_headroom as rh
from conftest import two_data_folders


def test_reorderings_and_recall_by_hand():
    row = [7, 3, 9, 1, 4, 8]
    assert rh.oracle_reorder(row, {1, 8}, 5) == [1, 7, 3, 9, 4, 8]  # 8 is below the depth: stays
    assert rh.oracle_reorder(row, {1, 8}, 6) == [1, 8, 7, 3, 9, 4]
    cos = [0.1, 0.5, 0.3, 0.5, 0.9, 0.0]
    assert rh.cosine_reorder(row, cos, 5) == [4, 3, 1, 9, 7, 8]  # the tie 3 / 1 keeps their rank order
    assert rh.cosine_reorder(row[:2], cos[:2], 5) == [3, 7]
    r = rh.recall([row, [2, 5]], [{3, 8}, set()], ks=(2, 5, 6))
    assert r == {"recall@2": 50.0, "recall@5": 50.0, "recall@6": 100.0}  # the question without gold is left out
    assert rh.recall([row], [set()], ks=(2,)) == {"recall@2": None}


def test_run_on_two_sets_reports_the_default_oracles_and_cosine_rerank(tmp_path, small_corpus, small_questions,
                                                                        small_rag):
    cache, (set_a, set_b) = two_data_folders(tmp_path, small_corpus, small_questions, small_rag)
    out = tmp_path / "headroom.json"
    assert rh.main(["--data", str(set_a), str(set_b), "--cache", str(cache),
                    "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["datasets"]) == {"setA", "setB"}
    for name, qs in (("setA", small_questions[:3]), ("setB", small_questions[3:])):
        d = res["datasets"][name]
        assert d["n_questions"] == len(qs)
        # the default equals recall computed here from the engine's own ranking
        enc = small_rag.encode_queries([q["question"] for q in qs])
        ranked = small_rag.retrieve(enc, small_rag.config.replace(top_k=20)).indices.tolist()
        row_of = {str(pid): i for i, pid in enumerate(small_rag.index.passage_ids)}
        gold = [{row_of[str(g)] for g in q["supporting_ids"]} for q in qs]
        assert d["default"]["recall@5"] == round(100 * sum(len(g & set(r[:5])) / len(g)
                                                          for r, g in zip(ranked, gold)) / len(qs), 2)
        # a reorder within the top K leaves recall@K (and beyond) as it was and cannot lower recall at smaller k
        for depth in (5, 10, 20):
            o = d[f"oracle_top{depth}"]
            assert all(o[f"recall@{k}"] == d["default"][f"recall@{k}"] for k in (2, 5, 10, 20) if k >= depth)
            assert all(o[f"recall@{k}"] >= d["default"][f"recall@{k}"] for k in (2, 5, 10, 20))
        c = d["cosine_top10"]
        assert c["recall@10"] == d["default"]["recall@10"] and c["recall@20"] == d["default"]["recall@20"]
        assert 0.0 <= c["recall@2"] <= 100.0


def test_a_missing_file_or_a_bad_override_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        rh.main(["--data", str(tmp_path / "nowhere")])
    assert exc.value.code == 2 and str(tmp_path / "nowhere" / "corpus.jsonl") in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        rh.main(["--data", str(tmp_path), "--set", "lam"])
    assert exc.value.code == 2 and "--set expects FIELD=VALUE, got 'lam'" in capsys.readouterr().err
