"""The store contract, run against every backend (SQLite file, memory, PostgreSQL)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import pitstop
from pitstop import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    InputError,
    LeaseLostError,
    RetentionPolicy,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    RunStatus,
    SerializationError,
    Store,
)
from pitstop.store import Lease, PreparedSave, SaveRequest

MiB = 1 << 20


class Exploding:
    """Serialising this fails: it proves a field was (or was not) serialised."""


# -- saving and loading -------------------------------------------------------------------------


def test_save_latest_get_round_trip(store: Store) -> None:
    state = {"messages": ["hi", {"role": "tool", "n": 3}], "count": 1, "when": datetime.now(UTC)}
    first = store.save("r1", state, metadata={"source": "step", "tags": ["start"]})
    assert first.step == 0 and first.parent_id is None and first.run_id == "r1"
    assert first.state == state

    second = store.save("r1", {**state, "count": 2})
    assert second.parent_id == first.id and second.step == 1
    assert second.id > first.id

    latest = store.latest("r1")
    assert latest is not None and latest.id == second.id and latest.state["count"] == 2
    again = store.get(first.id)
    assert again.state == state
    assert again.metadata == {"source": "step", "tags": ["start"]}
    assert again.checksum == first.checksum
    assert store.latest("no-such-run") is None
    with pytest.raises(CheckpointNotFoundError):
        store.get("no-such-checkpoint")


def test_run_record_follows_saves(store: Store) -> None:
    store.save("r", {"a": 1}, workflow="wf", metadata={"waiting_for": ["approval"]},
               status=RunStatus.WAITING)
    run = store.get_run("r")
    assert run.workflow == "wf" and run.status is RunStatus.WAITING
    assert run.waiting_for == ("approval",) and run.checkpoints == 1 and run.step == 0
    ckpt = store.save("r", {"a": 2}, status=RunStatus.COMPLETED)
    run = store.get_run("r")
    assert run.head_id == ckpt.id and run.waiting_for == () and run.status is RunStatus.COMPLETED
    assert run.checkpoints == 2 and run.bytes > 0
    with pytest.raises(RunNotFoundError):
        store.get_run("nope")


def test_explicit_parent_makes_a_branch_nothing_overwritten(store: Store) -> None:
    a = store.save("r", {"x": 1})
    b = store.save("r", {"x": 2})
    branch = store.save("r", {"x": 20}, parent_id=a.id)
    assert branch.parent_id == a.id and branch.step == 1
    assert store.latest("r").id == branch.id  # type: ignore[union-attr]
    assert store.get(b.id).state == {"x": 2}  # the other branch is intact
    assert [s.id for s in store.history("r")] == [branch.id, b.id, a.id]


def test_history_is_paginated_newest_first_without_state(store: Store) -> None:
    ids = [store.save("r", {"i": i}).id for i in range(25)]
    page1 = store.history("r", limit=10)
    page2 = store.history("r", limit=10, before=page1[-1].id)
    page3 = store.history("r", limit=10, before=page2[-1].id)
    got = [s.id for s in page1 + page2 + page3]
    assert got == ids[::-1]
    assert not hasattr(page1[0], "state")
    assert page1[0].size > 0 and page1[0].step == 24
    with pytest.raises(RunNotFoundError):
        store.history("missing")


@pytest.mark.slow
def test_summaries_reads_many_records_by_id_skipping_unknown_ones(store: Store) -> None:
    a = store.save("a", {"i": 1}, metadata={"step_name": "one"})
    b = store.save("b", {"i": 2})
    many = [store.save("c", {"i": i}).id for i in range(600)]  # more than one batch
    found = store.summaries([b.id, "no-such-checkpoint", a.id, b.id])
    assert list(found) == [b.id, a.id]  # in the order asked, once each
    assert found[a.id] == store.summary(a.id)
    assert found[a.id].metadata["step_name"] == "one" and not hasattr(found[a.id], "state")
    assert list(store.summaries(many)) == many
    assert store.summaries([]) == {}


@pytest.mark.slow
def test_get_many_reads_many_checkpoints_by_id_as_get_does(store: Store) -> None:
    import numpy as np

    big = np.arange(300_000, dtype=np.int64)  # chunked: a tree of stored values
    a = store.save("a", {"doc": "x" * 10_000, "arr": big, "i": 1})
    b = store.save("b", {"i": 2, "text": "y" * 5_000})
    many = [store.save("c", {"i": i}).id for i in range(600)]  # more than one batch
    found = store.get_many([b.id, "no-such-checkpoint", a.id, b.id])
    assert list(found) == [b.id, a.id]  # in the order asked, once each
    assert found[a.id].state["doc"] == "x" * 10_000 and found[a.id].state["i"] == 1
    assert np.array_equal(found[a.id].state["arr"], big)
    assert dict(found[b.id].state) == dict(store.get(b.id).state)
    assert found[b.id].metadata == store.get(b.id).metadata
    assert [c.state["i"] for c in store.get_many(many).values()] == list(range(600))
    assert store.get_many([]) == {}


def test_unchanged_values_are_stored_once(store: Store) -> None:
    big = "x" * MiB
    for i in range(20):
        store.save("r", {"doc": big, "note": f"note number {i} " * 4, "i": i})
    stats = store.stats()
    # one 1 MiB document + 20 distinct notes; the tiny `i` values live inside the records
    assert stats.blobs == 21
    assert stats.bytes < 2 * MiB  # compressed or not, stored once


def test_unhinted_saves_recognise_unchanged_fields_by_their_bytes(store: Store) -> None:
    # Mid-size values (above the inline limit, below the remembered-bytes limit), saved
    # without a `changed` hint: equal bytes reuse the parent's value, others are stored.
    a, b = {"k": ["alpha"] * 20}, {"k": ["beta"] * 20}
    states = [
        {"doc": a, "other": "o" * 100, "i": 0},
        {"doc": a, "other": "o" * 100, "i": 1},  # unchanged doc and other
        {"doc": b, "other": "o" * 100, "i": 2},  # doc changed
        {"doc": a, "other": "p" * 100, "i": 3},  # doc back to its first bytes, other changed
    ]
    saved = [store.save("r", state) for state in states]
    saved.append(store.save("r", states[3], changed=["i"]))  # hinted, then unhinted again
    saved.append(store.save("r", {**states[3], "i": 5}))
    assert [store.get(c.id).state for c in saved] == [*states, states[3], {**states[3], "i": 5}]
    assert store.stats().blobs == 4  # a, b, "o"*100, "p"*100: each once


def test_small_values_live_in_the_record_and_are_verified(store: Store) -> None:
    first = store.save("r", {"n": 1, "flag": True, "label": "short"})
    store.save("r", {"n": 2, "flag": True, "label": "short"})
    assert store.stats().blobs == 0
    assert store.get(first.id).state == {"n": 1, "flag": True, "label": "short"}

    def edit(tx: Any) -> None:  # flip the inline value's bytes inside the record
        fields = bytes(tx.one("SELECT fields FROM pitstop_checkpoints WHERE id = ?",
                              (first.id,))[0])
        tx.run("UPDATE pitstop_checkpoints SET fields = ? WHERE id = ?",
               (fields.replace(b"short", b"shirt"), first.id))

    store._tx(edit, write=True)  # type: ignore[attr-defined]
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        store.get(first.id)


def test_changed_hint_skips_serialising_other_fields(store: Store) -> None:
    store.save("r", {"a": 1, "b": [1, 2, 3]})
    # `b` holds something unserialisable; it is not serialised because `changed` says so.
    ckpt = store.save("r", {"a": 2, "b": Exploding()}, changed=["a"])
    assert store.get(ckpt.id).state == {"a": 2, "b": [1, 2, 3]}
    with pytest.raises(SerializationError):
        store.save("r", {"a": 3, "b": Exploding()})


class _RefusingSerializer(pitstop.MsgpackSerializer):
    """Fails on two values as a user's serialiser might: by raising its own error (named
    as the field) or a SerializationError of its own (its path kept under the field)."""

    def dumps(self, value: object) -> bytes:
        if value == 13 or value == [13]:
            raise RuntimeError("unlucky")
        if value == "secret":
            raise SerializationError("not this text", path="[0]")
        return super().dumps(value)


@pytest.mark.parametrize(
    ("state", "path", "message"),
    [({"i": 13}, "state.i", "RuntimeError: unlucky"),
     ({"note": "secret"}, "state.note[0]", "not this text"),
     ({"items": [13]}, "state.items", "RuntimeError: unlucky")],
)
def test_a_serializer_failing_on_a_field_is_named_and_nothing_written(
    open_store: Callable[..., Store], state: dict[str, Any], path: str, message: str
) -> None:
    # Scalars and lists are serialised without the codec's per-field wrapper (a save's
    # hot path): the error still names the run and the field, and the head stays.
    store = open_store(serializer=_RefusingSerializer())
    first = store.save("r", {"i": 1, "note": "ok", "items": [1]})
    with pytest.raises(SerializationError) as info:
        store.save("r", {"i": 2, "note": "fine", "items": [2], **state})
    assert info.value.run_id == "r"
    assert info.value.path == path
    assert message in str(info.value)
    assert store.latest("r").id == first.id  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "path", "message"),
    [(13, "effect['k']", "RuntimeError: unlucky"),
     ("secret", "effect['k'][0]", "not this text")],
)
def test_a_serializer_failing_on_a_record_names_its_key(
    open_store: Callable[..., Store], value: Any, path: str, message: str
) -> None:
    # A record's place is named only once it failed (not formatted for every record).
    store = open_store(serializer=_RefusingSerializer())
    saved = store.save("r", {"i": 1})
    for record in (lambda: store.record_effects("r", {"k": value}),
                   lambda: store.attach("r", saved.id, {"k": value})):
        with pytest.raises(SerializationError) as info:
            record()
        assert info.value.run_id == "r"
        assert info.value.path == path
        assert message in str(info.value)
        if value == 13:  # the serializer's own error stays the cause
            assert isinstance(info.value.__cause__, RuntimeError)
    assert store.effects("r") == {}
    assert store.attachments("r", saved.id) == {}


def test_fields_can_be_added_and_removed(store: Store) -> None:
    store.save("r", {"a": 1, "b": 2})
    store.save("r", {"a": 1, "c": 3}, changed=["c"])
    assert store.latest("r").state == {"a": 1, "c": 3}  # type: ignore[union-attr]


def test_serialization_error_names_run_and_path_and_writes_nothing(store: Store) -> None:
    good = store.save("r", {"messages": []})
    before = store.stats()
    bad = {"messages": [{"role": "user"}, {"role": "tool"}, {"x": 1}, {"tool": Exploding()}]}
    with pytest.raises(SerializationError) as info:
        store.save("r", bad)
    err = info.value
    assert err.run_id == "r"
    assert err.path == "state.messages[3].tool"
    assert err.type_name is not None and "Exploding" in err.type_name
    assert "state.messages[3].tool" in str(err) and "'r'" in str(err)
    assert store.latest("r").id == good.id  # type: ignore[union-attr]
    after = store.stats()
    assert (after.checkpoints, after.blobs, after.bytes) == (
        before.checkpoints, before.blobs, before.bytes,
    )


def test_metadata_must_be_json(store: Store) -> None:
    with pytest.raises(SerializationError) as info:
        store.save("r", {"a": 1}, metadata={"ok": 1, "when": datetime.now(UTC)})
    assert info.value.path == "metadata.when"
    for bad in (float("nan"), float("inf")):  # JSON has no such numbers: refused, not nulled
        with pytest.raises(SerializationError) as info:
            store.save("r", {"a": 1}, metadata={"score": [1.5, bad]})
        assert info.value.path == "metadata.score"
    assert store.latest("r") is None
    meta = {"none": None, "nested": {"x": [1, None, "null"]}, 7: "int key", "big": 2**70}
    saved = store.save("r", {"a": 1}, metadata=meta)
    expected = {"none": None, "nested": {"x": [1, None, "null"]}, "7": "int key", "big": 2**70}
    assert saved.metadata == expected  # as the json module would store it
    assert store.get(saved.id).metadata == expected


def test_state_must_be_a_mapping(store: Store) -> None:
    with pytest.raises(TypeError, match="mapping"):
        store.save("r", [1, 2])  # type: ignore[arg-type]


def test_expected_head_rejects_a_second_writer(store: Store) -> None:
    first = store.save("r", {"a": 1})
    store.save("r", {"a": 2}, parent_id=first.id, expected_head=first.id)
    with pytest.raises(ConflictError) as info:
        store.save("r", {"a": 3}, parent_id=first.id, expected_head=first.id)
    assert info.value.run_id == "r" and info.value.expected == first.id
    assert len(store.history("r")) == 2
    with pytest.raises(ConflictError):
        store.save("new", {"a": 1}, expected_head="something")
    store.save("new", {"a": 1}, expected_head=None)


def test_start_run_writes_the_run_and_its_first_checkpoint_together(store: Store) -> None:
    def first(run_id: str, status: RunStatus = RunStatus.RUNNING) -> PreparedSave:
        return store.prepare(run_id, {"x": 1}, step=0, workflow="wf", status=status,
                             expected_head=None)

    ckpt, lease = store.start_run(first("a"), metadata={"k": "v"}, priority=3, owner="me",
                                  ttl=60)
    run = store.get_run("a")
    assert run.head_id == ckpt.id and run.checkpoints == 1 and run.metadata == {"k": "v"}
    assert run.priority == 3 and run.workflow == "wf" and run.owner == "me"
    assert lease is not None and lease.token == 1 and lease.workflow == "wf"
    with pytest.raises(RunBusyError):  # born leased: nobody else writes meanwhile
        store.acquire("a", "other")
    store.save("a", {"x": 2}, lease=lease, release=True, status=RunStatus.COMPLETED)
    assert store.latest("a").state == {"x": 2}
    with pytest.raises(RunExistsError):
        store.start_run(first("a"))
    store.create_run("registered", workflow="wf", status=RunStatus.WAITING)  # no input: refused
    with pytest.raises(RunExistsError):
        store.start_run(first("registered"))
    assert store.get_run("registered").head_id is None
    _, none = store.start_run(first("q", RunStatus.QUEUED))
    assert none is None and store.get_run("q").status is RunStatus.QUEUED
    assert [c.run_id for c in store.claim("w", workflows=["wf"])] == ["q"]
    with pytest.raises(ValueError, match="expected_head=None"):
        store.start_run(store.prepare("b", {"x": 1}))


# -- forks ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fork_shares_values_and_leaves_source_untouched(store: Store) -> None:
    big = "y" * MiB
    store.save("src", {"doc": big, "n": 1}, workflow="wf")
    mid = store.save("src", {"doc": big, "n": 2})
    store.save("src", {"doc": big, "n": 3})
    blobs = store.stats().blobs

    fork = store.fork(mid.id, new_run_id="copy", update={"n": "edited " * 10})
    assert fork.run_id == "copy" and fork.parent_id == mid.id
    assert fork.state == {"doc": big, "n": "edited " * 10}
    assert fork.metadata["source"] == "fork"
    assert fork.metadata["forked_from"] == {"run_id": "src", "checkpoint_id": mid.id}
    assert store.get_run("copy").workflow == "wf"
    assert store.stats().blobs == blobs + 1  # only the edited value is new
    assert store.latest("src").state["n"] == 3  # type: ignore[union-attr]
    # the fork survives its source being deleted
    store.delete_run("src")
    assert store.latest("copy").state == {"doc": big, "n": "edited " * 10}  # type: ignore[union-attr]


def test_fork_generates_a_run_id(store: Store) -> None:
    ckpt = store.save("src", {"a": 1})
    fork = store.fork(ckpt.id)
    assert fork.run_id != "src"
    with pytest.raises(RunExistsError):
        store.fork(ckpt.id, new_run_id="src")


# -- runs -----------------------------------------------------------------------------------------


def test_runs_filters(store: Store) -> None:
    store.create_run("q1", workflow="billing", status=RunStatus.QUEUED,
                     metadata={"customer": "acme", "tier": 2})
    time.sleep(0.01)
    cut = datetime.now(UTC)
    time.sleep(0.01)
    store.save("a", {"x": 1}, workflow="billing", status=RunStatus.COMPLETED)
    store.save("b", {"x": 1}, workflow="support", status=RunStatus.WAITING)
    store.update_run("b", metadata={"customer": "acme", "vip": True})

    assert [r.id for r in store.runs()] == ["b", "a", "q1"]
    assert [r.id for r in store.runs(status="queued")] == ["q1"]
    assert {r.id for r in store.runs(status=[RunStatus.COMPLETED, RunStatus.WAITING])} == {"a", "b"}
    assert [r.id for r in store.runs(workflow="billing")] == ["a", "q1"]
    assert [r.id for r in store.runs(since=cut)] == ["b", "a"]
    assert [r.id for r in store.runs(until=cut)] == ["q1"]
    assert {r.id for r in store.runs(metadata={"customer": "acme"})} == {"q1", "b"}
    assert [r.id for r in store.runs(metadata={"tier": 2})] == ["q1"]
    assert [r.id for r in store.runs(metadata={"vip": True})] == ["b"]
    assert [r.id for r in store.runs(limit=1, offset=1)] == ["a"]
    with pytest.raises(RunExistsError):
        store.create_run("q1")
    assert store.create_run("q1", exist_ok=True).status is RunStatus.QUEUED


def test_runs_by_id_prefix_keyset_pages_and_counts(store: Store) -> None:
    # Ten runs, created in one burst: some share a creation time, so the keyset must break
    # ties by id, and every run must appear exactly once across the pages.
    for i in range(10):
        store.create_run(f"job-{i:02d}", workflow="w" if i % 2 else "v",
                         status=RunStatus.QUEUED if i < 4 else RunStatus.COMPLETED)
    store.create_run("other-1", status=RunStatus.WAITING)
    newest_first = [r.id for r in store.runs(limit=None)]
    seen: list[str] = []
    before = None
    while True:
        page = store.runs(limit=3, before=before)
        if not page:
            break
        seen.extend(r.id for r in page)
        before = page[-1].id
    assert seen == newest_first
    assert len(set(seen)) == 11
    assert {r.id for r in store.runs(id_prefix="job-0", limit=None)} == {
        f"job-{i:02d}" for i in range(10)}
    assert [r.id for r in store.runs(id_prefix="other")] == ["other-1"]
    assert store.runs(id_prefix="%") == []  # not a pattern
    assert store.runs(before="no-such-run") == []
    assert store.count_runs() == {"queued": 4, "completed": 6, "waiting": 1}
    assert store.count_runs(workflow="w") == {"queued": 2, "completed": 3}
    assert store.count_runs(id_prefix="other", status="waiting") == {"waiting": 1}
    assert store.count_runs(status="failed") == {}
    # statuses alone are counted per status through the index; repeats and [] as ever
    assert store.count_runs(status=["waiting", "queued", "waiting"]) == {"waiting": 1,
                                                                        "queued": 4}
    assert store.count_runs(status=[], workflow="v") == {"queued": 2, "completed": 3}
    assert asyncio.run(store.aio.count_runs(id_prefix="job")) == {"queued": 4, "completed": 6}


def test_update_run_merges_metadata(store: Store) -> None:
    store.create_run("r", metadata={"a": 1})
    run = store.update_run("r", status=RunStatus.FAILED, metadata={"b": 2})
    assert run.status is RunStatus.FAILED and run.metadata == {"a": 1, "b": 2}
    with pytest.raises(RunNotFoundError):
        store.update_run("nope", status=RunStatus.FAILED)


@pytest.mark.slow
def test_delete_run_frees_only_unshared_values(store: Store) -> None:
    shared = "s" * 10_000
    store.save("keep", {"v": shared, "k": 1})
    store.save("drop", {"v": shared, "d": "only-here " * 8})
    store.save("drop", {"v": shared, "d": "only-here-too " * 8})
    report = store.delete_run("drop")
    assert report.runs == ["drop"] and len(report.checkpoints) == 2
    assert report.blobs == 2 and report.bytes_reclaimed > 0
    assert store.latest("keep").state["v"] == shared  # type: ignore[union-attr]
    assert store.stats().blobs == 1  # the shared value; `k` is inline
    with pytest.raises(RunNotFoundError):
        store.delete_run("drop")
    assert store.verify() == []


# -- retention ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_prune_keep_last_keeps_head_and_milestones(store: Store) -> None:
    ids = []
    for i in range(10):
        tags = ["milestone"] if i == 2 else []
        ids.append(store.save("r", {"i": i, "big": "b" * 5000 + str(i)},
                              metadata={"tags": tags}).id)
    # resume from an old checkpoint: the head is now old-ish, on its own branch
    head = store.save("r", {"i": 100, "big": "head " * 20}, parent_id=ids[0])
    dry = store.prune(RetentionPolicy(keep_last=3), dry_run=True)
    assert dry.dry_run and store.stats().checkpoints == 11  # nothing deleted
    report = store.prune(RetentionPolicy(keep_last=3))
    assert sorted(report.checkpoints) == sorted(dry.checkpoints)
    assert report.bytes_reclaimed == dry.bytes_reclaimed > 0
    kept = {s.id for s in store.history("r", limit=None)}
    assert kept == {head.id, ids[9], ids[8], ids[2]}
    assert store.latest("r").id == head.id  # type: ignore[union-attr]
    assert store.get(ids[2]).state["i"] == 2
    assert store.get_run("r").checkpoints == 4
    assert store.verify() == []
    # without milestones
    store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
    assert {s.id for s in store.history("r", limit=None)} == {head.id}
    assert store.stats().blobs == 1  # the head's one stored value (`i` is inline)


def test_prune_bytes_reclaimed_matches_stats(store: Store) -> None:
    for i in range(6):
        store.save("r", {"payload": f"{i}" * 20_000})
    before = store.stats().bytes
    report = store.prune(RetentionPolicy(keep_last=2))
    after = store.stats().bytes
    assert before - after == report.bytes_reclaimed


def test_prune_finished_runs_older_than(store: Store) -> None:
    """Only runs that finished before ``now - finished_older_than`` go. The cutoff is taken
    when prune starts, so the age is set just under the older runs' age: the newer run is
    kept if prune starts within ``gap`` of that. A late start (a loaded machine) that caught
    the newer run too is recognised by the clock and repeated with a wider gap; any other
    outcome fails."""
    for gap in (0.05, 0.3, 1.5, 5.0):
        store.save("old-done", {"a": "one " * 20}, status=RunStatus.COMPLETED)
        store.save("old-waiting", {"a": "two " * 20}, status=RunStatus.WAITING)
        time.sleep(gap)
        store.save("new-done", {"a": "three " * 20}, status=RunStatus.COMPLETED)
        old = store.get_run("old-done").updated_at.timestamp()
        new = store.get_run("new-done").updated_at.timestamp()
        before = time.time()
        age = before - old - 0.001  # old-done is older than this whenever prune starts
        report = store.prune(RetentionPolicy(finished_older_than=timedelta(seconds=age)))
        late = time.time() - age >= new  # prune may have started after new-done aged out
        if late and sorted(report.runs) == ["new-done", "old-done"]:
            for run in store.runs():
                store.delete_run(run.id)
            continue
        assert report.runs == ["old-done"]
        assert {r.id for r in store.runs()} == {"old-waiting", "new-done"}
        assert store.stats().blobs == 2
        return
    pytest.fail("prune never started within 5 s of being called")


def test_prune_effects_of_pruned_checkpoints(store: Store) -> None:
    first = store.save("r", {"i": 0})
    store.record_effect("r", "charge", {"ok": True}, checkpoint_id=first.id)
    for i in range(3):
        store.save("r", {"i": i + 1})
    store.prune(RetentionPolicy(keep_last=1))
    assert store.get_effect("r", "charge") == (False, None)


def test_retention_policy_validates() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        RetentionPolicy(keep_last=0)


# -- integrity ------------------------------------------------------------------------------------


def _corrupt_blob(store: Store, checkpoint_id: str, field: str) -> None:
    """Flip bytes of a stored value behind the store's back (through its own connection)."""
    from pitstop.store.encoding.records import decode_field_map

    def edit(tx: Any) -> None:
        fields = tx.one("SELECT fields FROM pitstop_checkpoints WHERE id = ?", (checkpoint_id,))[0]
        ref = decode_field_map(bytes(fields))[field]
        data = bytes(tx.one("SELECT data FROM pitstop_blobs WHERE hash = ?", (ref.hash,))[0])
        bad = data[:-3] + bytes(b ^ 0xFF for b in data[-3:])
        tx.run("UPDATE pitstop_blobs SET data = ? WHERE hash = ?", (bad, ref.hash))

    store._tx(edit, write=True)  # type: ignore[attr-defined]
    store._fields._data.clear()  # type: ignore[attr-defined]


def _corrupt_record(store: Store, checkpoint_id: str) -> None:
    store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.run("UPDATE pitstop_checkpoints SET step = step + 7 WHERE id = ?",
                          (checkpoint_id,)),
        write=True,
    )


def test_corrupt_value_is_detected_and_named(store: Store) -> None:
    good = store.save("r", {"a": "fine", "b": 1})
    bad = store.save("r", {"a": "will rot " * 10, "b": 2})
    _corrupt_blob(store, bad.id, "a")
    with pytest.raises(CorruptCheckpointError) as info:
        store.latest("r")
    assert info.value.checkpoint_id == bad.id and info.value.field == "a"
    assert info.value.run_id == "r"
    fallen = store.latest("r", fallback=True)
    assert fallen is not None and fallen.id == good.id
    assert len(fallen.skipped) == 1 and bad.id in fallen.skipped[0]
    problems = store.verify()
    assert len(problems) == 1 and problems[0].kind == "blob"
    assert bad.id in problems[0].message and problems[0].run_id == "r"


def test_corrupt_record_is_detected(store: Store) -> None:
    good = store.save("r", {"a": 1})
    bad = store.save("r", {"a": 2})
    _corrupt_record(store, bad.id)
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        store.get(bad.id)
    assert store.latest("r", fallback=True).id == good.id  # type: ignore[union-attr]
    assert [(p.kind, p.id) for p in store.verify()] == [("checkpoint", bad.id)]


def test_fallback_with_nothing_valid_raises(store: Store) -> None:
    only = store.save("r", {"a": 1})
    _corrupt_record(store, only.id)
    with pytest.raises(CorruptCheckpointError):
        store.latest("r", fallback=True)


# -- leases ---------------------------------------------------------------------------------------


def test_lease_excludes_others_until_it_expires(store: Store) -> None:
    store.create_run("r")
    lease = store.acquire("r", "w1", ttl=30)
    with pytest.raises(RunBusyError) as info:
        store.acquire("r", "w2")
    assert info.value.owner == "w1"
    assert store.acquire("r", "w1").token == lease.token  # re-entrant for the same owner
    store.save("r", {"a": 1}, lease=lease)
    with pytest.raises(RunBusyError):
        store.save("r", {"a": 2})  # no lease while another owner holds one
    store.release(lease)
    store.save("r", {"a": 2})


def test_expired_lease_is_taken_over_and_the_old_owner_is_fenced(store: Store) -> None:
    store.create_run("r")
    old = store.acquire("r", "w1", ttl=0.05)
    time.sleep(0.1)
    new = store.acquire("r", "w2", ttl=30)
    assert new.token > old.token
    with pytest.raises(LeaseLostError) as info:
        store.save("r", {"a": "stale"}, lease=old)
    assert info.value.token == old.token and info.value.current_token == new.token
    with pytest.raises(LeaseLostError):
        store.renew(old)
    store.release(old)  # a no-op: does not release the new owner's lease
    assert store.get_run("r").owner == "w2"
    store.save("r", {"a": "fresh"}, lease=new)
    assert store.latest("r").state == {"a": "fresh"}  # type: ignore[union-attr]
    assert store.renew(new, ttl=60).expires_at > new.expires_at


def test_a_save_can_release_its_lease(store: Store) -> None:
    store.create_run("r")
    lease = store.acquire("r", "w1", ttl=30)
    store.save("r", {"a": 1}, lease=lease, status=RunStatus.WAITING,
               metadata={"waiting_for": ["ok"]}, release=True)
    run = store.get_run("r")
    assert run.owner is None and run.lease_expires_at is None
    assert run.status is RunStatus.WAITING and run.waiting_for == ("ok",)
    taken = store.acquire("r", "w2")  # free at once, not after the TTL
    assert taken.token > lease.token
    with pytest.raises(LeaseLostError):  # the released lease fences nothing any more
        store.save("r", {"a": 2}, lease=lease, release=True)
    assert store.get_run("r").owner == "w2"
    store.release(lease)  # a no-op for the new owner
    assert store.get_run("r").owner == "w2"


def test_latest_with_run_reads_both(store: Store) -> None:
    with pytest.raises(RunNotFoundError):
        store.latest_with_run("nope")
    store.create_run("empty", workflow="wf")
    run, head = store.latest_with_run("empty")
    assert run.id == "empty" and run.workflow == "wf" and head is None
    first = store.save("r", {"a": 1, "big": "x" * 500}, workflow="wf")
    second = store.save("r", {"a": 2, "big": "x" * 500})
    store.save("r", {"a": 3}, parent_id=first.id)  # a branch: the new head
    run, head = store.latest_with_run("r")
    assert head is not None and run.head_id == head.id != second.id
    assert head.state == {"a": 3} and head.parent_id == first.id
    assert (run, head.state) == (store.get_run("r"), store.latest("r").state)  # type: ignore[union-attr]
    store.save("r", {"a": 4, "big": "y" * 500})  # a head with a separately stored value
    run, head = store.latest_with_run("r")
    assert head is not None and head.state == {"a": 4, "big": "y" * 500}
    assert run.head_id == head.id and run.step == head.step


def test_cancel_fences_the_owner(store: Store) -> None:
    store.create_run("r")
    lease = store.acquire("r", "w1")
    store.update_run("r", status=RunStatus.CANCELLED)
    with pytest.raises(LeaseLostError):
        store.save("r", {"a": 1}, lease=lease)
    assert store.get_run("r").status is RunStatus.CANCELLED


def test_claim_hands_each_runnable_run_to_one_worker(store: Store) -> None:
    for i in range(6):
        store.create_run(f"q{i}", workflow="wf", status=RunStatus.QUEUED, priority=i % 2)
    store.create_run("other", workflow="not-mine", status=RunStatus.QUEUED)
    store.save("done", {"a": 1}, workflow="wf", status=RunStatus.COMPLETED)
    store.save("sleeping", {"a": 1}, workflow="wf", status=RunStatus.WAITING,
               metadata={"wake_at": time.time() + 3600})
    store.save("due", {"a": 1}, workflow="wf", status=RunStatus.WAITING,
               metadata={"wake_at": time.time() - 1})
    first = store.claim("w1", workflows=["wf"], limit=3)
    assert len(first) == 3
    assert {lease.run_id for lease in first} <= {"q1", "q3", "q5"}  # priority first
    rest = store.claim("w2", workflows=["wf"], limit=10)
    claimed = {lease.run_id for lease in first + rest}
    assert claimed == {"q0", "q1", "q2", "q3", "q4", "q5", "due"}
    assert {lease.workflow for lease in first + rest} == {"wf"}
    assert store.claim("w3", workflows=["wf"], limit=10) == []
    for lease in first:
        store.save(lease.run_id, {"done": True}, lease=lease)


def test_concurrent_claims_never_share_a_run(store: Store) -> None:
    for i in range(40):
        store.create_run(f"q{i}", workflow="wf", status=RunStatus.QUEUED)
    got: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while True:
            leases = store.claim(name, workflows=["wf"], limit=3)
            if not leases:
                return
            with lock:
                got.extend(lease.run_id for lease in leases)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(f"q{i}" for i in range(40))


# -- inputs and effects ---------------------------------------------------------------------------


def test_send_input_to_a_waiting_run(store: Store) -> None:
    store.save("r", {"a": 1}, status=RunStatus.WAITING,
               metadata={"waiting_for": ["finance", "legal"]})
    assert store.get_run("r").wake_at is None
    store.send("r", "finance", {"approved": True, "by": "ana"})
    assert store.get_run("r").wake_at is None  # still waits for legal
    with pytest.raises(InputError, match="already delivered"):
        store.send("r", "finance", {"approved": False})
    with pytest.raises(InputError, match="waits for 'finance', 'legal'"):
        store.send("r", "security", 1)
    store.send("r", "legal", "ok")
    assert store.get_run("r").wake_at is not None  # now runnable
    inputs = store.inputs("r")
    assert inputs["finance"].payload == {"approved": True, "by": "ana"}
    assert inputs["legal"].payload == "ok"
    ckpt = store.save("r", {"a": 2}, status=RunStatus.RUNNING,
                      consumed_inputs=[i.id for i in inputs.values()])
    assert store.inputs("r") == {}
    assert store.inputs("r", pending=False)["legal"].consumed_by == ckpt.id


def test_send_to_finished_or_unknown_run(store: Store) -> None:
    store.save("r", {"a": 1}, status=RunStatus.COMPLETED)
    with pytest.raises(InputError, match="finished"):
        store.send("r", "x", 1)
    with pytest.raises(RunNotFoundError):
        store.send("ghost", "x", 1)
    store.save("s", {"a": 1})
    with pytest.raises(InputError, match="running"):
        store.send("s", "x", 1)
    assert store.inputs("r", pending=False) == {}


def test_send_rejects_unserialisable_payload(store: Store) -> None:
    store.save("r", {"a": 1}, status=RunStatus.WAITING, metadata={"waiting_for": ["x"]})
    with pytest.raises(SerializationError, match=r"input\.x"):
        store.send("r", "x", Exploding())
    assert store.inputs("r") == {}


def test_effects_are_recorded_once(store: Store) -> None:
    store.save("r", {"a": 1})
    assert store.get_effect("r", "k") == (False, None)
    assert store.record_effect("r", "k", {"charge": 1}) == {"charge": 1}
    assert store.record_effect("r", "k", {"charge": 2}) == {"charge": 1}  # first wins
    assert store.get_effect("r", "k") == (True, {"charge": 1})
    assert store.get_effect("r", "other") == (False, None)


def test_save_records_effects_in_its_transaction(store: Store) -> None:
    first = store.save("r", {"a": 1})
    store.record_effects("r", {"kept": 1}, checkpoint_id=first.id)
    second = store.save("r", {"a": 2}, effects={first.id: {"kept": 2, "new": [1, 2]}})
    assert store.effects("r", checkpoint_id=first.id) == {"kept": 1, "new": [1, 2]}
    # Groups on several checkpoints, the new one's included (its id chosen by the caller).
    store.save("r", {"a": 3}, checkpoint_id="third",
               effects={first.id: {"late": 1}, "third": {"own": "x"}})
    assert store.effects("r", checkpoint_id="third") == {"own": "x"}
    assert store.effects("r", checkpoint_id=first.id) == {"kept": 1, "new": [1, 2], "late": 1}
    # A refused save records nothing: the checkpoint and the records commit together.
    with pytest.raises(ConflictError):
        store.save("r", {"a": 4}, expected_head=second.id, effects={second.id: {"lost": 1}})
    assert store.get_effect("r", "lost") == (False, None)
    # The run's first save, and one with enough records for several statements.
    many = {f"k{i}": i for i in range(250)}
    store.save("fresh", {"a": 1}, checkpoint_id="f1", effects={"f1": many})
    assert store.effects("fresh", checkpoint_id="f1") == many


# -- api shape ------------------------------------------------------------------------------------


def test_async_api_has_the_same_shape(store: Store) -> None:
    async def main() -> None:
        aio = store.aio
        ckpt = await aio.save("r", {"a": 1})
        got = await aio.latest("r")
        assert got is not None and got.id == ckpt.id
        assert [s.id for s in await aio.history("r")] == [ckpt.id]
        results = await asyncio.gather(*(aio.save(f"r{i}", {"i": i}) for i in range(10)))
        assert len({c.id for c in results}) == 10

    asyncio.run(main())


def test_keyword_save_and_prepare_make_the_request_save_request_of_does(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save`` and ``prepare`` pass their keywords on positionally (a cheaper call): each
    lands in the field ``SaveRequest.of`` puts it in (every argument a distinct value, so a
    swapped pair shows)."""
    lease = Lease("r", "me", 3, 9.0, "wf")
    keywords: dict[str, Any] = {
        "parent_id": "p", "step": 4, "changed": ["a"], "schema_version": 2,
        "metadata": {"waiting_for": ["x"], "wake_at": 5.0, "error": "e"},
        "workflow": "wf", "status": RunStatus.WAITING, "expected_head": "h", "lease": lease,
        "release": True, "consumed_inputs": ["i1"], "durability": "full",
        "checkpoint_id": "c", "effects": {"c": {"k": 1}}, "attach": {"c": {"k": 2}},
    }
    requests: list[SaveRequest] = []
    monkeypatch.setattr(store, "save_request", requests.append)
    monkeypatch.setattr(store, "prepare_request", requests.append)
    store.save("r", {"a": 1}, **keywords)
    store.prepare("r", {"a": 1}, deliver_to="up", **keywords)
    assert requests == [SaveRequest.of("r", {"a": 1}, **keywords),
                        SaveRequest.of("r", {"a": 1}, deliver_to="up", **keywords)]
    assert requests[1].control.deliver_to == "up" and requests[0].options.lease is lease


def test_commit_callbacks_run_once_after_their_own_transaction(store: Store) -> None:
    """A transaction's on-commit callbacks run after it commits, once, and never after a
    rollback, though a backend may hand the same Tx to the transactions that follow."""
    ran: list[str] = []
    tx_of: Any = store._tx  # type: ignore[attr-defined]

    def fail_after_registering(tx: Any) -> None:
        tx.on_commit(lambda: ran.append("rolled back"))
        raise RuntimeError("boom")

    tx_of(lambda tx: tx.on_commit(lambda: ran.append("first")), write=True)
    tx_of(lambda tx: None, write=True)
    with pytest.raises(RuntimeError, match="boom"):
        tx_of(fail_after_registering, write=True)
    tx_of(lambda tx: None)
    assert ran == ["first"]


def test_schema_version_is_recorded(store: Store) -> None:
    from pitstop.store.engine.schema import LATEST_SCHEMA

    assert store.schema_version() == LATEST_SCHEMA  # type: ignore[attr-defined]
    assert store.migrate() == LATEST_SCHEMA


@pytest.mark.slow
def test_many_threads_one_store(store: Store) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                store.save(f"t{n}", {"i": i, "shared": "same"})
                store.save("common", {"from": n, "i": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.history("common", limit=None)) == 80
    # follow-the-head saves form one chain: every checkpoint but the first has its
    # predecessor as parent
    chain = store.history("common", limit=None)
    assert all(a.parent_id == b.id for a, b in itertools.pairwise(chain))
    assert store.verify() == []


def test_closed_store_refuses_work(open_store: Callable[..., Store]) -> None:
    s = open_store()
    s.close()
    with pytest.raises(pitstop.StoreError):
        s.save("r", {"a": 1})


def test_keyed_results_attached_to_a_checkpoint(store: Store) -> None:
    a = store.save("r", {"x": 1})
    b = store.save("r", {"x": 2})
    store.record_effects("r", {"w:1": ("chan", 1), "w:2": [1, 2]}, checkpoint_id=a.id)
    store.record_effects("r", {"w:3": "b"}, checkpoint_id=b.id)
    store.record_effects("r", {"w:1": "ignored"}, checkpoint_id=a.id)
    assert store.effects("r", checkpoint_id=a.id) == {"w:1": ("chan", 1), "w:2": [1, 2]}
    store.record_effects("r", {"w:1": "replaced"}, checkpoint_id=a.id, replace=True)
    assert store.effects("r", checkpoint_id=a.id)["w:1"] == "replaced"
    assert set(store.effects("r")) == {"w:1", "w:2", "w:3"}


def test_many_keyed_results_in_one_call(store: Store) -> None:
    """More rows than one multi-row INSERT takes (a transaction of several statements on
    SQLite, one statement of arrays on PostgreSQL): all kept, existing keys kept or replaced,
    binary and None values intact."""
    a = store.save("r", {"x": 1})
    store.record_effects("r", {"k0": "first"}, checkpoint_id=a.id)
    many = {f"k{i}": (b"\x00\xff" * i if i % 3 else None) for i in range(300)}
    many['clé "quoted", {braced}'] = "é"
    store.record_effects("r", many, checkpoint_id=a.id)
    assert store.effects("r", checkpoint_id=a.id) == {**many, "k0": "first"}
    store.record_effects("r", dict.fromkeys(many, "new"), checkpoint_id=a.id, replace=True)
    assert store.effects("r") == dict.fromkeys(many, "new")
    store.record_effects("other", many)  # no checkpoint named
    assert store.effects("other") == many


def test_caller_chosen_checkpoint_ids(store: Store) -> None:
    first = store.save("r", {"x": 1}, checkpoint_id="1ef-0001")
    assert first.id == "1ef-0001" and store.get("1ef-0001").state == {"x": 1}
    second = store.save("r", {"x": 2}, checkpoint_id="1ef-0002")
    assert second.parent_id == "1ef-0001"
    with pytest.raises(ConflictError, match="already exists"):
        store.save("other", {"x": 3}, checkpoint_id="1ef-0001")
    assert store.latest("r").id == "1ef-0002"  # type: ignore[union-attr]


def test_takeover_of_a_named_dead_owner(store: Store) -> None:
    store.create_run("r")
    dead = store.acquire("r", "host:1:dead", ttl=60)
    with pytest.raises(RunBusyError):
        store.acquire("r", "w2", takeover="someone-else")
    taken = store.acquire("r", "w2", takeover="host:1:dead")
    assert taken.token > dead.token and store.get_run("r").owner == "w2"
    with pytest.raises(LeaseLostError):
        store.save("r", {"a": 1}, lease=dead)


def test_expected_head_holds_when_following_the_head(store: Store) -> None:
    first = store.save("r", {"a": 1})
    store.save("r", {"a": 2})
    with pytest.raises(ConflictError):
        store.save("r", {"a": 3}, expected_head=first.id)  # parent defaults to the head
    assert len(store.history("r")) == 2


def test_a_first_checkpoint_on_a_run_another_handle_wrote_is_refused(
    store_url: str, open_store: Callable[..., Store]
) -> None:
    """expected_head=None (what starting a run sends) skips reading the head: the write's
    check must still refuse it, once, when the run already has checkpoints."""
    if store_url == "memory://":
        pytest.skip("needs two handles on one store")
    writer, starter = open_store(), open_store()
    head = writer.save("r", {"a": 1})
    with pytest.raises(ConflictError) as info:
        starter.save("r", {"a": 2}, expected_head=None)
    assert (info.value.expected, info.value.actual) == (None, head.id)
    starter.create_run("empty")
    first = starter.save("empty", {"a": 1}, expected_head=None)  # a created run has no head
    assert first.parent_id is None and writer.latest("empty") == first
    assert [c.id for c in writer.history("r")] == [head.id]


def test_a_branch_from_a_pruned_away_value_is_refused_not_dangling(
    store_url: str, open_store: Callable[..., Store]
) -> None:
    if store_url == "memory://":
        pytest.skip("needs two handles on one store")
    writer, pruner = open_store(), open_store()
    old = writer.save("r", {"doc": "old value " * 10})
    for i in range(3):
        writer.save("r", {"doc": f"newer value {i} " * 10})
    pruner.prune(RetentionPolicy(keep_last=1))  # `writer` still has `old` cached
    with pytest.raises(CheckpointNotFoundError):
        writer.save("r", {"doc": "old value " * 10, "x": 1}, parent_id=old.id, changed=["x"])
    assert writer.verify() == []


def test_async_store_has_every_public_method() -> None:
    from pitstop.store.contract.aio import AsyncStore

    public = {n for n in dir(Store) if not n.startswith("_") and callable(getattr(Store, n))}
    assert public - set(dir(AsyncStore)) == set()
