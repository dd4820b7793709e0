"""The benchmark programs run end to end on tiny sizes (their numbers are not checked, their plumbing is)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_mode_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--smoke",
                           "--json", str(out), "--budget-s", "120"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    for name in ("bandwidth", "agreement", "kernels", "timing", "questions", "graph"):
        assert "error" not in res["sections"][name], res["sections"][name].get("traceback")
    assert res["sections"]["agreement"]["result"]["ok"]
    assert res["sections"]["agreement"]["result"]["local"]["device_vs_cpu"]["max_rel_err_scores"] < 1e-3
    q = res["sections"]["questions"]["result"]  # the whole question path on a real (tiny) index
    assert [r["batch"] for r in q["rows"]] == [1, 16] and all(r["questions_per_s"] > 0 for r in q["rows"])
    workers = q["rows_question_ner_processes"]  # the batches again with NER in a worker process
    assert q["question_ner_processes"] == 1 and [r["batch"] for r in workers] == [1, 16]
    assert all(r["questions_per_s"] > 0 for r in workers)
    assert q["top_k_same_as_cpu"] == q["compared"] > 0
    assert q["passages_per_s"] > 0 and {"ner", "embed_passages", "embed_entities"} <= set(q["build_stages_s"])
    timing = res["sections"]["timing"]["result"]
    assert {r["batch"] for r in timing} == {1, 8}
    # both walks at every size of the smoke run (ppr_local_from 0 there), auto running the local push
    assert {(r["passages"], r["batch"], r["mode"], r["ppr_mode_run"]) for r in timing} == {
        (P, B, m, run) for P in (2_000, 6_000) for B in (1, 8) for m, run in (("exact", "exact"), ("auto", "local"))}
    graph = res["sections"]["graph"]["result"]  # the graph stage alone on that index (no sync debug on the CPU)
    assert [r["batch"] for r in graph["rows"]] == [1, 16] and "sync_debug" not in graph
    assert all(r["questions_per_s"] > 0 and 0 < r["host_reads_per_batch"] < 100 for r in graph["rows"])
    kernel_ops = {r["op"] for r in res["sections"]["kernels"]["result"]}
    assert {"ppr_step", "personalized_pagerank", "top-k passages", "reference activation"} <= kernel_ops
    assert all(r["max_abs_diff_vs_unfused"] < 1e-4 for r in res["sections"]["kernels"]["result"])


def test_scaling_benchmark_writes_slopes_rows_and_plot(tmp_path):
    out = tmp_path / "scaling.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--sizes", "1000", "2000", "--batch", "1", "4",
                           "--backends", "torch", "scipy", "--ppr-modes", "exact", "--real", "none", "--dim", "64",
                           "--scipy-questions", "2", "--min-questions", "2", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert set(res["slopes"]) >= {"build", "build_warm", "query"} and isinstance(res["slopes"]["build"], float)
    assert all(s["build_warm_s"] > 0 for s in res["sizes"])
    torch_rows = [r for r in res["rows"] if r["backend"] == "torch"]
    assert all(r["ppr_step_calls"] > 0 and r["ppr_modeled_GB_per_s"] > 0 for r in torch_rows)
    keys = {"passages", "backend", "device", "batch", "queries_per_s", "build_s", "index_bytes", "peak_mem_bytes"}
    assert len(res["rows"]) == 2 * 2 * 2 and all(keys <= set(r) for r in res["rows"])
    assert {r["backend"] for r in res["rows"]} == {"torch", "scipy"}
    assert out.with_suffix(".png").stat().st_size > 0
    # bytes a passage by part: 64 float32 numbers a passage vector; the sum is the index's bytes
    for size in res["sizes"]:
        parts = size["index_bytes_per_passage_by_part"]
        assert parts["passage_vectors"] == 64 * 4 and size["dim"] == 64 and size["embedding_dtype"] == "float32"
        assert abs(sum(parts.values()) - size["index_bytes_per_passage"]) < 1.0
        assert size["graph_bytes_per_passage_by_part"]["walk"] > 0 and size["graph_bytes_per_passage_by_part"]["vectors"] == 0
        assert 0 < size["build_peak_anonymous_bytes"] <= size["build_peak_mem_bytes"]
    assert all(r["peak_anonymous_bytes"] > 0 for r in torch_rows) and res["skipped_sizes"] == []


def test_scaling_benchmark_defaults_are_the_real_size_and_skip_what_cannot_fit(tmp_path):
    """The defaults: 384-d vectors in an index's dtype, the defaults' row; a size whose memory extrapolated from the
    last one exceeds what is available is skipped and listed, not run into the out-of-memory killer."""
    from benchmarks import scaling

    args = scaling.parse_args(["--json", str(tmp_path / "x.json"), "--real", "none"])
    assert args.dim == 384 and args.ppr_modes == ["defaults"] and args.backends == ["torch"]
    assert args.embedding_dtype == "float32" and args.real is None
    with pytest.raises(SystemExit):
        scaling.parse_args(["--json", "x.json", "--real", str(tmp_path)])  # no corpus.jsonl there
    sizes = {1000: {"passages": 1000, "peak_rss_per_passage": 50_000}}
    ok, est, avail = scaling.fits(2000, sizes)
    assert ok and est == 100_000_000
    ok, est, avail = scaling.fits(10 ** 9, sizes)
    assert not ok and est == 5 * 10 ** 13 and 0 < avail < est
    out = tmp_path / "half.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--sizes", "1200", "--batch", "4", "--real", "none",
                           "--embedding-dtype", "float16", "--min-questions", "4", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    size = res["sizes"][0]
    assert size["index_bytes_per_passage_by_part"]["passage_vectors"] == 384 * 2
    assert [r["backend"] for r in res["rows"]] == ["torch defaults"]


def test_scaling_benchmark_runs_both_pagerank_modes_side_by_side(tmp_path):
    out = tmp_path / "scaling_local.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--sizes", "1500", "--batch", "4",
                           "--backends", "torch", "--ppr-modes", "exact", "local", "defaults", "--real", "none",
                           "--dim", "64", "--reset-passages", "20", "--min-questions", "4", "--agreement-questions", "8",
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    rows = {r["backend"]: r for r in res["rows"]}
    assert set(rows) == {"torch", "torch local", "torch defaults"}
    assert rows["torch local"]["settings"]["ppr_mode"] == "local" and rows["torch"]["settings"]["ppr_mode"] == "exact"
    # the defaults at 1,500 passages: auto, run as the exact walk (steps of the whole walk, no push)
    assert rows["torch defaults"]["settings"]["ppr_mode"] == "auto"
    assert rows["torch defaults"]["ppr_mode_run"] == "exact" and rows["torch defaults"]["ppr_step_calls"] > 0
    assert rows["torch local"]["ppr_touched_per_question_round"] > 0 and "ppr_touched_per_question_round" not in rows["torch"]
    assert {"cosines", "pagerank", "top-k"} <= set(rows["torch local"]["stage_ms_per_question"])
    agree = res["sizes"][0]["top5_same_as_exact_percent"]["torch local"]
    assert 0.0 <= agree <= 100.0


def test_scaling_benchmark_runs_the_ann_stage(tmp_path):
    pytest.importorskip("faiss")
    out = tmp_path / "scaling_ann.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--sizes", "1500", "--batch", "4",
                           "--backends", "torch", "--ppr-modes", "local", "--ann", "ivf", "--reset-passages", "20",
                           "--real", "none", "--dim", "64",
                           "--min-questions", "4", "--agreement-questions", "8", "--ann-cache", str(tmp_path / "ann"),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    rows = {r["backend"]: r for r in res["rows"]}
    assert set(rows) == {"torch local", "torch local ivf"} and rows["torch local ivf"]["settings"]["ann"] == "ivf"
    stage = res["sizes"][0]["ann"]["torch local ivf"]
    assert 0.0 <= stage["nearest_entity_recall"] <= 1.0 and 0.0 <= stage["top_m_recall"] <= 1.0
    assert stage["entity"]["bytes"] > 0 and not stage["entity"]["from_cache"]
    assert len(list((tmp_path / "ann").glob("*.faiss"))) == 2
    assert "native_bf16" in res["cpu_caps"]


def test_kernels_benchmark_checks_agreement_and_writes_plot(tmp_path):
    out = tmp_path / "kernels.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.fused_ops", "--passages", "1500", "--batch", "4",
                           "--repeat", "1", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    ops = {r["op"] for r in res["rows"]}
    assert {"ppr_step", "personalized_pagerank", "reference activation", "passage_reset (eq. 7)"} <= ops
    assert all(r["max_abs_diff_vs_unfused"] < 1e-4 for r in res["rows"])
    assert out.with_suffix(".png").stat().st_size > 0


def test_setting_overrides_parse_values_and_name_a_malformed_item():
    from benchmarks.common import setting_overrides

    errors = []
    got = setting_overrides(["chain_passages=0", "lam=0.5", "lexicon_seeds=False", "mode=paper", 'mode2="paper"',
                             "flag=true"], "--set", errors.append)
    assert got == {"chain_passages": 0, "lam": 0.5, "lexicon_seeds": False, "mode": "paper", "mode2": "paper",
                   "flag": True} and errors == []
    setting_overrides(["lam"], "--override", errors.append)
    assert errors == ["--override expects FIELD=VALUE, got 'lam'"]


def test_shards_agree_benchmark_compares_one_process_and_two(tmp_path, small_index_dir, small_questions):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": i, "question": q["question"]}) + "\n"
                                 for i, q in enumerate(small_questions)))
    out = tmp_path / "agree.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.shards_agree", "--index", str(small_index_dir),
                           "--questions", str(questions), "--flags=--rerank", "--explain-questions", "3",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    n = len(small_questions)
    assert result["n_questions"] == n and result["same_top_k_in_order"] == n and result["differing"] == []
    assert result["explain_with_shards"] == {"questions": 3, "hits_match_the_search": True}
    assert f"{n} of {n} questions" in proc.stdout


def test_encoder_arithmetic_pool_writes_passage_vectors_from_the_sentences(small_index_dir, tmp_path):
    import torch

    from linearrag_torch.index import TriGraphIndex

    dst = tmp_path / "pooled"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.encoder_arithmetic", "pool", str(small_index_dir),
                           str(dst), "--weights", "uniform"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    src, out = TriGraphIndex.load(small_index_dir), TriGraphIndex.load(dst)
    ps = src.PS.to("cpu")
    for p in range(src.num_passages):  # by hand: the normalised sum of the passage's sentence vectors
        rows = ps.col[ps.crow[p]:ps.crow[p + 1]].tolist()
        want = src.sentence_emb[rows].float().sum(0) if rows else src.passage_emb[p].float()
        want = want / want.norm()
        assert torch.allclose(out.passage_emb[p].float(), want, atol=1e-6), p
    assert torch.equal(out.sentence_emb, src.sentence_emb) and torch.equal(out.entity_emb, src.entity_emb)
    assert out.sentences == src.sentences and torch.equal(out.M.col, src.M.col) and torch.equal(out.M.val, src.M.val)
    meta = json.loads((dst / "encode_seconds.json").read_text())
    assert meta["passage_vectors"] == "pooled sentence vectors, uniform weights"


def test_a_result_names_the_cpu_and_its_kernels_capped_or_not():
    """Every benchmark's ``machine`` record names the CPU, the kernels torch dispatches to and whether bf16 is
    native there: the same CPU with torch's kernels capped at AVX2 (as on an AVX2-only CPU) says so."""
    code = ("import json, torch; from benchmarks.common import machine; "
            "print(json.dumps(machine(torch.device('cpu'), 1)))")
    records = {}
    for cap in (None, "avx2"):
        env = {k: v for k, v in __import__("os").environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if cap:
            env["ATEN_CPU_CAPABILITY"] = cap
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        records[cap] = json.loads(proc.stdout)
    capped = records["avx2"]
    assert capped["cpu"] == records[None]["cpu"] and capped["cpu"]
    assert capped["torch_cpu_capability"] == "AVX2" and capped["native_bf16"] is False
    assert capped["description"].endswith("no native bf16 kernels")


def test_scaling_benchmark_queries_an_index_written_to_disk(tmp_path):
    """--index-dir: each size written block by block and queried loaded back (mapped), as a saved index is: the folder
    is a loadable index of that size, and the run reports the write, the load and the folder's bytes."""
    from linearrag_torch.index import TriGraphIndex

    out = tmp_path / "disk.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--sizes", "1500", "--batch", "4", "--real", "none",
                           "--dim", "32", "--index-dir", str(tmp_path / "idx"), "--min-questions", "4",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    size = json.loads(out.read_text())["sizes"][0]
    assert size["index_on_disk"] and size["write_s"] > 0 and size["load_s"] > 0 and "build_warm_s" not in size
    index = TriGraphIndex.load(size["index_dir"])
    assert index.num_passages == 1500 and index.dim == 32 and index.num_entities == size["entities"]
    assert size["index_dir_bytes"] > index.num_entities * 32 * 4
