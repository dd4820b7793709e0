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
