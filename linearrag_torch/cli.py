"""Command line: `linearrag index | query | demo` (run `linearrag COMMAND --help`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .config import IndexConfig, RetrievalConfig

SETTINGS = (  # flag, RetrievalConfig field, type, help
    ("--mode", "mode", str, "activation: 'paper' (eq. 5 as written) or 'reference' (the reference code's BFS)"),
    ("--max-iterations", "max_iterations", int, "activation loop runs while t < this (3 = two hops)"),
    ("--delta", "delta", float, "activation threshold (reference: iteration_threshold)"),
    ("--lam", "lam", float, "lambda of eq. 7, weight of dense similarity (reference: passage_ratio)"),
    ("--damping", "damping", float, "PageRank damping"),
    ("--top-k-sentence", "top_k_sentence", int, "reference mode: sentences each active entity expands per step"),
    ("--passage-node-weight", "passage_node_weight", float, "W_p of eq. 7"),
    ("--ppr-tol", "ppr_tol", float, "power-iteration tolerance (L1 change per question)"),
    ("--ppr-max-iter", "ppr_max_iter", int, "power-iteration cap"),
)


def _add_settings(p: argparse.ArgumentParser, stored: bool) -> None:
    g = p.add_argument_group(
        "retrieval settings", "default: " + ("the values stored with the index" if stored else "the reference code's values")
    )
    for flag, field, typ, text in SETTINGS:
        kw = {"choices": ("paper", "reference")} if field == "mode" else {}
        g.add_argument(flag, dest=field, type=typ, default=None, help=f"{text} (default {getattr(RetrievalConfig(), field)})" if not stored else text, **kw)
    g.add_argument("--adjacent-passages", dest="adjacent_passages", action="store_true", default=None,
                   help="link passage i to i+1 (only for consecutive chunks of one document)")


def _settings(args) -> dict:
    return {field: getattr(args, field) for _, field, _, _ in SETTINGS + (("", "adjacent_passages", None, ""),)}


def _device_arg(p):
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="linearrag",
        description="LinearRAG graph retrieval (entities, sentences, passages; activation + PageRank) on torch.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("index", help="build an index from a JSONL corpus",
                       description="Sentence split, NER and encode every passage; write the Tri-Graph index to INDEX_DIR.")
    p.add_argument("corpus", metavar="CORPUS.jsonl", help='one JSON object per line: "text", optional "id" and "title"')
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("--spacy-model", default=IndexConfig.spacy_model, help="spaCy package name or folder (default %(default)s)")
    p.add_argument("--encoder", default=IndexConfig.encoder, help="packaged all-MiniLM-L6-v2 or a local sentence-transformers folder (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=IndexConfig.batch_size, help="encoder batch (default %(default)s)")
    p.add_argument("--processes", type=int, default=0, help="spaCy processes (default 0: from the cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _device_arg(p)
    _add_settings(p, stored=False)

    q = sub.add_parser("query", help="answer questions from an index",
                       description="Rank passages for each question (arguments, or --questions FILE.jsonl).")
    q.add_argument("index_dir", metavar="INDEX_DIR")
    q.add_argument("question", nargs="*", help="question text(s)")
    q.add_argument("--questions", metavar="FILE.jsonl", help='JSON lines with "question" and optional "id"')
    q.add_argument("--top-k", type=int, default=None, help="passages per question (default: the index's, 5)")
    q.add_argument("--json", action="store_true", help="one JSON object per question per line")
    q.add_argument("--backend", choices=("torch", "scipy"), default="torch", help="torch engine or the scipy reference")
    q.add_argument("--batch-size", type=int, default=256, help="questions per batched call (default %(default)s)")
    _device_arg(q)
    _add_settings(q, stored=True)

    d = sub.add_parser("demo", help="index the bundled sample corpus and answer its multi-hop questions",
                       description="Index a few hundred bundled 2WikiMultiHopQA passages (cached after the first run) "
                                   "and show, for each bundled question, the passages found and the entities that bridged them.")
    d.add_argument("--top-k", type=int, default=3)
    d.add_argument("--questions", type=int, default=5, help="how many bundled questions to answer (default %(default)s)")
    d.add_argument("--cache", default=None, help="where to keep the demo index (default: ~/.cache/linearrag_torch)")
    _device_arg(d)
    return top


def cmd_index(args) -> int:
    from .api import LinearRAG

    t0 = time.perf_counter()
    cfg = RetrievalConfig().replace(**_settings(args))
    icfg = IndexConfig(spacy_model=args.spacy_model, encoder=args.encoder, batch_size=args.batch_size, n_process=args.processes)
    rag = LinearRAG.build(args.corpus, index_config=icfg, config=cfg, device=args.device, progress=not args.quiet)
    rag.save(args.index_dir)
    s = rag.index.summary()
    print(f"indexed {s['passages']} passages, {s['sentences']} sentences, {s['entities']} entities "
          f"(nnz M {s['nnz_M']}, C {s['nnz_C']}, N {s['nnz_N']}) into {args.index_dir} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def cmd_query(args) -> int:
    from .api import LinearRAG
    from .corpus import read_questions

    items = [{"id": i, "question": q} for i, q in enumerate(args.question)]
    if args.questions:
        items += read_questions(args.questions)
    if not items:
        raise ValueError("no question given (pass QUESTION arguments or --questions FILE.jsonl)")
    rag = LinearRAG.load(args.index_dir, device=args.device)
    rag.config = rag.config.replace(**_settings(args))
    results = []
    for start in range(0, len(items), max(1, args.batch_size)):
        chunk = items[start:start + args.batch_size]
        results += rag.search([it["question"] for it in chunk], top_k=args.top_k, backend=args.backend)
    for it, hits in zip(items, results):
        if args.json:
            print(json.dumps({"id": it["id"], "question": it["question"],
                              "hits": [{"id": h.id, "score": h.score, "title": h.title} for h in hits]}, ensure_ascii=False))
        else:
            print(f"Q {it['id']}: {it['question']}")
            for rank, h in enumerate(hits, 1):
                print(f"  {rank}. [{h.id}] {h.title or _snippet(h.text, 60)}  score {h.score:.4g}")
    return 0


def _snippet(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = parser().parse_args(argv)
    from .corpus import InputError
    from .index import IndexFormatError

    try:
        return {"index": cmd_index, "query": cmd_query, "demo": cmd_demo}[args.command](args)
    except (InputError, IndexFormatError, ValueError, FileNotFoundError, OSError) as exc:
        print(f"linearrag {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
