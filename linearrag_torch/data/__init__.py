"""The bundled sample: 300 passages of 2WikiMultiHopQA and 40 of its multi-hop questions (ATTRIBUTION.md).

    from linearrag_torch import LinearRAG
    from linearrag_torch.data import sample_corpus_path, sample_questions

    rag = LinearRAG.build(sample_corpus_path(), device="cpu")
    hits = rag.search([q["question"] for q in sample_questions()[:2]], top_k=5)

This module imports neither torch nor any model: it only locates the files.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

__all__ = ["data_file", "sample_corpus_path", "sample_questions", "sample_questions_path"]


def data_file(name: str) -> Path:
    """The path of a file bundled in ``linearrag_torch/data/``."""
    return Path(str(resources.files(__name__) / name))


def sample_corpus_path() -> Path:
    """The bundled corpus, ``demo_corpus.jsonl``: one JSON object per line with "id", "title" and "text"
    (300 passages, the input format of ``LinearRAG.build`` and ``linearrag index``)."""
    return data_file("demo_corpus.jsonl")


def sample_questions_path() -> Path:
    """The bundled questions, ``demo_questions.jsonl``: "id", "question", "answers", "supporting_ids" (the gold
    passages' corpus ids), "supporting_titles" and "type" (compositional, inference, comparison,
    bridge_comparison), 10 of each type; the input format of ``linearrag query --questions``."""
    return data_file("demo_questions.jsonl")


def sample_questions() -> list[dict]:
    """The 40 bundled questions as dicts (see ``sample_questions_path``)."""
    text = sample_questions_path().read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
