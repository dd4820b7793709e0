"""The Tri-Graph index (ALGORITHM.md section 2) and its on-disk format.

On disk an index is a folder:
    index.json                 format, version, counts, configs, file manifest (size + sha256)
    tensors-<tag>.safetensors  embeddings, the CSR arrays of M, C, N, PS (and of the NER record), token keys
    strings-<tag>.json         passage ids, titles, texts; sentence and entity strings
    .lock                      present only while a writer works on the folder (see index_lock)
A write holds the folder's lock, puts the new data files next to the old ones, fsyncs them and the
folder, then atomically replaces index.json (temporary file, fsync, os.replace, fsync of the folder)
and only then deletes the old data files: a crash at any point leaves an index.json whose files are
all present and intact, and load() verifies each file's size and sha256 against index.json.
Readers take no lock (a reader that loses a race with a writer's clean-up re-reads index.json).
No pickle anywhere.

Test hook: when the environment variable LINEARRAG_TEST_PAUSE_BEFORE_COMMIT is set to a number of
seconds, save() prints a line to stderr and sleeps that long just before the atomic replacement of
index.json (the crash-safety test kills the process there).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import IndexConfig, RetrievalConfig
from .sparse import Csr

FORMAT = "linearrag_torch-index"
FORMAT_VERSION = 1
MATRICES = ("M", "C", "N", "PS")  # sentence x entity, passage x entity (PPR weights), counts, passage x sentence
NER_PARTS = ("entities", "sentences", "mentions")  # the NerRecord matrices, stored as "ner_<part>.crow" etc.
KEY_PARTS = ("passages", "sentences", "entities")  # TokenKeys, stored as "keys.<part>"
LOCK_NAME = ".lock"
PAUSE_ENV = "LINEARRAG_TEST_PAUSE_BEFORE_COMMIT"


class IndexFormatError(ValueError):
    """A missing, truncated, mismatched or foreign index folder (the message names the problem)."""


class IndexLockedError(OSError):
    """Another process holds the folder's write lock (the message names the folder and its pid)."""


@dataclass
class NerRecord:
    """What NER found in every passage, as node ids in text order (rows may have unsorted columns).

    entities   [P x E]  row p: the distinct entities of passage p in order of first mention
    sentences  [P x S]  row p: the sentence nodes of p in text order, one entry per occurrence
                        (a sentence repeated in p appears twice; sentences without entities are absent)
    mentions   [O x E]  O = sentences.nnz; row o: the distinct entities NER found in the o-th stored
                        sentence occurrence, in order of first mention
    This is the input of node numbering (build.py): deleting passages renumbers the remaining ones
    from it exactly as a fresh build of them would. Not used by retrieval. Values are all 1.
    """

    entities: Csr
    sentences: Csr
    mentions: Csr

    def check(self, P: int, S: int, E: int) -> None:
        shapes = {"entities": (P, E), "sentences": (P, S), "mentions": (self.sentences.nnz, E)}
        for part in NER_PARTS:
            mat = getattr(self, part)
            if tuple(mat.shape) != shapes[part]:
                raise IndexFormatError(f"NER record {part} has shape {tuple(mat.shape)}, expected {shapes[part]}")
            try:
                mat.check(f"NER record {part}")
            except ValueError as exc:
                raise IndexFormatError(str(exc)) from None

    def to(self, device) -> "NerRecord":
        return NerRecord(*(getattr(self, part).to(device) for part in NER_PARTS))


@dataclass
class TokenKeys:
    """Per node, a 64-bit hash of the token ids the encoder saw (build.token_hash): an add finds the
    old texts whose tokens equal a new text's without tokenizing the whole index. int64 [P], [S], [E]."""

    passages: torch.Tensor
    sentences: torch.Tensor
    entities: torch.Tensor

    def check(self, P: int, S: int, E: int) -> None:
        for part, n in (("passages", P), ("sentences", S), ("entities", E)):
            t = getattr(self, part)
            if t.dtype != torch.int64 or t.dim() != 1 or t.numel() != n:
                raise IndexFormatError(f"token keys of {part}: expected {n} int64 values, got {t.dtype} {tuple(t.shape)}")


@dataclass
class TriGraphIndex:
    """Passages, sentences and entities with their embeddings and the sparse matrices between them.

    M  [S x E]  M[s, e] = 1 if sentence s mentions entity e (NER span inside the sentence)
    C  [P x E]  C[p, e] = passage-entity edge weight for PPR: count(e in passage) / sum over the
                passage's entities (case-sensitive substring counts); its structure is the 0/1 contain matrix
    N  [P x E]  N[p, e] = lower-cased substring count of e in passage p, over every passage (eq. 7)
    PS [P x S]  PS[p, s] = 1 if sentence s occurs in passage p (sentences are keyed by their text)
    ner         the NER record of every passage (NerRecord); None for indexes written before it existed
    keys        hashes of every text's encoder tokens (TokenKeys); None for indexes written before they existed
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
    ner: Optional[NerRecord] = None
    keys: Optional[TokenKeys] = None

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
            if mat.val.dtype != torch.float32:
                raise IndexFormatError(f"matrix {name}: values must be float32, got {mat.val.dtype}")
            try:
                mat.check(f"matrix {name}")
            except ValueError as exc:
                raise IndexFormatError(str(exc)) from None
        if self.keys is not None:
            self.keys.check(P, S, E)
        if self.ner is not None:
            self.ner.check(P, S, E)
            if self.ner.entities.nnz != self.C.nnz:
                raise IndexFormatError(
                    f"NER record lists {self.ner.entities.nnz} passage entities, matrix C holds {self.C.nnz}"
                )

    # ---------------------------------------------------------------- persistence
    def save(self, path) -> Path:
        """Write atomically to folder ``path`` (created if needed) while holding its write lock
        (IndexLockedError if another process holds it); returns the path."""
        self.validate()
        path = Path(path)
        _make_dirs(path)
        with index_lock(path):
            self._write(path)
        return path

    def _write(self, path: Path) -> None:
        tag = uuid.uuid4().hex[:12]
        tensors = {
            "passage_emb": self.passage_emb.contiguous().cpu(),
            "sentence_emb": self.sentence_emb.contiguous().cpu(),
            "entity_emb": self.entity_emb.contiguous().cpu(),
        }
        mats = {name: getattr(self, name) for name in MATRICES}
        if self.ner is not None:
            mats.update({f"ner_{part}": getattr(self.ner, part) for part in NER_PARTS})
        for name, mat in mats.items():
            mat = mat.to("cpu")
            tensors[f"{name}.crow"] = mat.crow.contiguous()
            tensors[f"{name}.col"] = mat.col.contiguous()
            tensors[f"{name}.val"] = mat.val.contiguous()
        if self.keys is not None:
            tensors.update({f"keys.{part}": getattr(self.keys, part).contiguous().cpu() for part in KEY_PARTS})
        strings = {
            "passage_ids": self.passage_ids,
            "titles": self.titles,
            "texts": self.texts,
            "sentences": self.sentences,
            "entities": self.entities,
        }
        files = {"tensors": f"tensors-{tag}.safetensors", "strings": f"strings-{tag}.json"}
        # new names: until index.json names them, these files are invisible to readers
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
        _fsync_dir(path)  # the new files' folder entries are durable before index.json points at them
        pause = os.environ.get(PAUSE_ENV)
        if pause:
            print(f"linearrag: {PAUSE_ENV}: pausing {pause} s before replacing {path / 'index.json'}",
                  file=sys.stderr, flush=True)
            time.sleep(float(pause))
        os.replace(tmp, path / "index.json")  # the commit point
        _fsync_dir(path)
        for stale in path.iterdir():  # data files of earlier versions, and leftovers of crashed writes
            if stale.name not in files.values() and stale.name != "index.json" and _is_ours(stale.name):
                stale.unlink(missing_ok=True)

    @staticmethod
    def load(path, device="cpu", verify: bool = True) -> "TriGraphIndex":
        """Load from folder ``path``; tensors go to ``device``. ``verify`` checks sizes and sha256.

        Takes no lock: if the folder changes while it is read (a writer replaced index.json and
        removed the files it named), the load starts again from the new index.json.
        """
        path = Path(path)
        for attempt in range(5):
            before = _read_or_none(path / "index.json")
            try:
                return TriGraphIndex._load_once(path, device, verify)
            except IndexFormatError:
                if attempt == 4 or _read_or_none(path / "index.json") == before:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _load_once(path: Path, device, verify: bool) -> "TriGraphIndex":
        if not path.is_dir():
            raise IndexFormatError(f"{path}: no such index folder")
        meta_path = path / "index.json"
        if not meta_path.is_file():
            raise IndexFormatError(f"{path}: not an index folder (no index.json)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IndexFormatError(f"{meta_path}: unreadable ({exc})") from None
        except OSError as exc:
            raise IndexFormatError(f"{meta_path}: cannot read ({exc.strerror})") from None
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
            for name, value in (("files", files), ("manifest", manifest), ("counts", counts)):
                if not isinstance(value, dict):
                    raise TypeError(f"'{name}' must be an object")
            index_config = IndexConfig.from_dict(meta["index_config"])
            retrieval_config = RetrievalConfig.from_dict(meta["retrieval_config"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IndexFormatError(f"{meta_path}: missing or invalid field {exc}") from None
        for role in ("tensors", "strings"):
            name = files.get(role)
            if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                raise IndexFormatError(f"{meta_path}: invalid file name for {role}: {name!r}")
            f = path / name
            if not f.is_file():
                raise IndexFormatError(f"{f}: data file named by index.json is missing")
            if verify:
                want = manifest.get(f.name)
                want = want if isinstance(want, dict) else {}
                if f.stat().st_size != want.get("bytes"):
                    raise IndexFormatError(
                        f"{f}: size {f.stat().st_size} bytes, index.json records {want.get('bytes')} (truncated?)"
                    )
                if _sha256(f) != want.get("sha256"):
                    raise IndexFormatError(f"{f}: checksum does not match index.json (corrupted file)")
        P, S, E = counts.get("passages"), counts.get("sentences"), counts.get("entities")
        for name, n in (("passages", P), ("sentences", S), ("entities", E)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise IndexFormatError(f"{meta_path}: invalid count of {name}: {n!r}")
        try:
            t = load_file(str(path / files["tensors"]))
        except (SafetensorError, OSError, ValueError) as exc:
            raise IndexFormatError(f"{path / files['tensors']}: unreadable safetensors ({exc})") from None
        try:
            s = json.loads((path / files["strings"]).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IndexFormatError(f"{path / files['strings']}: unreadable ({exc})") from None
        except OSError as exc:
            raise IndexFormatError(f"{path / files['strings']}: cannot read ({exc.strerror})") from None
        need = ["passage_emb", "sentence_emb", "entity_emb"] + [
            f"{m}.{part}" for m in MATRICES for part in ("crow", "col", "val")
        ]
        missing = [k for k in need if k not in t]
        if missing:
            raise IndexFormatError(f"{path / files['tensors']}: missing tensors {missing}")
        _check_strings(s, path / files["strings"])
        shapes = {"M": (S, E), "C": (P, E), "N": (P, E), "PS": (P, S)}
        ner_keys = [f"ner_{part}.{k}" for part in NER_PARTS for k in ("crow", "col", "val")]
        present = [k for k in ner_keys if k in t]
        if present and len(present) != len(ner_keys):
            raise IndexFormatError(
                f"{path / files['tensors']}: missing tensors {[k for k in ner_keys if k not in t]}"
            )
        key_names = [f"keys.{part}" for part in KEY_PARTS]
        if any(k in t for k in key_names) and not all(k in t for k in key_names):
            raise IndexFormatError(f"{path / files['tensors']}: missing tensors {[k for k in key_names if k not in t]}")
        keys = TokenKeys(*(t[k] for k in key_names)) if key_names[0] in t else None
        try:
            mats = {
                m: Csr(t[f"{m}.crow"], t[f"{m}.col"], t[f"{m}.val"], shapes[m]) for m in MATRICES
            }
            ner = None
            if present:
                occurrences = int(t["ner_sentences.col"].numel())
                ner_shapes = {"entities": (P, E), "sentences": (P, S), "mentions": (occurrences, E)}
                ner = NerRecord(*(
                    Csr(t[f"ner_{part}.crow"], t[f"ner_{part}.col"], t[f"ner_{part}.val"], ner_shapes[part])
                    for part in NER_PARTS
                ))
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
                ner=ner,
                keys=keys,
                **mats,
            )
        except (KeyError, TypeError) as exc:
            raise IndexFormatError(f"{path / files['strings']}: missing field {exc}") from None
        for name, n in (("passages", index.num_passages), ("sentences", index.num_sentences), ("entities", index.num_entities)):
            if counts.get(name) != n:
                raise IndexFormatError(f"{meta_path}: records {counts.get(name)} {name}, the data holds {n}")
        index.validate()
        if counts.get("dim") is not None and counts["dim"] != index.dim:
            raise IndexFormatError(f"{meta_path}: encoder dimension {counts['dim']} but embeddings have {index.dim}")
        return index.to(device)

    def to(self, device) -> "TriGraphIndex":
        moved = {k: getattr(self, k).to(device) for k in ("passage_emb", "sentence_emb", "entity_emb") + MATRICES}
        return dataclasses.replace(self, **moved)


_HELD: dict = {}  # folders whose write lock this process holds -> nesting depth


@contextmanager
def index_lock(path):
    """Hold the exclusive write lock of index folder ``path`` (which must exist) for the ``with`` block.

    The lock is a non-blocking fcntl.flock on ``path/.lock``, which records the holder's pid and is
    removed on release (a killed writer leaves the file behind, but not the lock: the kernel drops it).
    Another process holding it raises IndexLockedError("PATH is locked by another writer (pid N)").
    Re-entrant within a process (save() inside an add's read-modify-write). Readers need no lock.
    """
    import fcntl

    path = Path(path)
    key = str(path.resolve())
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    lock = path / LOCK_NAME
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise IndexLockedError(f"{path} is locked by another writer (pid {holder})") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the previous holder may have removed the file between our open and flock: retry
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD[key] = 1
        yield
    finally:
        _HELD.pop(key, None)
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)  # releases the flock


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def _make_dirs(path: Path) -> None:
    """mkdir -p, making each created folder's entry durable (fsync of its parent)."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for m in reversed(missing):
        _fsync_dir(m.parent)


def _read_or_none(path: Path):
    try:
        return path.read_bytes()
    except OSError:
        return None


def _check_strings(s, where: Path) -> None:
    """The strings file must hold lists of the right element types (anything else: IndexFormatError)."""
    if not isinstance(s, dict):
        raise IndexFormatError(f"{where}: expected a JSON object")
    for name in ("passage_ids", "titles", "texts", "sentences", "entities"):
        value = s.get(name)
        if not isinstance(value, list):
            raise IndexFormatError(f"{where}: missing field or not a list: {name!r}")
        if name == "passage_ids":
            ok = all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in value)
        else:
            ok = all(isinstance(x, str) for x in value)
        if not ok:
            raise IndexFormatError(f"{where}: {name!r} holds an element of the wrong type")


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
