"""What a new user hit in the first hour with the CLI (issue #30): a resume that ran nothing
says why, the attempt counter goes on across manual retries, and history names the step a
waiting checkpoint waits in. Real ``pitstop`` executable, real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from clitools import pitstop_exe

FLOWS = '''
import pitstop

wf = pitstop.Workflow("first-hour")


@wf.step
def draft(state):
    return {"n": 1}


@wf.step(wait_for="approval")
def review(state, approval):
    return {"approved": approval}


@wf.step
def publish(state):
    if state.get("fail"):
        raise RuntimeError("the press is down")
    return {"published": True}
'''


@pytest.fixture
def flows(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "flows.py").write_text(FLOWS)
    return tmp_path, f"sqlite:///{tmp_path / 'runs.db'}"


def _resume(cwd: Path, url: str, run: str, *extra: str) -> tuple[int, str]:
    done = pitstop_exe("resume", run, "--workflow", "flows:wf", *extra, store=url, cwd=cwd)
    return done.code, done.out


@pytest.mark.slow
def test_a_resume_with_nothing_to_do_says_what_it_found(flows: tuple[Path, str]) -> None:
    cwd, url = flows
    assert pitstop_exe("start", "flows:wf", "--run-id", "w", store=url, cwd=cwd).code == 0
    code, out = _resume(cwd, url, "w")
    assert code == 0 and out.splitlines()[0] == (
        "run w still waits for input 'approval': nothing was run (deliver it with "
        "pitstop send w approval JSON, then resume)"), out
    as_json = pitstop_exe("resume", "w", "--workflow", "flows:wf", "--json", store=url, cwd=cwd)
    assert "still waits for input 'approval'" in as_json.json["nothing_ran"]

    assert pitstop_exe("send", "w", "approval", "true", store=url, cwd=cwd).code == 0
    code, out = _resume(cwd, url, "w")
    assert code == 0 and "nothing was run" not in out and "completed" in out
    code, out = _resume(cwd, url, "w")
    assert code == 0 and out.startswith("run w had already completed: nothing was run"), out

    assert pitstop_exe("start", "flows:wf", "--run-id", "c", store=url, cwd=cwd).code == 0
    assert pitstop_exe("cancel", "c", store=url, cwd=cwd).code == 0
    code, out = _resume(cwd, url, "c")
    assert code == 0 and out.startswith("run c is cancelled: nothing was run"), out


@pytest.mark.slow
def test_the_attempt_counter_goes_on_after_manual_retries(flows: tuple[Path, str]) -> None:
    cwd, url = flows
    assert pitstop_exe("start", "flows:wf", "--run-id", "f", "--input", '{"fail": true}',
                       store=url, cwd=cwd).code == 0
    assert pitstop_exe("send", "f", "approval", "true", store=url, cwd=cwd).code == 0
    attempts = []
    for _ in range(3):
        done = pitstop_exe("resume", "f", "--workflow", "flows:wf", "--json", store=url, cwd=cwd)
        assert done.code == 1, done
        attempts.append(done.json["error"]["attempt"])
    assert attempts == [1, 2, 3]
    shown = pitstop_exe("show", "f", store=url, cwd=cwd).out
    assert "publish (attempt 3)" in shown, shown


@pytest.mark.slow
def test_history_names_the_step_a_waiting_checkpoint_waits_in(flows: tuple[Path, str]) -> None:
    cwd, url = flows
    assert pitstop_exe("start", "flows:wf", "--run-id", "h", store=url, cwd=cwd).code == 0
    lines = pitstop_exe("history", "h", store=url, cwd=cwd).out.splitlines()
    waiting = [line for line in lines if " waiting " in line]
    assert len(waiting) == 1 and " review " in waiting[0] and " draft " not in waiting[0], lines
