"""The sharded engine (linearrag_torch/distributed/) against the single-process engine: 2 and 3 gloo
processes on 127.0.0.1 give the same top-k and scores within 1e-5, on a synthetic index with sentences
shared by passages on different ranks and sentences of no passage, and on the small real index (default
settings with the chain round, the reference code's settings, paper mode, the ablations, the learned rerank
with and without the reranker in the chain rounds, plain and chain-aware), and the same explanations.
test_sharded_in_process.py checks the same in one process (ranks as threads), fast."""
import dataclasses
import json

import pytest
import torch

from conftest import assert_close, without_paths
from linearrag_torch.retrieval import engine
from linearrag_torch.config import RetrievalConfig
from linearrag_torch.distributed import Comm, Shard, ShardedEngine, passage_bounds, retrieve_job, run_local
from linearrag_torch.index.csr import Csr
from linearrag_torch.synthetic import random_index, random_queries

TIMEOUT_S = 300  # per group of processes; a run takes ~15 s on two loaded cores

SYNTHETIC_CONFIGS = {
    "default (chain round)": RetrievalConfig(),
    "two chain rounds": RetrievalConfig(chain_rounds=2, chain_passages=3),
    "pairs linked by entities": RetrievalConfig(pair_link_weight=1.0, pair_link_max_passages=4),
    "reference code": RetrievalConfig.reference_code(),
    "musique settings": RetrievalConfig.reference_code(max_iterations=5, delta=0.1, lam=2.0, top_k_sentence=4),
    "paper mode": RetrievalConfig(mode="paper"),
    "no activation": RetrievalConfig(use_activation=False),
    "no pagerank": RetrievalConfig(use_ppr=False),
}
REAL_CONFIGS = {
    "default (chain round)": RetrievalConfig(),
    "reference code": RetrievalConfig.reference_code(),
    "paper mode": RetrievalConfig(mode="paper", chain_passages=0),
}


def synthetic_index():
    """A random index whose PS puts some sentences in two passages far apart (so on different ranks)
    and leaves a few sentences in no passage."""
    idx = random_index(passages=48, entities=70, dim=16, seed=5)
    S = idx.num_sentences
    rows, cols = idx.PS.row_index(), idx.PS.col
    drop = torch.isin(cols, torch.tensor([3, 40, S - 1]))  # sentences of no passage
    gen = torch.Generator().manual_seed(7)
    extra_s = torch.randint(0, S, (12,), generator=gen)
    extra_p = (rows[torch.searchsorted(cols, extra_s).clamp(max=cols.numel() - 1)] + 24) % idx.num_passages
    PS = Csr.from_coo(torch.cat([rows[~drop], extra_p]), torch.cat([cols[~drop], extra_s]),
                      torch.ones(int((~drop).sum()) + 12), idx.PS.shape)
    return dataclasses.replace(idx, PS=PS.with_values(torch.ones(PS.nnz)))


def _strip(queries):
    """The queries without their link to an index object (it would be pickled to every rank)."""
    return dataclasses.replace(queries, rows_of=None)


def rerank_configs(reranker) -> dict:
    """The learned rerank by ``reranker`` (a folder), with the reranker in the chain rounds and without."""
    cfg = RetrievalConfig(rerank=True, reranker=str(reranker), rerank_candidates=6)
    return {"reranker in the loop": cfg.replace(rerank_loop_candidates=6),
            "final rerank": cfg.replace(rerank_loop_candidates=0)}


@pytest.fixture(scope="module")
def cases(small_rag, small_questions, tiny_reranker_dir, tiny_chain_reranker_dir):
    syn = synthetic_index()
    syn_q = random_queries(syn, batch=8, seed=2)
    qs = [q["question"] for q in small_questions]
    real_q = small_rag.encode_queries(qs)
    assert real_q.entity_rows is not None and bool((real_q.entity_rows >= 0).any())  # the stored-vector path
    out = {
        "synthetic": (syn, syn_q, SYNTHETIC_CONFIGS),
        "real": (small_rag.index, real_q, REAL_CONFIGS),
    }
    for name, folder in (("rerank", tiny_reranker_dir), ("chain-aware rerank", tiny_chain_reranker_dir)):
        cfgs = rerank_configs(folder)  # the questions carry this reranker's tokens
        out[name] = (small_rag.index, small_rag.encode_queries(qs, next(iter(cfgs.values()))), cfgs)
    return out


def _job(comm, cases, explain):
    torch.set_num_threads(1)
    out = {name: retrieve_job(comm, idx, q, list(cfgs.values())) for name, (idx, q, cfgs) in cases.items()}
    index, questions, queries, cfg = explain
    out["explain"] = ShardedEngine(Shard.build(index, comm.rank, comm.world), comm,
                                   index.entities if comm.rank == 0 else None).explain(questions, queries, cfg)
    return out


@pytest.fixture(scope="module")
def explain_case(small_rag, small_questions, tiny_chain_reranker_dir):
    """(index, questions, their encoding, settings) of the explain check: every field of an explanation in use."""
    qs = [q["question"] for q in small_questions]
    cfg = small_rag.config.replace(top_k=5, rerank=True, reranker=str(tiny_chain_reranker_dir), rerank_loop_candidates=6)
    return small_rag.index, qs, small_rag.encode_queries(qs, cfg), cfg


@pytest.fixture(scope="module", params=[2, 3], ids=["2 processes", "3 processes"])
def sharded_results(request, cases, explain_case):
    shipped = {name: (idx, _strip(q), cfgs) for name, (idx, q, cfgs) in cases.items()}
    index, qs, enc, cfg = explain_case
    return request.param, run_local(request.param, _job, (shipped, (index, qs, _strip(enc), cfg)), timeout_s=TIMEOUT_S)


_GRAPHS = {}


def _single(index, queries, cfg):
    if id(index) not in _GRAPHS:
        _GRAPHS[id(index)] = (index, engine.DeviceGraph(index))  # (the index kept alive: ids stay unique)
    return engine.retrieve(_GRAPHS[id(index)][1], queries, cfg)


@pytest.mark.parametrize("case", ["synthetic", "real", "rerank", "chain-aware rerank"])
def test_sharded_equals_single_process(sharded_results, cases, case):
    world, per_rank = sharded_results
    idx, q, cfgs = cases[case]
    for i, (name, cfg) in enumerate(cfgs.items()):
        want = _single(idx, q, cfg)
        for rank in range(world):
            got = per_rank[rank][case][i]
            assert torch.equal(got.indices, want.indices), f"{case}, {name}, rank {rank}/{world}: top-k differs"
            diff = (got.scores - want.scores).abs().max().item()
            assert diff <= 1e-5, f"{case}, {name}, rank {rank}/{world}: max score difference {diff}"


def test_sharded_explain_equals_single_process(sharded_results, explain_case, small_rag):
    world, per_rank = sharded_results
    _, qs, _, cfg = explain_case
    want = small_rag.explain(qs, top_k=5, rerank=True, reranker=cfg.reranker, rerank_loop_candidates=6)
    assert_close(per_rank[0]["explain"], without_paths(want), f"explain on {world} ranks")
    assert all(per_rank[r]["explain"] is None for r in range(1, world))


def test_synthetic_case_exercises_the_graph(cases):
    """The synthetic questions reach PageRank and a second activation hop (else the test proves little)."""
    idx, q, _ = cases["synthetic"]
    from linearrag_torch.retrieval.engine import activate_pairs

    _, _, act = activate_pairs(engine.DeviceGraph(idx), q, RetrievalConfig())
    assert int(act.tier.max()) >= 2 and act.col.unique().numel() >= q.batch_size // 2


def test_one_process_without_torch_distributed():
    idx = synthetic_index()
    q = random_queries(idx, batch=5, seed=3)
    eng = ShardedEngine(Shard.build(idx, 0, 1), Comm(dist=False))
    for cfg in (RetrievalConfig(), RetrievalConfig(mode="paper"), RetrievalConfig.reference_code()):
        got, want = eng.retrieve(q, cfg), _single(idx, q, cfg)
        assert torch.equal(got.indices, want.indices)
        assert (got.scores - want.scores).abs().max().item() <= 1e-5


def test_auto_mode_is_the_exact_walk_in_the_sharded_engine():
    """ppr_mode auto at any size: the sharded engine has only the exact walk, so auto past ppr_local_from is
    that walk there (one process would take the local one), not a refusal."""
    idx = synthetic_index()
    q = random_queries(idx, batch=5, seed=3)
    eng = ShardedEngine(Shard.build(idx, 0, 1), Comm(dist=False))
    got = eng.retrieve(q, RetrievalConfig(ppr_local_from=0))
    want = _single(idx, q, RetrievalConfig(ppr_mode="exact"))
    assert torch.equal(got.indices, want.indices)
    assert (got.scores - want.scores).abs().max().item() <= 1e-5


def test_shards_partition_the_index():
    """Every passage on one rank; every sentence and every entity owned by exactly one rank that holds it;
    the walk's private rows are disjoint and, with the shared list, cover every entity."""
    idx = synthetic_index()
    world = 3
    shards = [Shard.build(idx, r, world) for r in range(world)]
    assert [(s.lo, s.hi) for s in shards] == list(zip(passage_bounds(48, world), passage_bounds(48, world)[1:]))
    sent_owned = torch.zeros(idx.num_sentences, dtype=torch.int64)
    ent_owned = torch.zeros(idx.num_entities, dtype=torch.int64)
    walk = torch.zeros(idx.num_entities, dtype=torch.int64)
    for s in shards:
        sent_owned.index_add_(0, s.sentences[s.owned_sentence], torch.ones(int(s.owned_sentence.sum()), dtype=torch.int64))
        assert bool(torch.isin(s.owned_entities, s.entities).all())
        assert torch.equal(s.entity_emb, idx.entity_emb[s.owned_entities])
        ent_owned.index_add_(0, s.owned_entities, torch.ones(s.owned_entities.numel(), dtype=torch.int64))
        walk.index_add_(0, s.entities[s.walk_private], torch.ones(s.walk_private.numel(), dtype=torch.int64))
        assert torch.equal(s.walk_shared, shards[0].walk_shared)
        # a local passage's sentences are all held here
        held = set(s.sentences.tolist())
        for p in range(s.lo, s.hi):
            assert set(idx.PS.col[idx.PS.crow[p]:idx.PS.crow[p + 1]].tolist()) <= held
    assert torch.equal(sent_owned, torch.ones_like(sent_owned))
    assert torch.equal(ent_owned, torch.ones_like(ent_owned))
    walk[shards[0].walk_shared] += 1
    assert torch.equal(walk, torch.ones_like(walk))
    assert shards[0].walk_shared.numel() > 0  # entities spanning ranks: the all-reduce has work


def test_clear_errors():
    idx = random_index(passages=4, entities=10, dim=8, seed=0)
    with pytest.raises(ValueError, match="at least 5 passages"):
        Shard.build(idx, 0, 5)
    eng = ShardedEngine(Shard.build(idx, 0, 1), Comm(dist=False))
    with pytest.raises(ValueError, match="adjacent_passages"):
        eng.retrieve(random_queries(idx, batch=2), RetrievalConfig(adjacent_passages=True))
    with pytest.raises(ValueError, match="ppr_mode='exact'"):
        eng.retrieve(random_queries(idx, batch=2), RetrievalConfig(ppr_mode="local"))
    with pytest.raises(ValueError, match="reset_passages=0"):
        eng.retrieve(random_queries(idx, batch=2), RetrievalConfig(reset_passages=10))
    with pytest.raises(ValueError, match="ann='exact'"):
        eng.retrieve(random_queries(idx, batch=2), RetrievalConfig(ann="ivf"))


def _fail(comm):
    if comm.rank == 1:
        raise KeyError("boom")
    return comm.rank


def test_a_failing_rank_is_reported():
    with pytest.raises(RuntimeError, match="rank 1 failed: KeyError"):
        run_local(2, _fail, timeout_s=TIMEOUT_S)


def test_cli_shards_prints_what_one_process_prints(small_index_dir, small_questions, capsys):
    from linearrag_torch.cli import main

    qs = [q["question"] for q in small_questions[:3]]
    assert main(["query", str(small_index_dir), *qs, "--threads", "1"]) == 0
    one = capsys.readouterr().out
    assert main(["query", str(small_index_dir), *qs, "--shards", "2"]) == 0
    two = capsys.readouterr().out
    hits = [line for line in one.splitlines() if not line.lstrip().startswith("(order:")]  # cli/common.py order_note
    assert len(hits) == 3 * 6 and two == one


def test_cli_shards_rerank_prints_what_one_process_prints(small_index_dir, small_questions, capsys):
    """`--rerank` with the shipped (chain-aware) reranker, in the chain rounds and on the final list."""
    from linearrag_torch.cli import main

    qs = [q["question"] for q in small_questions]
    assert main(["query", str(small_index_dir), *qs, "--threads", "1"]) == 0
    plain = capsys.readouterr().out
    assert main(["query", str(small_index_dir), *qs, "--rerank", "--threads", "1"]) == 0
    one = capsys.readouterr().out
    assert main(["query", str(small_index_dir), *qs, "--rerank", "--shards", "2"]) == 0
    two = capsys.readouterr().out
    assert len(one.splitlines()) == len(qs) * 6 and two == one
    assert one != plain  # the reranker reordered something


def test_cli_shards_explain_prints_what_one_process_prints(small_index_dir, small_questions, tiny_chain_reranker_dir,
                                                           capsys):
    from linearrag_torch.cli import main

    qs = [q["question"] for q in small_questions]
    args = ["query", str(small_index_dir), *qs, "--explain", "--rerank", "--reranker", str(tiny_chain_reranker_dir)]
    assert main([*args, "--threads", "1"]) == 0
    one = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main([*args, "--shards", "2"]) == 0
    two = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["id"] for e in one] == list(range(len(qs))) and all(len(e["hits"]) == 5 and e["rerank"] for e in one)
    assert_close(two, without_paths(one), "explain")


def test_cli_shards_errors(small_index_dir, tmp_path, capsys):
    from linearrag_torch.cli import main

    assert main(["query", str(small_index_dir), "Who?", "--shards", "2", "--backend", "scipy"]) == 2
    assert "--shards runs the torch engine" in capsys.readouterr().err
    assert main(["query", str(tmp_path), "Who?", "--shards", "2"]) == 2
    assert "error" in capsys.readouterr().err


def test_question_side_without_the_index_tensors(small_rag, small_questions, nlp, encoder):
    """Rank 0's question path (QuestionIndex: strings and token hashes only, zero placeholders for stored
    vectors) gives the answers of LinearRAG's own question path once the owners fill in the vectors."""
    from linearrag_torch.distributed import QuestionIndex, encode_questions

    qs = [q["question"] for q in small_questions]
    cfg = small_rag.config
    enc = encode_questions(QuestionIndex(small_rag.index), qs, cfg, nlp=nlp, encoder=encoder)
    assert enc.entity_rows is not None and bool((enc.entity_rows >= 0).any())
    assert float(enc.entity_emb[enc.entity_rows >= 0].abs().sum()) == 0.0  # placeholders: no index tensors read
    got = ShardedEngine(Shard.build(small_rag.index, 0, 1), Comm(dist=False)).retrieve(enc, cfg)
    want = _single(small_rag.index, small_rag.encode_queries(qs), cfg)
    assert torch.equal(got.indices, want.indices)
    assert (got.scores - want.scores).abs().max().item() <= 1e-5
