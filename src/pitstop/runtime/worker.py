"""Workers: processes that claim runnable runs from a shared store and execute them.

Start as many as you like, on as many machines as share the store (``pitstop worker`` or
:class:`Worker`). Each claims runs with a lease — queued runs, waiting runs whose inputs
arrived or whose timer is due, and runs whose owner's lease expired — so a run is executed by
one worker at a time, and a worker that dies has its runs taken over by the others.
On PostgreSQL claims use ``FOR UPDATE SKIP LOCKED`` and workers are woken by LISTEN/NOTIFY;
on SQLite (one machine) the same semantics come from SQLite's write lock, and workers poll.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ..errors import PitstopError
from ..store import Lease, Store
from .leases import owner_id
from .workflow import Workflow

log = logging.getLogger("pitstop.worker")


@dataclass
class WorkerStats:
    """What a worker did, by final status of each execution."""

    executed: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    errors: int = 0


class Worker:
    """Claims and executes runs of ``workflows`` from ``store``, ``concurrency`` at a time.

    Runs execute on threads (good for steps that wait on I/O: model calls, APIs); for
    CPU-bound steps start more worker processes. ``limits`` caps how many runs of a workflow
    this worker executes at once. :meth:`stop` (and SIGTERM/SIGINT under :meth:`run`) lets
    each running run finish its current step, checkpoint, give its lease back and end.
    """

    def __init__(
        self,
        store: Store,
        workflows: Iterable[Workflow],
        *,
        concurrency: int = 1,
        poll_interval: float = 1.0,
        limits: Mapping[str, int] | None = None,
        owner: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.store = store
        self.workflows = {wf.name: wf for wf in workflows}
        if not self.workflows:
            raise ValueError("a worker needs at least one workflow")
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.limits = dict(limits or {})
        self.owner = owner or owner_id()
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._slot_freed = threading.Event()
        self._active: dict[Future[Any], str] = {}
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Finish the current steps, checkpoint, release the runs; :meth:`run` then returns."""
        self._stop.set()
        self._slot_freed.set()

    def _eligible(self) -> list[str]:
        with self._lock:
            running = Counter(self._active.values())
        return [
            name
            for name in self.workflows
            if running[name] < self.limits.get(name, self.concurrency)
        ]

    def _claim(self, free: int) -> list[Lease]:
        names = self._eligible()
        if not names:
            return []
        ttl = max(wf.lease_ttl for wf in self.workflows.values())
        if not self.limits:
            return self.store.claim(self.owner, workflows=names, limit=free, ttl=ttl)
        leases: list[Lease] = []
        for name in names:  # one claim per capped workflow keeps each within its limit
            with self._lock:
                running = sum(1 for n in self._active.values() if n == name)
            room = min(free - len(leases), self.limits.get(name, free) - running)
            if room > 0:
                leases += self.store.claim(self.owner, workflows=[name], limit=room, ttl=ttl)
        return leases

    def _execute(self, lease: Lease, workflow: str) -> None:
        wf = self.workflows[workflow]
        try:
            result = wf.resume(self.store, lease.run_id, lease=lease, stop=self._stop)
        except PitstopError as exc:
            log.warning("run %s (%s): %s", lease.run_id, workflow, exc)
            with self._lock:
                self.stats.errors += 1
            return
        except Exception:
            log.exception("run %s (%s) crashed the worker thread", lease.run_id, workflow)
            with self._lock:
                self.stats.errors += 1
            with contextlib.suppress(PitstopError):
                self.store.release(lease)
            return
        with self._lock:
            self.stats.executed += 1
            self.stats.by_status[result.status.value] += 1
        log.info("run %s (%s): %s", lease.run_id, workflow, result.status.value)

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._active.pop(future, None)
        self._slot_freed.set()

    def run(
        self,
        *,
        until_idle: bool = False,
        max_runs: int | None = None,
        handle_signals: bool = True,
    ) -> WorkerStats:
        """Claim and execute runs until :meth:`stop` (or SIGTERM/SIGINT).

        ``until_idle`` returns once nothing is runnable and nothing is executing (batch jobs,
        tests); ``max_runs`` after that many executions were started.
        """
        restore = self._install_signals() if handle_signals else None
        started = 0
        log.info("worker %s: %s, concurrency %d", self.owner, ", ".join(self.workflows),
                 self.concurrency)
        # One run at a time executes right here: no thread hand-offs per run.
        pool = (
            ThreadPoolExecutor(self.concurrency, thread_name_prefix="pitstop-run")
            if self.concurrency > 1
            else None
        )
        try:
            with pool or contextlib.nullcontext():
                while not self._stop.is_set():
                    with self._lock:
                        free = self.concurrency - len(self._active)
                    if max_runs is not None:
                        free = min(free, max_runs - started)
                        if free <= 0 and not self._active:
                            break
                    if free <= 0:
                        self._slot_freed.wait(self.poll_interval)
                        self._slot_freed.clear()
                        continue
                    leases = self._claim(free)
                    for lease in leases:
                        workflow = self._workflow_of(lease)
                        started += 1
                        if pool is None:
                            self._execute(lease, workflow)
                            continue
                        future = pool.submit(self._execute, lease, workflow)
                        with self._lock:
                            self._active[future] = workflow
                        future.add_done_callback(self._done)
                    if leases:
                        continue
                    with self._lock:
                        busy = bool(self._active)
                    if until_idle and not busy:
                        break
                    if busy:
                        self._slot_freed.wait(min(self.poll_interval, 0.05))
                        self._slot_freed.clear()
                    else:
                        self.store.wait_for_work(self.poll_interval)
        finally:
            if restore is not None:
                restore()
        log.info("worker %s stopped: %s", self.owner, dict(self.stats.by_status))
        return self.stats

    def _workflow_of(self, lease: Lease) -> str:
        if len(self.workflows) == 1:
            return next(iter(self.workflows))
        if lease.workflow is not None:
            return lease.workflow
        return self.store.get_run(lease.run_id).workflow or ""

    def _install_signals(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("worker %s: signal %d, finishing current steps", self.owner, signum)
            self.stop()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore


def run_until_idle(store: Store, *workflows: Workflow, concurrency: int = 1) -> WorkerStats:
    """Execute every runnable run of ``workflows`` now, then return (cron jobs, tests)."""
    return Worker(store, workflows, concurrency=concurrency).run(
        until_idle=True, handle_signals=False
    )


__all__ = ["Worker", "WorkerStats", "run_until_idle"]
