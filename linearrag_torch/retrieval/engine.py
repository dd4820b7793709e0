"""The torch backend: one batched call from encoded questions to ranked passages.

    seeds (eq. 3) -> sigma (eq. 4) -> activation (eq. 5, paper or reference mode)
    -> passage reset (eq. 7) -> personalized PageRank (eq. 6) -> top-k

Everything stays on the index's device; the batch state is (entities x B) / (passages x B), and
nothing of size (sentences x B) is formed (sigma is computed where a step needs it). A large batch
runs in chunks of questions sized from a memory budget (memory.py, ``DeviceGraph.questions_per_chunk``); the answer for a
question does not depend on the chunk it runs in.
"""
from __future__ import annotations

import dataclasses
import functools
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .. import kernels
from ..env import native_half
from . import ann, local_round, pairs, rerank_stage, stages
from .activation import (Activation, ActivePairs, ColumnEntries, NearestMemo, dense_seeds, propagate_paper, propagate_reference_pairs,
                         seed_pairs)
from ..config import RetrievalConfig
from ..index import TriGraphIndex
from .memory import default_chunk_budget
from .local_ppr import PushGraph, local_pagerank
from .pagerank import PPRGraph, StepLog, passage_reset_entries, personalized_pagerank, sparse_reset_entries
from ..queries import EncodedQueries, Retrieved
from ..rerank import load_reranker
from ..runtime import tracing
from .chain import ChainTables, enabled as chain_enabled
from .stages import LocalChain

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
    ``upcast`` is not True (query_embeddings); scores and everything after them are float32.
    """

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
        self.passage_emb = query_embeddings(index.passage_emb, self.device, upcast)
        self.sentence_emb = query_embeddings(index.sentence_emb, self.device, upcast)
        self.entity_emb = query_embeddings(index.entity_emb, self.device, upcast)
        self._ppr = {}
        self._push = {}  # adjacent_passages -> local_ppr.PushGraph (ppr_mode="local")
        self.nearest = NearestMemo()  # eq. 3's scan (keeping_last: a chain's later round repeats it)
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
            self.nearest.clear()

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
        cfg = cfg or RetrievalConfig()
        P, E = self.passage_emb.shape[0], self.entity_emb.shape[0]
        walk = self._ppr.get(cfg.adjacent_passages)
        rows = walk.to_entities.shape[0] if walk is not None else E
        if cfg.ppr_mode == "local" and cfg.use_ppr:
            rows = 0  # the push's table grows with its threshold, not with the corpus
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
        """Bytes of the query tensors on the device (embeddings, sparse matrices, PPR operator)."""
        tensors = [self.passage_emb, self.sentence_emb, self.entity_emb, self.M_crow, self.M_col, self.MT_crow,
                   self.MT_col, self.N_logT.crow, self.N_logT.col, self.N_logT.val]
        mats = list(self._torch_csr.values()) + [m for g in self._ppr.values()
                                              for m in (g.to_passages, g.to_entities, g.between_passages) if m is not None]
        n = sum(t.numel() * t.element_size() for t in tensors)
        for m in mats:
            n += sum(t.numel() * t.element_size() for t in (m.crow_indices(), m.col_indices(), m.values()))
        return n


@dataclass
class Trace:
    """Intermediate state of a batch, for diagnostics, the demo and benchmarks (tensors on the device).

    ``retrieve(..., trace=True)`` fills every field; ``trace="steps"`` only ``ppr_steps`` (cheap enough to time
    a call with)."""

    seeds: torch.Tensor | None = None  # [E, B]
    is_seed: torch.Tensor | None = None  # [E, B] bool
    activation: Activation | None = None
    dense: torch.Tensor | None = None  # [B] bool: answered by dense retrieval
    chain_seeds: list | None = None  # per question [(entity, seed score)] of the later rounds (chain.py)
    pair_ranks: list | None = None  # per question the ranks (1-based) before the pair rerank of its first two hits
    rerank: object = None  # rerank.Reranked of the rerank stage (rerank_stage.py), None without it
    rounds: list | None = None  # each graph round's own ranking (Retrieved; after its loop rerank), in order
    # what the batch asked of Python (runtime/tracing.py; the trace's own diagnostics aside): the values it read
    # back to the host (on CUDA each waits for the device) and its torch calls, which grow with the PageRank's
    # steps, not with the batch (no step runs per question)
    host_reads: int | None = None
    torch_calls: int | None = None
    # the PageRank steps of every graph round (pagerank.StepLog: each step's operator, working columns, L1
    # change and time marks), in order
    ppr_steps: StepLog | None = field(default=None, compare=False)


def activate_pairs(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig):
    """Eqs. 3-5 for a batch, as index lists: (seed keys, seed values, ActivePairs); keys = e * B + b.
    Sigma (eq. 4) is computed lazily from (sentence_emb, query_emb) for the (sentence, question) pairs
    the activation visits. Only paper mode forms dense [E, B] state."""
    B, E = queries.batch_size, graph.entity_emb.shape[0]
    known = queries.entity_rows if queries.rows_of is graph.index else None  # stored vectors' rows (pipeline.py)
    # half embeddings: the nearest-entity scan in their dtype, the seed values float32 from there on
    q_ent = queries.entity_emb.to(graph.entity_emb.dtype)
    nearest = None
    if q_ent.shape[0] and graph.entity_emb.shape[0]:  # eq. 3's scan, or the ANN's (cfg.ann; None: the scan)
        nearest = ann.nearest_entities(graph, q_ent, known, cfg) or graph.nearest(graph.entity_emb, q_ent, known)
    keys, vals = seed_pairs(graph.entity_emb, q_ent, queries.entity_owner, B, known, nearest)
    vals = vals.float()
    sigma = (graph.sentence_emb, queries.query_emb)  # float32 sigma either way (kernels.gather_sigma)
    if not cfg.use_activation:
        act = ActivePairs.from_keys(keys, vals, torch.ones_like(keys), vals, (E, B))
    elif cfg.mode == "paper":
        seeds, is_seed = dense_seeds(keys, vals, E, B)
        act = ActivePairs.from_activation(propagate_paper(graph.M, graph.MT, sigma, seeds, is_seed, cfg))
    else:
        act = propagate_reference_pairs(graph.M_crow, graph.M_col, graph.MT_crow, graph.MT_col, sigma, keys, vals, B, cfg)
    return keys, vals, act


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


class TorchBackend(LocalChain):
    """The torch engine's operations for the stage list (stages.Backend) on one DeviceGraph."""

    def __init__(self, graph: DeviceGraph, memory_budget: int | None = None, steps: StepLog | None = None):
        self.graph = graph
        self.memory_budget = memory_budget
        self.steps = steps  # the PageRank steps of every round are recorded here when given

    @property
    def tables(self):
        return self.graph.chain_tables

    def round(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool):
        res = graph_round(self.graph, queries, cfg, trace, self.memory_budget, self.steps)
        return res if trace else (res, None)

    def pair_rerank(self, queries, ranking, cfg):
        return self.graph.pair_rerank(queries, ranking, cfg)

    def learned_rerank(self, queries, ranking, cfg, candidates, known=None):
        reranker = self.graph.reranker(cfg.reranker, cfg.reranker_precision)
        return rerank_stage.apply(reranker, self.graph.rerank_passages(reranker), queries, ranking, candidates, known)

    @property
    def num_entities(self) -> int:
        return self.graph.entity_emb.shape[0]

    @property
    def entity_names(self) -> list:
        return self.graph.index.entities


@in_inference_mode
def retrieve(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool | str = False,
             memory_budget: int | None = None, timings: dict | None = None):
    """Rank passages for a batch of encoded questions. Returns Retrieved, and with ``trace`` (Retrieved, Trace).

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
    steps = StepLog() if trace else None
    if trace is True and tracing.active() is None:  # the outermost call of a traced batch counts it
        with tracing.OpCounter() as counter:
            out, tr = _run(graph, queries, cfg, True, memory_budget, timings, steps)
        tr.host_reads, tr.torch_calls = counter.host_reads, counter.calls
    elif trace is True:
        out, tr = _run(graph, queries, cfg, True, memory_budget, timings, steps)
    else:
        out = _run(graph, queries, cfg, False, memory_budget, timings, steps)
        if steps is None:
            return out
        tr = Trace()
    tr.ppr_steps = steps
    return out, tr


def _run(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool, memory_budget,
         timings, steps: StepLog | None):
    # the rounds of a chain whose batch runs in one chunk share its passage cosines and eq. 3's scan (kept only
    # for the chain: a kept [P, B] product would add to a chunked batch's memory budget)
    one_chunk = chain_enabled(cfg) and queries.batch_size <= graph.questions_per_chunk(memory_budget, cfg)
    with graph.keeping_last(one_chunk):
        return stages.run(TorchBackend(graph, memory_budget, steps), queries, cfg, trace, timings)


def graph_round(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool = False,
                memory_budget: int | None = None, steps: StepLog | None = None):
    """One graph round (eqs. 3-7) of cfg.top_k passages per question, in chunks of questions: Retrieved (and its
    Trace with ``trace``). ``steps``: the PageRank's steps are recorded there (pagerank.StepLog)."""
    queries = queries.to(graph.device)
    B = queries.batch_size
    if cfg.use_ppr and cfg.ppr_mode == "local":
        graph.push_graph(cfg.adjacent_passages)
    elif cfg.use_ppr:
        graph.ppr_graph(cfg.adjacent_passages)  # built once; its size enters the chunk size
    chunk = graph.questions_per_chunk(memory_budget, cfg)
    if B <= chunk:
        return _retrieve_chunk(graph, queries, cfg, trace, steps)
    parts = [_retrieve_chunk(graph, queries.slice(b, min(b + chunk, B)), cfg, trace, steps)
             for b in range(0, B, chunk)]
    outs = [p[0] for p in parts] if trace else parts
    out = Retrieved(torch.cat([o.indices for o in outs]), torch.cat([o.scores for o in outs]))
    if not trace:
        return out
    trs = [p[1] for p in parts]
    act = Activation(
        act=torch.cat([t.activation.act for t in trs], 1), tier=torch.cat([t.activation.tier for t in trs], 1),
        reset=torch.cat([t.activation.reset for t in trs], 1), steps=max(t.activation.steps for t in trs),
    )
    return out, Trace(torch.cat([t.seeds for t in trs], 1), torch.cat([t.is_seed for t in trs], 1), act,
                      torch.cat([t.dense for t in trs]))


def _retrieve_chunk(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool,
                    steps: StepLog | None = None):
    if local_round.applies(graph, cfg):  # local PageRank with the ANN stage: no [P, B] product
        return local_round.local_chunk(graph, queries, cfg, trace, steps, activate_pairs, Trace)
    B = queries.batch_size
    P, E = graph.passage_emb.shape[0], graph.entity_emb.shape[0]
    k = min(cfg.top_k, P)
    part = steps.stage if steps is not None else _no_stage  # seconds per part (StepLog.stage_s)
    with part("cosines"):
        sim = graph.passage_cosines(queries.query_emb)  # [P, B] float32 (shared: not written to)
    with part("seeds and activation"):
        seed_keys, seed_vals, act = activate_pairs(graph, queries, cfg)
    # the active (entity, question) pairs: eq. 7's sum and the PageRank reset are nonzero only there
    e, b = act.row, act.col
    use_graph = torch.zeros(B, dtype=torch.bool, device=graph.device)
    use_graph[b] = True  # a question without a seed (so nothing active) is answered by dense retrieval
    g = torch.nonzero(use_graph).flatten()
    scores = sim
    local = cfg.use_ppr and cfg.ppr_mode == "local"
    if g.numel():  # eqs. 7 and 6 for the questions with seeds only
        n = g.numel()
        # a chain's later round raises eq. 7's dense prior (chain.passage_prior); the dense fallback keeps sim
        prior = sim if queries.prior is None else queries.prior.apply(sim)
        if n < B:  # number those questions 0 .. n - 1
            col = torch.full((B,), -1, dtype=torch.int64, device=graph.device)
            col[g] = torch.arange(n, device=graph.device)
            bg, sim_g = col[b], prior.index_select(1, g)
        else:
            bg, sim_g = b, prior
        per_entity = ColumnEntries(e, bg, act.val / act.tier.to(sim.dtype), (E, n))
        if local:
            return _local_rest(graph, queries, cfg, trace, steps, sim, sim_g, per_entity,
                               ColumnEntries(e, bg, act.reset, (E, n)), use_graph, g, k, seed_keys, seed_vals, act)
        with part("reset"):
            reset_p = passage_reset_entries(sim_g, graph.N_logT, per_entity, cfg)
        if cfg.use_ppr:
            # the entity reset is nonzero only at active pairs (seeds and triggered entities)
            with part("pagerank"):
                ppr_p, _, valid = personalized_pagerank(graph.ppr_graph(cfg.adjacent_passages), reset_p,
                                                        ColumnEntries(e, bg, act.reset, (E, n)), cfg,
                                                        entity_scores=False, steps=steps)
        else:
            ppr_p, valid = reset_p, torch.ones(n, dtype=torch.bool, device=graph.device)
        use_graph[g] = valid  # a reset summing to 0 falls back to dense retrieval too
        if n == B:
            scores = torch.where(use_graph, ppr_p, sim)
        else:
            scores = sim.clone()
            scores[:, g[valid]] = ppr_p[:, valid]
    with part("top-k"):
        idx, vals = kernels.topk_columns(scores, k)  # best first, ties to the lowest row
    out = Retrieved(idx, vals)
    if trace:
        return out, Trace(*dense_seeds(seed_keys, seed_vals, E, B), act.dense(), ~use_graph)
    return out


@contextmanager
def _no_stage(name: str):
    yield


def _local_rest(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool, steps, sim, sim_g,
                per_entity: ColumnEntries, reset_e: ColumnEntries, use_graph, g, k: int, seed_keys, seed_vals, act):
    """_retrieve_chunk after activation with ppr_mode="local": eq. 7 as index lists on each question's top
    reset_passages passages and its active entities' passages (pagerank.sparse_reset_entries), eq. 6 by the
    batched forward push (local_ppr.local_pagerank), whose top k over the touched passages is the answer; the
    questions without a valid reset take the top k of their cosines."""
    part = steps.stage if steps is not None else _no_stage
    B, n = queries.batch_size, g.numel()
    P, E = graph.passage_emb.shape[0], graph.entity_emb.shape[0]
    with part("reset"):
        reset_p = sparse_reset_entries(sim_g, graph.N_logT, per_entity, cfg, at_least=k)
    with part("pagerank"):
        li, lv, valid = local_pagerank(graph.push_graph(cfg.adjacent_passages), reset_p, reset_e, n, cfg, k,
                                       steps.pushes if steps is not None else None)
    with part("top-k"):
        use_graph[g] = valid  # a reset summing to 0 falls back to dense retrieval too
        idx = torch.empty((B, k), dtype=torch.int64, device=graph.device)
        vals = torch.empty((B, k), dtype=torch.float32, device=graph.device)
        idx[g], vals[g] = li, lv
        dense = torch.nonzero(~use_graph).flatten()
        if dense.numel():
            di, dv = kernels.topk_columns(sim.index_select(1, dense), k)
            idx[dense], vals[dense] = di, dv.to(vals.dtype)
    out = Retrieved(idx, vals)
    if trace:
        return out, Trace(*dense_seeds(seed_keys, seed_vals, E, B), act.dense(), ~use_graph)
    return out
