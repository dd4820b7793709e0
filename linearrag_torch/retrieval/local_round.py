"""A graph round (round.one_chunk's, for a round.Part holding the whole index) without any pass over the corpus per question: ``ppr_mode: local`` with ``reset_passages`` and
an ANN stage (``ann: ivf | hnsw``, retrieval/ann.py).

round.one_chunk's local branch computes every passage's cosine ([P, B], one product) and takes the top
``reset_passages`` and the min-max from it; here the ANN gives each question's top passages (rescored exactly)
and the low end of the global min-max (the best match of the negated question), the seeds' nearest entities
come from the ANN too (round.activate), and eq. 6 is the forward push (local_ppr.local_pagerank). A
question without a valid reset (no seed) takes the top k of its candidates by cosine (dense retrieval over
them). What a batch costs then depends on the ANN's probes, the push's threshold and the seeds'
neighbourhoods, not on the corpus (docs/benchmarks/scaling.md).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..config import RetrievalConfig
from ..queries import EncodedQueries, Retrieved
from . import ann
from .activation import ColumnEntries, dense_seeds
from .local_ppr import local_pagerank
from .pagerank import entity_reset_terms


def asked(cfg: RetrievalConfig, device: torch.device) -> bool:
    """Whether ``cfg`` asks for this round on ``device``: the local PageRank with a sparse reset and an ANN stage,
    on the CPU (where FAISS runs; a GPU graph keeps the exact product). ``applies`` also needs the index built."""
    return (cfg.use_ppr and cfg.ppr_mode == "local" and cfg.reset_passages > 0 and cfg.ann != "exact"
            and torch.device(device).type == "cpu")


def applies(graph, cfg: RetrievalConfig) -> bool:
    """Whether a graph round of ``cfg`` on ``graph`` runs here: ``asked``, and the graph's passage ANN stage is
    there (ann.stage, built on first use)."""
    return asked(cfg, graph.device) and ann.stage(graph, "passage", cfg) is not None


def local_chunk(graph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool, steps, activate, Trace):
    """round.one_chunk for a round where ``applies``: Retrieved (and a Trace with ``trace``).

    ``activate`` and ``Trace``: the round's eqs. 3-5 (round.activate) and its Trace class, passed by the round
    (which imports this module)."""
    part = steps.stage if steps is not None else _no_stage
    B = queries.batch_size
    P, E = graph.passage_emb.shape[0], graph.entity_emb.shape[0]
    k = min(cfg.top_k, P)
    m = min(max(cfg.reset_passages, k), P)
    with part("cosines"):  # the ANN's top m per question and their exact cosines (no [P, B] product)
        cand = ann.passage_candidates(graph, queries.query_emb, m, cfg, queries.prior, cfg.reset_minmax == "global")
    with part("seeds and activation"):
        seed_keys, seed_vals, act = activate(graph, queries, cfg)
    e, b = act.row, act.col
    use_graph = torch.zeros(B, dtype=torch.bool, device=graph.device)
    use_graph[b] = True  # a question without a seed (so nothing active) is answered by dense retrieval
    with part("reset"):
        reset_p = _reset(graph, cand, ColumnEntries(e, b, act.val / act.tier.to(torch.float32), (E, B)), use_graph,
                         cfg, B)
    with part("pagerank"):
        li, lv, valid = local_pagerank(graph.push_graph(cfg.adjacent_passages), reset_p,
                                       ColumnEntries(e, b, act.reset, (E, B)), B, cfg, k,
                                       steps.pushes if steps is not None else None)
    with part("top-k"):
        use_graph &= valid  # a reset summing to 0 falls back to dense retrieval too
        # dense retrieval over the candidates: the top k by cosine, equal ones by the lower passage
        order, rank = ann.rank_within(cand.question, cand.cos, B)
        top = order[rank < k]
        di = torch.full((B, k), -1, dtype=torch.int64, device=graph.device)
        dv = torch.zeros((B, k), dtype=torch.float32, device=graph.device)
        qb, r = cand.question.index_select(0, top), rank[rank < k]
        di[qb, r], dv[qb, r] = cand.passage.index_select(0, top), cand.cos.index_select(0, top)
        idx = torch.where(use_graph[:, None], li, di)
        vals = torch.where(use_graph[:, None], lv, dv)
    out = Retrieved(idx, vals)
    if trace:
        return out, Trace(*dense_seeds(seed_keys, seed_vals, E, B), act.dense(), ~use_graph)
    return out


def _reset(graph, cand: ann.PassageCandidates, act_over_tier: ColumnEntries, use_graph: torch.Tensor,
           cfg: RetrievalConfig, B: int) -> ColumnEntries:
    """Eq. 7 as index lists (pagerank.sparse_reset_entries' entries, from the candidates): the dense term
    lam * W_p * min-max(prior value) on each question's candidates (the questions with seeds only), the entity
    term W_p * ln(1 + sum of ln(1 + N[p, e]) * act_e / L_e) on the passages of its active entities."""
    P = graph.passage_emb.shape[0]
    dev = graph.device
    q, v = cand.question, cand.prior
    hi = torch.full((B,), float("-inf"), device=dev).scatter_reduce_(0, q, v, "amax")
    if cfg.reset_minmax == "top":
        lo = torch.full((B,), float("inf"), device=dev).scatter_reduce_(0, q, v, "amin")
    else:
        lo = cand.low
    span = (hi - lo).index_select(0, q)
    ok = span > 0
    val = torch.where(ok, (v - lo.index_select(0, q)) / torch.where(ok, span, torch.ones_like(span)),
                      torch.zeros_like(v))
    keep = use_graph.index_select(0, q)
    zp, zb, zv = entity_reset_terms(graph.N_logT, act_over_tier, P, cfg, torch.float32)
    w = cfg.passage_node_weight
    return ColumnEntries(torch.cat([cand.passage[keep], zp]), torch.cat([q[keep], zb]),
                         torch.cat([(cfg.lam * w) * val[keep], zv]), (P, B))


@contextmanager
def _no_stage(name: str):
    yield
