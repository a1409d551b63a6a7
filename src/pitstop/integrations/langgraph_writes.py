"""Pending writes of a LangGraph step, committed in the transaction of the step's checkpoint.

LangGraph saves a task's writes (``put_writes``) as soon as the task finishes, on a background
thread, and the step's next checkpoint (``put``) right after the step; it never waits for
``put_writes`` before going on (with ``durability="sync"`` it waits for ``put`` only). A saver
that commits each call on its own pays two commits per step. :class:`HeldWrites` lets the
saver hold the regular writes made on a checkpoint it wrote for LangGraph's loop, and hand
them to the next ``put`` on that run, which commits them with the new checkpoint in one
transaction (``Store.save(attach=...)``): one commit per step, which appends them to their
checkpoint's row (:mod:`pitstop.store.attached`).

What is held, and for how long:

* Only regular writes, made on a checkpoint that this saver did not write as an
  ``update`` or ``fork`` (LangGraph's loop calls ``put_writes`` on a step's checkpoint, even
  before its ``put`` has run, and writes the run's next checkpoint after the step). Special
  writes (interrupts, errors, resumes: ``WRITES_IDX_MAP``) are committed before
  ``put_writes`` returns, together with the writes held on their run, and so are writes on
  the checkpoint of an ``update_state``.
* Until the run's next ``put`` takes them (it usually is the child of their checkpoint;
  LangGraph's threads may also deliver them after it, then the next one takes them), or
  ``writes_delay`` seconds at most (:data:`DELAY` by default): a thread of the saver commits
  writes held longer on their own (a step whose other tasks are still running, an
  interrupted invocation). Every read or maintenance call of the saver (``get_tuple``,
  ``list``, ``copy_thread``...), ``close()`` and the interpreter's exit commit them first.

So a process killed within that window loses the writes of tasks that finished in it, and
LangGraph runs those tasks again when the thread is resumed; readers in other processes see
them up to that delay later, as they would see the writes of a ``put_writes`` still in
flight with any saver.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Final, NamedTuple

from ..cache import BoundedCache
from ..store import Store

log = logging.getLogger("pitstop.langgraph")

DELAY: Final = 0.02
"""Seconds writes may be held before a thread of the saver commits them on their own (the
default of ``PitstopSaver(writes_delay=...)``)."""

_IDLE: Final = 1.0
"""Seconds with nothing held after which the committing thread ends (it restarts on demand)."""


class _Held(NamedTuple):
    records: dict[str, dict[str, bytes]]
    """Checkpoint id -> its held writes (key -> packed write)."""
    since: float


class HeldWrites:
    """Regular pending writes held for the next checkpoint of their run (see module docs)."""

    def __init__(self, store: Store, delay: float = DELAY) -> None:
        self._store = store
        self.delay = delay
        self._lock = threading.Lock()
        # Taken while held writes are being committed outside a put: a reader waits for
        # them (see flush).
        self._committing = threading.Lock()
        self._held: dict[str, _Held] = {}  # by run id
        # Checkpoints written here as update_state's or forks: writes on them do not wait.
        self._branches: BoundedCache[bool] = BoundedCache(4096)
        self._thread: threading.Thread | None = None
        _LIVE.add(self)

    def wrote_branch(self, checkpoint_id: str) -> None:
        """``checkpoint_id`` was written here, but not as a loop or input step: writes on it
        are committed at once."""
        self._branches.put(checkpoint_id, True)

    def hold(self, run_id: str, checkpoint_id: str, records: Mapping[str, bytes]) -> bool:
        """Hold ``records`` for the run's next checkpoint; False if they cannot wait."""
        if self._branches.get(checkpoint_id):
            return False
        with self._lock:
            held = self._held.get(run_id)
            if held is None:
                self._held[run_id] = _Held({checkpoint_id: dict(records)}, time.monotonic())
            else:
                mine = held.records.setdefault(checkpoint_id, {})
                for key, value in records.items():
                    mine.setdefault(key, value)  # a regular write is kept once
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._commit_late, name="pitstop-langgraph-writes", daemon=True
                )
                self._thread.start()
        return True

    def take(self, run_id: str) -> dict[str, dict[str, bytes]] | None:
        """The writes held for the run (by checkpoint), for the caller to commit."""
        if not self._held:  # (read without the lock: a put racing a hold commits it later)
            return None
        with self._lock:
            held = self._held.pop(run_id, None)
        return held.records if held is not None else None

    def commit(self, run_id: str, records: Mapping[str, Mapping[str, bytes]]) -> None:
        """Commit writes taken from here on their own."""
        for checkpoint_id, writes in records.items():
            self._store.attach(run_id, checkpoint_id, writes)

    def flush(self) -> None:
        """Commit every held write now (and wait for any being committed)."""
        with self._committing:
            with self._lock:
                due, self._held = self._held, {}
            try:
                for run_id, held in due.items():
                    self.commit(run_id, held.records)
            except BaseException:
                with self._lock:  # kept for the next flush (a write kept once is idempotent)
                    for run_id, held in due.items():
                        self._held.setdefault(run_id, held)
                raise

    def _commit_late(self) -> None:
        """The thread: commit writes held longer than the delay; end after _IDLE without any."""
        idle_since = time.monotonic()
        while True:
            time.sleep(self.delay / 2)
            now = time.monotonic()
            with self._committing:
                with self._lock:
                    due = {r: h for r, h in self._held.items() if now - h.since >= self.delay}
                    for run_id in due:
                        del self._held[run_id]
                for run_id, held in due.items():
                    try:
                        self.commit(run_id, held.records)
                    except Exception:
                        log.exception("could not commit held LangGraph writes of %r", run_id)
            with self._lock:
                if self._held:
                    idle_since = now
                elif now - idle_since > _IDLE:
                    self._thread = None
                    return


_LIVE: weakref.WeakSet[HeldWrites] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for writes in list(_LIVE):
        try:
            writes.flush()
        except Exception:
            log.exception("could not commit held LangGraph writes at exit")


__all__ = ["DELAY", "HeldWrites"]
