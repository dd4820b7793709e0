"""The Python API: build or load an index, then answer batches of questions.

    rag = LinearRAG.build("corpus.jsonl")          # or LinearRAG.load("my_index")
    rag.save("my_index")
    for hits in rag.search(["Who directed X?", "Where was Y born?"], top_k=5):
        print([(h.id, h.title, round(h.score, 4)) for h in hits])
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import engine, reference
from .config import IndexConfig, RetrievalConfig
from .corpus import Passage, check_question, read_corpus
from .index import TriGraphIndex
from .queries import EncodedQueries, Retrieved

BACKENDS = ("torch", "scipy")


class Hit(NamedTuple):
    id: object  # the corpus id
    score: float
    title: str
    text: str
    row: int  # position in the index


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> CUDA when present, else CPU; anything else is passed to torch.device."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device (use --device cpu or auto)")
    return dev


class LinearRAG:
    """A Tri-Graph index on a device, with the spaCy and encoder models that made it."""

    def __init__(self, index: TriGraphIndex, device="auto", nlp=None, encoder=None):
        self.device = resolve_device(device)
        self.index = index
        self.config = index.retrieval_config
        self._nlp = nlp
        self._encoder = encoder
        self._graph = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, corpus, index_config: IndexConfig | None = None, config: RetrievalConfig | None = None,
              device="auto", progress: bool = True, nlp=None, encoder=None) -> "LinearRAG":
        """Index ``corpus``: a JSONL path, or a list of Passage / dicts with "text" (and "id", "title")."""
        from .build import build_index

        dev = resolve_device(device)
        passages = read_corpus(corpus) if isinstance(corpus, (str, bytes)) or hasattr(corpus, "__fspath__") else [
            p if isinstance(p, Passage) else Passage(p.get("id", i), p.get("title", "") or "", p["text"])
            for i, p in enumerate(corpus)
        ]
        index_config = index_config or IndexConfig()
        nlp = nlp or _load_nlp(index_config)
        encoder = encoder or _load_encoder(index_config, dev)
        index = build_index(passages, index_config, config or RetrievalConfig(), device=str(dev),
                            progress=progress, nlp=nlp, encoder=encoder)
        return cls(index, dev, nlp, encoder)

    @classmethod
    def load(cls, path, device="auto") -> "LinearRAG":
        """Load an index folder written by save()."""
        return cls(TriGraphIndex.load(path, device="cpu"), device)

    def save(self, path):
        """Write the index atomically to folder ``path`` (config included)."""
        self.index.retrieval_config = self.config
        return self.index.save(path)

    # ------------------------------------------------------------------ models
    @property
    def nlp(self):
        if self._nlp is None:
            self._nlp = _load_nlp(self.index.index_config)
        return self._nlp

    @property
    def encoder(self):
        if self._encoder is None:
            self._encoder = _load_encoder(self.index.index_config, self.device)
        return self._encoder

    @property
    def graph(self) -> engine.DeviceGraph:
        if self._graph is None:
            self._graph = engine.DeviceGraph(self.index, self.device)
        return self._graph

    # ------------------------------------------------------------------ querying
    def encode_queries(self, questions: list[str]) -> EncodedQueries:
        """Question NER (entities lower-cased) and encoding: the input of both backends."""
        from .nlp import question_entities

        for q in questions:
            check_question(q)
        cfg = self.index.index_config
        ents = question_entities(self.nlp, questions, cfg.dropped_labels)
        enc = self.encoder
        flat = [e for es in ents for e in es]
        owner = torch.tensor([i for i, es in enumerate(ents) for _ in es], dtype=torch.int64)
        q_emb = enc.encode(list(questions))
        e_emb = enc.encode(flat) if flat else torch.zeros(0, q_emb.shape[1], device=q_emb.device)
        if e_emb.shape[1] != self.index.dim:
            raise ValueError(f"encoder {cfg.encoder!r} gives {e_emb.shape[1]}-d vectors, the index holds {self.index.dim}-d")
        return EncodedQueries(q_emb.float(), e_emb.float(), owner.to(q_emb.device), flat)

    def retrieve(self, queries: EncodedQueries, config: RetrievalConfig | None = None, backend: str = "torch") -> Retrieved:
        """Rank passages for encoded questions with the torch engine or the scipy reference."""
        cfg = config or self.config
        if backend == "torch":
            return engine.retrieve(self.graph, queries, cfg)
        if backend == "scipy":
            return reference.retrieve(self.index, queries.to("cpu"), cfg)
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def search(self, questions, top_k: int | None = None, backend: str = "torch", **overrides) -> list[list[Hit]]:
        """Top-k passages for each question (a string or a list of strings), best first.

        ``overrides`` change retrieval settings for this call (e.g. mode="paper", delta=0.3).
        """
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        cfg = self.config.replace(top_k=top_k, **overrides)
        out = self.retrieve(self.encode_queries(qs), cfg, backend)
        hits = self.hits(out)
        return hits[0] if single else hits

    def hits(self, out: Retrieved) -> list[list[Hit]]:
        idx, scores = out.indices.cpu().tolist(), out.scores.cpu().tolist()
        ix = self.index
        return [
            [Hit(ix.passage_ids[i], float(s), ix.titles[i], ix.texts[i], i) for i, s in zip(row, srow) if i >= 0]
            for row, srow in zip(idx, scores)
        ]

    def explain(self, questions: list[str], top_k: int | None = None, **overrides) -> list[dict]:
        """Hits plus how they were reached: question entities, seeds, and the activated entities
        (tier >= 2: reached by semantic bridging) found in each hit passage."""
        cfg = self.config.replace(top_k=top_k, **overrides)
        enc = self.encode_queries(list(questions))
        out, tr = engine.retrieve(self.graph, enc, cfg, trace=True)
        hits = self.hits(out)
        tier = tr.activation.tier.cpu()
        act = tr.activation.act.cpu()
        seeds = tr.seeds.cpu()
        C = self.index.C
        owner = enc.entity_owner.cpu().tolist()
        names = self.index.entities
        result = []
        for b, q in enumerate(questions):
            passage_ents = {h.row: set(C.col[C.crow[h.row]:C.crow[h.row + 1]].tolist()) for h in hits[b]}
            active = torch.nonzero(tier[:, b] > 0).flatten().tolist()
            result.append({
                "question": q,
                "dense_fallback": bool(tr.dense[b]),
                "question_entities": [t for t, o in zip(enc.entity_text, owner) if o == b],
                "seeds": [(names[e], float(seeds[e, b])) for e in torch.nonzero(tr.is_seed[:, b].cpu()).flatten().tolist()],
                "hits": [
                    (h, [(names[e], int(tier[e, b]), float(act[e, b])) for e in active if e in passage_ents[h.row]])
                    for h in hits[b]
                ],
            })
        return result


def _load_nlp(cfg: IndexConfig):
    from .nlp import load_spacy

    return load_spacy(cfg.spacy_model)


def _load_encoder(cfg: IndexConfig, device):
    from .encoding import Encoder

    return Encoder(cfg.encoder, device=str(device), max_length=cfg.max_length, batch_size=cfg.batch_size)
