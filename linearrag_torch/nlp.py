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
