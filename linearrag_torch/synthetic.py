"""Random Tri-Graphs with the shape of real ones, for tests and benchmarks (no NER, no encoder)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .index import TokenKeys, TriGraphIndex
from .queries import EncodedQueries
from .index.csr import Csr


def _unit(n: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, dim, generator=gen)
    return x / x.norm(dim=1, keepdim=True).clamp(min=1e-12)


def random_index(
    passages: int = 50,
    entities: int = 80,
    sentences_per_passage: float = 4.0,
    entities_per_sentence: float = 2.0,
    dim: int = 16,
    zipf: float = 1.0,
    seed: int = 0,
) -> TriGraphIndex:
    """A random index: each passage gets ~sentences_per_passage sentences, each sentence
    ~entities_per_sentence entities drawn with a Zipf-like frequency (exponent ``zipf``).

    C weights are counts normalised per passage; N is C's counts plus random extra occurrences in
    other passages (the lower-cased substring matches of the real index). Vectorised: builds a
    million passages in seconds.
    """
    gen = torch.Generator().manual_seed(seed)
    P, E = passages, entities
    n_sent = torch.poisson(torch.full((P,), sentences_per_passage - 1), generator=gen).long() + 1
    S = int(n_sent.sum())
    sent_passage = torch.repeat_interleave(torch.arange(P), n_sent)
    n_ent = torch.poisson(torch.full((S,), entities_per_sentence - 1), generator=gen).long() + 1
    weights = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** zipf
    ent = torch.multinomial(weights, int(n_ent.sum()), replacement=True, generator=gen)
    ent = ent[torch.randperm(ent.numel(), generator=gen)]  # frequent entities get random ids
    ent = torch.randperm(E, generator=gen)[ent]
    ent_sentence = torch.repeat_interleave(torch.arange(S), n_ent)
    ones = torch.ones(ent.numel())
    M = Csr.from_coo(ent_sentence, ent, ones, (S, E))
    M = M.with_values(torch.ones(M.nnz))  # a sentence mentioning an entity twice is still one edge
    counts = Csr.from_coo(sent_passage[ent_sentence], ent, ones, (P, E))  # mentions per passage
    C = counts.with_values(counts.val / counts.row_sums()[counts.row_index()])
    extra = max(1, counts.nnz // 4)
    er = torch.randint(0, P, (extra,), generator=gen)
    ec = torch.randint(0, E, (extra,), generator=gen)
    N = Csr.from_coo(torch.cat([counts.row_index(), er]), torch.cat([counts.col, ec]), torch.cat([counts.val, torch.ones(extra)]), (P, E))
    PS = Csr.from_coo(sent_passage, torch.arange(S), torch.ones(S), (P, S))
    used = torch.zeros(E, dtype=torch.bool)
    used[ent] = True
    return TriGraphIndex(
        passage_ids=list(range(P)),
        titles=[f"passage {i}" for i in range(P)],
        texts=[""] * P,
        sentences=[""] * S,
        entities=[f"entity {j}" for j in range(E)],
        passage_emb=_unit(P, dim, gen),
        sentence_emb=_unit(S, dim, gen),
        entity_emb=_unit(E, dim, gen),
        M=M,
        C=C,
        N=N,
        PS=PS,
    )


def random_queries(index: TriGraphIndex, batch: int = 8, entities_per_query: float = 2.0, seed: int = 1,
                   near: float = 0.7) -> EncodedQueries:
    """Questions whose entities are noisy copies of graph entities (so seeds are meaningful) and
    whose embedding leans toward a random passage; some questions get no entity at all."""
    gen = torch.Generator().manual_seed(seed)
    D = index.dim
    counts = torch.poisson(torch.full((batch,), entities_per_query), generator=gen).long()
    Q = int(counts.sum())
    owner = torch.repeat_interleave(torch.arange(batch), counts)
    picks = torch.randint(0, max(index.num_entities, 1), (Q,), generator=gen)
    ent = near * index.entity_emb[picks] + (1 - near) * _unit(Q, D, gen) if Q else torch.zeros(0, D)
    ent = ent / ent.norm(dim=1, keepdim=True).clamp(min=1e-12) if Q else ent
    target = torch.randint(0, index.num_passages, (batch,), generator=gen)
    q = near * index.passage_emb[target] + (1 - near) * _unit(batch, D, gen)
    q = q / q.norm(dim=1, keepdim=True)
    return EncodedQueries(q.float(), ent.float(), owner, [f"q{int(o)}" for o in owner])


@dataclass
class Mentions:
    """What NER would hand the index builder for a random corpus: the passage of every sentence, the
    (sentence, entity) mentions, and the extra (passage, entity) occurrences of the lower-cased
    substring count N beyond the NER mentions. Entity ids are 0 .. entities - 1, every one used."""

    passages: int
    sentences: int
    entities: int
    sent_passage: torch.Tensor  # [S] int64
    ent_sentence: torch.Tensor  # [mentions] int64, sorted
    ent: torch.Tensor  # [mentions] int64
    extra_passage: torch.Tensor  # [extra] int64
    extra_entity: torch.Tensor  # [extra] int64


def random_mentions(passages: int, vocabulary: int, sentences_per_passage: float = 4.0,
                    entities_per_sentence: float = 2.0, zipf: float = 1.0, extra_ratio: float = 0.25,
                    repeat: float = 0.0, seed: int = 0) -> Mentions:
    """Mentions of a random corpus with real-corpus statistics (see benchmarks/scaling.py, which
    measures them): sentences per passage and entities per sentence 1 + Poisson, entities drawn from a
    vocabulary of ``vocabulary`` names with Zipf exponent ``zipf``; names never drawn are not entities,
    the others are numbered in order of first mention (as the index builder does).
    With probability ``repeat`` a mention after the first of its passage names an entity mentioned earlier
    in the passage (real passages come back to their subject). N gets ``extra_ratio`` x mentions extra
    (passage, entity) pairs, uniformly at random."""
    gen = torch.Generator().manual_seed(seed)
    P = passages
    n_sent = torch.poisson(torch.full((P,), float(sentences_per_passage) - 1), generator=gen).long() + 1
    S = int(n_sent.sum())
    sent_passage = torch.repeat_interleave(torch.arange(P), n_sent)
    n_ent = torch.poisson(torch.full((S,), float(entities_per_sentence) - 1), generator=gen).long() + 1
    cdf = torch.cumsum(1.0 / torch.arange(1, vocabulary + 1, dtype=torch.float64) ** zipf, 0)
    draws = int(n_ent.sum())
    # inverse-CDF sampling (torch.multinomial takes at most 2^24 categories)
    ent = torch.searchsorted(cdf, torch.rand(draws, dtype=torch.float64, generator=gen) * cdf[-1], right=True)
    ent = ent.clamp_(max=vocabulary - 1)
    ent_sentence = torch.repeat_interleave(torch.arange(S), n_ent)
    if repeat > 0:  # mention i, the j-th of its passage, may name the entity of an earlier mention of it
        per_passage = torch.zeros(P, dtype=torch.int64).index_add_(0, sent_passage, n_ent)
        start = torch.repeat_interleave(torch.cumsum(per_passage, 0) - per_passage, per_passage)
        j = torch.arange(draws) - start
        again = (torch.rand(draws, generator=gen) < repeat) & (j > 0)
        earlier = start + (torch.rand(draws, generator=gen) * j).long()
        ent = torch.where(again, ent[earlier], ent)
    used, ent = torch.unique(ent, return_inverse=True)
    E = used.numel()
    # ids in order of first mention, as the index builder numbers them (it gives nearby passages
    # nearby entities, which the sparse products' memory access benefits from)
    first = torch.full((E,), draws, dtype=torch.int64).scatter_reduce_(0, ent, torch.arange(draws), "amin")
    rank = torch.empty(E, dtype=torch.int64)
    rank[torch.argsort(first)] = torch.arange(E)
    ent = rank[ent]
    extra = int(extra_ratio * draws)
    return Mentions(P, S, E, sent_passage, ent_sentence, ent,
                    torch.randint(0, P, (extra,), generator=gen), torch.randint(0, max(E, 1), (extra,), generator=gen))


def index_from_mentions(m: Mentions, passage_emb: torch.Tensor, sentence_emb: torch.Tensor,
                        entity_emb: torch.Tensor) -> TriGraphIndex:
    """The sparse structure of the Tri-Graph from mentions (the indexing work after NER and encoding):
    M (0/1), C (mention counts normalised per passage), N (C's counts + the extra occurrences), PS."""
    P, S, E = m.passages, m.sentences, m.entities
    ones = torch.ones(m.ent.numel())
    M = Csr.from_coo(m.ent_sentence, m.ent, ones, (S, E))
    M = M.with_values(torch.ones(M.nnz))  # a sentence mentioning an entity twice is still one edge
    counts = Csr.from_coo(m.sent_passage[m.ent_sentence], m.ent, ones, (P, E))  # mentions per passage
    C = counts.with_values(counts.val / counts.row_sums()[counts.row_index()])
    N = Csr.from_coo(torch.cat([counts.row_index(), m.extra_passage]), torch.cat([counts.col, m.extra_entity]),
                     torch.cat([counts.val, torch.ones(m.extra_passage.numel())]), (P, E))
    PS = Csr.from_coo(m.sent_passage, torch.arange(S), torch.ones(S), (P, S))
    # token keys as a built index has them (indexing/build.py): distinct per node, as distinct encoder tokens
    # give (random unit vectors never coincide); the engine then takes a chain seed's nearest entity to be
    # itself without a scan, as it does on a real index (chain.second_round_queries)
    keys = TokenKeys(torch.arange(P), torch.arange(S), torch.arange(E))
    return TriGraphIndex(
        passage_ids=list(range(P)), titles=[""] * P, texts=[""] * P, sentences=[""] * S, entities=[""] * E,
        passage_emb=passage_emb, sentence_emb=sentence_emb, entity_emb=entity_emb, M=M, C=C, N=N, PS=PS, keys=keys,
    )


def random_embeddings(rows: int, dim: int, seed: int = 0, chunk: int = 1 << 18,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, dim] random unit vectors (computed in float32, stored in ``dtype``), generated ``chunk`` rows at a
    time (little peak memory)."""
    out = torch.empty(rows, dim, dtype=dtype)
    i = 0
    for block in random_embedding_blocks(rows, dim, seed, chunk, dtype):
        out[i:i + block.shape[0]] = block
        i += block.shape[0]
    return out


def random_embedding_blocks(rows: int, dim: int, seed: int = 0, chunk: int = 1 << 18,
                            dtype: torch.dtype = torch.float32):
    """random_embeddings' rows, ``chunk`` at a time (a generator: the same values, never all in memory)."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, rows, chunk):
        x = torch.randn(min(chunk, rows - i), dim, generator=gen)
        yield (x / x.norm(dim=1, keepdim=True).clamp(min=1e-12)).to(dtype)


def write_index(folder, m: Mentions, dim: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                chunk: int = 1 << 18) -> TriGraphIndex:
    """index_from_mentions(m, ...) with random unit vectors (random_embeddings of seeds seed + 1, + 2, + 3 for the
    passages, sentences and entities, as benchmarks.common.synthetic_embeddings draws them) saved to ``folder``,
    the vectors written ``chunk`` rows at a time as they are drawn: the same files as building it in memory and
    saving it, without its vectors ever in memory (what a synthetic corpus of millions of passages needs). Returns
    the index with placeholder vectors (rows of zeros that take no memory): load the folder to query it."""
    from .index.storage import RowBlocks

    counts = (m.passages, m.sentences, m.entities)
    placeholders = [torch.zeros(1, dim, dtype=dtype).expand(n, dim) for n in counts]
    index = index_from_mentions(m, *placeholders)
    if dtype != torch.float32:
        import dataclasses

        name = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
        index.index_config = dataclasses.replace(index.index_config, embedding_dtype=name)
    vectors = {name: RowBlocks((n, dim), dtype, lambda n=n, i=i: random_embedding_blocks(n, dim, seed + i + 1, chunk, dtype))
               for i, (name, n) in enumerate(zip(("passage_emb", "sentence_emb", "entity_emb"), counts))}
    index.save(folder, vectors=vectors)
    return index
