"""One rank's part of a TriGraphIndex: a contiguous range of passages with the sentence and entity rows
they need, each entity owned by one rank, and the rank's part of the PageRank walk (see __init__.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import kernels
from ..retrieval.engine import query_embeddings
from ..index.csr import Csr


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
            passage_emb=query_embeddings(index.passage_emb[lo:hi], dev),
            N_logT=N_loc.with_values(torch.log1p(N_loc.val)).transpose().to(dev),
            sentences=sents.to(dev), sentence_texts=[index.sentences[i] for i in sents.tolist()],
            sentence_emb=query_embeddings(index.sentence_emb.index_select(0, sents), dev),
            owned_sentence=(sent_owner.index_select(0, sents) == rank).to(dev),
            M=M_loc.to(dev), PS=PS_loc.to(dev),
            entities=ents.to(dev), owned_entities=owned_ids.to(dev),
            entity_emb=query_embeddings(index.entity_emb.index_select(0, owned_ids), dev),
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
