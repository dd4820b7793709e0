"""Retrieval quality of LinearRAG (both activation modes, ablations) against dense and BM25 baselines.

    python -m benchmarks.quality --data /path/to/dataset [--json OUT] [--png OUT] [--cache DIR]
                                 [--limit N] [--modes reference paper dense ...]

DATA holds corpus.jsonl ({id, title, text}) and questions.jsonl ({id, question, answers,
supporting_ids, optional type}). The index is built once per corpus and index configuration and
cached (see benchmarks/README.md). Every system ranks all questions in ONE batched call, timed.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.api import resolve_device  # noqa: E402
from linearrag_torch.models.encoding import resolve_precision  # noqa: E402
from linearrag_torch.config import IndexConfig, RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.answers.scoring import answer_in_context, normalize_answer  # noqa: E402,F401
from linearrag_torch.queries import EncodedQueries, Retrieved  # noqa: E402

TOP_K = 10
DATA_SETS_HINT = ("the data sets are not in the repository: each is a folder with corpus.jsonl and questions.jsonl "
                  "(2wiki, hotpotqa_train100, musique_dev200 from the public HippoRAG / LinearRAG / MuSiQue releases; "
                  "docs/benchmarks/quality.md, 'Data sets', says where and how)")
RECALL_KS = (1, 2, 5, 10)
HOP_KS = (2, 5, 10)  # per-hop recall: is the gold passage at position j of supporting_ids in the top k
AIC_K = 5
DEFAULT_CACHE = Path("~/.cache/linearrag_torch/bench").expanduser()

# name -> (kind, RetrievalConfig overrides, IndexConfig overrides). kind "graph": rag.retrieve with the
# torch engine; "scipy": the numpy/scipy reference backend; "dense" / "bm25": baselines. The retrieval
# overrides apply to the current default RetrievalConfig, or to RetrievalConfig.reference_code() when
# they hold REFERENCE_CODE. A system with IndexConfig overrides runs on a second index built (and
# cached) with them. A system naming a field that this version of the package lacks is skipped.
REFERENCE_CODE = "__reference_code__"
SYSTEMS = {
    "reference": ("graph", {"mode": "reference"}, {}),
    "paper": ("graph", {"mode": "paper"}, {}),
    "no_activation": ("graph", {"mode": "reference", "use_activation": False}, {}),
    "no_ppr": ("graph", {"mode": "reference", "use_ppr": False}, {}),
    "no_lexicon": ("graph", {"mode": "reference", "lexicon_seeds": False}, {}),
    "no_title_entities": ("graph", {"mode": "reference"}, {"title_entities": False}),
    "reference_code": ("graph", {REFERENCE_CODE: True, "mode": "reference"}, {"title_entities": False}),
    "dense": ("dense", {}, {}),
    "bm25": ("bm25", {}, {}),
    "reference_scipy": ("scipy", {"mode": "reference"}, {}),
    "no_chain": ("graph", {"mode": "reference", "chain_passages": 0}, {}),
    "chain": ("graph", {"mode": "reference", "chain_passages": 2}, {}),
    "chain_s1": ("graph", {"mode": "reference", "chain_passages": 2, "chain_sentences": 1}, {}),
    "chain_scipy": ("scipy", {"mode": "reference", "chain_passages": 2}, {}),
    "no_chain_prior": ("graph", {"mode": "reference", "chain_prior_floor": -1.0, "chain_bridge_prior": False}, {}),
    "chain_floor_only": ("graph", {"mode": "reference", "chain_bridge_prior": False}, {}),
    "chain_bridge_only": ("graph", {"mode": "reference", "chain_prior_floor": -1.0}, {}),
    "no_pairs": ("graph", {"mode": "reference", "pair_candidates": 0}, {}),
    "pairs_no_link": ("graph", {"mode": "reference", "pair_link_weight": 0.0}, {}),
}

SYSTEM_HELP = {
    "reference": "LinearRAG, reference-code BFS activation + PPR (torch), current default settings",
    "paper": "LinearRAG, eq. 5 matrix activation + PPR (torch)",
    "no_activation": "seeds only (no propagation) + PPR",
    "no_ppr": "reference activation, ranked by the eq. 7 reset weight (no PPR)",
    "no_lexicon": "reference without lexicon seeds (question entities from spaCy NER only)",
    "no_title_entities": "reference on an index built with IndexConfig(title_entities=False)",
    "reference_code": "the reference code's settings: RetrievalConfig.reference_code() on an index without "
                      "title entities",
    "dense": "cosine of question and passage embeddings",
    "bm25": "bm25s (lucene, k1=1.5, b=0.75), lower-cased, English stopwords",
    "reference_scipy": "reference mode on the numpy/scipy backend",
    "no_chain": "reference, one round (chain_passages=0)",
    "chain": "reference with a second round seeded by the entities of the 2 best sentences of the first round's "
             "top 2 passages (chain_passages=2, chain_sentences=2)",
    "chain_s1": "chain with the best sentence only of each of those passages (chain_sentences=1)",
    "chain_scipy": "chain on the numpy/scipy backend",
    "no_chain_prior": "reference with the later rounds' eq. 7 prior as in the first (chain_prior_floor=-1, "
                      "no bridge-sentence cosines): the default before it",
    "chain_floor_only": "reference, later rounds' cosines floored at chain_prior_floor, no bridge-sentence cosines",
    "chain_bridge_only": "reference, later rounds' bridge-sentence cosines, no floor",
    "no_pairs": "reference without the pair rerank of the first two places (pair_candidates=0)",
    "pairs_no_link": "reference, the pair rerank without its shared-entity bonus (pair_link_weight=0)",
}


def system_config(name: str, default_cfg: RetrievalConfig):
    """The RetrievalConfig of a graph/scipy system (top_k = TOP_K), or None if it needs a field this
    RetrievalConfig lacks."""
    overrides = dict(SYSTEMS[name][1])
    base = default_cfg
    if overrides.pop(REFERENCE_CODE, False):
        if not hasattr(RetrievalConfig, "reference_code"):
            return None
        base = RetrievalConfig.reference_code()
    if set(overrides) - set(default_cfg.to_dict()):
        return None
    return base.replace(top_k=TOP_K, **overrides)


def index_config_for(name: str, base: IndexConfig | None = None):
    """The IndexConfig of a system's index (``base`` with the system's overrides), or None if IndexConfig
    lacks one of its fields."""
    overrides = SYSTEMS[name][2]
    if set(overrides) - set(IndexConfig().to_dict()):
        return None
    return dataclasses.replace(base or IndexConfig(), **overrides)


def _base_index_config(args) -> IndexConfig:
    """IndexConfig() with --encoder-precision when given."""
    precision = getattr(args, "encoder_precision", None)
    return IndexConfig() if precision is None else IndexConfig(encoder_precision=precision)


# ---------------------------------------------------------------------------------------- metrics
# normalize_answer / answer_in_context: linearrag_torch.answers.scoring (shared with benchmarks.qa)


def per_question_metrics(ranked_ids: list, gold: list, answers: list, passage_norm) -> dict:
    """recall@1..TOP_K (fractions; None without gold) and aic@5 for one question.
    ranked_ids: corpus ids (as str), best first. passage_norm: row/id -> normalised text (callable)."""
    out = {}
    gold_set = {str(g) for g in (gold or [])}
    if gold_set:
        for k in range(1, TOP_K + 1):
            out[f"recall@{k}"] = len(gold_set.intersection(ranked_ids[:k])) / len(gold_set)
        # per hop: the gold passage at position j of supporting_ids (hop order where the data keeps it)
        for j, g in enumerate(gold or []):
            for k in HOP_KS:
                out[f"hop{j + 1}@{k}"] = float(str(g) in ranked_ids[:k])
    ctx = " ".join(passage_norm(pid) for pid in ranked_ids[:AIC_K])
    out[f"aic@{AIC_K}"] = float(answer_in_context(answers, ctx))
    return out


def aggregate(rows: list[dict]) -> dict:
    """Mean of every metric over the questions that have it, in percent, with counts."""
    agg = {"n": len(rows)}
    keys = sorted({k for r in rows for k in r}, key=_metric_order)
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        agg[k] = round(100.0 * float(np.mean(vals)), 2) if vals else None
    agg["n_with_gold"] = sum(1 for r in rows if "recall@1" in r)
    return agg


def _metric_order(k: str):
    name, _, num = k.partition("@")
    return (name != "recall", name.startswith("hop"), int(num) if num.isdigit() else 0, name)


# ---------------------------------------------------------------------------------------- index cache
def data_set_arguments(ap, required: bool = True) -> None:
    """--data (folders with corpus.jsonl and questions.jsonl), --json and --cache, for the benchmarks that rank
    the dev sets' questions (rerank_headroom, rerank, rerank_loop)."""
    ap.add_argument("--data", required=required, nargs="+", type=Path,
                    help="folder(s) with corpus.jsonl and questions.jsonl (supporting_ids)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"index cache folder (default {DEFAULT_CACHE})")


def check_data_folders(folders, error) -> None:
    """Every folder's corpus.jsonl and questions.jsonl, checked before the first index loads (``error``: an
    argparse parser's error)."""
    for data in folders:
        for name in ("corpus.jsonl", "questions.jsonl"):
            if not (data / name).is_file():
                error(f"{data / name}: not found")


def cache_key(corpus_path: Path, index_config: IndexConfig) -> str:
    """sha256 of the corpus and the IndexConfig. encoder_precision enters resolved for this machine
    ("auto" = what LinearRAG.build would use here) and only when it is not float32, so that indexes
    cached before the setting existed (float32) keep their keys."""
    d = index_config.to_dict()
    precision = resolve_precision(d.pop("encoder_precision", "float32"), resolve_device("auto"))
    if precision != "float32":
        d["encoder_precision"] = precision
    if d.get("embedding_dtype") == "float32":  # likewise a later setting at its old behaviour
        del d["embedding_dtype"]
    if d.get("sentence_vectors") == "separate":
        del d["sentence_vectors"]
    h = hashlib.sha256()
    with open(corpus_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(b"\0")
    h.update(json.dumps(d, sort_keys=True).encode())
    return h.hexdigest()


def load_or_build(corpus_path: Path, cache_dir: Path, rebuild: bool = False, index_config: IndexConfig | None = None):
    """(rag, build_info). The index lives in cache_dir/<key[:24]>/index, build time in build.json."""
    index_config = index_config or IndexConfig()
    key = cache_key(corpus_path, index_config)
    folder = cache_dir / key[:24]
    index_dir, info_path = folder / "index", folder / "build.json"
    if not rebuild and index_dir.is_dir() and info_path.is_file():
        t0 = time.perf_counter()
        rag = LinearRAG.load(index_dir)
        info = json.loads(info_path.read_text())
        info.update(cached=True, load_s=round(time.perf_counter() - t0, 3), cache_dir=str(folder))
        print(f"[index] loaded from cache {folder} (built in {info.get('build_s')} s)", file=sys.stderr)
        return rag, info
    print(f"[index] building {corpus_path} -> {folder}", file=sys.stderr)
    t0 = time.perf_counter()
    rag = LinearRAG.build(str(corpus_path), index_config=index_config, progress=True)
    build_s = time.perf_counter() - t0
    folder.mkdir(parents=True, exist_ok=True)
    rag.save(index_dir)
    info = {
        "key": key,
        "corpus": str(corpus_path),
        "index_config": index_config.to_dict(),
        "build_s": round(build_s, 2),
        "built_at": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(rag),
    }
    tmp = info_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    os.replace(tmp, info_path)
    info.update(cached=False, cache_dir=str(folder))
    print(f"[index] built in {build_s:.1f} s", file=sys.stderr)
    return rag, info


def machine_info(rag=None) -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": str(rag.device) if rag is not None else None,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# ---------------------------------------------------------------------------------------- systems
def encode(rag, texts, cfg):
    """rag.encode_queries, passing the config where the API takes one (it decides lexicon seeds)."""
    import inspect

    if "config" in inspect.signature(rag.encode_queries).parameters:
        return rag.encode_queries(texts, cfg)
    return rag.encode_queries(texts)


def run_dense(rag, enc: EncodedQueries, k: int):
    emb = rag.index.passage_emb.to(rag.device)
    q = enc.query_emb.to(rag.device)
    t0 = time.perf_counter()
    sims = q @ emb.T  # [B, P] cosines (both sides L2-normalised)
    vals, idx = torch.sort(sims, dim=1, descending=True, stable=True)
    idx, vals = idx[:, :k].cpu(), vals[:, :k].cpu()
    return Retrieved(idx, vals), time.perf_counter() - t0


class BM25Baseline:
    def __init__(self, rag):
        import bm25s

        self.bm25s = bm25s
        t0 = time.perf_counter()
        texts = [rag.index.passage_text(i).lower() for i in range(rag.index.num_passages)]
        tokens = bm25s.tokenize(texts, lower=True, stopwords="en", return_ids=False, show_progress=False)
        self.retriever = bm25s.BM25()  # defaults: method lucene, k1 1.5, b 0.75
        self.retriever.index(tokens, show_progress=False)
        self.index_s = time.perf_counter() - t0

    def run(self, questions: list[str], k: int):
        t0 = time.perf_counter()
        qt = self.bm25s.tokenize([q.lower() for q in questions], lower=True, stopwords="en", return_ids=False,
                                 show_progress=False)
        # a question with no token left (all stopwords) gets an empty list: bm25s scores it 0 everywhere
        idx, scores = self.retriever.retrieve(qt, k=k, show_progress=False, n_threads=1)
        return Retrieved(torch.as_tensor(np.asarray(idx), dtype=torch.int64),
                         torch.as_tensor(np.asarray(scores), dtype=torch.float32)), time.perf_counter() - t0


# ---------------------------------------------------------------------------------------- torch vs scipy
def compare_backends(rag, enc, cfg, torch_out: Retrieved, scipy_out: Retrieved, max_details: int = 5) -> dict:
    """Top-5 agreement of the two backends; for a few disagreeing questions, full score vectors."""
    t5, s5 = torch_out.indices[:, :5].tolist(), scipy_out.indices[:, :5].tolist()
    same_order = [a == b for a, b in zip(t5, s5)]
    same_set = [set(a) == set(b) for a, b in zip(t5, s5)]
    rel = []
    for b, ok in enumerate(same_order):
        if ok:
            ts, ss = torch_out.scores[b, :5].double(), scipy_out.scores[b, :5].double()
            rel.append(float(((ts - ss).abs() / ss.abs().clamp_min(1e-30)).max()))
    result = {
        "top5_identical_fraction": round(float(np.mean(same_order)), 4) if same_order else None,
        "top5_same_set_fraction": round(float(np.mean(same_set)), 4) if same_set else None,
        "n_questions": len(same_order),
        "n_disagree": int(len(same_order) - sum(same_order)),
        "max_rel_score_diff_when_identical": max(rel) if rel else None,
    }
    bad = [b for b, ok in enumerate(same_order) if not ok][:max_details]
    if bad:
        P = rag.index.num_passages
        full = cfg.replace(top_k=P)
        sub = enc.select(bad)
        tt = rag.retrieve(sub, full, backend="torch")
        ss = rag.retrieve(sub, full, backend="scipy")
        seeds_t, seeds_s = _seed_sets(rag, sub, full)
        details = []
        for j, b in enumerate(bad):
            tv = torch.zeros(P, dtype=torch.float64)
            sv = torch.zeros(P, dtype=torch.float64)
            tv[tt.indices[j].cpu()] = tt.scores[j].cpu().double()
            sv[ss.indices[j].cpu()] = ss.scores[j].cpu().double()
            union = sorted(set(t5[b]) | set(s5[b]))
            relv = ((tv - sv).abs() / sv.abs().clamp_min(1e-30))[union]
            s_sorted = torch.sort(sv, descending=True).values
            gap = float((s_sorted[4] - s_sorted[5]) / s_sorted[4].abs().clamp_min(1e-30)) if P > 5 else None
            details.append({
                "question_row": b,
                "entities": [t for t, o in zip(enc.entity_text, enc.entity_owner.tolist()) if o == b],
                "torch_top5": [rag.index.passage_ids[i] for i in t5[b]],
                "scipy_top5": [rag.index.passage_ids[i] for i in s5[b]],
                "torch_top5_scores": [float(x) for x in tv[t5[b]]],
                "scipy_top5_scores": [float(x) for x in sv[s5[b]]],
                "max_rel_score_diff_on_top5_union": float(relv.max()),
                "scipy_rel_gap_5th_6th": gap,
                "within_1e-4_relative": bool(relv.max() <= 1e-4),
                "max_rel_score_diff_all_passages": float(
                    ((tv - sv).abs() / sv.abs().clamp_min(1e-12)).max()),
                "seeds_torch": seeds_t[j] if seeds_t else None,
                "seeds_scipy": seeds_s[j] if seeds_s else None,
                "same_seeds": (sorted(seeds_t[j]) == sorted(seeds_s[j])) if seeds_t and seeds_s else None,
            })
        result["disagreements"] = details
    return result


def _seed_sets(rag, enc, cfg):
    """Seed entities (eq. 3) per question on both backends, as {entity: score}; (None, None) if the
    internal functions are not available."""
    try:
        from linearrag_torch.retrieval import engine, scipy_backend
        from linearrag_torch.retrieval.activation import dense_seeds

        keys, vals, _ = engine.activate_pairs(rag.graph, enc.to(rag.device), cfg)
        seeds, is_seed = dense_seeds(keys, vals, rag.graph.entity_emb.shape[0], enc.batch_size)
        names = rag.index.entities
        st = [{names[e]: round(float(seeds[e, b]), 9) for e in torch.nonzero(is_seed[:, b]).flatten().tolist()}
              for b in range(enc.batch_size)]
        sd = scipy_backend.seeds(rag.index, enc.entity_emb.cpu().double().numpy(), enc.entity_owner.cpu().numpy(),
                             enc.batch_size)
        ss = [{names[e]: round(float(v), 9) for e, v in d.items()} for d in sd]
        return st, ss
    except Exception as exc:  # diagnostics only
        print(f"[warn] could not compare seeds: {exc}", file=sys.stderr)
        return None, None


# ---------------------------------------------------------------------------------------- main
def evaluate(name, out: Retrieved, rag, questions, norm_text) -> tuple[dict, dict, dict]:
    ids = rag.index.passage_ids
    rows = out.indices.cpu().tolist()
    per_q = []
    for q, row in zip(questions, rows):
        ranked = [str(ids[i]) for i in row if i >= 0]
        per_q.append(per_question_metrics(ranked, q.get("supporting_ids") or [], q.get("answers") or [], norm_text))
    return aggregate(per_q), group_by(questions, per_q, "type"), group_by(questions, per_q, "gold_quality")


def group_by(questions, per_q, field) -> dict:
    """Metrics per value of a question field ({} when no question has it)."""
    values = [q.get(field) for q in questions]
    if all(v is None for v in values):
        return {}
    groups = defaultdict(list)
    for v, r in zip(values, per_q):
        groups[f"(no {field})" if v is None else str(v)].append(r)
    return {v: aggregate(rs) for v, rs in sorted(groups.items())}


def fmt(v, w=7):
    return f"{v:>{w}.1f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>{w}}"


def print_table(title: str, systems: dict, key="overall", file=None):
    file = file or sys.stdout  # resolved at call time (tests capture it)
    hdr = f"{'system':<18}" + "".join(f"{'R@' + str(k):>7}" for k in RECALL_KS) + f"{'AiC@5':>7}{'ms/q':>9}{'n':>6}"
    print(f"\n{title}", file=file)
    print(hdr, file=file)
    print("-" * len(hdr), file=file)
    for name, s in systems.items():
        m = s[key]
        ms = s.get("retrieve_ms_per_question")
        print(f"{name:<18}" + "".join(fmt(m.get(f"recall@{k}")) for k in RECALL_KS) + fmt(m.get("aic@5"))
              + (f"{ms:>9.2f}" if ms is not None else f"{'-':>9}") + f"{m['n']:>6}", file=file)


def print_hop_table(systems: dict, file=None) -> None:
    """Recall@5 and @10 of the gold passage at each position of supporting_ids (hop 1, 2, ...)."""
    file = file or sys.stdout  # resolved at call time (tests capture it)
    hops = sorted({int(k[3:].partition("@")[0]) for s in systems.values() for k in s["overall"] if k.startswith("hop")})
    if not hops:
        return
    print("\nper hop (recall of the gold passage at position j of supporting_ids, @5 / @10; n = questions with hop j)",
          file=file)
    hdr = f"{'system':<18}" + "".join(f"{'hop' + str(j):>14}" for j in hops)
    print(hdr, file=file)
    print("-" * len(hdr), file=file)
    for name, s in systems.items():
        m = s["overall"]
        print(f"{name:<18}" + "".join(f"{fmt(m.get(f'hop{j}@5'), 6)} /{fmt(m.get(f'hop{j}@10'), 5)}" for j in hops),
              file=file)
    n = {j: next((s["hop_counts"].get(str(j)) for s in systems.values() if "hop_counts" in s), None) for j in hops}
    print(f"{'n':<18}" + "".join(f"{n[j] if n[j] is not None else '-':>14}" for j in hops), file=file)


def plot(path: Path, systems: dict, dataset: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = list(range(1, TOP_K + 1))
    for name, s in systems.items():
        ys = [s["overall"].get(f"recall@{k}") for k in ks]
        if any(y is None for y in ys):
            continue
        ax.plot(ks, ys, marker="o", ms=3, label=name, ls="--" if name.endswith("_scipy") else "-")
    ax.set_xlabel("k (passages retrieved)")
    ax.set_ylabel("recall@k (%)")
    ax.set_xticks(ks)
    ax.set_title(f"Passage recall@k, {dataset}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+",
                    help="folder(s) with corpus.jsonl and questions.jsonl; several run one after the other, "
                         "with results per set and a summary table (" + DATA_SETS_HINT + ")")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--png", type=Path, help="write the recall@k plot here")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"index cache folder (default {DEFAULT_CACHE})")
    ap.add_argument("--rebuild", action="store_true", help="build the index even when a cached one exists")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each system's batched call this many times and report the fastest (default 1)")
    ap.add_argument("--index-config", action="store_true",
                    help="use the RetrievalConfig stored with the (possibly cached) index instead of the "
                         "current defaults")
    ap.add_argument("--encoder-precision", choices=IndexConfig.__dataclass_fields__["encoder_precision"].metadata["choices"],
                    default=None, help="IndexConfig.encoder_precision of the indexes built (and cached); questions are "
                                       "encoded in float32 as LinearRAG does (default: IndexConfig's default)")
    ap.add_argument("--modes", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS), metavar="SYSTEM",
                    help=f"systems to run (default all): {', '.join(SYSTEMS)}")
    args = ap.parse_args(argv)
    if not args.data:  # argparse's "the following arguments are required" would not say where the data are
        ap.error(f"give --data DIR [DIR ...]: {DATA_SETS_HINT}")
    for data in args.data:
        for p in (data / "corpus.jsonl", data / "questions.jsonl"):
            if not p.is_file():
                ap.error(f"{p} does not exist")
    if len({d.name for d in args.data}) < len(args.data):
        ap.error("two --data folders have the same name")
    results = {}
    for data in args.data:
        try:
            results[data.name] = run_dataset(args, data, write=len(args.data) == 1)
        except NoQuestions:
            ap.error(f"{data}: no questions")
    if len(args.data) > 1:
        print_summary(results)
        if args.json:
            combined = {"datasets": results, "summary": summary(results), "date": _dt.datetime.now().isoformat(timespec="seconds")}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(combined, indent=2, default=str))
            print(f"\nwrote {args.json}")
        if args.png:
            for name, result in results.items():
                if result["has_passage_gold"]:
                    path = args.png.with_name(f"{args.png.stem}_{name}{args.png.suffix}")
                    plot(path, result["systems"], name)
                    print(f"wrote {path}")
    return 0


class NoQuestions(Exception):
    pass


SUMMARY_KS = (2, 5, 10)


def summary(results: dict) -> dict:
    """system -> dataset -> {recall@2/5/10, hop recall@5, ms/question} for a multi-set run."""
    out = defaultdict(dict)
    for name, result in results.items():
        for sname, s in result["systems"].items():
            m = s["overall"]
            row = {f"recall@{k}": m.get(f"recall@{k}") for k in SUMMARY_KS}
            row.update({k: v for k, v in m.items() if k.startswith("hop") and k.endswith("@5")})
            row["ms_per_question"] = s.get("retrieve_ms_per_question")
            out[sname][name] = row
    return dict(out)


def print_summary(results: dict, file=None) -> None:
    file = file or sys.stdout  # resolved at call time (tests capture it)
    table = summary(results)
    names = list(results)
    print(f"\nsummary: recall@2 / @5 / @10 (%) and ms per question, per set", file=file)
    hdr = f"{'system':<20}" + "".join(f"{n[:26]:>28}" for n in names)
    print(hdr, file=file)
    print("-" * len(hdr), file=file)
    for sname, per in table.items():
        cells = []
        for n in names:
            r = per.get(n)
            cells.append(f"{'-':>28}" if r is None else
                         f"{fmt(r['recall@2'], 6)}{fmt(r['recall@5'], 6)}{fmt(r['recall@10'], 6)}"
                         f"{r['ms_per_question'] or 0:>9.2f}ms")
        print(f"{sname:<20}" + "".join(cells), file=file)


def run_dataset(args, data: Path, write: bool = True) -> dict:
    """One dataset: every system of args.modes; prints its tables, and writes --json/--png if ``write``."""
    corpus_path, questions_path = data / "corpus.jsonl", data / "questions.jsonl"
    questions = read_questions(questions_path)
    if args.limit is not None:
        questions = questions[: args.limit]
    if not questions:
        raise NoQuestions(str(data))
    texts = [q["question"] for q in questions]
    has_gold = any(q.get("supporting_ids") for q in questions)
    hop_counts = {}
    for q in questions:
        for j in range(len(q.get("supporting_ids") or [])):
            hop_counts[str(j + 1)] = hop_counts.get(str(j + 1), 0) + 1

    base_icfg = _base_index_config(args)
    rag, build_info = load_or_build(corpus_path, args.cache.expanduser(), args.rebuild, index_config=base_icfg)
    index = rag.index
    ids = index.passage_ids
    id_to_row = {str(pid): i for i, pid in enumerate(ids)}
    norm_cache = {}

    def norm_text(pid: str) -> str:
        if pid not in norm_cache:
            row = id_to_row[pid]
            norm_cache[pid] = normalize_answer(f"{index.titles[row]} {index.texts[row]}")
        return norm_cache[pid]

    missing_gold = sorted({str(g) for q in questions for g in (q.get("supporting_ids") or [])} - set(id_to_row))
    if missing_gold:
        print(f"[warn] {len(missing_gold)} gold ids are not in the corpus (e.g. {missing_gold[:5]})", file=sys.stderr)

    # models loaded before timing, so that encoding time is NER + encoder only
    t0 = time.perf_counter()
    _ = rag.nlp, rag.encoder
    models_load_s = time.perf_counter() - t0
    default_cfg = RetrievalConfig()
    base_cfg = (rag.config if args.index_config else default_cfg).replace(top_k=TOP_K)
    if rag.config.replace(top_k=TOP_K) != default_cfg.replace(top_k=TOP_K):
        diff = {k: (v, default_cfg.to_dict().get(k)) for k, v in rag.config.to_dict().items()
                if k != "top_k" and v != default_cfg.to_dict().get(k)}
        print(f"[warn] the index's stored RetrievalConfig differs from the current defaults (stored, default): "
              f"{diff}; using the {'stored' if args.index_config else 'default'} one", file=sys.stderr)
    # one question first: loads lazily built parts (e.g. the entity lexicon for lexicon seeds)
    t0 = time.perf_counter()
    encode(rag, texts[:1], base_cfg)
    encode_warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc = encode(rag, texts, base_cfg)
    encode_s = time.perf_counter() - t0
    B = len(texts)
    n_no_entity = B - len(set(enc.entity_owner.tolist()))
    print(f"[encode] {B} questions in {encode_s:.2f} s ({1000 * encode_s / B:.2f} ms/question), "
          f"{len(enc.entity_text)} question entities, {n_no_entity} questions without entity", file=sys.stderr)

    # which systems run, with which config and index
    main_index_cfg = IndexConfig.from_dict(index.index_config.to_dict())
    plan = {}
    for n in args.modes:
        kind = SYSTEMS[n][0]
        cfg = None
        if kind in ("graph", "scipy"):
            cfg = system_config(n, default_cfg)
            if cfg is None:
                print(f"[skip] {n}: this RetrievalConfig has no field for it", file=sys.stderr)
                continue
            if args.index_config and not SYSTEMS[n][1].get(REFERENCE_CODE):
                cfg = base_cfg.replace(**{k: v for k, v in SYSTEMS[n][1].items() if k != REFERENCE_CODE})
        icfg = index_config_for(n, base_icfg) if SYSTEMS[n][2] else main_index_cfg
        if icfg is None:
            print(f"[skip] {n}: this IndexConfig has no field {sorted(SYSTEMS[n][2])}", file=sys.stderr)
            continue
        plan[n] = (kind, cfg, icfg)
    wanted = list(plan)

    # the indexes: the main one, plus one per other IndexConfig (built or loaded from the cache)
    indexes = {}  # json(IndexConfig) -> dict(rag, info, enc, encode_s, graph_prepare_s)

    def index_entry(icfg: IndexConfig):
        key = json.dumps(icfg.to_dict(), sort_keys=True)
        if key not in indexes:
            if icfg.to_dict() == main_index_cfg.to_dict():
                indexes[key] = {"rag": rag, "info": build_info, "encs": {}}
            else:
                r, info = load_or_build(corpus_path, args.cache.expanduser(), args.rebuild, index_config=icfg)
                _ = r.nlp, r.encoder
                indexes[key] = {"rag": r, "info": info, "encs": {}}
        return indexes[key]

    def queries_for(entry, cfg):
        """Encoded questions for this index and question-entity setting: (enc, encode_s or None if shared)."""
        lex = bool(getattr(cfg, "lexicon_seeds", False)) if cfg is not None else None
        if entry["rag"] is rag and lex == bool(getattr(base_cfg, "lexicon_seeds", False)):
            return enc, None
        if lex not in entry["encs"]:
            encode(entry["rag"], texts[:1], cfg)  # warm-up, as for the main encoding
            t0 = time.perf_counter()
            e = encode(entry["rag"], texts, cfg)
            entry["encs"][lex] = (e, time.perf_counter() - t0)
        return entry["encs"][lex]

    def prepare(entry, cfg):
        if "graph_prepare_s" not in entry:
            r = entry["rag"]
            t0 = time.perf_counter()
            r.graph.ppr_graph(cfg.adjacent_passages)
            e, _ = queries_for(entry, cfg)
            r.retrieve(e.select([0]), cfg)  # warm-up, not counted in any system's time
            entry["graph_prepare_s"] = time.perf_counter() - t0
        return entry["graph_prepare_s"]

    graph_prepare_s = None
    if any(plan[n][0] == "graph" for n in wanted) or "reference_scipy" in wanted:
        graph_prepare_s = prepare(index_entry(main_index_cfg), base_cfg)

    systems, outputs = {}, {}
    bm25_index_s = None
    for name in wanted:
        kind, cfg, icfg = plan[name]
        print(f"[run] {name} ...", file=sys.stderr, flush=True)
        extra = {}
        entry = index_entry(icfg)
        sys_rag = entry["rag"]
        if sys_rag is not rag:
            extra["index"] = {"index_config": icfg.to_dict(), "summary": sys_rag.index.summary(),
                              "build_s": entry["info"].get("build_s"), "cached": entry["info"].get("cached")}
        if kind in ("graph", "scipy"):
            backend = "torch" if kind == "graph" else "scipy"
            if kind == "graph":
                prepare(entry, cfg)
            sys_enc, sys_encode_s = queries_for(entry, cfg)
            if sys_encode_s is not None:  # encoded separately (other index or other question entities)
                extra["encode_ms_per_question"] = round(1000 * sys_encode_s / B, 3)
                extra["n_question_entities"] = len(sys_enc.entity_text)

            def call(sys_enc=sys_enc, cfg=cfg, backend=backend, sys_rag=sys_rag):
                t0 = time.perf_counter()
                o = sys_rag.retrieve(sys_enc, cfg, backend=backend)
                return o, time.perf_counter() - t0
        elif kind == "dense":
            def call():
                return run_dense(rag, enc, TOP_K)
            cfg_d = {"method": "cosine(question, passage) over rag.index.passage_emb", "top_k": TOP_K}
        else:
            bm = BM25Baseline(rag)
            bm25_index_s = bm.index_s

            def call():
                return bm.run(texts, TOP_K)
            extra["index_s"] = round(bm.index_s, 3)
            cfg_d = {"method": "bm25s lucene", "k1": bm.retriever.k1, "b": bm.retriever.b,
                     "tokenizer": "bm25s.tokenize, lower-cased, stopwords=en, no stemming",
                     "text": "title + newline + text", "top_k": TOP_K}
        times = []
        for _ in range(max(1, args.repeat)):
            out, t = call()
            times.append(t)
        elapsed = min(times)
        outputs[name] = (out, cfg)
        overall, per_type, per_quality = evaluate(name, out, sys_rag, questions, norm_text)
        systems[name] = {
            "description": SYSTEM_HELP[name],
            "config": cfg.to_dict() if cfg is not None else cfg_d,
            "overall": overall,
            "per_type": per_type,
            "hop_counts": hop_counts,
            **({"per_gold_quality": per_quality} if per_quality else {}),
            "retrieve_s": round(elapsed, 4),
            "retrieve_s_all": [round(t, 4) for t in times],
            "retrieve_ms_per_question": round(1000 * elapsed / B, 3),
            **extra,
        }
        print(f"[run] {name}: {elapsed:.3f} s ({1000 * elapsed / B:.2f} ms/question)", file=sys.stderr, flush=True)

    agreement = None
    if "reference_scipy" in outputs:
        scipy_cfg = outputs["reference_scipy"][1]
        if "reference" in outputs and outputs["reference"][1] == scipy_cfg:
            torch_out = outputs["reference"][0]
        else:
            torch_out = rag.retrieve(enc, scipy_cfg)
        agreement = compare_backends(rag, enc, scipy_cfg, torch_out, outputs["reference_scipy"][0])
        for d in agreement.get("disagreements", []):
            d["question"] = texts[d["question_row"]]
            d["question_id"] = questions[d["question_row"]].get("id")

    chain_agreement = None
    if "chain_scipy" in outputs:
        scipy_cfg = outputs["chain_scipy"][1]
        torch_out = outputs["chain"][0] if "chain" in outputs and outputs["chain"][1] == scipy_cfg \
            else rag.retrieve(enc, scipy_cfg)
        chain_agreement = compare_backends(rag, enc, scipy_cfg, torch_out, outputs["chain_scipy"][0], max_details=0)
        print(f"\ntorch vs scipy (chain): identical top-5 for {100 * chain_agreement['top5_identical_fraction']:.1f}% "
              f"of questions (same set: {100 * chain_agreement['top5_same_set_fraction']:.1f}%)")

    result = {
        "dataset": str(data),
        "dataset_name": data.name,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(rag),
        "index": {"summary": index.summary(), "build_s": build_info.get("build_s"),
                  "cached": build_info.get("cached"), "load_s": build_info.get("load_s"),
                  "cache_dir": build_info.get("cache_dir"),
                  "index_config": index.index_config.to_dict()},
        "n_questions": B,
        "has_passage_gold": has_gold,
        "n_questions_without_entity": n_no_entity,
        "models_load_s": round(models_load_s, 3),
        "graph_prepare_s": round(graph_prepare_s, 3) if graph_prepare_s is not None else None,
        "encode_warmup_s": round(encode_warmup_s, 3),
        "encode_s": round(encode_s, 3),
        "encode_ms_per_question": round(1000 * encode_s / B, 3),
        "config": default_cfg.to_dict(),
        "config_source": "index" if args.index_config else "defaults",
        "base_config": base_cfg.to_dict(),
        "index_stored_config": rag.config.to_dict(),
        "n_question_entities": len(enc.entity_text),
        "top_k": TOP_K,
        "repeat": args.repeat,
        "systems": systems,
        "torch_scipy_top5_agreement": agreement,
        "chain_torch_scipy_top5_agreement": chain_agreement,
    }
    if bm25_index_s is not None:
        result["bm25_index_s"] = round(bm25_index_s, 3)

    # ------------------------------------------------------------------ report
    ix = index.summary()
    print(f"\n{data.name}: {B} questions, {ix['passages']} passages, {ix['sentences']} sentences, "
          f"{ix['entities']} entities; device {rag.device}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"index build {build_info.get('build_s')} s{' (cached)' if build_info.get('cached') else ''}; "
          f"encode {1000 * encode_s / B:.2f} ms/question; graph prepare {graph_prepare_s or 0:.2f} s")
    for n, sd in systems.items():
        if "index" in sd:
            print(f"{n}: own index {sd['index']['index_config']} ({sd['index']['summary']['entities']} entities), "
                  f"build {sd['index']['build_s']} s{' (cached)' if sd['index']['cached'] else ''}, "
                  f"encode {sd.get('encode_ms_per_question')} ms/question")
    if not has_gold:
        print("no passage-level gold: recall columns are empty, answer-in-context only")
    print_table("overall (recall and AiC in %, ms/q = one batched retrieve call / questions)", systems)
    types = sorted({t for s in systems.values() for t in s["per_type"]})
    for t in types:
        sub = {n: {**s, "overall": s["per_type"][t]} for n, s in systems.items() if t in s["per_type"]}
        print_table(f"type = {t}", sub)
    print_hop_table(systems)
    qualities = sorted({t for s in systems.values() for t in s.get("per_gold_quality", {})})
    for t in qualities:
        sub = {n: {**s, "overall": s["per_gold_quality"][t]} for n, s in systems.items()
               if t in s.get("per_gold_quality", {})}
        print_table(f"gold_quality = {t}", sub)
    if agreement is not None:
        print(f"\ntorch vs scipy (reference mode): identical top-5 for {100 * agreement['top5_identical_fraction']:.1f}% "
              f"of questions (same set: {100 * agreement['top5_same_set_fraction']:.1f}%), "
              f"max relative score diff where identical: {agreement['max_rel_score_diff_when_identical']}")
        for d in agreement.get("disagreements", []):
            print(f"  q{d['question_row']}: torch {d['torch_top5']} vs scipy {d['scipy_top5']}; "
                  f"max rel diff {d['max_rel_score_diff_on_top5_union']:.2e}, scipy 5th/6th gap "
                  f"{d['scipy_rel_gap_5th_6th']:.2e}, same seeds: {d['same_seeds']}")
            if d["same_seeds"] is False:
                print(f"      seeds torch {d['seeds_torch']} vs scipy {d['seeds_scipy']}")

    if write and args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"\nwrote {args.json}")
    if write and args.png:
        if has_gold:
            plot(args.png, systems, data.name)
            print(f"wrote {args.png}")
        else:
            print("no passage gold: no recall plot", file=sys.stderr)
    return result


if __name__ == "__main__":
    sys.exit(main())
