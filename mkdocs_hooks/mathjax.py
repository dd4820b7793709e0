"""MkDocs hook: the site serves MathJax itself, so its equations render without the network.

MathJax 3 comes from the pip package django-static-mathjax (in the ``docs`` extra: the MathJax release as
static files, no dependencies, Django not needed). Its browser build is added to the site under
``javascripts/mathjax/``, where mkdocs.yml's ``extra_javascript`` loads ``tex-mml-chtml.js`` (after the
settings in docs/javascripts/mathjax.js); the script finds its fonts and the extensions it loads on demand
beside itself.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

SITE_FOLDER = "javascripts/mathjax"
# the combined TeX/MathML-to-HTML build, its fonts, and what it may load later: TeX extensions (autoload),
# the menu's accessibility and speech parts
PARTS = ("tex-mml-chtml.js", "output/chtml", "input", "ui", "a11y", "sre")


def mathjax_root() -> Path:
    """The es5 folder of the installed MathJax (django-static-mathjax)."""
    spec = importlib.util.find_spec("mathjax")
    root = Path(spec.origin).parent / "static" / "mathjax" / "es5" if spec and spec.origin else None
    if root is None or not (root / PARTS[0]).is_file():
        raise PluginError("the docs render equations with a local MathJax: pip install -e \".[docs]\" "
                          "(django-static-mathjax)")
    return root


def on_files(files: Files, config) -> Files:
    root = mathjax_root()
    for part in PARTS:
        path = root / part
        for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            files.append(File.generated(config, f"{SITE_FOLDER}/{f.relative_to(root).as_posix()}",
                                        abs_src_path=str(f)))
    return files
