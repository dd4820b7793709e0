"""The torch backend: one batched call from encoded questions to ranked passages.

    seeds (eq. 3) -> sigma (eq. 4) -> activation (eq. 5, paper or reference mode)
    -> passage reset (eq. 7) -> personalized PageRank (eq. 6) -> top-k

Everything stays on the index's device; the batch state is (entities x B) / (passages x B).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .activation import Activation, propagate_paper, propagate_reference, seed_entities, sentence_relevance
from .config import RetrievalConfig
from .index import TriGraphIndex
from .pagerank import PPRGraph, passage_reset, personalized_pagerank
from .queries import EncodedQueries, Retrieved


class DeviceGraph:
    """The tensors the query path multiplies by, prepared once per index and device.

    M [S, E] and its transpose MT [E, S] as real CSR (torch's .t() is a slow CSC view on CPU),
    N_log [P, E] = ln(1 + N), and the PPR operator (built lazily per adjacent_passages setting).
    """

    def __init__(self, index: TriGraphIndex, device="cpu"):
        self.device = torch.device(device)
        self.index = index
        M = index.M.to("cpu")
        MT = M.transpose()
        self.M_crow, self.M_col = M.crow.to(self.device), M.col.to(self.device)
        self.MT_crow, self.MT_col = MT.crow.to(self.device), MT.col.to(self.device)
        self.M = M.torch(self.device)
        self.MT = MT.torch(self.device)
        N = index.N.to("cpu")
        self.N_log = N.with_values(torch.log1p(N.val)).torch(self.device)
        self.passage_emb = index.passage_emb.to(self.device)
        self.sentence_emb = index.sentence_emb.to(self.device)
        self.entity_emb = index.entity_emb.to(self.device)
        self._ppr = {}

    def ppr_graph(self, adjacent_passages: bool) -> PPRGraph:
        if adjacent_passages not in self._ppr:
            self._ppr[adjacent_passages] = PPRGraph.build(self.index.C, adjacent_passages, self.device)
        return self._ppr[adjacent_passages]


@dataclass
class Trace:
    """Intermediate state of a batch, for diagnostics and the demo (tensors on the device)."""

    seeds: torch.Tensor  # [E, B]
    is_seed: torch.Tensor  # [E, B] bool
    activation: Activation
    dense: torch.Tensor  # [B] bool: answered by dense retrieval


def activate(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig):
    """Eqs. 3-5 for a batch: (seeds, is_seed, Activation)."""
    B = queries.batch_size
    seeds, is_seed = seed_entities(graph.entity_emb, queries.entity_emb, queries.entity_owner, B)
    sigma = sentence_relevance(graph.sentence_emb, queries.query_emb)
    if not cfg.use_activation:
        act = Activation(act=seeds, tier=is_seed.to(torch.int64), reset=seeds)
    elif cfg.mode == "paper":
        act = propagate_paper(graph.M, graph.MT, sigma, seeds, is_seed, cfg)
    else:
        act = propagate_reference(graph.M_crow, graph.M_col, graph.MT_crow, graph.MT_col, sigma, seeds, is_seed, cfg)
    return seeds, is_seed, act


def top_k(scores: torch.Tensor, k: int):
    """The k best rows of each column of [P, B], best first, ties to the lowest row: ([B, k], [B, k])."""
    vals, idx = torch.sort(scores.T, dim=1, descending=True, stable=True)
    return idx[:, :k], vals[:, :k]


def retrieve(graph: DeviceGraph, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool = False):
    """Rank passages for a batch of encoded questions. Returns Retrieved (and a Trace if asked)."""
    queries = queries.to(graph.device)
    B = queries.batch_size
    P = graph.passage_emb.shape[0]
    k = min(cfg.top_k, P)
    sim = graph.passage_emb @ queries.query_emb.T  # [P, B]
    seeds, is_seed, act = activate(graph, queries, cfg)
    reset_p = passage_reset(sim, graph.N_log, act.act, act.tier, cfg)
    if cfg.use_ppr:
        ppr_p, _, valid = personalized_pagerank(graph.ppr_graph(cfg.adjacent_passages), reset_p, act.reset, cfg)
    else:
        ppr_p, valid = reset_p, torch.ones(B, dtype=torch.bool, device=graph.device)
    use_graph = is_seed.any(dim=0) & valid
    scores = torch.where(use_graph, ppr_p, sim)  # dense retrieval for questions without a seed
    idx, vals = top_k(scores, k)
    out = Retrieved(idx, vals)
    if trace:
        return out, Trace(seeds, is_seed, act, ~use_graph)
    return out
