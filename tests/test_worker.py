"""Workers on a shared store: real worker processes, SIGKILL and SIGTERM, SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import ROOT
from pitstop import Retry, RunStatus, Worker

WORKER = """
import logging, sys
sys.path.insert(0, "tests")
import pitstop, workflows
logging.basicConfig(level=logging.WARNING)
url, variant, concurrency = sys.argv[1:4]
wf = workflows.jobs if variant == "normal" else workflows.jobs_short_lease
store = pitstop.open_store(url)
stats = pitstop.Worker(store, [wf], concurrency=int(concurrency), poll_interval=0.2).run(
    until_idle=len(sys.argv) > 4)
print(stats.executed, dict(stats.by_status), flush=True)
"""


def _worker(url: str, variant: str = "normal", concurrency: int = 2, *,
            until_idle: bool = True) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", WORKER, url, variant, str(concurrency)]
    if until_idle:
        args.append("idle")
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "JOB_STEP_DELAY": "0.002"})


def _log_lines(log: Path) -> list[tuple[str, str, int, float, float]]:
    out = []
    for line in log.read_text().splitlines():
        run_id, step, pid, start, end = line.split()
        out.append((run_id, step, int(pid), float(start), float(end)))
    return out


def _assert_exclusive_and_complete(store: pitstop.Store, runs: list[str], log: Path,
                                   expect_once: bool = True) -> None:
    lines = _log_lines(log)
    by_run: dict[str, list[tuple[str, str, int, float, float]]] = defaultdict(list)
    for entry in lines:
        by_run[entry[0]].append(entry)
    for run_id in runs:
        run = store.get_run(run_id)
        assert run.status is RunStatus.COMPLETED, run_id
        final = store.latest(run_id)
        assert final is not None
        assert final.state == __import__("workflows").jobs_expected(final.state["n"], str(log))
        # one linear history: no two checkpoints share a parent (no silent fork)
        history = store.history(run_id, limit=None)
        parents = [h.parent_id for h in history]
        assert len(parents) == len(set(parents)), run_id
        completions = [h for h in history if h.metadata.get("status") == "completed"]
        assert len(completions) == 1, run_id
        steps = sorted(by_run[run_id], key=lambda e: e[3])
        if expect_once:
            assert [e[1] for e in steps] == ["fetch", "transform", "load"], steps
        # never two owners at once: executions of one run do not overlap in time
        for a, b in itertools.pairwise(steps):
            assert a[4] <= b[3] + 1e-3 or a[2] == b[2], (run_id, a, b)


def test_worker_in_process_runs_queued_waiting_and_due_runs(tmp_path: Path) -> None:
    import workflows

    with pitstop.open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        log = str(tmp_path / "log")
        ids = [workflows.jobs.enqueue(store, {"n": i, "log": log, "trail": []}).id
               for i in range(10)]
        waiting = workflows.approval.start(store, {}).run_id
        sleeper = pitstop.Workflow("sleeper")
        sleeper.step(name="nap")(lambda state, ctx: ctx.sleep(0.2) or {"slept": True})
        napping = sleeper.start(store, {}).run_id
        worker = Worker(store, [workflows.jobs, workflows.approval, sleeper], concurrency=3,
                        poll_interval=0.05)
        wake_at = store.get_run(napping).wake_at
        assert wake_at is not None
        stats = worker.run(until_idle=True, handle_signals=False)
        ended = time.time()
        # The nap is runnable only once due: a pass that ended before then left it asleep
        # (until_idle waits for no future wake); a slower one (a loaded machine) may run it.
        napped = store.get_run(napping).status is RunStatus.COMPLETED
        if ended < wake_at.timestamp():
            assert not napped
        assert stats.by_status["completed"] == 10 + napped
        assert store.get_run(waiting).status is RunStatus.WAITING  # nothing to do yet
        pitstop.send(store, waiting, "decision", {"approved": True, "by": "w"})
        time.sleep(max(0.0, wake_at.timestamp() - time.time()) + 0.05)
        worker.run(until_idle=True, handle_signals=False)
        assert store.get_run(waiting).status is RunStatus.COMPLETED
        assert store.get_run(napping).status is RunStatus.COMPLETED
        _assert_exclusive_and_complete(store, ids, Path(log))


def test_worker_limits_per_workflow(tmp_path: Path) -> None:
    import workflows

    with pitstop.open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        log = str(tmp_path / "log")
        for i in range(6):
            workflows.jobs.enqueue(store, {"n": i, "log": log, "trail": []})
        worker = Worker(store, [workflows.jobs], concurrency=4, limits={"jobs": 1})
        peak = 0
        original = worker._execute

        def watch(lease: Any, workflow: str) -> None:
            nonlocal peak
            peak = max(peak, len(worker._active))
            original(lease, workflow)

        worker._execute = watch  # type: ignore[method-assign]
        assert worker.run(until_idle=True, handle_signals=False).executed == 6
        assert peak == 1


@pytest.mark.slow
def test_four_worker_processes_run_200_runs_exactly_once(shared_url: str, tmp_path: Path) -> None:
    import workflows

    log = tmp_path / "log"
    with pitstop.open_store(shared_url) as store:
        runs = [workflows.jobs.enqueue(store, {"n": i, "log": str(log), "trail": []},
                                       priority=i % 3).id for i in range(200)]
    workers = [_worker(shared_url) for _ in range(4)]
    outputs = [w.communicate(timeout=240) for w in workers]
    for w, (_out, err) in zip(workers, outputs, strict=True):
        assert w.returncode == 0, err
    executed = [int(out.split()[0]) for out, _ in outputs]
    assert sum(executed) == 200  # every run exactly once, none lost
    assert sum(1 for e in executed if e) >= 2  # the work was actually shared
    with pitstop.open_store(shared_url) as store:
        _assert_exclusive_and_complete(store, runs, log)
        assert store.verify() == []


@pytest.mark.slow
def test_killed_worker_runs_are_taken_over_after_the_lease(shared_url: str,
                                                            tmp_path: Path) -> None:
    import workflows

    log = tmp_path / "log"
    with pitstop.open_store(shared_url) as store:
        runs = [workflows.jobs_short_lease.enqueue(store, {"n": i, "log": str(log), "trail": []}).id
                for i in range(12)]
    env_slow = {"JOB_STEP_DELAY": "0.3"}
    victim = subprocess.Popen(
        [sys.executable, "-c", WORKER, shared_url, "short", "4"], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env_slow},
    )
    deadline = time.monotonic() + 60
    with pitstop.open_store(shared_url) as store:
        while not any(store.get_run(r).owner for r in runs):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    time.sleep(0.4)  # mid-step
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    with pitstop.open_store(shared_url) as store:
        orphaned = [r for r in runs if store.get_run(r).owner]
    assert orphaned  # it died holding runs
    survivor = _worker(shared_url, "short", 4, until_idle=False)  # a long-running worker
    deadline = time.monotonic() + 120
    with pitstop.open_store(shared_url) as store:
        while any(store.get_run(r).status is not RunStatus.COMPLETED for r in runs):
            assert time.monotonic() < deadline, "orphaned runs were never taken over"
            time.sleep(0.1)
    survivor.send_signal(signal.SIGTERM)
    _out, err = survivor.communicate(timeout=60)
    assert survivor.returncode == 0, err
    with pitstop.open_store(shared_url) as store:
        # each run ends with the uninterrupted state; an interrupted step may have run twice
        # (its effect was not recorded before the kill) but never concurrently
        _assert_exclusive_and_complete(store, runs, log, expect_once=False)


@pytest.mark.slow
def test_sigterm_finishes_the_step_releases_and_exits_0(shared_url: str, tmp_path: Path) -> None:
    import workflows

    log = tmp_path / "log"
    with pitstop.open_store(shared_url) as store:
        runs = [workflows.jobs.enqueue(store, {"n": i, "log": str(log), "trail": []}).id
                for i in range(4)]
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, shared_url, "normal", "4"], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "JOB_STEP_DELAY": "0.5"},
    )
    deadline = time.monotonic() + 60
    with pitstop.open_store(shared_url) as store:
        while not any(store.get_run(r).owner for r in runs):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    time.sleep(0.2)
    worker.send_signal(signal.SIGTERM)
    _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    with pitstop.open_store(shared_url) as store:
        for run_id in runs:
            run = store.get_run(run_id)
            assert run.owner is None  # released, not left to expire
            assert run.status in (RunStatus.RUNNING, RunStatus.QUEUED)
    finisher = _worker(shared_url)
    assert finisher.communicate(timeout=120)[0].split()[0] == "4"
    with pitstop.open_store(shared_url) as store:
        _assert_exclusive_and_complete(store, runs, log)


# -- runs that cannot be executed, and runs that failed -----------------------------------------

FAST_RETRY = Retry(attempts=3, backoff=0.05, multiplier=2.0, jitter=0.0)


def test_a_run_that_cannot_be_executed_is_backed_off_then_failed_not_spun_on(
    shared_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A queued run with no checkpoint (created, its input never saved) used to wedge the
    pool: 55,772 log lines in 15 s, the healthy runs behind it never executed. Now it is
    retried with backoff a bounded number of times, then marked failed with the error."""
    import workflows

    with pitstop.open_store(shared_url) as store:
        store.create_run("broken", workflow="approval", status=RunStatus.QUEUED, priority=9)
        healthy = [workflows.approval.enqueue(store, {}).id for _ in range(3)]
        worker = Worker(store, [workflows.approval], poll_interval=0.05, on_error=FAST_RETRY)
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="pitstop.worker"):
            stats = worker.run(until_idle=True, max_runs=30, handle_signals=False)
        assert time.monotonic() - started < 20
        assert stats.errors == FAST_RETRY.attempts  # tried three times, not spun on
        assert stats.given_up == 1
        assert stats.by_status["waiting"] == 3
        for run_id in healthy:
            assert store.get_run(run_id).status is RunStatus.WAITING
        broken = store.get_run("broken")
        assert broken.status is RunStatus.FAILED
        error = broken.metadata["error"]
        assert error["type"] == "pitstop.errors.RunNotStartedError"
        assert "has no checkpoint" in error["message"] and error["attempts"] == 3
        assert broken.owner is None  # its lease was given back
        claims = [r for r in caplog.records
                  if "event=claimed" in r.getMessage() and "run=broken" in r.getMessage()]
        assert len(claims) == FAST_RETRY.attempts


def _flaky(marker: Path, failures: int) -> pitstop.Workflow:
    wf = pitstop.Workflow("flaky")

    @wf.step
    def call_api(state: dict[str, Any]) -> dict[str, Any]:
        count = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(count + 1))
        if count < failures:
            raise ConnectionError(f"blip {count + 1}")
        return {"calls": count + 1}

    return wf


def _drain(store: pitstop.Store, wf: pitstop.Workflow, until: float = 10.0) -> None:
    """Run a worker until the run is neither waiting for a retry nor runnable."""
    deadline = time.monotonic() + until
    worker = Worker(store, [wf], poll_interval=0.02, retry_failed=FAST_RETRY)
    while time.monotonic() < deadline:
        worker.run(until_idle=True, handle_signals=False)
        if store.get_run("r").status is not RunStatus.WAITING:
            return
        time.sleep(0.05)


def test_retry_failed_brings_a_failed_run_back(tmp_path: Path) -> None:
    wf = _flaky(tmp_path / "calls", failures=2)
    with pitstop.open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        wf.enqueue(store, {}, run_id="r")
        _drain(store, wf)
        assert store.get_run("r").status is RunStatus.COMPLETED
        assert store.latest("r").state == {"calls": 3}  # type: ignore[union-attr]
        parked = [h for h in store.history("r", limit=None) if h.source == "retry"]
        assert [p.metadata["error"]["message"] for p in reversed(parked)] == ["blip 1", "blip 2"]
        assert all(p.metadata["status"] == "waiting" for p in parked)


def test_retry_failed_gives_up_after_its_attempts(tmp_path: Path) -> None:
    wf = _flaky(tmp_path / "calls", failures=10)
    with pitstop.open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        wf.enqueue(store, {}, run_id="r")
        _drain(store, wf)
        assert store.get_run("r").status is RunStatus.FAILED
        assert (tmp_path / "calls").read_text() == str(FAST_RETRY.attempts)
        assert store.latest("r").metadata["error"]["message"] == "blip 3"  # type: ignore[union-attr]


@pytest.mark.slow
def test_stop_ends_an_idle_worker_at_once_whatever_its_poll_interval(
    shared_url: str,
) -> None:
    """An idle worker waits for work up to its poll interval (SQLite: a sleep; PostgreSQL: a
    wait for NOTIFY). ``stop()`` (what SIGTERM calls) is noticed within a fraction of a
    second even with a poll interval of a minute, and a run queued meanwhile still wakes a
    PostgreSQL worker at once."""
    import threading

    wf = pitstop.Workflow("idle")
    wf.step(name="only")(lambda state: {"done": True})
    with pitstop.open_store(shared_url) as store:
        store.runs()
        worker = Worker(store, [wf], poll_interval=60)
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        thread.start()
        try:
            time.sleep(1.2)  # past a few of its waits' slices
            if shared_url.startswith("postgresql"):
                with pitstop.open_store(shared_url) as other:
                    wf.enqueue(other, {}, run_id="late")
                    deadline = time.monotonic() + 20
                    while other.get_run("late").status is not RunStatus.COMPLETED:
                        assert time.monotonic() < deadline, "the NOTIFY did not wake it"
                        time.sleep(0.05)
                time.sleep(1.2)
        finally:
            worker.stop()
            thread.join(timeout=20)
        assert not thread.is_alive(), "stop() waited out the poll interval"
