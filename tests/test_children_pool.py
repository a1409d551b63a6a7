"""Child runs under a pool of workers (issue #17, item 3 and its targets).

A parent's children spread over the worker processes that share the store, each worker's
per-workflow ``limits`` cap how many of them run at once, and on PostgreSQL the parent is
woken by the transaction that finishes its last child (NOTIFY), not by a worker polling.
Real ``pitstop worker`` processes, real SQLite files and PostgreSQL schemas; no test here
asserts how fast anything is (``bench/parallel.py --children`` measures that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import pitstop
from clitools import PITSTOP, pitstop_exe
from conftest import BACKENDS, POSTGRES_SKIP, drop_pg_schema, pg_schema_url
from pitstop import RunStatus, Worker
from pitstop.store import Store

FAMILY = """
import os
import pitstop

KIDS = int(os.environ["FAMILY_KIDS"])
LOG = os.environ["FAMILY_LOG"]


def log(line):
    with open(LOG, "a") as fh:  # one short O_APPEND write per line: lines never interleave
        fh.write(line + "\\n")


kid = pitstop.Workflow("pool-kid")


@kid.step
def work(state, ctx):
    log(f"kid {os.getpid()} {ctx.run_id}")
    return {"y": state["x"] * 2}


parent = pitstop.Workflow("pool-parent")


@parent.step
def fan(state, ctx):
    log(f"fan {os.getpid()} {ctx.run_id}")
    results = ctx.run_children([(kid, {"x": i}) for i in range(KIDS)])
    return {"total": sum(r.state["y"] for r in results)}
"""


def _pg_url() -> tuple[str, str]:
    if POSTGRES_SKIP is not None or "postgres" not in BACKENDS:
        pytest.skip(POSTGRES_SKIP or "no PostgreSQL")
    schema = f"pool_{uuid.uuid4().hex[:12]}"
    return schema, pg_schema_url(schema)


@pytest.mark.slow
def test_a_thousand_children_over_four_worker_processes_on_postgres(tmp_path: Path) -> None:
    """1,000 children, 4 ``pitstop worker`` processes on PostgreSQL: every child completes
    exactly once, the children are spread over the workers, the parent's step runs twice
    (it starts them, then the last child wakes it once) and ``pitstop show PARENT`` counts
    them all."""
    schema, url = _pg_url()
    kids = 1000
    log = tmp_path / "family.log"
    (tmp_path / "family.py").write_text(FAMILY)
    env = {**os.environ, "FAMILY_KIDS": str(kids), "FAMILY_LOG": str(log),
           "PITSTOP_STORE": url}
    env.pop("PITSTOP_DEBUG", None)
    assert PITSTOP is not None
    workers: list[subprocess.Popen[str]] = []
    try:
        queued = pitstop_exe("enqueue", "family:parent", "--run-id", "boss", store=url,
                             cwd=tmp_path, env={"FAMILY_KIDS": str(kids),
                                                "FAMILY_LOG": str(log)})
        assert queued.code == 0, queued.err
        workers = [
            subprocess.Popen(
                [PITSTOP, "worker", "--workflow", "family:parent", "--workflow", "family:kid",
                 "--concurrency", "2", "--poll", "5", "--child-grace", "0", "-q"],
                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            for _ in range(4)
        ]
        deadline = time.monotonic() + 300
        with pitstop.open_store(url) as store:
            while store.get_run("boss").status is not RunStatus.COMPLETED:
                assert time.monotonic() < deadline, "the parent never completed"
                for proc in workers:
                    assert proc.poll() is None, proc.communicate()
                time.sleep(0.2)
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            for proc in workers:
                _, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
            head = store.latest("boss")
            assert head is not None and head.state["total"] == sum(2 * i for i in range(kids))
            counts, _ = store.children_summary("boss")
            assert counts == {"completed": kids}
            waits = [h for h in store.history("boss", limit=None)
                     if h.metadata.get("status") == "waiting"]
            assert len(waits) == 1  # parked once, woken once

        lines = [line.split() for line in log.read_text().splitlines()]
        assert [kind for kind, *_ in lines].count("fan") == 2
        runs_of = Counter(run_id for kind, _, run_id in lines if kind == "kid")
        assert len(runs_of) == kids and set(runs_of.values()) == {1}  # each exactly once
        by_worker = Counter(pid for kind, pid, _ in lines if kind == "kid")
        assert len(by_worker) >= 2, by_worker  # spread over the pool, not one worker's
        assert set(by_worker) <= {str(p.pid) for p in workers}

        shown = pitstop_exe("show", "boss", store=url)
        assert shown.code == 0, shown.err
        assert f"{kids}: {kids} completed" in shown.out, shown.out[:400]
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        drop_pg_schema(schema)


@pytest.mark.slow
def test_on_postgres_the_last_child_wakes_its_parent_by_notify(tmp_path: Path) -> None:
    """A worker that would look for work only every 60 s: the child it queued waits for an
    input, the parent for the child. An input sent from another connection wakes the worker
    for the child (NOTIFY), and the transaction finishing the child wakes it for the parent
    (NOTIFY again): both run long before the worker would have looked by itself. Then
    ``stop()`` ends the idle worker at once, not after its 60 s wait."""
    schema, url = _pg_url()
    ask = pitstop.Workflow("notify-ask")

    @ask.step(wait_for="ok")
    def decide(state: dict[str, Any], ok: Any) -> dict[str, Any]:
        return {"ok": ok}

    parent = pitstop.Workflow("notify-parent")

    @parent.step
    def start_it(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"ok": ctx.run_child(ask, {}, run_id="kid").state["ok"]}

    try:
        with pitstop.open_store(url) as store, pitstop.open_store(url) as other:
            parent.enqueue(store, {}, run_id="p")
            worker = Worker(store, [parent, ask], concurrency=2, poll_interval=60,
                            child_grace=0)
            thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
            thread.start()
            try:
                deadline = time.monotonic() + 30
                while not (other.get_run("p").status is RunStatus.WAITING
                           and other.get_run("kid").status is RunStatus.WAITING):
                    assert time.monotonic() < deadline, "parent and child never parked"
                    time.sleep(0.05)
                time.sleep(0.5)  # the worker is back in its 60 s wait for work
                sent = time.monotonic()
                pitstop.send(other, "kid", "ok", True)
                while other.get_run("p").status is not RunStatus.COMPLETED:
                    assert time.monotonic() - sent < 30, "the parent was not woken"
                    time.sleep(0.05)
                time.sleep(0.5)  # idle again, in its wait for work
            finally:
                worker.stop()
                thread.join(timeout=20)
            assert not thread.is_alive(), "stop() waited for the poll interval"
            assert other.latest("p").state == {"ok": True}  # type: ignore[union-attr]
            assert worker.stats.by_status["completed"] == 2
    finally:
        drop_pg_schema(schema)


def test_a_workers_limit_caps_the_children_of_that_workflow(store: Store) -> None:
    """``limits={"capped-kid": 2}`` on a worker with 6 slots: its 12 children never run
    more than 2 at once (and do reach 2), while the parent holds a slot."""
    lock = threading.Lock()
    running = 0
    peak = 0

    kid = pitstop.Workflow("capped-kid")

    @kid.step
    def work(state: dict[str, Any]) -> dict[str, Any]:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return {"y": state["x"]}

    parent = pitstop.Workflow("capped-parent")

    @parent.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"ys": [r.state["y"] for r in ctx.run_children([(kid, {"x": i})
                                                               for i in range(12)])]}

    parent.enqueue(store, {}, run_id="p")
    stats = Worker(store, [parent, kid], concurrency=6, poll_interval=0.02,
                   limits={"capped-kid": 2}, child_grace=0).run(until_idle=True,
                                                                handle_signals=False)
    assert store.latest("p").state["ys"] == list(range(12))  # type: ignore[union-attr]
    assert stats.by_status["completed"] == 13
    assert peak == 2
