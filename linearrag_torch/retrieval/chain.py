"""A second retrieval round that follows the chain one more hop, without an LLM (``RetrievalConfig.chain_passages``).

Compositional questions ("the seat of the county where X is located") name only the first hop's
entity; the bridge entity ("Mountrail County") is written in the first hop's passage, not in the
question. After a first round (the usual eqs. 3-7), each of its top ``chain_passages`` passages p
contributes the entities of its ``chain_sentences`` sentences most similar to the question (eq. 4's
sigma), as extra seeds of a second round with seed score

    w(e) = chain_weight * score1(p) / score1(top passage) * sigma(s)        (the best such p and s for e)

next to the question's own entities (a passage's title line is not taken: it names the passage itself).
The second round is an ordinary retrieval (eqs. 3-7, with W_p = ``chain_passage_weight``) with those
seeds: an extra seed is given to eq. 3 as the graph entity's own embedding scaled by w(e), so that its
nearest graph entity is itself (cosine 1) and its seed score is w(e). Both backends therefore run it
unchanged, and agree as they do on one round.

The final list keeps the first round's top ``chain_keep`` passages in their order, then the second
round's ranking without them (the scores are each round's own PageRank values). ``chain_rounds`` > 1
repeats the step: each further round adds the chain seeds of the previous round's top passages not yet
used as sources (stages.chain_round runs the rounds; stages.py has the order).

Everything here is batched tensor work on the device of the round's results, with no loop over the
questions and no value read back to the host (segment operations over CSR rows, as in kernels/). On CUDA
the operations whose output size depends on the data (nonzero, unique, boolean masks, the CSR row
expansion of kernels.segment_positions) wait for the device to learn that size; no value reaches Python.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..config import RetrievalConfig
from ..kernels import gather_sigma, segment_positions, top_k_per_segment
from ..queries import EncodedQueries, PassagePrior, Retrieved


def enabled(cfg: RetrievalConfig) -> bool:
    """Whether a retrieval runs later rounds: chain_passages > 0 in reference mode. Paper mode answers in one
    round (its eq. 5 sums every path, and the extra seeds swamped it: docs/QUALITY.md)."""
    return cfg.chain_passages > 0 and cfg.mode == "reference"


@dataclass
class ChainTables:
    """What the chain reads of an index (or of one shard's rows), as tensors on one device; made once per index
    and device (engine.DeviceGraph.chain_tables, the scipy backend's prepare).

    ps_crow, ps_col     PS [P, S] as CSR: each passage's sentences, ascending
    ps_title            [nnz(PS)] bool: the entry's sentence is its passage's title line (a passage's title line
                        names the passage itself and links nowhere new: never a chain sentence)
    sp_crow, sp_col     PSᵀ [S, P]: each sentence's passages, ascending;  sp_title [nnz(PS)] as ps_title
    m_crow, m_col       M [S, E]: each sentence's entities;  mt_crow, mt_col  Mᵀ [E, S]: each entity's sentences
    sentence_emb        [S, D] the sentence vectors as the device multiplies them (eq. 4's sigma)
    entity_emb          [E, D] the entity vectors (a chain seed's query vector), None where not needed (shards)
    tokens_unique       [E] bool: no other entity has the entity's encoder tokens (TokenKeys); None without keys
    index               the index the rows belong to (EncodedQueries.rows_of of the second round's queries)
    """

    ps_crow: torch.Tensor
    ps_col: torch.Tensor
    ps_title: torch.Tensor
    sp_crow: torch.Tensor
    sp_col: torch.Tensor
    sp_title: torch.Tensor
    m_crow: torch.Tensor
    m_col: torch.Tensor
    mt_crow: torch.Tensor
    mt_col: torch.Tensor
    sentence_emb: torch.Tensor
    entity_emb: torch.Tensor | None
    tokens_unique: torch.Tensor | None
    index: object

    @property
    def num_passages(self) -> int:
        return self.ps_crow.numel() - 1

    @property
    def num_sentences(self) -> int:
        return self.sp_crow.numel() - 1

    @property
    def num_entities(self) -> int:
        return self.mt_crow.numel() - 1

    @staticmethod
    def build(index, device, sentence_emb: torch.Tensor | None = None, entity_emb: torch.Tensor | None = None,
              mentions: tuple | None = None) -> "ChainTables":
        """From ``index`` (a TriGraphIndex, or any object with its PS, M, titles, sentences and optionally keys and
        entity_emb, e.g. a shard's view), on ``device``. ``sentence_emb``, ``entity_emb``: the vectors as the
        device multiplies them (default: the index's, moved there); ``mentions``: (M crow, M col, Mᵀ crow, Mᵀ col)
        already on the device (engine.DeviceGraph holds them), else made from index.M."""
        dev = torch.device(device)
        PS = index.PS.to("cpu")
        SP = PS.transpose()
        # title-line flags: each stripped title and sentence text numbered once, then compared as numbers
        title_id: dict = {}
        titles = torch.tensor([title_id.setdefault(t.strip(), len(title_id)) if t.strip() else -1
                               for t in index.titles], dtype=torch.int64)
        sentence_title = torch.tensor([title_id.get(s.strip(), -2) for s in index.sentences], dtype=torch.int64)
        ps_title = titles.index_select(0, PS.row_index()) == sentence_title.index_select(0, PS.col)
        sp_title = titles.index_select(0, SP.col) == sentence_title.index_select(0, SP.row_index())
        if mentions is None:
            M = index.M.to("cpu")
            MT = M.transpose()
            mentions = (M.crow, M.col, MT.crow, MT.col)
        m_crow, m_col, mt_crow, mt_col = (t.to(dev) for t in mentions)
        if sentence_emb is None:
            sentence_emb = index.sentence_emb
        if entity_emb is None:
            entity_emb = getattr(index, "entity_emb", None)
        hashes = getattr(getattr(index, "keys", None), "entities", None)
        unique = None
        if hashes is not None and hashes.numel() == mt_crow.numel() - 1:
            _, inv, counts = torch.unique(hashes, return_inverse=True, return_counts=True)
            unique = (counts[inv] == 1).to(dev)
        return ChainTables(
            PS.crow.to(dev), PS.col.to(dev), ps_title.to(dev), SP.crow.to(dev), SP.col.to(dev), sp_title.to(dev),
            m_crow, m_col, mt_crow, mt_col, sentence_emb.to(dev),
            None if entity_emb is None else entity_emb.to(dev), unique, index)


@dataclass
class ChainSeeds:
    """The chain seeds of a batch: one entry per (question, entity), sorted by question, then entity.

    question  [n] int64, the question (0 .. B - 1)
    entity    [n] int64, the entity (a row of the tables' entities: the index's, or a shard's local ones)
    weight    [n] float64, its seed score w(e) (module docstring), > 0
    """

    question: torch.Tensor
    entity: torch.Tensor
    weight: torch.Tensor

    @staticmethod
    def empty(device) -> "ChainSeeds":
        none = torch.zeros(0, dtype=torch.int64, device=device)
        return ChainSeeds(none, none, torch.zeros(0, dtype=torch.float64, device=device))

    @staticmethod
    def from_entries(question: torch.Tensor, entity: torch.Tensor, weight: torch.Tensor,
                     num_entities: int) -> "ChainSeeds":
        """The seeds of (question, entity, weight) entries in any order, repeats kept once with their largest weight."""
        keys, inv = torch.unique(question * num_entities + entity, sorted=True, return_inverse=True)
        best = torch.zeros(keys.numel(), dtype=torch.float64, device=keys.device).scatter_reduce_(
            0, inv, weight.to(torch.float64), "amax")  # weights are > 0: reduce from 0
        return ChainSeeds(keys // max(num_entities, 1), keys % max(num_entities, 1), best)

    def union(self, other: "ChainSeeds", num_entities: int) -> "ChainSeeds":
        """Both sets of seeds, an entity in both with the larger weight."""
        return ChainSeeds.from_entries(torch.cat([self.question, other.question]),
                                       torch.cat([self.entity, other.entity]),
                                       torch.cat([self.weight, other.weight]), num_entities)

    def to_dicts(self, batch: int) -> list[dict]:
        """Per question {entity: w(e)} on the host (diagnostics and tests: this copies the seeds off the device)."""
        out = [dict() for _ in range(batch)]
        for b, e, w in zip(self.question.tolist(), self.entity.tolist(), self.weight.tolist()):
            out[b][e] = w
        return out


def chain_sources(first: Retrieved, with_entities: torch.Tensor, used: torch.Tensor, cfg: RetrievalConfig):
    """The source passages of a round: per question its first ``chain_passages`` passages of ``first`` that no
    earlier round used (``used`` [B, U] int64, -1 = none), for questions with an entity (``with_entities`` [B]
    bool; the others are answered by dense retrieval: no chain either). Returns (source [B, K] bool, at the
    columns of first.indices, and ``used`` with this round's sources appended, [B, U + K])."""
    idx = first.indices
    fresh = (idx >= 0) & with_entities.to(idx.device)[:, None]
    if used.shape[1]:
        fresh &= ~(idx[:, :, None] == used[:, None, :]).any(dim=2)
    source = fresh & (torch.cumsum(fresh, dim=1) <= cfg.chain_passages)
    return source, torch.cat([used, torch.where(source, idx, torch.full_like(idx, -1))], dim=1)


def chain_seeds(tables: ChainTables, queries: EncodedQueries, first: Retrieved, source: torch.Tensor,
                cfg: RetrievalConfig) -> ChainSeeds:
    """The chain seeds (module docstring) of the source passages ``source`` [B, K] bool (chain_sources) of the
    round ``first``: for each source p of question b with share = max(score(p) / score(top), 0) (none when the
    top score is not positive), its ``chain_sentences`` sentences of largest sigma (ties to the lower sentence;
    title lines aside) give each entity they mention w = chain_weight * share * sigma when w > 0; an entity
    reached several times keeps its largest w. first.indices hold rows of ``tables`` (-1: none)."""
    idx, scores = first.indices, first.scores
    dev = idx.device
    if idx.shape[1] == 0:
        return ChainSeeds.empty(dev)
    top = scores[:, 0].double()
    b, j = torch.nonzero(source & (top > 0)[:, None], as_tuple=True)  # the sources, by question then rank
    share = (scores[b, j].double() / top[b]).clamp_(min=0.0)
    owner, pos, offsets = segment_positions(tables.ps_crow, idx[b, j])  # (source, sentence) entries
    sent = tables.ps_col[pos].to(torch.int64)
    question = b[owner]
    sigma = gather_sigma((tables.sentence_emb, queries.query_emb.to(dev, torch.float32)), sent, question)
    # best first, ties to the earlier entry: the lower sentence (PS rows ascend); title lines never taken
    sigma = torch.where(tables.ps_title[pos], torch.full_like(sigma, float("-inf")), sigma)
    taken = top_k_per_segment(sigma, owner, offsets, cfg.chain_sentences)
    w = (cfg.chain_weight * share[owner[taken]]) * sigma[taken].double()
    positive = w > 0
    sent, question, w = sent[taken][positive], question[taken][positive], w[positive]
    at, pos, _ = segment_positions(tables.m_crow, sent)  # (sentence, entity) entries
    return ChainSeeds.from_entries(question[at], tables.m_col[pos].to(torch.int64), w[at], tables.num_entities)


class _SeedTexts(Sequence):
    """EncodedQueries.entity_text of a later round: the question entities' texts, then the chain seeds' entity
    names, read from the index only when asked for (reading them copies the seeds' rows to the host)."""

    def __init__(self, head: list, names: list, entities: torch.Tensor):
        self._head, self._names, self._entities, self._tail = list(head), names, entities, None

    def __len__(self) -> int:
        return len(self._head) + self._entities.numel()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i < len(self._head):
            return self._head[i]
        if self._tail is None:
            self._tail = [self._names[e] for e in self._entities.tolist()]
        return self._tail[i - len(self._head)]


def second_round_queries(tables: ChainTables, queries: EncodedQueries, seeds: ChainSeeds,
                         vectors: torch.Tensor | None = None) -> EncodedQueries:
    """The questions with their own entities plus the chain seeds (scaled own embeddings, see module doc).
    ``vectors``: the seed entities' own vectors [n, D] (default: from tables.entity_emb)."""
    w = seeds.weight.to(torch.float32)
    if vectors is None:
        vectors = tables.entity_emb.index_select(0, seeds.entity)
    emb = vectors.float() * w[:, None]
    emb = torch.cat([queries.entity_emb, emb.to(queries.entity_emb.device)])
    owner = torch.cat([queries.entity_owner, seeds.question.to(queries.entity_owner.device)])
    text = _SeedTexts(queries.entity_text, tables.index.entities, seeds.entity)
    # stored-vector rows (EncodedQueries.entity_rows): the question entities' stay (pipeline.py); a chain seed
    # is its entity's own vector, so its nearest entity is itself unless another entity has its encoder
    # tokens (an equal vector up to rounding): those scan (-1), as do all of them without token keys
    rows = queries.entity_rows
    if tables.tokens_unique is None:
        if rows is not None:
            rows = torch.cat([rows, torch.full((seeds.entity.numel(),), -1, dtype=rows.dtype, device=rows.device)])
        return EncodedQueries(queries.query_emb, emb, owner, text, rows, queries.rows_of)
    dev = owner.device
    own = rows.to(dev) if rows is not None and queries.rows_of is tables.index else \
        torch.full((queries.entity_owner.numel(),), -1, dtype=torch.int64, device=dev)
    extra = torch.where(tables.tokens_unique[seeds.entity], seeds.entity, torch.full_like(seeds.entity, -1))
    return EncodedQueries(queries.query_emb, emb, owner, text, torch.cat([own, extra.to(dev)]), tables.index)


def passage_prior(tables: ChainTables, queries: EncodedQueries, seeds: ChainSeeds,
                  cfg: RetrievalConfig) -> PassagePrior | None:
    """Eq. 7's dense prior for a later round (module docstring): the floor cfg.chain_prior_floor, and with
    cfg.chain_bridge_prior, for each question b and passage p holding a sentence that mentions one of b's
    chain seeds (p's title line aside), the largest cosine of b with such a sentence. None when both are off
    (floor -1). ``tables`` may be a shard's (local rows); the entries are on the seeds' device."""
    if cfg.chain_prior_floor <= -1.0 and not cfg.chain_bridge_prior:
        return None
    dev = seeds.entity.device
    if not cfg.chain_bridge_prior or seeds.entity.numel() == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return PassagePrior(float(cfg.chain_prior_floor), empty, empty, torch.zeros(0, dtype=torch.float32, device=dev))
    # every question's (question, seed) pairs at once: the sentences mentioning a seed, each distinct
    # (question, sentence) pair's cosine, spread over the sentence's passages (title lines aside), and
    # the largest per (question, passage)
    S, P = tables.num_sentences, tables.num_passages
    owner, pos, _ = segment_positions(tables.mt_crow, seeds.entity)  # (seed, sentence) entries
    pairs = torch.unique(seeds.question[owner] * S + tables.mt_col[pos].to(torch.int64))  # b * S + s, sorted
    b, sent = pairs // S, pairs % S
    cos = pair_cosines(tables.sentence_emb, queries.query_emb.to(dev, torch.float32), sent, b)
    owner, pos, _ = segment_positions(tables.sp_crow, sent)  # (pair, passage) entries
    keep = ~tables.sp_title[pos]  # a passage's own title line names it and links nowhere new (as in chain_seeds)
    at = owner[keep]
    keys, inv = torch.unique(b[at] * P + tables.sp_col[pos][keep].to(torch.int64), return_inverse=True)  # b * P + p
    best = torch.full((keys.numel(),), float("-inf"), device=dev).scatter_reduce_(0, inv, cos[at], "amax")
    return PassagePrior(float(cfg.chain_prior_floor), keys % P, keys // P, best)


def pair_cosines(sentence_emb: torch.Tensor, query_emb: torch.Tensor, sent: torch.Tensor,
                 question: torch.Tensor) -> torch.Tensor:
    """<sentence_emb[sent[i]], query_emb[question[i]]> as float32 for (question, sentence) pairs sorted by
    question: one sampled product of [B, D] and [D, S] on the pairs' pattern (torch.sparse.sampled_addmm, each
    pair's own dot product whatever the other pairs, so a question's values do not depend on its batch; faster
    than gathering both rows per pair on the CPU, docs/benchmarks/kernels.md, "Figures behind the code's
    choices"). Half-precision sentence vectors, or a
    torch or device without that product: kernels.gather_sigma (products of the rows widened to float32)."""
    if sentence_emb.dtype == torch.float32 and sent.numel():
        B = query_emb.shape[0]
        crow = torch.zeros(B + 1, dtype=torch.int64, device=sent.device)
        torch.cumsum(torch.bincount(question, minlength=B), 0, out=crow[1:])
        with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state", invariant checks off
            warnings.simplefilter("ignore", UserWarning)
            pattern = torch.sparse_csr_tensor(crow, sent, torch.zeros(sent.numel(), device=sent.device),
                                              size=(B, sentence_emb.shape[0]))
            try:
                return torch.sparse.sampled_addmm(pattern, query_emb, sentence_emb.T, beta=0.0).values()
            except (RuntimeError, NotImplementedError):
                pass
    return gather_sigma((sentence_emb, query_emb), sent, question).float()


def merge(first: Retrieved, second: Retrieved, keep: int, k: int) -> Retrieved:
    """The first round's top ``keep`` passages, then the second round's ranking without them; k per question
    (min(k, the wider input's columns); -1 and score 0 pad a short row).
    A passage's score is its second-round score where the second round lists it (so passages that tie there
    still tie), else its first-round score."""
    dev = first.indices.device
    fi, fs = first.indices[:, :keep], first.scores[:, :keep]
    si, ss = second.indices.to(dev), second.scores.to(dev, fs.dtype)
    B = fi.shape[0]
    k = min(k, max(first.indices.shape[1], si.shape[1]))
    if si.shape[1]:  # a kept passage listed by the second round takes its score there
        listed = (fi[:, :, None] == si[:, None, :]) & (si >= 0)[:, None, :]  # [B, keep, K2]
        column = listed.to(torch.int32).argmax(dim=2)  # where the second round lists it (once at most)
        fs = torch.where(listed.any(dim=2), torch.gather(ss, 1, column), fs)
    cand, val = torch.cat([fi, si], dim=1), torch.cat([fs, ss], dim=1)  # [B, L]: candidates in order
    # each passage once, at its first place in that order
    L = cand.shape[1]
    earlier = torch.ones(L, L, dtype=torch.bool, device=dev).tril_(diagonal=-1)  # [j, i]: i < j
    repeat = ((cand[:, :, None] == cand[:, None, :]) & earlier).any(dim=2)
    ok = (cand >= 0) & ~repeat
    place = torch.cumsum(ok, dim=1) - 1
    place = torch.where(ok & (place < k), place, torch.full_like(place, k))  # column k: discarded
    idx = torch.full((B, k + 1), -1, dtype=torch.int64, device=dev).scatter_(1, place, cand)
    scores = torch.zeros((B, k + 1), dtype=val.dtype, device=dev).scatter_(1, place, val)
    return Retrieved(idx[:, :k], scores[:, :k].to(first.scores.device))


def part_chain_seeds(part, tables: ChainTables, queries: EncodedQueries, ranking: Retrieved, source: torch.Tensor,
                     cfg: RetrievalConfig) -> ChainSeeds:
    """chain_seeds written once for one process and N: the seeds of the sources that ``part`` (round.Part, whose
    passages are ``tables``' rows) holds, gathered from every part, with global entity ids (in one process the
    gather is the identity and the ids are the index's)."""
    idx = ranking.indices.to(part.device)
    mine = source.to(part.device) & (idx >= part.lo) & (idx < part.lo + tables.num_passages)
    local = Retrieved(torch.where(mine, idx - part.lo, torch.full_like(idx, -1)), ranking.scores.to(part.device))
    seeds = chain_seeds(tables, queries, local, mine, cfg)
    part.comm.phase = "chain"
    rows = part.comm.all_gather_rows(torch.stack([seeds.question.double(),
                                                  part.rows.global_entities(seeds.entity).double(), seeds.weight], 1))
    return ChainSeeds.from_entries(rows[:, 0].long(), rows[:, 1].long(), rows[:, 2], part.num_entities)


def part_later_queries(part, tables: ChainTables, queries: EncodedQueries, seeds: ChainSeeds,
                       cfg: RetrievalConfig) -> EncodedQueries:
    """later_queries written once for one process and N: the seeds' vectors from where the part keeps them
    (round.Part.entity_vectors), eq. 7's prior from the seeds whose entities the part holds (its passages'
    sentences mention only those)."""
    q2 = second_round_queries(tables, queries, seeds, part.entity_vectors(seeds.entity))
    q2.prior = passage_prior(tables, queries, part.local_seeds(seeds), cfg)
    return q2


def later_queries(tables: ChainTables, queries: EncodedQueries, seeds: ChainSeeds, cfg: RetrievalConfig) -> EncodedQueries:
    """The questions of a later round: second_round_queries with passage_prior as eq. 7's prior."""
    q2 = second_round_queries(tables, queries, seeds)
    q2.prior = passage_prior(tables, queries, seeds, cfg)
    return q2
