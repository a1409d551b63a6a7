"""Migration 10: a value's row names the run that stored it (its owner), which references it
without a ``pitstop_blob_refs`` row; every other run using it has one. Garbage collection
finds a run's own values by walking its checkpoints' field maps, and deletes a value only
when neither its owner nor a reference row holds it."""

from __future__ import annotations

import random
import string
import threading
from collections.abc import Callable
from typing import Any

import ormsgpack
import pytest
import xxhash

import pitstop
from oldstore import store_at, write_old
from pitstop import RetentionPolicy
from pitstop.serde import chunks
from pitstop.store import Store
from pitstop.store.engine import schema as store_schema

BACKENDS = pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
KEEP_ONE = RetentionPolicy(keep_last=1, keep_milestones=False)
SCALE = (1 << 64) // chunks.LIST_PARAMS.target  # where a list item ends its chunk


def _docs(seed: int, keys: int = 3000) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"doc-{i:05d}": "".join(rng.choices(string.ascii_letters, k=60)) for i in range(keys)}


def _count(store: Store, sql: str) -> int:
    return int(store._tx(lambda tx: tx.scalar(sql)))  # type: ignore[attr-defined]


def _edit(docs: dict[str, str], rng: random.Random) -> None:
    docs[f"doc-{rng.randrange(len(docs)):05d}"] = "".join(rng.choices(string.ascii_letters, k=60))


def _save_edits(
    store: Store, run_id: str, seed: int, saves: int
) -> tuple[dict[str, str], random.Random]:
    """Save ``saves`` versions of a dict, one key edited in each; the last version and the rng."""
    rng = random.Random(seed)
    docs = _docs(seed)
    for _ in range(saves):
        _edit(docs, rng)
        store.save(run_id, {"docs": docs})
    return docs, rng


@BACKENDS
def test_a_run_owns_what_it_stores_and_a_fork_references_it(
    open_store: Callable[..., Store],
) -> None:
    store = open_store()
    docs, _ = _save_edits(store, "src", 1, 20)
    values = _count(store, "SELECT COUNT(*) FROM pitstop_blobs")
    assert values > 100  # chunks and index nodes
    # One run: every row is its own, and it needs no reference row for them (PostgreSQL's
    # one-statement save gives one to a new chunk's key its run stored before: a few).
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs WHERE run_id = 'src'") == values
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blob_refs") < 5
    head = store.latest("src")
    assert head is not None
    store.fork(head.id, new_run_id="fork")
    forked = dict(docs, extra="x")
    store.save("fork", {"docs": forked})
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blob_refs WHERE run_id = 'fork'") > 100
    store.delete_run("src")  # the fork keeps what it shares; those rows have no owner now
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs WHERE run_id = 'src'") == 0
    assert store.latest("fork").state["docs"] == forked  # type: ignore[union-attr]
    assert store.verify() == []
    store.delete_run("fork")
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs") == 0


@BACKENDS
@pytest.mark.slow
def test_a_prune_from_another_handle_walks_the_trees(open_store: Callable[..., Store]) -> None:
    """The pruning handle has none of the writer's layouts: it reads every node it needs."""
    writer, pruner = open_store(), open_store()
    docs, rng = _save_edits(writer, "r", 2, 30)
    before = _count(pruner, "SELECT COUNT(*) FROM pitstop_blobs")
    report = pruner.prune(KEEP_ONE)
    assert len(report.checkpoints) == 29 and report.blobs > 0
    assert _count(pruner, "SELECT COUNT(*) FROM pitstop_blobs") == before - report.blobs
    assert pruner.latest("r").state["docs"] == docs  # type: ignore[union-attr]
    assert pruner.verify() == []
    _edit(docs, rng)
    writer.save("r", {"docs": docs})
    assert pruner.latest("r").state["docs"] == docs  # type: ignore[union-attr]


@BACKENDS
def test_two_runs_storing_the_same_value_each_keep_it(open_store: Callable[..., Store]) -> None:
    store = open_store()
    docs = _docs(3)
    store.save("a", {"docs": docs})
    store.save("b", {"docs": docs})  # every chunk is there already: "a" owns them
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs WHERE run_id = 'b'") == 0
    store.delete_run("a")
    assert store.latest("b").state["docs"] == docs  # type: ignore[union-attr]
    assert store.verify() == []
    store.delete_run("b")
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs") == 0


@BACKENDS
@pytest.mark.slow
def test_a_store_from_before_owners_is_upgraded_and_collects_its_old_values(
    store_url: str,
) -> None:
    rng = random.Random(4)
    docs = _docs(4)

    def write(old: Store) -> None:
        for _ in range(5):
            _edit(docs, rng)
            old.save("r", {"docs": docs})
        old.save("other", {"docs": docs})

    write_old(store_url, 9, write)  # a release from before migration 10
    with store_at(store_url, 9) as old:
        old_refs = _count(old, "SELECT COUNT(*) FROM pitstop_blob_refs")
        assert old_refs > 100
    with pitstop.open_store(store_url) as store:  # upgraded on open
        assert store.schema_version() == store_schema.LATEST_SCHEMA >= 10
        assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs WHERE run_id IS NOT NULL") == 0
        for _ in range(5):
            _edit(docs, rng)
            store.save("r", {"docs": docs})
        assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs WHERE run_id = 'r'") > 0
        # New rows are owned; a reference row only for a new key stored before (a few).
        assert _count(store, "SELECT COUNT(*) FROM pitstop_blob_refs") < old_refs + 10
        store.prune(KEEP_ONE, run_id="r")
        assert store.latest("r").state["docs"] == docs  # type: ignore[union-attr]
        store.delete_run("r")
        store.delete_run("other")
        assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs") == 0
        assert _count(store, "SELECT COUNT(*) FROM pitstop_blob_refs") == 0


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.slow
def test_runs_saving_the_same_values_while_others_are_deleted(
    open_store: Callable[..., Store],
) -> None:
    """Two runs save the same values at once (one insert waits for the other's), while a
    third handle deletes the first runs as they appear: the second runs lose nothing."""
    values = [_docs(10 + n, keys=1500) for n in range(12)]
    errors: list[BaseException] = []
    done = threading.Event()

    def save(prefix: str) -> None:
        store = open_store()
        try:
            for n, docs in enumerate(values):
                store.save(f"{prefix}-{n}", {"docs": docs})
                store.save(f"{prefix}-{n}", {"docs": dict(docs, n=str(n))})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def delete() -> None:
        store = open_store()
        try:
            while not done.is_set():
                for run in store.runs(id_prefix="a-", limit=None):
                    store.delete_run(run.id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(p,)) for p in "ab"]
    deleter = threading.Thread(target=delete)
    deleter.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    deleter.join()
    assert errors == []
    check = open_store()
    for n, docs in enumerate(values):
        latest: Any = check.latest(f"b-{n}")
        assert latest.state["docs"] == dict(docs, n=str(n))
        first = check.history(f"b-{n}", limit=None)[-1]
        assert check.get(first.id).state["docs"] == docs
    assert check.verify() == []


def test_appends_on_sqlite_ask_the_table_for_no_owner(tmp_path: Any) -> None:
    """A chunk an append grows in place is the run's own row: no reference row, and no query
    asking whose it is, also when the chunk is past the size that skips the insert count."""
    rng = random.Random(5)
    with pitstop.open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        store.save("r", {"log": [{"t": "x" * 3000, "n": n} for n in range(8)]})
        statements: list[str] = []
        store._connection().set_trace_callback(statements.append)  # type: ignore[attr-defined]
        items: list[dict[str, str]] = []
        while len(items) < 60:  # ~180 KiB: the open chunk reaches 64 KiB and is cut there
            item = {"t": "".join(rng.choices(string.ascii_letters, k=3000))}
            encoded = ormsgpack.packb(item)
            if xxhash.xxh3_64_intdigest(encoded) < len(encoded) * SCALE:
                continue  # it would end its chunk by its content, well before 64 KiB
            items.append(item)
            store.save("r", {"log": pitstop.Append([item])})
        store._connection().set_trace_callback(None)  # type: ignore[attr-defined]
        assert not [s for s in statements if "pitstop_blob_refs" in s or ("run_id = '" in s
                    and s.startswith("SELECT hash FROM pitstop_blobs"))]
        assert any(s.startswith("UPDATE pitstop_blobs SET hash") for s in statements)
        latest: Any = store.latest("r")
        assert latest.state["log"][8:] == items
        assert store.verify() == []


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_two_runs_sharing_values_deleted_at_once_leave_none(
    open_store: Callable[..., Store],
) -> None:
    """Two deletions each see the other run still holding the shared values before they take
    the garbage-collection lock; the second to get it must still delete them (found by the
    soak: values with no owner and no reference row, left for good)."""
    import psycopg

    store = open_store()
    docs = _docs(5)
    store.save("a", {"docs": docs})
    store.save("b", {"docs": docs})  # "a" owns every chunk, "b" has reference rows
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs") > 0
    errors: list[BaseException] = []

    def delete(run_id: str) -> None:
        try:
            open_store().delete_run(run_id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    key = store._gc_key  # type: ignore[attr-defined]
    with psycopg.connect(store._conninfo, autocommit=True) as gate:  # type: ignore[attr-defined]
        gate.execute("SELECT pg_advisory_lock(%s)", (key,))
        threads = [threading.Thread(target=delete, args=(r,)) for r in "ab"]
        for t in threads:
            t.start()
        for _ in range(600):  # both have looked and wait for the lock (at most 60 s)
            row = gate.execute(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid::bigint = %s AND objid::bigint = %s",
                ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            ).fetchone()
            if row is not None and row[0] >= 2:
                break
            threading.Event().wait(0.1)
        gate.execute("SELECT pg_advisory_unlock(%s)", (key,))
        for t in threads:
            t.join()
    assert errors == []
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blobs") == 0
    assert _count(store, "SELECT COUNT(*) FROM pitstop_blob_refs") == 0
