"""spaCy NER and sentence splitting (docs/METHOD.md, "Indexing (steps 1-4)", steps 1-2; query NER of eq. 3).

The pipeline keeps only what named-entity recognition needs. en_core_web_sm's ``ner`` carries its own
embedding layer (it does not listen to the shared ``tok2vec``), so ``tok2vec`` is dropped as well;
the entities are identical with and without it. Sentence boundaries come from two rules that run
before ``ner`` (so that no entity crosses a boundary): a new sentence starts after every newline
(the passage title is "title\\ntext", so the title is its own sentence) and after ., ! or ?
(spaCy's rule-based ``sentencizer``).
"""
from __future__ import annotations

import os
from bisect import bisect_right
from typing import NamedTuple, Sequence

import spacy
from spacy.language import Language
from spacy.tokens import Doc
from tqdm.auto import tqdm

from .encoding import ModelLoadError

# components NER does not need (``senter`` is a statistical sentence splitter: we use rules)
UNNEEDED = ("tagger", "morphologizer", "parser", "attribute_ruler", "lemmatizer", "senter", "trainable_lemmatizer")
EMBEDDERS = ("tok2vec", "transformer")  # kept only when a remaining component listens to them
AUTO_MULTIPROCESS_MIN_TEXTS = 200  # below this, starting worker processes costs more than it saves


@Language.component("newline_sentence_starts")
def newline_sentence_starts(doc: Doc) -> Doc:
    """Start a sentence at the token after every whitespace token that holds a newline."""
    for tok in doc[:-1]:
        if tok.is_space and "\n" in tok.text:
            doc[tok.i + 1].is_sent_start = True
    return doc


class PassageAnalysis(NamedTuple):
    """Sentences of one passage, the entities of each sentence, and the passage's distinct entities."""

    sentences: list  # stripped, non-empty, in text order (may repeat)
    sentence_entities: list  # per sentence, distinct entity strings in order of first occurrence
    entities: list  # distinct entity strings of the passage, in order of first occurrence


def bind_title(analysis: PassageAnalysis, title: str) -> PassageAnalysis:
    """Make the passage title an entity of the passage mentioned by every one of its sentences.

    A Wikipedia-style passage is about its title: its sentences say "He was born in ..." without
    naming it. Binding the title to each sentence lets activation step from a title (found in the
    question) to the passage's most question-relevant sentence, and links the passage to every
    other passage that names the title. Identity when the title is empty.
    """
    title = title.strip()
    if not title:
        return analysis
    rest = [e for e in analysis.entities if e != title]
    return PassageAnalysis(
        sentences=analysis.sentences,
        sentence_entities=[[title] + [e for e in ents if e != title] for ents in analysis.sentence_entities],
        entities=[title] + rest,
    )


def load_spacy(name: str) -> Language:
    """Load pipeline ``name`` (an installed package or a folder) with only NER and rule sentence splitting."""
    try:
        nlp = spacy.load(name, exclude=list(UNNEEDED))
    except (OSError, ImportError, ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"cannot load spaCy model {name!r} ({exc}); install its package or give the path of a model folder"
        ) from None
    if "ner" not in nlp.pipe_names:
        raise ModelLoadError(f"spaCy model {name!r} has no 'ner' component (it has {nlp.pipe_names})")
    for emb in EMBEDDERS:
        if emb in nlp.pipe_names and not getattr(nlp.get_pipe(emb), "listening_components", []):
            nlp.remove_pipe(emb)
    nlp.add_pipe("sentencizer", first=True)
    nlp.add_pipe("newline_sentence_starts", first=True)
    return nlp


def analyse_passages(
    nlp: Language,
    texts: Sequence[str],
    dropped_labels: Sequence[str],
    batch_size: int = 64,
    n_process: int = 0,
    progress: bool = True,
) -> list[PassageAnalysis]:
    """Split every text into sentences and find its entities (labels in ``dropped_labels`` are skipped).

    ``n_process`` 0 picks min(2, cores) worker processes for more than 200 texts, else 1.
    """
    if n_process <= 0:
        n_process = min(2, os.cpu_count() or 1) if len(texts) > AUTO_MULTIPROCESS_MIN_TEXTS else 1
    dropped = set(dropped_labels)
    docs = nlp.pipe(texts, batch_size=batch_size, n_process=n_process)
    out = []
    for doc in tqdm(docs, total=len(texts), desc="NER", unit="passage", disable=not progress):
        out.append(_analyse_doc(doc, dropped))
    return out


def question_entities(nlp: Language, questions: Sequence[str], dropped_labels: Sequence[str]) -> list[list[str]]:
    """Lower-cased distinct entity strings of each question (NER runs on the original casing)."""
    dropped = set(dropped_labels)
    out = []
    # one question: nlp() itself, without nlp.pipe's batching machinery (~0.5 ms of a ~5 ms call); the same doc
    docs = [nlp(questions[0])] if len(questions) == 1 else nlp.pipe(questions)
    for doc in docs:
        ents: dict[str, None] = {}
        for ent in doc.ents:
            text = ent.text.strip().lower()
            if ent.label_ not in dropped and text:
                ents.setdefault(text)
        out.append(list(ents))
    return out


class NERPool:
    """spaCy NER of question batches in ``processes`` worker processes that stay up (each loads ``model``, a
    spaCy package name or folder, as load_spacy does), beside the calling process. spaCy runs on one core per
    process: where cores idle while NER runs (a GPU server; the engine thread of `linearrag serve`, whose torch
    work waits for the entities) a batch's NER time falls about as the cores it gets. ``entities`` splits a
    batch into contiguous parts of at least ``min_part`` questions, one per worker and (``caller_part``) one
    for the calling process (a smaller batch runs in the calling process alone), and gives what
    question_entities gives (tested). Without the caller's part the calling thread only waits, so a server's
    event loop in the same process keeps the interpreter meanwhile. spaCy's own ``nlp.pipe(n_process=...)``
    starts its processes on every call (seconds), so it is no use per batch. The processes are started with
    "spawn" (a process that runs torch must not fork) and stopped by close() or at exit."""

    MAX_RESTARTS = 3  # worker processes started again after a failure at most this many times

    def __init__(self, model: str, processes: int, min_part: int = 8, caller_part: bool = True):
        import threading

        if processes < 1:
            raise ValueError(f"NERPool needs at least 1 process, got {processes}")
        self.model, self.processes, self.min_part = model, int(processes), max(1, int(min_part))
        self.caller_part = bool(caller_part)
        self.restarts = 0  # times the worker processes were replaced after one died
        self._closed = False
        self._lock = threading.Lock()
        self._pool = None
        self._pool = self._new_pool()  # a bad model fails here, not in the first batch

    def _new_pool(self):
        """Worker processes, each with the model loaded (waits for them)."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_pool_init, initargs=(self.model,))
        try:
            list(pool.map(_pool_ready, range(self.processes), chunksize=1))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        return pool

    def parts(self, n: int) -> int:
        """Into how many parts a batch of ``n`` questions is split (1: it runs in the calling process)."""
        return max(1, min(self.processes + self.caller_part, n // self.min_part))

    def entities(self, nlp: Language, questions: Sequence[str], dropped_labels: Sequence[str]) -> list[list[str]]:
        """question_entities, the batch split over the calling process (with ``nlp``, the same pipeline) and the
        workers. A batch too small to split, a batch whose worker died, and every batch while the pool is closed or
        its workers are being replaced, runs in the calling process alone."""
        k = self.parts(len(questions))
        pool = self._pool  # (a restart may install a new one meanwhile)
        if k == 1 or pool is None:
            return question_entities(nlp, questions, dropped_labels)
        size = -(-len(questions) // k)
        chunks = [list(questions[i:i + size]) for i in range(0, len(questions), size)]
        dropped = tuple(dropped_labels)
        mine = chunks[:1] if self.caller_part else []
        try:
            futures = [pool.submit(_pool_entities, c, dropped) for c in chunks[len(mine):]]
        except Exception as exc:  # noqa: BLE001 - the pool is broken or shut down
            return self._failed(exc, nlp, questions, dropped)
        first = [ents for c in mine for ents in question_entities(nlp, c, dropped)]
        try:
            rest = [f.result() for f in futures]
        except Exception as exc:  # noqa: BLE001 - a worker died (BrokenProcessPool)
            return self._failed(exc, nlp, questions, dropped)
        return first + [ents for part in rest for ents in part]

    def _failed(self, exc, nlp, questions, dropped):
        """A worker died: this batch runs in the calling process, and new worker processes are started on a
        thread of their own (batches run in the calling process until they are up), at most MAX_RESTARTS times."""
        import logging
        import threading

        log = logging.getLogger("linearrag")
        with self._lock:
            broken, self._pool = self._pool, None
            restart = not self._closed and self.restarts < self.MAX_RESTARTS
            if restart:
                self.restarts += 1
        log.warning("NER worker processes failed (%s: %s); this batch runs in this process, %s",
                    type(exc).__name__, exc, f"new workers are starting (restart {self.restarts} of "
                    f"{self.MAX_RESTARTS})" if restart else "and so do the next ones (no more restarts)")
        if broken is not None:
            broken.shutdown(wait=False, cancel_futures=True)
        if restart:
            threading.Thread(target=self._restart, name="linearrag-ner-restart", daemon=True).start()
        return question_entities(nlp, questions, dropped)

    def _restart(self) -> None:
        import logging

        try:
            pool = self._new_pool()
        except Exception as exc:  # noqa: BLE001 (NER stays in process)
            logging.getLogger("linearrag").warning("NER worker processes could not be started again: %s: %s",
                                                   type(exc).__name__, exc)
            return
        with self._lock:
            if not self._closed:
                self._pool, pool = pool, None
        if pool is not None:  # closed meanwhile
            pool.shutdown(wait=True, cancel_futures=True)
        else:
            logging.getLogger("linearrag").info("NER worker processes replaced")

    def close(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    @property
    def running(self) -> bool:
        return self._pool is not None

    def __repr__(self) -> str:
        return (f"NERPool({self.model!r}, processes={self.processes}, caller_part={self.caller_part}, "
                f"running={self.running})")


_WORKER_NLP: Language | None = None  # the pipeline of a NERPool worker process


def _pool_init(model: str) -> None:
    global _WORKER_NLP
    _WORKER_NLP = load_spacy(model)


def _pool_ready(_: int) -> bool:
    return _WORKER_NLP is not None


def _pool_entities(questions: list, dropped_labels: tuple) -> list[list[str]]:
    return question_entities(_WORKER_NLP, questions, dropped_labels)


def _analyse_doc(doc: Doc, dropped: set) -> PassageAnalysis:
    text = doc.text
    starts: list[int] = []  # start character of every kept sentence
    sentences: list[str] = []
    for sent in doc.sents:
        pos = sent.start_char
        for piece in text[sent.start_char : sent.end_char].split("\n"):
            stripped = piece.strip()
            if stripped:
                starts.append(pos + len(piece) - len(piece.lstrip()))
                sentences.append(stripped)
            pos += len(piece) + 1
    sentence_entities: list[dict] = [{} for _ in sentences]
    entities: dict[str, None] = {}
    for ent in doc.ents:
        if ent.label_ in dropped:
            continue
        name = ent.text.strip()
        if not name:
            continue
        anchor = ent.start_char + len(ent.text) - len(ent.text.lstrip())  # first non-space character
        sentence_entities[bisect_right(starts, anchor) - 1].setdefault(name)
        entities.setdefault(name)
    return PassageAnalysis(sentences, [list(e) for e in sentence_entities], list(entities))
