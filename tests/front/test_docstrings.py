"""The public API's docstrings (issue 38): numpy sections, no measured figures or dates, examples that run.

- Every public callable of the API reference (``public_objects``) that takes parameters has a numpy
  "Parameters" section naming each of them, and one that returns something a "Returns" (or "Yields") section;
  a class documents its constructor's parameters in its own docstring (or its ``__init__``'s) and has an
  "Examples" section. The settings dataclasses list their important fields only: every field's help text
  lives in its metadata (config.py), rendered by mkdocs_hooks/settings_table.py.
- No docstring anywhere in the package quotes a date or a timing figure: measured figures live in docs/ and
  benchmarks/results/, and a docstring points there (``FIGURE_PATTERNS``).
- The ``>>>`` examples run as written, on the tiny corpus of ``LinearRAG``'s own example: its methods' examples,
  the settings', the adapters' (when their extra is installed) and the kernels'. Those marked ``+SKIP`` (a bundled
  sample build of minutes, a server, a chat model, worker processes) are not run.

Each check is a function applied to hand-made objects first, so that it is seen to fail.
"""
from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "linearrag_torch"

# a date (2026-12-03) or a measured figure: "3.2 ms per question", "10.2 against 13.5 ms", "5.8x slower",
# "1.4x as long", "13% less", "took 37 ms", "17-20 s instead of 10-15 s", "R@2 74.0", "recall@5 66.8"
FIGURE_PATTERNS = {
    "date": r"\b20\d\d-\d\d\b",
    "timing": r"\b\d+(?:\.\d+)?\s?(?:ms|s|us|µs)\s+(?:(?:per|against|instead\s+of)\b|for\s+\d)",
    "comparison": r"\b\d+(?:\.\d+)?\s+against\s+\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:ms|s|us|µs)\b",
    "speed-up": r"\b\d+(?:\.\d+)?x\s+(?:faster|slower|as\s+long|as\s+fast|less|more)\b",
    "share": r"\b\d+(?:\.\d+)?\s?%\s+(?:less|more|faster|slower)\b",
    "took": r"\b(?:took|takes|cost|costs|measured)\s+~?\d+(?:\.\d+)?\s?(?:ms|s|us|µs)\b",
    "recall": r"\b(?:R|recall)@\d+\s+(?:of\s+)?\d+(?:\.\d+)?\b",
    "cosine": r"\bcosines?\s+(?:of\s+)?~?\d?\.\d+",
    "machine": r"\b\d+-vCPU\b|\bAMD\s+EPYC\b",
    "time-share": r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?%\s+of\s+the\b",
    "op-count": r"~\d[\d,.]*\s+(?:small\s+)?(?:ops|operations|torch\s+calls|kernel\s+launches)\b",
}
FIGURE_RE = re.compile("|".join(f"(?P<{name.replace('-', '_')}>{p})" for name, p in FIGURE_PATTERNS.items()),
                       re.IGNORECASE)


# ------------------------------------------------------------------ the checks
def figures(text: str) -> list[str]:
    """The dates and measured figures quoted in ``text``."""
    return [m.group(0) for m in FIGURE_RE.finditer(text)]


def section(doc: str, title: str) -> str | None:
    """The body of numpy section ``title`` ("Parameters", "Returns", ...) of a cleaned docstring, or None."""
    m = re.search(rf"^{title}\n-{{{len(title)}}}\n(.*?)(?=^\S[^\n]*\n-{{3,}}\n|\Z)", doc, re.M | re.S)
    return None if m is None else m.group(1)


def documented_names(body: str) -> set[str]:
    """The parameter names a numpy Parameters section lists ("name : type", "a, b : int", "**overrides")."""
    names = set()
    for line in body.splitlines():
        if line and not line[0].isspace():
            head = line.split(" : ")[0]
            names |= {n.strip().lstrip("*") for n in head.split(",")}
    return names


def _own_source(fn) -> ast.AST | None:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    return tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _walk_own(node):
    """The nodes of a function's body, not those of the functions and classes defined inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield child
        yield from _walk_own(child)


def returns_value(fn) -> tuple[bool, bool]:
    """(returns a value, is a generator yielding values) of a function: from its return annotation when it has
    one, else from its source (a ``return <value>`` / ``yield <value>`` of its own)."""
    fn = inspect.unwrap(fn)
    node = _own_source(fn)
    own = list(_walk_own(node)) if node is not None else []
    yields = any(isinstance(n, (ast.Yield, ast.YieldFrom)) and getattr(n, "value", None) is not None for n in own)
    ann = inspect.signature(fn).return_annotation
    if ann is not inspect.Signature.empty:
        return ann not in (None, "None") and not yields, yields
    returns = any(isinstance(n, ast.Return) and n.value is not None
                  and not (isinstance(n.value, ast.Constant) and n.value.value is None) for n in own)
    return returns, yields


def parameters(fn) -> list[str]:
    return [n for n in inspect.signature(fn).parameters if n not in ("self", "cls")]


def missing_sections(name: str, fn, doc: str | None = None) -> list[str]:
    """What the numpy docstring of callable ``fn`` lacks: a Parameters section naming every parameter, a Returns
    (or Yields) section when it returns a value. ``doc``: the docstring to check (default fn's)."""
    doc = inspect.cleandoc(doc if doc is not None else (fn.__doc__ or ""))
    if not doc:
        return [f"{name}: no docstring"]
    problems = []
    params = parameters(fn)
    if params:
        body = section(doc, "Parameters")
        if body is None:
            problems.append(f"{name}: no 'Parameters' section (parameters {params})")
        else:
            undocumented = [p for p in params if p not in documented_names(body)]
            if undocumented:
                problems.append(f"{name}: Parameters does not name {undocumented}")
    returns, yields = returns_value(fn)
    if returns and section(doc, "Returns") is None:
        problems.append(f"{name}: no 'Returns' section")
    if yields and section(doc, "Yields") is None:
        problems.append(f"{name}: no 'Yields' section")
    return problems


def class_problems(name: str, cls, document_params: bool = True) -> list[str]:
    """A class: a docstring, and its constructor's parameters in a Parameters section of the class docstring
    (numpy's place for them) or of ``__init__``'s. ``document_params=False``: only that a Parameters section
    exists (a settings dataclass, whose fields carry their own help)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    if not doc:
        return [f"{name}: no docstring"]
    init = cls.__dict__.get("__init__")
    params = parameters(init) if init is not None else list(getattr(cls, "__annotations__", {}))
    params = [p for p in params if not p.startswith("_") and p not in ("args", "kwargs")]
    if not params:
        return []
    body = section(doc, "Parameters")
    if body is None and init is not None and init.__doc__:
        body = section(inspect.cleandoc(init.__doc__), "Parameters")
    if body is None and hasattr(cls, "_fields"):  # a NamedTuple: its fields are its attributes (as griffe reads them)
        body = section(doc, "Attributes")
    if body is None:
        return [f"{name}: no 'Parameters' section for the constructor's {params}"]
    undocumented = [p for p in params if p not in documented_names(body)]
    return [f"{name}: Parameters does not name {undocumented}"] if document_params and undocumented else []


# ------------------------------------------------------------------ the checks fail where they should
def test_the_figure_check_finds_dates_and_measured_figures():
    for text in ("measured 5.8x slower than float32", "2.1 ms per question in a batch of 256", "on 2026-12-03",
                 "its encoder stage 10.2 against 13.5 ms", "1.4x as long", "costs 13% less", "took 37 ms",
                 "17-20 s instead of 10-15 s", "R@2 74.0 on hotpotqa", "recall@5 66.8 -> 69.5",
                 "4.5 s for 100k passages", "5x\n    faster than gathering", "vectors within cosine ~0.99 of the exact",
                 "MiniLM's vectors fall to cosine 0.98", "on a 2-vCPU AMD EPYC with AVX2 only", "9-20% of the engine's time",
                 "a question's ~2,000 small ops", "1.2-1.3x faster"):
        assert figures(text), text
    for text in ("at least 0.1 s x 2^attempt", "up to 60 s", "~1e-7 per component", "recall@N and beyond",
                 "eq. 7", "top_k=5", "a 2-core CPU", "docs/tuning.md, 'Question throughput'", "1,024 questions",
                 "the cosine of the question", "an AMD CPU"):
        assert not figures(text), text


def _undocumented(a, b=1):
    """Adds.

    Returns
    -------
    int
        The sum.
    """
    return a + b


def _no_returns(a):
    """Adds one.

    Parameters
    ----------
    a : int
        A number.
    """
    return a + 1


def _complete(a, *, b=1, **overrides):
    """Adds.

    Parameters
    ----------
    a, b : int
        Numbers.
    **overrides
        Ignored.

    Returns
    -------
    int
        The sum.
    """
    return a + b


def _partial(a, b):
    """Adds.

    Parameters
    ----------
    a : int
        A number.

    Returns
    -------
    int
    """
    return a + b


def _returns_none(a) -> None:
    """Nothing.

    Parameters
    ----------
    a : int
        Ignored.
    """
    def inner():
        return 1  # another function's return

    inner()


def _generator(n):
    """Counts.

    Parameters
    ----------
    n : int
        How far.
    """
    yield from range(n)


class _Undocumented:
    """A class."""

    def __init__(self, a):
        self.a = a


class _Documented:
    """A class.

    Parameters
    ----------
    a : int
        A number.
    """

    def __init__(self, a):
        self.a = a


def test_the_section_check_fails_without_parameters_or_returns():
    assert any("no 'Parameters'" in p for p in missing_sections("f", _undocumented))
    assert any("no 'Returns'" in p for p in missing_sections("f", _no_returns))
    assert any("does not name ['b']" in p for p in missing_sections("f", _partial))
    assert any("no 'Yields'" in p for p in missing_sections("f", _generator))
    assert missing_sections("f", lambda: None, doc="") == ["f: no docstring"]
    assert missing_sections("f", _complete) == []
    assert missing_sections("f", _returns_none) == []
    assert any("no 'Parameters'" in p for p in class_problems("C", _Undocumented))
    assert class_problems("C", _Documented) == []


# ------------------------------------------------------------------ the package
def public_objects() -> list[tuple[str, object]]:
    """(name, object) of the public API whose docstrings must be numpy-style: LinearRAG and its public methods,
    the settings, SearchClient, the adapters (those whose extra is installed), the kernels' entry points and the
    package's exported functions."""
    import linearrag_torch
    from linearrag_torch import kernels
    from linearrag_torch.kernels import backends

    out = [(f"linearrag_torch.{n}", getattr(linearrag_torch, n))
           for n in ("LinearRAG", "RetrievalConfig", "IndexConfig", "resolve_device", "read_corpus", "TriGraphIndex",
                     "EncodedQueries", "Retrieved")]
    out.append(("linearrag_torch.client.SearchClient", importlib.import_module("linearrag_torch.client").SearchClient))
    out.append(("linearrag_torch.integrations.HitSource",
                importlib.import_module("linearrag_torch.integrations").HitSource))
    for module in ("langchain", "llamaindex", "haystack"):
        try:
            mod = importlib.import_module(f"linearrag_torch.integrations.{module}")
        except ImportError:
            continue
        out.append((f"linearrag_torch.integrations.{module}.LinearRAGRetriever", mod.LinearRAGRetriever))
    out += [(f"linearrag_torch.kernels.{n}", getattr(kernels, n)) for n in kernels.__all__ if n != "backends"]
    out += [(f"linearrag_torch.kernels.backends.{n}", f) for n, f in vars(backends).items()
            if inspect.isfunction(f) and f.__module__ == backends.__name__ and not n.startswith("_")]
    return out


FRAMEWORK_HOOKS = {"model_post_init", "model_config"}  # pydantic's, on the LangChain retriever
SETTINGS = ("linearrag_torch.RetrievalConfig", "linearrag_torch.IndexConfig")  # fields with their own help text


def members(cls) -> list[tuple[str, object]]:
    """The public methods and properties a class defines itself or takes from the package's own base classes
    (LinearRAG's models.holder.QuestionModels), the class's first, each in source order."""
    out, seen = [], set()
    own = [c for c in cls.__mro__ if c.__module__.startswith("linearrag_torch")] or [cls]
    for name, value in ((n, v) for c in own for n, v in vars(c).items()):
        if name.startswith("_") or name in FRAMEWORK_HOOKS or name in seen:
            continue
        seen.add(name)
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out.append((name, value))
    return out


def test_the_public_api_has_numpy_parameters_and_returns():
    problems = []
    for name, obj in public_objects():
        if inspect.isclass(obj):
            problems += class_problems(name, obj, document_params=name not in SETTINGS)
            if section(inspect.cleandoc(obj.__doc__ or ""), "Examples") is None:
                problems.append(f"{name}: no 'Examples' section")
            for member, value in members(obj):
                if isinstance(value, property):
                    if not (value.__doc__ or "").strip():
                        problems.append(f"{name}.{member}: a property without a docstring")
                else:
                    problems += missing_sections(f"{name}.{member}", value)
        else:
            problems += missing_sections(name, obj)
    assert not problems, "\n".join(problems)


def test_every_exported_name_has_numpy_sections():
    """Every name ``from linearrag_torch import ...`` gives (its ``__all__``): a class its constructor's parameters in
    a Parameters section and each public method's Parameters / Returns, a function its own (the Examples sections
    are held for the main objects above)."""
    import linearrag_torch

    problems = []
    for name in linearrag_torch.__all__:
        obj = getattr(linearrag_torch, name)
        full = f"linearrag_torch.{name}"
        if inspect.isclass(obj):
            problems += class_problems(full, obj, document_params=full not in SETTINGS)
            if issubclass(obj, Exception):
                continue
            for member, value in members(obj):
                if isinstance(value, property):
                    if not (value.__doc__ or "").strip():
                        problems.append(f"{full}.{member}: a property without a docstring")
                else:
                    problems += missing_sections(f"{full}.{member}", value)
        else:
            problems += missing_sections(full, obj)
    assert len(linearrag_torch.__all__) >= 10 and "TriGraphIndex" in linearrag_torch.__all__
    assert not problems, "\n".join(problems)


def docstrings(path: Path):
    """(line, docstring) of a module, its classes and its functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield (node.body[0].lineno, doc)


def messages(path: Path):
    """(line, text) of every string constant of a module that is not a docstring: help texts, warnings and error
    messages (an f-string's literal parts one by one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docs and id(n) not in parts]
    # implicitly joined literals are one constant already; an f-string's parts are joined back for the check
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            yield node.lineno, text
    for n in strings:
        yield n.lineno, n.value


def test_the_message_scan_reads_help_texts_warnings_and_f_strings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""A module."""\nimport warnings\n\n\ndef f(p, x):\n    """Nothing measured."""\n'
                      '    p.add_argument("--q", help="int8 vectors within cosine ~0.99 of the exact ones")\n'
                      '    warnings.warn(f"{x}: emulated, measured 5.8x slower")\n    return "fine"\n')
    found = sorted((line, figures(text)) for line, text in messages(module) if figures(text))
    assert found == [(7, ["cosine ~0.99"]), (8, ["5.8x slower"])], found


def test_no_message_quotes_a_measured_figure():
    """Help texts, warnings and errors point to the doc that holds a figure, as docstrings do."""
    found = [f"{path.relative_to(ROOT)}:{line}: {', '.join(figures(text))}"
             for path in sorted(PACKAGE.rglob("*.py")) for line, text in messages(path) if figures(text)]
    assert not found, "figures belong in docs/ or benchmarks/results/, with a pointer here:\n" + "\n".join(found)


def test_no_docstring_quotes_a_date_or_a_measured_figure():
    found = [f"{path.relative_to(ROOT)}:{line}: {', '.join(figures(doc))}"
             for path in sorted(PACKAGE.rglob("*.py")) for line, doc in docstrings(path) if figures(doc)]
    assert not found, "figures belong in docs/ or benchmarks/results/, with a pointer here:\n" + "\n".join(found)


# ------------------------------------------------------------------ the examples run
def run_examples(objects, globs: dict) -> list[str]:
    """Run the ``>>>`` examples of ``objects`` [(name, object)] in order, in one namespace; the failures' reports."""
    parser = doctest.DocTestParser()
    reports = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for name, obj in objects:
        doc = inspect.getdoc(obj.fget if isinstance(obj, property) else obj) or ""
        test = parser.get_doctest(doc, globs, name, None, 0)
        if test.examples:
            test.globs = globs  # shared: a method's example continues its class's
            runner.run(test, out=reports.append, clear_globs=False)
    return reports


def with_members(name, obj):
    out = [(name, obj)]
    if inspect.isclass(obj):
        out += [(f"{name}.{m}", v) for m, v in members(obj)]
    return out


def test_run_examples_reports_a_wrong_example():
    def wrong():
        """>>> 1 + 1
        3
        """
    assert run_examples([("wrong", wrong)], {}) and not run_examples([("right", _Documented)], {})


def test_the_examples_run_on_the_tiny_corpus(monkeypatch, nlp, encoder):
    """LinearRAG's example first (it builds ``rag``), then its methods', the settings', the adapters' and the
    kernels'; the session's models stand in for the ones a build loads (the same models, loaded once)."""
    from linearrag_torch import models

    monkeypatch.setattr(models, "load_nlp", lambda cfg: nlp)
    monkeypatch.setattr(models, "load_encoder", lambda cfg, device, **kw: encoder)
    objects = [x for name, obj in public_objects() for x in with_members(name, obj)]
    globs: dict = {}
    reports = run_examples(objects, globs)
    assert not reports, "\n".join(reports)
    # the examples did run: LinearRAG's, its methods' and the kernels'
    assert type(globs.get("rag")).__name__ == "LinearRAG" and {"encoded", "top", "indices"} <= set(globs)
