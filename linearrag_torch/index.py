"""The Tri-Graph index (ALGORITHM.md section 2) and its on-disk format.

On disk an index is a folder:
    index.json                 format, version, counts, configs, file manifest (size + sha256)
    tensors-<tag>.safetensors  embeddings and the CSR arrays of M, C, N, PS
    strings-<tag>.json         passage ids, titles, texts; sentence and entity strings
A write puts the new data files next to the old ones, fsyncs them, then atomically replaces
index.json (os.replace) and only then deletes the old data files: a crash at any point leaves an
index.json whose files are all present and intact. No pickle anywhere.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import IndexConfig, RetrievalConfig
from .sparse import Csr

FORMAT = "linearrag_torch-index"
FORMAT_VERSION = 1
MATRICES = ("M", "C", "N", "PS")  # sentence x entity, passage x entity (PPR weights), counts, passage x sentence


class IndexFormatError(ValueError):
    """A missing, truncated, mismatched or foreign index folder (the message names the problem)."""


@dataclass
class TriGraphIndex:
    """Passages, sentences and entities with their embeddings and the sparse matrices between them.

    M  [S x E]  M[s, e] = 1 if sentence s mentions entity e (NER span inside the sentence)
    C  [P x E]  C[p, e] = passage-entity edge weight for PPR: count(e in passage) / sum over the
                passage's entities (case-sensitive substring counts); its structure is the 0/1 contain matrix
    N  [P x E]  N[p, e] = lower-cased substring count of e in passage p, over every passage (eq. 7)
    PS [P x S]  PS[p, s] = 1 if sentence s occurs in passage p (sentences are keyed by their text)
    """

    passage_ids: list
    titles: list
    texts: list
    sentences: list
    entities: list
    passage_emb: torch.Tensor
    sentence_emb: torch.Tensor
    entity_emb: torch.Tensor
    M: Csr
    C: Csr
    N: Csr
    PS: Csr
    index_config: IndexConfig = field(default_factory=IndexConfig)
    retrieval_config: RetrievalConfig = field(default_factory=RetrievalConfig)

    @property
    def num_passages(self) -> int:
        return len(self.passage_ids)

    @property
    def num_sentences(self) -> int:
        return len(self.sentences)

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def dim(self) -> int:
        return int(self.passage_emb.shape[1])

    def passage_text(self, i: int) -> str:
        """The text that is embedded and searched: title + newline + text when there is a title."""
        return f"{self.titles[i]}\n{self.texts[i]}" if self.titles[i] else self.texts[i]

    def summary(self) -> dict:
        return {
            "passages": self.num_passages,
            "sentences": self.num_sentences,
            "entities": self.num_entities,
            "nnz_M": self.M.nnz,
            "nnz_C": self.C.nnz,
            "nnz_N": self.N.nnz,
            "dim": self.dim,
        }

    def validate(self) -> None:
        """Raise IndexFormatError naming the first inconsistency between counts, shapes and dtypes."""
        P, S, E = self.num_passages, self.num_sentences, self.num_entities
        for name, n in (("titles", len(self.titles)), ("texts", len(self.texts))):
            if n != P:
                raise IndexFormatError(f"{name} has {n} entries but there are {P} passages")
        for name, emb, rows in (
            ("passage_emb", self.passage_emb, P),
            ("sentence_emb", self.sentence_emb, S),
            ("entity_emb", self.entity_emb, E),
        ):
            if emb.dtype != torch.float32 or emb.dim() != 2:
                raise IndexFormatError(f"{name}: expected a 2-d float32 tensor, got {emb.dtype} {tuple(emb.shape)}")
            if emb.shape[0] != rows:
                raise IndexFormatError(f"{name} has {emb.shape[0]} rows, expected {rows}")
            if emb.shape[1] != self.passage_emb.shape[1]:
                raise IndexFormatError(f"{name} has dimension {emb.shape[1]}, passages have {self.passage_emb.shape[1]}")
        for name, shape in (("M", (S, E)), ("C", (P, E)), ("N", (P, E)), ("PS", (P, S))):
            mat = getattr(self, name)
            if tuple(mat.shape) != shape:
                raise IndexFormatError(f"matrix {name} has shape {tuple(mat.shape)}, expected {shape}")
            try:
                mat.check(f"matrix {name}")
            except ValueError as exc:
                raise IndexFormatError(str(exc)) from None

    # ---------------------------------------------------------------- persistence
    def save(self, path) -> Path:
        """Write atomically to folder ``path`` (created if needed); returns the path."""
        self.validate()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:12]
        tensors = {
            "passage_emb": self.passage_emb.contiguous().cpu(),
            "sentence_emb": self.sentence_emb.contiguous().cpu(),
            "entity_emb": self.entity_emb.contiguous().cpu(),
        }
        for name in MATRICES:
            mat = getattr(self, name).to("cpu")
            tensors[f"{name}.crow"] = mat.crow.contiguous()
            tensors[f"{name}.col"] = mat.col.contiguous()
            tensors[f"{name}.val"] = mat.val.contiguous()
        strings = {
            "passage_ids": self.passage_ids,
            "titles": self.titles,
            "texts": self.texts,
            "sentences": self.sentences,
            "entities": self.entities,
        }
        files = {"tensors": f"tensors-{tag}.safetensors", "strings": f"strings-{tag}.json"}
        save_file(tensors, str(path / files["tensors"]))
        (path / files["strings"]).write_text(json.dumps(strings, ensure_ascii=False), encoding="utf-8")
        manifest = {}
        for f in files.values():
            _fsync(path / f)
            manifest[f] = {"bytes": (path / f).stat().st_size, "sha256": _sha256(path / f)}
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "counts": self.summary(),
            "index_config": self.index_config.to_dict(),
            "retrieval_config": self.retrieval_config.to_dict(),
            "files": files,
            "manifest": manifest,
        }
        tmp = path / f"index.json.{tag}.tmp"
        tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        _fsync(tmp)
        os.replace(tmp, path / "index.json")
        _fsync_dir(path)
        for stale in path.iterdir():  # data files of earlier versions, and leftovers of crashed writes
            if stale.name not in files.values() and stale.name != "index.json" and _is_ours(stale.name):
                stale.unlink(missing_ok=True)
        return path

    @staticmethod
    def load(path, device="cpu", verify: bool = True) -> "TriGraphIndex":
        """Load from folder ``path``; tensors go to ``device``. ``verify`` checks sizes and sha256."""
        path = Path(path)
        if not path.is_dir():
            raise IndexFormatError(f"{path}: no such index folder")
        meta_path = path / "index.json"
        if not meta_path.is_file():
            raise IndexFormatError(f"{path}: not an index folder (no index.json)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IndexFormatError(f"{meta_path}: unreadable ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise IndexFormatError(f"{meta_path}: not a {FORMAT} file")
        if meta.get("format_version") != FORMAT_VERSION:
            raise IndexFormatError(
                f"{meta_path}: format version {meta.get('format_version')} is not supported "
                f"(this library reads version {FORMAT_VERSION}); rebuild the index"
            )
        try:
            files = meta["files"]
            manifest = meta["manifest"]
            counts = meta["counts"]
            index_config = IndexConfig.from_dict(meta["index_config"])
            retrieval_config = RetrievalConfig.from_dict(meta["retrieval_config"])
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{meta_path}: missing or invalid field {exc}") from None
        for role in ("tensors", "strings"):
            f = path / files.get(role, "")
            if not f.is_file():
                raise IndexFormatError(f"{f}: data file named by index.json is missing")
            if verify:
                want = manifest.get(f.name, {})
                if f.stat().st_size != want.get("bytes"):
                    raise IndexFormatError(
                        f"{f}: size {f.stat().st_size} bytes, index.json records {want.get('bytes')} (truncated?)"
                    )
                if _sha256(f) != want.get("sha256"):
                    raise IndexFormatError(f"{f}: checksum does not match index.json (corrupted file)")
        try:
            t = load_file(str(path / files["tensors"]))
        except (SafetensorError, OSError, ValueError) as exc:
            raise IndexFormatError(f"{path / files['tensors']}: unreadable safetensors ({exc})") from None
        try:
            s = json.loads((path / files["strings"]).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IndexFormatError(f"{path / files['strings']}: unreadable ({exc})") from None
        need = ["passage_emb", "sentence_emb", "entity_emb"] + [
            f"{m}.{part}" for m in MATRICES for part in ("crow", "col", "val")
        ]
        missing = [k for k in need if k not in t]
        if missing:
            raise IndexFormatError(f"{path / files['tensors']}: missing tensors {missing}")
        P, S, E = counts.get("passages"), counts.get("sentences"), counts.get("entities")
        shapes = {"M": (S, E), "C": (P, E), "N": (P, E), "PS": (P, S)}
        try:
            mats = {
                m: Csr(t[f"{m}.crow"], t[f"{m}.col"], t[f"{m}.val"], shapes[m]) for m in MATRICES
            }
            index = TriGraphIndex(
                passage_ids=s["passage_ids"],
                titles=s["titles"],
                texts=s["texts"],
                sentences=s["sentences"],
                entities=s["entities"],
                passage_emb=t["passage_emb"],
                sentence_emb=t["sentence_emb"],
                entity_emb=t["entity_emb"],
                index_config=index_config,
                retrieval_config=retrieval_config,
                **mats,
            )
        except (KeyError, TypeError) as exc:
            raise IndexFormatError(f"{path / files['strings']}: missing field {exc}") from None
        for name, n in (("passages", index.num_passages), ("sentences", index.num_sentences), ("entities", index.num_entities)):
            if counts.get(name) != n:
                raise IndexFormatError(f"{meta_path}: records {counts.get(name)} {name}, the data holds {n}")
        if counts.get("dim") is not None and counts["dim"] != index.dim:
            raise IndexFormatError(f"{meta_path}: encoder dimension {counts['dim']} but embeddings have {index.dim}")
        index.validate()
        return index.to(device)

    def to(self, device) -> "TriGraphIndex":
        moved = {k: getattr(self, k).to(device) for k in ("passage_emb", "sentence_emb", "entity_emb") + MATRICES}
        return dataclasses.replace(self, **moved)


def _is_ours(name: str) -> bool:
    return (name.startswith("tensors-") and name.endswith(".safetensors")) or (
        name.startswith("strings-") and name.endswith(".json")
    ) or (name.startswith("index.json.") and name.endswith(".tmp"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync(path)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
