"""Stage 1, entity activation by semantic bridging (eqs. 3-5), batched over B questions.

The state is dense (entities x B); nothing of size (sentences x B) is formed: sigma (eq. 4) is computed
for the (sentence, question) pairs a step visits (see kernels/), so a ``sigma`` argument is always the
pair (sentence_emb [S, D], query_emb [B, D]) (testing.sigma_pair writes a dense [S, B] sigma so).
See docs/METHOD.md for the exact semantics of both modes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels
from ..config import RetrievalConfig


@dataclass
class ColumnEntries:
    """The nonzero entries of a mostly-zero [rows, B] matrix as index lists (row, col, val), sorted by
    (row, col): the entity side of a batch (a question activates a handful of entities), without a dense
    [E, B] pass. activation.ActivePairs is one with the activation's other fields beside ``val``."""

    row: torch.Tensor  # int64
    col: torch.Tensor  # int64
    val: torch.Tensor
    shape: tuple

    @staticmethod
    def from_dense(x: torch.Tensor) -> "ColumnEntries":
        r, c = torch.nonzero(x, as_tuple=True)  # NaN counts as nonzero: the consumers clean values
        return ColumnEntries(r, c, x[r, c], tuple(x.shape))


@dataclass
class Activation:
    """Result of stage 1 for a batch (all [E, B]).

    act     activation used in eq. 7 (a_final in paper mode, the last recorded score in reference mode)
    tier    hop level L_e (1 = seed, t + 1 = activated at step t, 0 = inactive)
    reset   entity part of the PPR reset (a_final, or the accumulated weights in reference mode)
    """

    act: torch.Tensor
    tier: torch.Tensor
    reset: torch.Tensor
    steps: int = 0


def nearest_entities(entity_emb: torch.Tensor, query_entity_emb: torch.Tensor, rows: int = 256,
                     cols: int | None = None, known: torch.Tensor | None = None):
    """For each question entity: (largest cosine, index of the first graph entity reaching it), computed
    in [rows x cols] blocks of the similarity matrix (never the whole Q x E matrix). ``cols`` (default 4,096
    on a CPU, 65,536 on a GPU): on a CPU a block of 4,096 x 256 cosines (4 MiB) is still in cache when its
    maximum is taken; with 65,536 the maximum read the block back from memory and the scan was slower
    (measured: docs/benchmarks/kernels.md, "Figures behind the code's choices"). The products are the same
    bits whatever the block.

    ``known`` [Q] int64: for a question entity whose vector IS graph entity known[q]'s stored vector
    (the first entity with its encoder tokens; -1 where unknown), that entity and its self-cosine are
    the answer without the scan (another entity could tie only with an identical vector, which only
    equal tokens give, and those rows come later)."""
    # whether any row takes a stored vector: one value read back to the host per call, to skip that path's work
    if known is not None and known.numel() == query_entity_emb.shape[0] and bool((known >= 0).any()):
        known = known.to(entity_emb.device)
        hit = known >= 0
        best = torch.empty(known.shape[0], dtype=entity_emb.dtype, device=entity_emb.device)
        arg = known.clone()
        best[hit] = (query_entity_emb[hit].to(entity_emb.dtype) * entity_emb[known[hit]]).sum(1)
        rest = torch.nonzero(~hit).flatten()
        if rest.numel():
            best[rest], arg[rest] = nearest_entities(entity_emb, query_entity_emb[rest], rows, cols)
        return best, arg
    Q, E = query_entity_emb.shape[0], entity_emb.shape[0]
    cols = cols or (4096 if entity_emb.device.type == "cpu" else 1 << 16)
    best = torch.full((Q,), float("-inf"), dtype=entity_emb.dtype, device=entity_emb.device)
    arg = torch.zeros(Q, dtype=torch.int64, device=entity_emb.device)
    for i in range(0, Q, rows):
        q = query_entity_emb[i:i + rows]
        for j in range(0, E, cols):
            # entities x questions, not the transpose: with a few question rows the CPU's GEMM then reads the
            # entity block once (2wiki's 42,850 x 384 for 2 / 12 rows: 5.4 / 15.8 ms against 14.4 / 29.5)
            v, a = (entity_emb[j:j + cols] @ q.T).max(dim=0)  # max returns the first maximum
            better = v > best[i:i + rows]  # strict: an earlier block keeps a tie
            best[i:i + rows] = torch.where(better, v, best[i:i + rows])
            arg[i:i + rows] = torch.where(better, a + j, arg[i:i + rows])
    return best, arg


class NearestMemo:
    """nearest_entities with the last call's answer kept: a call whose question entities begin with the last
    call's (equal vectors, equal ``known`` rows) scans only the rows after them. A chain's later round
    (chain.second_round_queries) asks for the question's own entities again, then its chain seeds.
    The answer for a row is the one its first scan gave (a scan's rounding can depend, in the last bit, on
    the rows scanned beside it). One memo per entity matrix (DeviceGraph, which clears it after a chain); the
    equality check makes a stale or concurrent entry harmless."""

    def __init__(self):
        self._last = None  # (query vectors, known rows or None, best, arg)

    def clear(self) -> None:
        self._last = None

    def __call__(self, entity_emb: torch.Tensor, query_entity_emb: torch.Tensor, known: torch.Tensor | None = None):
        q = query_entity_emb
        last, n = self._last, 0
        if last is not None:
            pq, pk, pbest, parg = last
            m = pq.shape[0]
            if 0 < m <= q.shape[0] and pq.dtype == q.dtype and pq.device == q.device and torch.equal(pq, q[:m]) \
                    and torch.equal(_rows(pk, m, q.device), _rows(known, m, q.device)):
                n = m
        if n:
            best, arg = pbest, parg
            if n < q.shape[0]:
                b, a = nearest_entities(entity_emb, q[n:], known=None if known is None else known[n:])
                best, arg = torch.cat([best, b]), torch.cat([arg, a])
        else:
            best, arg = nearest_entities(entity_emb, q, known=known)
        self._last = (q, None if known is None else known[:q.shape[0]], best, arg)
        return best, arg


def _rows(known: torch.Tensor | None, m: int, device) -> torch.Tensor:
    """The first m known rows, -1 (scan) for all of them when there are none."""
    if known is None or known.numel() < m:
        return torch.full((m,), -1, dtype=torch.int64, device=device)
    return known[:m].to(device, torch.int64)


def seed_pairs(entity_emb: torch.Tensor, query_entity_emb: torch.Tensor, owner: torch.Tensor, batch: int,
               known: torch.Tensor | None = None, nearest: tuple | None = None):
    """Eq. 3 as index lists: (keys, values), keys = e * batch + b sorted and unique, one per (graph entity e,
    question b) that a question entity seeds, values its cosine (the largest when several entities of one
    question seed e; ties between graph entities go to the lowest index). ``known``: see nearest_entities;
    ``nearest``: its answer (best, arg) when the caller has it already (NearestMemo)."""
    if not (query_entity_emb.shape[0] and entity_emb.shape[0]):
        return (torch.zeros(0, dtype=torch.int64, device=entity_emb.device),
                torch.zeros(0, dtype=entity_emb.dtype, device=entity_emb.device))
    best, arg = nearest if nearest is not None else nearest_entities(entity_emb, query_entity_emb, known=known)  # [Q]
    return seed_keys(best, arg, owner, batch)


def seed_keys(best: torch.Tensor, arg: torch.Tensor, owner: torch.Tensor, batch: int):
    """seed_pairs from each question entity's nearest graph entity ``arg`` [Q] and its cosine ``best`` [Q]
    (``owner`` [Q]: the question of each): (keys e * batch + b sorted and unique, values the largest cosine)."""
    keys, inv = torch.unique(arg * batch + owner.to(arg.device), sorted=True, return_inverse=True)
    # a cosine can be <= 0: reduce from -inf
    vals = torch.full((keys.numel(),), float("-inf"), dtype=best.dtype, device=best.device)
    return keys, vals.scatter_reduce_(0, inv, best, "amax")


def dense_seeds(keys: torch.Tensor, vals: torch.Tensor, E: int, batch: int):
    """(seeds [E, B], is_seed [E, B] bool) from seed_pairs' (keys, values)."""
    seeds = torch.zeros(E * batch, dtype=vals.dtype, device=vals.device).index_copy_(0, keys, vals)
    is_seed = torch.zeros(E * batch, dtype=torch.bool, device=vals.device).index_fill_(0, keys, True)
    return seeds.view(E, batch), is_seed.view(E, batch)


def propagate_paper(M, MT, sigma, seeds, is_seed, cfg: RetrievalConfig, where=None) -> Activation:
    """Eq. 5 with dynamic pruning: a_t = max(Mᵀ(sigma ⊙ M(a ⊙ [a >= delta])) pruned at delta, a_{t-1}).

    M [S, E] and MT [E, S] are sparse CSR; each step is kernels.propagate_step (on the touched entries
    only). A question stops (keeps a_{t-1}) at the first step that activates no new entity.
    ``where``: None for a whole index; a shard's rows (kernels.propagate_step) in the sharded engine, whose
    dense [E, B] state is the same on every rank.
    """
    a = seeds.clone()
    tier = is_seed.to(torch.int64)
    live = torch.ones(a.shape[1], dtype=torch.bool, device=a.device)
    steps = 0
    for t in range(1, cfg.max_iterations):
        a_new = kernels.propagate_step(M, MT, a, sigma, cfg.delta, where)
        newly = (a_new >= cfg.delta) & (tier == 0)
        live = live & newly.any(dim=0)
        if not bool(live.any()):
            break
        steps = t
        a = torch.where(live, a_new, a)
        tier = torch.where(newly & live, t + 1, tier)
    return Activation(act=a, tier=tier, reset=a, steps=steps)


@dataclass
class ActivePairs(ColumnEntries):
    """Stage 1's result over the active (entity, question) pairs of a batch (tier >= 1), sorted by
    (entity, question): a ColumnEntries of shape (E, B) with row = entity, col = question, val = act
    (Activation.act at those pairs) and the other Activation fields beside it. Everything else is
    inactive (act = reset = 0, tier = 0), so eq. 7 and the PageRank reset need only these."""

    tier: torch.Tensor  # int64, >= 1
    reset: torch.Tensor
    steps: int = 0

    @staticmethod
    def from_keys(keys: torch.Tensor, act, tier, reset, shape: tuple, steps: int = 0) -> "ActivePairs":
        """From keys = e * B + b (sorted, unique), the form the activation loops merge on."""
        B = shape[1]
        return ActivePairs(keys // B, keys % B, act, tuple(shape), tier, reset, steps)

    def dense(self) -> Activation:
        """The [E, B] tensors of Activation."""
        E, B = self.shape
        keys = self.row * B + self.col

        def spread(v):
            return torch.zeros(E * B, dtype=v.dtype, device=v.device).index_copy_(0, keys, v).view(E, B)

        return Activation(act=spread(self.val), tier=spread(self.tier), reset=spread(self.reset), steps=self.steps)

    @staticmethod
    def from_activation(a: Activation) -> "ActivePairs":
        keys = torch.nonzero(a.tier.reshape(-1) > 0).flatten()
        return ActivePairs.from_keys(keys, a.act.reshape(-1)[keys], a.tier.reshape(-1)[keys], a.reset.reshape(-1)[keys],
                                     tuple(a.tier.shape), a.steps)


class WholeIndex:
    """Where propagate_reference_pairs' rows live, for one process holding the whole index: a step's sentences
    are all here, entity rows are global ids, and nothing is exchanged (every collective is the identity).
    The sharded engine passes its shard's instead (distributed/engine.py): there a rank takes the sentences it
    owns from the global top ``top_k_sentence`` of every rank's (a gather of top-k), maps its local entity rows
    to global ids and gathers the candidates of every rank."""

    num_entities: int | None = None  # E of the result; None: MT's row count

    def take(self, MT_crow, MT_col, e_idx, b_idx, sigma, used, B: int, k: int):
        """The sentences a step takes here: (pair, sentence, question, sigma) per taken (frontier pair, sentence),
        in pair order, best first: each frontier pair's ``k`` unused sentences of largest sigma
        (kernels.segment_topk_sigma)."""
        picks = kernels.segment_topk_sigma(MT_crow, MT_col, e_idx, b_idx, sigma, used, B, k)
        pair, _ = torch.nonzero(picks >= 0, as_tuple=True)  # (pair, rank) in pair order, best first
        cs = picks[picks >= 0]
        cb = b_idx[pair]
        return pair, cs, cb, kernels.gather_sigma(sigma, cs, cb)

    def held(self, e: torch.Tensor, b: torch.Tensor, av: torch.Tensor):
        """kernels.propagate_step's active entries of the entities held here (all of them), with their rows."""
        return e, b, av

    def global_entities(self, e: torch.Tensor) -> torch.Tensor:
        return e

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's rows, concatenated in rank order."""
        return x


WHOLE_INDEX = WholeIndex()


def propagate_reference_pairs(M_crow, M_col, MT_crow, MT_col, sigma, seed_keys: torch.Tensor, seed_vals: torch.Tensor,
                              B: int, cfg: RetrievalConfig, where: WholeIndex = WHOLE_INDEX) -> ActivePairs:
    """The reference code's breadth-first activation, for a batch, in the order-free form of METHOD.md.

    Each frontier entity (score >= delta) takes its top_k_sentence unused sentences by sigma
    (kernels.segment_topk_sigma); every entity of a taken sentence gets candidate score(e) * sigma[s];
    candidates >= delta add to its accumulated weight and re-activate it (score = largest candidate,
    tier = t + 1). The state lives on the active pairs only (seed_keys = e * B + b sorted, as from
    seed_pairs): the frontier, the used sentences and the scores are index lists, no [E, B] / [S, B] tensor.
    E (the result's shape) is MT's row count (where.num_entities when set). ``where``: where the rows live
    (WholeIndex; a shard's in the sharded engine, whose state, keyed by global entity ids, is the same on every
    rank).
    """
    device = seed_vals.device
    keys, score, weight = seed_keys, seed_vals.clone(), seed_vals.clone()
    tier = torch.ones(keys.numel(), dtype=torch.int64, device=device)
    e_idx, b_idx, f = keys // B, keys % B, seed_vals  # the frontier, sorted by (e, b)
    used = torch.empty(0, dtype=torch.int64, device=device)  # sorted keys s * B + b (a shard: the sentences it owns)
    steps = 0
    for t in range(1, cfg.max_iterations):
        keep = f >= cfg.delta
        e_idx, b_idx, f = e_idx[keep], b_idx[keep], f[keep]
        if e_idx.numel() == 0:
            break
        steps = t
        pair, cs, cb, sig = where.take(MT_crow, MT_col, e_idx, b_idx, sigma, used, B, cfg.top_k_sentence)
        used = torch.unique(torch.cat([used, cs * B + cb]))
        base = f[pair] * sig  # score(e) * sigma[s] for each taken (e, s)
        # every entity of each taken sentence receives the candidate
        owner2, pos2, _ = kernels.segment_positions(M_crow, cs)
        cand = base[owner2]
        ok = cand >= cfg.delta
        flat = where.global_entities(M_col[pos2][ok].to(torch.int64)) * B + cb[owner2][ok]
        flat, cand = where.gather_rows(flat), where.gather_rows(cand[ok])
        flat, inv = torch.unique(flat, sorted=True, return_inverse=True)
        new = torch.full((flat.numel(),), float("-inf"), dtype=score.dtype, device=device).scatter_reduce_(0, inv, cand, "amax")
        added = torch.zeros(flat.numel(), dtype=weight.dtype, device=device).index_add_(0, inv, cand)
        # merge the triggered pairs into the state: score = the new largest candidate, weight += the sum
        merged, where_at = torch.unique(torch.cat([keys, flat]), sorted=True, return_inverse=True)
        old_at, new_at = where_at[:keys.numel()], where_at[keys.numel():]
        score = score.new_zeros(merged.numel()).index_copy_(0, old_at, score).index_copy_(0, new_at, new)
        weight = weight.new_zeros(merged.numel()).index_copy_(0, old_at, weight).index_add_(0, new_at, added)
        tier = tier.new_zeros(merged.numel()).index_copy_(0, old_at, tier).index_fill_(0, new_at, t + 1)
        keys = merged
        e_idx, b_idx, f = flat // B, flat % B, new
    E = MT_crow.numel() - 1 if where.num_entities is None else where.num_entities
    return ActivePairs.from_keys(keys, score, tier, weight, (E, B), steps)
