"""The optional parts and the extra that installs each (setup.py's EXTRAS): one line naming the pip command
when a part is used without it, instead of a ModuleNotFoundError from deep inside (or a traceback pages long)."""
from __future__ import annotations


class MissingExtra(ImportError):
    """An optional part used without its extra installed. An ImportError, so that code which tries an optional
    import (pytest.importorskip, ``except ImportError``) treats it as before; the command line prints its one
    line and exits 2."""


def install_hint(extra: str) -> str:
    return f'pip install -e ".[{extra}]" in a checkout, or pip install "linearrag_torch[{extra}]"'


def require(extra: str, *modules: str, what: str) -> None:
    """MissingExtra naming ``extra`` unless every module of ``modules`` imports. Imported, not looked up
    (importlib.util.find_spec): a package that is present but broken must fail here too, and a test can hide
    one with sys.modules[name] = None."""
    for name in modules:
        try:
            __import__(name)  # through builtins.__import__, as the import statement that follows goes
        except ImportError as exc:  # noqa: PERF203
            raise MissingExtra(f"{what} needs the '{extra}' extra ({name} cannot be imported): "
                               f"{install_hint(extra)}") from exc
