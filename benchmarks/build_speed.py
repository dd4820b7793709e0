"""How long indexing takes, stage by stage, in float32 and in bfloat16 (IndexConfig.encoder_precision).

    python -m benchmarks.build_speed --data DIR [DIR ...] [--precisions float32 bfloat16]
                                     [--json OUT] [--png OUT] [--no-command] [--threads N]

For each DATA folder (corpus.jsonl) and each precision:
  * stages: the models loaded (spaCy, encoder), then build_index with its ``timings`` (NER, graph, counts,
    embed passages / sentences / entities), in this process, with the number of texts of each stage;
  * command: the whole `linearrag index CORPUS OUT --encoder-precision P --quiet` in a fresh process
    (interpreter start, imports, model loads, build, atomic write), wall clock.
Per stage, how far it is from the machine's limit (benchmarks/arithmetic.py): the encoder's GFLOP/s in each embed
stage against a matmul peak of the transformer's shapes in the same precision, measured here; NER's words per second.
Then the indexes are compared: the command's index against the in-process one of the same precision
(same strings and matrices, largest embedding difference), and bf16 against float32 (strings and matrices
equal, least cosine of the vectors). The load average before and after each run is recorded: figures
taken with other work on the cores are "under load".
Writes JSON (default benchmarks/results/build_speed_cpu.json) and a plot beside it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks import arithmetic  # noqa: E402
from benchmarks.common import log, machine  # noqa: E402
from linearrag_torch.indexing.build import build_index  # noqa: E402
from linearrag_torch.config import ENCODER_PRECISIONS, IndexConfig  # noqa: E402
from linearrag_torch.corpus import read_corpus  # noqa: E402
from linearrag_torch.models.encoding import Encoder, native_bf16  # noqa: E402
from linearrag_torch.index import TriGraphIndex  # noqa: E402
from linearrag_torch.models.nlp import load_spacy  # noqa: E402

RESULTS = Path(__file__).parent / "results"
STAGES = ("load_spacy", "load_encoder", "ner", "graph", "counts", "embed_passages", "embed_sentences", "embed_entities")
MATRICES = ("M", "C", "N", "PS")
VECTORS = ("passage_emb", "sentence_emb", "entity_emb")


def load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def stages(corpus: Path, precision: str, progress: bool, sentence_vectors: str = "separate"
           ) -> tuple[dict, TriGraphIndex]:
    """Seconds per stage of an in-process build, and the index."""
    cfg = IndexConfig(encoder_precision=precision, sentence_vectors=sentence_vectors)
    passages = read_corpus(corpus)
    t = {}
    t0 = time.perf_counter()
    nlp = load_spacy(cfg.spacy_model)
    t["load_spacy"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    encoder = Encoder(cfg.encoder, "cpu", cfg.max_length, cfg.batch_size, precision=precision)
    t["load_encoder"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = build_index(passages, cfg, device="cpu", progress=progress, nlp=nlp, encoder=encoder, timings=t)
    t["build"] = time.perf_counter() - t0
    t["total"] = t["build"] + t["load_spacy"] + t["load_encoder"]
    stages.encoder = encoder  # efficiency() counts its tokens
    return {k: round(v, 3) for k, v in t.items()}, index


_PEAKS: dict = {}


def efficiency(index: TriGraphIndex, encoder, t: dict, precision: str) -> dict:
    """Per stage, how far it is from the machine's limit (benchmarks/arithmetic.py): each embed stage's encoder
    GFLOP/s against the matmul peak of the transformer's shapes in ``precision`` (measured here once per
    precision), and NER's words per second."""
    layers, hidden, inter = arithmetic.model_shape(encoder)
    if precision not in _PEAKS:
        _PEAKS[precision] = arithmetic.matmul_peak(precision, hidden, inter)
    peak = _PEAKS[precision]
    texts = [index.passage_text(i) for i in range(index.num_passages)]
    one_pass = index.index_config.sentence_vectors == "passage"
    lengths = {"embed_passages": (arithmetic.window_lengths(encoder.tokenizer, texts, encoder.max_length) if one_pass
                                  else arithmetic.token_lengths(encoder.tokenizer, texts, encoder.max_length)),
               "embed_sentences": [] if one_pass else arithmetic.token_lengths(
                   encoder.tokenizer, sorted(set(index.sentences)), encoder.max_length),
               "embed_entities": arithmetic.token_lengths(encoder.tokenizer, index.entities, encoder.max_length)}
    out = {"matmul_peak_gflops": round(peak / 1e9, 2), "precision": precision}
    for name, lens in lengths.items():
        if t.get(name) and lens:
            flops = arithmetic.encoder_flops(lens, layers, hidden, inter)
            out[name] = {"gflop": round(flops / 1e9, 2), "gflops": round(flops / t[name] / 1e9, 2),
                         "fraction_of_peak": round(flops / t[name] / peak, 3), "tokens": sum(lens)}
    if t.get("ner"):
        w = arithmetic.words(texts)
        out["ner"] = {"words": w, "words_per_s": round(w / t["ner"], 1)}
    return out


def command(corpus: Path, precision: str, out: Path, sentence_vectors: str = "separate") -> float:
    """Wall seconds of the whole `linearrag index` command in a fresh process."""
    cmd = [sys.executable, "-m", "linearrag_torch.cli", "index", str(corpus), str(out),
           "--encoder-precision", precision, "--sentence-vectors", sentence_vectors, "--quiet"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return round(seconds, 2)


def same_graph(a: TriGraphIndex, b: TriGraphIndex) -> bool:
    """Equal strings and sparse matrices (the vectors aside)."""
    if (a.passage_ids, a.titles, a.texts, a.sentences, a.entities) != (b.passage_ids, b.titles, b.texts,
                                                                         b.sentences, b.entities):
        return False
    for name in MATRICES:
        x, y = getattr(a, name), getattr(b, name)
        if x.shape != y.shape or not all(torch.equal(u, v) for u, v in zip((x.crow, x.col, x.val), (y.crow, y.col, y.val))):
            return False
    return True


def vector_gap(a: TriGraphIndex, b: TriGraphIndex) -> dict:
    """Per kind of vector: the largest absolute difference and the least cosine."""
    out = {}
    for name in VECTORS:
        x, y = getattr(a, name).float(), getattr(b, name).float()
        out[name] = {"max_abs_diff": float((x - y).abs().max()) if x.numel() else 0.0,
                     "min_cosine": float((x * y).sum(1).min()) if x.numel() else 1.0}
    return out


def run(args) -> dict:
    result = {"date": _dt.datetime.now().isoformat(timespec="seconds"),
              "machine": {**machine(torch.device("cpu"), torch.get_num_threads()), "native_bf16": native_bf16("cpu")},
              "note": "wall seconds; 'load' is the 1/5/15-minute load average before and after each run: above "
                      "the core count, other work shared the cores (figures under load)",
              "datasets": {}}
    for data in args.data:
        corpus = data / "corpus.jsonl"
        entry = {"corpus": str(corpus), "runs": {}}
        indexes = {}
        with tempfile.TemporaryDirectory(prefix="build_speed_") as tmp:
            for precision in args.precisions:
                log(f"[{data.name}] {precision}: stages ...")
                before = load()
                t, index = stages(corpus, precision, args.progress, args.sentence_vectors)
                counts = {"passages": index.num_passages, "sentences": index.num_sentences, "entities": index.num_entities}
                row = {"stages": t, "counts": counts, "stored_precision": index.index_config.encoder_precision,
                       "rates": {f"embed_{k}": round(counts[k] / t[f"embed_{k}"], 1) for k in
                                 ("passages", "sentences", "entities") if t.get(f"embed_{k}")},
                       "load_stages": [before, load()],
                       "efficiency": efficiency(index, stages.encoder, t, precision)}
                log(f"[{data.name}] {precision}: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()))
                if args.command:
                    out = Path(tmp) / precision
                    before = load()
                    row["command_s"] = command(corpus, precision, out, args.sentence_vectors)
                    row["load_command"] = [before, load()]
                    log(f"[{data.name}] {precision}: `linearrag index` {row['command_s']:.1f} s")
                    cli_index = TriGraphIndex.load(out)
                    row["command_vs_stages"] = {"same_graph": same_graph(cli_index, index),
                                                "vectors": vector_gap(cli_index, index)}
                entry["runs"][precision] = row
                indexes[precision] = index
        if "float32" in indexes and "bfloat16" in indexes:
            entry["bfloat16_vs_float32"] = {"same_graph": same_graph(indexes["bfloat16"], indexes["float32"]),
                                            "vectors": vector_gap(indexes["bfloat16"], indexes["float32"])}
        runs = entry["runs"]
        if "float32" in runs and "bfloat16" in runs:
            entry["speedup"] = {k: round(runs["float32"][key][k] / runs["bfloat16"][key][k], 2)
                                for key, k in [("stages", "total")] + [("stages", s) for s in STAGES if s.startswith("embed")]
                                if runs["bfloat16"][key].get(k)}
            if args.command:
                entry["speedup"]["command"] = round(runs["float32"]["command_s"] / runs["bfloat16"]["command_s"], 2)
        result["datasets"][data.name] = entry
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{name}\n{p}", r) for name, e in result["datasets"].items() for p, r in e["runs"].items()]
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.8 * len(rows)))
    colors = plt.get_cmap("tab10").colors
    for y, (label, r) in enumerate(rows):
        left = 0.0
        for i, s in enumerate(STAGES):
            v = r["stages"].get(s, 0.0)
            ax.barh(y, v, left=left, color=colors[i % 10], label=s if y == 0 else None)
            left += v
        eff = r.get("efficiency", {})
        fr = [f"{k.removeprefix('embed_')} {100 * v['fraction_of_peak']:.0f}%" for k, v in eff.items()
              if isinstance(v, dict) and "fraction_of_peak" in v]
        if fr:
            ax.text(0.5, y - 0.3, f"encoder vs {eff['precision']} matmul peak ({eff['matmul_peak_gflops']:.0f} GFLOP/s): "
                    + ", ".join(fr) + (f"; NER {eff['ner']['words_per_s']:.0f} words/s" if "ner" in eff else ""),
                    fontsize=7, va="center")
        if "command_s" in r:
            ax.plot([r["command_s"]], [y], "k|", markersize=22, mew=2, label="`linearrag index`" if y == 0 else None)
            ax.text(r["command_s"], y + 0.3, f" {r['command_s']:.0f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (stages of build_index in process; | = the whole command)")
    m = result["machine"]
    ax.set_title(f"indexing time by stage, {m['description']}, native bf16: {m['native_bf16']}")
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.build_speed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="folder(s) with corpus.jsonl")
    ap.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"], choices=ENCODER_PRECISIONS[1:],
                    help="encoder precisions to time (default: %(default)s)")
    ap.add_argument("--json", type=Path, default=RESULTS / "build_speed_cpu.json", help="default %(default)s")
    ap.add_argument("--png", type=Path, help="default: --json with .png")
    ap.add_argument("--no-command", dest="command", action="store_false",
                    help="skip the whole `linearrag index` command (stages only)")
    ap.add_argument("--sentence-vectors", choices=("separate", "passage"), default="separate",
                    help="IndexConfig.sentence_vectors of every build (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of both (default: torch's, one per core)")
    ap.add_argument("--progress", action="store_true", help="progress bars of the in-process builds")
    args = ap.parse_args(argv)
    for d in args.data:
        if not (d / "corpus.jsonl").is_file():
            ap.error(f"{d / 'corpus.jsonl'} does not exist")
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the command's (torch reads it when it loads)
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    log(f"wrote {args.json}")
    png = args.png or args.json.with_suffix(".png")
    plot(result, png)
    log(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
