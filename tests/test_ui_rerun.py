"""The inspector's "Rerun from here" (#28): POST /api/runs/{id}/rerun, wf.rerun's rules."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the ui extra is not installed")

from fastapi.testclient import TestClient

import pitstop
from pitstop import CachePolicy, RunStatus
from pitstop.ui import create_app

CALLS: list[str] = []
wf = pitstop.Workflow("ui-rerun")


@wf.step
def load(state: dict[str, Any]) -> dict[str, Any]:
    CALLS.append("load")
    return {"rows": [1, 2, 3]}


@wf.step(cache=CachePolicy(inputs=["rows"], version="1"))
def total(state: dict[str, Any]) -> dict[str, Any]:
    CALLS.append("total")
    return {"sum": sum(state["rows"])}


@wf.step
def report(state: dict[str, Any]) -> dict[str, Any]:
    CALLS.append("report")
    return {"text": f"{state.get('title', 'sum')}: {state['sum']}"}


def finished(store: pitstop.Store, run_id: str) -> pitstop.Run:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        run = store.get_run(run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


@pytest.mark.slow
def test_rerun_from_a_step_with_an_edit(tmp_path: Path) -> None:
    CALLS.clear()
    store = pitstop.open_store(f"sqlite:///{tmp_path}/ui.db")
    first = wf.start(store, {"title": "sum"})
    with TestClient(create_app(store, workflows=[wf])) as client:
        made = client.post(f"/api/runs/{first.run_id}/rerun",
                           json={"from_step": "total", "updates": {"title": "total"}})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["fields"] == ["title"] and body["resumed"]
        assert made.headers["location"].endswith(f"/api/runs/{body['run_id']}")
        rerun = finished(store, body["run_id"])
        assert rerun.status is RunStatus.COMPLETED
        head = store.get(rerun.head_id)  # type: ignore[arg-type]
        assert head.state["text"] == "total: 6"
        # load not again, total from the cache, report ran.
        assert CALLS == ["load", "total", "report", "report"]
        # wf.rerun's refusals, nothing written.
        runs = len(store.runs(limit=None))
        never = client.post(f"/api/runs/{first.run_id}/rerun", json={"from_step": "nope"})
        assert never.status_code == 422 and "has no step 'nope'" in never.json()["message"]
        bad = client.post(f"/api/runs/{first.run_id}/rerun",
                          json={"from_step": "total", "updates": {"nofield": 1}})
        assert bad.status_code == 422, bad.text
        missing = client.post("/api/runs/none/rerun", json={"from_step": "total"})
        assert missing.status_code == 404
        assert len(store.runs(limit=None)) == runs
    store.close()


def test_rerun_needs_the_workflow_and_a_writable_inspector(tmp_path: Path) -> None:
    store = pitstop.open_store(f"sqlite:///{tmp_path}/ui.db")
    first = wf.start(store, {})
    with TestClient(create_app(store)) as client:
        refused = client.post(f"/api/runs/{first.run_id}/rerun", json={"from_step": "total"})
        assert refused.status_code == 409 and "--workflow" in refused.json()["message"]
    with TestClient(create_app(store, workflows=[wf], read_only=True)) as client:
        assert client.post(f"/api/runs/{first.run_id}/rerun",
                           json={"from_step": "total"}).status_code == 403
    assert len(store.runs(limit=None)) == 1
    store.close()


@pytest.mark.slow
def test_history_rows_offer_rerun_from_here(tmp_path: Path) -> None:
    store = pitstop.open_store(f"sqlite:///{tmp_path}/ui.db")
    first = wf.start(store, {})
    with TestClient(create_app(store, workflows=[wf])) as client:
        page = client.get(f"/runs/{first.run_id}").text
        assert 'data-action="rerun"' in page and 'data-step="total"' in page
    with TestClient(create_app(store)) as client:  # cannot run the workflow: no button
        assert 'data-action="rerun"' not in client.get(f"/runs/{first.run_id}").text
    store.close()


def test_schedules_page_lists_cron_timezone_pause_ticks_and_runs(tmp_path: Path) -> None:
    from pitstop.runtime.schedules import fire_due

    store = pitstop.open_store(f"sqlite:///{tmp_path}/ui.db")
    with TestClient(create_app(store)) as client:
        assert "No schedules" in client.get("/schedules").text
    wf.schedule(store, "nightly", cron="0 2 * * *", timezone="Europe/Berlin")
    wf.schedule(store, "minutely", cron="* * * * *", catchup="all")
    first = store.schedule_rows(name="minutely")[0].next_tick
    started = fire_due(store, {wf.name: wf}, now=first + 1)
    store.schedule_pause("minutely", True)
    with TestClient(create_app(store)) as client:
        page = client.get("/schedules")
        assert page.status_code == 200
        text = page.text
        assert "0 2 * * *" in text and "Europe/Berlin" in text and "02:00 CE" in text
        assert "paused" in text and started and started[0] in text
    store.close()
