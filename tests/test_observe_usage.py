"""Byte accounting (#29): ``pitstop du`` by run, field and step, and ``stats`` counting every
kind of record, on every backend."""

from __future__ import annotations

from typing import Any

import pytest

import pitstop
from clitools import pitstop_exe
from pitstop import Store, Workflow
from pitstop.observe.usage import fields_usage, growth, runs_usage, steps_usage


def _fill(store: Store) -> tuple[str, str]:
    """Two runs: one grows a big field step by step and records effects; the other is a
    fork of it (so it shares the values it did not change)."""
    wf = Workflow("grow")

    @wf.step
    def add(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        n = state.get("n", 0) + 1
        ctx.effect("note", lambda: "x" * 500)
        return pitstop.goto("add" if n < 5 else "finish",
                            {"n": n, "blob": bytes(range(256)) * 40 * n, "tag": "same"})

    @wf.step(checkpoint=True)
    def finish(state: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    big = wf.start(store, {})
    store.fork(big.checkpoint_id, new_run_id="forked")
    return big.run_id, "forked"


def test_runs_usage_counts_records_new_shared_effects(store: Store) -> None:
    big, forked = _fill(store)
    usages = {u.run_id: u for u in runs_usage(store)}
    grown, fork = usages[big], usages[forked]
    assert grown.checkpoints == store.get_run(big).checkpoints
    assert grown.effects >= 5 * 500 and grown.inputs == 0
    # The blob field's versions (10, 20 ... 50 KiB before compression) are the run's own.
    assert grown.new > 0 and grown.records > 0
    assert grown.total == grown.records + grown.new + grown.effects + grown.inputs
    assert fork.new == 0 and fork.shared > 0  # the fork stored nothing of its own
    assert fork.head_size == grown.head_size
    assert runs_usage(store)[0].run_id == big  # largest first
    assert [u.run_id for u in runs_usage(store, [forked])] == [forked]
    assert runs_usage(store, [forked])[0].head_size == fork.head_size > 0
    # The runs kept by a limit: the same figures, their head sizes read by key.
    assert runs_usage(store, limit=1) == [grown]


def test_fields_and_steps_usage(store: Store) -> None:
    big, _ = _fill(store)
    fields = {g.name: g for g in fields_usage(store, big)}
    assert fields["blob"].versions == 5 and fields["tag"].versions == 1
    assert fields["blob"].written >= fields["blob"].largest > fields["tag"].written
    assert fields["tag"].referenced == fields["tag"].checkpoints * fields["tag"].written
    assert fields["blob"].head == fields["blob"].largest
    assert fields_usage(store)[0].name == "blob"  # store-wide too
    steps = {g.name: g for g in steps_usage(store, big)}
    assert steps["add"].checkpoints >= 1 and steps["add"].written > 0
    assert steps["add"].seconds >= 0
    newest = growth(store, big, limit=2)
    assert len(newest) == 2 and newest[0]["created_at"] >= newest[1]["created_at"]


def test_stats_count_every_kind_of_record(store: Store) -> None:
    _fill(store)
    st = store.stats()
    assert st.effects >= 5 and st.effect_bytes >= 5 * 500
    assert st.inputs == 0 and st.input_bytes == 0
    assert st.all_bytes == st.bytes + st.effect_bytes + st.input_bytes + st.attached_bytes
    bounded = store.stats(exact=False)
    assert bounded.effects == st.effects  # small tables are counted exactly either way


@pytest.mark.slow
def test_du_cli(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'du.db'}"
    store = pitstop.open_store(url)
    try:
        big, forked = _fill(store)
    finally:
        store.close()
    listing = pitstop_exe("du", store=url)
    assert listing.code == 0, listing.err
    assert "largest runs" in listing.out and big in listing.out and forked in listing.out
    doc = pitstop_exe("du", "--json", store=url).json
    assert doc["by"] == "run" and doc["runs"][0]["run_id"] == big
    one = pitstop_exe("du", big, store=url)
    assert one.code == 0 and "steps of run" in one.out and "growth per checkpoint" in one.out
    fields = pitstop_exe("du", big, "--by", "field", "--json", store=url).json
    assert fields["fields"][0]["name"] == "blob" and fields["growth"]
    wide = pitstop_exe("du", "--by", "field", store=url)
    assert wide.code == 0 and "blob" in wide.out
    refused = pitstop_exe("du", "--by", "step", store=url)
    assert refused.code == 2 and "needs a RUN" in refused.err
    stats = pitstop_exe("stats", "--json", store=url).json
    assert stats["effects"] >= 5 and stats["all_bytes"] > stats["bytes"]


@pytest.mark.slow
def test_size_warning_logs_counts_and_marks_the_run(store: Store, caplog: Any) -> None:
    import logging

    from pitstop.observe import metrics

    wf = Workflow("big", size_warning=20_000)

    @wf.step
    def grow(state: dict[str, Any]) -> dict[str, Any]:
        return {"blob": bytes(range(256)) * 200, "small": 1}  # ~51 KiB, incompressible-ish

    @wf.step
    def again(state: dict[str, Any]) -> dict[str, Any]:
        return {"small": 2}

    counting = metrics.enable()
    labels = {"workflow": "big", "kind": "checkpoint"}
    before = counting.registry.get_sample_value("pitstop_size_warnings_total", labels) or 0
    with caplog.at_level(logging.WARNING, logger="pitstop.runtime"):
        result = wf.start(store, {})
    warnings = [r for r in caplog.records if "size_warning" in r.getMessage()]
    assert len(warnings) == 1  # once an execution, not at every checkpoint
    assert "blob=" in warnings[0].getMessage()
    mark = store.get_run(result.run_id).metadata["size_warning"]
    assert mark["limit"] == 20_000 and mark["bytes"] >= 20_000 and mark["over"] == ["blob"]
    assert counting.registry.get_sample_value("pitstop_size_warnings_total",
                                              labels) == before + 1

    # The store's threshold applies when the workflow sets none.
    quiet = Workflow("quiet")

    @quiet.step
    def small(state: dict[str, Any]) -> dict[str, Any]:
        return {"blob": bytes(range(256)) * 200}

    store.size_warning = 10 * 2**20
    assert "size_warning" not in store.get_run(quiet.start(store, {}).run_id).metadata
    store.size_warning = 1_000
    flagged = quiet.start(store, {})
    assert store.get_run(flagged.run_id).metadata["size_warning"]["limit"] == 1_000

    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    store.size_warning = None
    with TestClient(create_app(store)) as client:
        assert "size warning: 50.0 KiB" in client.get(f"/runs/{result.run_id}").text
        unmarked = quiet.start(store, {}).run_id
        assert "size warning:" not in client.get(f"/runs/{unmarked}").text


@pytest.mark.slow
def test_prune_reports_the_effects_and_inputs_it_removes(store: Store) -> None:
    big, forked = _fill(store)
    effects_before = store.stats().effects
    report = store.prune(pitstop.RetentionPolicy(keep_last=1), run_id=big, dry_run=True)
    assert report.checkpoints and report.effects >= 1 and report.effect_bytes >= 500
    assert store.stats().effects == effects_before  # a dry run removes nothing
    done = store.prune(pitstop.RetentionPolicy(keep_last=1), run_id=big)
    assert (done.effects, done.effect_bytes) == (report.effects, report.effect_bytes)
    assert store.stats().effects == effects_before - done.effects
    gone = store.delete_run(forked)
    assert gone.inputs == 0 and gone.runs == [forked]


def test_checkpointer_size_warning(store: Store, caplog: Any) -> None:
    import logging
    import os

    with caplog.at_level(logging.WARNING, logger="pitstop.runtime"), \
            pitstop.Checkpointer(store, "loop", size_warning=5_000) as ckpt:
        ckpt.save({"w": b"x" * 100})
        ckpt.save({"w": os.urandom(10_000)})  # incompressible: stored at its size
        ckpt.save({"w": os.urandom(11_000)})
    assert sum("size_warning" in r.getMessage() for r in caplog.records) == 1
    assert store.get_run("loop").metadata["size_warning"]["over"] == ["w"]
