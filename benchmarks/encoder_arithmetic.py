"""Recall of cheaper encoder arithmetic (issue 50): int8 and bf16 encoders, one pass per passage, int8 reranker.

    # an index's vectors encoded again by another encoder (its graph, strings and NER record kept as they are)
    python -m benchmarks.encoder_arithmetic vectors SRC_INDEX DST_INDEX --precision float32|bfloat16|int8|int8-all
                                                    [--sentence-vectors separate|passage]
    # passage vectors pooled from the index's own sentence vectors (no encoder pass), as a new index
    python -m benchmarks.encoder_arithmetic pool SRC_INDEX DST_INDEX --weights tokens|uniform
    # recall@2 / @5 of each (index, question encoder, reranker precision), defaults and with --rerank
    python -m benchmarks.encoder_arithmetic recall --set NAME DATA_DIR INDEX_DIR [INDEX_DIR ...] [--set ...]
                                                   [--questions exact int8] [--reranker float32 int8 bfloat16]
                                                   --json OUT

``vectors``: a build's three vector stages again (passages, sentences, entities) with the given encoder, written
as a new index (its index_config records ``encoder_precision`` and ``sentence_vectors``); the NER and graph of
the source stay, so that only the vectors differ. With ``--sentence-vectors passage`` the sentences' vectors come
from their passage's pass (Encoder.encode_with_spans; a sentence's span is the first passage of PS holding it,
found in that passage's text), as IndexConfig(sentence_vectors="passage") builds them. The seconds of each stage
go into DST_INDEX/encode_seconds.json (not quiet: not a speed figure).

``pool``: the reverse of one pass per passage: the sentences keep their own vectors and a passage's vector is the
normalised mean of its sentences' vectors (PS), weighted by their token counts or alike; the pass over the passages
would be saved. Everything else of the source index stays.

``recall``: for each set, each index, each question encoder (exact float32, or LinearRAG(quantize=...)), the
default retrieval settings and, with the learned reranker, each reranker precision: recall@2 and @5 over the
set's questions with gold (as benchmarks/quality.py computes them), questions ranked in one batched call.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.local_ppr import recall  # noqa: E402
from linearrag_torch import LinearRAG, env  # noqa: E402
from linearrag_torch.corpus import read_questions  # noqa: E402
from linearrag_torch.index import TriGraphIndex  # noqa: E402
from linearrag_torch.models.encoding import Encoder  # noqa: E402

PRECISIONS = ("float32", "bfloat16", "int8", "int8-all")


def encoder_for(index: TriGraphIndex, precision: str) -> Encoder:
    cfg = index.index_config
    if precision.startswith("int8"):
        return Encoder(cfg.encoder, max_length=cfg.max_length, batch_size=cfg.batch_size, quantize=precision)
    return Encoder(cfg.encoder, max_length=cfg.max_length, batch_size=cfg.batch_size, precision=precision)


def first_spans(index: TriGraphIndex) -> list:
    """(passage row, first, end character) of each sentence in the first passage (PS) that holds it."""
    ps = index.PS.to("cpu")
    crow, col = ps.crow.tolist(), ps.col.tolist()
    where = [None] * index.num_sentences
    for p in range(index.num_passages):
        for s in col[crow[p]:crow[p + 1]]:
            if where[s] is None:
                where[s] = p
    out = []
    for s, p in enumerate(where):
        text = index.passage_text(p)
        pos = text.find(index.sentences[s])
        if pos < 0:
            raise ValueError(f"sentence {s} is not in the text of passage {p}")
        out.append((p, pos, pos + len(index.sentences[s])))
    return out


def vectors(args) -> int:
    src = TriGraphIndex.load(args.src)
    enc = encoder_for(src, args.precision)
    texts = [src.passage_text(i) for i in range(src.num_passages)]
    sec = {}
    t = time.perf_counter()
    if args.sentence_vectors == "passage":
        p_emb, s_emb = enc.encode_with_spans(texts, first_spans(src), progress=True)
        sec["passages_and_sentences"] = time.perf_counter() - t
    else:
        p_emb = enc.encode(texts, progress=True)
        sec["passages"] = time.perf_counter() - t
        t = time.perf_counter()
        s_emb = enc.encode(src.sentences, progress=True)
        sec["sentences"] = time.perf_counter() - t
    t = time.perf_counter()
    e_emb = enc.encode(src.entities, progress=True)
    sec["entities"] = time.perf_counter() - t
    dt = src.passage_emb.dtype
    cfg = dataclasses.replace(src.index_config, encoder_precision=args.precision if args.precision in
                              ("float32", "bfloat16") else "float32", sentence_vectors=args.sentence_vectors)
    out = dataclasses.replace(src, passage_emb=p_emb.to(dt), sentence_emb=s_emb.to(dt), entity_emb=e_emb.to(dt),
                              index_config=cfg)
    out.save(args.dst)
    meta = {"source": str(args.src), "precision": args.precision, "sentence_vectors": args.sentence_vectors,
            "seconds": sec, "native_bf16": env.native_bf16("cpu"), "date": datetime.date.today().isoformat()}
    (Path(args.dst) / "encode_seconds.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))
    return 0


def pooled_passages(index: TriGraphIndex, weights: torch.Tensor) -> torch.Tensor:
    """[P, dim] L2-normalised float32: each passage's sentence vectors (its row of PS) summed with ``weights`` [S];
    a passage without sentences keeps its own vector."""
    ps = index.PS.to("cpu")
    counts = ps.crow[1:] - ps.crow[:-1]
    owner = torch.repeat_interleave(torch.arange(index.num_passages), counts)
    acc = torch.zeros(index.num_passages, index.dim)
    acc.index_add_(0, owner, index.sentence_emb.float()[ps.col] * weights[ps.col, None])
    out = torch.nn.functional.normalize(acc, dim=1)
    empty = counts == 0
    out[empty] = index.passage_emb[empty].float()
    return out


def pool(args) -> int:
    src = TriGraphIndex.load(args.src)
    if args.weights == "tokens":
        keys = encoder_for(src, "float32").token_keys(src.sentences)
        w = torch.tensor([len(k) for k in keys], dtype=torch.float32)
    else:
        w = torch.ones(src.num_sentences)
    p_emb = pooled_passages(src, w)
    cos = (p_emb * torch.nn.functional.normalize(src.passage_emb.float(), dim=1)).sum(1)
    dataclasses.replace(src, passage_emb=p_emb.to(src.passage_emb.dtype)).save(args.dst)
    meta = {"source": str(args.src), "passage_vectors": f"pooled sentence vectors, {args.weights} weights",
            "cosine_to_encoded": {"mean": round(cos.mean().item(), 4), "min": round(cos.min().item(), 4)},
            "date": datetime.date.today().isoformat()}
    (Path(args.dst) / "encode_seconds.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))
    return 0


def recall_rows(name: str, data: Path, index_dir: Path, args) -> dict:
    questions = [q if isinstance(q, dict) else vars(q) for q in read_questions(data / "questions.jsonl")]
    texts = [q["question"] for q in questions]
    base_rag = LinearRAG.load(index_dir, device="cpu")
    ids = base_rag.index.passage_ids
    rows = {}
    for qenc in args.questions:
        rag = base_rag if qenc == "exact" else LinearRAG(base_rag.index, "cpu", nlp=base_rag.nlp, quantize=qenc)
        runs = [("defaults", base_rag.config)] + [(f"rerank {p}", base_rag.config.replace(rerank=True,
                                                                                          reranker_precision=p))
                                                  for p in args.reranker]
        for label, cfg in runs:
            queries = rag.encode_queries(texts, cfg)
            top = rag.retrieve(queries, cfg).indices[:, :5].tolist()
            key = f"questions {qenc}, {label}"
            rows[key] = {"recall@2": recall(top, ids, questions, 2), "recall@5": recall(top, ids, questions, 5),
                         "questions": len(top)}
            print(f"{name:<18} {Path(index_dir).name:<28} {key:<36} R@2 {rows[key]['recall@2']:6.2f} "
                  f"R@5 {rows[key]['recall@5']:6.2f}", flush=True)
    meta = {}
    seconds = Path(index_dir) / "encode_seconds.json"
    if seconds.is_file():
        meta = json.loads(seconds.read_text())
    return {"index": str(index_dir), "index_config": base_rag.index.index_config.to_dict(), "vectors": meta,
            "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("vectors")
    v.add_argument("src", type=Path)
    v.add_argument("dst", type=Path)
    v.add_argument("--precision", choices=PRECISIONS, default="float32")
    v.add_argument("--sentence-vectors", choices=("separate", "passage"), default="separate")
    v.add_argument("--threads", type=int, default=0)
    pl = sub.add_parser("pool")
    pl.add_argument("src", type=Path)
    pl.add_argument("dst", type=Path)
    pl.add_argument("--weights", choices=("tokens", "uniform"), default="tokens")
    pl.add_argument("--threads", type=int, default=0)
    r = sub.add_parser("recall")
    r.add_argument("--set", nargs="+", action="append", required=True, metavar="NAME DATA_DIR INDEX_DIR")
    r.add_argument("--questions", nargs="+", default=["exact"], choices=("exact", "int8", "int8-all"))
    r.add_argument("--reranker", nargs="*", default=["float32"], choices=("float32", "bfloat16", "int8"))
    r.add_argument("--json", type=Path, required=True)
    r.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cmd == "vectors":
        return vectors(args)
    if args.cmd == "pool":
        return pool(args)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "platform": platform.platform(), "native_bf16": env.native_bf16("cpu"),
           "command": " ".join(sys.argv), "units": {"recall@k": "% (mean over questions with gold), top 5"},
           "sets": {}}
    for spec in args.set:
        name, data, *indexes = spec
        out["sets"][name] = [recall_rows(name, Path(data), Path(i), args) for i in indexes]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
