"""The workflow runtime, in one process, on every store backend."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, TypedDict

import pydantic
import pytest

import pitstop
from pitstop import (
    CheckpointPolicy,
    InputError,
    Retry,
    RunBusyError,
    RunExistsError,
    RunNotStartedError,
    RunStatus,
    SchemaVersionError,
    StepFailedError,
    Store,
    Workflow,
)
from pitstop.runtime.leases import keeper


def linear(name: str = "linear", **options: Any) -> Workflow:
    wf = Workflow(name, **options)

    @wf.step
    def one(state: dict[str, Any]) -> dict[str, Any]:
        return {"trail": [*state.get("trail", []), "one"]}

    @wf.step
    def two(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"trail": [*state["trail"], "two"], "run": ctx.run_id}

    @wf.step
    def three(state: dict[str, Any]) -> dict[str, Any]:
        return {"trail": [*state["trail"], "three"]}

    return wf


def test_steps_run_in_declared_order_with_a_checkpoint_each(store: Store) -> None:
    wf = linear()
    result = wf.start(store, {"x": 1}, run_id="r")
    assert result.status is RunStatus.COMPLETED and result.done
    assert result.state == {"x": 1, "trail": ["one", "two", "three"], "run": "r"}
    history = store.history("r")
    assert [h.metadata["step_name"] for h in history] == ["three", "two", "one", None]
    assert [h.metadata["next"] for h in history] == [None, "three", "two", "one"]
    assert history[0].metadata["completed"] == ["one", "two", "three"]
    assert history[-1].source == "input"
    run = store.get_run("r")
    assert run.status is RunStatus.COMPLETED and run.workflow == "linear"
    assert run.owner is None  # lease released


def test_goto_loops_and_finish_early(store: Store) -> None:
    wf = Workflow("loop")

    @wf.step
    def count(state: dict[str, Any]) -> Any:
        if state["i"] >= 5:
            return pitstop.goto("check", {"looped": True})
        return pitstop.goto("count", {"i": state["i"] + 1})

    @wf.step
    def never(state: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("skipped by goto")

    @wf.step
    def check(state: dict[str, Any]) -> Any:
        return pitstop.finish({"done": True})

    @wf.step
    def after_finish(state: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("finish ends the run")

    result = wf.start(store, {"i": 0})
    assert result.status is RunStatus.COMPLETED
    assert result.state == {"i": 5, "looped": True, "done": True}
    assert store.get_run(result.run_id).step == 7


def test_unknown_goto_target_fails_the_run_clearly(store: Store) -> None:
    wf = Workflow("bad-goto")

    @wf.step
    def a(state: dict[str, Any]) -> Any:
        return pitstop.goto("nowhere")

    result = wf.start(store)
    assert result.status is RunStatus.FAILED
    assert result.error is not None and "nowhere" in result.error["message"]


@dataclasses.dataclass
class Doc:
    title: str
    pages: int = 0


class Model(pydantic.BaseModel):
    title: str
    pages: int = 0


class TD(TypedDict):
    title: str
    pages: int


def test_state_types(store: Store) -> None:
    for state_type, initial in ((Doc, Doc("a")), (Model, Model(title="a")), (TD, {"title": "a"})):
        wf = Workflow(f"typed-{state_type.__name__}", state=state_type)

        @wf.step
        def grow(state: Any) -> Any:
            if isinstance(state, dict):
                return {"pages": state.get("pages", 0) + 1}
            state.pages += 1  # top-level assignment on the view counts as an update
            return None

        @wf.step
        def rename(state: Any) -> Any:
            return {"title": "b"}

        result = wf.start(store, initial)
        assert result.status is RunStatus.COMPLETED
        if isinstance(result.state, dict):
            assert result.state == {"title": "b", "pages": 1}
        else:
            assert type(result.state) is state_type
            assert (result.state.title, result.state.pages) == ("b", 1)


def test_async_steps(store: Store) -> None:
    wf = Workflow("async")

    @wf.step
    async def fetch(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        value = await ctx.aeffect("call", _async_double, 21)
        return {"value": value}

    @wf.step
    def sync_after(state: dict[str, Any]) -> dict[str, Any]:
        return {"plus": state["value"] + 1}

    result = asyncio.run(wf.astart(store, {}))
    assert result.state == {"value": 42, "plus": 43}
    # the sync API runs async steps too, when no event loop is running
    assert wf.start(store, {}).state == {"value": 42, "plus": 43}


async def _async_double(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


# -- checkpoint policies --------------------------------------------------------------------------


def _many(n: int, **options: Any) -> Workflow:
    wf = Workflow("many", **options)
    def make(i: int) -> Any:
        return lambda state: {"i": i}

    for i in range(n):
        wf.step(name=f"s{i}", milestone=(i == 5))(make(i))
    return wf


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (CheckpointPolicy(), 11),  # input + 10 steps (the last one is the completion)
        (CheckpointPolicy(every=3), 5),  # input, s2, s5 (milestone), s8, completion
        (CheckpointPolicy.milestones(), 1 + 1 + 1),  # input, milestone s5, completion
    ],
)
def test_checkpoint_policies(store: Store, policy: CheckpointPolicy, expected: int) -> None:
    wf = _many(10, policy=policy)
    result = wf.start(store, {})
    assert result.status is RunStatus.COMPLETED
    history = store.history(result.run_id, limit=None)
    assert len(history) == expected
    milestone = [h for h in history if h.tags]
    assert [h.metadata["step_name"] for h in milestone] == ["s5"]


def test_every_seconds_policy(store: Store) -> None:
    wf = Workflow("timed", policy=CheckpointPolicy.every_seconds(0.05))

    @wf.step
    def tick(state: dict[str, Any]) -> Any:
        time.sleep(0.01)
        if state["n"] < 20:
            return pitstop.goto("tick", {"n": state["n"] + 1})
        return None

    result = wf.start(store, {"n": 0})
    n = len(store.history(result.run_id, limit=None))
    assert 3 <= n <= 10  # ~0.2 s of steps: a handful, not one per step


def test_ctx_checkpoint_forces_one_before_a_risky_action(store: Store) -> None:
    wf = Workflow("risky", policy=CheckpointPolicy.milestones())
    seen: list[str] = []

    @wf.step
    def a(state: dict[str, Any]) -> dict[str, Any]:
        return {"a": 1}

    @wf.step
    def b(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        seen.append(ctx.checkpoint(tag="before-launch"))
        return {"b": 2}

    result = wf.start(store, {})
    forced = store.get(seen[0])
    assert forced.state == {"a": 1}  # everything before the step is durable
    assert forced.metadata["next"] == "b" and forced.tags == ("before-launch",)
    assert result.state == {"a": 1, "b": 2}


def test_unchanged_fields_are_not_written_again(store: Store) -> None:
    wf = Workflow("big")
    big = "z" * (1 << 20)

    @wf.step
    def loop(state: dict[str, Any]) -> Any:
        if state["i"] < 50:
            return pitstop.goto("loop", {"i": state["i"] + 1})
        return None

    before = store.stats().bytes
    wf.start(store, {"doc": big, "i": 0})
    grown = store.stats().bytes - before
    assert grown < 200_000  # 1 MiB of 'z' compresses; 52 checkpoints add only small records


# -- failures and retries -------------------------------------------------------------------------


def test_failed_step_keeps_prior_state_and_resume_retries(store: Store) -> None:
    wf = Workflow("flaky")
    calls: list[int] = []

    @wf.step
    def first(state: dict[str, Any]) -> dict[str, Any]:
        return {"first": True}

    @wf.step
    def second(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("upstream said no")
        return {"second": True}

    result = wf.start(store, {}, run_id="f")
    assert result.status is RunStatus.FAILED and result.step == "second"
    assert result.state == {"first": True}
    assert result.error is not None and result.error["type"] == "ValueError"
    assert "upstream said no" in result.error["traceback"]
    with pytest.raises(StepFailedError, match=r"second.*upstream said no"):
        result.raise_for_status()
    head = store.latest("f")
    assert head is not None and head.metadata["error"]["message"] == "upstream said no"
    assert store.get_run("f").status is RunStatus.FAILED

    again = wf.resume(store, "f")
    assert again.status is RunStatus.COMPLETED
    assert again.state == {"first": True, "second": True}


def test_retry_policy_counts_attempts_in_checkpoints(store: Store) -> None:
    wf = Workflow("retry")
    calls: list[int] = []

    @wf.step(retry=Retry(attempts=3, backoff=0.001))
    def wobbly(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return {"ok": True}

    result = wf.start(store, {})
    assert result.status is RunStatus.COMPLETED and len(calls) == 3
    retries = [h for h in store.history(result.run_id) if h.source == "retry"]
    assert [h.metadata["attempts"]["wobbly"] for h in retries] == [2, 1]

    calls.clear()
    always = Workflow("always")

    @always.step(retry=Retry(attempts=2, backoff=0))
    def broken(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        raise RuntimeError("nope")

    failed = always.start(store, {})
    assert failed.status is RunStatus.FAILED and len(calls) == 2
    assert store.latest(failed.run_id).metadata["attempts"] == {"broken": 2}  # type: ignore[union-attr]


# -- waiting for input ----------------------------------------------------------------------------


def test_wait_send_resume(store: Store) -> None:
    from workflows import approval

    result = approval.start(store, {}, run_id="a1")
    assert result.status is RunStatus.WAITING and result.waiting_for == ("decision",)
    run = store.get_run("a1")
    assert run.status is RunStatus.WAITING and run.waiting_for == ("decision",)
    assert run.owner is None and not keeper._held  # nothing held while waiting
    # resuming before the input arrives changes nothing and writes nothing
    again = approval.resume(store, "a1")
    assert again.status is RunStatus.WAITING and len(store.history("a1")) == 2

    with pytest.raises(InputError, match="waits for 'decision'"):
        pitstop.send(store, "a1", "other", 1)
    pitstop.send(store, "a1", "decision", {"approved": True, "by": "ana"})
    done = approval.resume(store, "a1")
    assert done.status is RunStatus.COMPLETED
    assert done.state == {"prepared": True, "outcome": "approved", "approver": "ana",
                          "notified": True}
    assert store.inputs("a1") == {}  # consumed
    consumed = store.history("a1")[1]  # the checkpoint after `decide`
    assert consumed.metadata["inputs"]["decision"]
    with pytest.raises(InputError, match="finished"):
        pitstop.send(store, "a1", "decision", {"approved": False})


def test_a_wait_records_the_fields_its_step_shows(store: Store) -> None:
    wf = pitstop.Workflow("show-fields")

    @wf.step(wait_for="ok", show=("amount", "vendor"))
    def ask(state: dict[str, Any], ok: Any) -> dict[str, Any]:
        return {"done": True}

    @wf.step(wait_for="again")
    def ask_again(state: dict[str, Any], again: Any) -> dict[str, Any]:
        return {}

    assert wf.start(store, {"amount": 3, "vendor": "x", "notes": "n"}, run_id="s1").status \
        is RunStatus.WAITING
    head = store.latest("s1")
    assert head is not None and head.metadata["show"] == ["amount", "vendor"]
    pitstop.send(store, "s1", "ok", True)
    wf.resume(store, "s1")
    head = store.latest("s1")
    assert head is not None and head.metadata["waiting_for"] == ["again"]
    assert "show" not in head.metadata  # only the step that declared it


def test_wait_timeout_runs_the_step_without_input(store: Store) -> None:
    wf = Workflow("deadline")

    @wf.step(wait_for="reply", timeout=0.05)
    def await_reply(state: dict[str, Any], ctx: pitstop.StepContext, reply: Any) -> Any:
        return {"reply": reply, "timed_out": ctx.timed_out}

    first = wf.start(store, {})
    assert first.status is RunStatus.WAITING and first.wake_at is not None
    assert store.get_run(first.run_id).wake_at is not None
    time.sleep(0.08)
    done = wf.resume(store, first.run_id)
    assert done.state == {"reply": None, "timed_out": True}


def test_durable_sleep(store: Store) -> None:
    """A resume before the wake time parks the run again (wake time not pushed back); one
    after it completes. An attempt whose "early" resume came after the wake (a loaded
    machine) is told by the clock and repeated with a longer nap."""
    wf = Workflow("sleepy")
    runs: list[float] = []

    @wf.step
    def nap(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        runs.append(state["nap_for"])
        ctx.sleep(state["nap_for"])
        return {"woke": True}

    for nap_for in (0.1, 0.5, 2.0, 8.0):
        first = wf.start(store, {"nap_for": nap_for})
        assert first.status is RunStatus.WAITING and first.wake_at is not None
        assert store.get_run(first.run_id).owner is None
        early = wf.resume(store, first.run_id)
        if early.status is RunStatus.COMPLETED and time.time() >= first.wake_at.timestamp():
            continue  # the resume ended after the wake: it was not early
        assert early.status is RunStatus.WAITING and early.wake_at == first.wake_at
        time.sleep(max(0.0, first.wake_at.timestamp() - time.time()) + 0.02)
        done = wf.resume(store, first.run_id)
        assert done.status is RunStatus.COMPLETED
        assert done.state == {"nap_for": nap_for, "woke": True}
        assert runs.count(nap_for) == 3
        return
    pytest.fail("no resume came before an 8 s nap ended")


# -- effects --------------------------------------------------------------------------------------


def test_effect_runs_once_across_re_execution(store: Store) -> None:
    wf = Workflow("pay")
    charges: list[str] = []
    crashes: list[int] = []

    def charge(amount: int, *, idempotency_key: str) -> str:
        charges.append(idempotency_key)
        return f"receipt-{amount}"

    @wf.step
    def pay(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        receipt = ctx.effect("charge", charge, 10)
        if not crashes:
            crashes.append(1)
            raise RuntimeError("failure after the charge, before the checkpoint")
        return {"receipt": receipt}

    first = wf.start(store, {})
    assert first.status is RunStatus.FAILED and len(charges) == 1
    done = wf.resume(store, first.run_id)  # the step runs again; the charge does not
    assert done.status is RunStatus.COMPLETED and done.state["receipt"] == "receipt-10"
    assert len(charges) == 1
    assert charges[0].startswith(first.run_id)


def test_effect_names_must_be_unique_in_a_step(store: Store) -> None:
    wf = Workflow("dupe")

    @wf.step
    def twice(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.effect("x", lambda: 1)
        ctx.effect("x", lambda: 2)
        return {}

    result = wf.start(store, {})
    assert result.status is RunStatus.FAILED and "used twice" in result.error["message"]  # type: ignore[index]


# -- time travel ----------------------------------------------------------------------------------


def test_resume_from_an_earlier_checkpoint_makes_a_branch(store: Store) -> None:
    wf = linear("branching")
    wf.start(store, {"x": 1}, run_id="b")
    original = store.history("b", limit=None)
    after_one = next(h for h in original if h.metadata["step_name"] == "one")
    result = wf.resume(store, "b", from_checkpoint=after_one.id)
    assert result.status is RunStatus.COMPLETED
    assert result.state["trail"] == ["one", "two", "three"]
    history = store.history("b", limit=None)
    assert len(history) == len(original) + 3  # branch point + two + three
    branch_point = next(h for h in history if h.source == "resume")
    assert branch_point.parent_id == after_one.id
    assert branch_point.metadata["branch"] != "b"
    assert {h.id for h in original} <= {h.id for h in history}  # nothing overwritten


def test_fork_with_edited_state(store: Store) -> None:
    wf = linear("forking")
    wf.start(store, {"x": 1}, run_id="src")
    after_two = next(h for h in store.history("src") if h.metadata["step_name"] == "two")
    result = wf.fork(store, after_two.id, update={"x": 99}, run_id="copy")
    assert result.run_id == "copy" and result.status is RunStatus.COMPLETED
    assert result.state["x"] == 99 and result.state["trail"] == ["one", "two", "three"]
    assert store.latest("src").state["x"] == 1  # type: ignore[union-attr]
    first = store.history("copy", limit=None)[-1]
    assert first.metadata["forked_from"]["checkpoint_id"] == after_two.id


# -- ownership and versions -----------------------------------------------------------------------


def test_a_running_run_cannot_be_resumed_twice(store: Store) -> None:
    wf = Workflow("busy")
    inside: list[Any] = []

    @wf.step
    def probe(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        with pytest.raises(RunBusyError):
            wf.resume(store, ctx.run_id)
        inside.append(store.get_run(ctx.run_id).owner)
        return {}

    result = wf.start(store, {})
    assert result.status is RunStatus.COMPLETED and inside[0] is not None


def test_state_migrations(store: Store) -> None:
    v1 = Workflow("evolving", version=1)

    @v1.step
    def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"name": "Ada Lovelace"}

    @v1.step(wait_for="go")
    def wait(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    first = v1.start(store, {}, run_id="m")
    assert first.status is RunStatus.WAITING

    v3 = Workflow("evolving", version=3)

    @v3.migration(from_version=1)
    def split(state: dict[str, Any]) -> dict[str, Any]:
        first_name, last = state.pop("name").split(" ", 1)
        return {**state, "first": first_name, "last": last}

    @v3.migration(from_version=2)
    def add_title(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "title": "Countess"}

    v3.step(ask)
    v3.step(wait_for="go")(wait)
    pitstop.send(store, "m", "go", True)
    done = v3.resume(store, "m")
    assert done.state == {"first": "Ada", "last": "Lovelace", "title": "Countess"}
    assert store.latest("m").schema_version == 3  # type: ignore[union-attr]

    with pytest.raises(SchemaVersionError, match="newer than workflow 'evolving' version 1"):
        v1.resume(store, "m", from_checkpoint=store.latest("m").id)  # type: ignore[union-attr]
    v2 = Workflow("evolving", version=2)
    v2.step(ask)
    with pytest.raises(SchemaVersionError, match="version 3"):
        v2.resume(store, "m", from_checkpoint=store.latest("m").id)  # type: ignore[union-attr]
    assert store.get_run("m").owner is None  # the failed resume released the run


def test_enqueue_then_resume(store: Store) -> None:
    wf = linear("queued")
    run = wf.enqueue(store, {"x": 2}, run_id="q")
    assert run.status is RunStatus.QUEUED and run.owner is None
    result = wf.resume(store, "q")
    assert result.status is RunStatus.COMPLETED


def test_starting_a_run_again_with_the_same_input_converges(store: Store) -> None:
    """A start (or enqueue) repeated after an error that left its outcome unknown must not
    fork the run or be refused: the same id and input is the same run."""
    wf = linear()
    first = wf.start(store, {"x": 1}, run_id="again")
    again = wf.start(store, {"x": 1}, run_id="again")
    assert again.status is RunStatus.COMPLETED and again.checkpoint_id == first.checkpoint_id
    assert len(store.history("again", limit=None)) == 4  # nothing written twice
    with pytest.raises(RunExistsError):
        wf.start(store, {"x": 2}, run_id="again")  # other input: another run
    with pytest.raises(RunExistsError):
        linear("other").start(store, {"x": 1}, run_id="again")
    queued = wf.enqueue(store, {"x": 3}, run_id="q")
    assert wf.enqueue(store, {"x": 3}, run_id="q") == queued
    with pytest.raises(RunExistsError):
        wf.enqueue(store, {"x": 4}, run_id="q")


def test_a_run_created_without_its_first_checkpoint_is_started_by_the_next_start(
    store: Store,
) -> None:
    wf = linear()
    store.create_run("orphan", workflow=wf.name)  # what a process killed right here left
    with pytest.raises(RunNotStartedError, match="has no checkpoint to continue from"):
        wf.resume(store, "orphan")
    assert wf.start(store, {"x": 1}, run_id="orphan").status is RunStatus.COMPLETED
    store.create_run("queued-orphan", workflow=wf.name, status=RunStatus.QUEUED)
    assert wf.enqueue(store, {"x": 1}, run_id="queued-orphan").head_id is not None


def test_background_durability(store: Store, tmp_path: Any) -> None:
    from workflows import counter_background, counter_input

    result = counter_background.start(store, counter_input(str(tmp_path / "log")))
    assert result.status is RunStatus.COMPLETED
    assert store.latest(result.run_id).state["finished"] is True  # type: ignore[union-attr]
    assert len(store.history(result.run_id, limit=None)) == 102
    assert store.verify() == []


def test_cancelled_run_stops_at_its_next_checkpoint(store: Store) -> None:
    wf = Workflow("cancel-me")

    @wf.step
    def first(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        store.update_run(ctx.run_id, status=RunStatus.CANCELLED)
        return {"first": True}

    @wf.step
    def second(state: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("never runs")

    result = wf.start(store, {})
    assert result.status is RunStatus.CANCELLED
    assert store.get_run(result.run_id).status is RunStatus.CANCELLED


def test_workflow_definition_errors() -> None:
    wf = Workflow("defs")

    @wf.step
    def a(state: dict[str, Any]) -> None:
        return None

    with pytest.raises(ValueError, match="already has a step"):
        wf.step(name="a")(lambda state: None)
    with pytest.raises(TypeError, match=r"\(state\) or \(state, ctx\)"):
        wf.step(lambda: None)
    with pytest.raises(ValueError, match="durability"):
        Workflow("x", durability="sometimes")  # type: ignore[arg-type]


def test_milestone_before_a_wait_is_checkpointed_and_tagged(store: Store) -> None:
    wf = Workflow("milestone-wait")

    @wf.step(milestone=True)
    def reviewed(state: dict[str, Any]) -> dict[str, Any]:
        return {"reviewed": True}

    @wf.step(wait_for="go")
    def go(state: dict[str, Any]) -> dict[str, Any]:
        return {"went": True}

    @wf.step(tags=["shipped"])
    def ship(state: dict[str, Any]) -> dict[str, Any]:
        return {"shipped": True}

    first = wf.start(store, {})
    tagged = [h for h in store.history(first.run_id) if h.tags]
    assert [(h.tags, h.metadata["step_name"]) for h in tagged] == [(("reviewed",), "reviewed")]
    pitstop.send(store, first.run_id, "go", 1)
    wf.resume(store, first.run_id)
    final = store.latest(first.run_id)
    assert final is not None and final.tags == ("shipped",)
    kept = store.prune(pitstop.RetentionPolicy(keep_last=1), run_id=first.run_id)
    assert {h.metadata["step_name"] for h in store.history(first.run_id)} == {"reviewed", "ship"}
    assert kept.checkpoints


def test_content_change_detection_sees_in_place_mutation(store: Store) -> None:
    for mode, expected in (("updates", []), ("content", ["x", "y"])):
        wf = Workflow(f"mutating-{mode}", change_detection=mode)

        @wf.step
        def first(state: dict[str, Any]) -> None:
            state["items"].append("x")  # in place, not returned

        @wf.step
        def second(state: dict[str, Any]) -> None:
            state["items"].append("y")

        result = wf.start(store, {"items": []})
        assert store.latest(result.run_id).state["items"] == expected  # type: ignore[union-attr]
