"""Shared fixtures: offline models and one small real index built once per test session.

The small corpus is the bundled 2WikiMultiHopQA demo sample cut down to ~60 passages: the supporting
passages of six chosen demo questions plus, in corpus order, distractors up to SMALL_CORPUS_SIZE.
Building it (spaCy NER + MiniLM on 2 CPU cores) takes ~10 s, so every model-using test shares it.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# a few test modules share helpers with a module of another folder (``from test_serve import serving``): every
# folder of tests/ on the path, so that any subset of the suite collects as the whole does
for _folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and p.name.islower() and not p.name.startswith((".", "_"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

import pytest  # noqa: E402

import linearrag_torch  # noqa: E402

DATA = Path(linearrag_torch.__file__).parent / "data"
SMALL_CORPUS_SIZE = 60
# demo questions (0-based line numbers in demo_questions.jsonl) whose supporting passages go into the
# small corpus: compositional, compositional, comparison, bridge_comparison, comparison, inference
CHOSEN_QUESTIONS = (0, 5, 7, 10, 17, 26)


# Test modules that start processes, clusters or servers, or run end to end (Ray, torch.distributed, NER worker
# processes, the ONNX export, hypothesis, the benchmark programs): `pytest -m "not slow"` leaves them out of the
# inner loop. By file name, so that a module keeps its mark wherever it moves.
SLOW_MODULES = {
    "test_ray_build.py", "test_ray_serve.py", "test_sharded.py", "test_ner_pool.py", "test_onnx_encoder.py",
    "test_fuzz.py", "test_benchmark_scripts.py", "test_benchmark_qa.py", "test_quality_benchmark.py",
    "test_rerank_headroom.py", "test_page.py",
}


# Single tests of the other modules that run a program end to end or start processes (benchmark programs, NER worker
# processes, a server process drained by SIGTERM, a writer killed mid-write, a filled disk, the example scripts, the
# Triton interpreter, a fresh half-precision build, sentence-transformers as the encoder's oracle, the README's
# commands and snippets run as written, bf16 builds, which a CPU without native bf16 emulates): slow too, by
# name, so that the README's test command stays within 5 minutes on 2 cores. `-m slow` runs them (CI does).
SLOW_TESTS = {
    "test_overload_and_soak_benchmark_modes_end_to_end", "test_serve_benchmark_end_to_end",
    "test_question_path_versions_benchmark_options", "test_throughput_benchmark_with_ner_processes",
    "test_throughput_benchmark_end_to_end", "test_throughput_benchmark_graph_stage_alone",
    "test_serve_command_drains_on_sigterm_and_exits_0", "test_a_killed_ner_worker_under_load_fails_no_request",
    "test_ner_worker_processes_give_the_same_results", "test_cli_query_with_ner_processes",
    "test_a_killed_add_leaves_the_previous_index_and_a_second_writer_is_refused",
    "test_a_full_disk_during_add_delete_or_index_is_a_clear_error_and_changes_nothing",
    "test_fifty_writers_killed_at_random_points_leave_a_whole_index",
    "test_add_into_a_full_tmpfs_fails_in_one_line_and_the_served_index_stays",
    "test_add_and_delete_with_reloads_under_query_load_fail_no_query",
    "test_examples_run_on_the_sample", "test_triton_kernels_in_the_interpreter_match_the_fallbacks",
    "test_conversion_equals_a_fresh_half_build", "test_encoder_equals_sentence_transformers",
    "test_readme_commands_run_as_written", "test_readme_python_snippets_run_as_written",
    "test_questions_are_float32_and_add_encodes_in_the_index_precision", "test_auto_is_stored_resolved",
    "test_index_and_query_with_a_local_sentence_transformers_folder",
    "test_the_loop_reads_the_host_as_often_for_any_batch", "test_a_planted_broken_link_fails_the_docs_build",
    "test_the_readme_server_snippet_runs_as_written", "test_aggressive_retrying_clients_keep_the_goodput_of_capacity",
    "test_the_readme_server_snippet_stops_waiting_when_the_server_exits", "test_the_readme_s_docs_build_prints_no_banner",
    "test_serve_ab_benchmark_alternates_settings_and_divides_by_the_runs_capacity",
    "test_linearrag_mcp_over_stdio",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process or end-to-end; left out by -m 'not slow' (conftest.SLOW_MODULES)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    # every name above still names a test (read from the files: a module skipped for a missing extra collects none)
    defined = {m for f in Path(__file__).parent.rglob("test_*.py")
               for m in re.findall(r"^def (test_\w+)\(", f.read_text(encoding="utf-8"), re.M)}
    assert SLOW_TESTS <= defined, f"conftest.SLOW_TESTS names no test: {sorted(SLOW_TESTS - defined)}"


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path, objs):
    Path(path).write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs), encoding="utf-8")
    return Path(path)


def two_data_folders(tmp_path, small_corpus, small_questions, small_rag):
    """(cache, [setA, setB]) for the benchmarks' --data runs: two folders with the small corpus and three of the
    chosen questions each, and a benchmarks.quality cache holding the small index, so that a run builds nothing."""
    from benchmarks import quality

    cache = tmp_path / "cache"
    folder = cache / quality.cache_key(small_corpus, quality.IndexConfig())[:24]
    small_rag.save(folder / "index")
    (folder / "build.json").write_text(json.dumps({"build_s": 1.0}))
    folders = []
    for name, qs in (("setA", small_questions[:3]), ("setB", small_questions[3:])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "corpus.jsonl").write_bytes(small_corpus.read_bytes())
        write_jsonl(tmp_path / name / "questions.jsonl", qs)
        folders.append(tmp_path / name)
    return cache, folders


def index_without_setting(index_dir, dst, field: str):
    """A copy of index folder ``index_dir`` at ``dst`` whose index.json lacks index_config[field], as an
    index written before that setting existed; returns ``dst``."""
    import shutil

    shutil.copytree(index_dir, dst)
    meta = json.loads((Path(dst) / "index.json").read_text())
    del meta["index_config"][field]
    (Path(dst) / "index.json").write_text(json.dumps(meta))
    return Path(dst)


def demo_corpus():
    return read_jsonl(DATA / "demo_corpus.jsonl")


def demo_questions():
    return read_jsonl(DATA / "demo_questions.jsonl")


def small_passages():
    """The passages of the small corpus (dicts with id, title, text), in demo-corpus order."""
    corpus = demo_corpus()
    questions = demo_questions()
    wanted = {sid for i in CHOSEN_QUESTIONS for sid in questions[i]["supporting_ids"]}
    chosen = [p for p in corpus if p["id"] in wanted]
    assert len(chosen) == len(wanted), "a supporting passage of a chosen question is not in the demo corpus"
    for p in corpus:
        if len(chosen) >= SMALL_CORPUS_SIZE:
            break
        if p["id"] not in wanted:
            chosen.append(p)
    position = {p["id"]: i for i, p in enumerate(corpus)}
    return sorted(chosen, key=lambda p: position[p["id"]])


@pytest.fixture(scope="session")
def small_questions():
    """The six chosen demo questions (dicts with question, answers, supporting_ids, ...)."""
    qs = demo_questions()
    return [qs[i] for i in CHOSEN_QUESTIONS]


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """Path of a JSONL file with the ~60 passages of the small corpus."""
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "small_corpus.jsonl", small_passages())


@pytest.fixture(scope="session")
def nlp():
    """The default spaCy pipeline, loaded once (the same loader LinearRAG uses)."""
    from linearrag_torch.models import load_nlp
    from linearrag_torch.config import IndexConfig

    return load_nlp(IndexConfig())


@pytest.fixture(scope="session")
def encoder():
    """The default encoder (packaged all-MiniLM-L6-v2) on the CPU in float32, loaded once. float32 whatever
    IndexConfig.encoder_precision "auto" picks on this machine: tests compare exact vectors (the small
    index built with it stores encoder_precision float32)."""
    from linearrag_torch.models import load_encoder
    from linearrag_torch.config import IndexConfig

    return load_encoder(IndexConfig(encoder_precision="float32"), "cpu")


@pytest.fixture(scope="session")
def small_rag(small_corpus, nlp, encoder):
    from linearrag_torch import LinearRAG

    return LinearRAG.build(small_corpus, device="cpu", progress=False, nlp=nlp, encoder=encoder)


@pytest.fixture(scope="session")
def small_index_dir(small_rag, tmp_path_factory):
    return small_rag.save(tmp_path_factory.mktemp("small_index") / "index")


def assert_pair_moved(got: list, plain: list, candidates: int = 5) -> None:
    """``got`` is ``plain`` (a ranking without the pair rerank, pairs.py) with two of its first ``candidates``
    passages moved to the front in their ranked order and the rest in their order (same length)."""
    front = list(got[:2])
    assert set(front) <= set(plain[:candidates]) and sorted(front, key=plain.index) == front, (got, plain)
    assert list(got[2:]) == [x for x in plain if x not in front][:len(got) - 2], (got, plain)


# ------------------------------------------------------------------ tiny cross-encoders (tests/rerank)
@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """A 2-layer, 32-wide BERT with the packaged MiniLM's tokenizer, randomly initialised (seed 0)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from linearrag_torch.models.reranker import packaged_base_folder

    folder = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(packaged_base_folder())).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_reranker_dir(tiny_base, tmp_path_factory):
    """A saved reranker folder with the tiny BERT (random weights, float32) and a fusion that mixes all three
    terms, so that the order it gives differs from the graph's."""
    import torch

    from linearrag_torch.rerank import RerankerSettings
    from linearrag_torch.models.reranker import base_cross_encoder, save_model

    model, tok = base_cross_encoder(tiny_base, seed=5)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    folder = tmp_path_factory.mktemp("tiny_reranker") / "model"
    save_model(model.eval(), tok, RerankerSettings(max_length=64, question_tokens=24, w_model=3.0, w_rank=-0.3,
                                                   w_score=0.2), folder, half=False)
    return folder


@pytest.fixture(scope="session")
def tiny_chain_reranker_dir(tiny_base, tmp_path_factory):
    """As tiny_reranker_dir, chain-aware (context_tokens 12)."""
    import torch

    from linearrag_torch.rerank import RerankerSettings
    from linearrag_torch.models.reranker import base_cross_encoder, save_model

    model, tok = base_cross_encoder(tiny_base, seed=6)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    folder = tmp_path_factory.mktemp("tiny_chain_reranker") / "model"
    save_model(model.eval(), tok, RerankerSettings(max_length=64, question_tokens=20, context_tokens=12, w_model=3.0,
                                                   w_rank=-0.3, w_score=0.2), folder, half=False)
    return folder


def assert_close(got, want, where: str = "", rel: float = 1e-5, abs_: float = 1e-6) -> None:
    """``got`` equals ``want`` (nested dicts, lists, tuples, named tuples, strings, numbers) but for floats,
    which agree within ``rel`` / ``abs_`` (a sharded result against one process's: summation order)."""
    if isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want, rel=rel, abs=abs_), f"{where}: {got} != {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}", rel, abs_)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]", rel, abs_)
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def without_paths(explanations: list) -> list:
    """Explanations less each hit's "paths", which a sharded engine does not draw (it holds no whole index to read
    the sentences from: retrieval/explain.Paths)."""
    assert all("paths" in e for e in explanations)
    return [{k: v for k, v in e.items() if k != "paths"} for e in explanations]
