"""Run lists (#29): ``pitstop runs`` and the inspector's runs page show a running loop's
progress, a stream partition's records and the size warning badge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pitstop
from clitools import pitstop_exe
from pitstop import Checkpointer, Workflow, stream


def _fill(url: str) -> None:
    """A loop stopped half way (its run still running), a stream partition, a run past its
    size_warning."""
    with Checkpointer(url, "train") as ckpt:
        for i in ckpt.iterate(range(1000), every=250, state=lambda: {"w": 1}):
            if i == 600:
                break
    store = pitstop.open_store(url)
    try:
        job = stream.Job("clicks", source=stream.Iterable([(f"u{i}", i) for i in range(120)]),
                         every=50, seconds=60)

        @job.handler
        def keep(state: Any, record: stream.Record, emit: Any) -> None:
            state[record.key] = record.value

        job.run(store, idle_exit=0.1)
        big = Workflow("big", size_warning=5_000)

        @big.step
        def grow(state: dict[str, Any]) -> dict[str, Any]:
            return {"blob": bytes(range(256)) * 80}  # ~20 KiB, barely compressible

        big.start(store, {}, run_id="grown")
    finally:
        store.close()


@pytest.mark.slow
def test_pitstop_runs_shows_progress_records_and_size_warnings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lists.db'}"
    _fill(url)
    listed = pitstop_exe("runs", "--json", store=url)
    assert listed.code == 0, listed.err
    by_id = {r["id"]: r for r in listed.json["runs"]}
    assert by_id["train"]["status"] == "running"
    assert by_id["train"]["progress"].startswith("items 500 / 1,000 (50.0%)")
    assert by_id["clicks/0"]["progress"].startswith("120 records · at 119")
    assert by_id["grown"]["progress"] is None
    assert by_id["grown"]["metadata"]["size_warning"]["limit"] == 5_000
    text = pitstop_exe("runs", store=url)
    assert text.code == 0, text.err
    lines = {line.split()[0]: line for line in text.out.splitlines() if line.strip()}
    assert "items 500 / 1,000 (50.0%)" in lines["train"]
    assert "120 records" in lines["clicks/0"]
    assert "(!)" in lines["grown"] and "(!)" not in lines["train"]


def test_inspector_runs_page_shows_progress_and_the_size_badge(tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="the ui extra is not installed")
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    url = f"sqlite:///{tmp_path / 'ui.db'}"
    _fill(url)
    store = pitstop.open_store(url)
    try:
        with TestClient(create_app(store)) as client:
            page = client.get("/")
            assert page.status_code == 200
            assert "items 500 / 1,000 (50.0%)" in page.text
            assert "120 records" in page.text
            assert page.text.count('class="pill size-warning"') == 1
            runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
            assert runs["train"]["progress"].startswith("items 500 / 1,000")
            assert runs["clicks/0"]["progress"] == "120 records"
            assert runs["grown"]["progress"] is None
    finally:
        store.close()
