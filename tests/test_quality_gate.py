"""The quality gate, scripts/check: CI runs it, and it fails on a format, lint or type
error, naming the step. It is run on small trees of its own (a copy of the script and of
pyproject.toml, and the project's .venv tools), one fault at a time."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

GATE = ROOT / "scripts" / "check"
TOOLS = ROOT / ".venv" / "bin"
CLEAN = 'def double(x: int) -> int:\n    """Twice x."""\n    return 2 * x\n'


def readme_test_command() -> str:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("# 2. install the test extras and run the whole test suite")
    return lines[start + 1]


def test_ci_installs_the_dev_tools_and_runs_the_gate_before_the_readme_test_command() -> None:
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    command = readme_test_command()
    assert command in ci, "the README's test command is not in .ci/run verbatim"
    gate = [n for n, ln in enumerate(ci) if not ln.startswith("#") and "scripts/check" in ln]
    assert gate, ".ci/run does not run scripts/check"
    assert gate[0] < ci.index(command), "the gate runs after the (long) test suite"
    assert "'.[dev,test]'" in ci[gate[0]] or any("'.[dev,test]'" in ln for ln in ci[: gate[0]])
    assert os.access(GATE, os.X_OK)


def run_gate(root: Path, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPY_CACHE_DIR": str(cache)} if cache else None
    return subprocess.run(
        ["bash", str(root / "scripts" / "check")], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def tree(root: Path, *, tools: bool) -> Path:
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(GATE, root / "scripts" / "check")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    for package in ("bridge", "tests", "bench", "examples"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
        (root / package / "clean.py").write_text(CLEAN)
    if tools:
        if not ((TOOLS / "ruff").exists() and (TOOLS / "mypy").exists()):
            pytest.skip(f"{TOOLS}/ruff and mypy are not installed: .venv/bin/pip install -e '.[dev,test]'")
        (root / ".venv" / "bin").mkdir(parents=True)
        for tool in ("ruff", "mypy"):
            (root / ".venv" / "bin" / tool).symlink_to(TOOLS / tool)
    return root


def test_the_gate_without_the_project_tools_says_how_to_install_them(tmp_path: Path) -> None:
    done = run_gate(tree(tmp_path, tools=False))
    assert done.returncode == 2
    assert ".venv/bin/ruff is missing" in done.stderr and "pip install" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the trees below: the standard library is checked once."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.mark.parametrize(
    ("path", "source", "step"),
    [
        (None, None, None),
        ("bridge/bad.py", "x = {  'a':1}\n", "ruff format --check"),
        ("tests/bad.py", "import os\n", "ruff check"),
        ("bench/bad.py", "def half(x):\n    return x / 2\n", "mypy --strict"),
        ("bridge/bad.py", "def half(x: int) -> str:\n    return x / 2\n", "mypy --strict"),
    ],
    ids=["clean", "format", "lint", "untyped", "type-error"],
)
def test_the_gate_passes_a_clean_tree_and_fails_on_each_kind_of_fault_naming_the_step(
    tmp_path: Path, mypy_cache: Path, path: str | None, source: str | None, step: str | None
) -> None:
    root = tree(tmp_path, tools=True)
    if path is not None and source is not None:
        (root / path).write_text(source)
    done = run_gate(root, mypy_cache)
    steps = [ln for ln in done.stderr.splitlines() if ln.startswith("scripts/check: ")]
    if step is None:
        assert done.returncode == 0, done.stdout + done.stderr
        assert steps[-1] == "scripts/check: all clean"
    else:
        assert done.returncode != 0, done.stdout + done.stderr
        assert step in steps[-1], steps  # the step that failed is the last one announced
        assert path is not None and Path(path).name in done.stdout + done.stderr
