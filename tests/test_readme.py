"""The README's promises: its two commands, and the demo they run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "the README opens with a bash block of commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_demo_and_the_test_command() -> None:
    demo, tests = _readme_commands()
    assert "examples/vendor_approval.py demo" in demo
    assert tests.endswith("pytest")
    # CI runs exactly the README's test command
    assert tests in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_the_demo_runs_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PITSTOP_STORE"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "vendor_approval.py"), "demo"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "waiting, waiting for finance_decision" in out
    assert "process killed with SIGKILL" in out
    assert ": 1 (the effect was recorded, not repeated)" in out
    assert out.count(": completed") >= 2
    assert "forked" in out.lower() or "fork" in out
    assert (tmp_path / "pitstop.db").exists()
    outbox = (tmp_path / "outbox.txt").read_text().splitlines()
    assert len(outbox) == 2  # one e-mail per approved vendor, none repeated by the crash


def test_ci_installs_the_pinned_cpu_torch_before_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    tests = _readme_commands()[1]
    torch_line = ".venv/bin/pip install -q torch==2.13.0"
    assert torch_line in ci and ci.index(torch_line) < ci.index(tests)
    assert not re.search(r"install[^\n]*\btorch(?!==2\.13\.0)\b", ci)  # never an open range


def test_the_readme_shows_a_typed_state_that_runs() -> None:
    """A dataclass state declared with ``Workflow(name, state=...)``, as the README shows it,
    runs as written (#30: the README never showed how)."""
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "state=Review" in b]
    assert len(blocks) == 1, "the README shows one dataclass state declared with state="
    names: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), names)  # our own README, run as written
    done = names["done"]
    assert repr(done.state) == "Review(vendor='Acme Corp', risk='high')"  # type: ignore[attr-defined]


def test_the_readme_says_the_browser_tests_need_debians_chromium() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "Debian's Chromium" in text and "apt-get install -y chromium" in text
