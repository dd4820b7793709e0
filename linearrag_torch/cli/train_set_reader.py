"""`linearrag train-set-reader --train TRAIN.jsonl --out OUT`: mine the engine's candidate sets of the training
questions and train the set reader over them (rerank/set_train.py; no torch import here)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from .flags import device_arg


def add_parser(sub) -> None:
    """`linearrag train-set-reader` on the CLI's subparsers."""
    p = sub.add_parser(
        "train-set-reader", help="train the set reader that reads a question's reranked candidates together",
        description="Train the set reader of `--rerank --rerank-set-reader` (docs/reranker.md, 'The set reader'): the "
                    "training questions (the format of `linearrag train-reranker`) run through the engine with "
                    "--rerank over an index of their paragraphs, each question's first 10 candidates are read by the "
                    "reranker and cached (OUT/sets: safetensors and JSON), a small attention head is trained over them "
                    "on the reranker's training split and fitted on its held-out questions. Writes OUT/model: a copy of "
                    "the reranker folder with the set reader in it (load it with --reranker OUT/model).")
    p.add_argument("--train", required=True, metavar="TRAIN.jsonl", help="training questions with their paragraphs")
    p.add_argument("--out", required=True, metavar="OUT", help="output folder")
    p.add_argument("--reranker", metavar="DIR", default=None,
                   help="the reranker folder whose vectors the set reader reads (default: the packaged one)")
    p.add_argument("--mine-index", metavar="DIR", nargs="+", default=None,
                   help="the mining index folder(s) (ids: the paragraphs' keys), each loaded when it holds an index, "
                        "else built there; each question is mined in the first that holds all its paragraphs "
                        "(default OUT/mining_index: every paragraph; with --mine-split OUT/mining_index and "
                        "OUT/mining_index_rest)")
    p.add_argument("--mine-split", action="store_true",
                   help="two mining indexes instead of one: the paragraphs of `linearrag train-reranker`'s mining "
                        "questions (--mine-share 0.4: the held-out ones and 40%% of the rest), and the other "
                        "questions' (each about half the index time of one of every paragraph)")
    p.add_argument("--mining-questions-only", action="store_true",
                   help="mine and train on `linearrag train-reranker`'s mining questions only (--mine-share 0.4: the "
                        "held-out ones and 40%% of the rest) over one index of their paragraphs (the shipped "
                        "reranker's mining index; less than half the index time of all)")
    p.add_argument("--epochs", type=int, default=40, help="passes over the trained questions' sets (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (the reranker's) and the training (default 0)")
    p.add_argument("--layers", type=int, default=1, help="attention layers across the candidates (default 1)")
    p.add_argument("--dim", type=int, default=64, help="width of the head (default 64)")
    p.add_argument("--reach-share", type=float, default=0.4,
                   help="the largest share of held-out questions read at 10 candidates (default 0.4)")
    p.add_argument("--precision", default="auto", help="the reranker's precision while mining (default auto)")
    device_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def mine_sets(rag, questions, cfg, batch: int = 64, progress: bool = True) -> dict:
    """The candidate sets of ``questions`` (rerank.train.TrainingQuestion) as ``rag`` (an index of the training
    paragraphs, ids = rerank.train.passage_key) ranks them with ``cfg`` (rerank on; ``cfg.rerank_reach``
    candidates read). Returns a dict of tensors (see the module docstring): ``rows`` [N, K] (-1: none), ``gold``
    [N, K] bool, ``n_gold`` [N], ``graph_scores``, ``logits`` [N, K], ``vectors`` [N, K, H] float16, ``from_loop``
    [N, K] bool, ``query_emb`` [N, D]."""
    import torch
    from tqdm.auto import tqdm

    from ..rerank.train import passage_key
    from ..retrieval import engine, stages

    K = max(cfg.rerank_reach, cfg.rerank_candidates)
    cfg = cfg.replace(rerank=True, rerank_set_reader=True, rerank_candidates=K)
    graph = rag.graph
    keys = [passage_key(rag.index.titles[r], rag.index.texts[r]) for r in range(rag.index.num_passages)]
    got = []

    def capture(be, b):  # the final rerank, reading all K candidates, its vectors kept
        _, rr = be.learned_rerank(b.queries, b.ranking, b.cfg, K, b.scored, vectors=True)
        got.append(rr)
        b.ranking = b.ranking

    plan = [stages.Stage("rerank", capture, "rerank") if st.name == "rerank" else st for st in stages.plan(cfg)]
    parts = {k: [] for k in ("rows", "gold", "n_gold", "graph_scores", "logits", "vectors", "from_loop", "query_emb")}
    bar = tqdm(total=len(questions), desc="mining sets", unit="question", disable=not progress)
    for s in range(0, len(questions), batch):
        part = questions[s:s + batch]
        enc = rag.encode_queries([q.question for q in part], cfg).to(graph.device)
        got.clear()
        with torch.inference_mode(), graph.keeping_last(engine.chain_enabled(cfg)
                                                          and len(part) <= graph.questions_per_chunk(None, cfg)):
            stages.run(engine.TorchBackend(graph), enc, cfg, stages=plan)
        rr = got[0]
        order = rr.graph_ranks.argsort(1)  # back to the graph's order
        g = lambda x: x.gather(1, order if x.dim() == 2 else order.unsqueeze(2).expand_as(x))  # noqa: E731
        rows = g(rr.indices).cpu()
        gold = torch.tensor([[r >= 0 and keys[r] in set(q.positives) for r in row.tolist()]
                             for q, row in zip(part, rows)])
        parts["rows"].append(rows)
        parts["gold"].append(gold)
        parts["n_gold"].append(torch.tensor([len(q.positives) for q in part]))
        parts["graph_scores"].append(g(rr.graph_scores).cpu())
        parts["logits"].append(g(rr.logits).cpu())
        parts["vectors"].append(g(rr.vectors).cpu().to(torch.float16))
        parts["from_loop"].append(torch.zeros_like(gold) if rr.known is None else g(rr.known).cpu())
        parts["query_emb"].append(enc.query_emb.cpu().float())
        bar.update(len(part))
    bar.close()
    return {k: torch.cat(v) for k, v in parts.items()}


def run(args) -> int:
    import shutil
    import time

    import torch

    from ..api import LinearRAG  # deferred: imports torch
    from ..config import RetrievalConfig, TrainConfig
    from ..env import resolve_device
    from ..models.reranker import packaged_reranker_folder, load_model
    from ..rerank.set_reader import save_set_reader
    from ..rerank.set_train import card, load_sets, save_sets, train_set_reader
    from ..rerank.train import mining_corpus, mining_questions, passage_key, read_training_file, split_heldout

    out = Path(args.out)
    device = resolve_device(args.device)
    questions, passages = read_training_file(args.train)
    folder = Path(args.reranker) if args.reranker else packaged_reranker_folder()
    _, _, settings = load_model(folder)
    sets_dir = out / "sets"
    if (sets_dir / "sets.safetensors").is_file():
        sets, mining = load_sets(sets_dir)
        print(f"mined sets loaded from {sets_dir}", file=sys.stderr)
    else:
        if args.mine_split:
            pool = mining_questions(len(questions), TrainConfig(mine_share=0.4))
            groups = [pool, [i for i in range(len(questions)) if i not in set(pool)]]
            dirs = [Path(d) for d in args.mine_index] if args.mine_index else \
                [out / "mining_index", out / "mining_index_rest"]
        else:
            groups = [mining_questions(len(questions), TrainConfig(mine_share=0.4)) if args.mining_questions_only
                      else list(range(len(questions)))]
            dirs = [Path(d) for d in args.mine_index] if args.mine_index else [out / "mining_index"]
        if len(dirs) < len(groups):
            raise SystemExit(f"linearrag train-set-reader: error: --mine-split needs two --mine-index folders, got {len(dirs)}")
        cfg = RetrievalConfig(rerank=True, reranker=str(args.reranker or ""), reranker_precision=args.precision)
        sizes = []
        t0, todo, parts, order = time.time(), {j for g in groups for j in g}, [], []
        for i, index_dir in enumerate(dirs):
            if index_dir.is_dir() and any(index_dir.iterdir()):
                rag = LinearRAG.load(index_dir, device=device)
            else:
                group = groups[i] if i < len(groups) else []
                keys = list(dict.fromkeys(k for j in group for k in questions[j].positives + questions[j].negatives))
                rag = LinearRAG.build(mining_corpus({k: passages[k] for k in keys}), device=device,
                                      progress=not args.quiet)
                rag.save(index_dir)
            try:
                held = {passage_key(t, x) for t, x in zip(rag.index.titles, rag.index.texts)}
                sizes.append(rag.index.num_passages)
                mine_here = [j for j in sorted(todo) if all(k in held for k in questions[j].positives
                                                            + questions[j].negatives)]
                print(f"{index_dir}: {rag.index.num_passages} paragraphs, mining {len(mine_here)} questions",
                      file=sys.stderr)
                if mine_here:
                    parts.append(mine_sets(rag, [questions[j] for j in mine_here], cfg, progress=not args.quiet))
                    order += mine_here
                    todo -= set(mine_here)
                resolved = rag.graph.reranker(cfg.reranker, cfg.reranker_precision).precision
            finally:
                rag.close()
        if todo:
            raise SystemExit(f"linearrag train-set-reader: error: {len(todo)} questions have paragraphs in none of the "
                             f"mining indexes {[str(d) for d in dirs]}")
        back = torch.tensor(order).argsort()  # the file's order
        sets = {k: torch.cat([p[k] for p in parts]).index_select(0, back) for k in parts[0]}
        sets["question"] = torch.tensor(sorted(order))  # each set's question: its line in the file
        mining = {"questions": len(questions), "paragraphs": sum(sizes), "mined_questions": len(order),
                  "seconds": round(time.time() - t0, 1),
                  "indexes": [str(d) for d in dirs],
                  "precision": resolved, "device": str(device), "torch": torch.__version__,
                  "torch_threads": torch.get_num_threads(), "reranker": str(folder),
                  "command": "linearrag train-set-reader " + " ".join(shlex.quote(a) for a in sys.argv[2:])}
        save_sets(sets, sets_dir, mining)
    tc = TrainConfig(seed=args.seed)
    train_ix, held_ix = split_heldout(len(questions), tc.heldout, tc.seed)
    at = {int(q): i for i, q in enumerate(sets["question"].tolist())}  # a question's position in the sets
    missing = [j for j in held_ix if j not in at]
    if missing:
        raise SystemExit(f"linearrag train-set-reader: error: {len(missing)} held-out questions were not mined")
    train_ix, held_ix = [at[j] for j in train_ix if j in at], [at[j] for j in held_ix]
    reader, facts = train_set_reader(sets, train_ix, held_ix, settings, dim=args.dim, layers=args.layers,
                                     epochs=args.epochs, seed=args.seed, reach_share=args.reach_share,
                                     log=lambda m: print(m, file=sys.stderr))
    model = out / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(folder, model)
    command = "linearrag train-set-reader " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    save_set_reader(reader, model, card(facts, mining, command))
    print(json.dumps({"model": str(model), "heldout": facts["heldout"], "alpha": facts["alpha"],
                      "reach_threshold": facts["reach_threshold"]}, indent=2))
    return 0
