"""Classes registered in a script keep a stable name however the module was started.

``python agent.py`` once registered ``Plan`` as ``__main__.Plan``; ``pitstop resume --workflow
agent:wf`` imports ``agent`` and could not load the state. Now the script's classes are named
after the module's import name, and values stored under ``__main__.X`` still load.
Real scripts in real interpreters, and the real ``pitstop`` executable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pitstop
from clitools import pitstop_exe
from pitstop.errors import UnregisteredTypeError
from pitstop.serde import MsgpackSerializer, TypeRegistry

AGENT = '''
import dataclasses
import sys
import pitstop


@pitstop.register
@dataclasses.dataclass
class Plan:
    goal: str


wf = pitstop.Workflow("agent")


@wf.step
def plan(state):
    return {"plan": Plan(state["topic"])}


@wf.step(wait_for="go")
def act(state, go):
    return {"done": state["plan"].goal.upper()}


if __name__ == "__main__":
    print(pitstop.serde.default_registry.name_of(Plan))
    if len(sys.argv) > 1:
        store = pitstop.open_store(sys.argv[1])
        print(wf.start(store, {"topic": "cats"}, run_id="r1").status.value)
'''


def python(*args: str, cwd: Path) -> list[str]:
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.slow
def test_a_script_and_the_cli_agree_on_the_name(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    assert python("agent.py", url, cwd=tmp_path) == ["agent.Plan", "waiting"]
    shown = pitstop_exe("show", "r1", "--field", "plan", "--json", store=url, cwd=tmp_path)
    assert shown.json["value"] == {"$type": "agent.Plan", "goal": "cats"}
    assert pitstop_exe("send", "r1", "go", "true", store=url, cwd=tmp_path).code == 0
    resumed = pitstop_exe("resume", "r1", "--workflow", "agent:wf", "--json", store=url,
                          cwd=tmp_path)
    assert resumed.code == 0, resumed
    assert resumed.json["status"] == "completed"


@pytest.mark.slow
def test_the_name_follows_the_package_and_python_m(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(AGENT)
    assert python("pkg/agent.py", cwd=tmp_path) == ["pkg.agent.Plan"]
    assert python("-m", "pkg.agent", cwd=tmp_path) == ["pkg.agent.Plan"]
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "agent.py").write_text(AGENT)
    assert python("loose/agent.py", cwd=tmp_path) == ["agent.Plan"]  # not a package


@pytest.mark.slow
def test_a_script_that_imports_itself_registers_both_copies(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT.replace(
        'if __name__ == "__main__":',
        'if __name__ == "__main__":\n    import agent\n    assert agent.Plan is not Plan\n'
        '    print(pitstop.serde.default_registry.name_of(agent.Plan))'))
    assert python("agent.py", cwd=tmp_path) == ["agent.Plan", "agent.Plan"]


@pytest.mark.slow
def test_values_stored_as_main_names_still_load(tmp_path: Path) -> None:
    """A store written before the fix holds ``__main__.Plan``: it loads as ``agent.Plan``."""
    (tmp_path / "agent.py").write_text(AGENT)
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old_writer = AGENT.replace("@pitstop.register\n", '@pitstop.register(name="__main__.Plan")\n')
    (tmp_path / "old_agent.py").write_text(old_writer)
    python("old_agent.py", url, cwd=tmp_path)
    assert pitstop_exe("show", "r1", "--field", "plan", "--json", store=url,
                       cwd=tmp_path).json["value"]["$type"] == "__main__.Plan"
    assert pitstop_exe("send", "r1", "go", "1", store=url, cwd=tmp_path).code == 0
    resumed = pitstop_exe("resume", "r1", "--workflow", "agent:wf", "--json", store=url,
                          cwd=tmp_path)
    assert resumed.code == 0, resumed
    assert resumed.json["status"] == "completed"
    with pitstop.open_store(url) as store:
        latest = store.latest("r1", strict=False)
        assert latest is not None and latest.state["done"] == "CATS"


def test_an_ambiguous_main_name_needs_an_explicit_alias() -> None:
    registry = TypeRegistry()
    first = type("Plan", (), {"__module__": "a"})
    second = type("Plan", (), {"__module__": "b"})
    registry.register(first)
    assert registry.lookup("__main__.Plan") is not None
    registry.register(second)
    assert registry.lookup("__main__.Plan") is None  # which one? refuse to guess
    old = type("Plan", (), {"__module__": "x"})
    stored = TypeRegistry()
    stored.register(old, name="__main__.Plan")  # what a script stored before the fix
    data = MsgpackSerializer(registry=stored).dumps(old())
    with pytest.raises(UnregisteredTypeError, match=r"several registered classes are called "
                       r"Plan \(a\.Plan, b\.Plan\); register the one it was with aliases="):
        MsgpackSerializer(registry=registry).loads(data)
    fixed = TypeRegistry()
    fixed.register(first)
    fixed.register(second, aliases=["__main__.Plan"])
    assert type(MsgpackSerializer(registry=fixed).loads(data)) is second
    with pytest.raises(ValueError, match="already names"):
        fixed.register(type("Other", (), {"__module__": "c"}), aliases=["__main__.Plan"])
