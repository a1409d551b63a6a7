"""An effect's function never starts once its worker cannot be sure it still holds the run.

A worker cut off from its store (a partition, a store locked by someone else) cannot renew
its lease; after the TTL another worker may take the run over and run the same step. The
step's ``ctx.effect`` then refuses to start the function (LeaseLostError) rather than run it
beside the new owner. Here the store is a real SQLite file that another process holds
locked for writing, so every renewal waits and fails, for longer than the lease's TTL.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import pitstop


@pytest.mark.slow
def test_an_effect_is_not_started_after_the_lease_could_not_be_renewed(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    calls: list[str] = []
    locker: list[subprocess.Popen[str]] = []
    wf = pitstop.Workflow("lease-effect", lease_ttl=1.0)

    @wf.step
    def work(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        if locker:  # the run's next execution: the store answers again
            ctx.effect("charge", lambda: calls.append("charged"))
            return {"done": True}
        # Another process takes the database's write lock and keeps it past the lease's TTL:
        # this worker's renewals cannot go through.
        locker.append(subprocess.Popen(
            [sys.executable, "-c",
             "import sqlite3, sys, time\n"
             "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(4)\n",
             str(path)],
            stdout=subprocess.PIPE, text=True))
        assert locker[0].stdout is not None and locker[0].stdout.readline() == "locked\n"
        time.sleep(1.5)  # past the TTL, no renewal has succeeded
        ctx.effect("charge", lambda: calls.append("charged"))
        return {"done": True}

    with pitstop.open_store(f"sqlite:///{path}?busy_timeout=10") as store:
        try:
            with pytest.raises(pitstop.LeaseLostError):
                wf.start(store, {}, run_id="r1")
        finally:
            for process in locker:
                process.wait(timeout=30)
        assert calls == []  # the function never started
        # Nothing was recorded for it, and the run is left for its next owner.
        assert store.effects("r1") == {}
        assert store.get_run("r1").status is not pitstop.RunStatus.COMPLETED
        # Once the store answers again, the run completes and the effect runs once.
        time.sleep(1.0)
        assert wf.resume(store, "r1").status is pitstop.RunStatus.COMPLETED
    assert calls == ["charged"]
    sqlite3.connect(path).close()
