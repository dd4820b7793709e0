"""The on-disk side of an index folder: the atomic write, the manifest, fsync, and every check on load.

A folder holds:
    index.json                 format, version, counts, configs, file manifest (size + sha256)
    tensors-<tag>.safetensors  embeddings, the CSR arrays of M, C, N, PS (and of the NER record), token keys
    strings-<tag>.json         passage ids, titles, texts; sentence and entity strings
    .lock                      present only while a writer works on the folder (lock.index_lock)
A write (under the folder's lock, which the caller holds) puts the new data files next to the old ones,
fsyncs them and the folder, then atomically replaces index.json (temporary file, fsync, os.replace,
fsync of the folder) and only then deletes the old data files: a crash at any point leaves an
index.json whose files are all present and intact, and ``read`` verifies each file's size and sha256
against index.json. Readers take no lock (a reader that loses a race with a writer's clean-up re-reads
index.json: ``read_retrying``). No pickle anywhere. This module knows files, not the Tri-Graph: it
writes and returns dicts of tensors and strings (graph.TriGraphIndex.to_files / from_files).

Test hooks: when the environment variable LINEARRAG_TEST_PAUSE_BEFORE_COMMIT is set to a number of
seconds, ``write`` prints a line to stderr and sleeps that long just before the atomic replacement of
index.json (the crash-safety test kills the process there). LINEARRAG_TEST_WRITE_STEP_PAUSE (seconds) makes
it print each step's name to stderr and pause after it, so that benchmarks/write_crash.py can kill a writer
between any two steps.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import env
from ..config import IndexConfig, RetrievalConfig
from . import upgrade
from .errors import IndexFormatError
from .layout import FORMAT, FORMAT_VERSION, REQUIRED_TENSORS, STRINGS

PAUSE_ENV = env.TEST_PAUSE_BEFORE_COMMIT.name
STEP_PAUSE_ENV = env.TEST_WRITE_STEP_PAUSE.name


def write(path: Path, tensors: dict, strings: dict, fields: dict) -> None:
    """Replace the index in folder ``path`` (existing; its lock held by the caller) with ``tensors``
    (name -> CPU tensor), ``strings`` (name -> list) and index.json ``fields`` (counts, configs)."""
    tag = uuid.uuid4().hex[:12]
    files = {"tensors": f"tensors-{tag}.safetensors", "strings": f"strings-{tag}.json"}
    tmp = path / f"index.json.{tag}.tmp"
    step = _stepper(path)
    try:
        # new names: until index.json names them, these files are invisible to readers
        step("begin")
        (path / files["strings"]).write_text(json.dumps(strings, ensure_ascii=False), encoding="utf-8")
        step("strings written")
        _save_tensors(tensors, path / files["tensors"])
        step("tensors written")
        # safetensors writes through a private temporary file (mode 0600): an index built by one user could not
        # be served by another. Give it the mode every other file here has, which the process's umask set
        # (read from the strings file just written, not from os.umask(), which would change it for all threads)
        os.chmod(path / files["tensors"], stat.S_IMODE((path / files["strings"]).stat().st_mode))
        manifest = {}
        for role, f in files.items():
            fsync(path / f)
            manifest[f] = {"bytes": (path / f).stat().st_size, "sha256": sha256(path / f)}
            step(f"{role} file synced")
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields, "files": files, "manifest": manifest}
        tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        step("index.json.tmp written")
        fsync(tmp)
        fsync_dir(path)  # the new files' folder entries are durable before index.json points at them
        step("folder synced")
    except OSError as exc:  # a full disk (ENOSPC), say: the new files go, the index in the folder stays as it was
        for f in (*files.values(), tmp.name):
            (path / f).unlink(missing_ok=True)
        raise OSError(exc.errno, f"cannot write the index to {path}: {exc.strerror or exc}; the index there "
                                 "is unchanged") from exc
    pause = env.TEST_PAUSE_BEFORE_COMMIT.get()
    if pause:
        print(f"linearrag: {PAUSE_ENV}: pausing {pause} s before replacing {path / 'index.json'}",
              file=sys.stderr, flush=True)
        time.sleep(float(pause))
    os.replace(tmp, path / "index.json")  # the commit point
    step("index.json replaced")
    fsync_dir(path)
    step("folder synced after the commit")
    for stale in sorted(path.iterdir()):  # data files of earlier versions, and leftovers of crashed writes
        if stale.name not in files.values() and stale.name != "index.json" and _is_ours(stale.name):
            stale.unlink(missing_ok=True)
            step(f"removed {stale.name}")
    step("end")


@dataclass
class RowBlocks:
    """A tensor written block by block (``write`` streams it: it never stands whole in memory): ``shape`` and
    ``dtype`` of the whole, and ``blocks()``, an iterable of its consecutive row blocks (tensors of that dtype whose
    rows add up to shape[0]). What the synthetic build at ten million passages writes its vectors as."""

    shape: tuple
    dtype: object
    blocks: object  # () -> iterable of torch.Tensor


# safetensors' dtype names, in the order of its Dtype enum: save_file lays tensors out by that order, descending,
# then by name (what _write_streaming reproduces, so that both write the same bytes: tests/index/test_storage.py)
_ST_DTYPES = ("BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64")


def _st_dtype(dtype) -> str:
    import torch

    names = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
             torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.float64: "F64",
             torch.int64: "I64"}
    if dtype not in names:
        raise TypeError(f"no safetensors name for {dtype}")
    return names[dtype]


def _write_streaming(tensors: dict, file: Path) -> None:
    """The safetensors file of ``tensors`` (name -> CPU tensor or RowBlocks) as save_file lays it out: an 8-byte
    little-endian header length, the JSON header padded with spaces to a multiple of 8, then each tensor's bytes in
    the header's order; a RowBlocks' blocks are written as they come (each checked against the declared size)."""
    import torch

    items = []
    for name, t in tensors.items():
        shape = tuple(int(n) for n in t.shape)
        dt = _st_dtype(t.dtype)
        itemsize = torch.empty((), dtype=t.dtype).element_size()
        items.append((name, t, shape, dt, itemsize * int(torch.Size(shape).numel())))
    items.sort(key=lambda it: (-_ST_DTYPES.index(it[3]), it[0]))
    header, at = {}, 0
    for name, _, shape, dt, nbytes in items:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [at, at + nbytes]}
        at += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = file.with_name(file.name + ".part")
    try:
        with open(tmp, "wb") as fh:
            fh.write(len(head).to_bytes(8, "little"))
            fh.write(head)
            for name, t, shape, dt, nbytes in items:
                done = 0
                for block in ([t] if isinstance(t, torch.Tensor) else t.blocks()):
                    block = block.detach().to("cpu").contiguous()
                    if block.dtype != t.dtype or tuple(block.shape[1:]) != shape[1:]:
                        raise ValueError(f"{name}: a block of {block.dtype} {tuple(block.shape)} in a {dt} {shape}")
                    data = block.view(torch.uint8).numpy() if block.numel() else b""
                    fh.write(data)
                    done += block.numel() * block.element_size()
                if done != nbytes:
                    raise ValueError(f"{name}: its blocks hold {done} bytes, its shape {shape} {nbytes}")
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


def _save_tensors(tensors: dict, file: Path) -> None:
    """safetensors' save_file (or, where a value is RowBlocks, the same layout written block by block: never the
    whole tensor in memory), whose I/O errors (a full disk, say) become the OSError they are: safetensors
    raises them as SafetensorError("... No space left on device (os error 28)"), which is no OSError."""
    if any(isinstance(t, RowBlocks) for t in tensors.values()):
        _write_streaming(tensors, file)
        return
    try:
        save_file(tensors, str(file))
    except SafetensorError as exc:
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(file)) from exc


def _stepper(path: Path):
    """The step hook of ``write``: a no-op, or (LINEARRAG_TEST_WRITE_STEP_PAUSE set) a function that prints
    the step's name to stderr and sleeps that many seconds."""
    pause = env.TEST_WRITE_STEP_PAUSE.get()
    if not pause:
        return lambda name: None

    def step(name: str) -> None:
        print(f"linearrag: {STEP_PAUSE_ENV}: {path}: {name}", file=sys.stderr, flush=True)
        time.sleep(float(pause))

    return step


@dataclass
class Stored:
    """What ``read`` found in a folder, checked against index.json, in the current layout."""

    meta_path: Path
    tensors_path: Path
    strings_path: Path
    counts: dict
    index_config: IndexConfig
    retrieval_config: RetrievalConfig
    tensors: dict
    strings: dict


def read(path: Path, verify: bool) -> Stored:
    """Read folder ``path``: index.json, the files it names (``verify``: their sizes and sha256), the
    tensors (required ones present, earlier layouts brought to the current one by upgrade.py) and the
    strings (lists of the right types). Anything else raises IndexFormatError naming the file."""
    if not path.is_dir():
        raise IndexFormatError(f"{path}: no such index folder")
    meta_path = path / "index.json"
    if not meta_path.is_file():
        raise IndexFormatError(f"{path}: not an index folder (no index.json)")
    meta = _read_json(meta_path)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IndexFormatError(f"{meta_path}: not a {FORMAT} file")
    version = meta.get("format_version")
    upgrade.check_version(version, meta_path)
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
            if sha256(f) != want.get("sha256"):
                raise IndexFormatError(f"{f}: checksum does not match index.json (corrupted file)")
    for name in ("passages", "sentences", "entities"):
        n = counts.get(name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise IndexFormatError(f"{meta_path}: invalid count of {name}: {n!r}")
    tensors_path, strings_path = path / files["tensors"], path / files["strings"]
    try:
        t = load_file(str(tensors_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise IndexFormatError(f"{tensors_path}: unreadable safetensors ({exc})") from None
    s = _read_json(strings_path)
    missing = [k for k in REQUIRED_TENSORS if k not in t]
    if missing:
        raise IndexFormatError(f"{tensors_path}: missing tensors {missing}")
    _check_strings(s, strings_path)
    t = upgrade.upgrade(version, t, tensors_path)
    return Stored(meta_path, tensors_path, strings_path, counts, index_config, retrieval_config, t, s)


def read_retrying(path: Path, read_once):
    """``read_once(path)``, started again (at most 5 times in all) when it fails while index.json changes
    under it: a writer replaced index.json and removed the files the first one named."""
    for attempt in range(5):
        before = _read_or_none(path / "index.json")
        try:
            return read_once(path)
        except IndexFormatError:
            if attempt == 4 or _read_or_none(path / "index.json") == before:
                raise
    raise AssertionError("unreachable")


def make_dirs(path: Path) -> None:
    """mkdir -p, making each created folder's entry durable (fsync of its parent)."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for m in reversed(missing):
        fsync_dir(m.parent)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fsync(path)
    except OSError:  # some filesystems refuse fsync on a directory
        pass


def _read_json(path: Path):
    """The JSON value in file ``path`` (IndexFormatError naming the file if it cannot be read or parsed)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"{path}: unreadable ({exc})") from None
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot read ({exc.strerror})") from None


def _read_or_none(path: Path):
    try:
        return path.read_bytes()
    except OSError:
        return None


def _check_strings(s, where: Path) -> None:
    """The strings file must hold lists of the right element types (anything else: IndexFormatError)."""
    if not isinstance(s, dict):
        raise IndexFormatError(f"{where}: expected a JSON object")
    for name in STRINGS:
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
