"""Reading a corpus and a question set from JSON-lines files, with errors that name file and line.

corpus.jsonl     one passage per line: {"text": str, "id": int | str (optional), "title": str (optional)}
questions.jsonl  one question per line: {"question": str, "id": int | str (optional), ...other fields kept}
A missing "id" defaults to the 0-based position of the line (for a file added to an index: the index's
passage count + that position). Blank lines are allowed only at the end. Two passages may have the
same text (they stay two passages), never the same id.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple, Union

PassageId = Union[int, str]


class Hit(NamedTuple):
    """A passage as a search returns it (LinearRAG.search, the sharded engine, the HTTP client, the adapters).

    Attributes
    ----------
    id : int or str
        The passage's corpus id.
    score : float
        Its score in the ranking (higher is better; a later round's on that round's own scale).
    title, text : str
        The passage's title ("" without one) and text.
    row : int
        Its position in the index (``TriGraphIndex`` rows); -1 where a server's reply does not say.
    """

    id: object  # the corpus id
    score: float
    title: str
    text: str
    row: int  # position in the index


class InputError(ValueError):
    """A bad input file or field; the message names the file and the 1-based line number."""


@dataclass(frozen=True)
class Passage:
    """A passage of a corpus, as ``read_corpus`` reads it.

    Parameters
    ----------
    id : int or str
        Its corpus id (unique in the corpus).
    title : str
        Its title ("" without one).
    text : str
        Its text.
    """

    id: PassageId
    title: str
    text: str


def read_corpus(path, first_id: int = 0) -> list[Passage]:
    """The passages of a JSON-lines corpus, in file order.

    One passage per line: {"text": str, "id": int | str (optional), "title": str (optional)}; blank lines
    only at the end.

    Parameters
    ----------
    path : str or os.PathLike
        The JSONL file.
    first_id : int, default 0
        The default id of the first line (an index's passage count when adding to it, so that a file without
        ids continues the numbering of a corpus without ids).

    Returns
    -------
    list of Passage
        (id, title, text) per line.

    Raises
    ------
    InputError
        A bad line, field or repeated id, naming the file and the 1-based line.

    Examples
    --------
    >>> from linearrag_torch import read_corpus
    >>> from linearrag_torch.data import sample_corpus_path
    >>> passages = read_corpus(sample_corpus_path())
    >>> len(passages), sorted(vars(passages[0]))
    (300, ['id', 'text', 'title'])
    """
    path = Path(path)
    passages: list[Passage] = []
    seen: dict[str, int] = {}
    for position, (lineno, obj) in enumerate(_read_jsonl(path)):
        where = f"{path}, line {lineno}"
        if "text" not in obj:
            raise InputError(f'{where}: missing field "text"')
        text = obj["text"]
        if not isinstance(text, str):
            raise InputError(f'{where}: "text" must be a string, got {_json_type(text)}')
        title = obj.get("title", "")
        if not isinstance(title, str):
            raise InputError(f'{where}: "title" must be a string, got {_json_type(title)}')
        pid = _get_id(obj, first_id + position, where)
        for name, value in (("text", text), ("title", title), ("id", pid)):
            _check_encodable(value, name, where)
        _check_unique(pid, lineno, seen, path)
        passages.append(Passage(pid, title, text))
    if not passages:
        raise InputError(f"{path}: the corpus holds no passages")
    return passages


def as_passages(items, first_id: int = 0) -> list[Passage]:
    """Passage objects, or dicts with "text" and optional "id" (default: ``first_id`` + position) and
    "title", checked like the lines of a corpus file (errors name the 0-based position)."""
    out: list[Passage] = []
    for i, item in enumerate(items):
        where = f"passage {i}"
        if isinstance(item, Passage):
            pid, title, text = item.id, item.title, item.text
        elif isinstance(item, dict):
            if "text" not in item:
                raise InputError(f'{where}: missing field "text"')
            pid, title, text = item.get("id", first_id + i), item.get("title") or "", item["text"]
        else:
            raise InputError(f"{where}: expected a Passage or a dict, got {type(item).__name__}")
        if not isinstance(text, str):
            raise InputError(f'{where}: "text" must be a string, got {_json_type(text)}')
        if not isinstance(title, str):
            raise InputError(f'{where}: "title" must be a string, got {_json_type(title)}')
        if isinstance(pid, bool) or not isinstance(pid, (int, str)):
            raise InputError(f'{where}: "id" must be an integer or a string, got {_json_type(pid)}')
        for name, value in (("text", text), ("title", title), ("id", pid)):
            _check_encodable(value, name, where)
        out.append(Passage(pid, title, text))
    return out


def check_new_ids(passages, existing_ids=(), source=None) -> None:
    """Raise InputError unless every passage id is new: not repeated among ``passages`` and not in
    ``existing_ids`` (an index's). 7 and "7" are the same id. The message names the id and, for a
    file ``source``, its line (passage i is on line i + 1: blank lines are only allowed at the end)."""
    existing = {str(x) for x in existing_ids}
    seen: dict[str, int] = {}
    for i, p in enumerate(passages):
        where = f"{source}, line {i + 1}" if source is not None else f"passage {i}"
        key = str(p.id)
        if key in existing:
            raise InputError(f"{where}: duplicate id {p.id!r} (already in the index)")
        if key in seen:
            first = f"line {seen[key] + 1}" if source is not None else f"passage {seen[key]}"
            raise InputError(f"{where}: duplicate id {p.id!r} (first used at {first})")
        seen[key] = i


def read_questions(path) -> list[dict]:
    """The questions of a JSON-lines file as dicts (all fields kept, "id" filled in), in file order."""
    path = Path(path)
    questions: list[dict] = []
    seen: dict[str, int] = {}
    for position, (lineno, obj) in enumerate(_read_jsonl(path)):
        where = f"{path}, line {lineno}"
        if "question" not in obj:
            raise InputError(f'{where}: missing field "question"')
        q = obj["question"]
        if not isinstance(q, str):
            raise InputError(f'{where}: "question" must be a string, got {_json_type(q)}')
        if not q.strip():
            raise InputError(f'{where}: "question" is empty')
        qid = _get_id(obj, position, where)
        _check_unique(qid, lineno, seen, path)
        questions.append({**obj, "id": qid})
    if not questions:
        raise InputError(f"{path}: the file holds no questions")
    return questions


def check_question(q: str) -> str:
    """Return ``q`` unchanged; raise ValueError("empty question") when it is empty or blank."""
    if not isinstance(q, str):
        raise TypeError(f"a question must be a string, got {type(q).__name__}")
    if not q.strip():
        raise ValueError("empty question")
    return q


# ---------------------------------------------------------------- helpers
def read_input(path: Path, expected: str) -> bytes:
    """The bytes of an input file, or InputError naming the path (``expected``: what a folder should have been)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected {expected}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, JSON object) for every line; blank lines only at the end."""
    raw = read_input(path, "a JSON-lines file")
    if raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark
        raw = raw[3:]
    lines = raw.split(b"\n")
    last = len(lines)
    while last and not lines[last - 1].strip():
        last -= 1
    for i in range(last):
        lineno = i + 1
        where = f"{path}, line {lineno}"
        try:
            line = lines[i].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: not valid UTF-8 (byte {exc.start + 1} of the line)") from None
        if not line.strip():
            raise InputError(f"{where}: blank line (blank lines are only allowed at the end of the file)")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {_json_type(obj)}")
        yield lineno, obj


def _get_id(obj: dict, position: int, where: str) -> PassageId:
    if "id" not in obj:
        return position
    pid = obj["id"]
    if isinstance(pid, bool) or not isinstance(pid, (int, str)):
        raise InputError(f'{where}: "id" must be an integer or a string, got {_json_type(pid)}')
    return pid


def _check_encodable(value, name: str, where: str) -> None:
    """Strings must be valid Unicode: JSON escapes can make lone surrogates (\\ud800) no file can hold."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(
                f'{where}: "{name}" is not valid Unicode (lone surrogate {value[exc.start]!r} at character {exc.start + 1})'
            ) from None


def _check_unique(pid: PassageId, lineno: int, seen: dict, path: Path) -> None:
    """Ids must be unique; 7 and "7" count as the same id (they print the same in any output)."""
    key = str(pid)
    if key in seen:
        raise InputError(f"{path}, line {lineno}: duplicate id {pid!r} (first used on line {seen[key]})")
    seen[key] = lineno


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def is_path(corpus) -> bool:
    return isinstance(corpus, (str, bytes)) or hasattr(corpus, "__fspath__")


def read_passages(corpus, first_id: int = 0, existing_ids=()) -> list[Passage]:
    """The passages of ``corpus`` (a JSONL path, or a list of Passage / dicts), their ids checked new: not
    repeated and not in ``existing_ids`` (check_new_ids: InputError naming the file's line). The one
    check of the ids on the way into an index: callers pass ``ids_checked=True`` to build.add_passages."""
    passages = read_corpus(corpus, first_id=first_id) if is_path(corpus) else as_passages(corpus, first_id=first_id)
    check_new_ids(passages, existing_ids, source=corpus if is_path(corpus) else None)
    return passages
