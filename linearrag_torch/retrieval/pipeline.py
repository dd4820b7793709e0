"""The question path, from question strings to EncodedQueries, in named and timed stages.

    ner      spaCy NER over the whole batch (one nlp.pipe), lower-cased distinct entity strings
    lexicon  the index's own entity strings found in each question (RetrievalConfig.lexicon_seeds)
    encoder  one tokenizer call for the questions and their entity strings; an entity string whose
             encoder tokens equal an index entity's (for the uncased MiniLM: equal up to case, so every
             lexicon match and most NER strings) takes that entity's stored vector; the questions and
             the remaining strings go through the transformer in one call, batched by token count
    graph    the engine: seeds, activation, PageRank, top-k (LinearRAG.retrieve)

A stored vector is what encoding the string again gives, up to the encoder's batching noise (~1e-7:
a vector depends in its last bits on the texts that share its forward pass), so top-k is unchanged
unless two passages tie within that noise. ``reuse_index_vectors=False`` encodes every string (the
path before stored vectors were reused; tests compare the two).

Stage times are added, in seconds, to a ``timings`` dict when one is given (pass the same dict over
several batches to accumulate). Nothing here is shared between threads; one caller at a time.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..models import encoding
from ..indexing.lexicon import EntityLexicon
from ..queries import EncodedQueries
from ..runtime.tracing import stage

STAGES = ("ner", "lexicon", "encoder", "graph")


class IndexEntityVectors:
    """Finds the index entity whose encoder tokens equal a text's tokens, by the index's stored token
    hashes (TokenKeys.entities; computed once here for an index written without them), checked token
    by token."""

    def __init__(self, index, encoder):
        token_hash = encoding.token_hash  # read at call time, as before (tests patch encoding.token_hash)
        self.index = index
        self.encoder = encoder
        self._hash = token_hash
        hashes = index.keys.entities if index.keys is not None else None
        if hashes is None or hashes.numel() != index.num_entities:
            hashes = [token_hash(k) for k in encoder.token_keys(index.entities)]
        else:
            hashes = hashes.tolist()
        self.rows: dict = {}
        for i, h in enumerate(hashes):
            self.rows.setdefault(h, i)
        self._checked: dict = {}  # row -> its token ids (rows already compared once)

    def find(self, keys: Sequence[tuple]) -> list:
        """Per token-id tuple, the row of an index entity with the same tokens, or None."""
        found = [self.rows.get(self._hash(k)) for k in keys]
        unchecked = sorted({r for r in found if r is not None and r not in self._checked})
        if unchecked:  # a hash is no proof: compare the tokens
            for r, k in zip(unchecked, self.encoder.token_keys([self.index.entities[r] for r in unchecked])):
                self._checked[r] = k
        return [r if r is not None and self._checked[r] == k else None for r, k in zip(found, keys)]


class QuestionPipeline:
    """Questions -> EncodedQueries for one index, its spaCy pipeline and its encoder (see the module doc)."""

    def __init__(self, index, nlp, encoder, ner_pool=None):
        self.index = index
        self.nlp = nlp
        self.encoder = encoder
        self.ner_pool = ner_pool  # nlp.NERPool or None
        self._lexicon = None
        self._vectors = None

    @property
    def lexicon(self):
        if self._lexicon is None:
            self._lexicon = EntityLexicon(self.index.entities)
        return self._lexicon

    @property
    def can_reuse(self) -> bool:
        """Stored vectors are reused only with the index's own encoder (equal tokens, same vector space)."""
        enc = self.encoder
        return (hasattr(enc, "token_keys") and hasattr(enc, "encode_token_ids")
                and getattr(enc, "name", None) == self.index.index_config.encoder)

    def encode_questions(self, questions: Sequence[str], cfg, reuse_index_vectors: bool = True,
                         timings: Optional[dict] = None, reranker=None) -> EncodedQueries:
        """The whole question path for a batch (stage 0 of stages.plan): each question checked, its entities
        (entities()), the vectors (encode()) and, with cfg.rerank, the reranker's question tokens.

        Parameters
        ----------
        questions : sequence of str
            The questions (an empty or non-string question raises corpus.InputError).
        cfg : RetrievalConfig
            lexicon_seeds, question_ner and rerank are read.
        reuse_index_vectors : bool
            Stored entity vectors for strings with an index entity's tokens (encode()).
        timings : dict, optional
            Seconds of "ner", "lexicon" and "encoder" are added to it.
        reranker : rerank.Reranker, optional
            The reranker whose question tokens cfg.rerank needs (required then).

        Returns
        -------
        EncodedQueries
        """
        from ..corpus import check_question

        questions = list(questions)
        for q in questions:
            check_question(q)
        ents = self.entities(questions, cfg.lexicon_seeds, timings, cfg.question_ner)
        enc = self.encode(questions, ents, reuse_index_vectors, timings)
        if cfg.rerank:  # the reranker's question tokens (host work of the question path, like NER)
            if reranker is None:
                raise ValueError("rerank=True needs the reranker to tokenise the questions")
            with stage(timings, "encoder"):
                enc.rerank_tokens = reranker.question_tokens(questions)
        return enc

    def entities(self, questions: Sequence[str], lexicon_seeds: bool, timings: Optional[dict] = None,
                 ner: str = "always") -> list:
        """Per question, its distinct lower-cased entity strings: NER first, then lexicon matches.

        ``ner`` (RetrievalConfig.question_ner): "always" runs spaCy on every question; "fallback" only on the
        questions in which the lexicon finds nothing; "off" never (lexicon matches only)."""
        from ..models.nlp import question_entities  # deferred: imports spaCy (~1.4 s), not needed with ner="off"

        questions = list(questions)
        lex = None
        if lexicon_seeds:
            with stage(timings, "lexicon"):
                lex = [self.lexicon.match(q) for q in questions]
        if ner == "always":
            todo = range(len(questions))
        elif ner == "fallback" and lex is not None:
            todo = [i for i, found in enumerate(lex) if not found]
        elif ner == "off" and lex is not None:
            todo = []
        else:
            raise ValueError(f"question NER {ner!r} with lexicon_seeds={lexicon_seeds}: see RetrievalConfig.question_ner")
        ents = [[] for _ in questions]
        if todo:
            with stage(timings, "ner"):
                part = [questions[i] for i in todo]
                dropped = self.index.index_config.dropped_labels
                found = (self.ner_pool.entities(self.nlp, part, dropped) if self.ner_pool is not None
                         else question_entities(self.nlp, part, dropped))
            for i, es in zip(todo, found):
                ents[i] = es
        if lex is not None:
            ents = [list(dict.fromkeys(es + ls)) for es, ls in zip(ents, lex)]
        return ents

    def encode(self, questions: Sequence[str], ents: list, reuse_index_vectors: bool = True,
               timings: Optional[dict] = None) -> EncodedQueries:
        """Vectors of the questions and of their entity strings (``ents``, as from entities())."""
        questions = list(questions)
        flat = [e for es in ents for e in es]
        owner = torch.tensor([i for i, es in enumerate(ents) for _ in es], dtype=torch.int64)
        enc = self.encoder
        with stage(timings, "encoder"):
            rows = None
            if hasattr(enc, "token_keys") and hasattr(enc, "encode_token_ids"):
                q_emb, e_emb, rows = self._encode_tokens(questions, flat, reuse_index_vectors and self.can_reuse)
            else:  # a stand-in encoder with encode() only
                q_emb = enc.encode(questions)
                e_emb = enc.encode(flat) if flat else torch.zeros(0, q_emb.shape[1], device=q_emb.device)
        if e_emb.shape[1] != self.index.dim:
            raise ValueError(f"encoder {self.index.index_config.encoder!r} gives {e_emb.shape[1]}-d vectors, "
                             f"the index holds {self.index.dim}-d")
        if rows is None or all(r is None for r in rows):
            return EncodedQueries(q_emb.float(), e_emb.float(), owner.to(q_emb.device), flat)
        known = torch.tensor([-1 if r is None else r for r in rows], dtype=torch.int64, device=q_emb.device)
        return EncodedQueries(q_emb.float(), e_emb.float(), owner.to(q_emb.device), flat, known, self.index)

    def _encode_tokens(self, questions: list, flat: list, reuse: bool):
        enc = self.encoder
        keys = enc.token_keys(questions + flat)  # one tokenizer call
        q_keys, e_keys = keys[:len(questions)], keys[len(questions):]
        rows = [None] * len(flat)
        if reuse and flat:
            if self._vectors is None:
                self._vectors = IndexEntityVectors(self.index, enc)
            rows = self._vectors.find(e_keys)
        todo = [j for j, r in enumerate(rows) if r is None]
        emb = enc.encode_token_ids(q_keys + [e_keys[j] for j in todo])  # one call, batched by length
        q_emb = emb[:len(questions)]
        e_emb = torch.empty(len(flat), emb.shape[1], dtype=torch.float32, device=emb.device)
        if todo:
            e_emb[torch.tensor(todo, device=emb.device)] = emb[len(questions):]
        done = [j for j, r in enumerate(rows) if r is not None]
        if done:
            stored = self.index.entity_emb[torch.tensor([rows[j] for j in done])]
            e_emb[torch.tensor(done, device=emb.device)] = stored.to(emb.device, torch.float32)
        return q_emb, e_emb, rows
