"""SQLite WAL checkpoints run on the store's own thread, not inside a save."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import pitstop
from conftest import run_python
from pitstop.store.backends.sqlite import SQLiteStore


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


def test_the_thread_checkpoints_more_often_for_larger_transactions(tmp_path: Path) -> None:
    # What a commit at the WAL's bound copies itself is what the thread has not: the thread
    # paces itself to about 256 WAL pages between its checkpoints, not a fixed 128 commits.
    with pitstop.open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        assert isinstance(store, SQLiteStore) and store._wal is not None
        assert store._wal.every == 128
        deadline = time.monotonic() + 60  # not a speed check: the thread may be starved
        i = 0
        while store._wal.runs < 3 and time.monotonic() < deadline:
            store.save("r", {"i": i, "blob": os.urandom(40_000)})  # ~11 pages a save
            i += 1
        assert store._wal.runs >= 3
        assert 1 <= store._wal.every <= 40


def test_the_pace_counts_a_restarted_wal_whole_even_when_it_grew_longer(
    tmp_path: Path,
) -> None:
    # A thread starved of CPU checkpoints late: the WAL it finds after a checkpoint that
    # copied everything started over, yet can be longer than the last. Counting only its
    # growth past the old length set ``every`` to 89 transactions of 11 pages (not ~23).
    with pitstop.open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        assert isinstance(store, SQLiteStore) and store._wal is not None
        wal = store._wal
        wal._pace(log=1408, commits=128, restarted=True)  # 128 commits of 11 pages
        assert wal.every == 23
        wal._pace(log=1540, commits=268, restarted=True)  # late: 140 more, WAL started over
        assert wal.every == 23
        wal._pace(log=1760, commits=288, restarted=False)  # a reader kept it from starting
        assert wal.every == 23  # over: 20 commits, 220 frames


def test_small_saves_are_checkpointed_every_few_dozen_commits_not_each(
    tmp_path: Path,
) -> None:
    # After a checkpoint that copied every frame, a reader on the old WAL (the store's own
    # reads) can keep the next writer from starting it over. Taking "all copied" for "started
    # over" counted the whole WAL as new at each checkpoint: the pace fell to one checkpoint
    # a commit, each sorting the WAL's frames (twice the instructions of a 1 KiB save).
    with pitstop.open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        assert isinstance(store, SQLiteStore) and store._wal is not None
        state = {"i": 0, "text": "x" * 1000}
        store.save("r", state)
        for i in range(3000):  # ~4 WAL pages a save
            state["i"] = i
            store.save("r", state, changed=["i"])
            if i % 50 == 0:
                store.latest("r")
        deadline = time.monotonic() + 60  # not a speed check: the thread may be starved
        while store._wal.runs < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store._wal.runs <= 3000 // 16
        assert store._wal.every >= 16


def test_a_store_that_only_reads_starts_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with pitstop.open_store(f"sqlite:///{path}") as store:
        store.save("r", {"i": 1})
    before = len(_checkpoint_threads())
    with pitstop.open_store(f"sqlite:///{path}") as store:
        for _ in range(200):
            store.latest("r")
        assert len(_checkpoint_threads()) == before


# The fork tests run in a fresh interpreter: a thread of another test of this process (say a
# LangGraph saver's, committing held writes to its own SQLite file) inside SQLite at the fork
# would hang the child as the store's own thread once did, and only the store's own thread is
# what they check.
_FORK_PRELUDE = """
import os, sys, threading, time
import pitstop
from pitstop.store.backends.sqlite import SQLiteStore

def wait_or_kill(pid, seconds):
    # The child's exit code, or -1 after killing a child still running (hung).
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return -1

store = pitstop.open_store("sqlite:///" + sys.argv[1])
assert isinstance(store, SQLiteStore) and store._wal is not None
"""

_CHILD_CHECKPOINTS = _FORK_PRELUDE + """
for i in range(200):  # the parent's thread is started
    store.save("parent", {"i": i})
pid = os.fork()
if pid == 0:
    code = 1
    try:
        runs = store._wal.runs
        for i in range(300):
            store.save("child", {"i": i})
        deadline = time.monotonic() + 60
        while store._wal.runs == runs and time.monotonic() < deadline:
            time.sleep(0.01)
        threads = [t for t in threading.enumerate() if t.name == "pitstop-wal-checkpoint"]
        code = 0 if store._wal.runs > runs and threads else 2
    finally:
        os._exit(code)
print(wait_or_kill(pid, 120), store.latest("child").state["i"])
store.close()
"""


@pytest.mark.slow
def test_a_forked_child_checkpoints_on_a_thread_of_its_own(tmp_path: Path) -> None:
    done = run_python(_CHILD_CHECKPOINTS, str(tmp_path / "runs.db"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "299"]  # -1: the child hung (was killed)


_FORKS = _FORK_PRELUDE + """
codes = []
for n in range(20):
    for i in range(150):
        store.save("parent", {"i": i, "pad": "x" * 4000})
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store.save(f"child-{n}", {"n": n})
            code = 0
        finally:
            os._exit(code)
    codes.append(wait_or_kill(pid, 30))
store.close()
print(codes)
"""


@pytest.mark.slow
def test_fork_while_the_thread_checkpoints_never_hangs_the_child(tmp_path: Path) -> None:
    # A fork while the thread held one of SQLite's mutexes left the child blocked forever in
    # its first connect; fork() now waits until the thread is outside SQLite. Each fork
    # follows a burst of saves, so the thread is likely mid-checkpoint when it happens.
    done = run_python(_FORKS, str(tmp_path / "runs.db"), timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([0] * 20)  # -1: that child hung and was killed
