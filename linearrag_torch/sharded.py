"""One index sharded across processes (torch.distributed): every rank holds a contiguous range of the
passages with the sentence and entity rows they need, runs the batched query path on its shard, and
exchanges only what the math makes global. The result equals engine.retrieve on the whole index (up to
float summation order, ~1e-7). docs/METHOD.md, "Sharded retrieval", derives each exchange; in short:

    seeds (eq. 3)     each entity is scanned by one rank (its owner); all-gather of [best, arg] per
                      question entity, the largest cosine wins, ties to the lowest entity index
    activation        the state (active pairs) is replicated; each sentence is owned by one rank.
      reference       per step: all-gather of each frontier pair's top_k_sentence unused (sigma, sentence)
                      -> the global top_k_sentence; all-gather of the candidates the taken sentences give
      paper           per step: all-gather of the partial sums M^T(sigma . M a) over owned sentences
    eq. 7             all-reduce max of the per-question min and max of cos(q, p) (min-max normalisation);
                      ln(1 + N_ep) sums are local (a passage's row of N is on its rank)
    PageRank          reset normalisation: all-reduce of the passage reset sums (and the reset's dangling
                      mass). Per block Gauss-Seidel step ONE all-reduce of [shared entities + 2, B]: the
                      partial W_ep p' of the entities whose passages lie on several ranks, the new passages'
                      dangling mass, and the L1 change of the step before (the stop rule is tested one
                      collective late, on the iterate kept anyway)
    top-k             all-gather of each rank's local top k, merged best first, ties to the lower passage
    chain round       the owner of a source passage computes its chain seeds; all-gather and max
                      per entity; the seed vectors come from the entities' owners (all-reduce)
    pair rerank       all-reduce of the top pair_candidates passages' vectors [B, N, D] (zeros where not
                      held); all-gather of the (question, slot, entity) links of the candidates each rank holds

Use: ``Shard.build(index, rank, world)`` then ``ShardedEngine(shard, Comm()).retrieve(queries, cfg)``
inside an initialised process group (``Comm(None)`` for one process without torch.distributed).
``run_local`` starts N local processes; ``python -m linearrag_torch.sharded`` is the torchrun entry point.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import time
from dataclasses import dataclass, field

import torch

from .retrieval import engine, pairs
from . import kernels
from .retrieval.activation import ActivePairs, nearest_entities
from .retrieval.chain import enabled as chain_enabled, merge as chain_merge
from .config import RetrievalConfig
from .retrieval.pagerank import FLOOR_RULE_BELOW
from .queries import EncodedQueries, Retrieved
from .retrieval.sparse import Csr

# ------------------------------------------------------------------------------------------ communication


class Comm:
    """The collectives the sharded engine uses, on the default process group (``group=None``) or, with
    ``dist=False``, a single process (every collective is the identity). Counts the bytes each rank
    contributes and the seconds spent inside collectives, per phase (``stats``)."""

    def __init__(self, dist: bool = True):
        self.dist = dist
        if dist:
            import torch.distributed as td

            self.td = td
            self.rank, self.world = td.get_rank(), td.get_world_size()
        else:
            self.td, self.rank, self.world = None, 0, 1
        self.phase = "other"
        self.stats: dict = {}

    def _count(self, nbytes: int, seconds: float, calls: int = 1) -> None:
        s = self.stats.setdefault(self.phase, {"calls": 0, "bytes": 0, "seconds": 0.0})
        s["calls"] += calls
        s["bytes"] += int(nbytes)
        s["seconds"] += seconds

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place; returns x."""
        if self.world == 1:
            return x
        t0 = time.perf_counter()
        ops = {"sum": self.td.ReduceOp.SUM, "max": self.td.ReduceOp.MAX}
        self.td.all_reduce(x, op=ops[op])
        self._count(x.numel() * x.element_size(), time.perf_counter() - t0)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[world, *x.shape]: every rank's x (same shape on every rank)."""
        if self.world == 1:
            return x[None]
        t0 = time.perf_counter()
        out = torch.empty((self.world, *x.shape), dtype=x.dtype, device=x.device)
        self.td.all_gather_into_tensor(out, x.contiguous()) if x.is_cuda else \
            self.td.all_gather(list(out.unbind(0)), x.contiguous())
        self._count(x.numel() * x.element_size(), time.perf_counter() - t0)
        return out

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of every rank's x [n_rank, ...] concatenated in rank order (n_rank may differ)."""
        if self.world == 1:
            return x
        n = self.all_gather(torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)).view(-1)
        most = int(n.max())
        pad = torch.zeros((most, *x.shape[1:]), dtype=x.dtype, device=x.device)
        pad[:x.shape[0]] = x
        out = self.all_gather(pad)
        return torch.cat([out[r, :int(n[r])] for r in range(self.world)])

    def all_gather_object(self, obj) -> list:
        if self.world == 1:
            return [obj]
        t0 = time.perf_counter()
        out = [None] * self.world
        self.td.all_gather_object(out, obj)
        self._count(0, time.perf_counter() - t0)
        return out

    def broadcast_object(self, obj, src: int = 0):
        if self.world == 1:
            return obj
        box = [obj]
        self.td.broadcast_object_list(box, src=src)
        return box[0]


# ------------------------------------------------------------------------------------------------- shards


def _query_embeddings(emb: torch.Tensor, device) -> torch.Tensor:
    """Stored vectors as the single-process engine keeps them on ``device`` (engine.query_embeddings where
    it exists: half-precision indexes), else as stored."""
    from .retrieval import engine

    f = getattr(engine, "query_embeddings", None)
    return f(emb, device) if f is not None else emb.to(device)


def _cosines(emb: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """emb @ qᵀ as the single-process engine computes it (engine.cosines where it exists)."""
    from .retrieval import engine

    f = getattr(engine, "cosines", None)
    return f(emb, q) if f is not None else emb @ q.to(emb.dtype).T


def _find(sorted_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Position of each x in the sorted id list, -1 where absent."""
    if sorted_ids.numel() == 0:
        return torch.full_like(x, -1)
    i = torch.searchsorted(sorted_ids, x).clamp_(max=sorted_ids.numel() - 1)
    return torch.where(sorted_ids[i] == x, i, torch.full_like(i, -1))


def passage_bounds(passages: int, world: int) -> list:
    """Rank r holds passages bounds[r] .. bounds[r + 1] - 1 (contiguous, equal counts within one)."""
    return [passages * r // world for r in range(world + 1)]


@dataclass
class Shard:
    """What one rank holds (all tensors on ``device``). Global ids stay global in results; ``entities`` and
    ``sentences`` map the shard's local rows to global ids (both sorted, so local order = global order).

    passages    lo .. hi - 1 with passage_emb [P_r, D], ids, titles, texts
    N_logT      ln(1 + N) of the local passages, [E_r, P_r] (local entity rows)
    sentences   the sentences of the local passages (and, on rank 0, the sentences of no passage),
                sentence_emb [S_r, D], texts, M [S_r, E_r]; ``owned_MT`` [E_r, S_r] keeps only the
                sentences this rank owns (the lowest passage holding it is local): activation counts
                every sentence once
    entities    C, N and M columns of those rows (ids only); ``owned_entities`` [E_o] (sorted global ids)
                with entity_emb [E_o, D]: every entity has exactly one owner, which alone holds its
                vector, scans it for seeds and provides it to chain rounds
    walk        the PageRank operator on the local passages and the walk's entity rows: the entities
                only this rank's passages touch (private) and every entity whose passages lie on
                several ranks (shared, the same list on every rank; their partial products are
                all-reduced each iteration)
    """

    rank: int
    world: int
    lo: int
    hi: int
    num_passages: int  # of the whole index
    num_entities: int
    passage_ids: list
    titles: list
    texts: list
    passage_emb: torch.Tensor
    N_logT: Csr
    sentences: torch.Tensor  # [S_r] global ids
    sentence_texts: list
    sentence_emb: torch.Tensor
    owned_sentence: torch.Tensor  # [S_r] bool
    M: Csr  # [S_r, E_r]
    PS: Csr  # [P_r, S_r]
    entities: torch.Tensor  # [E_r] global ids
    owned_entities: torch.Tensor  # [E_o] global ids, sorted
    entity_emb: torch.Tensor  # [E_o, D]
    walk_private: torch.Tensor  # [n_priv] local entity rows
    walk_shared: torch.Tensor  # [n_sh] global ids (every rank: the same list)
    shared_local: torch.Tensor  # [n_sh] local entity row of each shared entity, -1 where not local
    to_passages: Csr  # [P_r, n_priv + n_sh]: w / str(e)
    to_entities: Csr  # [n_priv + n_sh, P_r]: w / str(p)
    dangling_passages: torch.Tensor  # local passage rows of strength 0
    dangling_walk: torch.Tensor  # walk rows of strength 0 (private only)
    dim: int = 0
    walk_entities: torch.Tensor | None = None  # [n_priv + n_sh] global id of each walk column (pairs.py's links)
    walk_df: torch.Tensor | None = None  # [n_priv + n_sh] passages of the whole index holding that entity
    _mt: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def build(index, rank: int, world: int, device="cpu") -> "Shard":
        """Rank ``rank``'s shard of a TriGraphIndex (CPU tensors in); deterministic, so every rank can build
        its own from the same index."""
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in 0 .. {world - 1}, got {rank}")
        P, S, E = index.num_passages, index.num_sentences, index.num_entities
        if P < world:
            raise ValueError(f"{world} shards need at least {world} passages, the index has {P}")
        bounds = torch.tensor(passage_bounds(P, world))
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])

        def rank_of(p):
            return torch.searchsorted(bounds[1:], p, right=True)

        C, N, M, PS = (m.to("cpu") for m in (index.C, index.N, index.M, index.PS))
        # the lowest passage holding each sentence (0 for a sentence of no passage: rank 0 keeps those)
        big = torch.iinfo(torch.int64).max
        first_p = torch.full((S,), big, dtype=torch.int64).scatter_reduce_(0, PS.col, PS.row_index(), "amin")
        first_p = torch.where(first_p == big, torch.zeros_like(first_p), first_p)
        sent_owner = rank_of(first_p)
        # the lowest passage where each entity appears (C, N, or a sentence of the passage): its owner
        first_e = torch.full((E,), big, dtype=torch.int64)
        first_e.scatter_reduce_(0, C.col, C.row_index(), "amin").scatter_reduce_(0, N.col, N.row_index(), "amin")
        first_e.scatter_reduce_(0, M.col, first_p.index_select(0, M.row_index()), "amin")
        first_e = torch.where(first_e == big, torch.zeros_like(first_e), first_e)
        ent_owner = rank_of(first_e)
        # local sentences: those of the local passages, plus (rank 0) those of no passage
        in_ps = torch.zeros(S, dtype=torch.bool)
        in_ps[PS.col] = True
        local_p = torch.arange(lo, hi)
        ps_lo, ps_hi = int(PS.crow[lo]), int(PS.crow[hi])
        need_s = torch.zeros(S, dtype=torch.bool)
        need_s[PS.col[ps_lo:ps_hi]] = True
        if rank == 0:
            need_s |= ~in_ps
        sents = torch.nonzero(need_s).flatten()
        # local entities: the columns of the local rows of C, N, M, and (rank 0) entities that appear nowhere
        need_e = torch.zeros(E, dtype=torch.bool)
        for mat, rows in ((C, local_p), (N, local_p), (M, sents)):
            _, pos, _ = kernels.segment_positions(mat.crow, rows)
            need_e[mat.col[pos]] = True
        need_e |= ent_owner == rank
        ents = torch.nonzero(need_e).flatten()
        owned_ids = torch.nonzero(ent_owner == rank).flatten()  # a subset of ents
        # the walk: strengths are global sums (an entity's passages may lie on several ranks)
        strength_p = C.row_sums().double()
        strength_e = torch.zeros(E, dtype=torch.float64).index_add_(0, C.col, C.val.double())
        c_rank = rank_of(C.row_index())
        lo_r = torch.full((E,), big, dtype=torch.int64).scatter_reduce_(0, C.col, c_rank, "amin")
        hi_r = torch.full((E,), -1, dtype=torch.int64).scatter_reduce_(0, C.col, c_rank, "amax")
        has_c = hi_r >= 0
        shared = has_c & (lo_r != hi_r)
        private = (has_c & (lo_r == rank) & (hi_r == rank)) | (~has_c & (ent_owner == rank))
        walk_shared = torch.nonzero(shared).flatten()
        walk_private_g = torch.nonzero(private).flatten()
        n_priv = walk_private_g.numel()
        walk_ids = torch.cat([walk_private_g, walk_shared])
        walk_row = torch.full((E,), -1, dtype=torch.int64)
        walk_row[walk_private_g] = torch.arange(n_priv)
        walk_row[walk_shared] = n_priv + torch.arange(walk_shared.numel())
        C_loc = C.submatrix(local_p, torch.arange(E))  # [P_r, E], global columns
        rows_loc = C_loc.row_index()
        inv_p = torch.where(strength_p > 0, 1.0 / strength_p, torch.zeros_like(strength_p))[lo:hi]
        inv_e = torch.where(strength_e > 0, 1.0 / strength_e, torch.zeros_like(strength_e))
        n_walk = n_priv + walk_shared.numel()
        wcol = walk_row.index_select(0, C_loc.col)
        to_p = Csr.from_coo(rows_loc, wcol, (C_loc.val.double() * inv_e.index_select(0, C_loc.col)).float(),
                            (hi - lo, n_walk))
        to_e = Csr.from_coo(wcol, rows_loc, (C_loc.val.double() * inv_p.index_select(0, rows_loc)).float(),
                            (n_walk, hi - lo))
        dangling_walk = torch.nonzero(strength_e.index_select(0, walk_private_g) == 0).flatten()

        local_e = torch.full((E,), -1, dtype=torch.int64)
        local_e[ents] = torch.arange(ents.numel())
        N_loc = N.submatrix(local_p, ents)
        M_loc = M.submatrix(sents, ents)
        PS_loc = PS.submatrix(local_p, sents)
        dev = torch.device(device)
        return Shard(
            rank=rank, world=world, lo=lo, hi=hi, num_passages=P, num_entities=E,
            passage_ids=list(index.passage_ids[lo:hi]), titles=list(index.titles[lo:hi]), texts=list(index.texts[lo:hi]),
            passage_emb=_query_embeddings(index.passage_emb[lo:hi], dev),
            N_logT=N_loc.with_values(torch.log1p(N_loc.val)).transpose().to(dev),
            sentences=sents.to(dev), sentence_texts=[index.sentences[i] for i in sents.tolist()],
            sentence_emb=_query_embeddings(index.sentence_emb.index_select(0, sents), dev),
            owned_sentence=(sent_owner.index_select(0, sents) == rank).to(dev),
            M=M_loc.to(dev), PS=PS_loc.to(dev),
            entities=ents.to(dev), owned_entities=owned_ids.to(dev),
            entity_emb=_query_embeddings(index.entity_emb.index_select(0, owned_ids), dev),
            walk_private=local_e.index_select(0, walk_private_g).to(dev), walk_shared=walk_shared.to(dev),
            shared_local=local_e.index_select(0, walk_shared).to(dev),
            to_passages=to_p.to(dev), to_entities=to_e.to(dev),
            dangling_passages=torch.nonzero(strength_p[lo:hi] == 0).flatten().to(dev),
            dangling_walk=dangling_walk.to(dev), dim=int(index.passage_emb.shape[1]),
            walk_entities=walk_ids.to(dev), walk_df=torch.bincount(C.col, minlength=E).index_select(0, walk_ids).to(dev),
        )

    @property
    def device(self) -> torch.device:
        return self.passage_emb.device

    def local_entity(self, e: torch.Tensor) -> torch.Tensor:
        """Local row of each global entity id, -1 where this shard does not hold it."""
        if self.entities.numel() == 0:
            return torch.full_like(e, -1)
        i = torch.searchsorted(self.entities, e).clamp_(max=self.entities.numel() - 1)
        return torch.where(self.entities[i] == e, i, torch.full_like(i, -1))

    def owned_row(self, e: torch.Tensor) -> torch.Tensor:
        """Row in entity_emb of each global entity id, -1 where this shard does not own it."""
        return _find(self.owned_entities, e)

    def local_sentence(self, s: torch.Tensor) -> torch.Tensor:
        if self.sentences.numel() == 0:
            return torch.full_like(s, -1)
        i = torch.searchsorted(self.sentences, s).clamp_(max=self.sentences.numel() - 1)
        return torch.where(self.sentences[i] == s, i, torch.full_like(i, -1))

    def matrix(self, name: str) -> torch.Tensor:
        """torch CSR forms, made once: to_passages, to_entities, M, MT (Mᵀ of the owned sentences only)."""
        if name not in self._mt:
            if name == "MT":
                M = self.M.to("cpu")
                owned = self.owned_sentence.to("cpu")
                keep = owned.index_select(0, M.row_index())
                m = Csr.from_coo(M.col[keep], M.row_index()[keep], M.val[keep], (M.shape[1], M.shape[0]))
            else:
                m = getattr(self, name).to("cpu")
            self._mt[name] = m.torch(self.device, index_dtype=m.compact_index_dtype())
        return self._mt[name]

    def nbytes(self) -> dict:
        """Bytes held per kind (embeddings, graph matrices) on the device."""
        def t(*xs):
            return sum(x.numel() * x.element_size() for x in xs)

        def csr(m):
            return t(m.crow, m.col, m.val)

        return {
            "passage_emb": t(self.passage_emb), "sentence_emb": t(self.sentence_emb), "entity_emb": t(self.entity_emb),
            "matrices": csr(self.N_logT) + csr(self.M) + csr(self.PS) + csr(self.to_passages) + csr(self.to_entities)
            + t(self.sentences, self.entities, self.owned_sentence, self.owned_entities, self.walk_private,
                self.walk_shared, self.shared_local),
        }


# ------------------------------------------------------------------------------------------------- engine


class ShardedEngine:
    """The query path of engine.retrieve on one shard; every rank calls ``retrieve`` with the same
    queries and config and gets the same Retrieved (global passage rows)."""

    def __init__(self, shard: Shard, comm: Comm):
        if comm.world != shard.world or comm.rank != shard.rank:
            raise ValueError(f"shard {shard.rank}/{shard.world} in process group rank {comm.rank}/{comm.world}")
        self.shard = shard
        self.comm = comm
        self.iteration_log: list | None = None  # set to [] to record (bytes, compute s, comm s) per PPR iteration

    # --------------------------------------------------------------------------------------------- entry
    @engine.in_inference_mode
    def retrieve(self, queries: EncodedQueries, cfg: RetrievalConfig) -> Retrieved:
        """Top-k passages for a batch (see engine.retrieve; trace is not offered; under inference mode, as
        there). ``queries.entity_rows``, when given, must be rows of the index this shard was built from."""
        if cfg.adjacent_passages:
            raise ValueError("adjacent_passages is not supported by the sharded engine (it links passages "
                             "across shard boundaries); query the index in one process")
        queries = self._stored_vectors(queries.to(self.shard.device))
        if pairs.enabled(cfg):
            return self._pairs(queries, self._ranked(queries, pairs.deeper(cfg)), cfg).head(cfg.top_k)
        return self._ranked(queries, cfg)

    def _ranked(self, queries: EncodedQueries, cfg: RetrievalConfig) -> Retrieved:
        """The ranking before the pair rerank: the chain's rounds, or one round."""
        return self._chain(queries, cfg) if chain_enabled(cfg) else self._one_round(queries, cfg)

    def _pairs(self, queries: EncodedQueries, out: Retrieved, cfg: RetrievalConfig) -> Retrieved:
        """pairs.rerank: the candidates' vectors from their ranks (all-reduce of [B, N, D], zeros elsewhere) and
        the linking entities of the candidates each rank holds (all-gather of (question, slot, entity))."""
        sh = self.shard
        N = min(cfg.pair_candidates, out.indices.shape[1])
        if N < 2:
            return out
        dev = sh.device
        idx = out.indices.to(dev)
        cand = idx[:, :N]
        mine = (cand >= sh.lo) & (cand < sh.hi)
        vec = torch.zeros((*cand.shape, sh.dim), dtype=torch.float32, device=dev)
        vec[mine] = sh.passage_emb[cand[mine] - sh.lo].float()
        self.comm.phase = "pairs"
        self.comm.all_reduce(vec)
        linking = pairs.link_entities(sh.walk_df, cfg.pair_link_max_passages)
        tp = sh.to_passages
        q, slot, col = pairs.candidate_entities(tp.crow, tp.col, linking, torch.where(mine, cand - sh.lo, -1))
        triples = self.comm.all_gather_rows(torch.stack([q, slot, sh.walk_entities[col]], 1))
        link = pairs.linked(triples[:, 0], triples[:, 1], triples[:, 2], cand.shape[0], N)
        return pairs.rerank(Retrieved(idx, out.scores.to(dev)), queries.query_emb, vec, link,
                            pairs.has_entities(queries), cfg)

    def _stored_vectors(self, queries: EncodedQueries) -> EncodedQueries:
        """The question entities with a stored-vector row get that entity's vector from its owner (the
        question side may send a placeholder: QuestionIndex)."""
        rows = queries.entity_rows
        if rows is None or not bool((rows >= 0).any()):
            return queries
        sh = self.shard
        hit = torch.nonzero(rows >= 0).flatten()
        loc = sh.owned_row(rows[hit].to(sh.device))
        vec = torch.zeros(hit.numel(), sh.dim, dtype=torch.float32, device=sh.device)
        vec[loc >= 0] = sh.entity_emb[loc[loc >= 0]].float()
        self.comm.phase = "seeds"
        self.comm.all_reduce(vec)
        emb = queries.entity_emb.clone()
        emb[hit.to(emb.device)] = vec.to(emb.device, emb.dtype)
        return dataclasses.replace(queries, entity_emb=emb)

    # ---------------------------------------------------------------------------------------------- seeds
    def seed_pairs(self, queries: EncodedQueries):
        """activation.seed_pairs over the whole index: (keys e * B + b sorted unique, values)."""
        sh, B = self.shard, queries.batch_size
        dev = sh.device
        Q = queries.entity_emb.shape[0]
        if Q == 0 or sh.num_entities == 0:
            return torch.zeros(0, dtype=torch.int64, device=dev), torch.zeros(0, dtype=sh.entity_emb.dtype, device=dev)
        best = torch.full((Q,), float("-inf"), dtype=sh.entity_emb.dtype, device=dev)
        arg = torch.zeros(Q, dtype=torch.int64, device=dev)
        known = queries.entity_rows.to(dev) if queries.entity_rows is not None else torch.full((Q,), -1, device=dev)
        scan = torch.nonzero(known < 0).flatten()
        if scan.numel() and sh.owned_entities.numel():
            b, a = nearest_entities(sh.entity_emb, queries.entity_emb.index_select(0, scan))
            best[scan], arg[scan] = b, sh.owned_entities[a]
        hit = torch.nonzero(known >= 0).flatten()
        if hit.numel():  # a stored vector: its own entity, with its self-cosine (nearest_entities' known path)
            loc = sh.owned_row(known[hit])
            mine = loc >= 0
            v = sh.entity_emb[loc[mine]]
            best[hit[mine]] = (queries.entity_emb[hit[mine]].to(v.dtype) * v).sum(1)
            arg[hit] = known[hit]
        self.comm.phase = "seeds"
        both = self.comm.all_gather(torch.stack([best.double(), arg.double()]))  # [world, 2, Q]
        vals, args = both[:, 0], both[:, 1]
        top = vals.max(0).values
        # the largest cosine; among ranks reaching it, the lowest entity index
        args = torch.where(vals == top, args, torch.full_like(args, float("inf")))
        best, arg = top.to(sh.entity_emb.dtype), args.min(0).values.to(torch.int64)
        keys, inv = torch.unique(arg * B + queries.entity_owner.to(dev), sorted=True, return_inverse=True)
        vals = torch.full((keys.numel(),), float("-inf"), dtype=best.dtype, device=dev)
        return keys, vals.scatter_reduce_(0, inv, best, "amax")

    # ---------------------------------------------------------------------------------------- activation
    def activate(self, queries: EncodedQueries, cfg: RetrievalConfig) -> ActivePairs:
        keys, vals = self.seed_pairs(queries)
        E, B = self.shard.num_entities, queries.batch_size
        if not cfg.use_activation:
            return ActivePairs.from_keys(keys, vals, torch.ones_like(keys), vals, (E, B))
        self.comm.phase = "activation"
        if cfg.mode == "paper":
            return self._propagate_paper(keys, vals, queries, cfg)
        return self._propagate_reference(keys, vals, queries, cfg)

    def _propagate_reference(self, keys, seed_vals, queries, cfg) -> ActivePairs:
        """activation.propagate_reference_pairs with the sentences spread over the ranks."""
        sh, B, comm = self.shard, queries.batch_size, self.comm
        dev = sh.device
        MT = sh.matrix("MT")
        MT_crow, MT_col = MT.crow_indices().to(torch.int64), MT.col_indices().to(torch.int64)
        M_crow, M_col = sh.M.crow, sh.M.col
        sigma = (sh.sentence_emb, queries.query_emb)
        score, weight = seed_vals.clone(), seed_vals.clone()
        tier = torch.ones(keys.numel(), dtype=torch.int64, device=dev)
        e_idx, b_idx, f = keys // B, keys % B, seed_vals
        used = torch.empty(0, dtype=torch.int64, device=dev)  # local sentence * B + b, owned sentences only
        steps = 0
        k = cfg.top_k_sentence
        for t in range(1, cfg.max_iterations):
            keep = f >= cfg.delta
            e_idx, b_idx, f = e_idx[keep], b_idx[keep], f[keep]
            if e_idx.numel() == 0:
                break
            steps = t
            n = e_idx.numel()
            # this rank's best unused owned sentences of each frontier pair (entities it does not hold: none)
            loc = sh.local_entity(e_idx)
            has = torch.nonzero(loc >= 0).flatten()
            sig = torch.full((n, k), float("-inf"), dtype=torch.float64, device=dev)
            gid = torch.full((n, k), float("inf"), dtype=torch.float64, device=dev)
            if has.numel():
                picks = kernels.segment_topk_sigma(MT_crow, MT_col, loc[has], b_idx[has], sigma, used, B, k)
                ok = picks >= 0
                pr, _ = torch.nonzero(ok, as_tuple=True)
                s_loc = picks[ok]
                v = kernels.gather_sigma(sigma, s_loc, b_idx[has][pr])
                sub_sig = torch.full((has.numel(), k), float("-inf"), dtype=torch.float64, device=dev)
                sub_gid = torch.full((has.numel(), k), float("inf"), dtype=torch.float64, device=dev)
                sub_sig[ok], sub_gid[ok] = v.double(), sh.sentences[s_loc].double()
                sig[has], gid[has] = sub_sig, sub_gid
            allp = comm.all_gather(torch.stack([sig, gid]))  # [world, 2, n, k]
            sig_all = allp[:, 0].permute(1, 0, 2).reshape(n, -1)
            gid_all = allp[:, 1].permute(1, 0, 2).reshape(n, -1)
            # the global top k: sigma descending, ties to the lower sentence
            o = torch.argsort(gid_all, dim=1, stable=True)
            o = o.gather(1, torch.argsort(-sig_all.gather(1, o), dim=1, stable=True))[:, :k]
            top_sig, top_gid = sig_all.gather(1, o), gid_all.gather(1, o)
            ok = top_sig > float("-inf")
            pair, _ = torch.nonzero(ok, as_tuple=True)  # (pair, rank) in pair order, best first
            cs_g = top_gid[ok].to(torch.int64)
            cb = b_idx[pair]
            cs_l = sh.local_sentence(cs_g)
            mine = cs_l >= 0
            mine[mine.clone()] = sh.owned_sentence[cs_l[mine]]
            m = torch.nonzero(mine).flatten()
            used = torch.unique(torch.cat([used, cs_l[m] * B + cb[m]]))
            base = f[pair[m]] * top_sig[ok][m].to(f.dtype)  # score(e) * sigma[s] (sigma as the owner computed it)
            owner2, pos2, _ = kernels.segment_positions(M_crow, cs_l[m])
            cand = base[owner2]
            okc = cand >= cfg.delta
            flat_l = sh.entities[M_col[pos2][okc]] * B + cb[m][owner2][okc]
            cand_l = cand[okc]
            flat = comm.all_gather_rows(flat_l)
            cand = comm.all_gather_rows(cand_l)
            flat, inv = torch.unique(flat, sorted=True, return_inverse=True)
            new = torch.full((flat.numel(),), float("-inf"), dtype=score.dtype, device=dev).scatter_reduce_(0, inv, cand, "amax")
            added = torch.zeros(flat.numel(), dtype=weight.dtype, device=dev).index_add_(0, inv, cand)
            merged, where = torch.unique(torch.cat([keys, flat]), sorted=True, return_inverse=True)
            old_at, new_at = where[:keys.numel()], where[keys.numel():]
            score = score.new_zeros(merged.numel()).index_copy_(0, old_at, score).index_copy_(0, new_at, new)
            weight = weight.new_zeros(merged.numel()).index_copy_(0, old_at, weight).index_add_(0, new_at, added)
            tier = tier.new_zeros(merged.numel()).index_copy_(0, old_at, tier).index_fill_(0, new_at, t + 1)
            keys = merged
            e_idx, b_idx, f = flat // B, flat % B, new
        return ActivePairs.from_keys(keys, score, tier, weight, (sh.num_entities, B), steps)

    def _propagate_paper(self, keys, seed_vals, queries, cfg) -> ActivePairs:
        """activation.propagate_paper (kernels.propagate_step) with the sentences spread over the ranks:
        the dense [E, B] state is replicated, y = Mᵀ(sigma ⊙ M a) is summed over the ranks' owned sentences."""
        sh, B, comm = self.shard, queries.batch_size, self.comm
        E, dev = sh.num_entities, sh.device
        sigma = (sh.sentence_emb, queries.query_emb)
        a = torch.zeros(E * B, dtype=seed_vals.dtype, device=dev).index_copy_(0, keys, seed_vals).view(E, B)
        tier = torch.zeros(E * B, dtype=torch.int64, device=dev).index_fill_(0, keys, 1).view(E, B)
        MT = sh.matrix("MT")
        MT_crow, MT_col, MT_val = MT.crow_indices().to(torch.int64), MT.col_indices().to(torch.int64), MT.values()
        live = torch.ones(B, dtype=torch.bool, device=dev)
        steps = 0
        for t in range(1, cfg.max_iterations):
            # kernels.propagate_step: x = M (a ⊙ [a >= delta]) on owned sentences, y = Mᵀ (sigma ⊙ x)
            a_new = a.clamp(min=0)
            e, b = ((a >= cfg.delta) & (a != 0)).nonzero(as_tuple=True)
            flat_l = torch.zeros(0, dtype=torch.int64, device=dev)
            y_l = torch.zeros(0, dtype=a.dtype, device=dev)
            if e.numel():
                loc = sh.local_entity(e)
                h = loc >= 0
                e_l, b_l, av = loc[h], b[h], a[e[h], b[h]]
                owner, pos, _ = kernels.segment_positions(MT_crow, e_l)
                key = MT_col[pos] * B + b_l[owner]
                key, inv = torch.unique(key, sorted=True, return_inverse=True)
                x = torch.zeros(key.numel(), dtype=a.dtype, device=dev).index_add_(0, inv, MT_val[pos] * av[owner])
                s, sb = key // B, key % B
                z = x * kernels.gather_sigma(sigma, s, sb)
                owner2, pos2, _ = kernels.segment_positions(sh.M.crow, s)
                flat_l = sh.entities[sh.M.col[pos2]] * B + sb[owner2]
                y_l = sh.M.val[pos2].to(a.dtype) * z[owner2]
            flat = comm.all_gather_rows(flat_l)
            yv = comm.all_gather_rows(y_l)
            if flat.numel():
                flat, inv2 = torch.unique(flat, sorted=True, return_inverse=True)
                y = torch.zeros(flat.numel(), dtype=a.dtype, device=dev).index_add_(0, inv2, yv)
                y = y * (y >= cfg.delta)
                a_new.view(-1)[flat] = torch.maximum(y, a.reshape(-1)[flat])
            newly = (a_new >= cfg.delta) & (tier == 0)
            live = live & newly.any(dim=0)
            if not bool(live.any()):
                break
            steps = t
            a = torch.where(live, a_new, a)
            tier = torch.where(newly & live, t + 1, tier)
        flat = torch.nonzero(tier.reshape(-1) > 0).flatten()
        return ActivePairs.from_keys(flat, a.reshape(-1)[flat], tier.reshape(-1)[flat], a.reshape(-1)[flat], (E, B), steps)

    # ---------------------------------------------------------------------------------------- one round
    def _one_round(self, queries: EncodedQueries, cfg: RetrievalConfig) -> Retrieved:
        sh, comm = self.shard, self.comm
        B, dev = queries.batch_size, sh.device
        sim = _cosines(sh.passage_emb, queries.query_emb)  # [P_r, B]
        act = self.activate(queries, cfg)
        use_graph = torch.zeros(B, dtype=torch.bool, device=dev)
        use_graph[act.col] = True
        g = torch.nonzero(use_graph).flatten()
        scores = sim
        if g.numel():
            n = g.numel()
            col = torch.full((B,), -1, dtype=torch.int64, device=dev)
            col[g] = torch.arange(n, device=dev)
            prior = sim if queries.prior is None else queries.prior.apply(sim)  # this rank's passages (_chain)
            bg, sim_g = col[act.col], prior.index_select(1, g)
            reset_p = self._passage_reset(sim_g, act, bg, cfg)
            if cfg.use_ppr:
                ppr_p, valid = self._pagerank(reset_p, act.row, bg, act.reset, cfg)
            else:
                ppr_p, valid = reset_p, torch.ones(n, dtype=torch.bool, device=dev)
            use_graph[g] = valid
            scores = sim.clone()
            scores[:, g[valid]] = ppr_p[:, valid]
        return self._topk(scores, min(cfg.top_k, sh.num_passages))

    def _passage_reset(self, sim, act: ActivePairs, bg, cfg) -> torch.Tensor:
        """Eq. 7 (pagerank.passage_reset_entries) with the min-max normalisation over every rank's passages."""
        sh = self.shard
        self.comm.phase = "eq7"
        ext = self.comm.all_reduce(torch.cat([-sim.min(dim=0).values, sim.max(dim=0).values]), "max")
        n = sim.shape[1]
        lo, hi = -ext[:n], ext[n:]
        span = (hi - lo)[None]
        lo = lo[None]
        mm = torch.where(span > 0, (sim - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(sim))
        z = torch.zeros_like(sim)
        loc = sh.local_entity(act.row)
        h = loc >= 0
        kernels.spmm_sparse_rhs(sh.N_logT.crow, sh.N_logT.col, sh.N_logT.val, loc[h], bg[h],
                                (act.val / act.tier.to(sim.dtype))[h], z)
        return (cfg.lam * mm + torch.log1p_(z)) * cfg.passage_node_weight

    def _pagerank(self, reset_p, e_glob, cols, e_vals, cfg):
        """pagerank.personalized_pagerank (passage scores only) on the sharded walk: see the module doc."""
        sh, comm = self.shard, self.comm
        dev = reset_p.device
        d = float(cfg.damping)
        rp = torch.nan_to_num(reset_p, nan=0.0).clamp_(min=0)
        B = rp.shape[1]
        ev = torch.nan_to_num(e_vals.to(rp.dtype), nan=0.0).clamp_(min=0)
        n_priv, n_sh = sh.walk_private.numel(), sh.walk_shared.numel()
        # the walk rows of the reset entries: private ones held here, every shared one
        loc = sh.local_entity(e_glob)
        wrow = torch.full_like(e_glob, -1)
        if n_priv:
            pos = torch.searchsorted(sh.walk_private, loc.clamp(min=0)).clamp_(max=n_priv - 1)
            wrow = torch.where((loc >= 0) & (sh.walk_private[pos] == loc), pos, wrow)
        if n_sh:
            pos = torch.searchsorted(sh.walk_shared, e_glob).clamp_(max=n_sh - 1)
            wrow = torch.where(sh.walk_shared[pos] == e_glob, n_priv + pos, wrow)
        h = wrow >= 0

        def entity_reset(values):
            return torch.zeros(n_priv + n_sh, B, dtype=rp.dtype, device=dev).index_put_(
                (wrow[h], cols[h]), values[h], accumulate=True)

        dp, de = sh.dangling_passages, sh.dangling_walk
        # the reset's total, and its mass on the dangling passages and entities (dangling walk rows are
        # private: each is held by one rank), in one collective
        comm.phase = "ppr_setup"
        sums = comm.all_reduce(torch.stack([rp.sum(0), rp.index_select(0, dp).sum(0),
                                            entity_reset(ev).index_select(0, de).sum(0)]))
        total = sums[0].index_add_(0, cols, ev)
        valid = total > 0
        norm = torch.where(valid, total, torch.ones_like(total))
        rp.div_(norm)
        re = entity_reset(ev / norm[cols])
        r_dp, r_de = sums[1] / norm, sums[2] / norm
        W_pe, W_ep = sh.matrix("to_passages"), sh.matrix("to_entities")
        result = torch.zeros_like(rp)
        cols_w = torch.arange(B, device=dev)
        xp, xe = rp.clone(), re.clone()
        # g: the dangling mass of (xp, xe). A dangling entity row has no edge, so after a step it holds its
        # reset times that step's entity coefficient: the entities' part of g is r_de times it (x_0 = r: 1)
        g_e = r_de.clone()
        g = r_dp + g_e
        last = torch.full((B,), float("inf"), dtype=rp.dtype, device=dev)
        ch_loc = torch.zeros(B, dtype=rp.dtype, device=dev)
        log = self.iteration_log
        comm.phase = "ppr"
        for t in range(cfg.ppr_max_iter):
            t0 = time.perf_counter()
            # block Gauss-Seidel (kernels.ppr_step): the passages (all local), then the entities from them
            reset_part = rp * ((1.0 - d) + d * g)
            out_p = torch.addmm(reset_part, W_pe, xe, alpha=d) if W_pe.shape[1] else reset_part
            y = torch.mm(W_ep, out_p) if W_ep.shape[0] else xe.new_zeros(n_priv + n_sh, xp.shape[1])
            buf = torch.cat([y[n_priv:], out_p.index_select(0, dp).sum(0)[None], ch_loc[None]])
            t1 = time.perf_counter()
            comm.all_reduce(buf)
            t2 = time.perf_counter()
            sent = buf.numel() * buf.element_size() if comm.world > 1 else 0
            y_sh, g_p, change = buf[:n_sh], buf[n_sh], buf[n_sh + 1]
            if t > 0:  # the stop rule of personalized_pagerank, for the step before
                stop = (change < cfg.ppr_tol) | ((change >= last) & (change < FLOOR_RULE_BELOW))
                last = change
                if bool(stop.any()):
                    result[:, cols_w[stop]] = xp[:, stop]
                    k = torch.nonzero(~stop).flatten()
                    if k.numel() == 0:
                        if log is not None:
                            log.append((sent, t1 - t0, t2 - t1))
                        break
                    cols_w, last = cols_w[k], last[k]
                    xp, xe, rp, re = xp[:, k], xe[:, k], rp[:, k], re[:, k]
                    out_p, y, y_sh, g_p, g_e, r_de = out_p[:, k], y[:, k], y_sh[:, k], g_p[k], g_e[k], r_de[k]
            t3 = time.perf_counter()
            coef_e = (1.0 - d) + d * (g_p + g_e)  # g' over (p', xe)
            out_e = re * coef_e
            out_e[:n_priv] += d * y[:n_priv]
            out_e[n_priv:] += d * y_sh
            g_e = r_de * coef_e
            g = g_p + g_e
            ch_loc = (out_p - xp).abs().sum(0) + (out_e[:n_priv] - xe[:n_priv]).abs().sum(0)
            if sh.rank == 0:  # the shared rows are the same on every rank: counted once
                ch_loc = ch_loc + (out_e[n_priv:] - xe[n_priv:]).abs().sum(0)
            xp, xe = out_p, out_e
            if log is not None:
                log.append((sent, (t1 - t0) + (time.perf_counter() - t3), t2 - t1))
        else:
            result[:, cols_w] = xp  # ppr_max_iter reached
        return result, valid

    def _topk(self, scores, k: int) -> Retrieved:
        """kernels.topk_columns over every rank's passages: local top k, all-gathered, merged."""
        sh = self.shard
        B = scores.shape[1]
        kl = min(k, scores.shape[0])
        idx, vals = kernels.topk_columns(scores, kl)
        pad_i = torch.full((B, k), float("inf"), dtype=torch.float64, device=scores.device)
        pad_v = torch.full((B, k), float("-inf"), dtype=torch.float64, device=scores.device)
        pad_i[:, :kl], pad_v[:, :kl] = (idx + sh.lo).double(), vals.double()
        self.comm.phase = "topk"
        allk = self.comm.all_gather(torch.stack([pad_v, pad_i]))  # [world, 2, B, k]
        v = allk[:, 0].permute(1, 0, 2).reshape(B, -1)
        i = allk[:, 1].permute(1, 0, 2).reshape(B, -1)
        o = torch.argsort(i, dim=1, stable=True)
        o = o.gather(1, torch.argsort(-v.gather(1, o), dim=1, stable=True))[:, :k]
        return Retrieved(i.gather(1, o).to(torch.int64), v.gather(1, o).to(scores.dtype))

    # -------------------------------------------------------------------------------------- chain rounds
    def _chain(self, queries: EncodedQueries, cfg: RetrievalConfig) -> Retrieved:
        """chain.chain_retrieve with this engine's rounds; the chain seeds come from the ranks that hold
        the source passages (chain.chain_seeds on the shard), merged by max per entity."""
        one = cfg.replace(chain_passages=0)
        later = one.replace(passage_node_weight=cfg.chain_passage_weight)
        depth = max(cfg.top_k, cfg.chain_passages * (cfg.chain_rounds + 1), cfg.chain_keep * (cfg.chain_rounds + 1))
        cur = self._one_round(queries, one.replace(top_k=depth))
        out = cur
        B = queries.batch_size
        skip = [set() for _ in range(B)]
        seeds = [dict() for _ in range(B)]
        for r in range(1, cfg.chain_rounds + 1):
            for acc, new in zip(seeds, self._chain_seeds(queries, cur, cfg, skip)):
                for e, w in new.items():
                    acc[e] = max(acc.get(e, 0.0), w)
            q2 = dataclasses.replace(self._second_round_queries(queries, seeds), prior=self._prior(queries, seeds, cfg))
            cur = self._one_round(q2, later.replace(top_k=depth))
            out = chain_merge(out, cur, r * cfg.chain_keep, depth)
        return out.head(cfg.top_k)

    def _prior(self, queries: EncodedQueries, seeds: list, cfg: RetrievalConfig):
        """chain.passage_prior for this rank's passages: a passage's sentences and the entities they mention
        are all on its rank, so the seeds this rank holds give its passages' entries with nothing exchanged."""
        from .retrieval import chain

        sh = self.shard
        ents = sorted({e for sd in seeds for e in sd})
        loc = sh.local_entity(torch.tensor(ents, dtype=torch.int64, device=sh.device)).cpu().tolist() if ents else []
        to_local = {e: lc for e, lc in zip(ents, loc) if lc >= 0}
        local = [{to_local[e]: w for e, w in sd.items() if e in to_local} for sd in seeds]
        return chain.passage_prior(_ChainView(sh), queries, local, cfg)

    def _chain_seeds(self, queries, first: Retrieved, cfg, skip) -> list:
        from .retrieval import chain

        sh = self.shard
        idx = first.indices.cpu()
        # the sources of this round (chain.chain_seeds' rule), then only those held here, at their positions
        mine = torch.full_like(idx, -1)
        has_entities = set(queries.entity_owner.cpu().tolist())
        for b in range(idx.shape[0]):
            if b not in has_entities:
                continue
            sources = [int(p) for p in idx[b].tolist() if p >= 0 and int(p) not in skip[b]][: cfg.chain_passages]
            for p in sources:
                skip[b].add(p)
                if sh.lo <= p < sh.hi:
                    mine[b, idx[b].tolist().index(p)] = p - sh.lo
        view = _ChainView(sh)
        local = chain.chain_seeds(view, queries, Retrieved(mine, first.scores), cfg)
        ents = sh.entities.cpu()
        local = [{int(ents[e]): w for e, w in sd.items()} for sd in local]
        self.comm.phase = "chain"
        out = [dict() for _ in range(idx.shape[0])]
        for part in self.comm.all_gather_object(local):
            for acc, sd in zip(out, part):
                for e, w in sd.items():
                    if w > acc.get(e, 0.0):
                        acc[e] = w
        return out

    def _second_round_queries(self, queries: EncodedQueries, seeds: list) -> EncodedQueries:
        """chain.second_round_queries: each seed entity's own vector (from its owner) scaled by w(e)."""
        sh = self.shard
        dev = queries.entity_emb.device
        ents, owner, ws = [], [], []
        for b, sd in enumerate(seeds):
            for e in sorted(sd):
                ents.append(e)
                owner.append(b)
                ws.append(sd[e])
        if not ents:
            return queries
        e = torch.tensor(ents, dtype=torch.int64, device=sh.device)
        vec = torch.zeros(e.numel(), sh.dim, dtype=torch.float32, device=sh.device)
        loc = sh.owned_row(e)
        have = loc >= 0
        vec[have] = sh.entity_emb[loc[have]].float()
        self.comm.phase = "chain"
        self.comm.all_reduce(vec)
        w = torch.tensor(ws, dtype=torch.float32)
        emb = (vec.cpu() * w[:, None]).to(dev)
        rows = queries.entity_rows
        if rows is not None:
            rows = torch.cat([rows, torch.full((len(ents),), -1, dtype=rows.dtype, device=rows.device)])
        return EncodedQueries(queries.query_emb, torch.cat([queries.entity_emb, emb]),
                              torch.cat([queries.entity_owner, torch.tensor(owner, dtype=torch.int64,
                                                                            device=queries.entity_owner.device)]),
                              list(queries.entity_text) + [f"entity {i}" for i in ents], rows, None)

    # ------------------------------------------------------------------------------------------- results
    def passages(self, rows) -> dict:
        """{global row: (id, title, text)} for the given rows, gathered from the ranks holding them."""
        sh = self.shard
        mine = {p: (sh.passage_ids[p - sh.lo], sh.titles[p - sh.lo], sh.texts[p - sh.lo])
                for p in {int(r) for r in rows} if sh.lo <= p < sh.hi}
        out = {}
        for part in self.comm.all_gather_object(mine):
            out.update(part)
        return out

    def hits(self, out: Retrieved) -> list:
        """api.LinearRAG.hits for a sharded result (every rank gets the same list)."""
        from .api import Hit

        idx, scores = out.indices.cpu().tolist(), out.scores.cpu().tolist()
        info = self.passages([i for row in idx for i in row if i >= 0])
        return [[Hit(info[i][0], float(s), info[i][1], info[i][2], i) for i, s in zip(row, srow) if i >= 0]
                for row, srow in zip(idx, scores)]


class _ChainView:
    """The shard seen as the index chain.chain_seeds reads (local passage and sentence rows, local entities)."""

    def __init__(self, sh: Shard):
        self.PS, self.M, self.titles, self.sentences = sh.PS.to("cpu"), sh.M.to("cpu"), sh.titles, sh.sentence_texts
        self.sentence_emb = sh.sentence_emb.to("cpu")


# ------------------------------------------------------------------------------------------ question side


class QuestionIndex:
    """What the question pipeline reads of an index (entity strings and token hashes, the index settings),
    without its tensors. An entity string that takes an index entity's stored vector gets a zero
    placeholder here and its row in EncodedQueries.entity_rows: the sharded seed search uses only the
    row (the entity's owner supplies its self-cosine)."""

    def __init__(self, index):
        self.entities = index.entities
        self.keys = index.keys
        self.index_config = index.index_config
        self.retrieval_config = index.retrieval_config
        self.num_entities = index.num_entities
        self.dim = index.dim
        self.entity_emb = _ZeroRows(index.dim)


class _ZeroRows:
    def __init__(self, dim):
        self.dim = dim

    def __getitem__(self, rows):
        return torch.zeros(len(rows), self.dim)


def encode_questions(qindex: QuestionIndex, questions: list, cfg: RetrievalConfig, nlp=None, encoder=None,
                     device="cpu") -> EncodedQueries:
    """LinearRAG.encode_queries for a sharded index (rank 0 runs it and broadcasts the result)."""
    from .api import _load_encoder, _load_nlp
    from .corpus import check_question
    from .retrieval.pipeline import QuestionPipeline

    for q in questions:
        check_question(q)
    pipe = QuestionPipeline(qindex, nlp or _load_nlp(qindex.index_config),
                            encoder or _load_encoder(qindex.index_config, device))
    enc = pipe.encode(questions, pipe.entities(questions, cfg.lexicon_seeds), True)
    return EncodedQueries(enc.query_emb, enc.entity_emb, enc.entity_owner, enc.entity_text, enc.entity_rows, None)


# ------------------------------------------------------------------------------------------ process group


def device_for(rank: int, device: str = "auto") -> torch.device:
    """cuda:(local rank mod GPUs) when CUDA is present (device auto or cuda), else cpu."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device(device)


def init_group(rank: int, world: int, port: int | None = None, device: torch.device = torch.device("cpu"),
               timeout_s: float = 300.0) -> Comm:
    """Join the process group: NCCL for CUDA, gloo for CPU. With ``port``, rendezvous on 127.0.0.1:port
    (local processes); without, torch's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: torchrun)."""
    import datetime

    import torch.distributed as td

    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    url = f"tcp://127.0.0.1:{port}" if port else "env://"
    kw = {"device_id": device} if device.type == "cuda" else {}
    td.init_process_group(backend, init_method=url, rank=rank, world_size=world,
                          timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return Comm()


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_worker(rank, world, port, device, fn, args, out_q):
    import torch.distributed as td

    try:
        comm = init_group(rank, world, port, device_for(rank, device))
        out = fn(comm, *args)
        # plain pickle bytes: tensors sent through torch's shared-memory reducers would need this
        # process alive until the parent has read them
        out_q.put((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        out_q.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if td.is_initialized():
            td.destroy_process_group()


def run_local(world: int, fn, args=(), device: str = "cpu", timeout_s: float = 600.0) -> list:
    """Run ``fn(comm, *args)`` in ``world`` local processes (spawned, one process group on 127.0.0.1 at a
    free port) and return their results in rank order; an error or ``timeout_s`` in any rank raises
    RuntimeError (the others are terminated). ``fn`` and ``args`` must be picklable."""
    import queue

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_local_worker, args=(r, world, port, device, fn, args, out_q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"sharded run: no result from ranks {sorted(set(range(world)) - set(results))} "
                                   f"within {timeout_s:.0f} s")
            try:
                rank, status, value = out_q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    raise RuntimeError(f"sharded run: rank {dead[0]} exited with code {procs[dead[0]].exitcode}")
                continue
            if status == "error":
                raise RuntimeError(f"sharded run: rank {rank} failed: {value}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [results[r] for r in range(world)]


# ------------------------------------------------------------------------------------------- the query job


def query_job(comm: Comm, index_dir: str, questions: list, overrides: dict, top_k=None, batch_size: int = 256,
              reference_code: bool = False, threads: int | None = None, device: str = "auto",
              quantize: str | None = None, encoder_backend: str = "torch"):
    """One rank of `linearrag query --shards N` (or of a torchrun job): load INDEX_DIR, keep this rank's
    shard (the rest is freed), answer the questions (rank 0 encodes them, with ``quantize`` and
    ``encoder_backend`` as LinearRAG takes them, and broadcasts the vectors) and return the hits (api.Hit
    lists) on rank 0, None elsewhere."""
    import gc

    from .index import TriGraphIndex
    from .retrieval.pipeline import set_threads

    set_threads(threads)
    dev = device_for(comm.rank, device)
    index = TriGraphIndex.load(index_dir, device="cpu")
    base = index.retrieval_config
    if reference_code:
        base = RetrievalConfig.reference_code(top_k=base.top_k)
    cfg = base.replace(**overrides).replace(top_k=top_k)
    shard = Shard.build(index, comm.rank, comm.world, dev)
    qindex = QuestionIndex(index) if comm.rank == 0 else None
    del index
    gc.collect()
    engine = ShardedEngine(shard, comm)
    encoder = None
    if comm.rank == 0:
        from .api import load_question_encoder

        encoder = load_question_encoder(qindex.index_config, dev, quantize, encoder_backend)
    results = []
    for start in range(0, len(questions), batch_size):
        chunk = questions[start:start + batch_size]
        enc = encode_questions(qindex, chunk, cfg, encoder=encoder, device=dev) if comm.rank == 0 else None
        enc = comm.broadcast_object(None if enc is None else enc.to("cpu"))
        results += engine.hits(engine.retrieve(enc, cfg))
    return results if comm.rank == 0 else None


def _check_device(device: str, shards: int) -> str:
    dev = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    if dev.startswith("cuda"):
        n = torch.cuda.device_count()
        if shards > n:
            raise ValueError(f"--shards {shards} on CUDA needs {shards} GPUs (NCCL puts one rank on each), "
                             f"torch sees {n}; use --device cpu (gloo) or fewer shards")
        return "cuda"
    return dev


def cmd_query_sharded(args, items: list) -> int:
    """`linearrag query INDEX_DIR ... --shards N`: N local processes, rank 0 prints (cli.print_hits)."""
    from . import cli

    if args.backend != "torch":
        raise ValueError("--shards runs the torch engine; --backend scipy answers in one process")
    cli._open_for_update(args.index_dir)  # a clear error now for a folder that holds no index
    device = _check_device(args.device, args.shards)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.shards)
    try:
        hits = run_local(args.shards, query_job,
                         (str(args.index_dir), [it["question"] for it in items], cli._settings(args), args.top_k,
                          args.batch_size, args.reference_code, threads, device, args.quantize, args.encoder_backend),
                         device=device, timeout_s=float(os.environ.get("LINEARRAG_SHARD_TIMEOUT", 3600)))[0]
    except RuntimeError as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    cli.print_hits(items, hits, args.json)
    return 0


def retrieve_job(comm: Comm, index, queries: EncodedQueries, configs: list, device: str = "cpu") -> list:
    """One rank: shard ``index`` (the whole TriGraphIndex, pickled to every rank) and retrieve ``queries``
    under each config; returns the Retrieved list (CPU tensors; every rank gets the same)."""
    shard = Shard.build(index, comm.rank, comm.world, device_for(comm.rank, device))
    engine = ShardedEngine(shard, comm)
    out = []
    for cfg in configs:
        r = engine.retrieve(queries, cfg)
        out.append(Retrieved(r.indices.cpu(), r.scores.cpu()))
    return out


def main(argv=None) -> int:
    """torchrun entry point: ``torchrun ... -m linearrag_torch.sharded INDEX_DIR QUESTION ...`` with the
    arguments of `linearrag query` (not --shards: the launcher's WORLD_SIZE is the shard count); each rank
    joins through env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) and rank 0 prints."""
    import sys

    from . import cli

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = cli.parser().parse_args(["query", *(sys.argv[1:] if argv is None else argv)])
    items = cli._question_items(args)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    comm = init_group(rank, world, None, device_for(rank, args.device))
    try:
        hits = query_job(comm, args.index_dir, [it["question"] for it in items], cli._settings(args), args.top_k,
                         args.batch_size, args.reference_code, args.threads, args.device, args.quantize,
                         args.encoder_backend)
    finally:
        import torch.distributed as td

        td.destroy_process_group()
    if rank == 0:
        cli.print_hits(items, hits, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
