"""Long values in ``pitstop show`` are shortened with a marker (``--full`` and ``--field``
show them whole), and the import progress bar counts sizes, not raw bytes."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

from clitools import PITSTOP, pitstop_exe

BIG = '''
import os
import pitstop

wf = pitstop.Workflow("big")


@wf.step
def fill(state):
    return {"text": "y" * 100_000 + "END", "items": list(range(300)), "small": "ok",
            "blob": os.urandom(3 << 20)}
'''


@pytest.fixture
def big(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "big.py").write_text(BIG)
    url = f"sqlite:///{tmp_path / 'big.db'}"
    assert pitstop_exe("start", "big:wf", "--run-id", "b", store=url, cwd=tmp_path).code == 0
    return tmp_path, url


@pytest.mark.slow
def test_show_shortens_long_values_with_a_marker(big: tuple[Path, str]) -> None:
    cwd, url = big
    shown = pitstop_exe("show", "b", store=url, cwd=cwd)
    assert shown.code == 0
    assert "… [+99,703 chars]" in shown.out and "END" not in shown.out
    assert '"… [+280 more items]"' in shown.out and '"small": "ok"' in shown.out
    assert "2 long values shortened (marked …); --full shows everything" in shown.out
    assert len(shown.out) < 5000

    full = pitstop_exe("show", "b", "--full", store=url, cwd=cwd)
    assert "y" * 100_000 + "END" in full.out and "shortened" not in full.out
    field = pitstop_exe("show", "b", "--field", "text", store=url, cwd=cwd)
    assert "y" * 100_000 + "END" in field.out
    doc = pitstop_exe("show", "b", "--json", store=url, cwd=cwd).json  # never shortened
    assert doc["state"]["text"].endswith("END") and len(doc["state"]["items"]) == 300


@pytest.mark.slow
def test_the_import_progress_bar_counts_mib(big: tuple[Path, str]) -> None:
    cwd, url = big
    assert pitstop_exe("export", "b", "-o", "b.pitstop", store=url, cwd=cwd).code == 0
    assert PITSTOP is not None
    controller, terminal = pty.openpty()  # stderr is a terminal: the bar is drawn
    proc = subprocess.Popen(
        [PITSTOP, "import", "b.pitstop"], cwd=cwd, stdout=subprocess.PIPE, stderr=terminal,
        env={**os.environ, "PITSTOP_STORE": f"sqlite:///{cwd / 'other.db'}", "TERM": "xterm",
             "COLUMNS": "120"},
    )
    os.close(terminal)
    out = proc.communicate(timeout=60)[0].decode()
    drawn = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        drawn += chunk
    os.close(controller)
    assert proc.returncode == 0 and "imported run b" in out
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.decode(errors="replace"))
    reading = [line for line in re.split(r"[\r\n]", text) if line.startswith("reading")]
    assert any(re.search(r"\d+\.\d/3\.\d MiB", line) for line in reading), reading
    assert not re.search(r"\d{6,}", " ".join(reading))  # no raw byte counts
