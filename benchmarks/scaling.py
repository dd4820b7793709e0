"""How index building and querying scale with corpus size: synthetic Tri-Graphs with the statistics of
a real corpus, from 10,000 passages up, torch backend against the scipy reference.

    python -m benchmarks.scaling [--sizes 10000 100000 1000000] [--batch 1 64 1024] [--device cpu]
                                 [--real DIR | --real none] [--dim 384] --json OUT [--png OUT] [--merge]

By default at the real size: 384-dimensional vectors (all-MiniLM-L6-v2's) in the dtype an index stores
(--embedding-dtype), the statistics of a real corpus (--real, 2wiki of ../shared/datasets when present) and the
defaults' rows (RetrievalConfig(), ppr_mode auto). Per size: build time of the sparse structure (mentions -> M, C,
N, PS -> the query-ready device graph; NER and encoding excluded, they are measured on the real corpus with
--real), the bytes a passage costs by part (the index's vectors and matrices, what the engine made from them),
queries/s per backend and batch size, peak memory (total RSS, and its anonymous and file-backed parts); then the
log-log slope of time against size. A size whose memory, extrapolated from the last one, would not fit in the
memory available is skipped (and listed). See benchmarks/README.md for the protocol and benchmarks/results/ for our numbers.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    DEFAULT_STATS, MemorySampler, StepMeter, cgroup_memory, log, machine, peak_memory, pick_device, reset_peak_memory, sync, synthetic_embeddings,
    synthetic_mentions,
)
from linearrag_torch.retrieval import ann, scipy_backend  # noqa: E402
from linearrag_torch.config import AUTO_RESET_PASSAGES, IndexConfig, RetrievalConfig  # noqa: E402
from linearrag_torch.index.graph import EMBEDDING_TORCH_DTYPES  # noqa: E402
from linearrag_torch.retrieval.engine import DeviceGraph, retrieve  # noqa: E402
from linearrag_torch.retrieval.memory import release_freed_memory, status_bytes  # noqa: E402
from linearrag_torch.index import TriGraphIndex  # noqa: E402
from linearrag_torch.synthetic import index_from_mentions, random_embeddings, random_mentions, random_queries, write_index

DEFAULT_SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
DEFAULT_BATCHES = (1, 64, 1024)
# the real corpus whose statistics the synthetic ones copy by default (the project's shared data sets, beside the
# repository; absent elsewhere: then DEFAULT_STATS, calibrated on it)
DEFAULT_REAL = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "2wiki"


# ----------------------------------------------------------------------------------------- real corpus
class _RandomEncoder:
    """Stands in for the encoder during the timed build: random unit vectors, no model (the real
    encoder's time is measured on samples separately)."""

    def __init__(self, dim: int = 384):
        self.dim, self.calls = dim, 0

    def token_keys(self, texts):
        return list(texts)  # texts as their own keys (encoding.TextEncoder)

    def encode(self, texts, progress=False, desc=None, keys=None):
        self.calls += 1
        return random_embeddings(len(texts), self.dim, seed=self.calls)


def measure_real_corpus(folder: Path, encode_sample: int = 256, seed: int = 0) -> dict:
    """Index the real corpus in ``folder``/corpus.jsonl with build_index (stage times: NER, graph,
    counts; a stand-in encoder), time the device graph, estimate encoding from samples with the real
    encoder, and return the statistics the synthetic corpora copy."""
    from linearrag_torch.indexing.build import build_index
    from linearrag_torch.index import passage_text
    from linearrag_torch.corpus import read_corpus
    from linearrag_torch.models.encoding import Encoder
    from linearrag_torch.models.nlp import load_spacy

    cfg = IndexConfig()
    passages = read_corpus(folder / "corpus.jsonl")
    texts = [passage_text(p.title, p.text) for p in passages]
    times = {}
    t = time.perf_counter()
    nlp = load_spacy(cfg.spacy_model)
    times["load_spacy_s"] = time.perf_counter() - t
    stages = {}
    t = time.perf_counter()
    index = build_index(passages, cfg, progress=False, nlp=nlp, encoder=_RandomEncoder(), timings=stages)
    times["build_index_with_stand_in_encoder_s"] = time.perf_counter() - t
    for stage in ("ner", "graph", "counts"):
        times[f"{stage}_s"] = stages.get(stage)
    times["stand_in_embeddings_s"] = sum(v for k, v in stages.items() if k.startswith("embed"))
    t = time.perf_counter()
    graph = DeviceGraph(index, "cpu")
    graph.ppr_graph(False)
    times["device_graph_s"] = time.perf_counter() - t
    # encoding: a random sample of each kind of text, extrapolated to the whole corpus
    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    enc = Encoder(cfg.encoder, "cpu", cfg.max_length, cfg.batch_size)
    times["load_encoder_s"] = time.perf_counter() - t
    encode = {}
    for name, items in (("passages", texts), ("sentences", index.sentences), ("entities", index.entities)):
        pick = [items[i] for i in rng.choice(len(items), size=min(encode_sample, len(items)), replace=False)]
        t = time.perf_counter()
        enc.encode(pick, progress=False)
        rate = len(pick) / (time.perf_counter() - t)
        encode[name] = {"sampled": len(pick), "per_s": rate, "estimated_s": len(items) / rate}
    times["encode_estimated_s"] = sum(v["estimated_s"] for v in encode.values())
    P, S, E = index.num_passages, index.num_sentences, index.num_entities
    M, C, N = index.M, index.C, index.N
    mention_freq = np.sort(np.bincount(M.col.numpy(), minlength=E))[::-1]  # sentences per entity, by rank
    stats = {
        "passages": P, "sentences": S, "entities": E, "nnz_M": M.nnz, "nnz_C": C.nnz, "nnz_N": N.nnz,
        "sentences_per_passage": S / P,  # sentence nodes: distinct texts that mention an entity
        "entities_per_sentence": M.nnz / max(S, 1),
        "entities_per_passage": C.nnz / P,
        "entities_per_passage_node": E / P,
        "extra_ratio": (N.nnz - C.nnz) / max(M.nnz, 1),  # N's substring matches beyond C, per mention
        "singleton_entities": float((mention_freq == 1).mean()),
        "top_entity_share": float(mention_freq[0] / mention_freq.sum()),
        "rank_frequency": {str(r): int(mention_freq[r - 1]) for r in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000,
                                                                      2000, 5000, 10000) if r <= E},
    }
    stats.update(calibrate_zipf(mention_freq, M.nnz, E, P))
    return {"folder": str(folder), "stats": stats, "timings": times, "encode": encode,
            "index_bytes_per_passage_dim384": _index_bytes(index) / P}


def calibrate_zipf(freq: np.ndarray, mentions: int, entities: int, passages: int) -> dict:
    """The Zipf exponent s and vocabulary V of random_mentions that reproduce the real corpus: V such that
    ``mentions`` draws hit ``entities`` distinct names in expectation, s fitting the rank-frequency curve
    (log counts at log-spaced ranks with at least 3 mentions)."""
    ranks = np.unique(np.round(np.logspace(0, math.log10(max(2, len(freq))), 40)).astype(int))
    ranks = ranks[(ranks <= len(freq)) & (freq[np.minimum(ranks, len(freq)) - 1] >= 3)]
    best = None
    for s in np.arange(0.5, 1.31, 0.02):
        lo, hi = entities, 200 * entities
        for _ in range(40):  # bisection on V: expected distinct names grows with V
            V = (lo + hi) // 2
            p = 1.0 / np.arange(1, V + 1) ** s
            p /= p.sum()
            distinct = float(np.sum(-np.expm1(mentions * np.log1p(-p))))
            lo, hi = (V, hi) if distinct < entities else (lo, V)
            if hi - lo <= max(1, V // 1000):
                break
        err = float(np.mean((np.log(freq[ranks - 1]) - np.log(mentions * p[ranks - 1])) ** 2)) if len(ranks) else 0.0
        if best is None or err < best[0]:
            best = (err, float(s), int(V))
    return {"zipf": round(best[1], 2), "vocabulary_per_passage": best[2] / passages, "zipf_fit_mse_log": best[0]}


def calibrate_generator(stats: dict, max_passages: int = 20_000, rounds: int = 10, seed: int = 0) -> dict:
    """Parameters of random_mentions (mean entities per sentence, repeat, vocabulary per passage; the
    Zipf exponent and the other means as measured) that reproduce, on a corpus of the real size (at most
    ``max_passages``), the real mentions per sentence (nnz M / S), distinct entities per passage
    (nnz C / P) and entities per passage node (E / P): a few rounds of multiplicative corrections."""
    P = min(int(stats["passages"]), max_passages)
    want = {"M/S": stats["entities_per_sentence"], "C/P": stats["entities_per_passage"],
            "E/P": stats["entities_per_passage_node"]}
    lam, rep, vpp = stats["entities_per_sentence"], 0.2, stats["vocabulary_per_passage"]
    got = {}
    for _ in range(rounds):
        m = random_mentions(P, max(1, round(vpp * P)), stats["sentences_per_passage"], lam, stats["zipf"], 0.0,
                            repeat=rep, seed=seed)
        pairs_m = torch.unique(m.ent_sentence * m.entities + m.ent).numel()
        pairs_c = torch.unique(m.sent_passage[m.ent_sentence] * m.entities + m.ent).numel()
        got = {"M/S": pairs_m / m.sentences, "C/P": pairs_c / P, "E/P": m.entities / P}
        lam *= want["M/S"] / got["M/S"]
        rep = min(0.95, max(0.0, rep + 0.8 * (got["C/P"] - want["C/P"]) / max(got["C/P"], 1e-9)))
        vpp *= (want["E/P"] / got["E/P"]) ** 1.5
    # N's extra pairs are drawn per raw mention (before a sentence's repeats collapse): rescale
    extra = stats["extra_ratio"] * got["M/S"] * m.sentences / max(m.ent.numel(), 1)
    return {"entities_per_sentence": lam, "repeat": rep, "vocabulary_per_passage": vpp, "extra_ratio": extra,
            "calibration_passages": P, "achieved": got, "target": want}


# ----------------------------------------------------------------------------------------- one size
def _index_bytes(index) -> int:
    """Bytes of the index's tensors: vectors, the CSR arrays of M, C, N, PS, the token keys."""
    return sum(index.nbytes_by_part().values())


def per_passage(parts: dict, passages: int) -> dict:
    """{part: bytes} as bytes a passage, rounded."""
    return {k: round(v / passages, 1) for k, v in parts.items()}


def rss_now() -> dict:
    """This process's resident memory now: total, anonymous and file-backed (mapped files) bytes."""
    return {"rss_bytes": status_bytes("VmRSS") or 0, "rss_anonymous_bytes": status_bytes("RssAnon") or 0,
            "rss_file_bytes": status_bytes("RssFile") or 0}


def prepare_walks(graph, cfgs: dict, passages: int) -> None:
    """The PageRank structures the settings ``cfgs`` run at this size (ppr_mode auto made concrete): the exact
    walk's operator and / or the push's graph, built as part of the timed build."""
    modes = {cfg.for_corpus(passages).ppr_mode for cfg in cfgs.values()} or {"exact"}
    if "exact" in modes:
        graph.ppr_graph(False)
    if "local" in modes:
        graph.push_graph(False)


def build(passages: int, stats: dict, dim: int, device: torch.device, seed: int = 0,
          dtype: str = "float32", cfgs: dict | None = None, index_dir: Path | None = None, reuse: bool = False):
    """A synthetic index of ``passages`` passages with ``dim``-dimensional vectors stored in ``dtype``; times the
    structure build (mentions -> device graph, with the PageRank structures ``cfgs`` use: prepare_walks) and reports
    its memory: peak RSS of the whole build (vectors included), bytes a passage by part.

    ``index_dir``: the index is written to a folder there instead (synthetic.write_index: its vectors block by block,
    never all in memory) and loaded back as a user loads a saved index (TriGraphIndex.load: its tensors mapped
    from the file, the checksums verified); the times are then the write's and the load's. ``reuse``: a folder
    written by an earlier run (the same size, dimension, dtype and seed: the same index) is loaded, not rewritten."""
    cfgs = {} if cfgs is None else cfgs
    base = reset_peak_memory(torch.device("cpu"))
    info = {}
    with MemorySampler() as mem:
        m = synthetic_mentions(passages, stats, seed)
        t, tc = time.perf_counter(), time.process_time()
        if index_dir is not None:
            folder = Path(index_dir) / f"synthetic-{passages}-{dim}-{dtype}-{seed}"
            if not (reuse and (folder / "index.json").is_file()):
                write_index(folder, m, dim, seed, EMBEDDING_TORCH_DTYPES[dtype])
            else:
                info["reused_index"] = True
            del m
            gc.collect()
            release_freed_memory()  # the write's blocks, which keep_freed_memory would keep in the process
            info["write_s"] = time.perf_counter() - t
            t1 = time.perf_counter()
            index = TriGraphIndex.load(folder)
            info["load_s"] = time.perf_counter() - t1
            info["index_dir"] = str(folder)
            info["index_dir_bytes"] = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        else:
            emb = synthetic_embeddings(m, dim, seed, EMBEDDING_TORCH_DTYPES[dtype])
            t, tc = time.perf_counter(), time.process_time()
            index = index_from_mentions(m, *emb)
            if dtype != "float32":  # as a built index records it (IndexConfig.embedding_dtype)
                index.index_config = dataclasses.replace(index.index_config, embedding_dtype=dtype)
        structure_s = time.perf_counter() - t
        graph = DeviceGraph(index, device)
        prepare_walks(graph, cfgs, passages)
        sync(device)
        build_s = time.perf_counter() - t
        build_cpu_s = time.process_time() - tc
    if index_dir is not None:  # the load's and the graph's freed temporaries, as the server gives them back after a load
        release_freed_memory()
    index_parts, graph_parts = index.nbytes_by_part(), graph.nbytes_by_part()
    info.update({
        "passages": passages, "sentences": index.num_sentences, "entities": index.num_entities,
        "nnz_M": index.M.nnz, "nnz_C": index.C.nnz, "nnz_N": index.N.nnz, "dim": dim, "embedding_dtype": dtype,
        "index_on_disk": index_dir is not None,
        "build_s": build_s, "build_cpu_s": build_cpu_s, "structure_s": structure_s,
        "device_graph_s": build_s - structure_s,
        "index_bytes": sum(index_parts.values()), "graph_bytes": sum(graph_parts.values()),
        "index_bytes_per_passage_by_part": per_passage(index_parts, passages),
        "graph_bytes_per_passage_by_part": per_passage(graph_parts, passages),
        "build_peak_mem_bytes": peak_memory(torch.device("cpu")), "build_rss_before_bytes": base,
        "build_peak_anonymous_bytes": mem.peak_anonymous, "build_peak_file_bytes": mem.peak_file,
        "after_build": rss_now(),
    })
    info["index_bytes_per_passage"] = info["index_bytes"] / passages
    if index_dir is not None:
        return index, graph, info
    # the same build again in this process: without the page faults of the memory the process takes for
    # the first time (on our VM, first touch costs about 0.6 ns per byte, more than the work on it)
    del graph, index
    gc.collect()
    t = time.perf_counter()
    index = index_from_mentions(m, *emb)
    index.index_config = dataclasses.replace(index.index_config, embedding_dtype=dtype)
    graph = DeviceGraph(index, device)
    prepare_walks(graph, cfgs, passages)
    sync(device)
    info["build_warm_s"] = time.perf_counter() - t
    del m, emb
    return index, graph, info


def time_torch(graph, index, batch: int, cfg, device, min_questions: int, seed: int, max_call_s: float = 150.0):
    """queries/s of engine.retrieve at batch size ``batch`` (calls repeated until min_questions are done).

    The engine runs a batch as independent chunks of graph.questions_per_chunk() questions; when a whole
    batch would take longer than ``max_call_s``, only some of its chunks are timed (at least 2, each a
    retrieve call on that chunk's questions) and the row says so ("chunks_timed" of "chunks")."""
    t = time.perf_counter()
    # warm-up: first-call allocations, and what the engine builds on first use (the push graph, the ANN indexes)
    retrieve(graph, random_queries(index, 2, seed=seed + 99), cfg)
    first_call_s = time.perf_counter() - t
    chunk = graph.questions_per_chunk(None, cfg)
    meter = StepMeter(device)  # the PageRank steps of the timed calls: count, time, modeled traffic
    out = _time_torch_calls(graph, index, batch, cfg, device, min_questions, seed, max_call_s, chunk, meter)
    ppr_ms = meter.ms()
    questions = out["questions_timed"]
    out["stage_ms_per_question"] = {k: 1e3 * v / questions for k, v in meter.stage_s.items()}
    out["first_call_s"] = first_call_s
    if meter.pushes:
        cols = sum(p.columns for p in meter.pushes)
        out["ppr_touched_per_question_round"] = sum(p.touched for p in meter.pushes) / cols
        out["ppr_pushed_per_question_round"] = sum(p.pushed for p in meter.pushes) / cols
        out["ppr_rounds_max"] = max(p.rounds for p in meter.pushes)
        ppr_ms = 1e3 * meter.stage_s.get("pagerank", 0.0)
    out.update({"ppr_step_calls": meter.calls, "ppr_s": ppr_ms / 1e3,
                "ppr_fraction_of_time": ppr_ms / 1e3 / out["seconds"] if out["seconds"] else None,
                "ppr_modeled_GB_per_s": meter.bytes / (ppr_ms / 1e3) / 1e9 if ppr_ms else None})
    return out


def _time_torch_calls(graph, index, batch: int, cfg, device, min_questions: int, seed: int, max_call_s: float,
                      chunk: int, meter):
    n_chunks = -(-batch // chunk)
    base = reset_peak_memory(device)
    extra = {}
    cpu = 0.0
    if n_chunks > 2:
        q = random_queries(index, batch, seed=seed)
        sync(device)
        t = time.perf_counter()
        retrieve(graph, q.slice(0, chunk), cfg)
        sync(device)
        if (time.perf_counter() - t) * n_chunks <= max_call_s:  # the whole batch fits: time it whole
            n_chunks = 0
    if n_chunks > 2:
        times = []
        for c in range(n_chunks):  # chunk by chunk, until the time limit (then extrapolate)
            sub = q.slice(c * chunk, min(batch, (c + 1) * chunk))
            sync(device)
            t, tc = time.perf_counter(), time.process_time()
            _, tr = retrieve(graph, sub, cfg, trace="steps")
            sync(device)
            times.append(time.perf_counter() - t)
            cpu += time.process_time() - tc
            meter.add(tr)
            if c >= 1 and sum(times) / (c + 1) * n_chunks > max_call_s and sum(times) > max_call_s / 4:
                break
        questions = min(batch, len(times) * chunk)
        total = sum(times)
        calls = 1
        extra = {"chunks": n_chunks, "chunks_timed": len(times)}
        if len(times) < n_chunks:
            extra["estimated_batch_s"] = total / questions * batch
    else:
        calls, questions, total = 0, 0, 0.0
        while questions < max(batch, min_questions) or calls == 0:
            q = random_queries(index, batch, seed=seed + calls)
            sync(device)
            t, tc = time.perf_counter(), time.process_time()
            _, tr = retrieve(graph, q, cfg, trace="steps")
            sync(device)
            total += time.perf_counter() - t
            cpu += time.process_time() - tc
            meter.add(tr)
            calls += 1
            questions += batch
    return {"queries_per_s": questions / total, "seconds": total, "cpu_seconds": cpu,
            "queries_per_cpu_s": questions / cpu if cpu else None, "questions_timed": questions, "calls": calls,
            "questions_per_chunk": chunk, **extra, "peak_mem_bytes": peak_memory(device), "mem_before_bytes": base}


def time_scipy(index, prepared, batch: int, cfg, max_questions: int, seed: int):
    """queries/s of the scipy reference on min(batch, max_questions) questions (it answers one question
    at a time, so its rate does not depend on the batch; the per-index prepare() is excluded)."""
    n = min(batch, max_questions)
    calls = max(1, max_questions // batch) if batch < max_questions else 1
    total, cpu, questions = 0.0, 0.0, 0
    base = reset_peak_memory(torch.device("cpu"))
    for c in range(calls):
        q = random_queries(index, n, seed=seed + c)
        t, tc = time.perf_counter(), time.process_time()
        scipy_backend.retrieve(index, q, cfg, prepared=prepared)
        total += time.perf_counter() - t
        cpu += time.process_time() - tc
        questions += n
    return {"queries_per_s": questions / total, "seconds": total, "cpu_seconds": cpu,
            "queries_per_cpu_s": questions / cpu if cpu else None, "questions_timed": questions, "calls": calls,
            "peak_mem_bytes": peak_memory(torch.device("cpu")), "mem_before_bytes": base}


def exact_config(args) -> RetrievalConfig:
    """The exact walk's settings (the torch rows named 'torch' and the scipy reference)."""
    return RetrievalConfig().replace(ppr_mode="exact", reset_passages=args.exact_reset_passages)


def mode_configs(args) -> dict:
    """The torch backend's settings per PageRank mode asked (--ppr-modes): the row's backend name -> config."""
    out = {}
    for mode in args.ppr_modes:
        if mode == "defaults":  # ppr_mode auto: the exact walk or the local one by the corpus's size
            out["torch defaults"] = RetrievalConfig()
        elif mode == "exact":
            out["torch"] = exact_config(args)
        else:
            out["torch local"] = RetrievalConfig().replace(ppr_mode="local", reset_passages=args.reset_passages,
                                                           ppr_eps=args.ppr_eps, reset_minmax=args.reset_minmax)
            for kind in args.ann:  # the local mode with the ANN stage (retrieval/ann.py)
                out[f"torch local {kind}"] = out["torch local"].replace(
                    ann=kind, ann_probe=args.ann_probe, ann_lists=args.ann_lists, ann_cache=args.ann_cache or "")
    return out


def ann_stages(graph, index, cfgs: dict, questions: int, seed: int, log) -> dict:
    """Per ANN setting of ``cfgs``: the build (or cache read) of its entity and passage indexes (seconds, bytes),
    and on ``questions`` random questions its recall of the exact answers: the share of question entities whose
    nearest entity (eq. 3) is the exact scan's, and of the exact top reset_passages passages among its
    candidates (both as the engine uses them, rescored exactly), with each search's ms per question."""
    from linearrag_torch.retrieval.activation import nearest_entities
    from linearrag_torch.retrieval.engine import cosines
    from linearrag_torch.retrieval.pagerank import top_passages

    out = {}
    q = random_queries(index, questions, seed=seed)
    exact_top = None
    exact_near = None
    for name, cfg in cfgs.items():
        if cfg.ann in ("exact", "auto"):
            continue
        info = {}
        for which in ("entity", "passage"):
            t = time.perf_counter()
            st = ann.stage(graph, which, cfg)
            info[which] = {"build_s": st.build_s, "first_use_s": time.perf_counter() - t, "from_cache": st.from_cache,
                           "bytes": st.nbytes(), "rows": st.rows, "lists": st.lists}
        with torch.inference_mode():
            if exact_near is None:
                t = time.perf_counter()
                exact_near = nearest_entities(graph.entity_emb, q.entity_emb.to(graph.entity_emb.dtype))[1]
                exact_scan_s = time.perf_counter() - t
                t = time.perf_counter()
                sim = cosines(graph.passage_emb, q.query_emb)
                exact_top = top_passages(sim, cfg.reset_passages, cfg.reset_minmax)[0]
                exact_top_s = time.perf_counter() - t
                del sim
            t = time.perf_counter()
            near = ann.nearest_entities(graph, q.entity_emb, None, cfg)[1]
            near_s = time.perf_counter() - t
            t = time.perf_counter()
            cand = ann.passage_candidates(graph, q.query_emb, cfg.reset_passages, cfg, low=cfg.reset_minmax == "global")
            cand_s = time.perf_counter() - t
        P = graph.passage_emb.shape[0]
        want = (torch.arange(questions)[None, :] * P + exact_top).flatten()
        got = cand.question * P + cand.passage
        info.update({
            "questions": questions, "question_entities": int(q.entity_emb.shape[0]),
            "nearest_entity_recall": float((near == exact_near).float().mean()) if near.numel() else None,
            "top_m": cfg.reset_passages, "top_m_recall": float(torch.isin(want, got).float().mean()),
            "ms_per_question": {"ann nearest entities": 1e3 * near_s / questions,
                                "ann top m": 1e3 * cand_s / questions,
                                "exact nearest entities": 1e3 * exact_scan_s / questions,
                                "exact cosines and top m": 1e3 * exact_top_s / questions},
            "settings": {"ann": cfg.ann, "ann_probe": cfg.ann_probe, "ann_lists": cfg.ann_lists}})
        out[name] = info
        log(f"    {name}: entity index {info['entity']['rows']:,} rows, {info['entity']['build_s']:.1f} s"
            f"{' (cached)' if info['entity']['from_cache'] else ''}, {info['entity']['bytes'] / 2**20:.0f} MiB; passage "
            f"index {info['passage']['build_s']:.1f} s, {info['passage']['bytes'] / 2**20:.0f} MiB; nearest entity "
            f"= exact {100 * (info['nearest_entity_recall'] or 0):.1f}%, top {cfg.reset_passages} recall "
            f"{100 * info['top_m_recall']:.1f}%; ms/question {info['ms_per_question']}")
    return out


def top5_agreement(graph, index, cfgs: dict, questions: int, seed: int) -> dict:
    """Share of ``questions`` random questions whose top 5 under each setting equals the exact mode's (the
    row "torch"), in percent."""
    if "torch" not in cfgs or len(cfgs) < 2:
        return {}
    q = random_queries(index, questions, seed=seed)
    ref = retrieve(graph, q, cfgs["torch"]).indices[:, :5]
    return {name: 100.0 * float((retrieve(graph, q, cfg).indices[:, :5] == ref).all(1).float().mean())
            for name, cfg in cfgs.items() if name != "torch"}


def run_size(passages, stats, args, device, log):
    cfgs = mode_configs(args)
    index, graph, info = build(passages, stats, args.dim, device, seed=args.seed, dtype=args.embedding_dtype,
                               cfgs=cfgs if "torch" in args.backends else {}, index_dir=args.index_dir,
                               reuse=args.reuse_index)
    if args.memory_budget:
        graph.memory_budget = args.memory_budget
    log(f"{passages:>9,} passages: {info['sentences']:,} sentences, {info['entities']:,} entities, "
        f"build {info['build_s']:.2f} s ({info['build_cpu_s']:.2f} CPU s; "
        + (f"again: {info['build_warm_s']:.2f} s" if "build_warm_s" in info else
           f"written in {info['write_s']:.1f} s, loaded in {info['load_s']:.1f} s")
        + f"), {info['index_bytes_per_passage']:.0f} B/passage, peak {info['build_peak_mem_bytes'] / 2**30:.2f} GiB "
          f"({info['build_peak_anonymous_bytes'] / 2**30:.2f} anonymous)")
    rows = []
    common = {"passages": passages, "build_s": info["build_s"], "build_cpu_s": info["build_cpu_s"],
              "index_bytes": info["index_bytes"]}
    if "torch" in args.backends and args.ann:
        info["ann"] = ann_stages(graph, index, cfgs, max(args.agreement_questions, 16), args.seed + 7, log)
    if "torch" in args.backends and args.agreement_questions:
        info["top5_same_as_exact_percent"] = top5_agreement(graph, index, cfgs, args.agreement_questions,
                                                            args.seed + 7)
        if info["top5_same_as_exact_percent"]:
            log(f"    top 5 the same as the exact mode's: {info['top5_same_as_exact_percent']} "
                f"({args.agreement_questions} questions)")
    for batch in args.batch:
        for name, cfg in (cfgs.items() if "torch" in args.backends else ()):
            with MemorySampler() as mem:
                r = time_torch(graph, index, batch, cfg, device, args.min_questions, args.seed + 1000 * batch,
                               args.max_call_s)
            r.update({"peak_anonymous_bytes": mem.peak_anonymous, "peak_file_bytes": mem.peak_file,
                      # the engine's caches after the row (the push graph, ANN indexes are built on first use)
                      "graph_bytes_per_passage_by_part": per_passage(graph.nbytes_by_part(), passages)})
            rows.append({**common, "backend": name, "device": str(device), "batch": batch,
                         "settings": {k: getattr(cfg, k) for k in ("ppr_mode", "reset_passages", "ppr_eps",
                                                                   "reset_minmax", "ann", "ann_probe")},
                         # what auto chose
                         "ppr_mode_run": cfg.for_corpus(passages).ppr_mode, "ann_run": ann.for_graph(cfg, graph).ann,
                         **r})
            part = f", {r['chunks_timed']} of {r['chunks']} chunks of {r['questions_per_chunk']}" if "chunks" in r else ""
            stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_ms_per_question"].items())
            log(f"    {name:<11} {str(device):>5} batch {batch:>5}: {r['queries_per_s']:9.2f} q/s "
                f"({r['questions_timed']} questions{part}, {r['queries_per_cpu_s'] or 0:.2f} per CPU-second, "
                f"peak {r['peak_mem_bytes'] / 2**30:.2f} GiB; PageRank {100 * (r['ppr_fraction_of_time'] or 0):.0f}% "
                f"of the time, {r['ppr_modeled_GB_per_s'] or 0:.1f} GB/s modeled; ms/question: {stages}"
                + (f"; touched {r['ppr_touched_per_question_round']:.0f} per question and round)"
                   if "ppr_touched_per_question_round" in r else ")"))
    del graph  # the scipy reference's float64 copies take its place in memory
    gc.collect()
    if "scipy" in args.backends:
        t = time.perf_counter()
        cfg = exact_config(args)  # the oracle
        prepared = scipy_backend.prepare(index, cfg)
        prepare_s = time.perf_counter() - t
        for batch in args.batch:
            r = time_scipy(index, prepared, batch, cfg, args.scipy_questions, args.seed + 1000 * batch)
            rows.append({**common, "backend": "scipy", "device": "cpu", "batch": batch, "prepare_s": prepare_s, **r})
            log(f"    scipy   cpu batch {batch:>5}: {r['queries_per_s']:9.2f} q/s ({r['questions_timed']} questions, "
                f"{r['queries_per_cpu_s']:.2f} per CPU-second)")
        del prepared
    return info, rows


# ----------------------------------------------------------------------------------------- summary
def fit_slope(xs, ys) -> float | None:
    """Least-squares slope of log(y) against log(x) (None with fewer than 2 sizes)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    lx, ly = np.array(pts).T
    return float(np.polyfit(lx, ly, 1)[0])


def summarise(result: dict) -> dict:
    sizes = sorted(result["sizes"], key=lambda s: s["passages"])
    rows = result["rows"]
    build = fit_slope([s["passages"] for s in sizes], [s["build_s"] for s in sizes])
    warm = [s for s in sizes if s.get("build_warm_s")]
    build_warm = fit_slope([s["passages"] for s in warm], [s["build_warm_s"] for s in warm]) if warm else None

    def seconds_per_batch(backend, batch):
        pts = sorted((r["passages"], r["batch"] / r["queries_per_s"]) for r in rows
                     if r["backend"] == backend and r["batch"] == batch)
        return [p for p, _ in pts], [t for _, t in pts]

    per, per_cpu = {}, {}
    for backend in sorted({r["backend"] for r in rows}):
        for batch in sorted({r["batch"] for r in rows if r["backend"] == backend}):
            per[f"{backend}_batch{batch}"] = fit_slope(*seconds_per_batch(backend, batch))
            pts = sorted((r["passages"], 1.0 / r["queries_per_cpu_s"]) for r in rows
                         if r["backend"] == backend and r["batch"] == batch and r.get("queries_per_cpu_s"))
            per_cpu[f"{backend}_batch{batch}"] = fit_slope([p for p, _ in pts], [t for _, t in pts])
    build_cpu = fit_slope([s["passages"] for s in sizes if s.get("build_cpu_s")],
                          [s["build_cpu_s"] for s in sizes if s.get("build_cpu_s")])
    # the reference answers one question at a time: pool its rows of a size (all batch settings)
    pooled = {}
    for r in rows:
        if r["backend"] == "scipy":
            q, t, c = pooled.get(r["passages"], (0, 0.0, 0.0))
            pooled[r["passages"]] = (q + r["questions_timed"], t + r["seconds"], c + (r.get("cpu_seconds") or 0.0))
    vs_pooled = {}
    for r in rows:
        if r["backend"] == "torch" and r["passages"] in pooled:
            q, t, c = pooled[r["passages"]]
            vs_pooled.setdefault(str(r["passages"]), {})[str(r["batch"])] = {
                "wall": r["queries_per_s"] / (q / t),
                "cpu_time": (r["queries_per_cpu_s"] / (q / c)) if c and r.get("queries_per_cpu_s") else None}
    ratios, ratios_cpu = {}, {}
    for r in rows:
        if r["backend"] != "torch":
            continue
        s = [x for x in rows if x["backend"] == "scipy" and x["passages"] == r["passages"] and x["batch"] == r["batch"]]
        if s:
            ratios.setdefault(str(r["passages"]), {})[str(r["batch"])] = r["queries_per_s"] / s[0]["queries_per_s"]
            if r.get("queries_per_cpu_s") and s[0].get("queries_per_cpu_s"):
                ratios_cpu.setdefault(str(r["passages"]), {})[str(r["batch"])] = (
                    r["queries_per_cpu_s"] / s[0]["queries_per_cpu_s"])
    big = max((r["batch"] for r in rows if r["backend"] == "torch"), default=None)
    return {"slopes": {"build": build, "build_warm": build_warm, "query": per.get(f"torch_batch{big}"), "query_batch": big,
                       "per_backend_batch": per},
            "slopes_cpu_time": {"build": build_cpu, "query": per_cpu.get(f"torch_batch{big}"),
                                "per_backend_batch": per_cpu},
            "torch_over_scipy": ratios, "torch_over_scipy_cpu_time": ratios_cpu,
            "torch_over_scipy_pooled": vs_pooled,
            "scipy_pooled_queries_per_s": {str(p): q / t for p, (q, t, _) in sorted(pooled.items())}}


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(result["sizes"], key=lambda s: s["passages"])
    rows = result["rows"]
    fig, ax = plt.subplots(2, 2, figsize=(12, 9))
    P = [s["passages"] for s in sizes]
    ax[0, 0].loglog(P, [s["build_s"] for s in sizes], "o-", label=f"build (slope {result['slopes']['build']:.2f})"
                    if result["slopes"]["build"] is not None else "build")
    warm = [s for s in sizes if s.get("build_warm_s")]
    if warm:
        ax[0, 0].loglog([s["passages"] for s in warm], [s["build_warm_s"] for s in warm], "s--",
                        label=f"the same build again (slope {result['slopes'].get('build_warm') or 0:.2f})")
    ax[0, 0].set(title="structure build time (mentions -> device graph)", xlabel="passages", ylabel="seconds")
    # marker and line per row kind; "o-." for the local mode on an ANN stage
    styles = {"torch": "o-", "scipy": "o--", "torch local": "o:", "torch defaults": "s-"}
    backends = ["torch", "torch local", *sorted({r["backend"] for r in rows} - {"torch", "torch local", "scipy"}),
                "scipy"]
    for backend in backends:
        for batch in sorted({r["batch"] for r in rows if r["backend"] == backend}):
            pts = sorted((r["passages"], r["queries_per_s"], r["batch"] / r["queries_per_s"]) for r in rows
                         if r["backend"] == backend and r["batch"] == batch)
            if not pts:
                continue
            x, qps, spb = zip(*pts)
            slope = result["slopes"]["per_backend_batch"].get(f"{backend}_batch{batch}")
            lab = f"{backend} batch {batch}" + (f" (slope {slope:.2f})" if slope is not None else "")
            ax[0, 1].loglog(x, qps, styles.get(backend, "o-."), label=lab)
            ax[1, 0].loglog(x, spb, styles.get(backend, "o-."), label=lab)
    ax[0, 1].set(title="query throughput", xlabel="passages", ylabel="questions / s")
    ax[1, 0].set(title="time per call (batch of questions)", xlabel="passages", ylabel="seconds")
    ax[1, 1].semilogx(P, [s["index_bytes_per_passage"] for s in sizes], "o-", label="index (embeddings + CSR)")
    ax[1, 1].semilogx(P, [s["graph_bytes"] / s["passages"] for s in sizes], "s-", label="device graph (query tensors)")
    for backend in backends[:-1]:
        peak = sorted((r["passages"], r["peak_mem_bytes"] / r["passages"]) for r in rows
                      if r["backend"] == backend and r["batch"] == max(x["batch"] for x in rows))
        if peak:
            ax[1, 1].semilogx(*zip(*peak), "^--", label=f"{backend} peak RSS at the largest batch")
    ax[1, 1].set(title=f"bytes per passage (dim {sizes[0]['dim']})", xlabel="passages", ylabel="bytes")
    for a in ax.flat:
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"linearrag_torch scaling, {result['machine']['description']}, {result['date']}")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="numbers of passages")
    ap.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES), help="batch sizes")
    ap.add_argument("--device", default="cpu", help="torch device of the torch backend (cpu, cuda, auto)")
    ap.add_argument("--backends", nargs="+", default=["torch"], choices=["torch", "scipy"],
                    help="the torch engine and/or the scipy reference (its float64 copies need about 3x the "
                         "memory of the index)")
    ap.add_argument("--ppr-modes", nargs="+", default=["defaults"], choices=["exact", "local", "defaults"],
                    help="the torch backend's PageRank: 'exact' (row backend 'torch'), 'local' ('torch local', "
                         "with --reset-passages and --ppr-eps) and/or 'defaults' ('torch defaults': "
                         "RetrievalConfig() as it is, ppr_mode auto)")
    ap.add_argument("--exact-reset-passages", type=int, default=0, help="reset_passages of the exact rows")
    ap.add_argument("--reset-passages", type=int, default=RetrievalConfig().reset_passages or AUTO_RESET_PASSAGES,
                    help="reset_passages of the local rows")
    ap.add_argument("--reset-minmax", default=RetrievalConfig().reset_minmax, choices=["global", "top"])
    ap.add_argument("--ppr-eps", type=float, default=RetrievalConfig().ppr_eps, help="ppr_eps of the local rows")
    ap.add_argument("--ann", nargs="*", default=[], choices=["ivf", "ivfpq", "hnsw"],
                    help="also the local rows with these ANN stages (RetrievalConfig.ann; needs faiss)")
    ap.add_argument("--ann-probe", type=int, default=RetrievalConfig().ann_probe, help="ann_probe of the ANN rows")
    ap.add_argument("--ann-lists", type=int, default=RetrievalConfig().ann_lists, help="ann_lists of the ANN rows")
    ap.add_argument("--ann-cache", default=None, help="ann_cache of the ANN rows (a folder; default: build in memory)")
    ap.add_argument("--agreement-questions", type=int, default=64,
                    help="questions on which the local rows' top 5 is compared with the exact mode's (0: none)")
    ap.add_argument("--dim", type=int, default=384,
                    help="embedding dimension of the synthetic corpora (384: all-MiniLM-L6-v2's, what `linearrag "
                         "index` builds)")
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="write each size's index to a folder here (its vectors block by block) and query it loaded "
                         "back, mapped from its files, as a saved index is (default: built and queried in memory)")
    ap.add_argument("--reuse-index", action="store_true",
                    help="with --index-dir: load a folder an earlier run wrote for the same size, dimension, dtype "
                         "and seed instead of writing it again")
    ap.add_argument("--embedding-dtype", default=IndexConfig().embedding_dtype, choices=list(EMBEDDING_TORCH_DTYPES),
                    help="the dtype the index stores its vectors in (IndexConfig.embedding_dtype; default: an "
                         "index's default)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch (and BLAS) threads; 1 by default: on a shared machine it gives steady numbers")
    ap.add_argument("--scipy-questions", type=int, default=8, help="questions the scipy reference is timed on")
    ap.add_argument("--min-questions", type=int, default=8, help="time torch calls until this many questions ran")
    ap.add_argument("--max-call-s", type=float, default=150.0,
                    help="time only some chunks of a batch that would take longer than this (see time_torch)")
    ap.add_argument("--memory-budget", default=None, help="engine working-memory budget, e.g. 4G (default: engine's)")
    ap.add_argument("--real", type=_real_folder, default=DEFAULT_REAL if DEFAULT_REAL.is_dir() else None,
                    help="real corpus folder (corpus.jsonl) to measure statistics on, or 'none' (the statistics kept "
                         "by --merge, else those measured on 2wiki, DEFAULT_STATS); default: "
                         "../shared/datasets/2wiki beside the repository when present")
    ap.add_argument("--encode-sample", type=int, default=256, help="texts per kind encoded to estimate encoding time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, required=True, help="write (or with --merge, update) this JSON file")
    ap.add_argument("--png", type=Path, default=None, help="plots (default: the JSON path with .png)")
    ap.add_argument("--glibc-default", action="store_true",
                    help="leave glibc's allocator settings alone (default: memory.keep_freed_memory(), as the CLI does)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the sizes and rows of an existing --json file that this run does not redo")
    args = ap.parse_args(argv)
    if args.memory_budget:
        from linearrag_torch.retrieval.memory import parse_bytes

        args.memory_budget = parse_bytes(args.memory_budget)
    return args


def _real_folder(value: str) -> Path | None:
    """--real: a corpus folder, or 'none'."""
    if value.lower() == "none":
        return None
    path = Path(value)
    if not (path / "corpus.jsonl").is_file():
        raise argparse.ArgumentTypeError(f"{path}: no corpus.jsonl there")
    return path


def fits(passages: int, sizes: dict, margin: float = 0.9) -> tuple:
    """Whether a size of ``passages`` fits in memory, extrapolated linearly from the largest size measured below it
    (its peak RSS a passage, build and rows) against the memory available to this process (MemAvailable and what
    it holds now, which that size frees): (fits, estimated bytes, available bytes); True without such a size."""
    below = [s for p, s in sizes.items() if p < passages and s.get("peak_rss_per_passage")]
    avail = _mem_available() + (status_bytes("VmRSS") or 0)
    if not below or not avail:
        return True, None, avail
    est = max(below, key=lambda s: s["passages"])["peak_rss_per_passage"] * passages
    return est <= margin * avail, est, avail


def _mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 where unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def prepare(args):
    """Device, threads, allocator; the statistics of the synthetic corpora (measured on --real, or kept
    from the --merge file, else DEFAULT_STATS) and the sizes and rows of the --merge file this run keeps.
    Returns (device, malloc_kept, stats, real, generator, sizes, rows)."""
    device = pick_device(args.device)
    torch.set_num_threads(args.threads)
    from linearrag_torch.retrieval.memory import keep_freed_memory

    malloc_kept = False if args.glibc_default else keep_freed_memory()
    try:  # the reference's BLAS gets the same number of threads
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    old = json.loads(args.json.read_text()) if args.merge and args.json.is_file() else {}
    real = old.get("real_corpus")
    if args.real is not None:
        log(f"measuring the real corpus {args.real} ...")
        real = measure_real_corpus(args.real, args.encode_sample, args.seed)
        log(json.dumps({k: real["stats"][k] for k in ("passages", "sentences_per_passage", "entities_per_sentence",
                                                        "entities_per_passage", "zipf", "vocabulary_per_passage")}))
    generator = old.get("generator")
    if real and (args.real is not None or not generator):
        log("calibrating the generator on the real statistics ...")
        generator = calibrate_generator(real["stats"], seed=args.seed)
    stats = dict(DEFAULT_STATS)
    if real:
        stats.update({k: real["stats"][k] for k in ("sentences_per_passage", "zipf")})
        stats.update({k: generator[k] for k in ("entities_per_sentence", "repeat", "vocabulary_per_passage",
                                                "extra_ratio")})
    sizes = {s["passages"]: s for s in old.get("sizes", [])}
    rows = [r for r in old.get("rows", []) if r["passages"] not in args.sizes
            or r["backend"].split()[0] not in args.backends or r["batch"] not in args.batch
            or (r["backend"] == "torch" and r["device"] != str(device))]
    return device, malloc_kept, stats, real, generator, sizes, rows


def report(args, argv, device, malloc_kept, stats, real, generator, sizes, rows, skipped=()) -> dict:
    """The result so far, written to --json (after every size: a long run keeps what it did)."""
    result = {
        "benchmark": "scaling", "date": datetime.date.today().isoformat(), "machine": {**machine(device, args.threads),
                                                          "malloc_keep_freed_memory": malloc_kept},
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.scaling"] + (argv or sys.argv[1:])),
        "cpu_caps": _cpu_caps(),
        "config": RetrievalConfig().to_dict(), "synthetic_stats": stats, "generator": generator,
        "real_corpus": real,
        "sizes": sorted(sizes.values(), key=lambda s: s["passages"]),
        "skipped_sizes": list(skipped),
        "cgroup_memory": cgroup_memory(),  # a run in a memory-limited cgroup: the limit and the most it held
        "rows": sorted(rows, key=lambda r: (r["passages"], r["backend"], r["batch"])),
    }
    result.update(summarise(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    return result


def merge_size(old: dict, new: dict) -> dict:
    """A size's entry of a --merge run: the new run's measurements, with the old top-5 agreement kept when this run
    measured none, and every run's ANN stages listed under "ann_runs" (a first build and later cache reads)."""
    out = {**old, **new}
    if not new.get("top5_same_as_exact_percent") and old.get("top5_same_as_exact_percent"):
        out["top5_same_as_exact_percent"] = old["top5_same_as_exact_percent"]
    runs = old.get("ann_runs", [old["ann"]] if "ann" in old else [])
    if "ann" in new:
        out["ann_runs"] = runs + [new["ann"]]
    return out


def _cpu_caps() -> dict:
    """The instruction-set caps this run had (environment), what torch's precision choice made of them, and the
    FAISS build and SIMD level (the ANN rows)."""
    from linearrag_torch.env import native_bf16

    out = {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                          "FAISS_SIMD_LEVEL")}
    out["native_bf16"] = bool(native_bf16("cpu"))
    try:
        import faiss

        out["faiss"] = faiss.__version__
        out["faiss_simd_level"] = faiss.SIMDConfig.get_level_name()
    except (ImportError, AttributeError):
        pass
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    device, malloc_kept, stats, real, generator, sizes, rows = prepare(args)
    skipped = []
    for P in args.sizes:  # run
        ok, est, avail = fits(P, sizes)
        if not ok:
            log(f"{P:>9,} passages: skipped, about {est / 2**30:.1f} GiB by the last size's peak a passage, "
                f"{avail / 2**30:.1f} GiB available")
            skipped.append({"passages": P, "estimated_peak_bytes": est, "available_bytes": avail})
            continue
        info, new_rows = run_size(P, stats, args, device, log)
        peaks = [info["build_peak_mem_bytes"]] + [r["peak_mem_bytes"] for r in new_rows if "peak_mem_bytes" in r]
        info["peak_rss_per_passage"] = max(peaks) / P
        sizes[P] = merge_size(sizes.get(P, {}), info)
        rows += new_rows
        report(args, argv, device, malloc_kept, stats, real, generator, sizes, rows, skipped)  # what is done so far
    result = report(args, argv, device, malloc_kept, stats, real, generator, sizes, rows, skipped)
    plot(result, args.png or args.json.with_suffix(".png"))
    log(json.dumps({k: result[k] for k in ("slopes", "slopes_cpu_time", "torch_over_scipy_pooled")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
