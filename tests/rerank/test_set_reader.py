"""The set reader (rerank/set_reader.py, set_train.py): its attention against a per-question reference, its
features by hand, its folder, and the engine's path with it (reading 5 or 10 candidates per question)."""
import json
import math
import shutil

import pytest
import torch

from linearrag_torch.config import RetrievalConfig
from linearrag_torch.rerank import Reranker
from linearrag_torch.rerank.set_reader import (FEATURES, SetReader, SetReaderLoadError, candidate_features,
                                               load_set_reader, save_set_reader)
from linearrag_torch.rerank.set_train import read_mask, recall, train_set_reader
from linearrag_torch.retrieval import engine, stages


def _reader(hidden=32, seed=0, alpha=1.0, threshold=0.5):
    torch.manual_seed(seed)
    r = SetReader(hidden, dim=16, heads=2, layers=2, query_dim=hidden)
    for p in r.parameters():  # the read-out starts at zero: make it say something
        torch.nn.init.normal_(p, std=0.3)
    r.alpha, r.reach_threshold = alpha, threshold
    return r.eval()


def _reference_delta(r: SetReader, v, f, n):
    """The head on one question's first n candidates alone, written out with plain tensor ops (no padding)."""
    x = torch.nn.functional.layer_norm(v[:n] @ r.proj.weight.T + r.proj.bias + f[:n] @ r.feat.weight.T + r.feat.bias,
                                       (r.norm.normalized_shape[0],), r.norm.weight, r.norm.bias)
    for layer in r.layers:
        D, h = x.shape[1], layer.heads
        y = torch.nn.functional.layer_norm(x, (D,), layer.norm1.weight, layer.norm1.bias)
        q, k, vv = (y @ layer.qkv.weight.T + layer.qkv.bias).split(D, 1)
        outs = []
        for j in range(h):
            s = slice(j * D // h, (j + 1) * D // h)
            a = torch.softmax(q[:, s] @ k[:, s].T / math.sqrt(D // h), 1)
            outs.append(a @ vv[:, s])
        x = x + torch.cat(outs, 1) @ layer.out.weight.T + layer.out.bias
        x = x + layer.ff(torch.nn.functional.layer_norm(x, (D,), layer.norm2.weight, layer.norm2.bias))
    ro = r.read_out
    return ro[1](ro[0](x)).squeeze(-1)


def test_the_head_reads_each_question_alone_whatever_its_padding():
    """Each question's correction equals the head run on its read candidates alone (plain ops, no mask): the
    candidates not read and the other questions of the batch change nothing."""
    r = _reader()
    B, K = 4, 10
    g = torch.Generator().manual_seed(1)
    v, f = torch.randn(B, K, 32, generator=g), torch.randn(B, K, len(FEATURES), generator=g)
    n = torch.tensor([5, 10, 3, 7])
    valid = torch.arange(K).unsqueeze(0) < n.unsqueeze(1)
    with torch.no_grad():
        got = r.delta(v, f, valid)
        for b in range(B):
            want = _reference_delta(r, v[b], f[b], int(n[b]))
            assert got[b, :n[b]].tolist() == pytest.approx(want.tolist(), abs=1e-5)
            assert got[b, n[b]:].abs().sum() == 0
            assert r.delta(v[b:b + 1], f[b:b + 1], valid[b:b + 1])[0].tolist() == pytest.approx(got[b].tolist(),
                                                                                                 abs=1e-5)


def test_candidate_features_by_hand():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    fused = torch.tensor([[0.4, 1.4, 1.4, float("-inf")]])  # the fourth not read; a tie at the top
    scores = torch.tensor([[2.0, 1.0, 0.5, 0.25]])
    loop = torch.tensor([[True, False, True, False]])
    valid = torch.tensor([[True, True, True, False]])
    f = candidate_features(logits, fused, scores, loop, valid)[0]
    col = {name: f[:, i].tolist() for i, name in enumerate(FEATURES)}
    assert col["logit"] == [1.0, 3.0, 2.0, 0.0]
    assert col["fused"] == pytest.approx([0.4, 1.4, 1.4, 0.0])
    assert col["fused_gap"] == pytest.approx([-1.0, 0.0, 0.0, 0.0])
    # pointwise ranks 2, 0, 1 (the tie goes to the earlier graph rank)
    assert col["pointwise_rank"] == pytest.approx([math.log(3), 0.0, math.log(2), 0.0])
    assert col["graph_rank"] == pytest.approx([0.0, math.log(2), math.log(3), 0.0])
    assert col["graph_score"] == pytest.approx([0.0, math.log(0.5), math.log(0.25), 0.0])
    assert col["from_loop"] == [1.0, 0.0, 1.0, 0.0]
    assert col["read"] == pytest.approx([0.3, 0.3, 0.3, 0.0])


def test_alpha_zero_is_the_pointwise_score():
    r = _reader(alpha=0.0)
    g = torch.Generator().manual_seed(2)
    v, logits = torch.randn(3, 5, 32, generator=g), torch.randn(3, 5, generator=g)
    fused, scores = torch.randn(3, 5, generator=g), torch.rand(3, 5, generator=g) + 0.1
    valid = torch.ones(3, 5, dtype=torch.bool)
    assert torch.equal(r.score(v, logits, fused, scores, None, valid), fused)


def test_the_folder_round_trips_and_a_damaged_one_names_its_file(tmp_path):
    r = _reader(alpha=0.75, threshold=0.3)
    r.facts = {"seed": 0}
    save_set_reader(r, tmp_path, card="# card\n")
    got = load_set_reader(tmp_path)
    assert got.alpha == 0.75 and got.reach_threshold == pytest.approx(0.3) and got.facts == {"seed": 0}
    for (k, a), (_, b) in zip(r.state_dict().items(), got.state_dict().items()):
        assert torch.equal(a, b), k
    assert (tmp_path / "SET_READER.md").read_text() == "# card\n"
    (tmp_path / "plain").mkdir()
    assert load_set_reader(tmp_path / "plain") is None  # a reranker folder without a set reader
    (tmp_path / "set_reader.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SetReaderLoadError, match="set_reader.safetensors"):
        load_set_reader(tmp_path)
    s = json.loads((tmp_path / "set_reader.json").read_text())
    s["features"] = ["logit"]
    (tmp_path / "set_reader.json").write_text(json.dumps(s))
    with pytest.raises(SetReaderLoadError, match="set_reader.json.*features"):
        load_set_reader(tmp_path)


def _synthetic_sets(n=200, K=10, H=16, seed=0):
    """Sets where the pointwise score is noise and the gold candidates carry a direction in their vectors."""
    g = torch.Generator().manual_seed(seed)
    gold = torch.zeros(n, K, dtype=torch.bool)
    for i in range(n):
        gold[i, torch.randperm(K, generator=g)[:2]] = True
    vec = torch.randn(n, K, H, generator=g)
    vec[..., 0] += 2.0 * gold
    return {"rows": torch.arange(K).expand(n, K).clone(), "gold": gold, "n_gold": torch.full((n,), 2),
            "graph_scores": torch.linspace(1.0, 0.5, K).expand(n, K).clone(),
            "logits": torch.randn(n, K, generator=g), "vectors": vec.to(torch.float16),
            "from_loop": torch.zeros(n, K, dtype=torch.bool), "query_emb": torch.randn(n, 8, generator=g)}


def test_training_finds_what_the_vectors_say_and_fits_on_the_held_out_questions():
    from linearrag_torch.rerank import RerankerSettings

    sets = _synthetic_sets()
    settings = RerankerSettings(w_model=0.3, w_rank=-0.5, w_score=0.0)
    reader, facts = train_set_reader(sets, list(range(160)), list(range(160, 200)), settings, dim=16, heads=2,
                                     epochs=15, batch=16, log=lambda m: None)
    h = facts["heldout"]
    assert h["set_5"]["R@2"] > h["pointwise_5"]["R@2"] + 20  # the pointwise score is noise here
    assert facts["alpha"] > 0 and facts["last_losses"][-1] < facts["first_losses"][0]


def test_recall_orders_the_read_candidates_and_keeps_the_rest_in_graph_order():
    sets = {"rows": torch.tensor([[0, 1, 2, 3]]), "gold": torch.tensor([[False, False, True, True]]),
            "n_gold": torch.tensor([3])}  # a third gold passage is not among the candidates
    read = read_mask(sets, torch.tensor([3]))
    got = recall(torch.tensor([[0.0, 1.0, 2.0, float("-inf")]]), sets, read, ks=(1, 2, 4))
    assert got == {"R@1": pytest.approx(100 / 3, abs=0.01), "R@2": pytest.approx(100 / 3, abs=0.01),
                   "R@4": pytest.approx(200 / 3, abs=0.01)}


# ------------------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def set_reader_dir(tiny_chain_reranker_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("set_reader") / "model"
    shutil.copytree(tiny_chain_reranker_dir, folder)
    r = _reader(hidden=32, seed=3, alpha=1.0, threshold=0.5)
    r.reach = torch.nn.Linear(384, 1)  # the small index's question embeddings
    r.shape["query_dim"] = 384
    save_set_reader(r, folder)
    return folder


def test_without_a_set_reader_the_flag_says_which_folder(small_rag, small_questions, tiny_chain_reranker_dir):
    cfg = small_rag.config.replace(rerank=True, reranker=str(tiny_chain_reranker_dir), rerank_set_reader=True)
    with pytest.raises(ValueError, match="holds no set reader"):
        small_rag.retrieve(small_rag.encode_queries([small_questions[0]["question"]], cfg), cfg)


def test_the_engine_orders_by_the_set_reader_as_computed_from_the_pairs(small_rag, small_questions, set_reader_dir):
    """The final rerank with the set reader, checked against the set reader's score computed here from the
    cross-encoder's own logits and vectors of the same pairs; the questions the classifier picks read 10
    candidates, the others 5, and the ones not read follow in the graph's order."""
    qs = [q["question"] for q in small_questions]
    cfg = small_rag.config.replace(rerank=True, reranker=str(set_reader_dir), rerank_set_reader=True, top_k=10,
                                   rerank_loop_candidates=0)
    enc = small_rag.encode_queries(qs, cfg)
    out, tr = engine.retrieve(small_rag.graph, enc, cfg, trace=True)
    reranker = small_rag.graph.reranker(str(set_reader_dir), cfg.reranker_precision)
    sr = reranker.set_reader
    assert sr is not None
    wants = sr.wants_reach(enc.query_emb)
    # the graph's list before the final rerank: the same stages without it
    plain = stages.run(engine.TorchBackend(small_rag.graph), enc, cfg,
                       stages=[s for s in stages.plan(cfg) if s.name not in ("rerank", "top-k")])
    K = 10
    idx, sc = plain.indices[:, :K], plain.scores[:, :K]
    from linearrag_torch.rerank.scoring import chain_context, fuse

    ctx = chain_context(idx)
    B = idx.shape[0]
    qpair = torch.arange(B).repeat_interleave(K)
    logits, vecs = reranker.pair_logits(enc.rerank_tokens, small_rag.graph.rerank_passages(reranker), qpair,
                                        idx.reshape(-1), ctx.reshape(-1), vectors=True)
    logits, vecs = logits.view(B, K), vecs.view(B, K, -1)
    n = torch.where(wants, 10, 5)
    valid = torch.arange(K).unsqueeze(0) < n.unsqueeze(1)
    fused = fuse(reranker.settings, logits, sc).masked_fill(~valid, float("-inf"))
    want = sr.score(vecs, logits, fused, sc, None, valid)
    for b in range(B):
        m = int(n[b])
        order = sorted(range(m), key=lambda j: (-float(want[b, j]), j))
        assert out.indices[b, :m].tolist() == [int(idx[b, j]) for j in order]
        assert out.indices[b, m:K].tolist() == idx[b, m:K].tolist()
    assert tr.rerank.logits.shape == (B, K)


def test_reach_off_and_alpha_zero_give_the_pointwise_rerank(small_rag, small_questions, set_reader_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(set_reader_dir, folder)
    r = load_set_reader(folder)
    r.alpha = 0.0
    save_set_reader(r, folder)
    qs = [q["question"] for q in small_questions]
    base = small_rag.config.replace(rerank=True, reranker=str(folder), top_k=5)
    with_set = base.replace(rerank_set_reader=True, rerank_reach=0)
    a = small_rag.retrieve(small_rag.encode_queries(qs, base), base)
    b = small_rag.retrieve(small_rag.encode_queries(qs, with_set), with_set)
    assert torch.equal(a.indices, b.indices)
    assert torch.allclose(a.scores, b.scores)


def test_the_read_mask_scores_only_the_read_pairs(small_rag, small_questions, tiny_chain_reranker_dir):
    """Reranker.rerank with ``read``: the pairs scored are the read ones only; the rest keep the graph's order
    after them and a score below the read ones'."""
    reranker = Reranker.load(tiny_chain_reranker_dir)
    p = reranker.passage_tokens(small_rag.index)
    q = reranker.question_tokens([small_questions[0]["question"], small_questions[1]["question"]])
    idx = torch.tensor([[5, 3, 8, 1, 0, 2], [7, 6, 4, 9, 2, 1]])
    sc = torch.tensor([[1.0, 0.9, 0.8, 0.7, 0.6, 0.5]] * 2)
    read = torch.tensor([[True] * 3 + [False] * 3, [True] * 6])
    seen = []
    orig = reranker.pair_logits

    def counted(*a, **k):
        seen.append(a[2].numel())
        return orig(*a, **k)

    reranker.pair_logits = counted
    rr = reranker.rerank(q, p, idx, sc, read=read)
    assert seen == [9]
    assert sorted(rr.indices[0, :3].tolist()) == [3, 5, 8] and rr.indices[0, 3:].tolist() == [1, 0, 2]
    assert rr.scores[0, 3:].max() < rr.scores[0, :3].min() and torch.isfinite(rr.scores).all()
    assert sorted(rr.indices[1].tolist()) == sorted(idx[1].tolist())


def test_cli_train_set_reader_end_to_end(small_rag, tiny_chain_reranker_dir, tmp_path, capsys, monkeypatch):
    """`linearrag train-set-reader` on a tiny file: the mining index built, the sets cached (a second run trains
    from the cache), OUT/model a reranker folder with its set reader that the engine loads."""
    from test_rerank import _training_rows

    from conftest import write_jsonl
    from linearrag_torch import models
    from linearrag_torch.cli import main
    from linearrag_torch.rerank.set_train import load_sets

    monkeypatch.setattr(models, "load_nlp", lambda cfg: small_rag.nlp)
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, *a, **k: small_rag.encoder)
    train_file = write_jsonl(tmp_path / "train.jsonl", _training_rows())
    args = ["train-set-reader", "--train", str(train_file), "--out", str(tmp_path / "out"), "--reranker",
            str(tiny_chain_reranker_dir), "--epochs", "2", "--dim", "16", "--precision", "float32", "--quiet",
            "--device", "cpu"]
    assert main(args) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    sets, info = load_sets(tmp_path / "out/sets")
    assert sets["rows"].shape == (8, 10) and sets["vectors"].shape == (8, 10, 32) and info["mined_questions"] == 8
    assert sets["gold"].sum(1).le(1).all() and sets["gold"].any()  # one gold paragraph a question
    reader = load_set_reader(tmp_path / "out/model")
    assert reader is not None and reader.alpha == report["alpha"]
    assert "seed | 0" in (tmp_path / "out/model/SET_READER.md").read_text()
    assert Reranker.load(tmp_path / "out/model").set_reader is not None
    assert main(args) == 0
    assert "mined sets loaded from" in capsys.readouterr().err


def test_the_set_reader_reads_the_host_as_often_for_any_batch(small_rag, small_questions, set_reader_dir):
    """With the set reader and its reach (the loop on), Trace.host_reads (less the PageRank's steps) is the same
    for 3 and for 6 questions: the batch stays on the device, whatever the number read at 10."""
    qs = [q["question"] for q in small_questions]
    cfg = small_rag.config.replace(rerank=True, reranker=str(set_reader_dir), rerank_set_reader=True, top_k=5,
                                   rerank_loop_candidates=5)
    reads = {}
    for B in (3, 6):
        enc = small_rag.encode_queries(qs[:B], cfg)
        engine.retrieve(small_rag.graph, enc, cfg)  # warm
        _, tr = engine.retrieve(small_rag.graph, enc, cfg, trace=True)
        reads[B] = tr.host_reads - len(tr.ppr_steps)
    assert reads[3] == reads[6], reads
