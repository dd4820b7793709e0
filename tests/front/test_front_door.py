"""What a new user meets first: `linearrag --version`, a `--help` that answers before torch loads, a missing
extra named in one line before any work, and `index --help` saying what its retrieval flags are for."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import linearrag_torch
from linearrag_torch.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"linearrag {linearrag_torch.__version__}\n"


@pytest.mark.parametrize("argv", [["--help"], ["index", "--help"], ["query", "--help"], ["serve", "--help"]])
def test_help_does_not_import_torch(argv):
    code = ("import sys\nfrom linearrag_torch.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'scipy', 'spacy', 'transformers', 'fastapi') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage: linearrag" in r.stdout


def test_the_package_names_load_on_first_use():
    assert set(linearrag_torch.__all__) <= set(dir(linearrag_torch))
    from linearrag_torch import Hit, LinearRAG, RetrievalConfig  # noqa: F401

    assert linearrag_torch.LinearRAG is LinearRAG
    with pytest.raises(AttributeError):
        linearrag_torch.NoSuchName  # noqa: B018


def test_answer_without_the_gen_extra_says_so_before_any_work(monkeypatch, capsys, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a))
    # the folder holds no index: reaching the index would be another error
    rc = main(["answer", str(tmp_path / "no_index"), "Where did Sylvia Burka's husband die?",
               "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-model", "m"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == "linearrag answer: error: answers need the 'gen' extra: pip install 'linearrag_torch[gen]'\n"


def test_index_help_says_the_retrieval_flags_are_stored(capsys):
    with pytest.raises(SystemExit):
        main(["index", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "retrieval settings stored with the index: not used to build it" in out
    assert "--ray" in out and "--embedding-dtype" in out
