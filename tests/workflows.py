"""Workflows used by the runtime tests, importable by subprocesses (``tests/`` on sys.path).

``counter`` is the crash-test workflow: 100 executions of one step in a loop, each updating
state deterministically, every 7th recording an external effect into a log file (the
"outside world") through ``ctx.effect`` with its idempotency key.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import pitstop

STEPS = 100


def _write_log(path: str, key: str, *, idempotency_key: str) -> str:
    """The external side effect: append one line per call, return this call's nonce."""
    nonce = uuid.uuid4().hex
    assert key == idempotency_key
    with open(path, "a") as f:
        f.write(f"{key} {nonce}\n")
        f.flush()
        os.fsync(f.fileno())
    return nonce


def make_counter(durability: str = "normal", every: int = 1) -> pitstop.Workflow:
    wf = pitstop.Workflow(
        "counter",
        durability=durability,  # type: ignore[arg-type]
        policy=pitstop.CheckpointPolicy(every=every),
    )

    @wf.step
    def work(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        n = state["n"]
        delay = float(os.environ.get("COUNTER_STEP_DELAY", "0"))
        if delay:
            time.sleep(delay)
        update: dict[str, Any] = {"n": n + 1, "total": state["total"] + n * n}
        if n % 7 == 3:
            key = ctx.idempotency_key(f"log-{n}")
            nonce = ctx.effect(f"log-{n}", _write_log, state["log"], key)
            update["nonces"] = [*state["nonces"], nonce]
        if n + 1 < STEPS:
            return pitstop.goto("work", update)
        return update

    @wf.step
    def done(state: dict[str, Any]) -> dict[str, Any]:
        return {"finished": True}

    return wf


counter = make_counter()
counter_background = make_counter("background")
counter_every_5 = make_counter(every=5)


def counter_input(log: str) -> dict[str, Any]:
    return {"n": 0, "total": 0, "nonces": [], "log": log, "finished": False}


# -- an approval flow with a human in the loop ----------------------------------------------------

approval = pitstop.Workflow("approval")


@approval.step
def prepare(state: dict[str, Any]) -> dict[str, Any]:
    return {"prepared": True}


@approval.step(wait_for="decision")
def decide(state: dict[str, Any], ctx: pitstop.StepContext, decision: Any) -> Any:
    if not decision.get("approved"):
        return pitstop.finish({"outcome": "rejected"})
    return {"outcome": "approved", "approver": decision.get("by")}


@approval.step
def notify(state: dict[str, Any]) -> dict[str, Any]:
    return {"notified": True}


# -- short jobs for the worker tests --------------------------------------------------------------


def _log_step(path: str, run_id: str, step: str, *, idempotency_key: str) -> list[float]:
    """Record who executed which step when (to prove no run ran twice or concurrently)."""
    start = time.time()
    time.sleep(float(os.environ.get("JOB_STEP_DELAY", "0.002")))
    with open(path, "a") as f:
        f.write(f"{run_id} {step} {os.getpid()} {start} {time.time()}\n")
    return [start, time.time()]


def make_jobs(lease_ttl: float = 30.0) -> pitstop.Workflow:
    wf = pitstop.Workflow("jobs", lease_ttl=lease_ttl)

    def step(name: str) -> Any:
        def run(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
            ctx.effect("log", _log_step, state["log"], ctx.run_id, name)
            return {name: state["n"] * len(name), "trail": [*state["trail"], name]}

        return run

    for name in ("fetch", "transform", "load"):
        wf.step(name=name)(step(name))
    return wf


jobs = make_jobs()
jobs_short_lease = make_jobs(lease_ttl=2.0)


def jobs_expected(n: int, log: str) -> dict[str, Any]:
    return {"n": n, "log": log, "trail": ["fetch", "transform", "load"],
            "fetch": n * 5, "transform": n * 9, "load": n * 4}


# -- ctx.map: the crash-test workflow -------------------------------------------------------------

MAP_ITEMS = 50
MAP_CONCURRENCY = 5


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _mail(path: str, item: int, *, idempotency_key: str) -> str:
    nonce = uuid.uuid4().hex
    _append(path, f"mail {os.getpid()} {item} {nonce}")
    return nonce


mapper = pitstop.Workflow("mapper")


@mapper.step
def fan_out(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    """50 items, 5 at a time, each sending an "e-mail" through ctx.effect and taking 30 ms."""
    log = state["log"]

    def item(i: int) -> dict[str, Any]:
        _append(log, f"start {os.getpid()} {i}")
        nonce = ctx.effect(f"mail-{i}", _mail, log, i)
        time.sleep(0.03)
        return {"square": i * i, "pid": os.getpid(), "nonce": nonce}

    async def async_item(i: int) -> dict[str, Any]:
        _append(log, f"start {os.getpid()} {i}")
        nonce = await ctx.aeffect(f"mail-{i}", _mail, log, i)
        await asyncio.sleep(0.03)
        return {"square": i * i, "pid": os.getpid(), "nonce": nonce}

    fn = async_item if os.environ.get("MAPPER_KIND") == "async" else item
    out = ctx.map(fn, range(MAP_ITEMS), concurrency=MAP_CONCURRENCY, name="items")
    return {"squares": [r["square"] for r in out], "pids": [r["pid"] for r in out],
            "nonces": [r["nonce"] for r in out]}


# -- child runs: the crash-test parent and its children -------------------------------------------

KIDS = 20

kid = pitstop.Workflow("kid")


@kid.step
def kid_work(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    """Takes a while (so a kill lands mid-child), logging who started it."""
    _append(state["log"], f"start {os.getpid()} {ctx.run_id}")
    time.sleep(float(os.environ.get("KID_STEP_DELAY", "0.1")))
    return {"y": state["x"] * 2, "pid": os.getpid()}


boss = pitstop.Workflow("boss")


@boss.step
def boss_fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    _append(state["log"], f"fan {os.getpid()} {ctx.run_id}")
    results = ctx.run_children([(kid, {"x": i, "log": state["log"]}) for i in range(KIDS)])
    return {"ys": [r.state["y"] for r in results]}


@boss.step
def boss_merge(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    _append(state["log"], f"merge {os.getpid()} {ctx.run_id}")
    return {"total": sum(state["ys"])}
