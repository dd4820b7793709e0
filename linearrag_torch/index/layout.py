"""What an index folder holds, by name: the format tag, its version and the tensors of each part.

A new storage field: add its tensor names here (an optional part, as ``keys.<part>``, when indexes
written before it must still load), write it in graph.TriGraphIndex.to_files, read it in
graph.TriGraphIndex.from_files, and say in upgrade.py what a folder without it means.
"""
FORMAT = "linearrag_torch-index"
FORMAT_VERSION = 1  # what this library writes; upgrade.UPGRADES lists what it reads
MATRICES = ("M", "C", "N", "PS")  # sentence x entity, passage x entity (PPR weights), counts, passage x sentence
NER_PARTS = ("entities", "sentences", "mentions")  # the NerRecord matrices, stored as "ner_<part>.crow" etc.
KEY_PARTS = ("passages", "sentences", "entities")  # TokenKeys, stored as "keys.<part>"
EMBEDDINGS = ("passage_emb", "sentence_emb", "entity_emb")
STRINGS = ("passage_ids", "titles", "texts", "sentences", "entities")


def csr_names(name: str) -> list:
    """The three tensors of CSR matrix ``name``."""
    return [f"{name}.{part}" for part in ("crow", "col", "val")]


REQUIRED_TENSORS = list(EMBEDDINGS) + [n for m in MATRICES for n in csr_names(m)]
NER_TENSORS = [n for part in NER_PARTS for n in csr_names(f"ner_{part}")]
KEY_TENSORS = [f"keys.{part}" for part in KEY_PARTS]
