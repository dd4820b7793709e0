"""`linearrag answer INDEX_DIR QUESTION ...`: answer questions with a chat model from the retrieved passages
(answers/generation.py)."""
from __future__ import annotations

import json
import sys

from .common import count, question_items, snippet
from .flags import add_llm_flags, add_retrieval_flags, device_arg, llm_from_args, positive_int, retrieval_config


def add_parser(sub) -> None:
    an = sub.add_parser("answer", help="answer questions with a chat model from the retrieved passages",
                        description="Retrieve the top-k passages of each question (arguments, or --questions "
                                    "FILE.jsonl), ask an OpenAI-compatible chat model to reason briefly and end with "
                                    "'Answer: ...', and print the parsed answers. Replies are cached on disk, so a "
                                    "rerun costs no tokens. An endpoint error prints one line naming the URL and the "
                                    "HTTP status and exits 2.")
    an.add_argument("index_dir", metavar="INDEX_DIR")
    an.add_argument("question", nargs="*", help="question text(s)")
    an.add_argument("--questions", metavar="FILE.jsonl", help='JSON lines with "question" and optional "id"')
    an.add_argument("--top-k", type=positive_int, default=5, help="passages shown to the model (default %(default)s)")
    an.add_argument("--json", action="store_true",
                    help='one JSON object per question per line: {"id", "question", "answer", "reply", "marker_found", '
                         '"cached", "usage", "passages": [{"id", "score", "title"}]}')
    an.add_argument("--batch-size", type=positive_int, default=256, help="questions per retrieval call (default %(default)s)")
    device_arg(an)
    add_llm_flags(an)
    add_retrieval_flags(an, stored=True)


def run(args) -> int:
    from ..api import LinearRAG  # deferred: imports torch, which `linearrag --help` must not load
    from ..answers.generation import LLMError, answer_batch  # deferred: --help imports this module

    items = question_items(args)
    try:
        # a missing URL or model fails before the index loads; a retry says what it waits for and how long
        llm = llm_from_args(args, notify=lambda line: print(f"linearrag answer: waiting: {line}", file=sys.stderr,
                                                             flush=True))
        rag = LinearRAG.load(args.index_dir, device=args.device)
        rag.config = retrieval_config(args, rag.config)
        hits = []
        for start in range(0, len(items), args.batch_size):
            hits += rag.search([it["question"] for it in items[start:start + args.batch_size]], top_k=args.top_k)
        answers = answer_batch(hits, [it["question"] for it in items], llm, top_k=args.top_k)
    except LLMError as exc:
        print(f"linearrag answer: error: {exc}", file=sys.stderr)
        return 2
    for it, a in zip(items, answers):
        if args.json:
            d = a.to_dict(include_text=False)
            print(json.dumps({"id": it["id"], **d}, ensure_ascii=False))
        else:
            print(f"Q {it['id']}: {it['question']}")
            print(f"  A: {a.answer}" + ("" if a.marker_found else "  (no 'Answer:' line: the whole reply)"))
            print("  from: " + "; ".join(f"[{p.id}] {p.title or snippet(p.text, 40)}" for p in a.passages))
    spent = sum(a.usage.get("total_tokens", 0) for a in answers if not a.cached)
    print(f"answered {count(len(answers), 'question')} with {llm.model}: {count(sum(a.cached for a in answers), 'reply', 'replies')} "
          f"from the cache, {count(spent, 'token')} spent", file=sys.stderr)
    return 0
