"""``pitstop start`` and ``pitstop enqueue``: runs started from the shell, and the logging
options every command takes. Real ``pitstop`` executable, real SQLite file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clitools import PITSTOP, one_error_line, pitstop_exe, sqlite_rows

FLOWS = '''
import dataclasses
import pitstop


@dataclasses.dataclass
class Address:
    city: str


@dataclasses.dataclass
class Order:
    item: str
    address: Address
    quantity: int = 1


orders = pitstop.Workflow("orders", state=Order)


@orders.step
def pack(state):
    return {"quantity": state.quantity * 2, "item": state.item + "@" + state.address.city}


plain = pitstop.Workflow("plain")


@plain.step
def one(state):
    return {"n": state.get("n", 0) + 1}


@plain.step(wait_for="go")
def two(state, go):
    return {"went": go}
'''


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "shop.py").write_text(FLOWS)
    return tmp_path


@pytest.mark.slow
def test_start_runs_here_with_input_inline_from_a_file_or_stdin(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'new.db'}"  # no store yet: start creates it
    inline = pitstop_exe("start", "shop:orders", "--input",
                         '{"item": "tea", "address": {"city": "Oslo"}}', "--run-id", "o1",
                         "--json", store=url, cwd=cwd)
    assert inline.code == 0, inline
    assert inline.json["status"] == "completed" and inline.json["run_id"] == "o1"
    state = pitstop_exe("show", "o1", "--json", store=url, cwd=cwd).json["state"]
    assert state == {"item": "tea@Oslo", "quantity": 2,  # the nested dataclass was built
                     "address": {"$type": "shop.Address", "city": "Oslo"}}
    (cwd / "order.json").write_text('{"item": "ink", "address": {"city": "Rome"}, "quantity": 3}')
    from_file = pitstop_exe("start", "shop:orders", "--input", "@order.json", "--json",
                            store=url, cwd=cwd)
    assert from_file.code == 0, from_file
    piped = pitstop_exe("start", "shop:plain", "--input", "-", "--run-id", "p1", store=url,
                        cwd=cwd, stdin='{"n": 41}')
    assert piped.code == 0, piped
    assert re.search(r"status: +waiting", piped.out) and re.search(r"run: +p1", piped.out)
    shown = pitstop_exe("show", "p1", "--field", "n", "--json", store=url, cwd=cwd).json
    assert shown["value"] == 42


@pytest.mark.slow
def test_enqueue_queues_for_a_worker(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'q.db'}"
    queued = pitstop_exe("enqueue", "shop:plain", "--input", '{"n": 1}', "--run-id", "q1",
                         "--priority", "5", "--json", store=url, cwd=cwd)
    assert queued.code == 0, queued
    assert queued.json["status"] == "queued" and queued.json["priority"] == 5
    text = pitstop_exe("enqueue", "shop:plain", store=url, cwd=cwd)
    assert re.match(r"queued run \S+ \(plain\)", text.out)
    worker = pitstop_exe("worker", "--workflow", "shop:plain", "--until-idle", "--json",
                         store=url, cwd=cwd)
    assert worker.code == 0, worker
    assert worker.json["by_status"] == {"waiting": 2}


@pytest.mark.parametrize(("args", "expected"), [
    (["start", "shop:orders", "--input", "[1]"], "--input must be a JSON object"),
    (["start", "shop:orders", "--input", '{"item": "x"}'], "does not fit the state"),
    (["start", "shop:orders", "--input", '{"item": "x", "address": {"town": "y"}}'],
     "Address has no field 'town'"),
    (["start", "shop:orders", "--input", "{"], "--input is not valid JSON"),
    (["start", "shop:nope"], "has no attribute 'nope'"),
    (["enqueue", "shop:orders", "--input", '{"item": 5, "address": {"city": "x"}}'],
     "field 'item': expects a str"),
])
def test_bad_input_is_refused_before_anything_is_written(
    cwd: Path, args: list[str], expected: str
) -> None:
    url = f"sqlite:///{cwd / 'none.db'}"
    assert expected in one_error_line(pitstop_exe(*args, store=url, cwd=cwd))
    assert not (cwd / "none.db").exists()  # not even an empty store


@pytest.mark.slow
def test_an_existing_run_id_is_refused(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'dup.db'}"
    assert pitstop_exe("start", "shop:plain", "--run-id", "x", store=url, cwd=cwd).code == 0
    before = sqlite_rows(url)
    assert "already exists" in one_error_line(
        pitstop_exe("start", "shop:plain", "--run-id", "x", "--input", '{"n": 2}', store=url,
                    cwd=cwd))
    assert sqlite_rows(url) == before
    # The same start again (after an error that left its outcome unknown, say) converges on
    # the run instead of being refused (#18): it reports where the run stands.
    again = pitstop_exe("start", "shop:plain", "--run-id", "x", store=url, cwd=cwd)
    assert again.code == 0 and "waiting for: go" in again.out


@pytest.mark.slow
def test_every_command_takes_the_logging_options(cwd: Path) -> None:
    import click

    from pitstop.cli.app import all_commands

    # A command group (`pitstop cache`, `schedule`, `stream`) takes them on each subcommand.
    invocations = []
    for name, command in all_commands().items():
        if isinstance(command, click.Group):
            invocations += [(name, sub) for sub in command.commands]
        else:
            invocations.append((name,))
    for words in invocations:
        text = pitstop_exe(*words, "--help").out
        for option in ("--log-level", "-v, --verbose", "-q, --quiet"):
            assert option in text, (words, option)
    assert PITSTOP is not None


@pytest.mark.slow
def test_worker_logs_are_key_value_lines_naming_run_step_and_attempt(cwd: Path) -> None:
    (cwd / "flaky.py").write_text('''
import pitstop
wf = pitstop.Workflow("flaky", retry=pitstop.Retry(attempts=2, backoff=0))

@wf.step
def boom(state):
    raise RuntimeError("down")
''')
    url = f"sqlite:///{cwd / 'w.db'}"
    assert pitstop_exe("enqueue", "flaky:wf", "--run-id", "f1", store=url, cwd=cwd).code == 0
    worker = pitstop_exe("worker", "--workflow", "flaky:wf", "--until-idle", store=url, cwd=cwd)
    assert worker.code == 0, worker
    finished = [line for line in worker.err.splitlines() if "event=finished" in line]
    assert len(finished) == 1, worker.err
    assert re.search(r"WARNING pitstop\.worker event=finished run=f1 workflow=flaky "
                     r"status=failed step=boom attempt=2 error=\"RuntimeError: down\"",
                     finished[0]), finished
    assert any("event=retry run=f1" in line and "step=boom attempt=1" in line
               for line in worker.err.splitlines()), worker.err
    quiet = pitstop_exe("worker", "--workflow", "flaky:wf", "--until-idle", "-q", store=url,
                        cwd=cwd)
    assert quiet.err == ""
    debug = pitstop_exe("--log-level", "debug", "runs", store=url, cwd=cwd)
    assert debug.code == 0
