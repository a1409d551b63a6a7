"""Timelines, event lists and loop progress (#29): what the runtime records in checkpoint
metadata, what pitstop.observe reads back, and how the CLI and the inspector show it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import pitstop
from clitools import pitstop_exe
from pitstop import Checkpointer, Retry, RunStatus, Store, Workflow
from pitstop.observe import events, progress, timeline


def _story(store: Store) -> str:
    """A run that retries a step, records an effect, iterates, maps, waits for an input and
    completes: every kind of span and event but children and cancellation."""
    wf = Workflow("story")
    calls = {"n": 0}

    @wf.step(retry=Retry(attempts=3, backoff=0))
    def fetch(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        calls["n"] += 1
        time.sleep(0.03)
        if calls["n"] == 1:
            raise RuntimeError("flaky upstream")
        ctx.effect("charge", lambda: 42)
        it = ctx.iterate(range(40), every=10, state={"n": 0})
        for _ in it:
            it.state["n"] += 1
        ctx.map(lambda x: x * 2, range(5), name="double")
        return {"fetched": True}

    @wf.step(wait_for=["approval"])
    def approve(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"approved": ctx.input("approval")}

    result = wf.start(store, {})
    assert result.status is RunStatus.WAITING
    store.send(result.run_id, "approval", True)
    assert wf.resume(store, result.run_id).status is RunStatus.COMPLETED
    return result.run_id


def test_each_checkpoint_records_when_its_step_started_and_how_long_it_ran(
    store: Store,
) -> None:
    run_id = _story(store)
    by_source: dict[str, list[Any]] = {}
    for entry in store.history(run_id):
        by_source.setdefault(entry.source or "", []).append(entry)
    retried = by_source["retry"][0].metadata
    done = next(e for e in by_source["step"] if e.metadata["step_name"] == "fetch").metadata
    # The retried attempt slept 30 ms, and so did the one that succeeded: the step's
    # checkpoint counts both attempts from the first one's start.
    assert retried["duration"] >= 0.03
    assert done["started_at"] == retried["started_at"]
    assert done["duration"] >= 0.06
    for entry in store.history(run_id):
        if "started_at" in entry.metadata:
            assert entry.metadata["started_at"] <= entry.created_at.timestamp()
    # The lease owner that claimed the run, on the first save of each execution only.
    owners = [e.metadata.get("claimed_by") for e in reversed(store.history(run_id))]
    assert sum(1 for o in owners if o) == 2  # start, then the resume


def test_timeline_and_events_cover_steps_retries_waits_maps_inputs(store: Store) -> None:
    run_id = _story(store)
    spans = timeline(store, run_id)
    kinds = [span.kind for span in spans]
    assert kinds.count("retry") == 1 and kinds.count("step") == 2
    assert "wait" in kinds and "map" in kinds
    retry = next(s for s in spans if s.kind == "retry")
    assert retry.label == "fetch" and "flaky upstream" in retry.detail
    wait = next(s for s in spans if s.kind == "wait")
    assert wait.label == "waiting for approval" and wait.end is not None
    assert next(s for s in spans if s.kind == "map").detail.startswith("5 items")
    assert [s.start for s in spans] == sorted(s.start for s in spans)

    found = events(store, run_id)
    kinds = [event.kind for event in found]
    for kind in ("created", "claimed", "retried", "effect", "map", "waiting", "input",
                 "completed"):
        assert kind in kinds, kind
    assert kinds[0] == "created" and kinds[-1] == "completed"
    assert next(e for e in found if e.kind == "effect").detail == "charge in fetch"
    assert "consumed" in next(e for e in found if e.kind == "input").detail
    assert [e.at for e in found[1:]] == sorted(e.at for e in found[1:])  # created: first


def test_children_cancellation_and_a_wait_that_lasts(store: Store) -> None:
    child = Workflow("kid")

    @child.step(wait_for=["go"])
    def hold(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    parent = Workflow("parent")

    @parent.step
    def spawn(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_child(child, {}, run_id="the-kid")
        return {}

    result = parent.start(store, {})
    assert result.status is RunStatus.WAITING
    spans = timeline(store, result.run_id)
    kid = next(s for s in spans if s.kind == "child")
    assert kid.label == "the-kid" and kid.end is None and "waiting" in kid.detail
    assert next(s for s in spans if s.kind == "wait").end is None  # still waiting
    assert any(e.kind == "child" and "the-kid" in e.detail
               for e in events(store, result.run_id))
    store.update_run(result.run_id, status=RunStatus.CANCELLED)
    assert events(store, result.run_id)[-1].kind == "cancelled"


def test_ctx_iterate_progress_is_visible_while_the_step_runs(store: Store) -> None:
    wf = Workflow("batch")
    seen: list[Any] = []

    @wf.step
    def process(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        it = ctx.iterate(iter(range(300)), every=100, total=300)
        for i in it:
            if i == 150:  # from another process's point of view: what the store says now
                seen.extend(progress(store, ctx.run_id))
        return {}

    wf.start(store, {})
    [loop] = seen
    assert (loop.name, loop.step, loop.done, loop.total) == ("items", "process", 100, 300)
    assert str(loop).startswith("100 / 300 (33.3%)")
    assert loop.rate is not None and loop.rate > 0


def test_checkpointer_iterate_progress_and_save_durations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'loop.db'}"
    with Checkpointer(url, "train") as ckpt:
        it = ckpt.iterate(range(1000), every=250, state=lambda: {"w": 1})
        for i in it:
            if i == 600:
                break  # a crash: the position of the last checkpoint stands
    store = pitstop.open_store(url)
    try:
        [loop] = progress(store, "train")
        assert (loop.done, loop.total, loop.step) == (500, 1000, None)
        assert str(loop).startswith("500 / 1,000 (50.0%)")
        meta = store.history("train")[0].metadata
        assert meta["duration"] >= 0 and meta["started_at"] <= time.time()
        assert [s.kind for s in timeline(store, "train")] == ["loop", "loop"]
    finally:
        store.close()


@pytest.mark.slow
def test_cli_history_durations_and_show_timeline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = pitstop.open_store(url)
    try:
        run_id = _story(store)
    finally:
        store.close()
    history = pitstop_exe("history", run_id, store=url)
    assert history.code == 0, history.err
    assert "TOOK" in history.out and "ms" in history.out
    shown = pitstop_exe("show", run_id, "--timeline", store=url)
    assert shown.code == 0, shown.err
    for text in ("timeline", "retry", "waiting for approval", "double", "events",
                 "claimed", "approval received", "progress items", "40 / 40 (100.0%)"):
        assert text in shown.out, text
    doc = pitstop_exe("show", run_id, "--timeline", "--json", store=url).json
    assert {s["kind"] for s in doc["timeline"]} >= {"step", "retry", "wait", "map"}
    assert doc["progress"][0]["done"] == 40
    plain = pitstop_exe("show", run_id, "--json", store=url).json
    assert plain["checkpoint"]["duration"] is not None
    assert plain["progress"][0]["text"].startswith("40 / 40")


def test_inspector_run_page_and_api_show_the_timeline(tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="the ui extra is not installed")
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    store = pitstop.open_store(f"sqlite:///{tmp_path / 'ui.db'}")
    try:
        run_id = _story(store)
        with TestClient(create_app(store)) as client:
            page = client.get(f"/runs/{run_id}")
            assert page.status_code == 200
            assert 'class="card timeline"' in page.text
            assert 'class="span k-retry"' in page.text and "<svg" in page.text
            assert "40 / 40 (100.0%)" in page.text
            fragment = client.get(f"/runs/{run_id}?fragment=timeline")
            assert fragment.status_code == 200 and "Timeline" in fragment.text
            doc = client.get(f"/api/runs/{run_id}/timeline").json()
            assert {s["kind"] for s in doc["spans"]} >= {"step", "retry", "wait", "map"}
            assert doc["events"][0]["kind"] == "created"
            assert doc["progress"][0]["total"] == 40
            assert client.get("/api/runs/nope/timeline").status_code == 404
    finally:
        store.close()


def test_a_checkpoint_inside_a_step_splits_its_time(store: Store) -> None:
    wf = Workflow("split")

    @wf.step
    def long(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        time.sleep(0.03)
        ctx.checkpoint(tag="half")
        time.sleep(0.03)
        return {"done": True}

    result = wf.start(store, {})
    manual, done = (next(e for e in store.history(result.run_id) if e.source == source)
                    for source in ("manual", "step"))
    # The manual checkpoint saves the step-start state; the step's own checkpoint counts
    # the time after it, not the step's whole.
    assert done.metadata["started_at"] >= manual.created_at.timestamp() - 0.001
    assert done.metadata["duration"] >= 0.03


def test_odd_metadata_never_breaks_a_timeline(store: Store) -> None:
    # Metadata is whatever a plain store user (or an old release) wrote.
    for meta in ({"source": "retry", "error": "boom", "started_at": "x"},
                 {"status": "failed", "error": ["a"], "started_at": 1.0, "duration": "y"},
                 {"status": "waiting", "waiting_for": "approval", "children": 3},
                 {"iterate": {"items": {"index": "x"}}, "source": "loop"}):
        store.save("odd", {"n": 1}, metadata=meta)
    assert timeline(store, "odd") is not None
    assert events(store, "odd")[0].kind == "created"
    progress(store, "odd")
