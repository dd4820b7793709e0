"""The package's layout: no import cycle between its modules (every import statement read with ast, those at
module level and those deferred into functions alike: a deferred import still ties the two modules together), no
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


def import_graph(package: Path = PACKAGE) -> dict:
    """module -> the package's modules it imports (an import of a package's name counts as one of the package's
    __init__, ``from .x import y`` of submodule y as one of y)."""
    paths = {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}
    graph = {m: set() for m in paths}
    for mod, path in paths.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
