"""The query path as an ordered list of named stages, run the same way by every backend.

A batch of questions flows through ``plan(cfg)``, a list such as::

    encode -> round 1 -> rerank 1 -> round 2 -> pairs -> rerank -> top-k

each entry a ``Stage`` (a name and a function ``(backend, batch) -> None`` that updates the ``Batch``). Which
stages run, and in which order, is read from that list, never from branches elsewhere:

- ``encode`` (stage 0, when the batch starts from question strings): the question path
  (pipeline.QuestionPipeline.encode_questions: NER, lexicon, encoder), timed by its parts ("ner", "lexicon",
  "encoder"); a batch given as EncodedQueries starts at round 1;
- ``round 1``: one graph round (eqs. 3-7) ranking ``depth`` passages per question;
- ``rerank r`` (``rerank`` with ``rerank_loop_candidates`` > 0, a chain): the learned reranker reorders round
  r's top candidates before the chain reads its sources and keeps its passages from them (rerank_stage.py);
- ``round r + 1`` (the chain, chain.py): seeds from round r's top passages, then its ranking merged after the
  list's kept passages;
- ``pairs`` (pairs.py): the best pair of the top passages takes the first two places;
- ``rerank`` (rerank_stage.py): the learned reranker reorders the final list's top candidates;
- ``top-k``: the first ``top_k`` passages.

A backend (the torch engine, the scipy reference, a shard of the sharded engine) supplies the few operations
that differ between them (``Backend``); the stages hold the order and the bookkeeping, written once. The
runner times each stage (``timings[name]``) and keeps each round's ranking in the trace.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import torch

from ..config import RetrievalConfig
from ..queries import EncodedQueries, Retrieved
from . import chain, pairs, rerank_stage
from ..runtime.tracing import stage as timed, uncounted


class Backend(Protocol):
    """What the stages ask of a backend. Every method works on a whole batch at once."""

    def encode(self, questions: list, cfg: RetrievalConfig, timings: dict | None) -> EncodedQueries:
        """Stage 0: the questions encoded (pipeline.QuestionPipeline.encode_questions), on the backend's device."""

    def round(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool) -> tuple[Retrieved, object]:
        """One graph round (eqs. 3-7) of ``cfg.top_k`` passages per question, and its trace (None unless asked)."""

    def chain_seeds(self, queries: EncodedQueries, ranking: Retrieved, source: torch.Tensor,
                    cfg: RetrievalConfig) -> chain.ChainSeeds:
        """chain.chain_seeds of the source passages ``source`` [B, K] bool of ``ranking`` (global entity ids)."""

    def later_queries(self, queries: EncodedQueries, seeds: chain.ChainSeeds, cfg: RetrievalConfig) -> EncodedQueries:
        """The questions of a later round: their entities plus the chain seeds, with eq. 7's later prior."""

    def pair_rerank(self, queries: EncodedQueries, ranking: Retrieved, cfg: RetrievalConfig) -> Retrieved:
        """pairs.rerank of ``ranking``."""

    def learned_rerank(self, queries: EncodedQueries, ranking: Retrieved, cfg: RetrievalConfig, candidates: int,
                       known=None):
        """rerank_stage.apply of ``ranking``'s first ``candidates`` (``known``: the batch's pairs scored before):
        (Retrieved, Reranked)."""

    @property
    def num_entities(self) -> int:
        """Entities of the whole index (the chain seeds' id space)."""

    @property
    def entity_names(self) -> list:
        """The whole index's entity names (for the trace)."""


class PartChain:
    """Backend.chain_seeds and Backend.later_queries for a backend whose ``part`` (round.Part) runs the graph round
    and whose ``tables`` (chain.ChainTables) hold that part's rows: the torch engine (the whole index) and a shard
    of the sharded engine alike (chain.part_chain_seeds, chain.part_later_queries)."""

    def chain_seeds(self, queries, ranking, source, cfg):
        return chain.part_chain_seeds(self.part, self.tables, queries, ranking, source, cfg)

    def later_queries(self, queries, seeds, cfg):
        return chain.part_later_queries(self.part, self.tables, queries, seeds, cfg)


class LocalChain:
    """Backend.chain_seeds and Backend.later_queries for a backend whose ``tables`` (chain.ChainTables) hold the
    whole index without a round.Part: the scipy reference."""

    def chain_seeds(self, queries, ranking, source, cfg):
        return chain.chain_seeds(self.tables, queries, ranking, source, cfg)

    def later_queries(self, queries, seeds, cfg):
        return chain.later_queries(self.tables, queries, seeds, cfg)


@dataclass
class Batch:
    """A batch on its way through the stages.

    queries   the encoded questions (None until stage 0 when the batch starts from ``questions``)
    questions the question strings, for stage 0 (None when the batch starts encoded)
    timings   the seconds of each stage are added here (None: not timed)
    cfg       the settings of the call
    depth     passages per question the graph rounds rank (enough for every later stage)
    ranking   the list so far (Retrieved, best first)
    round     the last round's own ranking (the chain takes its sources from it)
    before    the list before the last round was merged in (None after the first round)
    rounds    graph rounds run so far
    used      [B, U] the chain's source passages so far (-1: none)
    seeds     the chain seeds of the later rounds so far (chain.ChainSeeds) or None
    scored    the pairs the reranker in the loop has scored so far (rerank.Reranked) or None: the final rerank
              takes their logits again instead of scoring the same pairs twice
    trace     the first round's Trace, with the later stages' details added, when traced
    round_lists  each round's own ranking (after its loop rerank), when traced
    """

    queries: Optional[EncodedQueries]
    cfg: RetrievalConfig
    depth: int
    questions: Optional[list] = None
    timings: Optional[dict] = None
    ranking: Optional[Retrieved] = None
    round: Optional[Retrieved] = None
    before: Optional[Retrieved] = None
    rounds: int = 0
    used: Optional[torch.Tensor] = None
    seeds: Optional[chain.ChainSeeds] = None
    scored: object = None
    trace: object = None
    traced: bool = False
    round_lists: list = field(default_factory=list)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Backend, Batch], None]
    timing: Optional[str]  # the timings key it adds to ("graph" or "rerank"); None: its parts time themselves


# ------------------------------------------------------------------------------------------------- depths
def final_depth(cfg: RetrievalConfig) -> int:
    """Passages per question the stages after the graph need: top_k, the learned rerank's candidates, the pairs'."""
    k = max(cfg.top_k, cfg.rerank_candidates, rerank_stage.reach(cfg)) if rerank_stage.enabled(cfg) else cfg.top_k
    return max(k, cfg.pair_candidates) if pairs.enabled(cfg) else k


def graph_depth(cfg: RetrievalConfig) -> int:
    """Passages per question each graph round ranks (with a chain: enough for its sources and kept passages)."""
    k = final_depth(cfg)
    if chain.enabled(cfg):
        n = cfg.chain_rounds + 1
        k = max(k, cfg.chain_passages * n, cfg.chain_keep * n, loop_candidates(cfg))
    return k


def loop_candidates(cfg: RetrievalConfig) -> int:
    """Candidates the reranker reorders after each round but the last (0: none)."""
    return cfg.rerank_loop_candidates if rerank_stage.enabled(cfg) and chain.enabled(cfg) else 0


# ------------------------------------------------------------------------------------------------- stages
def encode(be: Backend, b: Batch) -> None:
    b.queries = be.encode(b.questions, b.cfg, b.timings)


def first_round(be: Backend, b: Batch) -> None:
    cfg = b.cfg.replace(chain_passages=0, pair_candidates=0, rerank=False, top_k=b.depth)
    out, tr = be.round(b.queries, cfg, b.traced)
    b.ranking = b.round = out
    b.rounds, b.trace = 1, tr
    b.used = torch.zeros((b.queries.batch_size, 0), dtype=torch.int64, device=out.indices.device)
    if b.traced:
        b.round_lists.append(out)


def chain_round(be: Backend, b: Batch) -> None:
    """The next round of the chain (chain.py): seeds from the last round's top passages not used before."""
    cfg = b.cfg
    cur = b.round
    with_entities = b.queries.has_entities().to(cur.indices.device)
    source, b.used = chain.chain_sources(cur, with_entities, b.used, cfg)
    new = be.chain_seeds(b.queries, cur, source, cfg)
    b.seeds = new if b.seeds is None else b.seeds.union(new, be.num_entities)
    later = cfg.replace(chain_passages=0, pair_candidates=0, rerank=False, top_k=b.depth,
                        passage_node_weight=cfg.chain_passage_weight)
    out, _ = be.round(be.later_queries(b.queries, b.seeds, cfg), later, False)
    b.before, b.round = b.ranking, out
    b.ranking = chain.merge(b.before, out, b.rounds * cfg.chain_keep, b.depth)
    b.rounds += 1
    if b.traced:
        b.round_lists.append(out)


def round_rerank(be: Backend, b: Batch) -> None:
    """The reranker in the loop: the last round's top ``rerank_loop_candidates`` reordered by the fused score, so
    that the chain's next sources and the passages it keeps are the reranker's (rerank_stage.loop_order)."""
    _, rr = be.learned_rerank(b.queries, b.round, b.cfg, loop_candidates(b.cfg), b.scored,
                              **({"vectors": True} if b.cfg.rerank_set_reader else {}))
    b.scored = rr if b.scored is None else b.scored.join(rr)
    b.round = rerank_stage.loop_order(b.round, rr)
    b.ranking = b.round if b.before is None else \
        chain.merge(b.before, b.round, (b.rounds - 1) * b.cfg.chain_keep, b.depth)
    if b.traced:
        b.round_lists[-1] = b.round


def pair_stage(be: Backend, b: Batch) -> None:
    before = b.ranking
    b.ranking = be.pair_rerank(b.queries, before, b.cfg)
    if b.traced:
        with uncounted():
            b.trace.pair_ranks = pairs.ranks_before(before, b.ranking)


def learned_rerank(be: Backend, b: Batch) -> None:
    b.ranking, rr = be.learned_rerank(b.queries, b.ranking, b.cfg, b.cfg.rerank_candidates, b.scored,
                                      **({"set_reader": True, "reach": rerank_stage.reach(b.cfg)}
                                         if b.cfg.rerank_set_reader else {}))
    if b.traced:
        b.trace.rerank = rr


def top_k(be: Backend, b: Batch) -> None:
    b.ranking = b.ranking.head(b.cfg.top_k)


def plan(cfg: RetrievalConfig, encode_first: bool = False) -> list[Stage]:
    """The stages a batch runs with ``cfg``, in order (``encode_first``: from question strings, stage 0 first)."""
    out = [Stage("encode", encode, None)] if encode_first else []
    out.append(Stage("round 1", first_round, "graph"))
    if chain.enabled(cfg):
        for r in range(1, cfg.chain_rounds + 1):
            if loop_candidates(cfg):
                out.append(Stage(f"rerank {r}", round_rerank, "rerank"))
            out.append(Stage(f"round {r + 1}", chain_round, "graph"))
    if pairs.enabled(cfg):
        out.append(Stage("pairs", pair_stage, "graph"))
    if rerank_stage.enabled(cfg):
        out.append(Stage("rerank", learned_rerank, "rerank"))
    out.append(Stage("top-k", top_k, "graph"))
    return out


def run(be: Backend, queries, cfg: RetrievalConfig, trace: bool = False,
        timings: dict | None = None, stages: list[Stage] | None = None):
    """Run ``stages`` (default: plan(cfg), from stage 0 when ``queries`` is a list of question strings) on a
    batch (EncodedQueries, or the questions): Retrieved, and with ``trace`` (Retrieved, Trace).
    ``timings``: each stage's seconds are added to timings[stage.timing] ("graph" or "rerank"; stage 0's parts to
    "ner", "lexicon" and "encoder")."""
    strings = isinstance(queries, (list, tuple))
    b = Batch(None if strings else queries, cfg, graph_depth(cfg), list(queries) if strings else None, timings,
              traced=trace)
    for st in stages if stages is not None else plan(cfg, strings):
        with timed(timings if st.timing else None, st.timing):
            st.run(be, b)
    queries = b.queries
    if not trace:
        return b.ranking
    if b.seeds is not None:
        names = be.entity_names
        with uncounted():  # the trace's names are read on the host
            b.trace.chain_seeds = [[(names[e], w) for e, w in sorted(sd.items(), key=lambda x: (-x[1], x[0]))]
                                   for sd in b.seeds.to_dicts(queries.batch_size)]
    b.trace.rounds = b.round_lists
    return b.ranking, b.trace
