"""Random Tri-Graphs with the shape of real ones, for tests and benchmarks (no NER, no encoder)."""
from __future__ import annotations

import torch

from .index import TriGraphIndex
from .queries import EncodedQueries
from .sparse import Csr


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
