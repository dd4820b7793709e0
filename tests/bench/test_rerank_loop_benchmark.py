"""benchmarks/rerank_loop.py: the systems it compares are the ones it names."""


def test_rerank_loop_systems_name_what_they_run():
    """benchmarks.rerank_loop's "rerank" system reranks the final list only (rerank_loop_candidates 0): with the
    default (5, the loop) its dev rows of 2026-12-04/05 for MuSiQue and 2wiki measured the loop twice."""
    from benchmarks.rerank_loop import systems

    got = systems([5, 10], ["float32", "int8"], {"sp": "/models/sp"})
    assert not got["graph"].rerank
    assert got["rerank"].rerank and got["rerank"].rerank_loop_candidates == 0 and got["rerank"].reranker == ""
    assert got["loop5"].rerank_loop_candidates == 5 and got["loop10"].rerank_loop_candidates == 10
    assert got["rerank_int8"].reranker_precision == "int8" and got["rerank_int8"].rerank_loop_candidates == 0
    assert got["rerank_sp"].reranker == "/models/sp" and got["rerank_sp"].rerank_loop_candidates == 0
    assert got["loop5_int8_sp"].reranker == "/models/sp" and got["loop5_int8_sp"].rerank_loop_candidates == 5
    assert "rerank_c10" not in got
    more = systems([5], ["auto"], final_candidates=(5, 10))
    assert sorted(more) == ["graph", "loop5_auto", "loop5_auto_c10", "rerank_auto", "rerank_auto_c10"]
    assert more["loop5_auto_c10"].rerank_candidates == 10 and more["loop5_auto"].rerank_candidates == 5


def test_rerank_loop_counts_the_pairs_the_cross_encoder_reads(small_rag, small_questions, tiny_chain_reranker_dir):
    """pairs_per_question: none for the graph, rerank_candidates for the final list, and for the loop its round's
    candidates plus the final list's pairs it had not read (the same pair is not read twice: fewer than 2 x 5)."""
    from benchmarks.rerank_loop import run_set

    base = small_rag.config.replace(reranker=str(tiny_chain_reranker_dir))
    configs = {"graph": base, "rerank": base.replace(rerank=True, rerank_loop_candidates=0),
               "loop5": base.replace(rerank=True, rerank_loop_candidates=5)}
    got = run_set(small_rag, small_questions, configs, batch=4)
    assert got["graph"]["pairs_per_question"] == 0
    assert got["rerank"]["pairs_per_question"] == 5
    assert 5 < got["loop5"]["pairs_per_question"] < 10


def test_rerank_loop_names_the_set_reader_systems():
    from benchmarks.rerank_loop import systems

    got = systems([5], ["auto"], set_reader=True)
    assert sorted(got) == ["graph", "loop5_auto", "rerank_auto", "set5_auto", "set5_noreach_auto"]
    assert got["set5_auto"].rerank_set_reader and got["set5_auto"].rerank_loop_candidates == 5
    assert got["set5_auto"].rerank_reach == 10 and got["set5_noreach_auto"].rerank_reach == 0
    assert not got["loop5_auto"].rerank_set_reader
