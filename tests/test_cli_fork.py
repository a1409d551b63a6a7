"""``pitstop fork --set``: edited fields keep their types, typos are refused, nothing is written.

Run with the real ``pitstop`` executable against a workflow file whose state holds a
registered dataclass, as in the issue: ``--set 'plan={"goal":"x"}'`` once replaced the
``Plan`` with a dict and the fork failed later with ``AttributeError``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clitools import one_error_line, pitstop_exe, sqlite_rows

AGENT = '''
import dataclasses
import pitstop


@pitstop.register(name="agent.Plan")
@dataclasses.dataclass
class Plan:
    goal: str
    steps: list[str]


wf = pitstop.Workflow("agent")


@wf.step
def plan(state):
    return {"plan": Plan(state["topic"], ["search", "write"]), "count": 1}


@wf.step(wait_for="go")
def act(state, go):
    return {"done": state["plan"].goal.upper() + " " + ",".join(state["plan"].steps)}
'''


@pytest.fixture
def agent(tmp_path: Path) -> tuple[Path, str, str]:
    (tmp_path / "agent.py").write_text(AGENT)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    started = pitstop_exe("start", "agent:wf", "--input", '{"topic": "cats"}', "--run-id", "r1",
                          "--json", store=url, cwd=tmp_path)
    assert started.code == 0, started
    assert started.json["status"] == "waiting"
    return tmp_path, url, "r1"


@pytest.mark.slow
def test_set_converts_json_to_the_registered_dataclass(agent: tuple[Path, str, str]) -> None:
    cwd, url, run = agent
    forked = pitstop_exe("fork", run, "--set", 'plan={"goal": "dogs", "steps": ["a"]}',
                         "--set", "count=2", "--workflow", "agent:wf", "--run-id", "r2",
                         "--json", store=url, cwd=cwd)
    assert forked.code == 0, forked
    assert forked.json["status"] == "waiting"
    shown = pitstop_exe("show", "r2", "--json", store=url, cwd=cwd).json["state"]
    assert shown["plan"] == {"$type": "agent.Plan", "goal": "dogs", "steps": ["a"]}
    assert shown["count"] == 2
    nested = pitstop_exe("fork", run, "--set", 'plan.goal="birds"', "--workflow", "agent:wf",
                         "--run-id", "r3", "--json", store=url, cwd=cwd)
    assert nested.code == 0, nested
    state = pitstop_exe("show", "r3", "--json", store=url, cwd=cwd).json["state"]
    assert state["plan"]["goal"] == "birds" and state["plan"]["steps"] == ["search", "write"]


@pytest.mark.parametrize(("edit", "expected"), [
    ('plan={"goal": "x"}', "field 'plan': agent.Plan needs field 'steps' too"),
    ("nosuchfield=1", "no field 'nosuchfield' in this state"),
    ('count="two"', "field 'count': expects an int, got a string"),
    ("plan.gaol=1", "agent.Plan has no field 'gaol' (fields: goal, steps)"),
    ("count=", "--set count is not valid JSON"),
])
@pytest.mark.slow
def test_a_bad_edit_is_one_line_exit_2_and_writes_nothing(
    agent: tuple[Path, str, str], edit: str, expected: str
) -> None:
    cwd, url, run = agent
    before = sqlite_rows(url)
    line = one_error_line(pitstop_exe("fork", run, "--set", edit, "--workflow", "agent:wf",
                                      store=url, cwd=cwd))
    assert expected in line
    assert sqlite_rows(url) == before


@pytest.mark.slow
def test_add_allows_a_new_field(agent: tuple[Path, str, str]) -> None:
    cwd, url, run = agent
    forked = pitstop_exe("fork", run, "--set", 'note="hi"', "--add", "--workflow", "agent:wf",
                         "--run-id", "r4", "--json", store=url, cwd=cwd)
    assert forked.code == 0, forked
    assert pitstop_exe("show", "r4", "--field", "note", "--json", store=url,
                       cwd=cwd).json["value"] == "hi"
