"""The README's quick start runs as written, and so do the examples.

The Python snippets run in order in one namespace, as a reader pasting them into one session would; the
`linearrag` commands of the quick start run in this process (cli.main), from a scratch folder. Both read the
bundled sample through its path, which the test points at the 60-passage cut of conftest (the supporting
passages of six bundled questions and their neighbours): the whole 300-passage sample would take minutes on two
CPU cores. A chat-model endpoint is a scripted one on 127.0.0.1 (tests/scripted_servers.py). Not run here: the
install lines, `linearrag demo` (test_cli), Ray (test_ray_build, test_ray_serve) and
sharding (test_sharded); a snippet whose extra is not installed is skipped. The server snippet runs in bash, as
written (slow: a server process).
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from conftest import write_jsonl, small_passages
from scripted_servers import ScriptedChatServer, running

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SAMPLE = "linearrag_torch/data/demo_corpus.jsonl"
RUN = {"index", "query", "answer", "--version"}  # the commands run here (with their arguments as written)
NOT_HERE = ("--ray", "--shards")  # a cluster or several processes: their own tests


def flagship_question(text: str) -> str:
    """The question of the README's first `linearrag query INDEX "QUESTION"` line: its example."""
    return next(argv[2] for argv in commands(text) if argv[0] == "query" and len(argv) > 2 and not argv[2].startswith("-"))


def python_snippets(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def commands(text: str) -> list[list[str]]:
    """The `linearrag ...` lines of the README's indented code blocks, split as a shell would."""
    out = []
    for line in re.findall(r"^    (linearrag .*)$", text, re.M):
        argv = shlex.split(line, comments=True)[1:]
        if argv and argv[0] in RUN and not any(flag in argv for flag in NOT_HERE):
            out.append(argv)
    return out


def missing_imports(code: str) -> list[str]:
    """Top-level packages the snippet imports that are not installed (its extra is absent)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    # the adapters import their framework when their module is imported
    extras = {"linearrag_torch.integrations.langchain": "langchain_core",
              "linearrag_torch.integrations.llamaindex": "llama_index",
              "linearrag_torch.integrations.haystack": "haystack",
              "linearrag_torch.answers.generation": "openai"}
    names |= {pkg for mod, pkg in extras.items() if mod in code}
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


FLAGSHIP = flagship_question(README)


@pytest.fixture
def readme_world(tmp_path, monkeypatch, small_corpus):
    """A scratch working folder, the sample path pointed at the small cut, and a scripted chat endpoint."""
    import linearrag_torch.data

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(linearrag_torch.data, "sample_corpus_path", lambda: Path(small_corpus))
    monkeypatch.setenv("LINEARRAG_LLM_CACHE", "off")
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")
    with running(ScriptedChatServer(lambda body: ("reply", "It says so.\nAnswer: Toronto"))) as chat:
        monkeypatch.setenv("LINEARRAG_LLM_BASE_URL", chat.base_url)
        monkeypatch.setenv("LINEARRAG_LLM_MODEL", "scripted")
        yield tmp_path, Path(small_corpus), chat


def test_the_readme_has_what_this_test_runs():
    assert len(python_snippets(README)) >= 3
    run = {argv[0] for argv in commands(README)}
    assert {"index", "query", "--version"} <= run, run


def two_commands(text: str) -> list[str]:
    """The shell commands (indented lines) of the README's "Two commands" section, in order."""
    section = re.search(r"^## Two commands\n(.*?)^## ", text, re.S | re.M).group(1)
    return re.findall(r"^    (\S.*)$", section, re.M)


def test_two_commands_install_what_the_tests_need_and_ci_runs_the_same():
    install, test = two_commands(README)[:2]
    # the first installs torch's wheel first, then the package with its test tools, and runs the main job
    assert install.startswith("pip install torch==") and re.search(r'pip install -e "\.\[test[,\]]', install), install
    assert install.endswith("linearrag demo"), install
    extras = re.search(r'"test": \[(.*?)\]', (ROOT / "setup.py").read_text()).group(1)
    assert "pytest" in extras and "hypothesis" in extras
    # the second runs the whole default suite, and CI runs exactly that line, after installing every extra
    assert test == "python -m pytest -q tests", test
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, ".ci/run must run the README's test command as written"
    assert any('pip install' in line and '".[test,all]"' in line for line in ci)
    assert any(line.strip() == "python -m pytest -q tests -m slow" for line in ci), "CI runs the longer run too"


def created_folders(text: str) -> set[str]:
    """The folders the README's commands and snippets create: `linearrag index CORPUS OUT`'s OUT and
    rag.save("...")'s argument."""
    out = {argv[2] for argv in (shlex.split(line, comments=True)[1:]
                                 for line in re.findall(r"^    (linearrag index .*)$", text, re.M)) if len(argv) >= 3}
    return out | set(re.findall(r'rag\.save\("([^"]+)"\)', text))


def test_the_folders_the_readme_creates_are_ignored_by_git():
    import shutil
    import subprocess

    folders = created_folders(README)
    assert {"demo_index", "ray_index"} <= folders, folders
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in sorted(folders) + ["update_demo"]:  # update_demo: examples/update_index.py's --out default
        proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", f"{name}/index.json"])
        assert proc.returncode == 0, f"{name}/ is not in .gitignore"


def test_readme_commands_run_as_written(readme_world, capsys):
    from linearrag_torch.cli import main

    _, small, chat = readme_world
    for argv in commands(README):
        argv = [str(small) if a == SAMPLE else str(ROOT / a) if a.startswith("linearrag_torch/data/") else a
                for a in argv]
        try:
            rc = main(argv)
        except SystemExit as exc:  # --version
            rc = exc.code
        out = capsys.readouterr()
        assert rc == 0, f"linearrag {shlex.join(argv)}: exit {rc}\n{out.err}"
        if argv[0] == "query":
            assert FLAGSHIP in out.out or '"hits"' in out.out, out.out
        if argv[0] == "answer":
            assert "A: Toronto" in out.out, out.out
        if argv[0] == "--version":
            assert re.fullmatch(r"linearrag \S+\n", out.out), out.out
    assert chat.chat_requests, "the answer command did not reach the chat endpoint"


def test_readme_python_snippets_run_as_written(readme_world):
    _, _, chat = readme_world
    namespace: dict = {"__name__": "__readme__"}
    ran, skipped = 0, []
    for i, code in enumerate(python_snippets(README), 1):
        missing = missing_imports(code)
        if missing:
            skipped.append((i, missing))
            continue
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                exec(compile(code, f"README.md python snippet {i}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"README python snippet {i} failed: {exc!r}\n{code}") from exc
        assert buf.getvalue().strip(), f"README python snippet {i} printed nothing"
        ran += 1
    assert (Path("demo_index") / "index.json").exists()
    assert ran >= 1
    if skipped:
        pytest.skip(f"ran {ran} snippets; skipped (extra not installed): {skipped}")


def test_examples_run_on_the_sample(small_index_dir, tmp_path, monkeypatch, capsys):
    """The examples the README links, on the small index (no build) and, for the update example, a 20-passage cut."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setattr(sys, "argv", ["search_and_explain.py", "--index", str(small_index_dir)])
    runpy.run_path(str(ROOT / "examples" / "search_and_explain.py"), run_name="__main__")
    assert "seeds:" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["recall_on_sample.py", "--index", str(small_index_dir)])
    runpy.run_path(str(ROOT / "examples" / "recall_on_sample.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert re.search(r"\d+ questions, 60 passages", out) and "recall@5" in out, out
    # each variant's questions moved against the defaults, and where the defaults were chosen (not on 40 questions)
    assert len(re.findall(r"\[\+\d+/-\d+ @2, \+\d+/-\d+ @5\]$", out, re.M)) == 4 and "docs/QUALITY.md" in out, out
    cut = write_jsonl(tmp_path / "cut.jsonl", small_passages()[:20])
    monkeypatch.setattr(sys, "argv", ["update_index.py", "--corpus", str(cut), "--out", str(tmp_path / "grown")])
    runpy.run_path(str(ROOT / "examples" / "update_index.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "top-5 lists identical" in out and (tmp_path / "grown" / "index.json").exists(), out


@pytest.mark.slow
def test_the_flagship_example_finds_its_second_hop_on_the_full_sample(tmp_path, capsys):
    """The README's example question, run as the README runs it on the whole bundled sample (300 passages: built
    here, ~2 minutes on two busy cores, hence slow): its printed top 3 holds both gold passages, the second hop's
    too, and the transcript of the README's first screen shows what this run prints."""
    from conftest import demo_questions

    from linearrag_torch.cli import main

    gold = next(q for q in demo_questions() if q["question"] == FLAGSHIP)  # a bundled question, with its gold
    folder = tmp_path / "demo_index"
    assert main(["index", str(ROOT / SAMPLE), str(folder), "--quiet", "--device", "cpu"]) == 0
    capsys.readouterr()
    argv = next(a for a in commands(README) if a[0] == "query" and FLAGSHIP in a)
    assert main(["query", str(folder), *argv[2:], "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    top = [int(i) for i in re.findall(r"^  \d+\. \[(\d+)\]", out, re.M)]
    assert len(top) == 3 and set(gold["supporting_ids"]) <= set(top), (gold["supporting_titles"], out)
    first_screen = README[:README.index("## Two commands")]
    for line in out.splitlines():
        printed = re.sub(r"score (\S+)", "score", line)
        assert any(re.sub(r"score (\S+)", "score", shown) == printed for shown in first_screen.splitlines()), line


def server_snippet(text: str) -> list[str]:
    """The shell lines of the README's **Server** block (continuation lines joined), in order."""
    block = re.search(r"^\*\*Server\*\*.*?\n\n((?:    .*\n)+)", text, re.M).group(1)
    return [line.strip() for line in re.sub(r"\\\n\s*", "", block).splitlines()]


def test_the_server_snippet_waits_for_health_before_searching():
    """`linearrag serve ... &` then a search at once is refused (the port is not open yet) or answered 503 (the
    index is loading): the snippet waits for GET /health to answer 200 (`curl -f` fails on a 503) first, and stops
    waiting when the server has exited (`kill -0 $!` fails: a bad folder, a port in use), not forever."""
    lines = server_snippet(README)
    serve = next(i for i, line in enumerate(lines) if line.startswith("linearrag serve") and line.endswith("&"))
    search = next(i for i, line in enumerate(lines) if "/v1/search" in line)
    wait = lines[serve + 1]
    assert serve < search and serve + 1 < search, lines
    assert re.match(r"until curl -s?f\S* localhost:(\d+)/health(\s*>\s*/dev/null)?; "
                    r"do kill -0 \$! (2>\s*/dev/null )?\|\| break; sleep \d+; done", wait), wait
    port = re.search(r"--port (\d+)", lines[serve]).group(1)
    assert f"localhost:{port}/health" in wait and f"localhost:{port}/v1/search" in lines[search]


def run_server_snippet(index_dir, cwd, timeout: float):
    """The README's server snippet run by bash as written, but on a free port, on ``index_dir``, with `linearrag` as
    this interpreter's module and `set -e`; the server is killed when the script ends."""
    import os
    import shutil
    import subprocess

    from test_serve import free_port

    if shutil.which("curl") is None:
        pytest.skip("no curl")
    script = "\n".join(line for line in server_snippet(README) if not line.startswith("pip "))
    script = (script.replace("8000", str(free_port())).replace("demo_index", shlex.quote(str(index_dir)))
              .replace("linearrag serve", f"{shlex.quote(sys.executable)} -m linearrag_torch.cli serve"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(["bash", "-c", "set -e\ntrap 'kill $! 2>/dev/null' EXIT\n" + script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_readme_server_snippet_stops_waiting_when_the_server_exits(tmp_path):
    """Issue 60: the wait loop waited forever for a server that had exited at start. Here the server is given a
    folder without an index, exits 2 at once, and the snippet ends within seconds (the search then fails)."""
    import time

    t0 = time.monotonic()
    proc = run_server_snippet(tmp_path / "no_index_here", tmp_path, timeout=60)
    assert proc.returncode != 0 and time.monotonic() - t0 < 30, proc.stdout + proc.stderr
    assert "no_index_here" in proc.stderr and "No such process" in proc.stderr, proc.stderr


def test_the_readme_server_snippet_runs_as_written(small_index_dir, tmp_path):
    """The snippet run by bash as written (the server on a free port, the 60-passage index, `linearrag` as this
    interpreter's module; the wait ends when the server has exited, and the run is bounded): the search's hits (the
    server's access log shares the output)."""
    proc = run_server_snippet(small_index_dir, tmp_path, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '{"results":[{"question":"Which country the composer' in proc.stdout, proc.stdout + proc.stderr
    assert '"title":"Thunder on the Hill"' in proc.stdout
