"""`linearrag train-reranker --train TRAIN.jsonl --out OUT`: train the cross-encoder reranker (rerank/train.py;
no torch import here: `linearrag --help` stays fast); its settings are config.TrainConfig."""
from __future__ import annotations

import json
from pathlib import Path

from ..config import TrainConfig
from ..env import resolve_device
from .flags import device_arg


def add_parser(sub) -> None:
    """`linearrag train-reranker` on the CLI's subparsers."""
    d = TrainConfig()
    p = sub.add_parser(
        "train-reranker", help="train the cross-encoder reranker on questions with their paragraphs",
        description="Train the reranker that `--rerank` uses: a cross-encoder (question and passage read together) "
                    "initialised from the packaged all-MiniLM-L6-v2. TRAIN.jsonl holds one question a line: "
                    '"question" and "paragraphs", a list of {"title", "text", "supporting"}: the format of the '
                    "training set the shipped reranker was trained on (train_multihop: 1,348 questions of the train "
                    "splits of 2WikiMultiHopQA, HotpotQA and MuSiQue, each with the paragraphs it was published "
                    "with; not in this repository: docs/reranker.md, 'The training set', says where it comes from). Negatives: each question's other paragraphs and the engine's own "
                    "top-ranked wrong passages over an index of the file's paragraphs (mining). Writes OUT/model "
                    "(load it with --reranker OUT/model); a checkpoint in OUT lets an interrupted run restart.")
    p.add_argument("--train", required=True, metavar="TRAIN.jsonl", help="training questions with their paragraphs")
    p.add_argument("--out", required=True, metavar="OUT", help="output folder (the model goes to OUT/model)")
    p.add_argument("--init", metavar="DIR", default=None,
                   help="a BERT folder to start from (default: the packaged all-MiniLM-L6-v2), or a reranker folder "
                        "to go on training")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the training questions (default {d.epochs})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the split, the order and the sampling (default {d.seed})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"encoder learning rate (default {d.lr})")
    p.add_argument("--negatives", type=int, default=d.negatives,
                   help=f"negatives per question and step (default {d.negatives})")
    p.add_argument("--questions-per-step", type=int, default=d.questions_per_step,
                   help=f"questions per optimiser step (default {d.questions_per_step})")
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help=f"tokens of a (question, passage) pair (default {d.max_length})")
    p.add_argument("--question-tokens", type=int, default=d.question_tokens,
                   help=f"the question's share of a pair at most (default {d.question_tokens})")
    p.add_argument("--context-tokens", type=int, default=d.context_tokens,
                   help="chain-aware pairs: read the graph's top passage (its second for the top one) after the "
                        f"question, at most this many tokens (default {d.context_tokens}: off)")
    p.add_argument("--mine-share", type=float, default=d.mine_share,
                   help="share of the training questions whose paragraphs enter the mining index and that get the "
                        "engine's mistakes as negatives (held-out questions always do; 0: held-out only) "
                        f"(default {d.mine_share})")
    p.add_argument("--mine-index", metavar="DIR", default=None,
                   help="the mining index folder: loaded when it holds an index, else built there (default OUT/mining_index)")
    p.add_argument("--second-place", nargs="?", const="first-hop", choices=["first-hop", "engine"], default="",
                   help="train the second place: with --init a reranker, mine its own mistakes on the training "
                        "questions and train only on the questions that have one, each with a group of its other "
                        "gold passages against those mistakes beside its ordinary group (needs --context-tokens). "
                        "first-hop (the default of the flag): the paragraphs it puts above a gold second hop when it "
                        "reads the gold first hop; engine: the mined candidates it fuses above a gold one when the "
                        "engine's top candidate is gold (use --mine-share 1 to mine every question)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N questions (a quick trial)")
    device_arg(p)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    p.add_argument("--float32", action="store_true", help="store the weights in float32 (default float16, half the size)")
    p.add_argument("--no-resume", action="store_true", help="start over even when OUT holds a checkpoint of this run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args) -> int:
    import sys

    from ..api import LinearRAG  # deferred (both): import torch
    from ..rerank.train import mine, mining_corpus, mining_questions, read_training_file, train

    cfg = TrainConfig(epochs=args.epochs, seed=args.seed, lr=args.lr, negatives=args.negatives,
                      questions_per_step=args.questions_per_step, max_length=args.max_length,
                      question_tokens=args.question_tokens, context_tokens=args.context_tokens,
                      mine_share=args.mine_share, threads=args.threads, second_place=args.second_place)
    if cfg.second_place and not cfg.context_tokens:
        raise SystemExit("linearrag train-reranker: error: --second-place reads the first hop as context: give "
                         "--context-tokens (40 for the shipped reranker)")
    questions, passages = read_training_file(args.train)
    if args.limit:
        questions = questions[:args.limit]
        keep = {k for q in questions for k in q.positives + q.negatives}
        passages = {k: v for k, v in passages.items() if k in keep}
    device = resolve_device(args.device)
    out = Path(args.out)
    mined = [questions[i] for i in mining_questions(len(questions), cfg)]
    mine_keys = list(dict.fromkeys(k for q in mined for k in q.positives + q.negatives))
    print(f"{len(questions)} questions, {len(passages)} paragraphs; mining over the {len(mine_keys)} paragraphs of "
          f"{len(mined)} questions", file=sys.stderr)
    index_dir = Path(args.mine_index) if args.mine_index else out / "mining_index"
    if index_dir.is_dir() and any(index_dir.iterdir()):
        rag = LinearRAG.load(index_dir, device=device)
    else:  # built from the mining questions' paragraphs, ids = their keys
        rag = LinearRAG.build(mining_corpus({k: passages[k] for k in mine_keys}), device=device,
                              progress=not args.quiet)
        rag.save(index_dir)
    try:
        mine(mined, rag, cfg.candidates, progress=not args.quiet)
    finally:
        rag.close()
    facts = train(questions, passages, out, cfg, init=args.init, device=device, progress=not args.quiet,
                  resume=not args.no_resume, half=not args.float32, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({"model": str(out / "model"), "train_seconds": facts["train_seconds"], "steps": facts["steps"],
                      "fusion": facts["fusion"]}, indent=2))
    return 0
