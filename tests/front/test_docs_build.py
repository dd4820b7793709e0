"""The documentation build CI runs (.ci/build-docs: `mkdocs build --strict`, no --quiet, and no WARNING line) can
fail: a copy of the site with a planted broken link fails it, the same copy without the plant passes (two
builds of the site: slow, conftest.SLOW_TESTS). CI builds the real site with the same script."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "build-docs"

needs_docs_tools = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason='the docs extra is not installed (pip install -e ".[docs]")')


def site_copy(dest: Path) -> Path:
    """The site's sources (mkdocs.yml, docs/, the hooks) copied into ``dest``, the package linked beside them for
    the API reference; the copy's mkdocs.yml."""
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copytree(ROOT / "mkdocs_hooks", dest / "mkdocs_hooks")
    (dest / "linearrag_torch").symlink_to(ROOT / "linearrag_torch", target_is_directory=True)
    return dest / "mkdocs.yml"


def build(config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(["bash", str(SCRIPT), str(config)], cwd=config.parent, env=env, capture_output=True,
                          text=True, timeout=300)


def test_ci_builds_the_docs_with_the_script_that_fails_on_warnings():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".ci/build-docs" in [line.strip() for line in ci]
    script = SCRIPT.read_text()
    assert "mkdocs build --strict" in script and "grep -qE '^(WARNING|ERROR)'" in script
    # no flag or `|| true` that lets a failure through: --quiet makes mkdocs 1.6 exit 0 on warnings
    for line in ci + script.splitlines():
        code = line.split("#")[0]
        assert "--quiet" not in code and "|| true" not in code, line


@needs_docs_tools
def test_a_planted_broken_link_fails_the_docs_build(tmp_path):
    config = site_copy(tmp_path)
    clean = build(config)
    assert clean.returncode == 0 and "docs: built with no warning" in clean.stdout, clean.stdout + clean.stderr
    page = tmp_path / "docs" / "cli.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the missing page](no-such-page.md).\n",
                    encoding="utf-8")
    broken = build(config)
    assert broken.returncode != 0, broken.stdout + broken.stderr
    assert "WARNING" in broken.stdout and "no-such-page.md" in broken.stdout, broken.stdout
    assert "the build failed or warned" in broken.stderr


def readme_docs_commands() -> list[str]:
    """The shell lines of the README's block under "## Documentation" that builds the site, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Documentation"):]
    block = section[section.index("\n    pip install"):].split("\n\n")[0]
    return [line.strip() for line in block.strip("\n").splitlines()]


def test_the_readme_s_docs_commands_turn_the_theme_s_end_of_life_banner_off():
    """Issue 60: mkdocs-material prints an end-of-life banner on every `mkdocs` command unless NO_MKDOCS_2_WARNING
    is set (.ci/build-docs sets it; docs/development.md says why): the README sets it before its mkdocs lines."""
    lines = readme_docs_commands()
    first_mkdocs = next(i for i, line in enumerate(lines) if line.startswith("mkdocs "))
    assert any(line.startswith("export NO_MKDOCS_2_WARNING=1") for line in lines[:first_mkdocs]), lines
    assert "NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict" in SCRIPT.read_text()
    assert "NO_MKDOCS_2_WARNING=1" in (ROOT / "docs" / "development.md").read_text(encoding="utf-8")


@needs_docs_tools
def test_the_readme_s_docs_build_prints_no_banner(tmp_path):
    """The README's `mkdocs build --strict`, after its export, on a copy of the site: nothing but INFO lines
    (no end-of-life banner, no warning). Slow (a build of the site: conftest.SLOW_TESTS)."""
    lines = readme_docs_commands()
    export = next(line for line in lines if line.startswith("export "))
    build_line = next(line for line in lines if line.startswith("mkdocs build"))
    config = site_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("NO_MKDOCS_2_WARNING", None)
    proc = subprocess.run(["bash", "-c", f"{export}\n{build_line}"], cwd=config.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and
               not line.startswith("INFO ")]
    assert printed == [], printed
