"""Building the Tri-Graph index from passages (ALGORITHM.md section 2).

Stages: NER + sentence split (spaCy) -> node numbering -> M, PS, C, N -> embeddings.
Like the reference code, a sentence becomes a node only if it mentions at least one entity
(sentences without entities never take part in retrieval), and sentences are keyed by their text.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from .config import IndexConfig, RetrievalConfig
from .corpus import Passage
from .counting import count_occurrences
from .encoding import Encoder
from .index import TriGraphIndex
from .nlp import PassageAnalysis, analyse_passages, load_spacy
from .sparse import Csr


def passage_text(title: str, text: str) -> str:
    """The text that is analysed, embedded and searched (same as TriGraphIndex.passage_text)."""
    return f"{title}\n{text}" if title else text


def build_index(
    passages: Sequence[Passage],
    index_config: Optional[IndexConfig] = None,
    retrieval_config: Optional[RetrievalConfig] = None,
    device="cpu",
    progress: bool = True,
    nlp=None,
    encoder: Optional[Encoder] = None,
    timings: Optional[dict] = None,
) -> TriGraphIndex:
    """Build the index of ``passages`` on ``device``.

    ``nlp`` / ``encoder``: already loaded models to reuse (else loaded from ``index_config``).
    ``timings``: if given, receives the seconds spent per stage.
    """
    index_config = index_config or IndexConfig()
    retrieval_config = retrieval_config or RetrievalConfig()
    if not passages:
        raise ValueError("cannot build an index of zero passages")
    clock = _Clock(timings)
    texts = [passage_text(p.title, p.text) for p in passages]

    if nlp is None:
        nlp = load_spacy(index_config.spacy_model)
        clock.lap("load_spacy")
    analyses = analyse_passages(
        nlp, texts, index_config.dropped_labels, index_config.ner_batch_size, index_config.n_process, progress
    )
    clock.lap("ner")

    graph = _number_nodes(analyses)
    E, S = len(graph.entities), len(graph.sentences)
    M = Csr.from_rows(graph.sentence_rows, E)
    PS = Csr.from_rows(graph.passage_sentence_rows, S)
    C = contain_weights(texts, graph.passage_entity_rows, graph.entities)
    clock.lap("graph")
    N = lower_counts(texts, graph.entities)
    clock.lap("counts")

    if encoder is None:
        encoder = Encoder(index_config.encoder, device, index_config.max_length, index_config.batch_size)
        clock.lap("load_encoder")
    passage_emb = encoder.encode(texts, progress=progress, desc="embed passages")
    clock.lap("embed_passages")
    sentence_emb = encoder.encode(graph.sentences, progress=progress, desc="embed sentences")
    clock.lap("embed_sentences")
    entity_emb = encoder.encode(graph.entities, progress=progress, desc="embed entities")
    clock.lap("embed_entities")

    index = TriGraphIndex(
        passage_ids=[p.id for p in passages],
        titles=[p.title for p in passages],
        texts=[p.text for p in passages],
        sentences=graph.sentences,
        entities=graph.entities,
        passage_emb=passage_emb,
        sentence_emb=sentence_emb,
        entity_emb=entity_emb,
        M=M,
        C=C,
        N=N,
        PS=PS,
        index_config=index_config,
        retrieval_config=retrieval_config,
    )
    return index.to(device)


class _Graph:
    """Node strings (first-occurrence order) and the row lists of M, PS and C."""

    def __init__(self):
        self.entities: list[str] = []
        self.sentences: list[str] = []
        self.sentence_rows: list[list[int]] = []  # M: entity columns of each sentence
        self.passage_sentence_rows: list[list[int]] = []  # PS
        self.passage_entity_rows: list[list[int]] = []  # structure of C


def _number_nodes(analyses: Sequence[PassageAnalysis]) -> _Graph:
    g = _Graph()
    entity_id: dict[str, int] = {}
    sentence_id: dict[str, int] = {}
    sentence_ents: list[dict[int, None]] = []  # ordered sets: M row = union over the sentence's occurrences
    for a in analyses:
        g.passage_entity_rows.append([_intern(e, entity_id, g.entities) for e in a.entities])
        row: dict[int, None] = {}
        for sent, ents in zip(a.sentences, a.sentence_entities):
            if not ents:
                continue
            s = _intern(sent, sentence_id, g.sentences)
            if s == len(sentence_ents):
                sentence_ents.append({})
            for e in ents:
                sentence_ents[s].setdefault(entity_id[e])
            row.setdefault(s)
        g.passage_sentence_rows.append(list(row))
    g.sentence_rows = [list(r) for r in sentence_ents]
    return g


def _intern(key: str, ids: dict, names: list) -> int:
    i = ids.get(key)
    if i is None:
        i = ids[key] = len(names)
        names.append(key)
    return i


def contain_weights(texts: Sequence[str], passage_entity_rows: Sequence[list], entities: Sequence[str]) -> Csr:
    """C[p, e] = text_p.count(e) / sum over p's NER entities e' of text_p.count(e') (case-sensitive)."""
    values = []
    for text, row in zip(texts, passage_entity_rows):
        counts = [text.count(entities[e]) for e in row]
        total = sum(counts)
        values.append([c / total for c in counts] if total else [0.0] * len(row))
    return Csr.from_rows(passage_entity_rows, len(entities), values)


def lower_counts(texts: Sequence[str], entities: Sequence[str]) -> Csr:
    """N[p, e] = text_p.lower().count(e.lower()) over every passage and entity (eq. 7)."""
    rows, cols, counts = count_occurrences([e.lower() for e in entities], [t.lower() for t in texts])
    return Csr.from_coo(rows, cols, counts.to(torch.float32), (len(texts), len(entities)))


class _Clock:
    def __init__(self, timings: Optional[dict]):
        self.timings = timings
        self.t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[stage] = self.timings.get(stage, 0.0) + now - self.t
        self.t = now
