"""Command line: `linearrag index | add | delete | convert | query | serve | mcp | answer | demo | train-reranker |
train-set-reader` (run
`linearrag COMMAND --help`). One module per command, each with its ``add_parser(sub)`` and ``run(args)``;
``flags.py`` makes the flags from the settings dataclasses (each field's help and default: config.py,
serve/settings.py, serve/ray_app.py), ``common.py`` holds what the commands (and distributed/) share."""
from __future__ import annotations

import argparse
import sys

from .. import __version__, env


def commands() -> dict:
    """command -> its module, in the order `linearrag --help` lists them (imported here, not with the package:
    distributed/ imports common.py without the commands)."""
    from . import (add, answer, convert, delete, demo, index, mcp, query, serve, train_reranker,  # deferred: see above
                   train_set_reader)

    return {"index": index, "add": add, "delete": delete, "convert": convert, "query": query, "serve": serve,
            "mcp": mcp, "answer": answer, "demo": demo, "train-reranker": train_reranker,
            "train-set-reader": train_set_reader}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="linearrag",
        description="LinearRAG graph retrieval (entities, sentences, passages; activation + PageRank) on torch.",
    )
    top.add_argument("--version", action="version", version=f"linearrag {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in commands().values():
        module.add_parser(sub)
    return top


def main(argv=None) -> int:
    env.offline_by_default()
    args = parser().parse_args(argv)
    # deferred: imported after parsing, so that --help (which exits in parse_args) loads none of them
    from ..corpus import InputError
    from ..extras import MissingExtra
    from ..retrieval.memory import keep_freed_memory

    keep_freed_memory()  # this process is ours: reuse freed memory instead of faulting it in again
    from ..index import IndexFormatError  # deferred (both): import torch
    from ..models.reranker import RerankerLoadError

    try:
        return commands()[args.command].run(args)
    except (InputError, IndexFormatError, RerankerLoadError, MissingExtra, ValueError, FileNotFoundError, OSError) as exc:
        print(f"linearrag {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
