"""Why did the run fail? ``show`` (text and --json), ``runs`` and ``history`` say it.

A failed run's head checkpoint holds the error; before, the CLI showed the last completed
step and no error at all. Real ``pitstop`` executable, real SQLite file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clitools import pitstop_exe

FLOWS = '''
import pitstop

wf = pitstop.Workflow("billing", retry=pitstop.Retry(attempts=2, backoff=0))


@wf.step
def load(state):
    return {"invoice": {"amount": state["amount"]}}


@wf.step
def charge(state):
    raise ValueError(f"no budget for {state['invoice']['amount']}\\nsecond line")
'''


@pytest.fixture
def failed(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "billing.py").write_text(FLOWS)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    started = pitstop_exe("start", "billing:wf", "--input", '{"amount": 12}', "--run-id", "inv-1",
                          store=url, cwd=tmp_path)
    assert started.code == 1, started  # a failed run: exit 1
    assert "error:" in started.out and "ValueError: no budget for 12" in started.out
    return tmp_path, url


@pytest.mark.slow
def test_show_names_the_failed_step_the_error_and_the_traceback(
    failed: tuple[Path, str]
) -> None:
    cwd, url = failed
    shown = pitstop_exe("show", "inv-1", store=url, cwd=cwd)
    assert shown.code == 0, shown
    assert "failed step: charge (attempt 2)" in shown.out
    assert "error:       ValueError: no budget for 12" in shown.out
    assert "Traceback (most recent call last)" in shown.out
    assert 'billing.py", line' in shown.out and "in charge" in shown.out

    doc = pitstop_exe("show", "inv-1", "--json", store=url, cwd=cwd).json
    error = doc["error"]
    assert error["step"] == "charge" and error["type"] == "ValueError"
    assert error["message"] == "no budget for 12\nsecond line"
    assert error["attempt"] == 2
    assert "Traceback (most recent call last)" in error["traceback"]
    assert error["checkpoint_id"] == doc["checkpoint"]["id"]


@pytest.mark.slow
def test_runs_and_history_show_the_first_line_of_the_error(failed: tuple[Path, str]) -> None:
    cwd, url = failed
    listing = pitstop_exe("runs", store=url, cwd=cwd)
    line = next(x for x in listing.out.splitlines() if x.startswith("inv-1"))
    assert "failed" in line and "ValueError: no budget for 12 (in charge)" in line
    assert "second line" not in listing.out
    doc = pitstop_exe("runs", "--json", store=url, cwd=cwd).json["runs"][0]
    assert doc["error"] == {"step": "charge", "type": "ValueError", "attempt": 2,
                            "message": "no budget for 12\nsecond line"}
    history = pitstop_exe("history", "inv-1", store=url, cwd=cwd).out
    assert history.count("ValueError: no budget for 12 (in charge)") == 2  # retry and failure


@pytest.mark.slow
def test_a_run_that_did_not_fail_has_no_error(tmp_path: Path) -> None:
    (tmp_path / "billing.py").write_text(FLOWS.replace("raise ValueError", "return {} or print"))
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    assert pitstop_exe("start", "billing:wf", "--input", '{"amount": 1}', "--run-id", "ok",
                       store=url, cwd=tmp_path).code == 0
    doc = pitstop_exe("show", "ok", "--json", store=url, cwd=tmp_path).json
    assert doc["error"] is None
    assert "error" not in pitstop_exe("runs", "--json", store=url, cwd=tmp_path).json["runs"][0]
