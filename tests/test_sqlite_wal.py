"""SQLite WAL checkpoints run on the store's own thread, not inside a save."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pitstop
from pitstop.store.sqlite import SQLiteStore


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pitstop-wal-checkpoint"]


def test_the_wal_is_checkpointed_by_the_stores_thread_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    before = len(_checkpoint_threads())
    store = pitstop.open_store(f"sqlite:///{path}")
    assert isinstance(store, SQLiteStore) and store._wal is not None
    try:
        for i in range(3000):
            store.save("r", {"i": i, "note": "x" * 200})
        assert len(_checkpoint_threads()) == before + 1
        deadline = time.monotonic() + 60  # not a speed check: the thread may be starved
        while store._wal.runs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store._wal.runs >= 1
        # Three to five WAL pages per save: without any checkpoint the WAL would pass
        # the bound (4,096 pages) here; with them it never goes beyond it.
        assert os.path.getsize(f"{path}-wal") <= 4100 * (4096 + 24) + 32
        assert store.latest("r").state["i"] == 2999  # type: ignore[union-attr]
    finally:
        store.close()
    assert len(_checkpoint_threads()) == before  # close() ends the thread
    with pitstop.open_store(f"sqlite:///{path}") as again:
        assert again.latest("r").state["i"] == 2999  # type: ignore[union-attr]


def test_a_store_that_only_reads_starts_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with pitstop.open_store(f"sqlite:///{path}") as store:
        store.save("r", {"i": 1})
    before = len(_checkpoint_threads())
    with pitstop.open_store(f"sqlite:///{path}") as store:
        for _ in range(200):
            store.latest("r")
        assert len(_checkpoint_threads()) == before
