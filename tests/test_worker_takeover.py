"""Orphaned runs: a dead owner's runs are taken over at once on its host, ``--until-idle``
waits for a lease that may belong to a dead owner elsewhere, and ``runs`` says which runs
lost their owner and when leases expire (a time, never an epoch).

The owner really dies: a ``pitstop start`` process is killed with SIGKILL in a step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import pitstop
from clitools import PITSTOP, one_error_line, pitstop_exe
from pitstop.owners import owner_id

FLOWS = '''
import os
import pathlib
import time
import pitstop

wf = pitstop.Workflow("slow", lease_ttl=120)


@wf.step
def work(state):
    if os.environ.get("HANG_MARKER"):
        pathlib.Path(os.environ["HANG_MARKER"]).write_text("in step")
        time.sleep(600)
    return {"done": True}
'''


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "slow.py").write_text(FLOWS)
    return tmp_path


def kill_in_step(cwd: Path, url: str, run_id: str) -> None:
    """Start a run in a process and SIGKILL it while its step runs: an orphan with a live
    lease of 120 s whose owner's pid is gone."""
    marker = cwd / f"{run_id}.marker"
    assert PITSTOP is not None
    proc = subprocess.Popen(
        [PITSTOP, "start", "slow:wf", "--run-id", run_id],
        cwd=cwd, env={**os.environ, "PITSTOP_STORE": url, "HANG_MARKER": str(marker)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the run's process ended early"
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_worker_takes_over_a_dead_owners_run_at_once(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'runs.db'}"
    kill_in_step(cwd, url, "orphan")
    with pitstop.open_store(url) as store:
        before = store.get_run("orphan")
    assert before.status is pitstop.RunStatus.RUNNING and before.lease_expires_at is not None

    listing = pitstop_exe("runs", store=url, cwd=cwd).out
    line = next(x for x in listing.splitlines() if x.startswith("orphan"))
    assert "running, owner gone" in line
    assert re.search(r"lease expires in \d+[sm]\)", line), line
    assert not re.search(r"\d{10}", line)  # no raw epoch anywhere
    assert pitstop_exe("runs", "--json", store=url, cwd=cwd).json["runs"][0]["lease"] == \
        "owner_gone"

    worker = pitstop_exe("worker", "--workflow", "slow:wf", "--until-idle", "--json",
                         store=url, cwd=cwd)
    assert worker.code == 0, worker
    assert worker.json["by_status"] == {"completed": 1}
    assert "event=takeover run=orphan workflow=slow" in worker.err
    with pitstop.open_store(url) as store:
        done = store.latest("orphan")
        assert done is not None and done.state["done"] is True
        # Taken over while the dead owner's lease still had most of its 120 s to run.
        assert done.created_at < before.lease_expires_at


def _started_at(worker_log: str) -> float:
    """When a ``pitstop worker -v`` started, from its ``event=started`` line (local time)."""
    line = next(x for x in worker_log.splitlines() if "event=started" in x)
    stamp, _, millis = line.split()[0].partition(".")
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


@pytest.mark.slow
def test_until_idle_waits_for_a_lease_held_elsewhere_then_takes_the_run(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'runs.db'}"
    assert pitstop_exe("enqueue", "slow:wf", "--run-id", "busy", store=url, cwd=cwd).code == 0
    with pitstop.open_store(url) as store:
        store.acquire("busy", "elsewhere:4242:abc", ttl=600)
    line = next(x for x in pitstop_exe("runs", store=url, cwd=cwd).out.splitlines()
                if x.startswith("busy"))
    assert re.search(r"lease expires in \d+[sm] \(elsewhere:4242:abc\)", line), line

    busy = one_error_line(pitstop_exe("resume", "busy", "--workflow", "slow:wf",
                                      store=url, cwd=cwd))
    assert "owned by 'elsewhere:4242:abc' (lease expires in" in busy
    assert not re.search(r"\d{10}", busy)
    assert pitstop_exe("cancel", "busy", store=url, cwd=cwd).code == 0  # nothing to wait for

    # A lease never renewed, from another host: the worker must wait it out, not exit idle.
    # It is taken just before the worker starts; a worker that started only after it expired
    # (a loaded machine) proves nothing, and a longer lease is tried.
    for ttl in (3.0, 10.0, 30.0):
        run_id = f"remote-{ttl:g}"
        assert pitstop_exe("enqueue", "slow:wf", "--run-id", run_id, store=url,
                           cwd=cwd).code == 0
        with pitstop.open_store(url) as store:
            lease = store.acquire(run_id, "elsewhere:4243:def", ttl=ttl)
        worker = pitstop_exe("worker", "--workflow", "slow:wf", "--until-idle", "--poll", "0.2",
                             "--json", "-v", store=url, cwd=cwd)
        assert worker.code == 0, worker
        assert worker.json["by_status"] == {"completed": 1}  # it did not exit before the expiry
        with pitstop.open_store(url) as store:
            done = store.latest(run_id)
            assert done is not None and done.state["done"] is True
            assert done.created_at >= datetime.fromtimestamp(lease.expires_at, UTC)
        if _started_at(worker.err) < lease.expires_at:
            return
    pytest.fail("no worker started within a 30 s lease")


@pytest.mark.slow
def test_until_idle_does_not_wait_for_a_live_owner_on_this_host(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'runs.db'}"
    assert pitstop_exe("enqueue", "slow:wf", "--run-id", "mine", store=url, cwd=cwd).code == 0
    with pitstop.open_store(url) as store:
        store.acquire("mine", owner_id(), ttl=120)  # this live process
    worker = pitstop_exe("worker", "--workflow", "slow:wf", "--until-idle", "--json",
                         store=url, cwd=cwd)
    assert worker.code == 0, worker
    assert worker.json["executed"] == 0


@pytest.mark.slow
def test_a_claimed_run_never_shows_as_queued(cwd: Path) -> None:
    url = f"sqlite:///{cwd / 'runs.db'}"
    marker = cwd / "claimed.marker"
    assert pitstop_exe("enqueue", "slow:wf", "--run-id", "q", store=url, cwd=cwd).code == 0
    assert pitstop_exe("runs", "--json", store=url, cwd=cwd).json["runs"][0]["status"] == \
        "queued"
    assert PITSTOP is not None
    worker = subprocess.Popen(
        [PITSTOP, "worker", "--workflow", "slow:wf", "-q"], cwd=cwd,
        env={**os.environ, "PITSTOP_STORE": url, "HANG_MARKER": str(marker)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():  # the worker claimed it and is inside its first step
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        listed = pitstop_exe("runs", "--json", store=url, cwd=cwd).json["runs"][0]
        assert listed["status"] == "running" and listed["lease"] == "held"
        assert pitstop_exe("runs", "--status", "queued", "--json", store=url,
                           cwd=cwd).json["runs"] == []
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
