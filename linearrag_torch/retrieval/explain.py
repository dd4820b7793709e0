"""What LinearRAG.explain and the sharded engine's explain (distributed/launch.py) return per question, built once
from a traced batch (engine.Trace): the hits plus how they were reached."""
from __future__ import annotations

from typing import Callable

import torch


def explanations(questions: list, queries, hits: list, tr, names, passage_entities: Callable[[int], set],
                 passage_id: Callable[[int], object], paths: "Paths | None" = None) -> list[dict]:
    """Per question: its entities, seeds, the first round's activated entities (tier >= 2: reached by semantic
    bridging) found in each hit passage, the later rounds' chain seeds, the ranks before the pair rerank, the
    rerank detail and the round that found each hit (LinearRAG.explain lists the fields).

    ``queries``: the batch's EncodedQueries; ``hits``: per question its api.Hit list; ``tr``: the batch's Trace;
    ``names``: entity names by index; ``passage_entities(row)``: the entity ids a hit passage contains (C's row);
    ``passage_id(row)``: a reranked passage's id; ``paths``: a Paths over the index, for each hit's drawn paths
    ("paths"; absent without it: the sharded engine holds no whole index to read sentences from)."""
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
        if paths is not None:
            sources = [out.indices[b, :paths.chain_passages].tolist() for out in tr.rounds[:-1]] if tr.rounds else []
            shares = [_shares(out, b, paths.chain_passages) for out in tr.rounds[:-1]] if tr.rounds else []
            is_seed = tr.is_seed[:, b].cpu()
            result[-1]["paths"] = [paths.of(b, h.row, tier[:, b], act[:, b], is_seed, seeds[:, b], ents[h.row],
                                            result[-1]["bridges"][i], sources, shares)
                                   for i, h in enumerate(hits[b])]
    return result


def _shares(out, b: int, k: int) -> list:
    """A round's first ``k`` passages' scores as shares of its top one (chain.chain_seeds' share)."""
    scores = out.scores[b, :k].tolist()
    top = scores[0] if scores else 0.0
    return [max(s / top, 0.0) if top > 0 else 0.0 for s in scores]


class Paths:
    """How each hit was reached, as paths the server's page draws (serve/page/): question -> seed entity ->
    sentence -> entity -> passage, each node with the number the engine computed for it.

    Stage 1 keeps, per entity, its tier and score, not the sentence that activated it; the path is rebuilt from
    them: an entity of tier t + 1 is joined to a seed or an entity of a lower tier (the entities active when it
    was reached; in reference mode a seed reached again takes a later tier) and the sentence holding both that give
    the largest candidate score (the entity's score x the sentence's sigma, eqs. 4-5), in turn back to a seed. A chain seed
    (a later round's seed, chain.py) is joined to the sentence of the earlier round's source passages that names it
    with the largest share x sigma (what gave its weight), and that sentence to the question's seeds it names.

    ``index``: the GraphIndex; ``query_emb`` [B, D]: the questions' vectors (sigma = the cosine of a sentence with
    the question); ``chain_passages``: the source passages per round (RetrievalConfig.chain_passages)."""

    def __init__(self, index, query_emb: torch.Tensor, chain_passages: int):
        self.index, self.chain_passages = index, chain_passages
        self.query_emb = query_emb.detach().to("cpu", torch.float32)
        self._mt = None
        self._sigma: dict = {}

    def passage_entities(self, row: int) -> set:
        """The entity ids passage ``row`` contains (C's row)."""
        C = self.index.C
        return set(C.col[C.crow[row]:C.crow[row + 1]].tolist())

    def _entity_sentences(self, e: int) -> list:
        if self._mt is None:
            self._mt = self.index.M.transpose()
        mt = self._mt
        return mt.col[mt.crow[e]:mt.crow[e + 1]].tolist()

    def _sentence_entities(self, s: int) -> set:
        M = self.index.M
        return set(M.col[M.crow[s]:M.crow[s + 1]].tolist())

    def _passage_sentences(self, p: int) -> list:
        PS = self.index.PS
        return PS.col[PS.crow[p]:PS.crow[p + 1]].tolist()

    def sigma(self, s: int, b: int) -> float:
        """Eq. 4: the cosine of sentence ``s`` with question ``b`` (the vectors are unit length)."""
        got = self._sigma.get((s, b))
        if got is None:
            got = self._sigma[(s, b)] = float(self.index.sentence_emb[s].float() @ self.query_emb[b])
        return got

    def _sentence(self, s: int, b: int) -> dict:
        return {"kind": "sentence", "text": self.index.sentences[s], "sigma": self.sigma(s, b)}

    def _entity(self, e: int, t: int, a: float) -> dict:
        return {"kind": "entity", "name": self.index.entities[e], "tier": t, "activation": a}

    def _back_to_seed(self, e: int, b: int, tier, act, is_seed, seeds, depth: int = 8) -> list:
        """The nodes from a seed to entity ``e`` (itself last): the parent (a seed, or of a lower tier) and the
        sentence holding both of largest act(parent) x sigma, in turn."""
        t = int(tier[e])
        if bool(is_seed[e]):
            return [{"kind": "seed", "name": self.index.entities[e], "score": float(seeds[e]),
                     "activation": float(act[e])}]
        best = None
        for s in self._entity_sentences(e) if depth else ():
            for f in self._sentence_entities(s):
                if f != e and (bool(is_seed[f]) or 0 < int(tier[f]) < t):
                    cand = float(act[f]) * self.sigma(s, b)
                    if best is None or cand > best[0]:
                        best = (cand, f, s)
        if best is None:  # (not reached from the tier below: nothing to draw before it)
            return [self._entity(e, t, float(act[e]))]
        _, f, s = best
        return self._back_to_seed(f, b, tier, act, is_seed, seeds, depth - 1) + [self._sentence(s, b),
                                                                         self._entity(e, t, float(act[e]))]

    def of(self, b: int, row: int, tier, act, is_seed, seeds, entities: set, bridges: list, sources: list,
           shares: list) -> list[dict]:
        """The paths to hit passage ``row`` of question ``b``: one per entity of the passage that the first round
        activated (``tier``, ``act``, ``is_seed``, ``seeds``: question b's columns), then one per chain seed it holds
        (``bridges`` [(name, weight)]; ``sources``, ``shares``: per earlier round its source passages' rows and
        shares). Each path is {"via": "activation" | "chain", "nodes": [...]}, a node {"kind": "seed", "name",
        "score"} (the seed's cosine with a question entity; "activation" too when the passage holds it), {"kind": "sentence", "text", "sigma"} (and "passage",
        the title of a chain source), {"kind": "entity", "name", "tier", "activation"} or, for a chain seed,
        {"kind": "entity", "name", "weight"}."""
        out = []
        for e in sorted((e for e in entities if int(tier[e]) > 0 or bool(is_seed[e])), key=lambda e: -float(act[e])):
            nodes = self._back_to_seed(e, b, tier, act, is_seed, seeds)
            out.append({"via": "activation", "nodes": nodes})
        ids = {name: i for i, name in enumerate(self.index.entities)} if bridges else {}
        for name, w in bridges:
            e = ids.get(name)
            best = None
            for rows, share in zip(sources, shares):
                for p, sh in zip(rows, share):
                    if p < 0:
                        continue
                    title = self.index.titles[p].strip()
                    for s in self._passage_sentences(p):
                        if self.index.sentences[s].strip() == title or e not in self._sentence_entities(s):
                            continue  # a title line is never a chain sentence (chain.ChainTables.ps_title)
                        cand = sh * self.sigma(s, b)
                        if best is None or cand > best[0]:
                            best = (cand, p, s)
            nodes = [{"kind": "entity", "name": name, "weight": w}]
            if best is not None:
                _, p, s = best
                sentence = {**self._sentence(s, b), "passage": self.index.titles[p]}
                named = [f for f in self._sentence_entities(s) if bool(is_seed[f])]
                lead = [{"kind": "seed", "name": self.index.entities[f], "score": float(seeds[f])}
                        for f in sorted(named, key=lambda f: -float(seeds[f]))[:1]]
                nodes = lead + [sentence] + nodes
            out.append({"via": "chain", "nodes": nodes})
        return out


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
