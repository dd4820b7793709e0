"""The Ray build (linearrag_torch/indexing/ray_build.py, `linearrag index|add --ray`) against the local build.

The Ray tests start a local Ray inside the test (2 CPUs, no dashboard) once for the module, and each
Ray call runs under a deadline. They check what issue 12 asks: the index built with --ray equals the
local build of the same corpus (identical strings, matrices, NER record and token keys, embeddings
within 1e-6, the same top-k for the demo questions), and `add --ray` equals a local add. The tests of
the error messages, the actor plan and the batch forming need no Ray cluster.
"""
import shutil
import signal
import socket
import sys
from contextlib import contextmanager

import pytest
import torch

from linearrag_torch import LinearRAG
from linearrag_torch.indexing import ray_build
from linearrag_torch.models import encoding
from linearrag_torch.cli import main
from linearrag_torch.config import IndexConfig
from linearrag_torch.index import MATRICES, NER_PARTS, TriGraphIndex

from conftest import demo_questions, small_passages, write_jsonl

RAY_CPUS = 2
EMB_TOL = 1e-6
RAY_DEADLINE_S = 300  # one Ray build or add of a few passages (measured ~60 s on 2 busy cores)
FIRST, MORE = 16, 4  # passages built, then added
QUESTIONS = [q["question"] for q in demo_questions()[:12]]


@contextmanager
def deadline(seconds: int):
    """TimeoutError in the main thread after ``seconds`` (a hung cluster fails the test, not the run)."""
    def expire(signum, frame):
        raise TimeoutError(f"the Ray call took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def threads(n: int):
    """The local reference encodes with as many torch threads as each Ray encoder actor has."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def assert_same_index(a: TriGraphIndex, b: TriGraphIndex):
    for name in ("passage_ids", "titles", "texts", "sentences", "entities"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.index_config == b.index_config
    for name in MATRICES:
        ma, mb = getattr(a, name), getattr(b, name)
        assert tuple(ma.shape) == tuple(mb.shape), name
        for part in ("crow", "col", "val"):
            assert torch.equal(getattr(ma, part), getattr(mb, part)), f"{name}.{part}"
    for part in NER_PARTS:
        ra, rb = getattr(a.ner, part), getattr(b.ner, part)
        assert torch.equal(ra.crow, rb.crow) and torch.equal(ra.col, rb.col), f"ner.{part}"
    for part in ("passages", "sentences", "entities"):
        assert torch.equal(getattr(a.keys, part), getattr(b.keys, part)), f"keys.{part}"
    for name in ("passage_emb", "sentence_emb", "entity_emb"):
        ea, eb = getattr(a, name), getattr(b, name)
        assert ea.shape == eb.shape, name
        assert float((ea - eb).abs().max()) <= EMB_TOL, name


def assert_same_hits(a: TriGraphIndex, b: TriGraphIndex, nlp, encoder):
    ha = LinearRAG(a, "cpu", nlp, encoder).search(QUESTIONS, top_k=5)
    hb = LinearRAG(b, "cpu", nlp, encoder).search(QUESTIONS, top_k=5)
    assert [[h.row for h in x] for x in ha] == [[h.row for h in x] for x in hb]
    for x, y in zip(ha, hb):
        assert [h.score for h in x] == pytest.approx([h.score for h in y], rel=1e-5, abs=1e-7)


# ------------------------------------------------------------------------------------- with a local Ray
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    if ray.is_initialized():
        ray.shutdown()
    with deadline(120):
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def passages():
    return small_passages()[:FIRST + MORE]


@pytest.fixture(scope="module")
def local_first(passages, nlp, encoder):
    with threads(RAY_CPUS):
        return LinearRAG.build(passages[:FIRST], device="cpu", progress=False, nlp=nlp, encoder=encoder)


@pytest.fixture(scope="module")
def ray_index_dir(ray_cluster, passages, tmp_path_factory):
    """`linearrag index CORPUS DIR --ray` of the first passages, one encoder actor with RAY_CPUS threads."""
    tmp = tmp_path_factory.mktemp("ray")
    corpus = write_jsonl(tmp / "first.jsonl", passages[:FIRST])
    with deadline(RAY_DEADLINE_S):
        rc = main(["index", str(corpus), str(tmp / "index"), "--ray", "--quiet", "--ray-encode-cpus", str(RAY_CPUS),
                   "--encoder-precision", "float32"])  # as the local fixture's encoder
    assert rc == 0
    return tmp / "index"


def test_ray_index_equals_the_local_build(ray_index_dir, local_first, nlp, encoder):
    built = TriGraphIndex.load(ray_index_dir)
    assert built.num_passages == FIRST
    assert_same_index(built, local_first.index)
    assert_same_hits(built, local_first.index, nlp, encoder)


def test_ray_add_equals_a_local_add(ray_index_dir, local_first, passages, nlp, encoder, tmp_path, capsys):
    folder = shutil.copytree(ray_index_dir, tmp_path / "index")
    more = write_jsonl(tmp_path / "more.jsonl", passages[FIRST:])
    with deadline(RAY_DEADLINE_S):
        rc, err = run(capsys, "add", folder, more, "--ray", "--quiet", "--ray-encode-cpus", RAY_CPUS)
    assert rc == 0, err
    assert f"added {MORE} passages" in err
    with threads(RAY_CPUS):
        local = LinearRAG(local_first.index, "cpu", nlp, encoder).add(passages[FIRST:])
    grown = TriGraphIndex.load(folder)
    assert grown.passage_ids == [p["id"] for p in passages]
    assert_same_index(grown, local.index)
    assert_same_hits(grown, local.index, nlp, encoder)


def test_an_unreachable_address_is_named(ray_cluster, passages, tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    corpus = write_jsonl(tmp_path / "c.jsonl", passages[:2])
    with deadline(60):
        rc, err = run(capsys, "index", corpus, tmp_path / "index", "--ray", f"127.0.0.1:{port}", "--quiet")
    assert rc == 2
    assert f"cannot reach the Ray cluster at '127.0.0.1:{port}'" in err
    assert not (tmp_path / "index").exists()


def test_a_failing_actor_is_a_clear_error(ray_cluster, passages):
    cfg = IndexConfig(spacy_model="no_such_spacy_model")
    with deadline(RAY_DEADLINE_S), pytest.raises(ray_build.RayBuildError, match="NerActor pool failed.*no_such_spacy_model"):
        ray_build.build_index_on_ray(passages[:2], index_config=cfg, progress=False)


# ------------------------------------------------------------------------------------- without a cluster
def test_without_ray_the_message_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ray_build.RayBuildError, match=r'pip install -e "\.\[ray\]"'):
        ray_build.import_ray()
    corpus = write_jsonl(tmp_path / "c.jsonl", small_passages()[:2])
    rc, err = run(capsys, "index", corpus, tmp_path / "index", "--ray", "--quiet")
    assert rc == 2 and 'pip install -e ".[ray]"' in err


def test_actor_plan(monkeypatch):
    monkeypatch.setattr(ray_build.os, "cpu_count", lambda: 8)
    opts = ray_build.RayOptions
    # two 8-CPU nodes, no GPU: a spaCy actor per CPU, CPU encoders with this machine's 8 threads
    p = ray_build.plan_actors(opts(), cpus=16, gpus=0, largest_node_cpus=8)
    assert (p.ner_actors, p.encode_actors, p.encode_cpus, p.encode_gpus, p.device) == (16, 2, 8, 0, "cpu")
    # a 4-CPU node: threads capped at its CPUs
    p = ray_build.plan_actors(opts(), cpus=4, gpus=0, largest_node_cpus=4)
    assert (p.encode_actors, p.encode_cpus) == (1, 4)
    # GPUs: one encoder actor per GPU with one CPU
    p = ray_build.plan_actors(opts(), cpus=32, gpus=4, largest_node_cpus=16)
    assert (p.ner_actors, p.encode_actors, p.encode_cpus, p.encode_gpus, p.device) == (32, 4, 1, 1, "cuda")
    p = ray_build.plan_actors(opts(encode_gpus=0, encode_cpus=2, ner_actors=3), cpus=32, gpus=4, largest_node_cpus=16)
    assert (p.ner_actors, p.encode_actors, p.encode_cpus, p.device) == (3, 16, 2, "cpu")
    with pytest.raises(ray_build.RayBuildError, match="1 GPUs, the Ray cluster has 0"):
        ray_build.plan_actors(opts(encode_gpus=1), cpus=8, gpus=0, largest_node_cpus=8)
    with pytest.raises(ray_build.RayBuildError, match="4 CPUs, the largest node of the Ray cluster has 2"):
        ray_build.plan_actors(opts(encode_cpus=4), cpus=8, gpus=0, largest_node_cpus=2)


def test_bad_actor_counts_are_errors(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", small_passages()[:2])
    rc, err = run(capsys, "index", corpus, tmp_path / "index", "--ray", "--ray-ner-actors", "0")
    assert rc == 2 and "--ray-ner-actors must be at least 1" in err


def test_forward_passes_are_the_local_encoders(encoder):
    """The passes RayEncoder ships, encoded one by one and put back in place, give exactly the vectors
    of the local Encoder.encode (duplicates and equal token ids included)."""
    passages = small_passages()
    texts = [p["text"] for p in passages[:40]] + [p["title"] for p in passages[:60]]
    texts += [texts[3], texts[50].upper(), texts[41]]  # repeats; the model is uncased: equal token ids
    rayenc = ray_build.RayEncoder(None, IndexConfig(), plan=None, local=encoder)
    passes, where = rayenc.forward_passes(texts)
    # 100 distinct token sequences, longest first, in passes of at most batch_size rows and the token budget
    assert sum(len(p) for p in passes) == 100 and len(passes) > 1
    lengths = [len(row) for p in passes for row in p]
    assert lengths == sorted(lengths, reverse=True)
    assert all(len(p) <= encoder.batch_size and (len(p) == 1 or len(p) * len(p[0]) <= encoding.ENCODE_TOKEN_BUDGET)
               for p in passes)
    with torch.inference_mode():
        pieces = [encoder.encode_pass(p) for p in passes]
    assert torch.equal(ray_build.assemble(pieces, where), encoder.encode(texts))
    assert torch.equal(where[-3], where[3]) and torch.equal(where[-2], where[50])


# ------------------------------------------------------------------------------------- what the terminal shows
NOISE = ("WARNING", "Traceback", "core_worker", " E ", "(raylet", "Token authentication")


def terminal_lines(stderr: str) -> list[str]:
    """stderr's lines without the progress bars (tqdm redraws with carriage returns)."""
    lines = [part.strip() for line in stderr.splitlines() for part in line.split("\r")]
    return [line for line in lines if line and "%|" not in line]


def test_index_ray_prints_a_line_for_the_cluster_and_no_ray_noise(tmp_path):
    """`linearrag index --ray local` as a user runs it: Ray's start-up says which cluster in one line; no notice
    of token authentication, no core_worker "E" line about actor restarts, no warnings (issue 37)."""
    import subprocess

    pytest.importorskip("ray.data")
    corpus = write_jsonl(tmp_path / "c.jsonl", small_passages()[:6])
    proc = subprocess.run([sys.executable, "-m", "linearrag_torch.cli", "index", str(corpus), str(tmp_path / "i"),
                           "--ray", "local", "--ray-encode-cpus", "1"],
                          capture_output=True, text=True, timeout=RAY_DEADLINE_S)
    lines = terminal_lines(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert lines[0].startswith("Ray: a new local Ray cluster, 1 node, ") and "CPUs" in lines[0], lines
    assert not [line for line in lines if any(n in line for n in NOISE)], lines
    assert TriGraphIndex.load(tmp_path / "i").num_passages == 6
