"""Real faults under real runs: a network that cuts, blacks out or goes away in front of
PostgreSQL, a disk that fills up, files and directories the process may not write.

The faults come from tests/faults.py (a TCP proxy, RLIMIT_FSIZE and a small tmpfs, dropped
file capabilities); pitstop meets them through the operating system as it would in
production. Timeouts are short so the whole module stays quick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import BACKENDS, drop_pg_schema, pg_schema_url
from faults import (
    FaultProxy,
    file_size_limit,
    pitstop_cli,
    run,
    small_disk,
    unprivileged,
)
from pitstop import RunNotFoundError, RunStatus, StoreError, Worker

needs_postgres = pytest.mark.skipif("postgres" not in BACKENDS, reason="no PostgreSQL backend")


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"f_{uuid.uuid4().hex[:12]}"
    yield name
    drop_pg_schema(name)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    relay = FaultProxy()
    yield relay
    relay.close()


def proxied_url(proxy: FaultProxy, schema: str, **options: str) -> str:
    """The test schema's URL through the proxy, with short timeouts by default."""
    return proxy.url(pg_schema_url(schema), **{"connect_timeout": "1", **options})


def _payments(calls: list[str], proxy: FaultProxy, outage: float) -> pitstop.Workflow:
    wf = pitstop.Workflow("payments")

    @wf.step
    def charge(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        proxy.down()  # the server goes away just as the effect looks for its record
        threading.Timer(outage, proxy.heal).start()
        receipt = ctx.effect("charge", lambda: calls.append("charged") or "receipt-1")
        return {"receipt": receipt}

    return wf


# -- the network ---------------------------------------------------------------------------------


@needs_postgres
@pytest.mark.slow
def test_an_effect_rides_out_a_store_that_is_briefly_away(
    proxy: FaultProxy, schema: str
) -> None:
    """A transient StoreError inside ctx.effect used to fail the step (and the run): the
    effect's store calls are retried with backoff, and the effect still runs once."""
    calls: list[str] = []
    wf = _payments(calls, proxy, outage=1.5)
    with pitstop.open_store(proxied_url(proxy, schema)) as store:
        result = wf.start(store, {}, run_id="pay")
        assert result.status is RunStatus.COMPLETED, result.error
        assert result.state["receipt"] == "receipt-1"
        assert calls == ["charged"]
        assert store.effects("pay") and store.verify() == []


@needs_postgres
@pytest.mark.slow
def test_a_worker_outlives_a_store_that_goes_away(
    proxy: FaultProxy, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose claim fails because the server is away backs off and claims again
    once it is back, instead of dying (or spinning)."""
    wf = pitstop.Workflow("jobs")
    wf.step(name="work")(lambda state: {"done": True})
    with pitstop.open_store(pg_schema_url(schema)) as direct:
        ids = [wf.enqueue(direct, {}).id for _ in range(5)]
    store = pitstop.open_store(proxied_url(proxy, schema))
    worker = Worker(store, [wf], poll_interval=0.05, on_error=pitstop.Retry(backoff=0.1))
    proxy.down()
    crashed: list[BaseException] = []

    def work() -> None:
        try:
            worker.run(handle_signals=False)
        except BaseException as exc:  # pragma: no cover - the failure this test is about
            crashed.append(exc)

    with caplog.at_level(logging.WARNING, logger="pitstop.worker"):
        thread = threading.Thread(target=work)
        thread.start()
        try:
            time.sleep(2.0)
            assert thread.is_alive(), crashed
            proxy.heal()
            deadline = time.monotonic() + 30
            with pitstop.open_store(pg_schema_url(schema)) as direct:  # watch from outside
                while time.monotonic() < deadline:
                    if all(direct.get_run(i).status is RunStatus.COMPLETED for i in ids):
                        break
                    time.sleep(0.1)
        finally:
            worker.stop()
            thread.join(30)
            store.close()
    assert not crashed
    assert worker.stats.by_status["completed"] == 5
    claims = [r for r in caplog.records if "event=store_error" in r.getMessage()]
    assert 1 <= len(claims) <= 10  # backed off while away: no tight loop


@needs_postgres
@pytest.mark.parametrize("deliver", [True, False], ids=["committed", "not-committed"])
@pytest.mark.slow
def test_a_start_whose_commit_is_cut_converges_on_one_run(
    proxy: FaultProxy, schema: str, deliver: bool
) -> None:
    """The connection is reset on ``start``'s COMMIT (its only one: the run's row and its
    input checkpoint; the steps' saves are autocommitted statements), after the server got
    it or before: the caller cannot tell whether it was applied. The same start converges on
    one run either way, with its input checkpoint written once."""
    wf = pitstop.Workflow("orders")
    wf.step(name="ship")(lambda state: {"shipped": state["order"]})
    with pitstop.open_store(proxied_url(proxy, schema)) as store:
        store.runs()  # connections are up before the trigger is armed
        proxy.cut_on(b"COMMIT", deliver=deliver)
        result = wf.start(store, {"order": 7}, run_id="order-7")
        assert proxy.triggered.is_set()
        assert result.status is RunStatus.COMPLETED and result.state["shipped"] == 7
        history = store.history("order-7", limit=None)
        assert [h.source for h in history][-1] == "input"
        assert sum(h.source == "input" for h in history) == 1
        assert store.verify() == []


@needs_postgres
@pytest.mark.parametrize("deliver", [True, False], ids=["committed", "not-committed"])
@pytest.mark.slow
def test_an_enqueue_whose_commit_is_cut_converges_on_one_queued_run(
    proxy: FaultProxy, schema: str, deliver: bool
) -> None:
    """``enqueue``'s one COMMIT (the run's row with its input) is cut, after the server got
    it or before: the call converges on one queued run either way, which a worker runs."""
    wf = pitstop.Workflow("orders")
    wf.step(name="ship")(lambda state: {"shipped": state["order"]})
    with pitstop.open_store(proxied_url(proxy, schema)) as store:
        store.runs()
        proxy.cut_on(b"COMMIT", deliver=deliver)
        queued = wf.enqueue(store, {"order": 3}, run_id="order-3")
        assert proxy.triggered.is_set()
        assert queued.status is RunStatus.QUEUED and queued.head_id is not None
        assert pitstop.Worker(store, [wf]).run(until_idle=True, handle_signals=False).executed == 1
        assert store.latest("order-3").state["shipped"] == 3  # type: ignore[union-attr]
        assert sum(h.source == "input" for h in store.history("order-3", limit=None)) == 1
        assert store.verify() == []


@needs_postgres
@pytest.mark.slow
def test_a_start_cut_while_the_store_stays_away_converges_when_repeated(
    proxy: FaultProxy, schema: str
) -> None:
    wf = pitstop.Workflow("orders")
    wf.step(name="ship")(lambda state: {"shipped": state["order"]})
    with pitstop.open_store(proxied_url(proxy, schema)) as store:
        store.runs()
        proxy.cut_on(b"COMMIT", deliver=True, then_down=True)
        with pytest.raises(StoreError):
            wf.start(store, {"order": 8}, run_id="order-8")
        proxy.heal()
        again = wf.start(store, {"order": 8}, run_id="order-8")  # at once: no lease to wait out
        assert again.status is RunStatus.COMPLETED
        assert sum(h.source == "input" for h in store.history("order-8", limit=None)) == 1


def _within(limit: float, fn: Any) -> Any:
    """``fn()`` in a thread: its result, or its exception raised here; fails the test (rather
    than hanging the suite) if it is still running after ``limit`` seconds."""
    outcome: list[tuple[bool, Any]] = []

    def call() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(limit)
    assert outcome, f"still waiting after {limit:.0f}s"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


# Short timeouts: a connection silent for statement_timeout + connect_timeout is stalled.
_QUICK = {"statement_timeout": "1", "connect_timeout": "1", "busy_timeout": "2"}


@needs_postgres
@pytest.mark.parametrize("size", [10, 20 << 20], ids=["small", "20MiB"])
@pytest.mark.slow
def test_a_write_into_a_silent_network_fails_instead_of_hanging(
    proxy: FaultProxy, schema: str, size: int
) -> None:
    """The network stops forwarding in the middle of a write, closing nothing (the kernel
    still acknowledges, so TCP timeouts never fire): the write ends in a StoreError naming
    the stall, and once the network is back the same write succeeds."""
    value = b"x" * size
    with pitstop.open_store(proxied_url(proxy, schema, **_QUICK)) as store:
        store.save("r", {"a": 1})
        proxy.blackhole_on(b"pitstop_effects")
        with pytest.raises(StoreError, match=r"stalled|unreachable"):
            _within(60, lambda: store.record_effect("r", "download", value))
        assert proxy.triggered.is_set()
        proxy.heal()
        assert store.record_effect("r", "download", value) == value
        assert store.get_effect("r", "download") == (True, value)


@needs_postgres
@pytest.mark.slow
def test_a_read_from_a_silent_network_fails_instead_of_hanging(
    proxy: FaultProxy, schema: str
) -> None:
    with pitstop.open_store(proxied_url(proxy, schema, **_QUICK)) as store:
        store.save("r", {"a": 1})
        proxy.blackhole()
        with pytest.raises(StoreError, match=r"stalled|unreachable|no connection"):
            _within(60, lambda: store.latest("r"))
        proxy.heal()
        assert store.latest("r").state == {"a": 1}  # type: ignore[union-attr]


@needs_postgres
@pytest.mark.slow
def test_a_start_whose_commit_stalls_converges_when_repeated(
    proxy: FaultProxy, schema: str
) -> None:
    """``start``'s COMMIT goes into a black hole: the caller gets a StoreError (the outcome
    is unknown), and the same start, once the network is back, converges on one run."""
    wf = pitstop.Workflow("orders")
    wf.step(name="ship")(lambda state: {"shipped": state["order"]})
    with pitstop.open_store(proxied_url(proxy, schema, **_QUICK)) as store:
        store.runs()
        proxy.blackhole_on(b"COMMIT")
        with pytest.raises(StoreError):
            _within(60, lambda: wf.start(store, {"order": 9}, run_id="order-9"))
        proxy.heal()
        again = wf.start(store, {"order": 9}, run_id="order-9")
        assert again.status is RunStatus.COMPLETED and again.state["shipped"] == 9
        assert sum(h.source == "input" for h in store.history("order-9", limit=None)) == 1
        assert store.verify() == []


@needs_postgres
@pytest.mark.parametrize("deliver", [True, False], ids=["committed", "not-committed"])
@pytest.mark.slow
def test_after_a_start_lost_in_its_commit_resume_says_what_happened(
    proxy: FaultProxy, schema: str, deliver: bool
) -> None:
    """``start``'s COMMIT is cut and the store stays away, so the caller only knows the
    outcome is unknown. The run's row commits with its input checkpoint, so once the store
    is back there is the whole run, which ``resume`` continues, or no run at all, which
    ``resume`` says (RunNotFoundError: there is no input to start it from; the caller's
    start again creates it). The repeated start converges on one run either way."""
    wf = pitstop.Workflow("orders")
    wf.step(name="ship")(lambda state: {"shipped": state["order"]})
    with pitstop.open_store(proxied_url(proxy, schema, busy_timeout="2")) as store:
        store.runs()
        proxy.cut_on(b"COMMIT", deliver=deliver, then_down=True)
        with contextlib.suppress(StoreError):  # (or it converged before the store went away)
            wf.start(store, {"order": 5}, run_id="order-5")
        assert proxy.triggered.is_set()
        proxy.heal()
        with pitstop.open_store(pg_schema_url(schema)) as direct:  # what did get written
            runs = direct.count_runs()
            input_committed = direct.latest("order-5") if runs else None
        assert bool(runs) == (input_committed is not None)  # the whole run or nothing
        if input_committed is not None:
            resumed = _once_back(lambda: wf.resume(store, "order-5"))
            assert resumed.status is RunStatus.COMPLETED and resumed.state["shipped"] == 5
        else:
            with pytest.raises(RunNotFoundError, match="order-5"):
                _once_back(lambda: wf.resume(store, "order-5"))
        again = _once_back(lambda: wf.start(store, {"order": 5}, run_id="order-5"))
        assert again.status is RunStatus.COMPLETED and again.state["shipped"] == 5
        assert sum(h.source == "input" for h in store.history("order-5", limit=None)) == 1
        assert store.verify() == []


def _once_back(fn: Any, patience: float = 30.0) -> Any:
    """``fn()``, retried while it fails with StoreError: the pool reconnects to a server
    that is back with a backoff of its own, so the first calls may still fail."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return fn()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _chain(calls: list[str]) -> pitstop.Workflow:
    # A short lease: a run whose owner lost its connection mid-step is taken back soon.
    wf = pitstop.Workflow("chain", lease_ttl=1.0)

    @wf.step
    def first(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        token = ctx.effect("token", lambda: calls.append(f"{ctx.run_id}:token") or ctx.run_id)
        return pitstop.goto("more", {"n": state["n"], "token": token, "steps": 1})

    @wf.step
    def more(state: dict[str, Any]) -> Any:
        if state["steps"] < 5:
            return pitstop.goto("more", {**state, "steps": state["steps"] + 1})
        return {**state, "done": True}

    return wf


def _until_complete(wf: pitstop.Workflow, store: pitstop.Store, run_id: str, n: int) -> int:
    """What a careful caller does: start (the same run id and input) or resume until the
    run completes, retrying store errors. Returns the number of attempts."""
    for attempt in range(1, 200):
        try:
            try:
                result = wf.resume(store, run_id)
            except RunNotFoundError:
                result = wf.start(store, {"n": n}, run_id=run_id)
        except (StoreError, pitstop.RunBusyError):
            time.sleep(0.1)
            continue
        if result.status is RunStatus.COMPLETED:
            return attempt
    raise AssertionError(f"run {run_id!r} did not complete")


RUNS = 20


@needs_postgres
@pytest.mark.slow
def test_runs_cut_at_random_all_complete(proxy: FaultProxy, schema: str) -> None:
    """Twenty runs of six checkpoints and an effect each, while the proxy resets every
    connection at random moments (every 0.2-0.8 s): every run completes, with one input
    checkpoint, its state intact, and the store verifies clean."""
    rng = random.Random(18)
    calls: list[str] = []
    wf = _chain(calls)
    stop = threading.Event()
    cuts = 0

    def cutter() -> None:
        nonlocal cuts
        while not stop.wait(rng.uniform(0.2, 0.8)):
            proxy.cut()
            cuts += 1

    store = pitstop.open_store(proxied_url(proxy, schema, busy_timeout="2"))
    thread = threading.Thread(target=cutter)
    thread.start()
    try:
        attempts = [_until_complete(wf, store, f"cut-{i}", i) for i in range(RUNS)]
    finally:
        stop.set()
        thread.join()
    try:
        assert cuts >= 5 and len(attempts) == RUNS  # (most absorbed by the store's retries)
        for i in range(RUNS):
            run_id = f"cut-{i}"
            assert store.get_run(run_id).status is RunStatus.COMPLETED
            latest = store.latest(run_id)
            assert latest is not None
            assert latest.state == {"n": i, "token": run_id, "steps": 5, "done": True}
            history = store.history(run_id, limit=None)
            assert sum(h.source == "input" for h in history) == 1
        assert store.verify() == []
    finally:
        store.close()


# -- the disk ------------------------------------------------------------------------------------

# 40 steps each adding 32 KiB of incompressible bytes: about 1.3 MiB of checkpoints.
GROW = """
import os
import pitstop

wf = pitstop.Workflow("grow")


@wf.step
def add(state):
    chunks = [*state.get("chunks", []), os.urandom(32 * 1024)]
    if len(chunks) < 40:
        return pitstop.goto("add", {"chunks": chunks})
    return {"chunks": chunks, "done": True}
"""


def _cli(where: Path, *args: str, store: Path, preexec: Callable[[], None] | None = None,
         as_user: bool = False) -> subprocess.CompletedProcess[str]:
    argv = pitstop_cli(*args, "--store", f"sqlite:///{store}")
    return run(unprivileged(argv) if as_user else argv, cwd=where, preexec=preexec,
               env={"PITSTOP_DEBUG": ""})


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], done.stderr
    return lines[0]


@contextlib.contextmanager
def _full_disk(kind: str, tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None] | None,
                                                            Callable[[], None]]]:
    """(directory for the store, preexec for the commands that hit the limit, and a function
    that frees space): a 600 KiB tmpfs (ENOSPC), or RLIMIT_FSIZE of 600 KB (EFBIG)."""
    if kind == "rlimit":
        yield tmp_path, file_size_limit(600_000), lambda: None
        return
    try:
        disk = small_disk("600k")
        place = disk.__enter__()
    except PermissionError as exc:
        pytest.skip(str(exc))
    try:
        def grow() -> None:
            subprocess.run(["mount", "-o", "remount,size=16m", str(place)], check=True)

        yield place, None, grow
    finally:
        disk.__exit__(None, None, None)


@pytest.mark.parametrize("kind", ["tmpfs", "rlimit"])
@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_run_completes_once_space_is_freed(
    tmp_path: Path, kind: str
) -> None:
    (tmp_path / "grow.py").write_text(GROW)
    with _full_disk(kind, tmp_path) as (place, limit, free_space):
        store = place / "runs.db"
        line = _one_line(_cli(tmp_path, "start", "grow:wf", "--run-id", "g",
                              store=store, preexec=limit))
        assert str(store) in line and "space" in line, line
        assert _cli(tmp_path, "verify", store=store).returncode == 0
        free_space()
        done = _cli(tmp_path, "resume", "g", "--workflow", "grow:wf", store=store)
        assert done.returncode == 0, done.stderr
        assert "completed" in done.stdout
        checked = _cli(tmp_path, "verify", store=store)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        with pitstop.open_store(f"sqlite:///{store}") as opened:
            latest = opened.latest("g")
            assert latest is not None and latest.state["done"] is True
            assert len(latest.state["chunks"]) == 40


@pytest.mark.parametrize("what", ["file", "directory"])
@pytest.mark.slow
def test_a_read_only_store_is_one_line_and_the_run_completes_once_writable(
    tmp_path: Path, what: str
) -> None:
    (tmp_path / "grow.py").write_text(GROW)
    place = tmp_path / "ro"
    place.mkdir()
    store = place / "runs.db"
    assert _cli(tmp_path, "enqueue", "grow:wf", "--run-id", "g", store=store).returncode == 0
    target = store if what == "file" else place
    mode = target.stat().st_mode
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        line = _one_line(_cli(tmp_path, "resume", "g", "--workflow", "grow:wf", store=store,
                              as_user=True))
        assert str(store) in line and "writ" in line, line
        assert "writable" in line, line
        if what == "file":  # reading needs only the directory (for -shm) to be writable
            listed = _cli(tmp_path, "runs", store=store, as_user=True)
            assert listed.returncode == 0 and "queued" in listed.stdout, listed.stderr
    finally:
        target.chmod(mode)
    assert sorted(os.listdir(place))[0] == "runs.db"
    done = _cli(tmp_path, "resume", "g", "--workflow", "grow:wf", store=store)
    assert done.returncode == 0 and "completed" in done.stdout, done.stderr
    assert _cli(tmp_path, "verify", store=store).returncode == 0
