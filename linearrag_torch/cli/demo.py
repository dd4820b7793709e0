"""`linearrag demo`: index the bundled 2WikiMultiHopQA sample and show multi-hop retrieval at work."""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from .. import env
from .common import order_note, sizes
from .flags import device_arg


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="index the bundled sample corpus and show the passages found for its multi-hop questions",
                       description="Index a few hundred bundled 2WikiMultiHopQA passages (cached after the first run) "
                                   "and show, for each bundled question, the passages found and the entities that bridged them.")
    d.add_argument("--top-k", type=int, default=3, help="passages shown per question (default %(default)s)")
    d.add_argument("--limit", type=int, default=5, metavar="N",
                   help="how many of the bundled questions to show (default %(default)s)")
    # the old spelling, which `query --questions FILE` made confusing: still accepted, with a note
    d.add_argument("--questions", type=int, default=None, dest="old_questions", help=argparse.SUPPRESS)
    d.add_argument("--cache", default=None, help="where to keep the demo index (default: ~/.cache/linearrag_torch)")
    device_arg(d)


def run(args) -> int:
    from ..api import LinearRAG  # deferred: imports torch, which `linearrag --help` must not load
    from ..data import sample_corpus_path, sample_questions as demo_questions  # looked up when the demo runs
    from ..index import IndexFormatError  # deferred: imports torch

    if args.old_questions is not None:
        print("linearrag demo: --questions N is deprecated, use --limit N (query's --questions is a file)",
              file=sys.stderr)
        args.limit = args.old_questions
    corpus = sample_corpus_path()
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()[:12]
    cache = Path(args.cache) if args.cache else env.cache_dir()
    index_dir = cache / f"demo-{digest}"
    rag, built = None, None
    if (index_dir / "index.json").exists():
        try:
            t0 = time.perf_counter()
            rag = LinearRAG.load(index_dir, device=args.device)
            print(f"Loaded the demo index from {index_dir} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        except IndexFormatError as exc:
            print(f"Rebuilding the demo index ({exc})", file=sys.stderr)
    if rag is None:
        print(f"Indexing {corpus.name} (300 passages of 2WikiMultiHopQA, see data/ATTRIBUTION.md) ...", file=sys.stderr)
        t0, timings = time.perf_counter(), {}
        rag = LinearRAG.build(corpus, device=args.device, timings=timings)  # the models loaded first, timed
        rag.save(index_dir)
        models_s = timings.get("load_models", 0.0)
        built = f"  {sizes(rag.index.summary())} in {time.perf_counter() - t0 - models_s:.1f} s; saved to {index_dir}"
    else:  # the question models load on first use: here, so that the questions' time below is theirs alone
        t0 = time.perf_counter()
        rag.nlp, rag.encoder  # noqa: B018 (each loads on first use)
        models_s = time.perf_counter() - t0
    ic = rag.index.index_config
    print(f"Loaded spaCy {ic.spacy_model} and the encoder {Path(ic.encoder).name} in {models_s:.1f} s", file=sys.stderr)
    if built:
        print(built, file=sys.stderr)

    questions = demo_questions()
    shown = questions[: max(0, args.limit)]
    t0 = time.perf_counter()
    later_rounds = False  # a hit shown was found by a later round: the legend says what that means
    shown_bridges = False  # a hit shown was reached through a chain seed: the legend says what that means
    explained = rag.explain([q["question"] for q in shown], top_k=args.top_k)
    for q, ex in zip(shown, explained):
        gold = set(q["supporting_ids"])
        print(f"\nQ: {q['question']}   (answer: {', '.join(q['answers'])})")
        if ex["dense_fallback"]:
            print("   no entity in the question: dense retrieval")
        else:
            print("   seeds: " + ", ".join(f"{name} ({score:.2f})" for name, score in ex["seeds"]))
        pair = ex.get("pair_ranks")
        if pair and tuple(pair) != (1, 2):  # why a lower score can come second
            print(f"   places 1-2: the pair rerank's best pair of the top {rag.config.pair_candidates}, ranked "
                  f"{pair[0]} and {pair[1]} by score before it (pairs.py); each keeps its own score")
        # the round that found each hit: a later round's scores are its own PageRank's, on another scale
        found = {f["id"]: f["round"] for f in ex.get("found") or []}
        bridged = ex.get("bridges") or [[] for _ in ex["hits"]]
        for rank, ((hit, ents), via) in enumerate(zip(ex["hits"], bridged), 1):
            mark = "*" if hit.id in gold else " "
            later = found.get(hit.id) or 1
            later_rounds |= later > 1
            print(f" {mark}{rank}. {hit.title}  score {hit.score:.4f}" + (f"  (found by round {later})" if later > 1 else ""))
            if ents:  # the activated entities this passage contains, strongest first
                ents = sorted(ents, key=lambda x: -x[2])
                names = [f"{n} ({'seed' if t == 1 else f'hop {t - 1}'})" for n, t, _ in ents[:6]]
                more = f" and {len(ents) - 6} more" if len(ents) > 6 else ""
                print("      entities: " + ", ".join(names) + more)
            if via and (later > 1 or not ents):  # how the later round reached a passage the first did not bridge to
                shown_bridges = True
                print("      bridge: " + ", ".join(n for n, _ in via[:4])
                      + (f" and {len(via) - 4} more" if len(via) > 4 else "")
                      + " (named in the first round's top passages)")
        note = order_note(rag.config)
        if note and any(a.score < b.score for (a, _), (b, _) in zip(ex["hits"], ex["hits"][1:])):
            print(f"   ({note})")  # the stages that set this order, not a bug
    all_hits = rag.search([q["question"] for q in questions], top_k=5)
    dt = time.perf_counter() - t0
    r2 = sum(len(set(q["supporting_ids"]) & {h.id for h in hits[:2]}) / len(q["supporting_ids"]) for q, hits in zip(questions, all_hits))
    r5 = sum(len(set(q["supporting_ids"]) & {h.id for h in hits[:5]}) / len(q["supporting_ids"]) for q, hits in zip(questions, all_hits))
    if later_rounds:
        print("\n(found by round 2): a passage the second round found from the entities of the first round's top "
              "passages; its score is that round's, on its own scale")
    if shown_bridges:
        print("bridge: the entities a later round started from (chain seeds: named in the first round's top "
              "passages) that this passage contains; `linearrag query --explain` lists them all")
    print(f"\n* = gold supporting passage. On all {len(questions)} bundled questions: "
          f"recall@2 {100 * r2 / len(questions):.1f}, recall@5 {100 * r5 / len(questions):.1f} "
          f"({rag.config.mode} mode, device {rag.device}; {dt:.1f} s for the questions, after {models_s:.1f} s "
          "loading the models)")
    return 0
