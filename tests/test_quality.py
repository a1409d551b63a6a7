"""The code stays ruff-clean and type-checks: checked with every test run, not on trust."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(ROOT / ".venv" / "bin")) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def test_ruff() -> None:
    done = subprocess.run([_tool("ruff"), "check", "src", "tests", "bench", "examples"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # ~40 s from a cold cache; `scripts/check mypy` runs it alone
def test_mypy_strict() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "src/pitstop"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if "No module named mypy" in done.stderr:
        pytest.skip("mypy is not installed")
    assert done.returncode == 0, done.stdout + done.stderr


def test_repository_tracks_no_symlinks() -> None:
    """A tracked symlink points outside a fresh clone (a local venv, say) and breaks it."""
    done = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    links = [line.split("\t", 1)[1] for line in done.stdout.splitlines()
             if line.startswith("120000 ")]
    assert links == [], f"the repository tracks symlinks: {links}"
