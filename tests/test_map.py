"""``ctx.map``: items run concurrently inside a step, each result recorded as it completes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import ROOT
from pitstop import RunStatus
from pitstop.store import Store


def _map_records(store: Store, run_id: str) -> dict[str, Any]:
    return {k.split(":", 4)[-1]: v for k, v in store.effects(run_id).items() if "map[" in k}


class Peak:
    """How many calls were inside at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def test_sync_function_results_in_input_order_at_bounded_concurrency(store: Store) -> None:
    wf = pitstop.Workflow("map-sync")
    peak = Peak()

    def square(x: int) -> int:
        with peak:
            time.sleep(0.002 * (x % 3))  # finish out of order
        return x * x

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"squares": ctx.map(square, range(30), concurrency=4)}

    result = wf.start(store, {}, run_id="m1")
    assert result.status is RunStatus.COMPLETED
    assert result.state["squares"] == [x * x for x in range(30)]
    assert 1 < peak.peak <= 4
    records = _map_records(store, "m1")
    assert records == {f"map[square][{i}]": i * i for i in range(30)}


def test_async_functions_run_concurrently_on_the_loop(store: Store) -> None:
    wf = pitstop.Workflow("map-async")
    peak = Peak()

    async def fetch(x: int) -> dict[str, int]:
        with peak:
            await asyncio.sleep(0.02)
        return {"x": x}

    @wf.step
    async def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        started = time.monotonic()
        pages = await ctx.amap(fetch, [3, 1, 2] * 10, concurrency=10)
        return {"pages": pages, "seconds": time.monotonic() - started}

    result = asyncio.run(wf.astart(store, {}))
    assert result.state["pages"] == [{"x": x} for x in [3, 1, 2] * 10]
    assert peak.peak == 10
    assert result.state["seconds"] < 30 * 0.02  # rounds of ten, not one item at a time


def test_async_function_from_a_sync_step_and_sync_function_from_an_async_step(
    store: Store,
) -> None:
    wf = pitstop.Workflow("map-mixed")

    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    def triple(x: int) -> int:
        return 3 * x

    @wf.step
    def sync_step(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"doubled": ctx.map(double, range(5))}

    @wf.step
    async def async_step(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"tripled": await ctx.amap(triple, range(5), concurrency=2)}

    for result in (wf.start(store, {}), asyncio.run(wf.astart(store, {}))):
        assert result.state == {"doubled": [0, 2, 4, 6, 8], "tripled": [0, 3, 6, 9, 12]}


def test_failing_item_fails_the_step_naming_it_and_the_retry_runs_only_the_rest(
    store: Store,
) -> None:
    wf = pitstop.Workflow("map-fail", retry=pitstop.Retry(attempts=2, backoff=0, on=(KeyError,)))
    calls: Counter[int] = Counter()

    def work(x: int) -> int:
        calls[x] += 1
        if x == 7 and calls[x] == 1:
            raise KeyError("flaky")
        return x + 100

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.map(work, range(10), concurrency=3, name="work")}

    result = wf.start(store, {}, run_id="flaky")
    assert result.status is RunStatus.COMPLETED
    assert result.state["out"] == [x + 100 for x in range(10)]
    # KeyError was retried although the step raised MapItemError: the item's error decides.
    assert calls[7] == 2
    assert all(calls[x] == 1 for x in range(10) if x != 7)  # the others ran once in all
    retry = next(s for s in store.history("flaky") if s.metadata.get("source") == "retry")
    assert retry.metadata["error"]["type"] == "pitstop.errors.MapItemError"
    assert "step 'fan': map[work][7] raised KeyError" in retry.metadata["error"]["message"]


def test_failure_without_retry_keeps_the_finished_items_for_a_resume(store: Store) -> None:
    wf = pitstop.Workflow("map-resume")
    broken = {"yes": True}
    calls: Counter[int] = Counter()

    def work(x: int) -> int:
        calls[x] += 1
        if x == 4 and broken["yes"]:
            raise ValueError("upstream down")
        return -x

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.map(work, range(6), concurrency=1)}

    failed = wf.start(store, {}, run_id="resume-me")
    assert failed.status is RunStatus.FAILED
    with pytest.raises(pitstop.StepFailedError, match=r"map\[work\]\[4\] raised ValueError"):
        failed.raise_for_status()
    # concurrency=1 stops at the failure: items after it never started
    assert set(_map_records(store, "resume-me")) == {f"map[work][{i}]" for i in range(4)}
    broken["yes"] = False
    done = wf.resume(store, "resume-me")
    assert done.state["out"] == [0, -1, -2, -3, -4, -5]
    assert calls == Counter({0: 1, 1: 1, 2: 1, 3: 1, 4: 2, 5: 1})


def test_return_exceptions_makes_failures_results_and_reruns_them_next_time(
    store: Store,
) -> None:
    wf = pitstop.Workflow("map-exceptions")
    seen: list[Any] = []
    calls: Counter[int] = Counter()

    async def work(x: int) -> int:
        calls[x] += 1
        if x % 2:
            raise RuntimeError(f"odd {x}")
        return x

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        out = ctx.map(work, range(4), return_exceptions=True)
        seen.append(out)
        ok = [r for r in out if not isinstance(r, Exception)]
        if len(seen) == 1:
            ctx.sleep(0.01)  # park the run: the step runs again when it wakes
        return {"ok": ok}

    first = wf.start(store, {}, run_id="exc")
    assert first.status is RunStatus.WAITING
    assert [type(r).__name__ for r in seen[0]] == ["int", "RuntimeError", "int", "RuntimeError"]
    assert str(seen[0][3]) == "odd 3"
    time.sleep(0.02)
    done = wf.resume(store, "exc")
    assert done.state["ok"] == [0, 2]
    assert calls == Counter({0: 1, 1: 2, 2: 1, 3: 2})  # only the failures ran again


def test_unserialisable_result_is_a_serialization_error_naming_the_item(store: Store) -> None:
    wf = pitstop.Workflow("map-unserialisable")

    class Opaque:
        pass

    def work(x: int) -> Any:
        return {"value": Opaque()} if x == 2 else x

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.map(work, range(5), name="probe", concurrency=5)}

    result = wf.start(store, {}, run_id="bad-value")
    assert result.status is RunStatus.FAILED
    assert result.error is not None
    assert result.error["type"] == "pitstop.errors.SerializationError"
    assert "map[probe][2].value" in result.error["message"]
    assert "'bad-value'" in result.error["message"]
    assert set(_map_records(store, "bad-value")) == {f"map[probe][{i}]" for i in (0, 1, 3, 4)}


def test_bad_arguments_name_the_step_and_write_nothing(store: Store) -> None:
    wf = pitstop.Workflow("map-bad")
    attempts: list[Any] = []

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        case = state["case"]
        try:
            if case == "not-iterable":
                ctx.map(str, 42)
            elif case == "string":
                ctx.map(str, "abc")
            elif case == "concurrency":
                ctx.map(str, [1], concurrency=0)
            elif case == "not-callable":
                ctx.map("str", [1])  # type: ignore[arg-type]
            else:
                ctx.map(str, [1], name="twice")
                ctx.map(str, [1], name="twice")
        except (TypeError, ValueError) as exc:
            attempts.append(exc)
            raise
        return {}

    for case in ("not-iterable", "string", "concurrency", "not-callable", "twice"):
        result = wf.start(store, {"case": case}, run_id=f"bad-{case}")
        assert result.status is RunStatus.FAILED
        assert f"run 'bad-{case}', step 'fan'" in str(attempts[-1])
        expected = 1 if case == "twice" else 0  # the first map of "twice" did its work
        assert len(_map_records(store, f"bad-{case}")) == expected
    assert "iterable of items" in str(attempts[0]) and "got int" in str(attempts[0])


def test_sync_map_in_an_async_step_says_to_await_amap(store: Store) -> None:
    wf = pitstop.Workflow("map-wrong-api")

    @wf.step
    async def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.map(str, [1])}

    result = asyncio.run(wf.astart(store, {}))
    assert result.status is RunStatus.FAILED
    assert result.error is not None and "await ctx.amap" in result.error["message"]


def test_maps_of_one_function_in_a_step_are_numbered_apart(store: Store) -> None:
    wf = pitstop.Workflow("map-names")

    def ident(x: int) -> int:
        return x

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"a": ctx.map(ident, [1, 2]), "b": ctx.map(ident, [3]),
                "c": ctx.map(lambda x: x, [4])}

    wf.start(store, {}, run_id="names")
    assert _map_records(store, "names") == {
        "map[ident][0]": 1, "map[ident][1]": 2, "map[ident#2][0]": 3, "map[<lambda>][0]": 4,
    }


def test_each_execution_of_a_looping_step_maps_afresh(store: Store) -> None:
    wf = pitstop.Workflow("map-loop")

    @wf.step
    def rounds(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        n = state["n"]
        got = ctx.map(lambda x: x + n, range(3), name="add")
        update = {"n": n + 1, "seen": [*state["seen"], got]}
        return pitstop.goto("rounds", update) if n < 2 else update

    result = wf.start(store, {"n": 0, "seen": []})
    assert result.state["seen"] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]


def test_effects_inside_items_run_once_across_a_retry(store: Store) -> None:
    wf = pitstop.Workflow("map-effects", retry=pitstop.Retry(attempts=3, backoff=0))
    sent: Counter[int] = Counter()
    tries = {"n": 0}

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        tries["n"] += 1

        def notify(x: int) -> int:
            ctx.effect(f"mail-{x}", sent.update, [x])
            if x == 3 and tries["n"] == 1:
                raise OSError("crash after the e-mail went out")
            return x

        return {"out": ctx.map(notify, range(6), concurrency=3)}

    result = wf.start(store, {})
    assert result.state["out"] == list(range(6))
    assert sent == Counter(range(6))  # item 3 ran twice, its e-mail once


# -- SIGKILL in the middle of a map ---------------------------------------------------------------

MAPPER = """
import sys
sys.path.insert(0, "tests")
import pitstop, workflows
url, run_id, log = sys.argv[1:4]
store = pitstop.open_store(url)
try:
    store.get_run(run_id)
except pitstop.RunNotFoundError:
    result = workflows.mapper.start(store, {"log": log}, run_id=run_id)
else:
    result = workflows.mapper.resume(store, run_id)
print(result.status.value, flush=True)
"""


def _started_by(log: Path, pid: int) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.startswith(f"start {pid} "))


@pytest.mark.slow
@pytest.mark.parametrize("fn_kind", ["sync", "async"])
def test_sigkill_during_a_map_reruns_at_most_the_items_in_flight(
    tmp_path: Path, fn_kind: str, shared_url: str
) -> None:
    """On SQLite and PostgreSQL (whose batches of results go as one statement of arrays)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import workflows

    url = shared_url
    log = tmp_path / "items.log"
    run_id = f"map-crash-{fn_kind}"
    env = {**os.environ, "MAPPER_KIND": fn_kind}
    # Each process is killed once it has started this many items: mid-map, mid-round.
    kill_at = [7, 3, 9, 6]
    pids: list[int] = []
    for target in [*kill_at, None]:
        proc = subprocess.Popen(
            [sys.executable, "-c", MAPPER, url, run_id, str(log)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        pids.append(proc.pid)
        if target is not None:
            deadline = time.monotonic() + 60
            while _started_by(log, proc.pid) < target and proc.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        if target is not None:
            assert proc.returncode == -signal.SIGKILL, (out, err)
        else:
            assert proc.returncode == 0, err
            assert out.strip() == "completed"
    kills = len(kill_at)

    starts: list[tuple[int, int]] = []  # (pid, item) per execution of an item
    mails: dict[int, list[str]] = {}
    for line in log.read_text().splitlines():
        kind, pid, item, *rest = line.split()
        if kind == "start":
            starts.append((int(pid), int(item)))
        else:
            mails.setdefault(int(item), []).append(rest[0])
    per_item = Counter(item for _, item in starts)
    assert set(per_item) == set(range(workflows.MAP_ITEMS))
    # Each killed process leaves at most `concurrency` items started without a recorded
    # result; only those run again.
    reruns = sum(n - 1 for n in per_item.values())
    assert reruns <= workflows.MAP_CONCURRENCY * kills
    with pitstop.open_store(url) as store:
        final = store.latest(run_id)
        assert final is not None
        state = final.state
        assert state["squares"] == [i * i for i in range(workflows.MAP_ITEMS)]
        recorded = store.effects(run_id)
        for item in range(workflows.MAP_ITEMS):
            # No process started an item after an earlier one had recorded its result.
            recorder = pids.index(state["pids"][item])
            assert all(pids.index(pid) <= recorder for pid, i in starts if i == item)
            # The e-mail's recorded call is its last one: it never ran after being recorded.
            nonce = next(v for k, v in recorded.items() if k.endswith(f":mail-{item}"))
            assert mails[item][-1] == nonce == state["nonces"][item]
        assert store.verify() == []


class _CountedWrites:
    """Counts the store's ``record_effects`` calls (each one write transaction) and, at each,
    how many items had started without a recorded result."""

    def __init__(self, store: Store) -> None:
        self.writes = 0
        self.started = 0
        self.recorded = 0
        self.most_unrecorded = 0
        self.lock = threading.Lock()
        record = store.record_effects

        def counted(run_id: str, results: Any, **kwargs: Any) -> None:
            record(run_id, results, **kwargs)
            with self.lock:
                self.writes += 1
                self.recorded += len(results)

        store.record_effects = counted  # type: ignore[method-assign]

    def start(self) -> None:
        with self.lock:
            self.started += 1
            self.most_unrecorded = max(self.most_unrecorded, self.started - self.recorded)


def test_quick_items_share_writes_and_stay_within_their_window(store: Store) -> None:
    """Items of a few µs each cannot pay a commit each: those that finish while a batch is
    written make up the next, one transaction for many. At most `concurrency` +
    REPEAT_ITEMS of them are ever started without a recorded result."""
    from pitstop.runtime.parallel import REPEAT_ITEMS

    counted = _CountedWrites(store)
    wf = pitstop.Workflow("map-quick")

    def work(x: int) -> int:
        counted.start()
        return x * 2

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.map(work, range(2_000), concurrency=4)}

    result = wf.start(store, {})
    assert result.state["out"] == [x * 2 for x in range(2_000)]
    assert counted.recorded == 2_000
    assert counted.writes <= 2_000 // 8, counted.writes  # one write per item before
    assert counted.most_unrecorded <= 4 + REPEAT_ITEMS


def test_slow_items_start_only_once_the_results_before_them_are_written(store: Store) -> None:
    """Items of REPEAT_SECONDS or more keep the strict window: at most `concurrency` started
    without a recorded result (what a crash can make run again)."""
    from pitstop.runtime.parallel import REPEAT_SECONDS

    counted = _CountedWrites(store)
    wf = pitstop.Workflow("map-slow")

    def work(x: int) -> int:
        counted.start()
        time.sleep(REPEAT_SECONDS * 1.25)
        return x

    @wf.step
    def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.map(work, range(15), concurrency=3)}

    result = wf.start(store, {})
    assert result.state["out"] == list(range(15))
    assert counted.most_unrecorded <= 3
