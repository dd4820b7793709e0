"""`linearrag query INDEX_DIR QUESTION ...`: rank the passages of an index for questions."""
from __future__ import annotations

import sys
from pathlib import Path

from ..config import ENCODER_BACKENDS
from .common import (count, order_note, print_explanations, print_hits, question_items, require_encoder_backend,
                     sizes)
from .flags import add_retrieval_flags, device_arg, positive_int, retrieval_config


def _query_speed_args(p):
    p.add_argument("--quantize", choices=("bfloat16", "int8", "int8-all"), default=None,
                   help="the question encoder in reduced precision: bfloat16 (bf16 autocast where the device has "
                        "native bf16: faster; a question's scores then depend on its batch, slightly), int8 or "
                        "int8-all (int8 Linear layers, CPU only; vectors close to the exact ones, int8-all less so; "
                        "docs/tuning.md has the figures). Default: exact float32 whatever the index was encoded in")
    p.add_argument("--encoder-backend", choices=ENCODER_BACKENDS, default="torch",
                   help="where the question encoder runs: torch, or onnx (float32 on ONNX Runtime, CPU only, extra "
                        "[onnx]: the same vectors to float noise, its encoder stage faster (docs/tuning.md); exported "
                        "once into ~/.cache/linearrag_torch/onnx) (default torch)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: $LINEARRAG_THREADS, else one per core; use 1 on cores shared "
                        "with other busy processes)")


def add_parser(sub) -> None:
    q = sub.add_parser("query", help="retrieve: rank the passages of an index for questions",
                       description="Rank passages for each question (arguments, or --questions FILE.jsonl).")
    q.add_argument("index_dir", metavar="INDEX_DIR")
    q.add_argument("question", nargs="*", help="question text(s)")
    q.add_argument("--questions", metavar="FILE.jsonl", help='JSON lines with "question" and optional "id"')
    q.add_argument("--top-k", type=positive_int, default=None, help="passages per question (default: the index's, 5)")
    q.add_argument("--json", action="store_true", help="one JSON object per question per line")
    q.add_argument("--explain", action="store_true", help="print per question, as one JSON line, how its hits were "
                   "reached (LinearRAG.explain: entities, seeds, chain seeds, pair and rerank detail) (torch engine)")
    q.add_argument("--backend", choices=("torch", "scipy"), default="torch", help="torch engine or the scipy reference")
    q.add_argument("--batch-size", type=positive_int, default=256, help="questions per batched call (default %(default)s)")
    _query_speed_args(q)
    q.add_argument("--ner-processes", type=int, default=0, metavar="N",
                   help="spaCy NER of each batch of 16 or more questions split over N worker processes and this one "
                        "(~340 MB and ~2 s to start each; pays with cores to spare) (default 0: NER here alone)")
    q.add_argument("--shards", type=positive_int, default=None, metavar="N",
                   help="split the index over N local processes (torch.distributed: gloo on CPU, NCCL on GPUs) "
                        "and answer as one; prints what one process prints (docs/scale-out.md: across machines with torchrun)")
    device_arg(q)
    add_retrieval_flags(q, stored=True)


def run(args) -> int:
    from ..api import LinearRAG  # deferred: imports torch, which `linearrag --help` must not load

    items = question_items(args)
    require_encoder_backend(args.encoder_backend)
    if args.ner_processes < 0:
        raise SystemExit(f"linearrag query: error: --ner-processes must be >= 0, got {args.ner_processes}")
    if args.shards:
        if args.ner_processes:
            raise SystemExit("linearrag query: error: --ner-processes does not apply with --shards")
        from .sharded import cmd_query_sharded

        return cmd_query_sharded(args, items)
    from ..runtime.threads import set_threads  # deferred: imports torch

    set_threads(args.threads)
    rag = LinearRAG.load(args.index_dir, device=args.device, quantize=args.quantize,
                         encoder_backend=args.encoder_backend)
    rag.config = retrieval_config(args, rag.config)
    # the models load on first use, the longest wait of a short query: say what is loading (stderr: --json stays)
    print(loading_line(rag.index, len(items), args.quantize, args.encoder_backend), file=sys.stderr)
    if args.ner_processes and len(items) >= 16:  # smaller batches would not use them
        rag.start_ner_processes(args.ner_processes)
    results = []
    try:
        for start in range(0, len(items), args.batch_size):
            qs = [it["question"] for it in items[start:start + args.batch_size]]
            results += rag.explain(qs, top_k=args.top_k) if args.explain else \
                rag.search(qs, top_k=args.top_k, backend=args.backend)
    finally:
        rag.close()
    if args.explain:
        print_explanations(items, results)
        return 0
    print_hits(items, results, args.json, order_note(rag.config.replace(top_k=args.top_k)))
    return 0


def loading_line(index, questions: int, quantize: str | None, backend: str) -> str:
    """"Loading spaCy X and the encoder Y (...) for N questions on P passages, S sentences, E entities ...": what
    `query` prints while the question models load."""
    ic = index.index_config
    how = ", ".join(x for x in (quantize, backend if backend != "torch" else None) if x)
    return (f"Loading spaCy {ic.spacy_model} and the encoder {Path(ic.encoder).name}" + (f" ({how})" if how else "")
            + f" for {count(questions, 'question')} on {sizes(index.summary())} ...")
