"""Building the Tri-Graph index from passages (docs/METHOD.md, "Updating an index": one numbering for build, add and delete).

Stages: NER + sentence split (spaCy) -> node numbering -> M, PS, C, N -> embeddings.
Like the reference code, a sentence becomes a node only if it mentions at least one entity
(sentences without entities never take part in retrieval), and sentences are keyed by their text.

A build is add_passages() to an empty index: the same code appends passages to an existing index
(only the new passages are analysed and encoded), and delete_passages() renumbers the remaining
passages from the stored NER record with the same numbering (_Numbering).

This module orchestrates and holds the graph's formulas (M, PS, C, N); the sparse operations are Csr
methods (index/csr.py), the vectors of new texts come from encoding.embed_texts, and any encoder with
encoding.TextEncoder's three members will do.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence

import torch

from .. import models
from ..config import IndexConfig, RetrievalConfig
from ..corpus import Passage, PassageId, check_new_ids
from ..index import NER_PARTS, NerRecord, TokenKeys, TriGraphIndex, embedding_dtype, passage_text
from ..runtime.tracing import stage
from ..index.csr import Csr
from .counting import count_occurrences
from ..models.encoding import TextEncoder, append_vectors, embed_texts, resolve_precision, token_hash
from ..models.nlp import analyse_passages, bind_title


def build_index(
    passages: Sequence[Passage],
    index_config: Optional[IndexConfig] = None,
    retrieval_config: Optional[RetrievalConfig] = None,
    device="cpu",
    progress: bool = True,
    nlp=None,
    encoder: Optional[TextEncoder] = None,
    timings: Optional[dict] = None,
    analyse: Optional[Callable] = None,
    *,
    ids_checked: bool = False,
    index_device=None,
) -> TriGraphIndex:
    """Build the index of ``passages`` on ``device``: add_passages() to an empty index.

    ``nlp`` / ``encoder``: already loaded models to reuse (else loaded from ``index_config``).
    ``analyse``: the NER stage, and ``ids_checked``, ``index_device``, as in add_passages.
    ``timings``: if given, receives the seconds spent per stage.
    """
    index_config = index_config or IndexConfig()
    retrieval_config = retrieval_config or RetrievalConfig()
    if not passages:
        raise ValueError("cannot build an index of zero passages")
    # the index stores the precision its vectors were made in (the given encoder's, else "auto" resolved
    # for ``device``), and questions are encoded in it (models.load_encoder)
    precision = getattr(encoder, "precision", None) or resolve_precision(index_config.encoder_precision, device)
    index_config = dataclasses.replace(index_config, encoder_precision=precision)
    return add_passages(empty_index(index_config, retrieval_config), passages, device=device, progress=progress,
                        nlp=nlp, encoder=encoder, timings=timings, analyse=analyse, ids_checked=ids_checked,
                        index_device=index_device)


def empty_index(index_config: Optional[IndexConfig] = None, retrieval_config: Optional[RetrievalConfig] = None,
                dim: int = 0) -> TriGraphIndex:
    """An index of zero passages (the start of every build)."""
    def none(rows, cols):
        return Csr(torch.zeros(rows + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                   torch.zeros(0, dtype=torch.float32), (rows, cols))

    emb = torch.zeros(0, dim, dtype=embedding_dtype(index_config or IndexConfig()))  # vectors added are cast to it
    return TriGraphIndex(
        passage_ids=[], titles=[], texts=[], sentences=[], entities=[],
        passage_emb=emb, sentence_emb=emb.clone(), entity_emb=emb.clone(),
        M=none(0, 0), C=none(0, 0), N=none(0, 0), PS=none(0, 0),
        index_config=index_config or IndexConfig(), retrieval_config=retrieval_config or RetrievalConfig(),
        ner=NerRecord(none(0, 0), none(0, 0), none(0, 0)),
        keys=TokenKeys(*(torch.zeros(0, dtype=torch.int64) for _ in range(3))),
    )


def add_passages(
    index: TriGraphIndex,
    passages: Sequence[Passage],
    device=None,
    progress: bool = True,
    nlp=None,
    encoder: Optional[TextEncoder] = None,
    timings: Optional[dict] = None,
    analyse: Optional[Callable] = None,
    *,
    ids_checked: bool = False,
    index_device=None,
) -> TriGraphIndex:
    """A new index: ``index`` with ``passages`` appended (``index`` itself is not changed).

    Only the new passages are split, tagged and encoded. Their new entities and sentences are appended
    in order of first occurrence and existing ones are reused by their string, so the result equals
    the build of all passages at once (see docs/METHOD.md, "Updating an index"). N gains the counts of
    every entity in the new passages and of the new entities in the old passages (one Aho-Corasick
    pass over the old texts). Ids must be new (7 and "7" are the same id): ValueError otherwise, unless
    ``ids_checked`` says the caller has checked them (corpus.read_passages, before loading any model).
    ``device``: where the encoder is loaded when not given, and where the result goes (default: where
    ``index`` is); ``index_device``, when given, where the result goes instead (LinearRAG.build: the CPU).
    ``analyse``: the NER stage, texts -> one nlp.PassageAnalysis per text (default: nlp.analyse_passages
    with ``nlp`` and the index's settings; ray_build runs it on a Ray cluster).
    """
    if not passages:
        raise ValueError("no passages to add")
    if not ids_checked:
        check_new_ids(passages, index.passage_ids)
    device = device if device is not None else index.passage_emb.device
    base = index.to("cpu")
    cfg = base.index_config
    texts = [passage_text(p.title, p.text) for p in passages]
    if analyse is None and nlp is None:
        with stage(timings, "load_spacy"):
            nlp = models.load_nlp(cfg)
    with stage(timings, "ner"):
        if analyse is None:
            analyses = analyse_passages(nlp, texts, cfg.dropped_labels, cfg.ner_batch_size, cfg.n_process, progress)
        else:
            analyses = list(analyse(texts))
        if getattr(cfg, "title_entities", False):
            analyses = [bind_title(a, p.title) for a, p in zip(analyses, passages)]

    with stage(timings, "graph"):
        g = _Numbering(base.entities, base.sentences)
        for a in analyses:
            g.add(a.entities, [(s, ents) for s, ents in zip(a.sentences, a.sentence_entities) if ents])
        M, PS, C, ner = _graph_matrices(base, g, texts)
    with stage(timings, "counts"):
        N = _grow_counts(base, texts, g.entities)

    if encoder is None:
        with stage(timings, "load_encoder"):
            encoder = models.load_encoder(cfg, device)
    old_keys = base.keys or TokenKeys(None, None, None)  # None: an index written without them
    old_texts = [base.passage_text(i) for i in range(base.num_passages)]
    one_pass = getattr(cfg, "sentence_vectors", "separate") == "passage"
    if one_pass and not hasattr(encoder, "encode_with_spans"):
        raise ValueError(f"IndexConfig.sentence_vectors='passage' needs an encoder with encode_with_spans "
                         f"(encoding.Encoder); {type(encoder).__name__} has none: use sentence_vectors='separate'")
    if one_pass:
        with stage(timings, "embed_passages"):  # the sentences' vectors come from the passages' pass
            passage_emb, passage_keys, sentence_emb, sentence_keys = _embed_one_pass(
                encoder, texts, analyses, g.sentences[base.num_sentences:], old_texts, base.sentences, old_keys,
                progress)
    else:
        with stage(timings, "embed_passages"):
            passage_emb, passage_keys = embed_texts(encoder, texts, old_texts, base.passage_emb, old_keys.passages,
                                                    progress, "embed passages")
        with stage(timings, "embed_sentences"):
            sentence_emb, sentence_keys = embed_texts(encoder, g.sentences[base.num_sentences:], base.sentences,
                                                      base.sentence_emb, old_keys.sentences, progress,
                                                      "embed sentences")
    with stage(timings, "embed_entities"):
        entity_emb, entity_keys = embed_texts(encoder, g.entities[base.num_entities:], base.entities,
                                              base.entity_emb, old_keys.entities, progress, "embed entities")

    out = TriGraphIndex(
        passage_ids=base.passage_ids + [p.id for p in passages],
        titles=base.titles + [p.title for p in passages],
        texts=base.texts + [p.text for p in passages],
        sentences=g.sentences,
        entities=g.entities,
        passage_emb=append_vectors(base.passage_emb, passage_emb),
        sentence_emb=append_vectors(base.sentence_emb, sentence_emb),
        entity_emb=append_vectors(base.entity_emb, entity_emb),
        M=M,
        C=C,
        N=N,
        PS=PS,
        index_config=base.index_config,
        retrieval_config=base.retrieval_config,
        ner=ner,
        keys=TokenKeys(passage_keys, sentence_keys, entity_keys),
    )
    return out.to(device if index_device is None else index_device)


def sentence_spans(texts: Sequence[str], analyses: Sequence, wanted: Sequence[str]) -> list[tuple[int, int, int]]:
    """Where each of the ``wanted`` sentences first occurs: (passage row, first character, end character) in
    ``texts`` (IndexConfig.sentence_vectors "passage"). A passage's sentences are stripped pieces of its text in
    text order (nlp.PassageAnalysis), found in turn from where the previous one ended.

    Parameters
    ----------
    texts : sequence of str
        The analysed passage texts.
    analyses : sequence of nlp.PassageAnalysis
        One per text.
    wanted : sequence of str
        Sentence strings, each a sentence of some passage.

    Returns
    -------
    list of (int, int, int)
        One span per wanted sentence, in its order. ValueError when a sentence is not found in order in its
        passage's text, or a wanted sentence in none.
    """
    need = {s: None for s in wanted}
    todo = len(need)
    for row, (text, a) in enumerate(zip(texts, analyses)):
        cursor = 0
        for sent in a.sentences:
            pos = text.find(sent, cursor)
            if pos < 0:
                raise ValueError(f"passage {row}: sentence {sent[:60]!r} is not in its text after character {cursor}")
            cursor = pos + len(sent)
            if sent in need and need[sent] is None:
                need[sent] = (row, pos, cursor)
                todo -= 1
        if not todo:
            break
    missing = [s for s, v in need.items() if v is None]
    if missing:
        raise ValueError(f"sentence {missing[0][:60]!r} is in no passage")
    return [need[s] for s in wanted]


def _embed_one_pass(encoder, texts, analyses, new_sentences, old_texts, old_sentences, old_keys, progress):
    """(passage vectors, passage token hashes, sentence vectors, sentence token hashes) of new passages and
    sentences, every passage encoded once (Encoder.encode_with_spans) and its new sentences' vectors taken from
    that pass; the hashes as embed_texts gives them (old + new)."""
    def hashes(strings):
        return torch.tensor([token_hash(k) for k in encoder.token_keys(list(strings))], dtype=torch.int64)

    spans = sentence_spans(texts, analyses, new_sentences)
    passage_emb, sentence_emb = encoder.encode_with_spans(texts, spans, progress=progress, desc="embed passages")
    old_p = old_keys.passages if old_keys.passages is not None else hashes(old_texts)
    old_s = old_keys.sentences if old_keys.sentences is not None else hashes(old_sentences)
    return (passage_emb.float().cpu(), torch.cat([old_p.to(torch.int64).cpu(), hashes(texts)]),
            sentence_emb.float().cpu(), torch.cat([old_s.to(torch.int64).cpu(), hashes(new_sentences)]))


def delete_passages(index: TriGraphIndex, ids: Iterable[PassageId]) -> TriGraphIndex:
    """A new index without the passages of ``ids`` (7 and "7" are the same id), and without the
    sentences and entities no remaining passage has; ``index`` itself is not changed.

    The remaining passages are renumbered from the stored NER record by the same numbering as a build,
    so the result equals the build of the remaining passages, up to the embeddings (kept, not
    recomputed: a fresh build would batch them differently, ~1e-7). An index without a NER record
    (written before it existed) is renumbered from M, C and PS instead, which can differ from a fresh
    build in node order and in M rows (docs/METHOD.md, "Updating an index").
    ValueError for an unknown id or when no passage would remain.
    """
    position = {str(pid): p for p, pid in enumerate(index.passage_ids)}
    drop: set = set()
    unknown = []
    for pid in ids:
        p = position.get(str(pid))
        if p is None:
            unknown.append(pid)
        else:
            drop.add(p)
    if unknown:
        shown = ", ".join(repr(x) for x in unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        raise ValueError(f"no passage with id {shown} in the index")
    keep = [p for p in range(index.num_passages) if p not in drop]
    if not keep:
        raise ValueError("deleting these passages would leave the index empty")
    device = index.passage_emb.device
    base = index.to("cpu")
    record = base.ner if base.ner is not None else _record_from_matrices(base)
    ents, sents, ments = (getattr(record, part).row_lists() for part in NER_PARTS)
    g = _Numbering()
    for p in keep:
        start = int(record.sentences.crow[p])
        g.add([base.entities[e] for e in ents[p]],
              [(base.sentences[s], [base.entities[e] for e in ments[start + k]]) for k, s in enumerate(sents[p])])
    texts = [base.passage_text(p) for p in keep]
    M, PS, C, ner = _graph_matrices(None, g, texts)
    old_entity = {e: i for i, e in enumerate(base.entities)}
    old_sentence = {s: i for i, s in enumerate(base.sentences)}
    entity_rows = torch.tensor([old_entity[e] for e in g.entities], dtype=torch.int64)
    sentence_rows = torch.tensor([old_sentence[s] for s in g.sentences], dtype=torch.int64)
    passage_rows = torch.tensor(keep, dtype=torch.int64)
    out = TriGraphIndex(
        passage_ids=[base.passage_ids[p] for p in keep],
        titles=[base.titles[p] for p in keep],
        texts=[base.texts[p] for p in keep],
        sentences=g.sentences,
        entities=g.entities,
        passage_emb=base.passage_emb.index_select(0, passage_rows),
        sentence_emb=base.sentence_emb.index_select(0, sentence_rows),
        entity_emb=base.entity_emb.index_select(0, entity_rows),
        M=M,
        C=C,
        N=base.N.submatrix(passage_rows, entity_rows),
        PS=PS,
        index_config=base.index_config,
        retrieval_config=base.retrieval_config,
        ner=ner if base.ner is not None else None,
        keys=None if base.keys is None else TokenKeys(base.keys.passages[passage_rows], base.keys.sentences[sentence_rows],
                                                      base.keys.entities[entity_rows]),
    )
    return out.to(device)


class _Numbering:
    """Node numbering, the one code path of build, add and delete: passages are fed in order, each as
    its NER output (distinct entities in order of first mention; the sentences that mention an entity,
    in text order, each with its entities). Entities and sentences (keyed by their text) get the next
    free number at their first occurrence, continuing the numbering of the nodes given at the start."""

    def __init__(self, entities: Sequence[str] = (), sentences: Sequence[str] = ()):
        self.entities = list(entities)
        self.sentences = list(sentences)
        self.entity_id = {e: i for i, e in enumerate(self.entities)}
        self.sentence_id = {s: i for i, s in enumerate(self.sentences)}
        self.entity_rows: list[list[int]] = []  # per passage: its entities in order of first mention
        self.sentence_rows: list[list[int]] = []  # per passage: the sentence of each occurrence, in text order
        self.mention_rows: list[list[int]] = []  # per occurrence: its entities in order of first mention

    def add(self, entities: Sequence[str], occurrences: Sequence[tuple]) -> None:
        self.entity_rows.append([_intern(e, self.entity_id, self.entities) for e in entities])
        row = []
        for sentence, ents in occurrences:
            row.append(_intern(sentence, self.sentence_id, self.sentences))
            self.mention_rows.append([self.entity_id[e] for e in ents])
        self.sentence_rows.append(row)


def _intern(key: str, ids: dict, names: list) -> int:
    i = ids.get(key)
    if i is None:
        i = ids[key] = len(names)
        names.append(key)
    return i


def _graph_matrices(base: Optional[TriGraphIndex], g: _Numbering, texts: Sequence[str]):
    """M, PS, C and the NER record of ``base``'s passages (None: no passages) followed by ``g``'s.

    M[s, e] = 1 when some occurrence of sentence s has entity e (an existing sentence's row can grow);
    PS[p, s] = 1 when p has an occurrence of s; C rows of the new passages from contain_weights().
    The record is None when ``base`` has passages but no record.
    """
    P0 = base.num_passages if base is not None else 0
    S, E = len(g.sentences), len(g.entities)
    occ_sentence = [s for row in g.sentence_rows for s in row]
    m_rows = [s for s, ents in zip(occ_sentence, g.mention_rows) for _ in ents]
    m_cols = [e for ents in g.mention_rows for e in ents]
    ps_rows = [P0 + p for p, row in enumerate(g.sentence_rows) for _ in row]
    ps_cols = occ_sentence
    M = Csr.ones(m_rows, m_cols, (S, E), base.M if base is not None else None)
    PS = Csr.ones(ps_rows, ps_cols, (P0 + len(texts), S), base.PS if base is not None else None)
    C = contain_weights(texts, g.entity_rows, g.entities)
    ner = NerRecord(Csr.ragged(g.entity_rows, E), Csr.ragged(g.sentence_rows, S), Csr.ragged(g.mention_rows, E))
    if base is not None:
        C = base.C.vstack(C)
        ner = None if base.ner is None else NerRecord(*(
            getattr(base.ner, part).vstack(getattr(ner, part)) for part in NER_PARTS
        ))
    return M, PS, C, ner


def _grow_counts(base: TriGraphIndex, new_texts: Sequence[str], entities: Sequence[str]) -> Csr:
    """N of base's passages + the new ones over ``entities`` (base's, then the new ones)."""
    P0, E0 = base.num_passages, base.num_entities
    lowered = [e.lower() for e in entities]
    r, c, v = [base.N.row_index()], [base.N.col], [base.N.val]
    if P0 and len(entities) > E0:  # the new entities in the old passages
        rows, cols, counts = count_occurrences(lowered[E0:], [base.passage_text(i).lower() for i in range(P0)])
        r.append(rows), c.append(cols + E0), v.append(counts.to(torch.float32))
    rows, cols, counts = count_occurrences(lowered, [t.lower() for t in new_texts])  # every entity in the new passages
    r.append(rows + P0), c.append(cols), v.append(counts.to(torch.float32))
    return Csr.from_coo(torch.cat(r), torch.cat(c), torch.cat(v), (P0 + len(new_texts), len(entities)))


def _record_from_matrices(ix: TriGraphIndex) -> NerRecord:
    """A stand-in NER record for an index written without one: node order in place of mention order,
    one occurrence per PS entry, and as its entities the sentence's M row restricted to the passage's C row."""
    c_rows, m_rows, ps_rows = ix.C.row_lists(), ix.M.row_lists(), ix.PS.row_lists()
    mentions = []
    for p, row in enumerate(ps_rows):
        have = set(c_rows[p])
        mentions += [[e for e in m_rows[s] if e in have] for s in row]
    return NerRecord(Csr.ragged(c_rows, ix.num_entities), Csr.ragged(ps_rows, ix.num_sentences),
                     Csr.ragged(mentions, ix.num_entities))


def contain_weights(texts: Sequence[str], passage_entity_rows: Sequence[list], entities: Sequence[str]) -> Csr:
    """C[p, e] = text_p.count(e) / sum over p's NER entities e' of text_p.count(e') (case-sensitive)."""
    values = []
    for text, row in zip(texts, passage_entity_rows):
        counts = [text.count(entities[e]) for e in row]
        total = sum(counts)
        values.append([c / total for c in counts] if total else [0.0] * len(row))
    return Csr.from_rows(passage_entity_rows, len(entities), values)
