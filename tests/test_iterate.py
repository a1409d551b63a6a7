"""Resumable iteration: ctx.iterate in a workflow step, Checkpointer.iterate in a loop."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import RunStatus, Store, Workflow
from pitstop.runtime.iteration import Position, Resumable


def run_until(it: Resumable[Any], stop: int) -> list[Any]:
    """Iterate; 'crash' (stop without finishing) once ``stop`` items are done."""
    seen = []
    for item in it:
        seen.append(item)
        if len(seen) == stop:
            break
    return seen


def resumable(source: Any, start: Position | None = None, **kw: Any) -> tuple[Resumable[Any],
                                                                                list[Position]]:
    records: list[Position] = []
    return Resumable(source, start=start, every=kw.pop("every", 3), seconds=None, due=None,
                     record=records.append, **kw), records


class Counting:
    """An iterable that is neither a sequence nor positioned: counts the items it produces."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.produced = 0

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.produced += 1
            yield i


@pytest.mark.parametrize("kind", ["range", "list", "generator", "text file", "binary file"])
def test_resume_continues_after_the_last_recorded_position(kind: str, tmp_path: Path) -> None:
    lines = [f"record {i}\n" for i in range(20)]
    path = tmp_path / "data.txt"
    path.write_text("".join(lines))

    def source() -> Any:
        if kind == "range":
            return range(20)
        if kind == "list":
            return list(range(20))
        if kind == "generator":
            return Counting(20)
        return open(path, "r" if kind == "text file" else "rb")

    first, records = resumable(source())
    done = run_until(first, 8)  # 8 items done; positions recorded at 3 and 6
    assert [r["index"] for r in records] == [3, 6]
    second_source = source()
    second, _ = resumable(second_source, start=records[-1])
    rest = list(second)
    assert second.resumed_from == 6 and second.position == 20
    everything = done[:6] + rest
    if kind.endswith("file"):
        expected: list[Any] = lines if kind == "text file" else [x.encode() for x in lines]
        assert everything == expected
        assert records[-1]["offset"] == sum(len(x) for x in lines[:6])  # sought, not re-read
    else:
        assert everything == list(range(20))
    if kind == "generator":
        assert second_source.produced == 20  # skipped forward: read and dropped


def test_a_failing_body_records_nothing_for_its_item() -> None:
    it, records = resumable(range(10), every=1)

    def body() -> None:
        for i in it:
            if i == 4:
                raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        body()
    assert records[-1]["index"] == 4  # items 0-3 done; item 4 runs again


def test_seconds_cadence_with_a_fake_clock() -> None:
    now = [0.0]
    records: list[Position] = []
    it = Resumable(range(100), start=None, every=None, seconds=1.0, due=None,
                   record=records.append, clock=lambda: now[0])
    for _ in it:
        now[0] += 0.3
    assert [r["index"] for r in records] == list(range(4, 101, 4))  # every 1.2 s of 0.3 s items


def test_iterated_once_only() -> None:
    it, _ = resumable(range(3))
    list(it)
    with pytest.raises(RuntimeError, match="only once"):
        iter(it)


def test_positioned_user_source() -> None:
    class Cursor:
        """A source that says where it is (like a queue offset or a database cursor)."""

        def __init__(self) -> None:
            self.at = 0

        def tell(self) -> int:
            return self.at

        def seek(self, offset: int) -> None:
            self.at = offset

        def __iter__(self) -> Iterator[int]:
            while self.at < 10:
                self.at += 1
                yield self.at * 100

    first, records = resumable(Cursor(), every=4)
    run_until(first, 5)
    assert [(r["index"], r["offset"], r["total"]) for r in records] == [(4, 4, None)]
    cursor = Cursor()
    second, _ = resumable(cursor, start=records[0])
    assert list(second) == [500, 600, 700, 800, 900, 1000]


# -- Checkpointer.iterate ----------------------------------------------------------------------

def test_checkpointer_iterate_resumes_with_consistent_state(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'it.db'}"

    def job(crash_at: int | None) -> dict[str, Any]:
        with pitstop.Checkpointer(url, "batch") as ckpt:
            state = ckpt.restore(default={"total": 0, "epoch": 0})
            while state["epoch"] < 3:
                for x in ckpt.iterate(range(50), every=7, state=state):
                    state["total"] += x
                    if crash_at is not None and state["epoch"] == 1 and x == crash_at:
                        raise KeyboardInterrupt  # dies mid-epoch
                state["epoch"] += 1
            ckpt.save(state, force=True)
            return dict(state)

    with pytest.raises(KeyboardInterrupt):
        job(crash_at=30)
    assert job(crash_at=None) == {"total": 3 * sum(range(50)), "epoch": 3}


def test_checkpointer_iterate_follows_the_policy_when_no_cadence(tmp_path: Path) -> None:
    store = pitstop.open_store("memory://")
    with pitstop.Checkpointer(store, "r", policy=pitstop.CheckpointPolicy(every=10)) as ckpt:
        for _ in ckpt.iterate(io.StringIO("a\nb\nc\n" * 10), state={}):
            pass
    positions = [c.metadata["iterate"]["items"]["index"] for c in store.history("r")]
    assert positions == [30, 20, 10]


# -- ctx.iterate in a workflow -----------------------------------------------------------------

def test_ctx_iterate_resumes_a_retried_step_and_effects_run_once(store: Store) -> None:
    wf = Workflow("batch", retry=pitstop.Retry(attempts=2, backoff=0))
    sent: list[int] = []
    crashed: list[bool] = []

    def send(i: int) -> int:
        sent.append(i)
        return i * 2

    @wf.step
    def process(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        it = ctx.iterate(range(100), every=10, state={"sum": 0})
        for i in it:
            it.state["sum"] += ctx.effect(f"send-{i}", send, i)
            if i == 55 and not crashed:
                crashed.append(True)
                raise RuntimeError("dies after item 55's effect")
        return {"sum": it.state["sum"], "resumed_from": it.resumed_from}

    result = wf.start(store, {})
    assert result.status is RunStatus.COMPLETED
    assert result.state["sum"] == 2 * sum(range(100))
    assert result.state["resumed_from"] == 50  # the retry skipped the 50 recorded items
    assert sorted(sent) == list(range(100))  # items 50-55 ran again; their effects did not


def test_ctx_iterate_names_must_differ_within_a_step(store: Store) -> None:
    wf = Workflow("two-loops")

    @wf.step
    def both(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        list(ctx.iterate([1], every=1))
        list(ctx.iterate([2], every=1))
        return {}

    result = wf.start(store, {})
    assert result.status is RunStatus.FAILED and "used twice" in str(result.error)


def test_idempotency_key_detection_is_cached_per_function_not_per_wrapper() -> None:
    import functools

    from pitstop.runtime.context import _takes_key

    def plain(x: int) -> int:
        return x

    def keyed(x: int, *, idempotency_key: str) -> int:
        return x

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    assert [_takes_key(f) for f in (plain, keyed, plain, keyed)] == [False, True, False, True]
    assert [_takes_key(logged(f)) for f in (plain, keyed)] == [False, True]
