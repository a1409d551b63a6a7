"""The ``background`` durability mode: checkpoints written by a thread, off the step path.

A checkpoint is *prepared* (serialised, hashed, given its final id) on the run's own thread,
so it is a consistent snapshot of that moment; only the write waits in a bounded queue. The
queue is drained before a run waits, records an effect, fails or finishes, and at interpreter
exit. What can be lost is what sits in the queue when the process is killed: at most
``maxsize`` checkpoints; the run then resumes from the last one written and re-runs the steps
after it.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from typing import Any

from ..store import PreparedSave, Store

log = logging.getLogger("pitstop.runtime")


class BackgroundWriter:
    """Commits prepared checkpoints in order; one per (process, store)."""

    def __init__(self, store: Store, maxsize: int = 64) -> None:
        self.store = store
        self._queue: queue.Queue[PreparedSave[Any] | None] = queue.Queue(maxsize=maxsize)
        self._failed: dict[str, BaseException] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="pitstop-writer", daemon=True)
        self._thread.start()

    def submit(self, prepared: PreparedSave[Any]) -> None:
        """Queue a write (blocks while the queue is full); re-raises an earlier failure."""
        if prepared.run_id in self._failed:
            self.flush(prepared.run_id)
        self._queue.put(prepared)

    def flush(self, run_id: str | None = None) -> None:
        """Wait until everything queued so far is written; raise a failure of ``run_id``."""
        self._queue.join()
        if run_id is not None:
            self.raise_failure(run_id)

    def raise_failure(self, run_id: str) -> None:
        with self._lock:
            error = self._failed.pop(run_id, None)
        if error is not None:
            raise error

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                with self._lock:
                    broken = item.run_id in self._failed
                if not broken:
                    try:
                        self.store.commit(item)
                    except BaseException as exc:
                        # Later checkpoints of this run were chained on this one: drop them
                        # and report the first failure to the run at its next submit/flush.
                        with self._lock:
                            self._failed[item.run_id] = exc
                        log.error("run %r: background checkpoint failed: %s", item.run_id, exc)
            finally:
                self._queue.task_done()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


_writers: weakref.WeakKeyDictionary[Store, BackgroundWriter] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def writer_for(store: Store) -> BackgroundWriter:
    with _lock:
        writer = _writers.get(store)
        if writer is None or not writer._thread.is_alive():
            writer = BackgroundWriter(store)
            _writers[store] = writer
        return writer


@atexit.register
def _flush_all() -> None:
    for writer in list(_writers.values()):
        try:
            writer.flush()
        except Exception as exc:  # pragma: no cover - reported, exit continues
            log.error("flushing checkpoints at exit failed: %s", exc)


__all__ = ["BackgroundWriter", "writer_for"]
