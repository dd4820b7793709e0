"""The reranker inside the chain rounds against the reranker on the final list only, by number of gold passages.

    python -m benchmarks.rerank_loop --data DIR [DIR ...] [--loop 5 10] [--precisions float32 int8]
                                     [--final-candidates 10] [--json OUT] [--png OUT]
    python -m benchmarks.rerank_loop --train questions.jsonl [--loop 0 3 5 10] ...   # the fitting set

Each data folder (corpus.jsonl + questions.jsonl with supporting_ids; the index is built or taken from
benchmarks.quality's cache) is ranked through the engine's own path (``linearrag query --json`` does the same) by:
the graph alone; ``rerank=True`` (the final list reranked); and ``rerank=True`` with ``rerank_loop_candidates``
K for each K > 0 of ``--loop`` (each round but the last reranked too, the chain's sources and kept passages taken
from that order). Reported per system: recall@2 / @5 overall and by the number of gold passages, and the count of
questions with every gold passage in the top 2 or the top 5, and the milliseconds per question of the whole path
(question encoding included; run it alone). ``--precisions`` repeats the reranked systems with the reranker
in each precision (RetrievalConfig.reranker_precision).

``--train FILE`` makes the fitting set from a training file of `linearrag train-reranker` instead: the held-out
questions of its default split (the ones the shipped fusion was fitted on, never trained on) over an index of
the paragraphs of its mining questions (rerank.train.mining_questions: the held-out ones and 40% of the rest), as
the reranker's training run built it. Settings are chosen there, never on the dev sets.
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

from benchmarks.quality import check_data_folders, data_set_arguments, encode, load_or_build, machine_info  # noqa: E402
from linearrag_torch.config import RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402

KS = (2, 5)


def fitting_set(train_file: Path, out: Path, heldout_only: bool = False) -> Path:
    """A data folder (corpus.jsonl, questions.jsonl) of the training file's held-out questions (see module doc);
    ``heldout_only``: the corpus holds only their own paragraphs (a quarter of the index to build)."""
    from linearrag_torch.config import TrainConfig
    from linearrag_torch.rerank.train import mining_questions, read_training_file, split_heldout

    questions, passages = read_training_file(train_file)
    cfg = TrainConfig(mine_share=0.4)  # the shipped model's run (its MODEL_CARD.md)
    _, held = split_heldout(len(questions), cfg.heldout, cfg.seed)
    pool = held if heldout_only else mining_questions(len(questions), cfg)
    keys = {k for i in pool for k in questions[i].positives + questions[i].negatives}
    out.mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for k in sorted(keys):
            title, text = passages[k]
            fh.write(json.dumps({"id": k, "title": title, "text": text}, ensure_ascii=False) + "\n")
    with (out / "questions.jsonl").open("w", encoding="utf-8") as fh:
        for i in held:
            q = questions[i]
            fh.write(json.dumps({"id": str(i), "question": q.question, "answers": [],
                                 "supporting_ids": q.positives}, ensure_ascii=False) + "\n")
    return out


def systems(loops: list[int], precisions: list[str], rerankers: dict | None = None,
            final_candidates: tuple = (), set_reader: bool = False) -> dict:
    """{name: config}: the graph alone, then per reranker (the shipped one, then each of ``rerankers``, {name:
    folder}), precision and final-list candidates (the default, then each of ``final_candidates``: names end in
    ``_cK``) the final-list rerank and each loop size; with ``set_reader``, each loop size also with the set reader
    (``setK``: its reach classifier on, ``setK_noreach``: off)."""
    base = RetrievalConfig()
    out = {"graph": base}
    default = base.rerank_candidates
    for rname, folder in {"": "", **(rerankers or {})}.items():
        for p in precisions:
            for c in [default] + [c for c in final_candidates if c != default]:
                tag = ("" if p == "float32" else f"_{p}") + (f"_{rname}" if rname else "") + \
                    ("" if c == default else f"_c{c}")
                cfg = base.replace(rerank=True, reranker_precision=p, reranker=folder, rerank_candidates=c)
                out[f"rerank{tag}"] = cfg.replace(rerank_loop_candidates=0)
                for k in loops:
                    if k > 0:
                        out[f"loop{k}{tag}"] = cfg.replace(rerank_loop_candidates=k)
                        if set_reader and c == default:
                            out[f"set{k}{tag}"] = cfg.replace(rerank_loop_candidates=k, rerank_set_reader=True)
                            out[f"set{k}_noreach{tag}"] = cfg.replace(rerank_loop_candidates=k, rerank_set_reader=True,
                                                                      rerank_reach=0)
    return out


def variants(items: list[str]) -> dict:
    """{NAME: config} of ``--variant NAME=FIELD=VALUE[,FIELD=VALUE ...]``: ``rerank=True`` with the default loop and
    ``reranker_precision`` auto, then these settings (each value read as the field's type)."""
    from dataclasses import fields

    types = {f.name: f.type for f in fields(RetrievalConfig)}
    out = {}
    for item in items:
        name, _, rest = item.partition("=")
        changes = {"reranker_precision": "auto"}
        for part in filter(None, rest.split(",")):
            key, sep, value = part.partition("=")
            if not sep or key not in types:
                raise ValueError(f"{item}: {part!r} is not FIELD=VALUE of a RetrievalConfig field")
            kind = types[key] if isinstance(types[key], str) else types[key].__name__
            changes[key] = (value.lower() in ("1", "true", "yes") if kind == "bool" else
                            int(value) if kind == "int" else float(value) if kind == "float" else value)
        if not name:
            raise ValueError(f"{item}: give NAME=FIELD=VALUE")
        out[name] = RetrievalConfig(rerank=True).replace(**changes)
    return out


def score(ranked: list[list[str]], questions: list[dict]) -> dict:
    """recall@k and all-gold-in-top-k counts, overall and by number of gold passages."""
    groups: dict = {}
    for ids, q in zip(ranked, questions):
        gold = {str(g) for g in q["supporting_ids"]}
        if not gold:
            continue
        for key in ("all", f"{len(gold)} gold"):
            g = groups.setdefault(key, {"n": 0, **{f"recall@{k}": 0.0 for k in KS}, **{f"all@{k}": 0 for k in KS}})
            g["n"] += 1
            for k in KS:
                hit = len(gold & set(ids[:k]))
                g[f"recall@{k}"] += hit / len(gold)
                g[f"all@{k}"] += int(hit == len(gold))
    for g in groups.values():
        for k in KS:
            g[f"recall@{k}"] = round(100.0 * g[f"recall@{k}"] / g["n"], 2)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0])))


class PairCount:
    """Counts the (question, passage) pairs the cross-encoder is given (Reranker.pair_logits, its filling
    copies left out) while in a ``with`` block."""

    def __enter__(self):
        from linearrag_torch.rerank.scoring import Reranker

        self.pairs, self._cls, self._orig = 0, Reranker, Reranker.pair_logits

        def counted(reranker, q, p, q_of_pair, *args, **kw):
            self.pairs += q_of_pair.numel()
            return self._orig(reranker, q, p, q_of_pair, *args, **kw)

        Reranker.pair_logits = counted
        return self

    def __exit__(self, *exc):
        self._cls.pair_logits = self._orig


def run_set(rag, questions: list[dict], configs: dict, batch: int = 64) -> dict:
    texts = [q["question"] for q in questions]
    res = {}
    for name, cfg in configs.items():
        rag.retrieve(encode(rag, texts[:8], cfg), cfg)  # warm-up: models loaded, passages tokenised
        ranked, t0 = [], time.perf_counter()
        with PairCount() as count:
            for s in range(0, len(texts), batch):
                enc = encode(rag, texts[s:s + batch], cfg)
                hits = rag.hits(rag.retrieve(enc, cfg))
                ranked += [[str(h.id) for h in hs] for hs in hits]
        res[name] = {"ms_per_question": round(1000 * (time.perf_counter() - t0) / max(len(texts), 1), 1),
                     "pairs_per_question": round(count.pairs / max(len(texts), 1), 2),
                     **score(ranked, questions)}
        a = res[name]["all"]
        print(f"  {name:<8} R@2 {a['recall@2']:5.1f}  R@5 {a['recall@5']:5.1f}  all@2 {a['all@2']:4d}  "
              f"all@5 {a['all@5']:4d}  ({res[name]['ms_per_question']} ms/q, "
              f"{res[name]['pairs_per_question']} pairs/q)", file=sys.stderr)
    return res


def plot(path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results["datasets"])
    panels = [(f"recall@{k} (%)", lambda r, name, k=k: r[name]["all"][f"recall@{k}"]) for k in KS]
    panels.append(("ms per question / the graph's", lambda r, name: r[name]["ms_per_question"]
                   / max(r["graph"]["ms_per_question"], 1e-9)))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    names = list(next(iter(results["datasets"].values())))
    width = 0.8 / len(names)
    for ax, (label, value) in zip(axes[0], panels):
        for i, name in enumerate(names):
            ax.bar([j + i * width for j in range(len(sets))],
                   [value(results["datasets"][s], name) for s in sets], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets, fontsize=8)
        ax.set_ylabel(label)
    for ax in axes[0][:len(KS)]:
        ax.set_ylim(bottom=30)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"reranker in the chain rounds ({results['date']})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rerank_loop", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    data_set_arguments(ap, required=False)
    ap.add_argument("--train", type=Path, help="a `linearrag train-reranker` training file: measure its held-out "
                                                "questions (the fitting set) instead of --data")
    ap.add_argument("--heldout-corpus", action="store_true",
                    help="with --train: index only the held-out questions' own paragraphs (faster to build, easier)")
    ap.add_argument("--loop", nargs="+", type=int, default=[5, 10], help="rerank_loop_candidates compared (> 0)")
    ap.add_argument("--precisions", nargs="+", default=["float32"], choices=["float32", "bfloat16", "int8", "auto"],
                    help="reranker precisions compared (RetrievalConfig.reranker_precision)")
    ap.add_argument("--rerankers", nargs="+", default=[], metavar="NAME=DIR",
                    help="retrained rerankers compared beside the shipped one (systems rerank_NAME, loopK_NAME)")
    ap.add_argument("--final-candidates", nargs="+", type=int, default=[], metavar="K",
                    help="also rerank K candidates of the final list (rerank_candidates; systems ending in _cK)")
    ap.add_argument("--set-reader", action="store_true",
                    help="also each loop size with the set reader of each reranker folder (systems setK, setK_noreach)")
    ap.add_argument("--indexes", nargs="+", type=Path, default=[],
                    help="a built index per --data folder, in order (instead of building or taking one from --cache)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FIELD=VALUE[,FIELD=VALUE]",
                    help="also the system NAME: the default `rerank=True` (the loop) with these RetrievalConfig "
                         "settings (e.g. len8=rerank_length_step=8; auto precision unless a setting names it)")
    ap.add_argument("--only", nargs="+", default=[], metavar="SYSTEM", help="run only these systems (names as printed)")
    ap.add_argument("--batch", type=int, default=64, help="questions per call")
    ap.add_argument("--png", type=Path, help="write the plot here")
    args = ap.parse_args(argv)
    folders = list(args.data or [])
    if args.train:
        name = "train_heldout_own" if args.heldout_corpus else "train_heldout"
        folders = [fitting_set(args.train, args.cache / name, args.heldout_corpus)]
    if not folders:
        ap.error("give --data folders or --train FILE")
    check_data_folders(folders, ap.error)
    results = {"command": " ".join(["python", "-m", "benchmarks.rerank_loop"] + (argv or sys.argv[1:])),
               "date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads(), "datasets": {}}
    rerankers = {}
    for item in args.rerankers:
        name, sep, folder = item.partition("=")
        if not sep or not name or not Path(folder).is_dir():
            ap.error(f"--rerankers {item}: give NAME=DIR with an existing reranker folder")
        rerankers[name] = folder
    configs = systems(args.loop, args.precisions, rerankers, tuple(args.final_candidates), args.set_reader)
    try:
        configs.update(variants(args.variant))
    except ValueError as exc:
        ap.error(f"--variant: {exc}")
    if args.only:
        unknown = sorted(set(args.only) - set(configs))
        if unknown:
            ap.error(f"--only: no system {unknown}; the systems: {sorted(configs)}")
        configs = {k: v for k, v in configs.items() if k in args.only}
    if args.indexes and len(args.indexes) != len(folders):
        ap.error(f"--indexes: {len(args.indexes)} folders for {len(folders)} data folders")
    results["configs"] = {k: {f: v for f, v in c.to_dict().items() if f.startswith("rerank")} for k, c in configs.items()}
    for i, data in enumerate(folders):
        if args.indexes:
            from linearrag_torch import LinearRAG

            rag = LinearRAG.load(args.indexes[i])
        else:
            rag, _ = load_or_build(data / "corpus.jsonl", args.cache)
        results.setdefault("machine", machine_info(rag))
        print(f"{data.name}:", file=sys.stderr)
        results["datasets"][data.name] = run_set(rag, read_questions(str(data / "questions.jsonl")), configs, args.batch)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.png:
        plot(args.png, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
