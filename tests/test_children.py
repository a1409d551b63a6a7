"""Child runs: ``ctx.run_child`` / ``ctx.run_children`` — fan-out, fan-in, sub-workflows."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import BACKENDS, POSTGRES_SKIP, ROOT, drop_pg_schema, pg_schema_url
from pitstop import ChildFailedError, ChildRunError, RunStatus, Worker
from pitstop.store import Store

# -- workflows ------------------------------------------------------------------------------------

double = pitstop.Workflow("double")


@double.step
def times_two(state: dict[str, Any]) -> dict[str, Any]:
    if state.get("fail"):
        raise ValueError(f"cannot double {state['x']}")
    return {"y": state["x"] * 2}


approve = pitstop.Workflow("approve")


@approve.step(wait_for="ok")
def decision(state: dict[str, Any], ok: Any) -> dict[str, Any]:
    return {"ok": ok}


def _fan_parent(name: str, n: int = 3) -> tuple[pitstop.Workflow, list[str]]:
    wf = pitstop.Workflow(name)
    executions: list[str] = []

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        executions.append(ctx.step)
        results = ctx.run_children([(double, {"x": i}) for i in range(n)])
        return {"ys": [r.state["y"] for r in results]}

    @wf.step
    def total(state: dict[str, Any]) -> dict[str, Any]:
        return {"total": sum(state["ys"])}

    return wf, executions


# -- in one process -------------------------------------------------------------------------------


def test_children_finishing_at_once_continue_the_step_with_their_states(store: Store) -> None:
    parent, _ = _fan_parent("fan")
    result = parent.start(store, {}, run_id="p")
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"ys": [0, 2, 4], "total": 6}

    children = store.children("p")
    assert [c.id for c in children] == ["p.0-0", "p.0-1", "p.0-2"]
    first = store.history("p")[-1]  # the input checkpoint the step started from
    for child in children:
        assert child.status is RunStatus.COMPLETED
        assert child.parent_run == "p"
        assert child.metadata["parent"]["run_id"] == "p"
        assert child.metadata["parent"]["checkpoint_id"] == first.id
        assert child.metadata["parent"]["step"] == "fan"
    assert [r.id for r in store.runs(parent_run="p")] == ["p.0-2", "p.0-1", "p.0-0"]
    assert store.count_runs(parent_run="p") == {"completed": 3}
    # The parent's history says where the children were started.
    marked = [h for h in store.history("p") if h.metadata.get("children")]
    assert len(marked) == 1
    assert marked[0].metadata["children"] == ["p.0-0", "p.0-1", "p.0-2"]
    assert store.inputs("p") == {}  # every child's outcome was consumed


def test_a_family_summary_counts_every_child_and_lists_the_first(store: Store) -> None:
    parent = pitstop.Workflow("summarised")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(double, {"x": i}) for i in range(24)] + [(approve, {})])
        return {}

    assert parent.start(store, {}, run_id="p").status is RunStatus.WAITING
    counts, first = store.children_summary("p", first=5)
    assert counts == {"completed": 24, "waiting": 1}
    assert [c.id for c in first] == [f"p.0-{i}" for i in range(5)]
    assert first == store.children("p", limit=5)
    assert store.children_summary("p.0-0") == ({}, [])
    assert asyncio.run(store.aio.children_summary("p", first=1))[1] == first[:1]


def test_waiting_child_parks_the_parent_holding_nothing_until_it_finishes(store: Store) -> None:
    parent = pitstop.Workflow("asker")
    executions = []

    @parent.step
    def ask(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        executions.append(1)
        return {"approved": ctx.run_child(approve, {}, run_id="ask-1").state["ok"]}

    waiting = parent.start(store, {}, run_id="p")
    assert waiting.status is RunStatus.WAITING
    assert waiting.waiting_for == ("child:ask-1",)
    run = store.get_run("p")
    assert run.status is RunStatus.WAITING and run.owner is None and run.wake_at is None
    assert store.get_run("ask-1").status is RunStatus.WAITING
    # Not runnable yet: a resume finds the child unfinished and waits again.
    assert parent.resume(store, "p").status is RunStatus.WAITING
    with pytest.raises(pitstop.InputError, match="delivered by the child runs themselves"):
        pitstop.send(store, "p", "child:ask-1", {"status": "completed"})  # no faking it

    from pitstop.ui.views import oldest_waiting

    # The inspector's inbox (what waits for a person) has the child, not the parent.
    assert [r.id for r in oldest_waiting(store, 10)[1]] == ["ask-1"]
    pitstop.send(store, "ask-1", "ok", True)
    assert approve.resume(store, "ask-1").status is RunStatus.COMPLETED
    woken = store.get_run("p")
    assert woken.wake_at is not None  # the child's completion made the parent runnable
    assert set(store.inputs("p")) == {"child:ask-1"}
    assert store.inputs("p")["child:ask-1"].payload["status"] == "completed"

    done = parent.resume(store, "p")
    assert done.status is RunStatus.COMPLETED
    assert done.state == {"approved": True}
    assert len(executions) == 3
    assert store.inputs("p") == {}


def test_a_step_run_again_finds_its_children_instead_of_starting_them_again(
    store: Store,
) -> None:
    parent = pitstop.Workflow("flaky-parent", retry=pitstop.Retry(attempts=3, backoff=0))
    attempts: list[int] = []

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        results = ctx.run_children([(double, {"x": i}) for i in range(4)])
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("the merge failed")
        return {"ys": [r.state["y"] for r in results]}

    result = parent.start(store, {}, run_id="p")
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"ys": [0, 2, 4, 6]}
    assert attempts == [1, 2]
    children = store.children("p")
    assert len(children) == 4
    assert all(c.checkpoints == 2 for c in children)  # input + completion: each ran once


def test_failed_child_fails_the_parent_step_naming_the_child(store: Store) -> None:
    parent = pitstop.Workflow("strict")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(double, {"x": 1}), (double, {"x": 2, "fail": True})])
        return {}

    result = parent.start(store, {}, run_id="p")
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["type"] == "pitstop.errors.ChildFailedError"
    assert "child run 'p.0-1' failed in step 'times_two'" in result.error["message"]
    assert "cannot double 2" in result.error["message"]
    assert store.get_run("p.0-0").status is RunStatus.COMPLETED


def test_a_step_may_handle_a_failed_child(store: Store) -> None:
    parent = pitstop.Workflow("lenient")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        try:
            ctx.run_children([(double, {"x": 1}), (double, {"x": 2, "fail": True})])
        except ChildFailedError as exc:
            return {"ok": [r.state["y"] for r in exc.results if r.ok],
                    "failed": [exc.child_run, exc.error["type"], exc.status]}
        return {}

    result = parent.start(store, {}, run_id="p")
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"ok": [2], "failed": ["p.0-1", "ValueError", "failed"]}


def test_cancelling_a_parent_cancels_its_unfinished_children(store: Store) -> None:
    parent = pitstop.Workflow("boss")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(double, {"x": 1}), (approve, {}), (approve, {})])
        return {}

    assert parent.start(store, {}, run_id="p").status is RunStatus.WAITING
    store.update_run("p", status=RunStatus.CANCELLED)
    statuses = {c.id: c.status for c in store.children("p")}
    assert statuses == {"p.0-0": RunStatus.COMPLETED, "p.0-1": RunStatus.CANCELLED,
                        "p.0-2": RunStatus.CANCELLED}
    with pytest.raises(pitstop.InputError):
        pitstop.send(store, "p.0-1", "ok", True)


def test_a_cancelled_child_wakes_its_parent_with_the_cancellation(store: Store) -> None:
    parent = pitstop.Workflow("waiter")

    @parent.step
    def ask(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        try:
            ctx.run_child(approve, {})
        except ChildFailedError as exc:
            return {"child": exc.status}
        return {"child": "completed"}

    assert parent.start(store, {}, run_id="p").status is RunStatus.WAITING
    store.update_run("p.0-0", status=RunStatus.CANCELLED)
    assert store.get_run("p").wake_at is not None
    result = parent.resume(store, "p")
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"child": "cancelled"}


def test_async_steps_await_their_children_on_the_loop(store: Store) -> None:
    slow = pitstop.Workflow("slow-async")

    @slow.step
    async def nap(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"y": state["x"] + 1}

    parent = pitstop.Workflow("async-parent")

    @parent.step
    async def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        one = await ctx.arun_child(slow, {"x": 0})
        many = await ctx.arun_children([(slow, {"x": i}) for i in range(1, 5)])
        return {"ys": [one.state["y"], *(r.state["y"] for r in many)]}

    result = asyncio.run(parent.astart(store, {}, run_id="p"))
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"ys": [1, 2, 3, 4, 5]}

    sync_parent = pitstop.Workflow("sync-call-in-async")

    @sync_parent.step
    async def wrong(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_child(slow, {"x": 0})
        return {}

    failed = asyncio.run(sync_parent.astart(store, {}, run_id="q"))
    assert failed.status is RunStatus.FAILED
    assert failed.error is not None and "arun_child" in failed.error["message"]


# -- bad input: a clear error naming the step, nothing written ------------------------------------


def _fails_with(store: Store, wf: pitstop.Workflow, run_id: str) -> dict[str, Any]:
    result = wf.start(store, {}, run_id=run_id)
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert store.children(run_id) == []
    return dict(result.error)


def test_a_child_run_id_that_exists_is_refused_naming_the_step(store: Store) -> None:
    double.start(store, {"x": 1}, run_id="taken")
    parent = pitstop.Workflow("reuser")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(double, {"x": 2}, "fresh"), (double, {"x": 3}, "taken")])
        return {}

    error = _fails_with(store, parent, "p")
    assert error["type"] == "pitstop.errors.ChildRunError"
    assert error["message"].startswith("run 'p', step 'fan': run 'taken' already exists")
    with pytest.raises(pitstop.RunNotFoundError):
        store.get_run("fresh")  # nothing was started: not even the good child
    assert store.get_run("taken").parent_run is None


def test_what_is_not_a_workflow_or_a_state_is_refused_naming_the_step(store: Store) -> None:
    for bad, words in [
        ([(double, 42)], "input of child"),
        ([("double", {})], "unknown workflow 'double': pass the Workflow object"),
        ([(object(), {})], "needs a Workflow"),
        ([double], "must be (workflow, input)"),
    ]:
        parent = pitstop.Workflow(f"bad-{words[:5]}")

        def fan(state: dict[str, Any], ctx: pitstop.StepContext, *, bad: Any = bad) -> Any:
            ctx.run_children(bad)
            return {}

        parent.step(fan)

        error = _fails_with(store, parent, f"p-{words[:5]}")
        assert error["type"] == "pitstop.errors.ChildRunError", error
        assert "step 'fan'" in error["message"] and words in error["message"], error
    assert store.count_runs(parent_run=None) == {"failed": 4}


def test_a_workflow_the_worker_does_not_run_is_refused(store: Store) -> None:
    parent = pitstop.Workflow("orphaning")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_child(approve, {})
        return {}

    parent.enqueue(store, {}, run_id="p")
    Worker(store, [parent, double], poll_interval=0.02).run(until_idle=True,
                                                            handle_signals=False)
    run = store.get_run("p")
    assert run.status is RunStatus.FAILED
    head = store.latest("p")
    assert head is not None
    message = head.metadata["error"]["message"]
    assert message.startswith("run 'p', step 'fan': unknown workflow 'approve'")
    assert "this worker runs double, orphaning" in message
    assert store.children("p") == []
    with pytest.raises(ChildRunError):
        raise ChildRunError("x", run_id="p", step="fan")


# -- workers --------------------------------------------------------------------------------------


def test_workers_run_children_and_wake_the_parent_once(store: Store) -> None:
    parent, executions = _fan_parent("fan-worker", n=12)
    parent.enqueue(store, {}, run_id="p")
    stats = Worker(store, [parent, double], concurrency=3, poll_interval=0.02,
                   limits={"double": 2}, child_grace=0).run(until_idle=True,
                                                            handle_signals=False)
    run = store.get_run("p")
    assert run.status is RunStatus.COMPLETED
    head = store.latest("p")
    assert head is not None and head.state["total"] == sum(2 * i for i in range(12))
    # The step ran twice: once starting the children, once when the last one finished.
    assert executions == ["fan", "fan"]
    assert stats.by_status["completed"] == 13
    assert stats.by_status["waiting"] == 1
    assert all(c.status is RunStatus.COMPLETED for c in store.children("p"))
    # The children were queued for the pool, never run inside the parent's step.
    assert {c.checkpoints for c in store.children("p")} == {2}


def test_under_a_worker_children_finishing_quickly_let_the_step_go_on_in_place(
    store: Store,
) -> None:
    """The pool finishes the children within the worker's child_grace: the parent's step
    continues with their states, never checkpointing as waiting nor running twice."""
    parent, executions = _fan_parent("fan-in-place", n=3)
    parent.enqueue(store, {}, run_id="p")
    stats = Worker(store, [parent, double], concurrency=4, poll_interval=0.01,
                   child_grace=60).run(until_idle=True, handle_signals=False)
    head = store.latest("p")
    assert head is not None and head.state == {"ys": [0, 2, 4], "total": 6}
    assert executions == ["fan"]
    assert "waiting" not in stats.by_status
    assert not [h for h in store.history("p") if h.metadata.get("status") == "waiting"]
    assert store.inputs("p") == {}  # every child's outcome was consumed
    assert {c.checkpoints for c in store.children("p")} == {2}  # each run by the pool, once


def test_under_a_worker_a_child_that_waits_parks_the_parent_after_the_grace(
    store: Store,
) -> None:
    parent = pitstop.Workflow("asker-grace")

    @parent.step
    def ask(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"approved": ctx.run_child(approve, {}).state["ok"]}

    parent.enqueue(store, {}, run_id="p")
    Worker(store, [parent, approve], concurrency=2, poll_interval=0.01,
           child_grace=0.2).run(until_idle=True, handle_signals=False)
    assert store.get_run("p").status is RunStatus.WAITING
    assert store.get_run("p").waiting_for == ("child:p.0-0",)


def test_a_parent_started_in_process_is_woken_for_a_worker(store: Store) -> None:
    parent = pitstop.Workflow("asker-2")

    @parent.step
    def ask(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"approved": ctx.run_child(approve, {}).state["ok"]}

    assert parent.start(store, {}, run_id="p").status is RunStatus.WAITING
    pitstop.send(store, "p.0-0", "ok", "yes")
    done = threading.Event()
    worker = Worker(store, [parent, approve], concurrency=2, poll_interval=0.02)

    def watch() -> None:
        while store.get_run("p").status is not RunStatus.COMPLETED:
            done.wait(0.02)
        worker.stop()

    watcher = threading.Thread(target=watch)
    watcher.start()
    worker.run(handle_signals=False)
    watcher.join()
    head = store.latest("p")
    assert head is not None and head.state == {"approved": "yes"}


# -- SIGKILL: a parent waiting for children, two worker processes, one killed ---------------------

WORKER = """
import sys
sys.path.insert(0, "tests")
import pitstop, workflows
store = pitstop.open_store(sys.argv[1])
pitstop.Worker(store, [workflows.boss, workflows.kid], concurrency=2, poll_interval=0.2).run()
"""


@pytest.mark.slow
def test_sigkill_of_one_of_two_workers_completes_every_child_and_the_parent_once(
    tmp_path: Path,
) -> None:
    if POSTGRES_SKIP is not None or "postgres" not in BACKENDS:
        pytest.skip(POSTGRES_SKIP or "no PostgreSQL")
    sys.path.insert(0, str(ROOT / "tests"))
    import workflows

    schema = f"c_{uuid.uuid4().hex[:12]}"
    url = pg_schema_url(schema)
    log = tmp_path / "kids.log"
    procs: list[subprocess.Popen[str]] = []
    try:
        with pitstop.open_store(url) as store:
            workflows.boss.enqueue(store, {"log": str(log)}, run_id="boss")
            procs = [
                subprocess.Popen([sys.executable, "-c", WORKER, url], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)
            ]
            victim, survivor = procs
            deadline = time.monotonic() + 120
            # Kill the victim while it is inside a child, with the parent waiting.
            while not (log.exists() and sum(
                1 for line in log.read_text().splitlines()
                if line.startswith(f"start {victim.pid} ")
            ) >= 2):
                assert time.monotonic() < deadline, "the victim never started a child"
                assert victim.poll() is None
                time.sleep(0.005)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            while store.get_run("boss").status is not RunStatus.COMPLETED:
                assert time.monotonic() < deadline, "the parent never completed"
                assert survivor.poll() is None, survivor.communicate()
                time.sleep(0.05)
            survivor.send_signal(signal.SIGTERM)
            _, err = survivor.communicate(timeout=60)
            assert survivor.returncode == 0, err

            head = store.latest("boss")
            assert head is not None
            assert head.state["total"] == sum(2 * i for i in range(workflows.KIDS))
            children = store.children("boss")
            assert len(children) == workflows.KIDS
            for run in [store.get_run("boss"), *children]:
                assert run.status is RunStatus.COMPLETED, run
                completions = [h for h in store.history(run.id, limit=None)
                               if h.metadata.get("status") == "completed"]
                assert len(completions) == 1, run.id  # completed exactly once
            lines = log.read_text().splitlines()
            # The parent's last step ran once; its fan-out once to start the children (twice
            # if the victim died starting them) and once when the last one finished.
            assert sum(1 for line in lines if line.startswith("merge ")) == 1
            assert sum(1 for line in lines if line.startswith("fan ")) in (2, 3)
            started = Counter(line.split()[2] for line in lines if line.startswith("start "))
            assert set(started) == {c.id for c in children}
            # Only children the victim held when it died ran twice (at most its concurrency).
            assert sum(n - 1 for n in started.values()) <= 2
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        drop_pg_schema(schema)


# -- the CLI --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_lists_children_by_parent_and_marks_where_they_started(tmp_path: Path) -> None:
    from clitools import pitstop_exe

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    parent = pitstop.Workflow("family")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(double, {"x": i}) for i in range(25)] + [(approve, {})])
        return {}

    with pitstop.open_store(url) as store:
        assert parent.start(store, {}, run_id="fam").status is RunStatus.WAITING
        double.start(store, {"x": 1}, run_id="loner")

    listed = pitstop_exe("runs", "--parent", "fam", "--limit", "100", "--json", store=url)
    assert listed.code == 0, listed.err
    ids = {r["id"] for r in listed.json["runs"]}
    assert ids == {f"fam.0-{i}" for i in range(26)}
    waiting = pitstop_exe("runs", "--parent", "fam", "--status", "waiting", store=url)
    assert waiting.code == 0 and "fam.0-25" in waiting.out and "fam.0-3 " not in waiting.out

    shown = pitstop_exe("show", "fam", store=url)
    assert shown.code == 0, shown.err
    assert "children:    26: 25 completed, 1 waiting" in shown.out
    assert "fam.0-19" in shown.out and "fam.0-20" not in shown.out  # the first 20 by name
    assert "6 more children: pitstop runs --parent fam" in shown.out
    doc = pitstop_exe("show", "fam", "--json", store=url).json
    assert doc["children"]["counts"] == {"completed": 25, "waiting": 1}
    assert doc["children"]["first"][0] == {"id": "fam.0-0", "status": "completed",
                                           "workflow": "double"}
    child = pitstop_exe("show", "fam.0-25", "--json", store=url).json
    assert child["parent"]["run_id"] == "fam" and child["parent"]["step"] == "fan"
    assert "parent:" in pitstop_exe("show", "fam.0-25", store=url).out

    history = pitstop_exe("history", "fam", store=url)
    assert history.code == 0, history.err
    assert "started 26 children" in history.out
    entries = pitstop_exe("history", "fam", "--json", store=url).json["checkpoints"]
    assert [e["note"] for e in entries if "started" in e["note"]] == ["head, started 26 children"]


FAMILY = """
import pitstop

double = pitstop.Workflow("double")


@double.step
def times_two(state):
    return {"y": state["x"] * 2}


fan = pitstop.Workflow("fan-cli")


@fan.step
def start_them(state, ctx):
    return {"ys": [r.state["y"] for r in ctx.run_children([(double, {"x": i}) for i in range(3)])]}
"""


@pytest.mark.slow
def test_worker_child_grace_flag_decides_whether_the_parent_waits(tmp_path: Path) -> None:
    """``pitstop worker --child-grace``: 0 parks the parent as waiting at once (its step runs
    again when the last child wakes it); a long grace lets the step go on in place, with no
    waiting checkpoint. The default is Worker's, and nan or a negative grace is refused."""
    from clitools import one_error_line, pitstop_exe
    from pitstop.cli.control import worker
    from pitstop.runtime.children import CHILD_GRACE

    (tmp_path / "family.py").write_text(FAMILY)
    grace = next(p for p in worker.params if p.name == "child_grace")
    assert grace.default == CHILD_GRACE
    assert "--child-grace" in pitstop_exe("worker", "--help").out
    flows = ["worker", "--workflow", "family:fan", "--workflow", "family:double",
             "--until-idle", "--concurrency", "3", "--poll", "0.02", "--json"]
    for seconds, statuses in (("0", {"completed": 4, "waiting": 1}), ("60", {"completed": 4})):
        url = f"sqlite:///{tmp_path / f'grace-{seconds}.db'}"
        with pitstop.open_store(url) as store:
            store.create_run("p", workflow="fan-cli", status=RunStatus.QUEUED)
            store.save("p", {}, metadata={"source": "input", "next": "start_them"},
                       workflow="fan-cli", schema_version=1)
        done = pitstop_exe(*flows, "--child-grace", seconds, store=url, cwd=tmp_path)
        assert done.code == 0, done.err
        assert done.json["by_status"] == statuses, seconds
        with pitstop.open_store(url) as store:
            head = store.latest("p")
            assert head is not None and head.state["ys"] == [0, 2, 4]
            waited = [h for h in store.history("p") if h.metadata.get("status") == "waiting"]
            assert len(waited) == (1 if seconds == "0" else 0), seconds
    for bad in ("nan", "-1"):
        refused = pitstop_exe(*flows, "--child-grace", bad, store=url, cwd=tmp_path)
        assert "--child-grace" in one_error_line(refused)
    with pytest.raises(ValueError, match="child_grace"):
        Worker(pitstop.open_store("memory://"), [double], child_grace=float("nan"))


# -- PostgreSQL: cancelling a parent while its children complete ----------------------------------


def _pg_store() -> tuple[str, str]:
    if POSTGRES_SKIP is not None or "postgres" not in BACKENDS:
        pytest.skip(POSTGRES_SKIP or "no PostgreSQL")
    schema = f"c_{uuid.uuid4().hex[:12]}"
    return schema, pg_schema_url(schema)


@pytest.mark.parametrize("how", ["complete", "cancel"])
def test_a_child_finishing_locks_its_parent_before_itself(how: str) -> None:
    """Rows are locked parents first. A transaction finishing a child waits for its parent's
    row *before* taking its own, so a cancel of the parent (which locks the parent, then its
    children) can never hold one while waiting for the other."""
    import psycopg

    from conftest import PG_URL

    schema, url = _pg_store()
    parent = pitstop.Workflow("lock-order")

    @parent.step
    def ask(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"ok": ctx.run_child(approve, {}, run_id="kid").state["ok"]}

    try:
        with pitstop.open_store(url) as store:
            assert parent.start(store, {}, run_id="p").status is RunStatus.WAITING
            pitstop.send(store, "kid", "ok", True)
            with psycopg.connect(PG_URL) as holder, psycopg.connect(PG_URL,
                                                                     autocommit=True) as probe:
                holder.execute(f'SET search_path TO "{schema}"')
                holder.execute("SELECT 1 FROM pitstop_runs WHERE run_id = 'p' FOR UPDATE")
                finish = (lambda: approve.resume(store, "kid")) if how == "complete" else (
                    lambda: store.update_run("kid", status=RunStatus.CANCELLED))
                thread = threading.Thread(target=finish)
                thread.start()
                deadline = time.monotonic() + 30
                blocked = ("SELECT count(*) FROM pg_stat_activity "
                           "WHERE %s = ANY(pg_blocking_pids(pid))")
                while not (probe.execute(blocked, (holder.info.backend_pid,)).fetchone()
                           or (0,))[0]:
                    assert time.monotonic() < deadline, "the child's finish never waited"
                    time.sleep(0.01)
                # Blocked on the parent, the finishing transaction holds nothing of the child.
                probe.execute(f'SET search_path TO "{schema}"')
                with probe.transaction():
                    probe.execute("SELECT 1 FROM pitstop_runs WHERE run_id = 'kid' "
                                  "FOR UPDATE NOWAIT")
                holder.rollback()
                thread.join(timeout=30)
                assert not thread.is_alive()
            assert store.get_run("p").wake_at is not None
            done = parent.resume(store, "p")
            if how == "complete":
                assert done.state == {"ok": True}
            else:
                assert done.status is RunStatus.FAILED
                assert done.error is not None and "cancelled" in done.error["message"]
    finally:
        drop_pg_schema(schema)


@pytest.mark.slow
def test_cancelling_a_parent_while_its_children_complete_ends_consistent() -> None:
    """Twenty children completing on threads while their parent is cancelled: every child ends
    completed (before the cancel) or cancelled, none is left running or queued, the parent
    ends cancelled, and the parent's inbox holds exactly the children that completed first."""
    from pitstop.store.engine.children import child_input

    schema, url = _pg_store()
    parent = pitstop.Workflow("race-parent")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(approve, {}) for _ in range(20)])
        return {}

    try:
        with pitstop.open_store(url) as store:
            for rnd in range(3):
                run_id = f"p{rnd}"
                assert parent.start(store, {}, run_id=run_id).status is RunStatus.WAITING
                kids = [c.id for c in store.children(run_id)]
                for kid in kids:
                    pitstop.send(store, kid, "ok", True)
                go = threading.Barrier(len(kids) + 1)

                def finish(kid: str, go: threading.Barrier = go) -> None:
                    go.wait()
                    with contextlib.suppress(pitstop.PitstopError):
                        approve.resume(store, kid)

                threads = [threading.Thread(target=finish, args=(k,)) for k in kids]
                for thread in threads:
                    thread.start()
                go.wait()
                time.sleep(0.005 * rnd)  # a different point in the completions each round
                store.update_run(run_id, status=RunStatus.CANCELLED)
                for thread in threads:
                    thread.join(timeout=60)
                    assert not thread.is_alive()
                assert store.get_run(run_id).status is RunStatus.CANCELLED
                statuses = {c.id: c.status for c in store.children(run_id)}
                assert set(statuses.values()) <= {RunStatus.COMPLETED, RunStatus.CANCELLED}
                completed = {k for k, s in statuses.items() if s is RunStatus.COMPLETED}
                delivered = set(store.inputs(run_id))
                assert delivered == {child_input(k) for k in completed}
                for kid in completed:
                    assert store.latest(kid).metadata["status"] == "completed"  # type: ignore[union-attr]
    finally:
        drop_pg_schema(schema)


def test_a_cancelled_parent_starts_no_children(store: Store) -> None:
    parent = pitstop.Workflow("cancelled-first")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        store.update_run(ctx.run_id, status=RunStatus.CANCELLED)  # e.g. `pitstop cancel`
        ctx.run_children([(double, {"x": 1})])
        return {}

    assert parent.start(store, {}, run_id="p").status is RunStatus.CANCELLED
    assert store.get_run("p").status is RunStatus.CANCELLED
    assert store.children("p") == []


def test_a_woken_parent_reads_its_childrens_final_states_together(tmp_path: Path) -> None:
    """Woken by the last of 40 children, the step reads their final checkpoints in one query
    (and their runs in one), however many children there are: not a query per child."""
    parent = pitstop.Workflow("many-askers")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        results = ctx.run_children([(approve, {}) for _ in range(40)])
        return {"yes": sum(1 for r in results if r.state["ok"])}

    with pitstop.open_store(f"sqlite:///{tmp_path / 'wake.db'}") as store:
        assert parent.start(store, {}, run_id="p").status is RunStatus.WAITING
        for child in store.children("p"):
            pitstop.send(store, child.id, "ok", True)
            assert approve.resume(store, child.id).status is RunStatus.COMPLETED
        statements: list[str] = []
        store._connection().set_trace_callback(statements.append)  # type: ignore[attr-defined]
        done = parent.resume(store, "p")
        store._connection().set_trace_callback(None)  # type: ignore[attr-defined]
    assert done.status is RunStatus.COMPLETED and done.state == {"yes": 40}
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    heads = [s for s in reads if "FROM pitstop_checkpoints" in s and "IN (" in s]
    assert len(heads) == 1, heads  # the 40 final checkpoints
    assert len([s for s in reads if "parent_run = " in s]) == 1  # the 40 runs
    assert len(reads) < 20, reads  # not one per child


@pytest.mark.slow
def test_an_exported_family_keeps_its_links_in_the_store_it_is_imported_into(
    tmp_path: Path,
) -> None:
    from clitools import pitstop_exe

    source, target = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db"))
    parent, _ = _fan_parent("family-moved", n=2)
    with pitstop.open_store(source) as store:
        assert parent.start(store, {}, run_id="fam").status is RunStatus.COMPLETED
        ids = ["fam", *(c.id for c in store.children("fam"))]
    for run_id in ids:
        archive = str(tmp_path / f"{run_id}.pitstop")
        out = pitstop_exe("export", run_id, "-o", archive, store=source)
        assert out.code == 0, out.err
        back = pitstop_exe("import", archive, store=target)
        assert back.code == 0, back.err
    copy = pitstop_exe("import", str(tmp_path / "fam.0-0.pitstop"), "--run-id", "lone-copy",
                       store=target)
    assert copy.code == 0, copy.err
    with pitstop.open_store(target) as store:
        assert [c.id for c in store.children("fam")] == ["fam.0-0", "fam.0-1"]
        assert store.get_run("fam.0-1").parent_run == "fam"
        assert store.get_run("fam").parent_run is None
        assert store.count_runs(parent_run="fam") == {"completed": 2}
        assert store.get_run("lone-copy").parent_run is None  # a copy is nobody's child
    listed = pitstop_exe("runs", "--parent", "fam", "--json", store=target)
    assert {(r["id"], r["parent_run"]) for r in listed.json["runs"]} == {
        ("fam.0-0", "fam"), ("fam.0-1", "fam")}

