"""The torch backend: one batched call from encoded questions to ranked passages.

``DeviceGraph`` holds the tensors the query path multiplies by, on one device; it is the whole index as a
round.Part, so the graph round (round.py: eqs. 3-7) runs on it as on a shard of the sharded engine, through the
communicator's one-process form (every collective the identity). ``retrieve`` runs a batch through the stage
list (stages.py: graph rounds, the chain, the rerankers, top-k).
"""
from __future__ import annotations

import dataclasses
import functools
from contextlib import contextmanager

import torch

from ..env import native_half
from . import ann, local_round, pairs, rerank_stage, stages
from .activation import WHOLE_INDEX, ColumnEntries, NearestMemo
from ..config import RetrievalConfig
from ..index import TriGraphIndex
from .memory import default_chunk_budget, read_at_random
from .local_ppr import PushGraph
from .pagerank import PPRGraph, StepLog
from ..queries import EncodedQueries, Retrieved
from ..rerank import load_reranker
from ..runtime import tracing
from ..runtime.comm import ONE_PROCESS
from .round import Trace, activate, graph_round
from .chain import ChainTables, enabled as chain_enabled
from .stages import PartChain

# bytes of working memory one question needs (see DeviceGraph.bytes_per_question): per passage, the
# [P, B] float32 state (cosines, eq. 7 terms, the PageRank reset, iterate and buffer, scores, top-k);
# per row of the PageRank's entity space (entities of degree >= 2 and one leaf bucket per passage), its
# reset, iterate and buffer; per entity in paper mode, the dense [E, B] activation state. The other modes
# keep stage 1 as index lists over the active pairs. With margin over peak RSS measured on synthetic
# 2WikiMultiHopQA-like graphs (benchmarks/scaling.py).
BYTES_PER_PASSAGE = 32
BYTES_PER_WALK_ROW = 16
BYTES_PER_ENTITY_PAPER = 32


def query_embeddings(emb: torch.Tensor, device, upcast: bool | None = None) -> torch.Tensor:
    """Stored vectors as the query path multiplies them on ``device``: float32 ones as they are; half ones
    (IndexConfig.embedding_dtype) kept half (half the memory; the products run in that dtype, see cosines)
    unless ``upcast`` (None: when the device lacks native arithmetic in it, native_half), then float32 once here."""
    if emb.dtype == torch.float32:
        return emb.to(device)
    if upcast is None:
        upcast = not native_half(emb.dtype, device)
    return emb.to(device, torch.float32) if upcast else emb.to(device)


def cosines(emb: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """emb [N, D] @ q [B, D]ᵀ as float32 [N, B]. With half ``emb`` the product runs in its dtype (the
    question vectors rounded to it; AMX and tensor cores accumulate in float32): off the CPU with a float32
    result (torch.mm's out_dtype), on the CPU rounded to that dtype and then widened."""
    if emb.dtype == q.dtype:
        return emb @ q.T
    qh = q.to(emb.dtype)
    if emb.device.type != "cpu":
        try:
            return torch.mm(emb, qh.T, out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):  # a torch or device without it
            pass
    return (emb @ qh.T).float()


class DeviceGraph:
    """The tensors the query path multiplies by, prepared once per index and device.

    M [S, E] and its transpose MT [E, S] as real CSR (torch's .t() is a slow CSC view on CPU),
    N_log [P, E] = ln(1 + N), and the PPR operator (built lazily per adjacent_passages setting).
    The embeddings stay in a half-precision index's dtype where the device computes in it natively and
    ``upcast`` is not True (query_embeddings), or where the index's settings take the ANN stage at its size
    (ann.gathers_only: its vectors are then only gathered, never multiplied whole); scores and everything after
    them are float32. Vectors mapped from an index folder stay mapped (read_at_random: no read-ahead).
    As a round.Part it is the whole index: passages from row 0, every entity held, the identity communicator.
    """

    comm = ONE_PROCESS
    lo = 0
    rows = WHOLE_INDEX

    def __init__(self, index: TriGraphIndex, device="cpu", memory_budget: int | None = None,
                 upcast: bool | None = None):
        self.device = torch.device(device)
        self.index = index
        self.memory_budget = memory_budget  # None: memory.default_chunk_budget(device, ...) at query time
        M = index.M.to("cpu")
        MT = M.transpose()
        self.M_crow, self.M_col = M.crow.to(self.device), M.col.to(self.device)
        self.MT_crow, self.MT_col = MT.crow.to(self.device), MT.col.to(self.device)
        N = index.N.to("cpu")
        self.N_logT = N.with_values(torch.log1p(N.val)).transpose().to(self.device)  # eq. 7: active entities' columns
        self._torch_csr = {}
        if upcast is None and ann.gathers_only(index, self.device):
            upcast = False  # the vectors are only gathered, row by row: no float32 copy of a half index
        self.passage_emb = query_embeddings(index.passage_emb, self.device, upcast)
        self.sentence_emb = query_embeddings(index.sentence_emb, self.device, upcast)
        self.entity_emb = query_embeddings(index.entity_emb, self.device, upcast)
        for emb in (self.passage_emb, self.sentence_emb, self.entity_emb):
            read_at_random(emb)  # mapped from an index file: a gathered row reads its page, not a read-ahead window
        self._ppr = {}
        self._push = {}  # adjacent_passages -> local_ppr.PushGraph (ppr_mode="local")
        self.nearest_memo = NearestMemo()  # eq. 3's scan (keeping_last: a chain's later round repeats it)
        self._pair_C = None  # (C crow, C col, passages per entity, {max passages: linking entities}): pairs.rerank
        self._chain = None  # chain.ChainTables on this device, made on first use
        self._last_cosines = None  # (questions, their passage cosines): see passage_cosines
        self._keep = False
        self._rerankers = {}  # (folder ("" = the packaged model), precision) -> rerank.Reranker on this device

    def reranker(self, folder: str = "", precision: str = "float32"):
        """The learned reranker (rerank.Reranker) from ``folder`` ("" = the one shipped with the package) in
        ``precision`` (rerank.scoring.resolve_precision), loaded once on this graph's device."""
        got = self._rerankers.get((folder, precision))
        if got is None:
            got = self._rerankers[(folder, precision)] = load_reranker(folder or None, self.device, precision)
        return got

    def rerank_passages(self, reranker):
        """This index's passages tokenised for ``reranker`` (once per index and reranker)."""
        return reranker.passage_tokens(self.index)

    @contextmanager
    def keeping_last(self, keep: bool = True):
        """Within the block (with ``keep``), passage_cosines keeps its last answer and ``nearest`` its last scan,
        for a chain's later rounds, which ask again for the same questions; afterwards both are dropped."""
        self._keep = keep
        try:
            yield self
        finally:
            self._keep = False
            self._last_cosines = None
            self.nearest_memo.clear()

    def passage_cosines(self, query_emb: torch.Tensor) -> torch.Tensor:
        """cosines(passage_emb, query_emb) [P, B]; within keeping_last the last answer is kept and given again for
        equal question vectors (then shared: callers do not write to it). A chain's later round passes the same
        tensor again, which is recognised without comparing values (a read on the host)."""
        last = self._last_cosines
        if last is not None and (last[0] is query_emb or (last[0].shape == query_emb.shape and
                                                         last[0].device == query_emb.device and
                                                         torch.equal(last[0], query_emb))):
            return last[1]
        sim = cosines(self.passage_emb, query_emb)
        self._last_cosines = (query_emb, sim) if self._keep else None
        return sim

    @property
    def num_entities(self) -> int:
        return self.entity_emb.shape[0]

    def nearest(self, queries: EncodedQueries, cfg: RetrievalConfig):
        """round.Part.nearest: eq. 3's scan over every entity (nearest_memo), or the ANN stage's (cfg.ann,
        retrieval/ann.py), in a half index's dtype; a question entity with a stored vector of this index
        (EncodedQueries.entity_rows) takes it without the scan."""
        known = queries.entity_rows if queries.rows_of is self.index else None  # stored vectors' rows (pipeline.py)
        q_ent = queries.entity_emb.to(self.entity_emb.dtype)
        found = ann.nearest_entities(self, q_ent, known, cfg)
        return found if found is not None else self.nearest_memo(self.entity_emb, q_ent, known)

    def local_entries(self, entries: ColumnEntries) -> ColumnEntries:
        """round.Part.local_entries: every entity is held here, its row its id."""
        return entries

    def entity_vectors(self, e: torch.Tensor) -> torch.Tensor:
        """round.Part.entity_vectors: the entities' vectors as the query path multiplies them."""
        return self.entity_emb.index_select(0, e)

    def local_seeds(self, seeds):
        """round.Part.local_seeds: every entity is held here."""
        return seeds

    def walk(self, cfg: RetrievalConfig) -> PPRGraph:
        """round.Part.walk: the PageRank operator for cfg.adjacent_passages (ppr_graph)."""
        return self.ppr_graph(cfg.adjacent_passages)

    def _csr(self, name: str, make) -> torch.Tensor:
        if name not in self._torch_csr:
            m = make()
            self._torch_csr[name] = m.torch(self.device, index_dtype=m.compact_index_dtype())
        return self._torch_csr[name]

    @property
    def M(self) -> torch.Tensor:
        """M [S, E] as torch CSR (paper mode), made on first use."""
        return self._csr("M", lambda: self.index.M.to("cpu"))

    @property
    def MT(self) -> torch.Tensor:
        """Mᵀ [E, S] as torch CSR (paper mode), made on first use."""
        return self._csr("MT", lambda: self.index.M.to("cpu").transpose())

    @property
    def N_log(self) -> torch.Tensor:
        """ln(1 + N) [P, E] as torch CSR, made on first use (the engine itself uses N_logT)."""
        return self._csr("N_log", lambda: self.N_logT.to("cpu").transpose())

    @property
    def chain_tables(self):
        """chain.ChainTables of this index on this device (PS and its transpose, title-line flags, this graph's M,
        Mᵀ and vectors), made on first use."""
        if self._chain is None:
            self._chain = ChainTables.build(self.index, self.device, self.sentence_emb, self.entity_emb,
                                            (self.M_crow, self.M_col, self.MT_crow, self.MT_col))
        return self._chain

    def ppr_graph(self, adjacent_passages: bool) -> PPRGraph:
        if adjacent_passages not in self._ppr:
            self._ppr[adjacent_passages] = PPRGraph.build(self.index.C, adjacent_passages, self.device)
        return self._ppr[adjacent_passages]

    def push_graph(self, adjacent_passages: bool) -> PushGraph:
        """The walk of eq. 6 for the local PageRank (local_ppr.PushGraph), built on first use."""
        if adjacent_passages not in self._push:
            self._push[adjacent_passages] = PushGraph.build(self.index.C, adjacent_passages, self.device)
        return self._push[adjacent_passages]

    def pair_rerank(self, queries: EncodedQueries, out: Retrieved, cfg: RetrievalConfig) -> Retrieved:
        """pairs.rerank of ``out`` for these questions (C's structure kept on the device on first use)."""
        N = min(cfg.pair_candidates, out.indices.shape[1])
        if N < 2:
            return out
        if self._pair_C is None:
            C = self.index.C
            col = C.col.to(self.device)
            self._pair_C = (C.crow.to(self.device), col, torch.bincount(col, minlength=self.entity_emb.shape[0]), {})
        crow, col, passages_with, linking = self._pair_C
        if cfg.pair_link_max_passages not in linking:
            linking[cfg.pair_link_max_passages] = pairs.link_entities(passages_with, cfg.pair_link_max_passages)
        idx = out.indices.to(self.device)
        cand = idx[:, :N]
        link = pairs.linked(*pairs.candidate_entities(crow, col, linking[cfg.pair_link_max_passages], cand),
                            cand.shape[0], N)
        vecs = self.passage_emb[cand.clamp(min=0)]
        return pairs.rerank(Retrieved(idx, out.scores.to(self.device)), queries.query_emb, vecs, link,
                            queries.has_entities(), cfg)

    def bytes_per_question(self, cfg: RetrievalConfig | None = None) -> int:
        """Working memory of one question of a batch, in bytes (an estimate with margin)."""
        P, E = self.passage_emb.shape[0], self.entity_emb.shape[0]
        cfg = ann.for_graph(cfg or RetrievalConfig(), self)
        walk = self._ppr.get(cfg.adjacent_passages)
        rows = walk.to_entities.shape[0] if walk is not None else E
        if cfg.ppr_mode == "local" and cfg.use_ppr:
            rows = 0  # the push's table grows with its threshold, not with the corpus
        if local_round.asked(cfg, self.device):  # no [P, B] tensor: the ANN's candidates (index lists of 3 words)
            P = min(P, ann.passage_search(cfg.reset_passages, cfg))
        paper = cfg.use_activation and cfg.mode == "paper"
        return BYTES_PER_PASSAGE * P + BYTES_PER_WALK_ROW * rows + (BYTES_PER_ENTITY_PAPER * E if paper else 0)

    def questions_per_chunk(self, memory_budget: int | None = None, cfg: RetrievalConfig | None = None) -> int:
        """How many questions one chunk of a batch holds within the memory budget (at least 1)."""
        budget = memory_budget if memory_budget is not None else self.memory_budget
        per_question = max(self.bytes_per_question(cfg), 1)
        if budget is None:
            budget = default_chunk_budget(self.device, per_question)
        return max(1, int(budget) // per_question)

    def nbytes(self) -> int:
        """Bytes of the query tensors this graph holds beyond the index's own (nbytes_by_part, summed)."""
        return sum(self.nbytes_by_part().values())

    def nbytes_by_part(self) -> dict:
        """Bytes this graph holds beyond its index's tensors (TriGraphIndex.nbytes_by_part), by part, each storage
        counted once: "vectors" (the passage, sentence and entity vectors where the graph made copies of them: float32
        ones of a half index on a device without native half arithmetic, or another device's), "activation" (M and Mᵀ
        as the activation reads them), "eq7" (ln(1 + N) by entity), "walk" (the exact PageRank's operators), "push"
        (the local PageRank's graph and its kept workspace), "chain" (the chain's tables), "pairs" (the pair rerank's
        tables) and "ann" (the FAISS indexes built for it, retrieval/ann.py)."""
        seen = {_storage_key(t) for t in self.index.tensors()}
        parts = {}

        def add(part, *tensors):
            n = 0
            for t in tensors:
                if t is None:
                    continue
                if t.layout == torch.sparse_csr:
                    n += sum(_count_new(x, seen) for x in (t.crow_indices(), t.col_indices(), t.values()))
                else:
                    n += _count_new(t, seen)
            parts[part] = parts.get(part, 0) + n

        add("vectors", self.passage_emb, self.sentence_emb, self.entity_emb)
        add("activation", self.M_crow, self.M_col, self.MT_crow, self.MT_col, *self._torch_csr.values())
        add("eq7", self.N_logT.crow, self.N_logT.col, self.N_logT.val)
        for g in self._ppr.values():
            add("walk", *(getattr(g, f.name) for f in dataclasses.fields(g)
                          if isinstance(getattr(g, f.name), torch.Tensor)))
        for g in self._push.values():
            add("push", g.crow, g.col, g.val, g.strength)
            # the compiled push's per-thread arrays (kernels/push.py _scratch): numpy, kept between batches
            parts["push"] += sum(a.nbytes for pair in g.workspace.get("push_scratch", ()) for a in pair)
        if self._chain is not None:
            add("chain", *(getattr(self._chain, f.name) for f in dataclasses.fields(self._chain)
                           if isinstance(getattr(self._chain, f.name), torch.Tensor)))
        if self._pair_C is not None:
            add("pairs", *self._pair_C[:3], *self._pair_C[3].values())
        parts["ann"] = sum(a.nbytes() for a in ann.built(self).values())
        return parts


def _storage_key(t: torch.Tensor):
    """What identifies a tensor's memory: its storage's device and address."""
    return (t.device, t.untyped_storage().data_ptr())


def _count_new(t: torch.Tensor, seen: set) -> int:
    """The bytes of ``t``'s storage if not ``seen`` yet (then marked seen), else 0."""
    key = _storage_key(t)
    if key in seen:
        return 0
    seen.add(key)
    return t.untyped_storage().nbytes()


def activate_pairs(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig):
    """Eqs. 3-5 for a batch on the whole index (round.activate): (seed keys, seed values, ActivePairs)."""
    return activate(graph, queries.to(graph.device), cfg)


def in_inference_mode(fn):
    """``fn`` run under torch.inference_mode (a question's many small ops cost less on CPU without the autograd
    bookkeeping: the figures are in docs/benchmarks/throughput.md), its tensors
    returned as ordinary copies, so that a caller may change them in place; called inside inference mode (a
    nested call), it runs as it is."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            res = fn(*args, **kwargs)
        return _ordinary(res)

    return run


def _ordinary(value):
    """Copies, made outside inference mode, of the tensors in a result (Retrieved, Trace, tuples and lists)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return type(value)(*map(_ordinary, value)) if hasattr(value, "_fields") else tuple(map(_ordinary, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _ordinary(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, list):
        return [_ordinary(v) for v in value]
    return value


class TorchBackend(PartChain):
    """The torch engine's operations for the stage list (stages.Backend) on one DeviceGraph."""

    def __init__(self, graph: DeviceGraph, memory_budget: int | None = None, steps: StepLog | None = None,
                 encoder=None):
        self.graph = graph
        self.memory_budget = memory_budget
        self.steps = steps  # the PageRank steps of every round are recorded here when given
        self.encoder = encoder  # stage 0: (questions, cfg, timings) -> EncodedQueries, or None

    def encode(self, questions, cfg, timings):
        if self.encoder is None:
            raise ValueError("a batch of question strings needs the question path: pass encode= to retrieve "
                             "(LinearRAG.search does), or encode the questions first (LinearRAG.encode_queries)")
        return self.encoder(questions, cfg, timings).to(self.graph.device)

    @property
    def part(self):
        return self.graph

    @property
    def tables(self):
        return self.graph.chain_tables

    def round(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool):
        res = graph_round(self.graph, queries, cfg, trace, self.memory_budget, self.steps)
        return res if trace else (res, None)

    def pair_rerank(self, queries, ranking, cfg):
        return self.graph.pair_rerank(queries, ranking, cfg)

    def learned_rerank(self, queries, ranking, cfg, candidates, known=None, **set_reading):
        reranker = self.graph.reranker(cfg.reranker, cfg.reranker_precision)
        return rerank_stage.apply(reranker, self.graph.rerank_passages(reranker), queries, ranking, candidates, known,
                                  **set_reading, **rerank_stage.passes(cfg))

    @property
    def num_entities(self) -> int:
        return self.graph.entity_emb.shape[0]

    @property
    def entity_names(self) -> list:
        return self.graph.index.entities


@in_inference_mode
def retrieve(graph: DeviceGraph, queries, cfg: RetrievalConfig, trace: bool | str = False,
             memory_budget: int | None = None, timings: dict | None = None, encode=None):
    """Rank passages for a batch of encoded questions. Returns Retrieved, and with ``trace`` (Retrieved, Trace).

    ``queries``: EncodedQueries, or a list of question strings with ``encode`` (a function (questions, cfg,
    timings) -> EncodedQueries, e.g. LinearRAG.encode_queries'), which then runs as stage 0 of the stage list.

    The batch runs through the stage list of ``cfg`` (stages.plan: graph rounds, the reranker in the loop, the
    pair rerank, the learned rerank, top-k); each graph round runs in chunks of graph.questions_per_chunk(
    memory_budget, cfg) questions. ``timings``: seconds added to timings["graph"] and timings["rerank"].
    Runs under torch.inference_mode and returns ordinary tensors (in_inference_mode).
    ``trace``: True, the whole Trace; a traced batch counts its host reads and torch calls (Trace.host_reads,
    Trace.torch_calls; the count sees every torch call from Python, which with the trace's own work makes a
    traced call markedly slower on the CPU). "steps": a Trace holding only the PageRank's steps
    (Trace.ppr_steps), recorded without reading anything back to the host: what benchmarks time the steps by.
    """
    if trace not in (False, True, "steps"):
        raise ValueError(f"trace must be False, True or 'steps', got {trace!r}")
    cfg = ann.for_graph(cfg, graph)  # ppr_mode and ann "auto": the walk and the scans for this index's size
    steps = StepLog() if trace else None
    if trace is True and tracing.active() is None:  # the outermost call of a traced batch counts it
        with tracing.OpCounter() as counter:
            out, tr = _run(graph, queries, cfg, True, memory_budget, timings, steps, encode)
        tr.host_reads, tr.torch_calls = counter.host_reads, counter.calls
    elif trace is True:
        out, tr = _run(graph, queries, cfg, True, memory_budget, timings, steps, encode)
    else:
        out = _run(graph, queries, cfg, False, memory_budget, timings, steps, encode)
        if steps is None:
            return out
        tr = Trace()
    tr.ppr_steps = steps
    return out, tr


def _run(graph: DeviceGraph, queries, cfg: RetrievalConfig, trace: bool, memory_budget, timings,
         steps: StepLog | None, encode=None):
    # the rounds of a chain whose batch runs in one chunk share its passage cosines and eq. 3's scan (kept only
    # for the chain: a kept [P, B] product would add to a chunked batch's memory budget)
    B = len(queries) if isinstance(queries, (list, tuple)) else queries.batch_size
    one_chunk = chain_enabled(cfg) and B <= graph.questions_per_chunk(memory_budget, cfg)
    with graph.keeping_last(one_chunk):
        return stages.run(TorchBackend(graph, memory_budget, steps, encode), queries, cfg, trace, timings)
