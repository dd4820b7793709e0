"""Indexes written by earlier versions of the library: the one place that knows their layouts.

index.json records ``format_version``. Every version this library reads is a key of UPGRADES; its
function takes the tensors file of that version and returns it in the current layout, in which an
optional part that a version did not write is absent (graph.TriGraphIndex.from_files then sets the
field to None: the code that uses it knows what None means, e.g. build.delete renumbers from C, PS, M).

Format version 1 covers three layouts, all read as they are:
    1a  M, C, N, PS and the embeddings                         (before the NER record)  ner = keys = None
    1b  1a + the NER record  ner_<part>.crow/col/val                                   keys = None
    1c  1b + the encoder token keys  keys.<part>                (what this library writes)
A part written only in half (some of its tensors) is refused, naming the missing tensors.

A change of the format bumps layout.FORMAT_VERSION and adds here the function that brings the previous
version's tensors to the new layout (e.g. UPGRADES = {1: _v1_to_v2, 2: _v2}; chain them by hand).
"""
from __future__ import annotations

from pathlib import Path

from .errors import IndexFormatError
from .layout import FORMAT_VERSION, KEY_TENSORS, NER_TENSORS

OPTIONAL_PARTS = (NER_TENSORS, KEY_TENSORS)  # each all or nothing


def _v1(tensors: dict, where: Path) -> dict:
    for names in OPTIONAL_PARTS:
        present = [k for k in names if k in tensors]
        if present and len(present) != len(names):
            raise IndexFormatError(f"{where}: missing tensors {[k for k in names if k not in tensors]}")
    return tensors


UPGRADES = {1: _v1}


def check_version(version, meta_path: Path) -> None:
    """IndexFormatError unless this library reads ``version`` (the value of index.json's format_version)."""
    if not any(version == v for v in UPGRADES):  # == as JSON numbers compare (1.0 is 1); no hashing
        raise IndexFormatError(
            f"{meta_path}: format version {version} is not supported "
            f"(this library reads version {FORMAT_VERSION}); rebuild the index"
        )


def upgrade(version: int, tensors: dict, where: Path) -> dict:
    """The tensors of a folder of format ``version`` in the current layout (see the module docstring)."""
    return next(fn for v, fn in UPGRADES.items() if v == version)(tensors, where)
