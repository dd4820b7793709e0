"""The package's layout: no import cycle between its modules, nor between its sub-packages (every import statement
read with ast, those at module level and those deferred into functions alike: a deferred import still ties the two
together; `if TYPE_CHECKING:` imports aside in the sub-package scan), nothing outside cli/ importing the command line
(the `__main__` entry points aside), no
private attribute set from outside, argparse only in the command-line package (cli/), at most ten modules
directly in linearrag_torch/, and no module over 600 lines."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "linearrag_torch"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE, parse=ast.parse) -> dict:
    """module -> the package's modules it imports (an import of a package's name counts as one of the package's
    __init__, ``from .x import y`` of submodule y as one of y). ``parse``: source text -> ast (default ast.parse)."""
    paths = {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}
    graph = {m: set() for m in paths}
    for mod, path in paths.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in paths:  # an attribute of a module: the module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_cycle_finder_finds_a_hand_made_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_scan_reads_relative_and_deferred_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph["linearrag_torch.api"]  # the scan sees the package
    assert cycles(graph) == []


def private_assignments(package: Path = PACKAGE) -> list:
    """(file:line, target) of every assignment to, or deletion of, a private attribute (``x._name``, not a dunder)
    of an object other than ``self`` or ``cls``."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            flat = []
            for t in targets:
                flat.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
            for t in flat:
                if (isinstance(t, ast.Attribute) and t.attr.startswith("_") and not t.attr.startswith("__")
                        and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))):
                    out.append((f"{path.relative_to(package.parent)}:{node.lineno}", ast.unparse(t)))
    return out


def test_the_scan_finds_a_private_attribute_set_from_outside(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f(rag, other):\n    rag._encoder, x = other, 1\n    self = rag\n    self._ok = 1\n"
                              "    del rag._nlp\n    rag.__dict__ = {}\n")
    assert private_assignments(pkg) == [("pkg/a.py:2", "rag._encoder"), ("pkg/a.py:5", "rag._nlp")]


def test_no_private_attribute_of_another_object_is_set_in_the_package():
    assert private_assignments() == []


CLI = PACKAGE / "cli"
ARGPARSE = re.compile(r"\bargparse\b|add_argument|ArgumentParser|add_subparsers")


def argparse_lines(package: Path = PACKAGE, cli: Path = CLI) -> list:
    """file:line of every line outside the command-line package ``cli`` that names argparse or builds a parser:
    the flags are made in one place, from the settings dataclasses."""
    out = []
    for path in sorted(package.rglob("*.py")):
        if cli in path.parents:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ARGPARSE.search(line):
                out.append(f"{path.relative_to(package.parent)}:{lineno}")
    return out


def test_the_argparse_scan_finds_a_parser_outside_cli(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "flags.py").write_text("import argparse\np = argparse.ArgumentParser()\n")
    (pkg / "settings.py").write_text("x = 1\n\ndef add(p):\n    p.add_argument('--x')\n")
    assert argparse_lines(pkg, pkg / "cli") == ["pkg/settings.py:4"]


def test_argparse_lives_only_in_the_cli_package():
    assert argparse_lines(PACKAGE, PACKAGE / "nowhere")  # the scan sees the parsers (in cli/)
    assert argparse_lines() == []


MAX_TOP_LEVEL_MODULES = 10


def top_level_modules(package: Path = PACKAGE) -> list:
    """The modules directly in the package (not __init__.py): the rest sit in subpackages by what they do."""
    return sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")


def test_the_module_count_sees_only_the_top_level(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/c.py"):
        (pkg / name).write_text("")
    assert top_level_modules(pkg) == ["a.py", "b.py"]


def test_at_most_ten_modules_sit_directly_in_the_package():
    modules = top_level_modules()
    assert "api.py" in modules and len(modules) <= MAX_TOP_LEVEL_MODULES, modules


MAX_MODULE_LINES = 600  # a module past this holds more than one thing


def test_no_module_is_over_600_lines():
    lines = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert lines["linearrag_torch/api.py"] > 100  # the scan reads the package
    assert {m: n for m, n in lines.items() if n > MAX_MODULE_LINES} == {}


# ------------------------------------------------------------------ arrows one way, by sub-package
def subpackage(module: str) -> str:
    """The part of the package a module belongs to: its sub-package (``linearrag_torch.retrieval.engine`` ->
    "retrieval") or, for a module directly in the package, itself ("api"); the package's __init__ is "<root>"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def entry_point(module: str) -> bool:
    """A ``__main__`` module: what ``python -m`` runs, above everything (it may call the command line)."""
    return module.rpartition(".")[2] == "__main__"


def without_type_checking(tree: ast.AST) -> ast.AST:
    """``tree`` with the bodies of ``if TYPE_CHECKING:`` blocks emptied: imports for annotations only."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return tree


def subpackage_graph(package: Path = PACKAGE) -> dict:
    """sub-package -> the sub-packages it imports (every import, deferred ones included, ``if TYPE_CHECKING:``
    aside; the ``__main__`` entry points left out), from ``import_graph``."""
    graph = import_graph(package, parse=lambda text: without_type_checking(ast.parse(text)))
    out: dict = {}
    for mod, targets in graph.items():
        if entry_point(mod):
            continue
        out.setdefault(subpackage(mod), set())
        for t in targets:
            if subpackage(t) != subpackage(mod):
                out[subpackage(mod)].add(subpackage(t))
    return out


def imports_of_cli(package: Path = PACKAGE) -> list:
    """Modules outside cli/ (its ``__main__`` entry points aside) that import a module of cli/."""
    graph = import_graph(package, parse=lambda text: without_type_checking(ast.parse(text)))
    return sorted(mod for mod, targets in graph.items()
                  if subpackage(mod) != "cli" and not entry_point(mod) and any(subpackage(t) == "cli" for t in targets))


def test_the_subpackage_scan_finds_a_deferred_cycle_and_a_use_of_the_command_line(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("cli", "models", "indexing"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "words.py").write_text("def count(n):\n    return str(n)\n")
    (pkg / "models" / "encoding.py").write_text("def f():\n    from ..indexing import build\n")  # deferred
    (pkg / "indexing" / "build.py").write_text("from ..models import encoding\nfrom ..cli.words import count\n")
    (pkg / "indexing" / "__main__.py").write_text("from ..cli import words\n")  # an entry point: allowed
    (pkg / "indexing" / "hints.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from ..cli import words\n")  # annotations only: allowed
    graph = subpackage_graph(pkg)
    assert cycles(graph) == [["indexing", "models"]]
    assert imports_of_cli(pkg) == ["pkg.indexing.build"]


def test_no_import_cycle_between_subpackages():
    """Counted by sub-package (deferred imports included), the package's parts import one another one way only:
    the command line on top, then the Python API, then the parts it assembles, with models/ below the parts that
    use the models (indexing/, retrieval/, rerank/)."""
    graph = subpackage_graph()
    assert {"cli", "api", "models", "indexing", "retrieval", "rerank"} <= set(graph)  # the scan sees the package
    assert "models" in graph["indexing"] and "api" in graph["cli"]
    assert cycles(graph) == []


def test_nothing_outside_the_command_line_imports_it():
    assert imports_of_cli() == []
