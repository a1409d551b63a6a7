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


def test_the_wal_is_checkpointed_by_a_thread_of_the_store(tmp_path: Path) -> None:
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


def test_a_forked_child_checkpoints_on_a_thread_of_its_own(tmp_path: Path) -> None:
    store = pitstop.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    assert isinstance(store, SQLiteStore) and store._wal is not None
    try:
        for i in range(200):  # the parent's thread is started
            store.save("parent", {"i": i})
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                runs = store._wal.runs
                for i in range(300):
                    store.save("child", {"i": i})
                deadline = time.monotonic() + 60
                while store._wal.runs == runs and time.monotonic() < deadline:
                    time.sleep(0.01)
                code = 0 if store._wal.runs > runs and _checkpoint_threads() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store.latest("child").state["i"] == 299  # type: ignore[union-attr]
    finally:
        store.close()
