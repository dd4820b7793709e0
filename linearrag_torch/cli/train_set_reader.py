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
    p.add_argument("--mine-index", metavar="DIR", default=None,
                   help="an index of the training file's paragraphs (ids: their keys): loaded when it holds one, else "
                        "built there (default OUT/mining_index)")
    p.add_argument("--epochs", type=int, default=40, help="passes over the trained questions' sets (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (the reranker's) and the training (default 0)")
    p.add_argument("--layers", type=int, default=1, help="attention layers across the candidates (default 1)")
    p.add_argument("--dim", type=int, default=64, help="width of the head (default 64)")
    p.add_argument("--reach-share", type=float, default=0.4,
                   help="the largest share of held-out questions read at 10 candidates (default 0.4)")
    p.add_argument("--precision", default="auto", help="the reranker's precision while mining (default auto)")
    device_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args) -> int:
    import shutil
    import time

    import torch

    from ..api import LinearRAG  # deferred: imports torch
    from ..config import RetrievalConfig, TrainConfig
    from ..env import resolve_device
    from ..models.reranker import packaged_reranker_folder, load_model
    from ..rerank.set_reader import save_set_reader
    from ..rerank.set_train import card, load_sets, mine_sets, save_sets, train_set_reader
    from ..rerank.train import mining_corpus, read_training_file, split_heldout

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
        index_dir = Path(args.mine_index) if args.mine_index else out / "mining_index"
        if index_dir.is_dir() and any(index_dir.iterdir()):
            rag = LinearRAG.load(index_dir, device=device)
        else:
            rag = LinearRAG.build(mining_corpus(passages), device=device, progress=not args.quiet)
            rag.save(index_dir)
        cfg = RetrievalConfig(rerank=True, reranker=str(args.reranker or ""), reranker_precision=args.precision)
        t0 = time.time()
        try:
            sets = mine_sets(rag, questions, cfg, progress=not args.quiet)
            resolved = rag.graph.reranker(cfg.reranker, cfg.reranker_precision).precision
        finally:
            rag.close()
        mining = {"questions": len(questions), "paragraphs": len(passages), "seconds": round(time.time() - t0, 1),
                  "precision": resolved, "device": str(device), "torch": torch.__version__,
                  "torch_threads": torch.get_num_threads(), "reranker": str(folder),
                  "command": "linearrag train-set-reader " + " ".join(shlex.quote(a) for a in sys.argv[2:])}
        save_sets(sets, sets_dir, mining)
    tc = TrainConfig(seed=args.seed)
    train_ix, held_ix = split_heldout(len(questions), tc.heldout, tc.seed)
    reader, facts = train_set_reader(sets, train_ix, held_ix, settings, dim=args.dim, layers=args.layers,
                                     epochs=args.epochs, seed=args.seed, reach_share=args.reach_share,
                                     log=lambda m: print(m, file=sys.stderr))
    model = out / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(folder, model)
    save_set_reader(reader, model, card(facts, mining))
    print(json.dumps({"model": str(model), "heldout": facts["heldout"], "alpha": facts["alpha"],
                      "reach_threshold": facts["reach_threshold"]}, indent=2))
    return 0
