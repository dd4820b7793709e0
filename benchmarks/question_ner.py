"""The question path without spaCy at query time (RetrievalConfig.question_ner): recall and cost per question.

    python -m benchmarks.question_ner --data DIR [DIR ...] [--json OUT] [--png OUT] [--batch 64]

For each data folder (corpus.jsonl + questions.jsonl with supporting_ids; the index from benchmarks.quality's
cache) and each question path: ``always`` (spaCy NER on every question, then the lexicon: the default),
``fallback`` (the lexicon first, NER only for the questions it finds nothing in) and ``off`` (lexicon
matches only), the questions are encoded in batches of --batch and ranked by the graph with the default
settings. Reported per path: recall@2/5/10 (and the change from ``always``), the share of questions that
went through NER, the question path's milliseconds per question by stage (ner, lexicon, encoder) and the
graph's, and the end-to-end ceiling of one CPU core: questions per second = 1000 / (question path + graph
ms per question), measured with one torch thread. Run it alone (nothing else on the cores).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.quality import check_data_folders, data_set_arguments, load_or_build, machine_info  # noqa: E402
from benchmarks.rerank import metrics  # noqa: E402
from linearrag_torch.config import QUESTION_NER, RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402

SHOWN = ("recall@2", "recall@5", "recall@10")


def run_path(rag, questions: list[dict], ner: str, batch: int) -> dict:
    """One question path over all questions: recall, the NER share and milliseconds per question by stage."""
    cfg = rag.config.replace(question_ner=ner)
    texts = [q["question"] for q in questions]
    stages: dict = {}
    rows, graph_s = [], 0.0
    for s in range(0, len(texts), batch):
        part = texts[s:s + batch]
        enc = rag.encode_queries(part, cfg, timings=stages)
        t = time.perf_counter()
        out = rag.retrieve(enc, cfg.replace(top_k=10))
        graph_s += time.perf_counter() - t
        rows += out.indices.tolist()
    n = len(texts)
    with_ner = {"always": n, "off": 0}.get(ner) if ner != "fallback" else \
        sum(1 for q in texts if not rag.pipeline.lexicon.match(q))
    ms = {k: round(1e3 * v / n, 3) for k, v in stages.items()}
    ms["graph"] = round(1e3 * graph_s / n, 3)
    path_ms = sum(v for k, v in ms.items() if k != "graph")
    return {"metrics": metrics(rows, rag, questions), "ner_share": round(with_ner / n, 4), "ms_per_question": ms,
            "question_path_ms": round(path_ms, 3),
            "one_core_ceiling_qps": round(1e3 / max(path_ms + ms["graph"], 1e-9), 1)}


def plot(path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results["datasets"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    x = range(len(sets))
    w = 0.8 / len(QUESTION_NER)
    for j, ner in enumerate(QUESTION_NER):
        off = (j - (len(QUESTION_NER) - 1) / 2) * w
        axes[0].bar([i + off for i in x], [results["datasets"][s][ner]["metrics"]["recall@5"] for s in sets], w,
                    label=ner)
        axes[1].bar([i + off for i in x], [results["datasets"][s][ner]["question_path_ms"] for s in sets], w,
                    label=ner)
    axes[0].set_title("recall@5")
    axes[0].set_ylim(0, 100)
    axes[1].set_title("question path, ms per question (1 thread)")
    for ax in axes:
        ax.set_xticks(list(x), sets, fontsize=8)
    axes[0].legend(fontsize=8, title="question_ner")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.question_ner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    data_set_arguments(ap)
    ap.add_argument("--batch", type=int, default=64, help="questions per encode/retrieve call (default 64)")
    ap.add_argument("--png", type=Path, help="write the plot here")
    args = ap.parse_args(argv)
    check_data_folders(args.data, ap.error)
    torch.set_num_threads(1)
    results = {"date": time.strftime("%Y-%m-%d"), "batch": args.batch, "datasets": {}}
    for data in args.data:
        rag, _ = load_or_build(data / "corpus.jsonl", args.cache)
        results.setdefault("machine", machine_info(rag))
        questions = read_questions(str(data / "questions.jsonl"))
        rag.search([questions[0]["question"]])  # warm: the models load, the lexicon is built
        res = results["datasets"][data.name] = {ner: run_path(rag, questions, ner, args.batch) for ner in QUESTION_NER}
        print(f"\n{data.name} ({len(questions)} questions): " + " / ".join(SHOWN)
              + ", NER share, question path ms, one-core ceiling q/s")
        for ner in QUESTION_NER:
            r = res[ner]
            delta = {m: round(r["metrics"][m] - res["always"]["metrics"][m], 2) for m in SHOWN}
            r["change_from_always"] = delta
            print(f"  {ner:<9}" + " / ".join(f"{r['metrics'][m]:.1f}" for m in SHOWN)
                  + f"  ({' / '.join(f'{v:+.1f}' for v in delta.values())})  {r['ner_share']:.0%}  "
                  + f"{r['question_path_ms']:.2f} ms  {r['one_core_ceiling_qps']:.0f}")
        rag.close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    if args.png:
        plot(args.png, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
