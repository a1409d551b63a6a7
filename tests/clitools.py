"""Running the real ``pitstop`` executable, as a user's shell does.

The console script installed next to this interpreter (``.venv/bin/pitstop``), in its own
process: exit statuses, stdout, stderr and "no traceback" are checked on the real thing.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NEXT_TO_PYTHON = Path(sys.executable).with_name("pitstop")
PITSTOP = str(_NEXT_TO_PYTHON) if _NEXT_TO_PYTHON.exists() else shutil.which("pitstop")


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def pitstop_exe(
    *args: str,
    store: str | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> Result:
    """``pitstop ARGS`` in a subprocess; ``store`` is passed as ``$PITSTOP_STORE``."""
    assert PITSTOP is not None, "the pitstop console script is not installed (pip install -e .)"
    full = {k: v for k, v in os.environ.items() if k not in ("PITSTOP_STORE", "PITSTOP_DEBUG")}
    if store:
        full["PITSTOP_STORE"] = store
    full.update(env or {})
    done = subprocess.run(
        [PITSTOP, *args], capture_output=True, text=True, input=stdin, cwd=cwd, env=full,
        timeout=timeout, check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def one_error_line(result: Result) -> str:
    """The failure contract: exit 2, one ``error:`` line on stderr, nothing on stdout."""
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("error: "), result.err
    assert "Traceback" not in result.err
    assert result.out == ""
    return lines[0]


def sqlite_rows(url: str) -> list[str]:
    """Every row of a SQLite store, to prove that a refused command wrote nothing."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return list(conn.iterdump())
