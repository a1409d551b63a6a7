"""Pending writes of a LangGraph step, committed in the transaction of a checkpoint.

LangGraph saves a task's writes (``put_writes``) as soon as the task finishes, on a background
thread, and the step's next checkpoint (``put``) right after the step; it never waits for
``put_writes`` before going on (with ``durability="sync"`` it waits for ``put`` only). A saver
that commits each call on its own pays two commits per step. :class:`HeldWrites` lets the
saver hold the regular writes made on a checkpoint and hand them to a ``put`` on their run,
which commits them with its checkpoint in one transaction (``Store.save(attach=...)``): one
commit per step, the writes in their checkpoint's row (:mod:`pitstop.store.encoding.attached`).

Two cases, told apart by whether the checkpoint the writes are made on is *written* (this
saver committed or read it, so it is in the store):

* **Written** (``durability="sync"``: LangGraph waits for a step's ``put`` before running the
  next step's tasks): the run's next ``put`` takes them and appends them to their
  checkpoint's row in its transaction.
* **Not written yet** (``durability="async"``: the ``put`` of the step's checkpoint runs on
  LangGraph's background thread, each after the one before, and the tasks of the next step
  often finish first; ``"exit"``: the writes of the last step are sent with the last
  ``put``): they wait for that checkpoint's own ``put``, which takes them into the row it
  inserts. Until then they cannot be read with any saver (no checkpoint names them), so
  holding them hides nothing and loses nothing a crash would not lose with the checkpoint.

What is held, and for how long:

* Only regular writes, made on a checkpoint that this saver did not write as an
  ``update`` or ``fork``. Special writes (interrupts, errors, resumes: ``WRITES_IDX_MAP``)
  are committed before ``put_writes`` returns, together with the writes held on their
  checkpoint and on every written checkpoint of their run, and so are writes on the
  checkpoint of an ``update_state``.
* A write on a written checkpoint: until the run's next ``put``, or ``writes_delay`` seconds
  at most (:data:`DELAY` by default): a thread of the saver commits writes held longer on
  their own (a step whose other tasks are still running, an interrupted invocation).
* A write on a checkpoint not written yet: until its ``put`` (or, if that ``put`` has already
  begun, until it ends: then as a write on a written checkpoint), as long as a ``put`` of
  its run is running. Once none has run for ``writes_delay``: committed then if its
  checkpoint is in the store after all (written by another saver), else after
  :data:`_ORPHANED` (its ``put`` failed or never came; or, on a loaded machine, the next of
  LangGraph's chained puts is slow to start).
* Every read or maintenance call of the saver (``get_tuple``, ``list``, ``copy_thread``...)
  first commits the writes held on written checkpoints and on any other checkpoint that is
  in the store by then; ``close()`` and the interpreter's exit commit all of them.

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
from collections.abc import Callable, Mapping
from typing import Final

from ..cache import BoundedCache
from ..store import Store

log = logging.getLogger("pitstop.langgraph")

DELAY: Final = 0.02
"""Seconds writes may be held before a thread of the saver commits them on their own (the
default of ``PitstopSaver(writes_delay=...)``)."""

_ORPHANED: Final = 1.0
"""Seconds writes on a checkpoint that is not in the store are held after the last put of
their run ended (its put failed, or never came), before they are committed on their own."""

_IDLE: Final = 1.0
"""Seconds with nothing held after which the committing thread ends (it restarts on demand)."""

Taken = dict[str, dict[str, bytes]]
"""Held writes taken for a commit: checkpoint id -> key -> packed write."""


class _Group:
    """The writes held on one checkpoint."""

    __slots__ = ("records", "since", "written")

    def __init__(self, records: dict[str, bytes], since: float, written: bool) -> None:
        self.records = records
        self.since = since
        """When the group was made, or (not written) when the last put on its run ended."""
        self.written = written
        """Whether its checkpoint is known to be in the store."""


class HeldWrites:
    """Regular pending writes held for a checkpoint's transaction (see module docs).

    The methods a LangGraph step calls (:meth:`hold`, :meth:`begin_put`, :meth:`end_put`)
    take the lock with ``acquire``/``release`` in ``try``/``finally``, not ``with``: the same,
    at half the interpreter's cost, on every step."""

    def __init__(self, store: Store, delay: float = DELAY) -> None:
        self._store = store
        self.delay = delay
        self._lock = threading.Lock()
        # Taken while held writes are being committed outside a put: a reader waits for
        # them (see flush).
        self._committing = threading.Lock()
        self._held: dict[str, dict[str, _Group]] = {}  # run id -> checkpoint id -> group
        self._putting: dict[str, int] = {}  # run id -> its puts running now
        # Checkpoints written here (by a put that began after their writes may have).
        self._written: BoundedCache[bool] = BoundedCache(4096)
        # Checkpoints written here as update_state's or forks: writes on them do not wait.
        self._branches: BoundedCache[bool] = BoundedCache(4096)
        self._thread: threading.Thread | None = None
        _LIVE.add(self)
        # Closing the store without closing the saver (a `with open_store(...)` block around
        # the graph) commits what is held while the store still works.
        store._call_before_close(self.flush)

    def wrote_branch(self, checkpoint_id: str) -> None:
        """``checkpoint_id`` was written here, but not as a loop or input step: writes on it
        are committed at once."""
        self._branches.put(checkpoint_id, True)

    def hold(
        self, run_id: str, checkpoint_id: str, records: Mapping[str, bytes], *, written: bool
    ) -> bool:
        """Hold ``records`` for a put of the run; False if they cannot wait. ``written``:
        the caller knows the checkpoint is in the store."""
        if self._branches.get(checkpoint_id):
            return False
        lock = self._lock
        lock.acquire()
        try:
            groups = self._held.get(run_id)
            if groups is None:
                groups = self._held[run_id] = {}
            group = groups.get(checkpoint_id)
            if group is None:
                written = written or self._written.get(checkpoint_id) is not None
                groups[checkpoint_id] = _Group(dict(records), time.monotonic(), written)
            else:
                mine = group.records
                for key, value in records.items():
                    mine.setdefault(key, value)  # a regular write is kept once
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._commit_late, name="pitstop-langgraph-writes", daemon=True
                )
                self._thread.start()
        finally:
            lock.release()
        return True

    def take_written(self, run_id: str) -> Taken | None:
        """The writes held on the run's written checkpoints, for the caller to commit now
        (before a special write)."""
        with self._lock:
            return self._take(run_id, None)

    def _take(self, run_id: str, checkpoint_id: str | None) -> Taken | None:
        """The writes held on the run's written checkpoints and on ``checkpoint_id``."""
        groups = self._held.get(run_id)
        if groups is None:
            return None
        taken = {}
        for c, g in groups.items():  # (not a comprehension: its own frame, every put)
            if g.written or c == checkpoint_id:
                taken[c] = g.records
        if not taken:
            return None
        for c in taken:
            del groups[c]
        if not groups:
            del self._held[run_id]
        return taken

    def begin_put(self, run_id: str, checkpoint_id: str) -> Taken | None:
        """A put of ``checkpoint_id`` begins: the writes it should commit with it, those held
        on it and on the run's written checkpoints."""
        lock = self._lock
        lock.acquire()
        try:
            self._putting[run_id] = self._putting.get(run_id, 0) + 1
            return self._take(run_id, checkpoint_id) if self._held else None
        finally:
            lock.release()

    def end_put(self, run_id: str, checkpoint_id: str, *, written: bool) -> None:
        """The put that :meth:`begin_put` began has ended (``written``: its checkpoint is in
        the store). Writes made on it meanwhile wait as writes on a written checkpoint; the
        run's others not written yet wait for their own put (or the delay) from now on."""
        lock = self._lock
        lock.acquire()
        try:
            left = self._putting[run_id] - 1
            if left:
                self._putting[run_id] = left
            else:
                del self._putting[run_id]
            if written:
                self._written.put(checkpoint_id, True)
            groups = self._held.get(run_id)
            if groups:
                now = time.monotonic()
                for c, group in groups.items():
                    if not group.written:
                        group.since = now
                        if written and c == checkpoint_id:
                            group.written = True
        finally:
            lock.release()

    def commit(self, run_id: str, records: Mapping[str, Mapping[str, bytes]]) -> None:
        """Commit writes taken from here on their own."""
        for checkpoint_id, writes in records.items():
            self._store.attach(run_id, checkpoint_id, writes)

    def flush(self, *, everything: bool = True) -> None:
        """Commit held writes now (and wait for any being committed). Not ``everything``
        (before a read): writes on a checkpoint not in the store stay held (no read can find
        them before their checkpoint's put, which takes them)."""
        with self._committing:
            found: set[str] = set()
            if not everything:
                with self._lock:
                    unknown = [
                        c for groups in self._held.values()
                        for c, g in groups.items() if not g.written
                    ]
                if unknown:  # (outside the lock: a put taking them meanwhile commits them)
                    found = set(self._store.summaries(unknown))
            with self._lock:
                due = self._pop(lambda r, c, g: everything or g.written or c in found)
            try:
                for run_id, taken in due.items():
                    self.commit(run_id, taken)
            except BaseException:
                with self._lock:  # kept for the next flush (a write kept once is idempotent)
                    for run_id, taken in due.items():
                        groups = self._held.setdefault(run_id, {})
                        for c, records in taken.items():
                            group = groups.setdefault(c, _Group({}, time.monotonic(), True))
                            for key, value in records.items():
                                group.records.setdefault(key, value)
                raise

    def _pop(self, due: Callable[[str, str, _Group], bool]) -> dict[str, Taken]:
        """Take the groups ``due(run id, checkpoint id, group)`` picks (under the lock)."""
        out: dict[str, Taken] = {}
        for run_id, groups in list(self._held.items()):
            taken = {c: g.records for c, g in groups.items() if due(run_id, c, g)}
            if taken:
                out[run_id] = taken
                for c in taken:
                    del groups[c]
                if not groups:
                    del self._held[run_id]
        return out

    def _commit_late(self) -> None:
        """The thread: commit writes held longer than the delay; end after _IDLE without any."""
        idle_since = time.monotonic()
        while True:
            time.sleep(self.delay / 2)
            now = time.monotonic()
            with self._committing:
                self._commit_due(now)
            with self._lock:
                if self._held:
                    idle_since = now
                elif now - idle_since > _IDLE:
                    self._thread = None
                    return

    def _commit_due(self, now: float) -> None:
        """Commit the writes held too long by ``now``.

        Writes on a checkpoint not written here wait while a put of their run runs. Once
        none has run for the delay, they are committed if their checkpoint is in the store
        (written elsewhere); otherwise they wait up to _ORPHANED: on a loaded machine the
        next of LangGraph's chained puts may take that long to start."""
        delay = self.delay
        with self._lock:
            putting = self._putting
            due = self._pop(
                lambda r, c, g: now - g.since >= (delay if g.written else _ORPHANED)
                and (g.written or r not in putting)
            )
            idle = [
                c
                for r, groups in self._held.items() if r not in putting
                for c, g in groups.items() if not g.written and now - g.since >= delay
            ]
        if idle:
            try:
                found = set(self._store.summaries(idle))
            except Exception:
                log.exception("could not look up the checkpoints of held LangGraph writes")
                found = set()
            if found:
                with self._lock:
                    for run_id, taken in self._pop(lambda r, c, g: c in found).items():
                        due.setdefault(run_id, {}).update(taken)
        for run_id, taken in due.items():
            try:
                self.commit(run_id, taken)
            except Exception:
                log.exception("could not commit held LangGraph writes of %r", run_id)


_LIVE: weakref.WeakSet[HeldWrites] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for writes in list(_LIVE):
        try:
            writes.flush()
        except Exception:
            log.exception("could not commit held LangGraph writes at exit")


__all__ = ["DELAY", "HeldWrites"]
