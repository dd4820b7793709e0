"""`linearrag delete INDEX_DIR --ids ID,...`: remove passages from an index."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import update_index


def add_parser(sub) -> None:
    r = sub.add_parser("delete", help="remove passages from an index",
                       description="Remove passages by id, with the sentences and entities no remaining passage has; "
                                   "the result answers like an index built without them. The folder is locked while "
                                   "it is updated and replaced atomically.")
    r.add_argument("index_dir", metavar="INDEX_DIR")
    # ids given without --ids (`linearrag delete INDEX 2`): caught here, to say how to give them
    r.add_argument("stray", nargs="*", metavar="ID", help=argparse.SUPPRESS)
    r.add_argument("--ids", metavar="ID,...", help="comma-separated passage ids")
    r.add_argument("--ids-file", metavar="FILE", help='one id per line, or JSON lines with an "id" field (a corpus file)')


def run(args) -> int:
    if args.stray:
        raise ValueError(f"the ids go after --ids: linearrag delete {args.index_dir} --ids {','.join(args.stray)} "
                         "(or --ids-file FILE)")
    ids = []
    if args.ids is not None:
        ids += [x.strip() for x in args.ids.split(",")]
        if any(not x for x in ids):
            raise ValueError(f"--ids {args.ids!r} holds an empty id")
    if args.ids_file:
        ids += _read_ids(Path(args.ids_file))
    if not ids:
        raise ValueError("no id given (--ids ID,... or --ids-file FILE)")
    return update_index(args.index_dir, "cpu", lambda rag: rag.delete(ids), "deleted", "from")


def _read_ids(path: Path) -> list:
    """Ids of an --ids-file: one per line (blank lines skipped), or JSON objects with an "id"."""
    from ..corpus import InputError, read_input  # deferred: --help imports this module

    raw = read_input(path, "a file of ids")
    ids = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        where = f"{path}, line {lineno}"
        try:
            text = line.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: not valid UTF-8 (byte {exc.start + 1} of the line)") from None
        if not text:
            continue
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict) or isinstance(obj.get("id"), bool) or not isinstance(obj.get("id"), (int, str)):
                raise InputError(f'{where}: expected an id, or a JSON object with an integer or string "id"')
            text = obj["id"]
        ids.append(text)
    return ids
