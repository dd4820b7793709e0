"""Half-precision embedding storage (IndexConfig.embedding_dtype) beside float32, on the shared dev sets.

    python -m benchmarks.half_precision [--data DIR ...] [--json OUT] [--png OUT] [--threads N]

For each dataset (corpus.jsonl + questions.jsonl; default: the three shared dev sets) the float32 index (encoder
in float32 too) is built once into the benchmarks.quality cache. It is copied
and converted (TriGraphIndex.with_embedding_dtype, what `linearrag convert` runs) to float16 and bfloat16 in
a temporary folder, never changed in place. Each variant is then measured with the default RetrievalConfig:

    float32          the index as built
    float16 / bf16   the converted index, its vectors kept half on the device where the CPU multiplies that
                     dtype natively (env.native_half; the products in that dtype, results float32)
    *_upcast         the same index with DeviceGraph(upcast=True): float32 in memory, float32 products

and for each: recall@1/2/5/10 (benchmarks.quality's metrics), top-5 agreement with float32, bytes per
passage on disk (the folder, and the tensors file's embeddings vs the rest) and in memory (the query
tensors, DeviceGraph.nbytes), load time (TriGraphIndex.load with sha256 verification, min of 3), the
batched retrieval of all questions (min of --repeat) and batch-1 retrieval (mean over --single
questions). Question encoding is timed apart and not in the query times. Times are wall clock and CPU
time of this process; on a shared machine say "under load".
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.common import machine  # noqa: E402
from benchmarks.quality import DEFAULT_CACHE, TOP_K, cache_key, encode, evaluate, load_or_build  # noqa: E402
from linearrag_torch import LinearRAG  # noqa: E402
from linearrag_torch.config import IndexConfig, RetrievalConfig  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.retrieval.engine import DeviceGraph, native_half  # noqa: E402
from linearrag_torch.index import TriGraphIndex  # noqa: E402
from linearrag_torch.index.graph import EMBEDDING_TORCH_DTYPES  # noqa: E402
from linearrag_torch.index.layout import EMBEDDINGS  # noqa: E402
from linearrag_torch.answers.scoring import normalize_answer  # noqa: E402

DATASETS = Path("/work/shared/datasets")
DEFAULT_DATA = [DATASETS / n for n in ("hotpotqa_train100", "musique_dev200", "2wiki")]
VARIANTS = (("float32", "float32", None), ("float16", "float16", None), ("float16_upcast", "float16", True),
            ("bfloat16", "bfloat16", None), ("bfloat16_upcast", "bfloat16", True))
RECALLS = ("recall@1", "recall@2", "recall@5", "recall@10")
TOLERANCE = 0.3  # points of recall@5 a half variant may lose to be offered as a default


def folder_bytes(path: Path) -> dict:
    """Bytes of the index folder's files: total, tensors file, and within it the embeddings and the rest."""
    meta = json.loads((path / "index.json").read_text())
    tensors_file = path / meta["files"]["tensors"]
    total = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    from safetensors import safe_open

    emb = 0
    with safe_open(str(tensors_file), "pt") as fh:
        for name in EMBEDDINGS:
            t = fh.get_slice(name)
            n = 1
            for d in t.get_shape():
                n *= d
            emb += n * EMBEDDING_TORCH_DTYPES[meta["index_config"].get("embedding_dtype", "float32")].itemsize
    return {"folder": total, "tensors_file": tensors_file.stat().st_size, "embeddings": emb,
            "tensors_other": tensors_file.stat().st_size - emb, "strings_and_json": total - tensors_file.stat().st_size}


def clock(fn):
    """(result, wall seconds, CPU seconds of this process)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def top5_agreement(a, b) -> float:
    return float((a.indices[:, :5] == b.indices[:, :5]).all(dim=1).float().mean())


def run_dataset(data: Path, args, workdir: Path, models: dict) -> dict:
    name = data.name
    questions = read_questions(data / "questions.jsonl")
    if args.limit:
        questions = questions[: args.limit]
    texts = [q["question"] for q in questions]
    # the exact float32 build (encoder in float32 too: only the storage differs), built once into
    # benchmarks.quality's cache
    exact = IndexConfig(encoder_precision="float32")
    load_or_build(data / "corpus.jsonl", DEFAULT_CACHE, index_config=exact)
    src = DEFAULT_CACHE / cache_key(data / "corpus.jsonl", exact)[:24] / "index"
    print(f"[{name}] float32 index {src}", file=sys.stderr, flush=True)
    base = TriGraphIndex.load(src)
    folders = {"float32": src}
    convert_s = {}
    for dt in ("float16", "bfloat16"):
        out = workdir / f"{name}_{dt}"
        shutil.rmtree(out, ignore_errors=True)
        _, w, _ = clock(lambda: TriGraphIndex.load(src).with_embedding_dtype(dt).save(out))
        folders[dt], convert_s[dt] = out, round(w, 3)
    cfg = RetrievalConfig().replace(top_k=TOP_K)
    P = base.num_passages
    norm = {}

    def norm_text(pid: str) -> str:
        if pid not in norm:
            row = id_row[pid]
            norm[pid] = normalize_answer(f"{base.titles[row]} {base.texts[row]}")
        return norm[pid]

    ids = [str(p) for p in base.passage_ids]
    id_row = {p: i for i, p in enumerate(ids)}
    result = {"passages": P, "sentences": base.num_sentences, "entities": base.num_entities, "questions": len(texts),
              "convert_s": convert_s, "variants": {}}
    encoded, outputs = {}, {}
    for variant, dt, upcast in VARIANTS:
        folder = folders[dt]
        loads = [clock(lambda: TriGraphIndex.load(folder))[1] for _ in range(3)]
        index = TriGraphIndex.load(folder)
        assert index.index_config.embedding_dtype == dt, (folder, index.index_config.embedding_dtype)
        rag = LinearRAG(index, "cpu", models.get("nlp"), models.get("encoder"))
        models["nlp"], models["encoder"] = rag.nlp, rag.encoder
        graph, graph_s, _ = clock(lambda: DeviceGraph(index, "cpu", upcast=upcast))
        rag._graph = graph
        if dt not in encoded:  # the questions' known entities take this index's stored vectors
            encode(rag, texts[:1], cfg)
            enc, enc_s, _ = clock(lambda: encode(rag, texts, cfg))
            encoded[dt] = (enc, enc_s)
        enc, enc_s = encoded[dt]
        rag.retrieve(enc.select([0]), cfg)  # warm-up (PageRank operator, lazily built parts)
        batch = [clock(lambda: rag.retrieve(enc, cfg)) for _ in range(args.repeat)]
        out = min(batch, key=lambda r: r[1])[0]
        n1 = min(args.single, len(texts))
        singles = [clock(lambda i=i: rag.retrieve(enc.select([i]), cfg)) for i in range(n1)]
        overall, _, _ = evaluate(variant, out, rag, questions, norm_text)
        outputs[variant] = out
        on_disk = folder_bytes(folder)
        result["variants"][variant] = {
            "embedding_dtype": dt,
            "query_dtype": str(graph.passage_emb.dtype).removeprefix("torch."),
            "native_half": native_half(EMBEDDING_TORCH_DTYPES[dt], "cpu") if dt != "float32" else None,
            **{k: overall.get(k) for k in RECALLS},
            "aic@5": overall.get("aic@5"),
            "top5_identical_to_float32": None if variant == "float32" else round(top5_agreement(out, outputs["float32"]), 4),
            "bytes_per_passage": {k: round(v / P, 1) for k, v in on_disk.items()},
            "memory_bytes_per_passage": round(graph.nbytes() / P, 1),
            "memory_embedding_bytes_per_passage": round(
                sum(t.numel() * t.element_size() for t in (graph.passage_emb, graph.sentence_emb, graph.entity_emb)) / P, 1),
            "load_s": round(min(loads), 4),
            "device_graph_s": round(graph_s, 4),
            "encode_ms_per_question": round(1e3 * enc_s / len(texts), 3),
            "batch_ms_per_question": round(1e3 * min(b[1] for b in batch) / len(texts), 3),
            "batch_cpu_ms_per_question": round(1e3 * min(b[2] for b in batch) / len(texts), 3),
            "single_ms": round(1e3 * sum(s[1] for s in singles) / max(n1, 1), 3),
            "single_cpu_ms": round(1e3 * sum(s[2] for s in singles) / max(n1, 1), 3),
        }
        v = result["variants"][variant]
        print(f"[{name}] {variant:16s} R@2 {v['recall@2']:6.2f} R@5 {v['recall@5']:6.2f} R@10 {v['recall@10']:6.2f} "
              f"disk {v['bytes_per_passage']['folder']:9,.0f} B/passage  memory {v['memory_bytes_per_passage']:9,.0f} "
              f"load {v['load_s']:.3f} s  batch {v['batch_ms_per_question']:.2f} ms/q  single {v['single_ms']:.2f} ms",
              file=sys.stderr, flush=True)
    f32 = result["variants"]["float32"]
    for v in result["variants"].values():
        v["recall@5_minus_float32"] = round(v["recall@5"] - f32["recall@5"], 2)
    return result


def verdict(results: dict) -> dict:
    """Per half variant: the largest loss of recall@5 against float32 over the datasets, and whether it is
    within TOLERANCE points on every one."""
    out = {}
    for variant, _, _ in VARIANTS[1:]:
        losses = [-r["variants"][variant]["recall@5_minus_float32"] for r in results.values()]
        out[variant] = {"max_recall@5_loss": round(max(losses), 2), f"within_{TOLERANCE}": max(losses) <= TOLERANCE}
    return out


def plot(path: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(results)
    variants = [v for v, _, _ in VARIANTS]
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(names))]
        axes[0].bar(xs, [results[n]["variants"][v]["recall@5"] for n in names], width, label=v)
        axes[1].bar(xs, [results[n]["variants"][v]["bytes_per_passage"]["folder"] / 1e3 for n in names], width, label=v)
    for ax, title in zip(axes, ("recall@5 (%)", "index folder, KB per passage")):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    lo = min(results[n]["variants"][v]["recall@5"] for n in names for v in variants)
    axes[0].set_ylim(max(0, lo - 10), None)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.half_precision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+", default=DEFAULT_DATA,
                    help="dataset folders (corpus.jsonl, questions.jsonl); default the three shared dev sets")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/half_precision.json"))
    ap.add_argument("--png", default="benchmarks/results/half_precision.png", help="the plot ('' for none)")
    ap.add_argument("--limit", type=int, help="only the first N questions of each set")
    ap.add_argument("--repeat", type=int, default=3, help="batched retrievals per variant, the fastest reported")
    ap.add_argument("--single", type=int, default=50, help="questions retrieved one at a time per variant")
    ap.add_argument("--threads", type=int, help="torch threads (default torch's)")
    ap.add_argument("--under-load", action="store_true", help="record that other work shared the CPU")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models, results = {}, {}
    with tempfile.TemporaryDirectory(prefix="half_precision_") as tmp:
        for data in args.data:
            results[data.name] = run_dataset(data, args, Path(tmp), models)
    out = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "under_load": args.under_load,
           "machine": machine(torch.device("cpu"), torch.get_num_threads()),
           "native_half_cpu": {dt: native_half(EMBEDDING_TORCH_DTYPES[dt], "cpu") for dt in ("float16", "bfloat16")},
           "tolerance_recall@5_points": TOLERANCE, "verdict": verdict(results), "datasets": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    if args.png:
        plot(Path(args.png), results)
        print(f"wrote {args.png}", file=sys.stderr)
    print(json.dumps(out["verdict"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
