"""One graph round, written once for one process and N: from encoded questions to each question's ranked
passages (eqs. 3-7).

    seeds (eq. 3) -> sigma (eq. 4) -> activation (eq. 5, paper or reference mode)
    -> passage reset (eq. 7) -> personalized PageRank (eq. 6) -> top-k

The round runs on a ``Part``: where the rows live and the communicator between the parts. In one process the
part is the whole index (engine.DeviceGraph) and every collective is the identity (runtime.comm.ONE_PROCESS); on
a shard of the sharded engine (distributed/) it is one rank's passages, the sentences and entity rows they need,
and its part of the walk, with torch.distributed's collectives. The math below is the same for both; what a part
supplies is only where a sum or a maximum has to reach the other parts (docs/METHOD.md, "Sharded retrieval").

Everything stays on the part's device; the batch state is (entities x B) / (passages x B), and nothing of size
(sentences x B) is formed (sigma is computed where a step needs it). A large batch runs in chunks of questions
sized from a memory budget (memory.py, ``Part.questions_per_chunk``); the answer for a question does not depend on
the chunk it runs in.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .. import kernels
from ..config import RetrievalConfig
from ..queries import EncodedQueries, Retrieved
from .activation import (Activation, ActivePairs, ColumnEntries, dense_seeds, propagate_paper,
                         propagate_reference_pairs, seed_keys)
from . import local_round
from .local_ppr import local_pagerank
from .pagerank import StepLog, passage_reset_entries, personalized_pagerank, sparse_reset_entries


class Part(Protocol):
    """What a graph round asks of where the rows live (engine.DeviceGraph: the whole index in one process;
    distributed.ShardedEngine's part: one rank's shard). Rows of passages are the part's own (0 .. P_r - 1, global
    row ``lo`` + r); entity ids in and out of the round are global."""

    comm: object  # runtime.comm.Comm: its collectives (the identity in one process)
    device: torch.device
    lo: int  # the global row of the part's first passage
    num_entities: int  # of the whole index
    rows: object  # where the activation's rows live (activation.WholeIndex or a shard's)
    sentence_emb: torch.Tensor  # the sentences the activation's steps read sigma of
    M_crow: torch.Tensor  # M [S_r, E_r] and Mᵀ [E_r, S_r] (the sentences the part owns) as CSR index tensors
    M_col: torch.Tensor
    MT_crow: torch.Tensor
    MT_col: torch.Tensor
    M: torch.Tensor  # the same as torch CSR (paper mode)
    MT: torch.Tensor
    N_logT: object  # ln(1 + N) [E_r, P_r] (index.csr.Csr), the part's entity rows

    def passage_cosines(self, query_emb: torch.Tensor) -> torch.Tensor:
        """cos(q, p) [P_r, B] of the part's passages, float32."""

    def nearest(self, queries: EncodedQueries, cfg: RetrievalConfig) -> tuple:
        """Eq. 3's scan over the entities this part scans: (largest cosine [Q], its global entity id [Q]) per
        question entity, -inf where it scans none; Comm.best_of makes it the whole index's."""

    def local_entries(self, entries: ColumnEntries) -> ColumnEntries:
        """The entries whose entity this part holds, with the part's entity rows (N_logT's rows)."""

    def entity_vectors(self, e: torch.Tensor) -> torch.Tensor:
        """The vectors [n, D] of the global entity ids ``e``, the same on every part (a chain round's seeds)."""

    def local_seeds(self, seeds):
        """chain.ChainSeeds of the entities this part holds, with the part's entity rows (its chain tables')."""

    def walk(self, cfg: RetrievalConfig):
        """The PageRank operator of eq. 6 (pagerank.PPRGraph, or a shard's walk) for cfg.adjacent_passages."""

    def push_graph(self, adjacent_passages: bool):
        """The walk of the local PageRank (local_ppr.PushGraph; one process only)."""

    def questions_per_chunk(self, memory_budget, cfg: RetrievalConfig) -> int:
        """Questions one chunk of a batch holds (the same on every part)."""


@dataclass
class Trace:
    """Intermediate state of a batch, for diagnostics, the demo and benchmarks (tensors on the device).

    ``retrieve(..., trace=True)`` fills every field; ``trace="steps"`` only ``ppr_steps`` (cheap enough to time
    a call with).

    Parameters
    ----------
    seeds : torch.Tensor, optional
        [E, B] eq. 3's seed scores.
    is_seed : torch.Tensor, optional
        [E, B] bool.
    activation : activation.Activation, optional
        Stage 1's result ([E, B] tensors).
    dense : torch.Tensor, optional
        [B] bool: the questions answered by dense retrieval (no seed, or a reset summing to 0).
    chain_seeds : list, optional
        Per question [(entity, seed score)] of the later rounds (chain.py).
    pair_ranks : list, optional
        Per question the ranks (1-based) before the pair rerank of its first two hits.
    rerank : rerank.Reranked, optional
        The rerank stage's scores (rerank_stage.py), None without it.
    rounds : list, optional
        Each graph round's own ranking (Retrieved; after its loop rerank), in order.
    host_reads, torch_calls : int, optional
        What the batch asked of Python (runtime/tracing.py; the trace's own diagnostics aside): the values it
        read back to the host (on CUDA each waits for the device) and its torch calls, which grow with the
        PageRank's steps, not with the batch (no step runs per question).
    ppr_steps : pagerank.StepLog, optional
        The PageRank steps of every graph round (each step's operator, working columns, L1 change and time
        marks), in order.
    """

    seeds: torch.Tensor | None = None
    is_seed: torch.Tensor | None = None
    activation: Activation | None = None
    dense: torch.Tensor | None = None
    chain_seeds: list | None = None
    pair_ranks: list | None = None
    rerank: object = None
    rounds: list | None = None
    host_reads: int | None = None
    torch_calls: int | None = None
    ppr_steps: StepLog | None = field(default=None, compare=False)


def seeds(part: Part, queries: EncodedQueries, cfg: RetrievalConfig):
    """Eq. 3 as index lists over the whole index: (keys e * B + b sorted and unique, values), the largest cosine
    per (graph entity, question); ties between graph entities go to the lowest index (activation.seed_pairs)."""
    if queries.entity_emb.shape[0] == 0 or part.num_entities == 0:
        return (torch.zeros(0, dtype=torch.int64, device=part.device),
                torch.zeros(0, dtype=torch.float32, device=part.device))
    part.comm.phase = "seeds"
    best, arg = part.comm.best_of(*part.nearest(queries, cfg))
    return seed_keys(best, arg, queries.entity_owner.to(part.device), queries.batch_size)


def activate(part: Part, queries: EncodedQueries, cfg: RetrievalConfig):
    """Eqs. 3-5 for a batch, as index lists: (seed keys, seed values, ActivePairs); keys = e * B + b, global
    entity ids, the same on every part. Sigma (eq. 4) is computed lazily from (sentence_emb, query_emb) for the
    (sentence, question) pairs the activation visits. Only paper mode forms dense [E, B] state."""
    keys, vals = seeds(part, queries, cfg)
    vals = vals.float()
    B, E = queries.batch_size, part.num_entities
    sigma = (part.sentence_emb, queries.query_emb)  # float32 sigma either way (kernels.gather_sigma)
    if not cfg.use_activation:
        return keys, vals, ActivePairs.from_keys(keys, vals, torch.ones_like(keys), vals, (E, B))
    part.comm.phase = "activation"
    if cfg.mode == "paper":  # the dense [E, B] state on every part
        s, is_seed = dense_seeds(keys, vals, E, B)
        return keys, vals, ActivePairs.from_activation(propagate_paper(part.M, part.MT, sigma, s, is_seed, cfg,
                                                                       part.rows))
    return keys, vals, propagate_reference_pairs(part.M_crow, part.M_col, part.MT_crow, part.MT_col, sigma, keys,
                                                 vals, B, cfg, part.rows)


def ranked(part: Part, scores: torch.Tensor, k: int) -> Retrieved:
    """The top ``k`` of [P_r, B] scores over every part's passages, best first, ties to the lowest row
    (kernels.topk_columns on the part, then Comm.top_k)."""
    idx, vals = kernels.topk_columns(scores, min(k, scores.shape[0]))
    part.comm.phase = "topk"
    return Retrieved(*part.comm.top_k(idx + part.lo if part.lo else idx, vals, k))


def graph_round(part: Part, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool = False,
                memory_budget: int | None = None, steps: StepLog | None = None):
    """One graph round (eqs. 3-7) of cfg.top_k passages per question, in chunks of questions: Retrieved (and its
    Trace with ``trace``). ``steps``: the PageRank's steps are recorded there (pagerank.StepLog)."""
    queries = queries.to(part.device)
    B = queries.batch_size
    if cfg.use_ppr and cfg.ppr_mode == "local":
        part.push_graph(cfg.adjacent_passages)
    elif cfg.use_ppr:
        part.walk(cfg)  # built once; its size enters the chunk size
    chunk = part.questions_per_chunk(memory_budget, cfg)
    if B <= chunk:
        return one_chunk(part, queries, cfg, trace, steps)
    parts = [one_chunk(part, queries.slice(b, min(b + chunk, B)), cfg, trace, steps) for b in range(0, B, chunk)]
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


def one_chunk(part: Part, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool,
              steps: StepLog | None = None):
    """graph_round for questions that fit one chunk."""
    if local_round.applies(part, cfg):  # the local PageRank on the ANN stage's candidates: no [P, B] product
        return local_round.local_chunk(part, queries, cfg, trace, steps, activate, Trace)
    B, E = queries.batch_size, part.num_entities
    k = cfg.top_k
    stage = steps.stage if steps is not None else _no_stage  # seconds per part of the round (StepLog.stage_s)
    with stage("cosines"):
        sim = part.passage_cosines(queries.query_emb)  # [P_r, B] float32 (shared: not written to)
    with stage("seeds and activation"):
        seed_k, seed_v, act = activate(part, queries, cfg)
    # the active (entity, question) pairs: eq. 7's sum and the PageRank reset are nonzero only there
    e, b = act.row, act.col
    use_graph = torch.zeros(B, dtype=torch.bool, device=part.device)
    use_graph[b] = True  # a question without a seed (so nothing active) is answered by dense retrieval
    g = torch.nonzero(use_graph).flatten()
    scores = sim
    local = cfg.use_ppr and cfg.ppr_mode == "local"
    if g.numel():  # eqs. 7 and 6 for the questions with seeds only
        n = g.numel()
        # a chain's later round raises eq. 7's dense prior (chain.passage_prior); the dense fallback keeps sim
        prior = sim if queries.prior is None else queries.prior.apply(sim)
        if n < B:  # number those questions 0 .. n - 1
            col = torch.full((B,), -1, dtype=torch.int64, device=part.device)
            col[g] = torch.arange(n, device=part.device)
            bg, sim_g = col[b], prior.index_select(1, g)
        else:
            bg, sim_g = b, prior
        per_entity = part.local_entries(ColumnEntries(e, bg, act.val / act.tier.to(sim.dtype), (E, n)))
        reset_e = ColumnEntries(e, bg, act.reset, (E, n))
        if local:
            return _local_rest(part, queries, cfg, trace, steps, sim, sim_g, per_entity, reset_e, use_graph, g, k,
                               seed_k, seed_v, act)
        with stage("reset"):
            part.comm.phase = "eq7"
            reset_p = passage_reset_entries(sim_g, part.N_logT, per_entity, cfg, part.comm)
        if cfg.use_ppr:
            # the entity reset is nonzero only at active pairs (seeds and triggered entities)
            with stage("pagerank"):
                ppr_p, _, valid = personalized_pagerank(part.walk(cfg), reset_p, reset_e, cfg, entity_scores=False,
                                                        steps=steps)
        else:
            ppr_p, valid = reset_p, torch.ones(n, dtype=torch.bool, device=part.device)
        use_graph[g] = valid  # a reset summing to 0 falls back to dense retrieval too
        if n == B:
            scores = torch.where(use_graph, ppr_p, sim)
        else:
            scores = sim.clone()
            scores[:, g[valid]] = ppr_p[:, valid]
    with stage("top-k"):
        out = ranked(part, scores, k)
    if trace:
        return out, Trace(*dense_seeds(seed_k, seed_v, E, B), act.dense(), ~use_graph)
    return out


@contextmanager
def _no_stage(name: str):
    yield


def _local_rest(part: Part, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool, steps, sim, sim_g,
                per_entity: ColumnEntries, reset_e: ColumnEntries, use_graph, g, k: int, seed_k, seed_v, act):
    """one_chunk after activation with ppr_mode="local" (one process): eq. 7 as index lists on each question's top
    reset_passages passages and its active entities' passages (pagerank.sparse_reset_entries), eq. 6 by the
    batched forward push (local_ppr.local_pagerank), whose top k over the touched passages is the answer; the
    questions without a valid reset take the top k of their cosines."""
    stage = steps.stage if steps is not None else _no_stage
    B, n = queries.batch_size, g.numel()
    k = min(k, sim.shape[0])
    with stage("reset"):
        reset_p = sparse_reset_entries(sim_g, part.N_logT, per_entity, cfg, at_least=k)
    with stage("pagerank"):
        li, lv, valid = local_pagerank(part.push_graph(cfg.adjacent_passages), reset_p, reset_e, n, cfg, k,
                                       steps.pushes if steps is not None else None)
    with stage("top-k"):
        use_graph[g] = valid  # a reset summing to 0 falls back to dense retrieval too
        idx = torch.empty((B, k), dtype=torch.int64, device=part.device)
        vals = torch.empty((B, k), dtype=torch.float32, device=part.device)
        idx[g], vals[g] = li, lv
        dense = torch.nonzero(~use_graph).flatten()
        if dense.numel():
            di, dv = kernels.topk_columns(sim.index_select(1, dense), k)
            idx[dense], vals[dense] = di, dv.to(vals.dtype)
    out = Retrieved(idx, vals)
    if trace:
        return out, Trace(*dense_seeds(seed_k, seed_v, part.num_entities, B), act.dense(), ~use_graph)
    return out
