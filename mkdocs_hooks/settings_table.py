"""MkDocs hook: the table of every field of a settings dataclass, from the help text each field carries.

A page writes ``<!-- settings-table: RetrievalConfig -->`` (a dataclass of ``linearrag_torch.config``) and gets a
table of its fields: name, default, and the help text that `linearrag index / query --help` prints too. The
help lives once, in the field's metadata (config.py); the API reference renders it from there, so that the
class docstrings need not repeat every field.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"<!-- settings-table: (\w+) -->")


def on_config(config):
    root = str(Path(config.config_file_path).resolve().parent)  # this checkout's package, not another install's
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def settings_table(name: str, where: str) -> str:
    """The markdown table of the fields of ``linearrag_torch.config.<name>``."""
    cls = getattr(importlib.import_module("linearrag_torch.config"), name, None)
    if cls is None or not dataclasses.is_dataclass(cls):
        raise PluginError(f"{where}: settings-table: linearrag_torch.config has no settings dataclass {name!r}")
    rows = ["| field | default | what it sets |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = ",".join(f.default) if isinstance(f.default, tuple) else f.default
        text = f.metadata.get("help")
        if not text:
            raise PluginError(f"{where}: settings-table: {name}.{f.name} has no help text (config.py)")
        rows.append(f"| `{f.name}` | `{default!r}` | {text.replace('|', '&#124;')} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: settings_table(m.group(1), page.file.src_uri), markdown)
