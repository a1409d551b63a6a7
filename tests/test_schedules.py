"""Schedules (#28): validation, catchup and overlap, and one run per tick under SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import pitstop
from clitools import PITSTOP, one_error_line, pitstop_exe
from pitstop import ScheduleError, Store
from pitstop.runtime.schedules import fire_due, run_id_for, schedules, tick_after


def ticking() -> pitstop.Workflow:
    wf = pitstop.Workflow("ticking")

    @wf.step
    def go(state: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    return wf


def waiting() -> pitstop.Workflow:
    wf = pitstop.Workflow("waiting")

    @wf.step(wait_for="go")
    def hold(state: dict[str, Any], go: Any = None) -> dict[str, Any]:
        return {}

    return wf


def scheduled_runs(store: Store) -> list[str]:
    return sorted(r.id for r in store.runs(limit=None) if "@" in r.id)


def test_bad_schedules_are_refused_with_the_reason(store: Store) -> None:
    wf = ticking()
    cases = [
        ({"cron": "61 * * * *"}, "does not parse: Bad minute"),
        ({"cron": "* * *"}, "does not parse"),
        ({"cron": "0 2 * * *", "timezone": "Europe/Nowhere"}, "timezone 'Europe/Nowhere' does"),
        ({"cron": "0 2 * * *", "catchup": "some"}, "catchup must be one of"),
        ({"cron": "0 2 * * *", "overlap": "maybe"}, "overlap must be one of"),
    ]
    for kwargs, reason in cases:
        with pytest.raises(ScheduleError, match=reason):
            wf.schedule(store, "bad", **kwargs)
    assert schedules(store) == []
    kept = wf.schedule(store, "nightly", cron="0 2 * * *", timezone="Europe/Berlin",
                       input={"day": 1})
    assert kept.next_tick.timestamp() > time.time()
    assert [t.hour for t in kept.upcoming(3)] == [2, 2, 2]
    assert store.schedule_input(store.schedule_rows(name="nightly")[0]) == {"day": 1}


def test_aschedule_is_the_async_twin(store: Store) -> None:
    import asyncio

    wf = ticking()

    async def main() -> None:
        with pytest.raises(ScheduleError, match="does not parse"):
            await wf.aschedule(store, "bad", cron="61 * * * *")
        made = await wf.aschedule(store, "hourly", cron="0 * * * *", input={"n": 1})
        assert made.next_tick.minute == 0

    asyncio.run(main())
    assert [row.name for row in store.schedule_rows()] == ["hourly"]


@pytest.mark.parametrize(("catchup", "expected"), [("all", 10), ("latest", 1), ("none", 1)])
def test_catchup_of_missed_ticks(store: Store, catchup: str, expected: int) -> None:
    wf = ticking()
    wf.schedule(store, "missed", cron="* * * * *", catchup=catchup, overlap="allow")
    first = store.schedule_rows(name="missed")[0].next_tick
    later = first + 9 * 60 + 30  # ten ticks due; all but the newest over a minute late
    started = fire_due(store, {wf.name: wf}, now=later)
    assert len(started) == expected
    assert len(scheduled_runs(store)) == expected
    if catchup != "all":
        assert started == [run_id_for("missed", first + 9 * 60)]
    # Whatever was started or dropped, the next tick is the one after `later`.
    assert store.schedule_rows(name="missed")[0].next_tick == tick_after(
        "* * * * *", "UTC", later, "missed")
    # Looking again starts nothing more: each tick has its run or was dropped.
    assert fire_due(store, {wf.name: wf}, now=later) == []


def test_catchup_none_starts_a_tick_on_time(store: Store) -> None:
    wf = ticking()
    wf.schedule(store, "ontime", cron="* * * * *", catchup="none")
    first = store.schedule_rows(name="ontime")[0].next_tick
    assert fire_due(store, {wf.name: wf}, now=first + 1) == [run_id_for("ontime", first)]


def test_overlap_skip_queue_allow(store: Store) -> None:
    wf = waiting()
    flows = {wf.name: wf}
    for overlap in ("skip", "queue", "allow"):
        wf.schedule(store, overlap, cron="* * * * *", catchup="all", overlap=overlap)
    first = store.schedule_rows(name="skip")[0].next_tick
    started = fire_due(store, flows, now=first + 1)
    assert len(started) == 3
    for run_id in started:  # (not a worker: it would look at the schedules on the clock)
        assert wf.resume(store, run_id).status is pitstop.RunStatus.WAITING
    second = fire_due(store, flows, now=first + 61)
    assert second == [run_id_for("allow", first + 60)]  # skip dropped, queue held
    assert store.schedule_rows(name="skip")[0].next_tick == first + 120
    assert store.schedule_rows(name="queue")[0].next_tick == first + 60
    pitstop.send(store, run_id_for("queue", first), "go", 1)
    assert wf.resume(store, run_id_for("queue", first)).status is pitstop.RunStatus.COMPLETED
    assert fire_due(store, flows, now=first + 61) == [run_id_for("queue", first + 60)]


def test_pause_and_remove(store: Store) -> None:
    wf = ticking()
    wf.schedule(store, "paused", cron="* * * * *", catchup="all")
    first = store.schedule_rows(name="paused")[0].next_tick
    store.schedule_pause("paused", True)
    assert fire_due(store, {wf.name: wf}, now=first + 1) == []
    store.schedule_pause("paused", False)
    assert len(fire_due(store, {wf.name: wf}, now=first + 1)) == 1
    store.schedule_delete("paused")
    with pytest.raises(ScheduleError, match="no such schedule"):
        store.schedule_delete("paused")


FLOW = '''
import pitstop

wf = pitstop.Workflow("ticks")

@wf.step
def go(state):
    return {"done": True}
'''


@pytest.mark.slow
def test_one_run_per_tick_with_workers_sigkilled(shared_url: str, tmp_path: Path) -> None:
    """Three `pitstop worker` processes, a 1-second schedule over ~16 ticks, a worker
    SIGKILLed and replaced about every second: every tick has exactly one run."""
    (tmp_path / "flows.py").write_text(FLOW)
    sys.path.insert(0, str(tmp_path))
    try:
        import flows  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    with pitstop.open_store(shared_url) as store:
        flows.wf.schedule(store, "every-second", cron="* * * * * *", catchup="all",
                          overlap="allow")
        first = store.schedule_rows(name="every-second")[0].next_tick
    env = {**os.environ, "PITSTOP_STORE": shared_url}
    assert PITSTOP is not None

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([PITSTOP, "worker", "--workflow", "flows:wf", "--poll", "0.2",
                                 "--concurrency", "2"], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    workers = [spawn() for _ in range(3)]
    rng = random.Random(28)
    killed = 0
    try:
        deadline = time.time() + 16
        while time.time() < deadline:
            time.sleep(rng.uniform(0.3, 1.5))
            victim = workers.pop(rng.randrange(len(workers)))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed += 1
            workers.append(spawn())
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    with pitstop.open_store(shared_url) as store:
        upto = store.schedule_rows(name="every-second")[0].next_tick
        runs = scheduled_runs(store)
    expected = sorted(run_id_for("every-second", first + i) for i in range(int(upto - first)))
    assert killed >= 8
    assert len(expected) >= 12
    assert runs == expected


@pytest.mark.slow
def test_cli_schedule_add_ls_pause_rm(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(FLOW)
    url = f"sqlite:///{tmp_path}/cli.db"
    added = pitstop_exe("schedule", "add", "nightly", "--workflow", "flows:wf", "--cron",
                        "0 2 * * *", "--timezone", "Europe/Berlin", "--input", '{"day": 1}',
                        "--catchup", "latest", "--json", store=url, cwd=tmp_path)
    assert added.code == 0, added.err
    assert added.json["name"] == "nightly" and len(added.json["upcoming"]) == 5
    bad = pitstop_exe("schedule", "add", "bad", "--workflow", "flows:wf", "--cron", "0 25 * * *",
                      store=url, cwd=tmp_path)
    assert "does not parse: Bad hour" in one_error_line(bad)
    listed = pitstop_exe("schedule", "ls", store=url)
    assert listed.code == 0 and "nightly" in listed.out and "0 2 * * *" in listed.out
    assert pitstop_exe("schedule", "pause", "nightly", store=url).code == 0
    assert pitstop_exe("schedule", "ls", "--json", store=url).json[0]["paused"] is True
    assert pitstop_exe("schedule", "pause", "nightly", "--resume", store=url).code == 0
    assert pitstop_exe("schedule", "rm", "nightly", store=url).code == 0
    assert pitstop_exe("schedule", "ls", "--json", store=url).json == []
    assert "no such schedule" in one_error_line(pitstop_exe("schedule", "rm", "nightly",
                                                            store=url))
