"""What LinearRAG.explain and the sharded engine's explain (distributed/launch.py) return per question, built once
from a traced batch (engine.Trace): the hits plus how they were reached."""
from __future__ import annotations

from typing import Callable

import torch


def explanations(questions: list, queries, hits: list, tr, names, passage_entities: Callable[[int], set],
                 passage_id: Callable[[int], object]) -> list[dict]:
    """Per question: its entities, seeds, the first round's activated entities (tier >= 2: reached by semantic
    bridging) found in each hit passage, the later rounds' chain seeds, the ranks before the pair rerank, the
    rerank detail and the round that found each hit (LinearRAG.explain lists the fields).

    ``queries``: the batch's EncodedQueries; ``hits``: per question its api.Hit list; ``tr``: the batch's Trace;
    ``names``: entity names by index; ``passage_entities(row)``: the entity ids a hit passage contains (C's row);
    ``passage_id(row)``: a reranked passage's id."""
    tier = tr.activation.tier.cpu()
    act = tr.activation.act.cpu()
    seeds = tr.seeds.cpu()
    owner = queries.entity_owner.cpu().tolist()
    result = []
    for b, q in enumerate(questions):
        ents = {h.row: passage_entities(h.row) for h in hits[b]}
        active = torch.nonzero(tier[:, b] > 0).flatten().tolist()
        chain_seeds = tr.chain_seeds[b] if getattr(tr, "chain_seeds", None) is not None else []
        result.append({
            "question": q,
            "dense_fallback": bool(tr.dense[b]),
            "question_entities": [t for t, o in zip(queries.entity_text, owner) if o == b],
            "seeds": [(names[e], float(seeds[e, b])) for e in torch.nonzero(tr.is_seed[:, b].cpu()).flatten().tolist()],
            # the later rounds' extra seeds (chain.py; [] with one round)
            "chain_seeds": chain_seeds,
            # (i, j): the first two hits were ranked i and j before the pair rerank (pairs.py)
            "pair_ranks": tr.pair_ranks[b] if getattr(tr, "pair_ranks", None) is not None else None,
            # with rerank: per reranked hit its fused score, the reranker's logit, the graph's score and rank
            "rerank": rerank_rows(tr.rerank, b, passage_id, len(hits[b])) if tr.rerank is not None else None,
            # per hit: the graph round that found it, and its rank and score in that round's own list
            "found": round_rows(tr.rounds, b, hits[b]) if tr.rounds else None,
            "hits": [(h, [(names[e], int(tier[e, b]), float(act[e, b])) for e in active if e in ents[h.row]])
                     for h in hits[b]],
            # per hit: the later rounds' seeds it contains (the entities that bridged to it from the first
            # round's top passages; [] for every hit with one round)
            "bridges": [bridges(chain_seeds, {names[e] for e in ents[h.row]}) for h in hits[b]],
        })
    return result


def bridges(chain_seeds: list, passage_names: set) -> list:
    """The chain seeds [(entity, seed score)] whose entity a passage contains (``passage_names``), in order."""
    return [(name, w) for name, w in chain_seeds if name in passage_names]


def rerank_rows(rr, b: int, passage_id: Callable[[int], object], n: int) -> list[dict]:
    """explain's per-hit rerank detail of question ``b`` (its first ``n`` hits that were reranked)."""
    cols = [t[b].tolist() for t in (rr.indices, rr.scores, rr.logits, rr.graph_scores, rr.graph_ranks)]
    return [{"id": passage_id(i), "fused_score": s, "reranker_logit": lg, "graph_score": g, "graph_rank": r + 1}
            for i, s, lg, g, r in list(zip(*cols))[:n] if i >= 0]


def round_rows(rounds: list, b: int, hits: list) -> list[dict]:
    """explain's per-hit origin for question ``b``: the first graph round that listed the hit (1 = the question's
    own round), and its rank (1-based) and score there (after that round's loop rerank, if any)."""
    first: dict = {}
    for r, out in enumerate(rounds, 1):
        for rank, (i, s) in enumerate(zip(out.indices[b].tolist(), out.scores[b].tolist()), 1):
            if i >= 0 and i not in first:
                first[i] = {"round": r, "round_rank": rank, "round_score": s}
    return [{"id": h.id, **first.get(h.row, {"round": None, "round_rank": None, "round_score": None})} for h in hits]


def named_rows(tr, hits: list) -> set:
    """The passage rows explanations() names by id: the hits and the reranked candidates it lists."""
    rows = {h.row for hs in hits for h in hs}
    if tr.rerank is not None:
        rows |= {i for b, hs in enumerate(hits) for i in tr.rerank.indices[b, :len(hs)].tolist() if i >= 0}
    return rows
