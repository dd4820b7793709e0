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
used as sources (see chain_retrieve).
"""
from __future__ import annotations

import torch

from ..config import RetrievalConfig
from ..kernels import segment_positions
from ..queries import EncodedQueries, PassagePrior, Retrieved


def enabled(cfg: RetrievalConfig) -> bool:
    """Whether a retrieval runs later rounds: chain_passages > 0 in reference mode. Paper mode answers in one
    round (its eq. 5 sums every path, and the extra seeds swamped it: docs/QUALITY.md)."""
    return cfg.chain_passages > 0 and cfg.mode == "reference"


def chain_seeds(index, queries: EncodedQueries, first: Retrieved, cfg: RetrievalConfig, skip=None) -> list[dict]:
    """Per question {entity: w(e)} from the round's top chain_passages passages (module docstring), passing
    over the passages in skip[b] (the sources of earlier rounds); the sources taken are added to skip[b]."""
    q = queries.query_emb.detach().to("cpu", torch.float32)
    PS, M = index.PS, index.M
    sent_emb = index.sentence_emb
    out = []
    idx, scores = first.indices.cpu(), first.scores.cpu().double()
    has_entities = set(queries.entity_owner.cpu().tolist())
    for b in range(q.shape[0]):
        seeds: dict = {}
        if b not in has_entities:  # answered by dense retrieval (METHOD.md): no chain either
            out.append(seeds)
            continue
        top = float(scores[b, 0]) if idx.shape[1] else 0.0
        used = skip[b] if skip is not None else set()
        sources = [int(p) for p in idx[b].tolist() if p >= 0 and int(p) not in used][: cfg.chain_passages]
        for p in sources:
            j = idx[b].tolist().index(p)
            used.add(p)
            if not top > 0:
                continue
            share = max(float(scores[b, j]) / top, 0.0)
            sents = PS.col[PS.crow[p]:PS.crow[p + 1]]
            if sents.numel() == 0:
                continue
            sigma = (sent_emb.index_select(0, sents).float() @ q[b]).double()
            # best first, ties to the lowest sentence index (sents is sorted); the title line names the
            # passage itself and links nowhere new: skipped
            title = index.titles[p].strip()
            order = sorted((i for i in range(sents.numel()) if index.sentences[int(sents[i])].strip() != title or not title),
                           key=lambda i: (-float(sigma[i]), int(sents[i])))
            for i in order[: cfg.chain_sentences]:
                s = int(sents[i])
                w = cfg.chain_weight * share * float(sigma[i])
                if not w > 0:
                    continue
                for e in M.col[M.crow[s]:M.crow[s + 1]].tolist():
                    if w > seeds.get(e, 0.0):
                        seeds[e] = w
        out.append(seeds)
    return out


def second_round_queries(index, queries: EncodedQueries, seeds: list[dict]) -> EncodedQueries:
    """The questions with their own entities plus the chain seeds (scaled own embeddings, see module doc)."""
    dev = queries.entity_emb.device
    emb = [queries.entity_emb]
    owner = [queries.entity_owner]
    text = list(queries.entity_text)
    E = index.entity_emb
    for b, sd in enumerate(seeds):
        if not sd:
            continue
        ents = sorted(sd)
        w = torch.tensor([sd[e] for e in ents], dtype=torch.float32)
        emb.append((E.index_select(0, torch.tensor(ents, dtype=torch.int64)).float() * w[:, None]).to(dev))
        owner.append(torch.full((len(ents),), b, dtype=torch.int64, device=queries.entity_owner.device))
        text.extend(index.entities[e] for e in ents)
    # stored-vector rows (EncodedQueries.entity_rows): the question entities' stay (pipeline.py); a chain seed
    # is its entity's own vector, so its nearest entity is itself unless another entity has its encoder
    # tokens (an equal vector up to rounding): those scan (-1), as do all of them without token keys
    unique = _tokens_unique(index)
    extra = [e if unique is not None and unique[e] else -1 for sd in seeds for e in sorted(sd)]
    if not extra or max(extra) < 0:
        rows = queries.entity_rows
        if rows is not None:
            rows = torch.cat([rows, torch.full((len(extra),), -1, dtype=rows.dtype, device=rows.device)])
        return EncodedQueries(queries.query_emb, torch.cat(emb), torch.cat(owner), text, rows, queries.rows_of)
    dev = queries.entity_owner.device
    own = queries.entity_rows if queries.entity_rows is not None and queries.rows_of is index else None
    own = own.to(dev) if own is not None else torch.full((queries.entity_owner.numel(),), -1, dtype=torch.int64, device=dev)
    rows = torch.cat([own, torch.tensor(extra, dtype=torch.int64, device=dev)])
    return EncodedQueries(queries.query_emb, torch.cat(emb), torch.cat(owner), text, rows, index)


def passage_prior(index, queries: EncodedQueries, seeds: list[dict], cfg: RetrievalConfig) -> PassagePrior | None:
    """Eq. 7's dense prior for a later round (module docstring): the floor cfg.chain_prior_floor, and with
    cfg.chain_bridge_prior, for each question b and passage p holding a sentence that mentions one of b's
    chain seeds (seeds[b], entity rows of ``index``; p's title line aside), the largest cosine of b with
    such a sentence. None when both are off (floor -1). ``index`` may be a shard's view (local rows)."""
    if cfg.chain_prior_floor <= -1.0 and not cfg.chain_bridge_prior:
        return None
    dev = queries.query_emb.device
    if cfg.chain_bridge_prior and any(seeds):
        # every question's (question, seed) pairs at once: the sentences mentioning a seed, each distinct
        # (question, sentence) pair's cosine, spread over the sentence's passages (title lines aside), and
        # the largest per (question, passage)
        q = queries.query_emb.detach().to("cpu", torch.float32)
        mt_crow, mt_col, sp_crow, sp_pas, sp_title = _bridge_tables(index)
        S, P = int(sp_crow.numel() - 1), len(index.titles)
        ents = torch.tensor([e for sd in seeds for e in sorted(sd)], dtype=torch.int64)
        qb = torch.tensor([b for b, sd in enumerate(seeds) for _ in sd], dtype=torch.int64)
        owner, pos, _ = segment_positions(mt_crow, ents)  # (seed, sentence) entries
        pairs = torch.unique(qb[owner] * S + mt_col[pos])  # b * S + s, sorted
        b, sent = pairs // S, pairs % S
        cos = _pair_cosines(index.sentence_emb, q, sent, b)
        owner, pos, _ = segment_positions(sp_crow, sent)  # (pair, passage) entries
        keep = ~sp_title[pos]  # a passage's own title line names it and links nowhere new (as in chain_seeds)
        at = owner[keep]
        keys, inv = torch.unique(b[at] * P + sp_pas[pos][keep], return_inverse=True)  # b * P + p, sorted
        best = torch.full((keys.numel(),), float("-inf")).scatter_reduce_(0, inv, cos[at], "amax")
        return PassagePrior(float(cfg.chain_prior_floor), (keys % P).to(dev), (keys // P).to(dev), best.to(dev))
    empty = torch.zeros(0, dtype=torch.int64, device=dev)
    return PassagePrior(float(cfg.chain_prior_floor), empty, empty, torch.zeros(0, dtype=torch.float32, device=dev))


def _pair_cosines(sentence_emb: torch.Tensor, q: torch.Tensor, sent: torch.Tensor, b: torch.Tensor,
                  questions: int = 32) -> torch.Tensor:
    """<sentence_emb[sent[i]], q[b[i]]> (float32) for pairs sorted by b: per block of ``questions`` questions, one
    product of their distinct sentences with them (a sentence that several questions reach is read once)."""
    out = torch.empty(sent.numel(), dtype=torch.float32)
    cuts = torch.searchsorted(b, torch.arange(0, q.shape[0] + questions, questions)).tolist()
    for blk, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        if hi > lo:
            u, inv = torch.unique(sent[lo:hi], return_inverse=True)
            first = blk * questions
            cos = sentence_emb.index_select(0, u).float() @ q[first:first + questions].T
            out[lo:hi] = cos[inv, b[lo:hi] - first]
    return out


_BRIDGE: list = [None, None]  # (the M.col, PS.col, sentences and titles objects, the tables) of the last index asked


def _bridge_tables(index):
    """(MT crow, MT col: entity -> sentences; SP crow, SP passages: sentence -> passages; SP title: whether
    each (sentence, passage) entry's sentence is that passage's title line), on the CPU, cached for the last
    index (by its M.col and PS.col tensors and its sentence and title lists: an index's matrices and strings are
    never changed in place)."""
    M, PS = index.M, index.PS
    key = (M.col, PS.col, index.sentences, index.titles)
    if _BRIDGE[0] is not None and all(a is b for a, b in zip(_BRIDGE[0], key)):
        return _BRIDGE[1]
    S, E = int(M.crow.numel() - 1), int(M.shape[1])

    def transpose(crow, col, n_cols):
        crow, col = crow.cpu().long(), col.cpu().long()
        r = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow[1:] - crow[:-1])
        order = torch.argsort(col * max(crow.numel() - 1, 1) + r)
        t_crow = torch.zeros(n_cols + 1, dtype=torch.int64)
        t_crow[1:] = torch.cumsum(torch.bincount(col, minlength=n_cols), 0)
        return t_crow, r[order]

    mt_crow, mt_col = transpose(M.crow, M.col, E)
    sp_crow, sp_pas = transpose(PS.crow, PS.col, S)
    titles, sentences = [t.strip() for t in index.titles], index.sentences
    owner = torch.repeat_interleave(torch.arange(S), sp_crow[1:] - sp_crow[:-1]).tolist()
    sp_title = torch.tensor([bool(titles[p]) and sentences[s].strip() == titles[p]
                             for s, p in zip(owner, sp_pas.tolist())], dtype=torch.bool)
    _BRIDGE[:] = [key, (mt_crow, mt_col, sp_crow, sp_pas, sp_title)]
    return _BRIDGE[1]


_UNIQUE: list = [None, None]  # (the token hashes, whether each entity's are unique) of the last index asked


def _tokens_unique(index):
    """[E] bool: the entity shares its encoder tokens (TokenKeys hash) with no other entity; None without keys."""
    keys = getattr(index, "keys", None)
    hashes = getattr(keys, "entities", None)
    if hashes is None or hashes.numel() != len(index.entities):
        return None
    if _UNIQUE[0] is not hashes:
        _, inv, counts = torch.unique(hashes, return_inverse=True, return_counts=True)
        _UNIQUE[:] = [hashes, (counts[inv] == 1).tolist()]
    return _UNIQUE[1]


def merge(first: Retrieved, second: Retrieved, keep: int, k: int) -> Retrieved:
    """The first round's top ``keep`` passages, then the second round's ranking without them; k per question.
    A passage's score is its second-round score where the second round lists it (so passages that tie there
    still tie), else its first-round score."""
    B = first.indices.shape[0]
    fi, fs = first.indices.cpu(), first.scores.cpu()
    si, ss = second.indices.cpu(), second.scores.cpu()
    k = min(k, max(fi.shape[1], si.shape[1]))
    idx = torch.full((B, k), -1, dtype=torch.int64)
    val = torch.zeros((B, k), dtype=torch.float32)
    for b in range(B):
        rows, vals = [], []
        later = {i: s for i, s in zip(si[b].tolist(), ss[b].tolist()) if i >= 0}
        for i, s in zip(fi[b, :keep].tolist(), fs[b, :keep].tolist()):
            if i >= 0 and i not in rows:
                rows.append(i)
                vals.append(later.get(i, s))
        for i, s in zip(si[b].tolist(), ss[b].tolist()):
            if len(rows) >= k:
                break
            if i >= 0 and i not in rows:
                rows.append(i)
                vals.append(s)
        idx[b, :len(rows)] = torch.tensor(rows, dtype=torch.int64)
        val[b, :len(vals)] = torch.tensor(vals, dtype=torch.float32)
    dev = first.indices.device
    return Retrieved(idx.to(dev), val.to(first.scores.device))


def chain_retrieve(run, index, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool = False):
    """``1 + chain_rounds`` rounds with ``run(queries, cfg, trace) -> Retrieved`` (either backend's one-round
    retrieve, called with chain_passages = 0). Round r + 1 is seeded by the question's entities and the
    chain seeds of rounds 2 .. r + 1 (each from the top passages of the round before, not yet used as
    sources); it runs with W_p = chain_passage_weight. The final list after round r + 1 is the list
    after round r cut to r * chain_keep passages, then round r + 1's ranking. With ``trace``, ``run``
    returns (Retrieved, trace) and so does this: the first round's trace (the question's own seeds and
    activation), with ``chain_seeds`` set to each question's [(entity name, w)] of the later rounds."""
    one = cfg.replace(chain_passages=0)
    later = one.replace(passage_node_weight=cfg.chain_passage_weight)
    depth = max(cfg.top_k, cfg.chain_passages * (cfg.chain_rounds + 1), cfg.chain_keep * (cfg.chain_rounds + 1))
    cur = run(queries, one.replace(top_k=depth), trace)
    cur, tr1 = cur if trace else (cur, None)
    out = cur
    skip = [set() for _ in range(queries.batch_size)]
    seeds = [dict() for _ in range(queries.batch_size)]
    tr = None
    for r in range(1, cfg.chain_rounds + 1):
        for acc, new in zip(seeds, chain_seeds(index, queries, cur, cfg, skip)):
            for e, w in new.items():
                acc[e] = max(acc.get(e, 0.0), w)
        q2 = second_round_queries(index, queries, seeds)
        q2.prior = passage_prior(index, queries, seeds, cfg)
        cur = run(q2, later.replace(top_k=depth), False)
        out = merge(out, cur, r * cfg.chain_keep, depth)
    out = out.head(cfg.top_k)
    if not trace:
        return out
    names = index.entities
    tr1.chain_seeds = [[(names[e], w) for e, w in sorted(sd.items(), key=lambda x: (-x[1], x[0]))] for sd in seeds]
    return out, tr1
