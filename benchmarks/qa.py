"""Answer quality: LinearRAG retrieval + a chat model, scored against the gold answers.

    python -m benchmarks.qa --data DIR --llm-base-url URL --llm-model NAME --json OUT [--png OUT] [--limit N]
                            [--top-k 5] [--index INDEX_DIR] [--judge-model NAME] [--no-judge] ...

DATA holds corpus.jsonl and questions.jsonl ({id, question, answers: [aliases], optional supporting_ids,
type}). The index is INDEX_DIR when given, else built once and cached as in benchmarks.quality. Each
question's top-k passages go to the model (linearrag_torch.answers.generation.answer_batch); the parsed answer
is scored with exact match, token F1 and containment (linearrag_torch.answers.scoring) and, unless --no-judge,
by an LLM judge; beside them recall@k of the passages shown, tokens and time, overall and per question
type. Metric definitions: benchmarks/README.md ("Answer quality"). Replies are cached on disk, so a
rerun costs no tokens.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.corpus import InputError, read_questions  # noqa: E402
from linearrag_torch.answers.generation import LLMError, answer_batch, judge_batch  # noqa: E402
from linearrag_torch.cli.flags import add_llm_flags, llm_from_args  # noqa: E402
from linearrag_torch.answers.scoring import answer_scores, recall_at_k  # noqa: E402

METRICS = ("em", "f1", "contains", "contains_words", "judge", "recall")  # the order of the table and the plot
LABELS = {"em": "EM", "f1": "F1", "contains": "contains", "contains_words": "contains (words)", "judge": "judge",
          "recall": "R@k"}


def score_rows(questions, answers, verdicts, top_k: int) -> list[dict]:
    """One row per question: its answer metrics (fractions; None where not defined) and its usage."""
    rows = []
    for q, a, v in zip(questions, answers, verdicts):
        gold = [str(x) for x in (q.get("answers") or [])]
        row = {"id": q["id"], "type": q.get("type"), "question": q["question"], "answers": gold,
               "prediction": a.answer, "marker_found": a.marker_found, "cached": a.cached, "usage": a.usage,
               "passages": [p.id for p in a.passages]}
        if gold:
            row.update(answer_scores(a.answer, gold))
            row["judge"] = None if v is None else (1.0 if v else 0.0)  # None: --no-judge
            row["judge_verdict"] = v
        row["recall"] = recall_at_k(row["passages"], q.get("supporting_ids"), top_k)
        rows.append(row)
    return rows


def aggregate(rows: list[dict], judged: bool) -> dict:
    """Means in percent: EM, F1, containment and judge over the questions with gold answers (a judge
    reply that is neither word counts as incorrect), recall@k over the questions with supporting_ids."""
    with_gold = [r for r in rows if r["answers"]]
    out = {"n": len(rows), "n_with_answers": len(with_gold)}
    for m in ("em", "f1", "contains", "contains_words"):
        out[m] = _pct([r[m] for r in with_gold])
    if judged:
        out["judge"] = _pct([1.0 if r.get("judge_verdict") else 0.0 for r in with_gold])
        out["judge_unparsed"] = sum(1 for r in with_gold if r.get("judge_verdict") is None)
    else:
        out["judge"] = None
    recalls = [r["recall"] for r in rows if r["recall"] is not None]
    out["recall"] = _pct(recalls)
    out["n_with_gold_passages"] = len(recalls)
    out["marker_missing"] = sum(1 for r in rows if not r["marker_found"])
    return out


def _pct(values) -> float | None:
    return round(100.0 * sum(values) / len(values), 2) if values else None


def usage_totals(replies_or_answers) -> dict:
    """Tokens as the endpoint reported them: ``all`` (every reply, cached ones too) and ``spent``
    (replies fetched in this run; a cached reply costs nothing)."""
    out = {"requests": 0, "cached": 0, "all": defaultdict(int), "spent": defaultdict(int)}
    for r in replies_or_answers:
        out["cached" if r.cached else "requests"] += 1
        for k, v in (r.usage or {}).items():
            out["all"][k] += v
            if not r.cached:
                out["spent"][k] += v
    return {**out, "all": dict(out["all"]), "spent": dict(out["spent"])}


def print_table(overall: dict, per_type: dict, top_k: int, file=sys.stdout) -> None:
    hdr = f"{'questions':<22}{'n':>5}" + "".join(f"{LABELS[m].replace('k', str(top_k)):>10}" for m in METRICS)
    print(hdr, file=file)
    print("-" * len(hdr), file=file)
    for name, m in [("all", overall)] + list(per_type.items()):
        cells = "".join(f"{m[k]:>10.1f}" if m.get(k) is not None else f"{'-':>10}" for k in METRICS)
        print(f"{name:<22}{m['n']:>5}{cells}", file=file)


def plot(path: Path, overall: dict, per_type: dict, title: str, top_k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("all", overall)] + list(per_type.items())
    metrics = [m for m in METRICS if any(g.get(m) is not None for _, g in groups)]
    width = 0.8 / max(1, len(metrics))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(groups) + 2), 4.5))
    for j, m in enumerate(metrics):
        xs = [i + (j - (len(metrics) - 1) / 2) * width for i in range(len(groups))]
        ys = [g.get(m) or 0.0 for _, g in groups]
        ax.bar(xs, ys, width, label=LABELS[m].replace("k", str(top_k)))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{name}\n(n={g['n']})" for name, g in groups], fontsize=8)
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=len(metrics))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.qa", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="folder with corpus.jsonl and questions.jsonl")
    ap.add_argument("--json", type=Path, help="write the results (with every question's row) here")
    ap.add_argument("--png", type=Path, help="write a bar plot of the metrics, overall and per question type")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument("--top-k", type=int, default=5, help="passages shown to the model; recall is @ this k (default 5)")
    ap.add_argument("--index", type=Path, help="an index folder to use instead of building/caching one from DATA")
    ap.add_argument("--cache", type=Path, default=None, help="index cache folder (default: benchmarks.quality's)")
    ap.add_argument("--rebuild", action="store_true", help="build the index even when a cached one exists")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda (default auto)")
    ap.add_argument("--batch-size", type=int, default=256, help="questions per retrieval call (default 256)")
    add_llm_flags(ap, judge=True)
    args = ap.parse_args(argv)

    questions_path = args.data / "questions.jsonl"
    try:
        questions = read_questions(questions_path)
    except InputError as exc:
        ap.error(str(exc))
    if args.limit is not None:
        questions = questions[: args.limit]
    try:
        llm = llm_from_args(args)
        judge = None if args.no_judge else llm.with_model(args.judge_model, args.judge_base_url)
    except (LLMError, ValueError) as exc:
        print(f"benchmarks.qa: error: {exc}", file=sys.stderr)
        return 2

    t_start = time.perf_counter()
    if args.index is not None:
        rag, index_info = LinearRAG.load(args.index, device=args.device), {"index_dir": str(args.index)}
    else:
        from benchmarks import quality

        corpus_path = args.data / "corpus.jsonl"
        if not corpus_path.is_file():
            ap.error(f"{corpus_path} does not exist")
        rag, index_info = quality.load_or_build(corpus_path, (args.cache or quality.DEFAULT_CACHE).expanduser(),
                                                args.rebuild)
    _ = rag.nlp, rag.encoder  # models loaded before the clock starts
    texts = [q["question"] for q in questions]

    t0 = time.perf_counter()
    hits = []
    for start in range(0, len(texts), args.batch_size):
        hits += rag.search(texts[start:start + args.batch_size], top_k=args.top_k)
    retrieve_s = time.perf_counter() - t0
    print(f"[retrieve] {len(texts)} questions in {retrieve_s:.2f} s", file=sys.stderr)
    try:
        t0 = time.perf_counter()
        answers = answer_batch(hits, texts, llm, top_k=args.top_k)
        generate_s = time.perf_counter() - t0
        gen_usage = usage_totals(answers)
        print(f"[generate] {len(texts)} answers in {generate_s:.2f} s ({gen_usage['cached']} from the cache)",
              file=sys.stderr)
        verdicts, judge_s, judge_usage = [None] * len(texts), None, None
        if judge is not None:
            graded = [i for i, q in enumerate(questions) if q.get("answers")]
            t0 = time.perf_counter()
            vs, replies = judge_batch(judge, [texts[i] for i in graded], [questions[i]["answers"] for i in graded],
                                      [answers[i].answer for i in graded])
            judge_s = time.perf_counter() - t0
            for i, v in zip(graded, vs):
                verdicts[i] = v
            judge_usage = usage_totals(replies)
            print(f"[judge] {len(graded)} verdicts in {judge_s:.2f} s", file=sys.stderr)
    except LLMError as exc:
        print(f"benchmarks.qa: error: {exc}", file=sys.stderr)
        return 2

    rows = score_rows(questions, answers, verdicts, args.top_k)
    judged = judge is not None
    overall = aggregate(rows, judged)
    by_type = defaultdict(list)
    for r in rows:
        if r["type"] is not None:
            by_type[str(r["type"])].append(r)
    per_type = {t: aggregate(rs, judged) for t, rs in sorted(by_type.items())}
    dataset = args.data.resolve().name
    print(f"\n{dataset}: {llm.model}, top-{args.top_k} passages, {len(rows)} questions")
    print_table(overall, per_type, args.top_k)

    result = {
        "dataset": dataset,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "model": llm.model, "base_url": llm.base_url,
        "judge_model": judge.model if judged else None, "judge_base_url": judge.base_url if judged else None,
        "top_k": args.top_k,
        "generation_settings": llm.settings,
        "retrieval_config": rag.config.replace(top_k=args.top_k).to_dict(),
        "index": {**{k: v for k, v in index_info.items() if k in ("index_dir", "cache_dir", "cached", "build_s")},
                  "summary": rag.index.summary()},
        "time_s": {"retrieve": round(retrieve_s, 3), "generate": round(generate_s, 3),
                   "judge": None if judge_s is None else round(judge_s, 3),
                   "total": round(time.perf_counter() - t_start, 3)},
        "retrieve_ms_per_question": round(1000 * retrieve_s / max(1, len(rows)), 3),
        "tokens": {"generation": gen_usage, "judge": judge_usage},
        "overall": overall,
        "per_type": per_type,
        "questions": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    if args.png:
        plot(args.png, overall, per_type, f"{dataset}: {llm.model}, top-{args.top_k} LinearRAG passages", args.top_k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
