"""The scipy reference: one question at a time, in float64, as docs/METHOD.md states the math.

This is the test oracle for the torch backend and the baseline of the benchmarks, so it is written to
be read, not to be fast: plain per-question loops, dicts and sets for the breadth-first `reference`
mode, scipy.sparse for the matrix products. Each function names the equation it implements.

Readings chosen where METHOD.md leaves room (the torch backend must make the same choices):
- an index without entities answers every question densely (there is no seed to find);
- `paper` mode: a step with no newly active entity is discarded whole (a_t = a_{t-1}), even if it
  raised an already active entity; a seed never changes tier;
- `reference` mode: a seed triggered again gets the new score and tier like any other entity;
- the sum of eq. 7 runs over entities with tier >= 1 only, with act / L_e computed per entity;
- ln(1 + z) is computed as log1p(z) (a value below -1 gives NaN, which the PPR reset sets to 0);
- PPR stops on this question's own L1 change; it returns the iterate that met the tolerance.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from ..config import RetrievalConfig
from ..index import TriGraphIndex
from ..queries import EncodedQueries, Retrieved
from . import rerank_stage
from .chain import ChainTables
from .stages import LocalChain, run as run_stages


def _f64(t: torch.Tensor) -> np.ndarray:
    return np.asarray(t.detach().cpu().double().numpy(), dtype=np.float64)  # (numpy has no bfloat16)


def _csr64(mat) -> sp.csr_matrix:
    return mat.scipy().astype(np.float64).tocsr()


def seeds(index: TriGraphIndex, query_entity_emb: np.ndarray, owner, B: int, entity_emb=None) -> list:
    """Eq. 3: per question {entity: seed score}. A question entity's seed is the graph entity of largest
    cosine (ties: lowest index, as np.argmax); several entities with one seed keep the largest score.
    ``entity_emb``: the float64 entity embeddings if already made (see prepare)."""
    entity_emb = _f64(index.entity_emb) if entity_emb is None else entity_emb
    query_entity_emb = np.asarray(query_entity_emb, dtype=np.float64)
    owner = np.asarray(owner, dtype=np.int64)
    out = [dict() for _ in range(B)]
    if entity_emb.shape[0] == 0:
        return out  # no graph entity to seed: every question goes dense
    for b in range(B):
        cos = entity_emb @ query_entity_emb[owner == b].T  # E x (entities of question b)
        for j in range(cos.shape[1]):
            e = int(np.argmax(cos[:, j]))
            out[b][e] = max(out[b].get(e, -np.inf), float(cos[e, j]))
    return out


def activate_paper(M: sp.csr_matrix, sigma: np.ndarray, seeds_dict: dict, config: RetrievalConfig):
    """Eq. 5 with dynamic pruning (mode `paper`). Returns (act, tier, reset_entity), all of length E:
    act = a_final (used in eq. 7), tier (0 = inactive, 1 = seed, t + 1 = first active at step t) and
    reset_entity = a_final (the entity part of the PPR reset)."""
    E = M.shape[1]
    a = np.zeros(E)
    tier = np.zeros(E, dtype=np.int64)
    for e, score in seeds_dict.items():
        a[e] = score
        tier[e] = 1
    for t in range(1, config.max_iterations):
        x = M @ (a * (a >= config.delta))  # S
        y = M.T @ (sigma * x)  # E
        a_new = np.maximum(y * (y >= config.delta), a)
        newly = (a_new >= config.delta) & (tier == 0)
        if not newly.any():
            break  # a_t = a_{t-1}: this step is dropped
        tier[newly] = t + 1
        a = a_new
    return a, tier, a.copy()


def activate_reference(M: sp.csr_matrix, MT: sp.csr_matrix, sigma: np.ndarray, seeds_dict: dict,
                       config: RetrievalConfig):
    """Mode `reference`: the reference code's breadth-first expansion, order-free (METHOD.md).
    M is S x E and MT its transpose, both CSR. Returns (score, tier, weight), all of length E:
    score = last recorded activation (used in eq. 7), tier (0 = inactive), weight = accumulated
    activation (the entity part of the PPR reset)."""
    score = dict(seeds_dict)
    weight = dict(seeds_dict)
    tier = {e: 1 for e in seeds_dict}
    used = set()
    frontier = set(seeds_dict)
    for t in range(1, config.max_iterations):
        taken = []  # (e, s) pairs of this step
        for e in sorted(frontier):
            if score[e] < config.delta:
                continue
            mention = MT.indices[MT.indptr[e]:MT.indptr[e + 1]]
            free = sorted((int(s) for s in mention if int(s) not in used), key=lambda s: (-sigma[s], s))
            taken.extend((e, s) for s in free[: config.top_k_sentence])
        used.update(s for _, s in taken)  # only after the step: entities of one step may share a sentence
        triggered = {}  # e2 -> largest candidate that triggered it at this step
        for e, s in taken:
            cand = score[e] * sigma[s]
            if cand >= config.delta:
                for e2 in M.indices[M.indptr[s]:M.indptr[s + 1]]:
                    e2 = int(e2)
                    weight[e2] = weight.get(e2, 0.0) + cand
                    triggered[e2] = max(triggered.get(e2, -np.inf), cand)
        for e2, cand in triggered.items():
            score[e2] = cand
            tier[e2] = t + 1
        frontier = set(triggered)
        if not frontier:
            break
    E = M.shape[1]
    score_v, tier_v, weight_v = np.zeros(E), np.zeros(E, dtype=np.int64), np.zeros(E)
    for e in tier:
        score_v[e], tier_v[e], weight_v[e] = score[e], tier[e], weight[e]
    return score_v, tier_v, weight_v


def passage_reset(sim: np.ndarray, N: sp.csr_matrix, act: np.ndarray, tier: np.ndarray,
                  config: RetrievalConfig) -> np.ndarray:
    """Eq. 7: I0(p) = (lam * sim'(p) + ln(1 + sum_{e active} act[e] * ln(1 + N[p,e]) / L_e)) * W_p,
    sim' the min-max normalised cosine (0 everywhere when max = min); with config.reset_passages = m, sim' only
    on the m passages of highest cosine (0 elsewhere), min-max over all passages or over those m
    (config.reset_minmax). The local PageRank (ppr_mode "local") is computed here exactly: this is its oracle."""
    lo, hi = sim.min(), sim.max()
    keep = None
    if config.reset_passages:
        keep = np.argsort(-sim, kind="stable")[:min(config.reset_passages, len(sim))]
        if config.reset_minmax == "top":
            lo = sim[keep].min()
    sim_n = (sim - lo) / (hi - lo) if hi > lo else np.zeros_like(sim)
    if keep is not None:
        sim_n = np.zeros_like(sim_n)
        sim_n[keep] = (sim[keep] - lo) / (hi - lo) if hi > lo else 0.0
    per_entity = np.zeros(len(act))
    active = tier > 0
    per_entity[active] = act[active] / tier[active]
    log_n = N.copy()
    log_n.data = np.log1p(log_n.data)  # ln(1 + N[p,e]); stored entries only, since ln(1 + 0) = 0
    with np.errstate(invalid="ignore"):
        return (config.lam * sim_n + np.log1p(log_n @ per_entity)) * config.passage_node_weight


def transition_matrix(C: sp.csr_matrix, adjacent_passages: bool):
    """The walk of eq. 6 on the undirected P + E graph: returns (Aᵀ D⁻¹ as CSR, dangling mask), where A
    holds C between passages and entities (and weight 1 between passages i, i+1 if asked)."""
    P, E = C.shape
    if adjacent_passages and P > 1:
        i = np.arange(P - 1)
        chain = sp.coo_matrix((np.ones(2 * (P - 1)), (np.r_[i, i + 1], np.r_[i + 1, i])), shape=(P, P))
    else:
        chain = sp.csr_matrix((P, P))
    A = sp.bmat([[chain, C], [C.T, sp.csr_matrix((E, E))]], format="csr")
    strength = np.asarray(A.sum(axis=1)).ravel()
    dangling = strength == 0
    inv = np.zeros_like(strength)
    inv[~dangling] = 1.0 / strength[~dangling]
    return (A.T @ sp.diags(inv)).tocsr(), dangling


def personalized_pagerank(C: sp.csr_matrix, reset_p: np.ndarray, reset_e: np.ndarray,
                          config: RetrievalConfig, walk=None):
    """Eq. 6: the fixed point of x = (1 - d) r + d (Aᵀ D⁻¹ x + (sum of x over dangling nodes) r), by block
    Gauss-Seidel steps from x_0 = r: the passage block from the current iterate, then the entity block
    from the new passage values (and the current entity values, for the dangling sum), until the L1
    change of a step is below ppr_tol or ppr_max_iter steps. r = [reset_p; reset_e] with negatives and
    NaN set to 0, normalised to sum 1. Returns x (passages first, then entities), or None if r sums to 0.
    ``walk`` is transition_matrix(C, config.adjacent_passages), passed in to build it only once."""
    T, dangling = walk if walk is not None else transition_matrix(C, config.adjacent_passages)
    r = np.concatenate([reset_p, reset_e]).astype(np.float64)
    r[np.isnan(r)] = 0.0
    r[r < 0] = 0.0
    total = r.sum()
    if not total > 0:
        return None
    r = r / total
    d = config.damping
    P = C.shape[0]
    T_p, T_e = T[:P], T[P:]  # the rows of the passage block and of the entity block
    x = r.copy()
    for _ in range(config.ppr_max_iter):
        old = x.copy()
        x[:P] = (1 - d) * r[:P] + d * (T_p @ x + x[dangling].sum() * r[:P])
        x[P:] = (1 - d) * r[P:] + d * (T_e @ x + x[dangling].sum() * r[P:])
        if np.abs(x - old).sum() < config.ppr_tol:
            break
    return x


def _rank(values: np.ndarray, k: int):
    """Top k by value, ties to the lowest passage index."""
    order = np.argsort(-values, kind="stable")[:k]
    return order, values[order]


def prepare(index: TriGraphIndex, config: RetrievalConfig) -> dict:
    """The per-index part of retrieve (float64 copies, Mᵀ, the walk of eq. 6), to reuse across calls."""
    M = _csr64(index.M)
    C = _csr64(index.C)
    return {
        "passage_emb": _f64(index.passage_emb), "sentence_emb": _f64(index.sentence_emb),
        "entity_emb": _f64(index.entity_emb), "M": M, "MT": M.T.tocsr(), "C": C, "N": _csr64(index.N),
        "adjacent_passages": config.adjacent_passages, "walk": transition_matrix(C, config.adjacent_passages),
    }


class ScipyBackend(LocalChain):
    """The reference's operations for the stage list (stages.Backend): rounds with numpy/scipy one question at a
    time, the chain on CPU tensors, the learned rerank by ``reranker``: a function of the config giving (Reranker,
    its PassageTokens of this index), as LinearRAG.retrieve passes (the reranker of its device graph)."""

    def __init__(self, index: TriGraphIndex, prepared: dict, reranker=None):
        self.index, self.prepared, self._reranker = index, prepared, reranker

    @property
    def tables(self):
        if "chain_tables" not in self.prepared:
            self.prepared["chain_tables"] = ChainTables.build(self.index, "cpu")
        return self.prepared["chain_tables"]

    def round(self, queries, cfg, trace):
        if trace:
            raise ValueError("the scipy backend keeps no trace; use the torch engine for explain")
        return one_round(self.index, queries, cfg, self.prepared), None

    def pair_rerank(self, queries, ranking, cfg):
        return pair_rerank(self.index, queries, ranking, cfg, self.prepared["passage_emb"])

    def learned_rerank(self, queries, ranking, cfg, candidates, known=None, **set_reading):
        if self._reranker is None:
            raise ValueError("rerank=True on the scipy backend needs its reranker: use LinearRAG.retrieve(..., "
                             "backend='scipy') or pass scipy_backend.retrieve(..., reranker=...)")
        reranker, passages = self._reranker(cfg)
        out, rr = rerank_stage.apply(reranker, passages, queries, ranking, candidates, known, **set_reading,
                                     **rerank_stage.passes(cfg))
        return Retrieved(out.indices.cpu(), out.scores.cpu()), rr

    @property
    def num_entities(self) -> int:
        return self.index.num_entities

    @property
    def entity_names(self) -> list:
        return self.index.entities


def retrieve(index: TriGraphIndex, queries: EncodedQueries, config: RetrievalConfig,
             prepared: dict | None = None, reranker=None, timings: dict | None = None) -> Retrieved:
    """Returns Retrieved(indices, scores) as torch tensors (int64 [B,k], float32 [B,k]) computed with
    numpy/scipy, k = min(config.top_k, P): the stage list of ``config`` (stages.plan: graph rounds, the chain,
    the pair rerank, the learned rerank) with this backend's rounds. ``prepared``: prepare(index, config), if
    already made; ``reranker``: see ScipyBackend."""

    config = config.for_corpus(index.num_passages)  # ppr_mode "auto": as the torch engine resolves it
    if prepared is None or prepared["adjacent_passages"] != config.adjacent_passages:
        prepared = prepare(index, config)
    return run_stages(ScipyBackend(index, prepared, reranker), queries.to("cpu"), config, timings=timings)


def one_round(index: TriGraphIndex, queries: EncodedQueries, config: RetrievalConfig, prepared: dict) -> Retrieved:
    """One graph round (eqs. 3-7) of config.top_k passages per question, one question at a time."""
    P = index.num_passages
    B = queries.batch_size
    k = min(config.top_k, P)
    passage_emb, sentence_emb = prepared["passage_emb"], prepared["sentence_emb"]
    M, MT, C, N, walk = prepared["M"], prepared["MT"], prepared["C"], prepared["N"], prepared["walk"]
    seed_dicts = seeds(index, _f64(queries.entity_emb), queries.entity_owner.cpu().numpy(), B,
                       entity_emb=prepared["entity_emb"])
    indices = np.zeros((B, k), dtype=np.int64)
    scores = np.zeros((B, k), dtype=np.float64)
    prior = queries.prior  # a chain's later round: eq. 7's dense prior raised (chain.passage_prior)
    if prior is not None:
        p_row, p_col, p_val = prior.row.cpu().numpy(), prior.col.cpu().numpy(), _f64(prior.val)
    for b in range(B):
        q = _f64(queries.query_emb[b])
        sim = passage_emb @ q  # cos(q, p)
        sim_prior = sim
        if prior is not None:
            sim_prior = np.maximum(sim, prior.floor)
            at = p_col == b
            sim_prior[p_row[at]] = np.maximum(sim_prior[p_row[at]], p_val[at])
        x = None
        if seed_dicts[b] and P > 0:
            sigma = sentence_emb @ q  # eq. 4
            if not config.use_activation:  # ablation: the seeds alone
                act, tier = np.zeros(M.shape[1]), np.zeros(M.shape[1], dtype=np.int64)
                for e, v in seed_dicts[b].items():
                    act[e], tier[e] = v, 1
                reset_e = act
            elif config.mode == "paper":
                act, tier, reset_e = activate_paper(M, sigma, seed_dicts[b], config)
            else:
                act, tier, reset_e = activate_reference(M, MT, sigma, seed_dicts[b], config)
            reset_p = passage_reset(sim_prior, N, act, tier, config)
            if config.use_ppr:
                x = personalized_pagerank(C, reset_p, reset_e, config, walk=walk)
            else:  # ablation: rank by the eq. 7 reset weights
                x = reset_p
        if x is None:  # dense fallback: no question entity, or a reset summing to zero
            indices[b], scores[b] = _rank(sim, k)
        else:
            indices[b], scores[b] = _rank(x[:P], k)
    return Retrieved(torch.from_numpy(indices), torch.from_numpy(scores.astype(np.float32)))


def pair_rerank(index: TriGraphIndex, queries: EncodedQueries, out: Retrieved, config: RetrievalConfig,
                passage_emb: np.ndarray | None = None) -> Retrieved:
    """pairs.py's rerank, one question at a time: among the first N = pair_candidates passages, the pair
    (i < j) of largest cos(q, v_i + v_j) + pair_rank_weight * (s_i + s_j) + pair_link_weight * [the two
    share an entity found in at most pair_link_max_passages passages], the first such pair on ties, takes
    the first two places; the rest keep their order. Only for questions with an entity and a positive top
    score. ``passage_emb``: the passage vectors in float64 (prepare's), if already made."""
    import itertools

    idx, scores = out.indices.numpy().copy(), out.scores.numpy().copy()
    N = min(config.pair_candidates, idx.shape[1])
    if N < 2:
        return out
    C = index.C
    crow, col = C.crow.numpy(), C.col.numpy()
    df = np.bincount(col, minlength=index.num_entities)
    emb = passage_emb if passage_emb is not None else _f64(index.passage_emb)
    with_entities = set(queries.entity_owner.cpu().tolist())
    for b in range(idx.shape[0]):
        cand = [int(p) for p in idx[b, :N]]
        top = float(scores[b, 0])
        if b not in with_entities or not top > 0 or sum(p >= 0 for p in cand) < 2:
            continue
        q = _f64(queries.query_emb[b])
        rare = [{int(e) for e in col[crow[p]:crow[p + 1]] if df[e] <= config.pair_link_max_passages} if p >= 0 else set()
                for p in cand]
        best, pair = -np.inf, None
        for i, j in itertools.combinations(range(N), 2):
            if cand[i] < 0 or cand[j] < 0:
                continue
            v = emb[cand[i]] + emb[cand[j]]
            value = float(v @ q) / max(float(np.linalg.norm(v)), 1e-12) \
                + config.pair_rank_weight * (float(scores[b, i]) + float(scores[b, j])) / top \
                + config.pair_link_weight * float(bool(rare[i] & rare[j]))
            if value > best:
                best, pair = value, (i, j)
        order = list(pair) + [c for c in range(idx.shape[1]) if c not in pair]
        idx[b], scores[b] = idx[b, order], scores[b, order]
    return Retrieved(torch.from_numpy(idx), torch.from_numpy(scores))
