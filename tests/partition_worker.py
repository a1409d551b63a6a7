"""A worker process on one simulated host (run inside its network namespace by
test_partitions.py): ``python partition_worker.py STORE_URL HOST JOURNAL MARKS``.

Its workflow's step appends what it does to JOURNAL, a file every host shares (the outside
world: a side effect still happens while the host's network is cut): ``call KEY`` when an
effect's function runs, ``recorded KEY`` once the effect's result is recorded. A run's state
may ask a step to hold, writing a marker under MARKS first, so that the test cuts the host's
network at that moment: ``hold = [step, where, seconds]`` with ``where`` one of ``step``
(before its effect), ``commit`` (after everything, just before the checkpoint is written),
``renewal`` (a step longer than the lease, renewed while the network is cut).
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
import time
from typing import Any

import pitstop

url, host, journal, marks = sys.argv[1:5]
TTL = float(os.environ.get("PARTITION_TTL", "2"))
wf = pitstop.Workflow("part", lease_ttl=TTL)


def note(line: str) -> None:
    with open(journal, "a") as f:  # one write per line, O_APPEND: lines never interleave
        f.write(line + "\n")


def hold(ctx: pitstop.StepContext, state: dict[str, Any], i: int, where: str) -> None:
    asked = state.get("hold")
    if not asked or asked[0] != i or asked[1] != where:
        return
    marker = pathlib.Path(marks) / f"{ctx.run_id}.{where}"
    try:  # the first execution only: a takeover must not hold again
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, host.encode())
    os.close(fd)
    time.sleep(asked[2])


@wf.step
def work(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
    i = state.get("i", 0)
    fence = ctx._execution.lease.token  # type: ignore[attr-defined]
    hold(ctx, state, i, "step")
    hold(ctx, state, i, "renewal")
    key = ctx.idempotency_key("e")
    ctx.effect("e", lambda: note(f"call {key} {host} {fence}"))
    note(f"recorded {key} {host} {fence}")
    time.sleep(state.get("step_s", 0.05))
    hold(ctx, state, i, "commit")
    update = {"i": i + 1, "trail": [*state.get("trail", []), [i, host, fence]]}
    if i + 1 < state["n"]:
        return pitstop.goto("work", update)
    return update


logging.basicConfig(level=logging.INFO, format=f"{host} %(asctime)s %(name)s %(message)s")
with pitstop.open_store(url) as store:
    note(f"up {host} {os.getpid()}")
    pitstop.Worker(store, [wf], concurrency=4, poll_interval=0.1).run()
