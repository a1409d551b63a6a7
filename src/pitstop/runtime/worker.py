"""Workers: processes that claim runnable runs from a shared store and execute them.

Start as many as you like, on as many machines as share the store (``pitstop worker`` or
:class:`Worker`). Each claims runs with a lease — queued runs, waiting runs whose inputs
arrived or whose timer is due, and runs whose owner's lease expired — so a run is executed by
one worker at a time, and a worker that dies has its runs taken over by the others: at once
by a worker on the dead worker's host (its pid is gone), after the lease expires elsewhere.
On PostgreSQL claims use ``FOR UPDATE SKIP LOCKED`` and workers are woken by LISTEN/NOTIFY;
on SQLite (one machine) the same semantics come from SQLite's write lock, and workers poll.

A worker never spins. A run it cannot execute (its checkpoint does not load, it has none, the
store failed under it) is retried with backoff while the worker keeps the run's lease, so no
other worker spins on it either; after the policy's attempts it is marked failed with the
error, and the worker goes on with the others. A store that cannot be reached is retried with
backoff too, however long it stays away.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ..errors import (
    LeaseLostError,
    PitstopError,
    RunBusyError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
)
from ..logfmt import kv
from ..model import RunStatus
from ..observe import metrics
from ..owners import owner_alive, owner_id
from ..store import Lease, Store
from .children import CHILD_GRACE, serving
from .policies import Retry
from .workflow import Workflow

log = logging.getLogger("pitstop.worker")


@dataclass
class WorkerStats:
    """What a worker did, by final status of each execution."""

    executed: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    """Executions that raised instead of returning (each is retried, see ``on_error``)."""
    given_up: int = 0
    """Runs marked failed because they could not be executed within ``on_error.attempts``."""


ON_ERROR = Retry(attempts=5, backoff=1.0, multiplier=2.0, max_delay=60.0)
"""The default ``on_error`` policy: retries after 1, 2, 4 and 8 seconds, then the run fails."""
STOP_CHECK = 0.5
SCHEDULE_CHECK = 0.5
"""Seconds between a worker's looks at its workflows' schedules."""
"""An idle worker notices :meth:`Worker.stop` (SIGTERM) within this many seconds, whatever
its ``poll_interval``: a store's wait for a notification cannot be interrupted, so it is
asked for at most this long at a time."""


@dataclass
class _Backoff:
    """A run this worker could not execute, held (by its lease) until it is tried again."""

    lease: Lease
    workflow: str
    attempts: int
    due: float


class Worker:
    """Claims and executes runs of ``workflows`` from ``store``, ``concurrency`` at a time.

    Runs execute on threads (good for steps that wait on I/O: model calls, APIs); for
    CPU-bound steps start more worker processes. ``limits`` caps how many runs of a workflow
    this worker executes at once. :meth:`stop` (and SIGTERM/SIGINT under :meth:`run`) lets
    each running run finish its current step, checkpoint, give its lease back and end.

    ``on_error`` says what happens to a run whose execution raises (a checkpoint that does
    not load, a run without one, a store error): it is tried again after
    ``on_error.delay(n)`` seconds, the worker holding its lease meanwhile, and after
    ``on_error.attempts`` tries it is marked failed with the error in its metadata
    (``run.metadata["error"]``). Store errors and state newer than this worker's code are
    not the run's fault: those are retried every ``on_error.max_delay`` at most, never failed.

    ``retry_failed`` makes failed runs come back: a run whose step fails (after the step's
    own retries) is parked as waiting, due again after ``retry_failed.delay(n)``, and any
    worker resumes it then, up to ``retry_failed.attempts - 1`` times before it fails for
    good. A network blip then needs no person.

    ``child_grace``: a step that queues children (``ctx.run_children``) waits up to this
    many seconds, holding its run and slot, for the pool to finish them; if they all do, it
    goes on in place, otherwise its run checkpoints as waiting and gives everything up until
    the last child wakes it. 0 makes it wait at once.
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
        on_error: Retry = ON_ERROR,
        retry_failed: Retry | None = None,
        child_grace: float = CHILD_GRACE,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 0 <= child_grace < math.inf:  # (nan too: it would wait until the children end)
            raise ValueError(f"child_grace must be a number of seconds >= 0, not {child_grace!r}")
        self.store = store
        self.workflows = {wf.name: wf for wf in workflows}
        if not self.workflows:
            raise ValueError("a worker needs at least one workflow")
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.limits = dict(limits or {})
        self.owner = owner or owner_id()
        self.on_error = on_error
        self.retry_failed = retry_failed
        self.child_grace = child_grace
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._slot_freed = threading.Event()
        self._active: dict[Future[Any], str] = {}
        self._lock = threading.Lock()
        self._orphans_checked = -float("inf")
        self._backoffs: dict[str, _Backoff] = {}
        self._failures: dict[str, int] = {}  # run id -> failed executions in a row
        self._until_idle = False
        self._orphans_elsewhere = False
        self._schedules_checked = -float("inf")

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

    _ORPHAN_SCAN = 200
    """Leased runs per workflow looked at for a dead owner on each scan."""

    def _adopt_orphans(self, free: int) -> list[Lease]:
        """Take over runs whose owner's process is gone from this host, without waiting for
        their leases to expire; note whether runs wait for a lease held elsewhere (an owner
        that may have died: ``until_idle`` keeps going until that lease expires or ends).

        At most once per poll interval: it lists the leased runs of these workflows.
        """
        now = time.monotonic()
        if now - self._orphans_checked < self.poll_interval:
            return []
        self._orphans_checked = now
        adopted: list[Lease] = []
        elsewhere = False
        for name in self._eligible():
            wf = self.workflows[name]
            candidates = self.store.runs(status=(RunStatus.RUNNING, RunStatus.QUEUED),
                                         workflow=name, limit=self._ORPHAN_SCAN)
            for run in candidates:
                if run.owner is None or run.owner == self.owner or run.lease_expires_at is None:
                    continue
                if run.lease_expires_at.timestamp() <= time.time():
                    elsewhere = True  # expired: the next claim takes it
                    continue
                alive = owner_alive(run.owner)
                if alive is None:
                    elsewhere = True
                if alive is not False:
                    continue
                if len(adopted) >= free:
                    elsewhere = True
                    continue
                try:
                    lease = self.store.acquire(run.id, self.owner, ttl=wf.lease_ttl,
                                               takeover=run.owner)
                except RunBusyError:
                    continue  # another worker on this host was quicker
                counting = metrics.current()
                if counting is not None:
                    counting.takeovers.labels(name).inc()
                log.warning(kv(event="takeover", run=run.id, workflow=name,
                               previous_owner=run.owner, reason="owner process is gone"),
                            extra={"run_id": run.id, "workflow": name})
                adopted.append(dataclasses.replace(lease, workflow=name))
        self._orphans_elsewhere = elsewhere
        return adopted

    def _execute(self, lease: Lease, workflow: str) -> None:
        wf = self.workflows[workflow]
        fields = {"run_id": lease.run_id, "workflow": workflow}
        log.info(kv(event="claimed", run=lease.run_id, workflow=workflow, token=lease.token),
                 extra=fields)
        try:
            # Children this run starts are queued for the pool.
            with serving(self.workflows, self.child_grace):
                result = wf.resume(
                    self.store,
                    lease.run_id,
                    lease=lease,
                    stop=self._stop,
                    retry_failed=self.retry_failed,
                )
        except (RunBusyError, LeaseLostError) as exc:  # another owner has it: theirs now
            log.info(kv(event="lost", run=lease.run_id, workflow=workflow,
                        error=f"{type(exc).__name__}: {exc}"), extra=fields)
            return
        except Exception as exc:
            if isinstance(exc, PitstopError):
                log.warning(kv(event="error", run=lease.run_id, workflow=workflow,
                               error=f"{type(exc).__name__}: {exc}"), extra=fields)
            else:
                log.exception(kv(event="crashed", run=lease.run_id, workflow=workflow,
                                 error=f"{type(exc).__name__}: {exc}"), extra=fields)
            with self._lock:
                self.stats.errors += 1
            self._back_off(lease, workflow, exc)
            return
        with self._lock:
            self.stats.executed += 1
            self.stats.by_status[result.status.value] += 1
            self._failures.pop(lease.run_id, None)
        error = result.error or {}
        done = {**fields, "status": result.status.value, "step": result.step,
                "attempt": error.get("attempt")}
        message = kv(event="finished", run=lease.run_id, workflow=workflow,
                     status=result.status.value, step=result.step, attempt=error.get("attempt"),
                     waiting_for=",".join(result.waiting_for) or None,
                     error=f"{error.get('type')}: {error.get('message')}" if error else None)
        if result.status is RunStatus.FAILED:
            log.warning(message, extra=done)
        else:
            log.info(message, extra=done)

    # -- runs that cannot be executed ------------------------------------------------------------

    def _back_off(self, lease: Lease, workflow: str, exc: BaseException) -> None:
        """Hold the run for a while (its lease keeps every worker off it), or give it up."""
        with self._lock:
            attempts = self._failures.get(lease.run_id, 0) + 1
            self._failures[lease.run_id] = attempts
        policy = self.on_error
        not_the_runs_fault = isinstance(exc, StoreError | SchemaVersionError)
        if attempts >= policy.attempts and not not_the_runs_fault:
            self._give_up(lease, workflow, exc, attempts)
            return
        exhausted = attempts >= policy.attempts
        delay = policy.max_delay if exhausted else policy.delay(attempts)
        log.warning(
            kv(event="backoff", run=lease.run_id, workflow=workflow, attempt=attempts,
               attempts=None if not_the_runs_fault else policy.attempts,
               retry_in=f"{delay:.1f}s", error=_one_line(exc)),
            extra={"run_id": lease.run_id, "workflow": workflow},
        )
        try:
            # The resume gave the lease back when it failed: take it again, for the delay.
            held = self.store.acquire(lease.run_id, self.owner, ttl=delay + 30.0)
        except PitstopError:  # taken by another worker, deleted, or the store is away
            with self._lock:
                self._failures.pop(lease.run_id, None)
            return
        if exhausted and self._until_idle:
            return  # held until the lease expires; a batch run does not wait for it
        with self._lock:
            self._backoffs[lease.run_id] = _Backoff(
                held, workflow, attempts, time.monotonic() + delay
            )

    def _give_up(self, lease: Lease, workflow: str, exc: BaseException, attempts: int) -> None:
        error = {
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            "message": _one_line(exc),
            "attempts": attempts,
            "worker": self.owner,
            "traceback": "".join(traceback.format_exception(exc)),
            "at": time.time(),
        }
        log.error(
            kv(event="given_up", run=lease.run_id, workflow=workflow, attempts=attempts,
               error=error["message"]),
            extra={"run_id": lease.run_id, "workflow": workflow},
        )
        with self._lock:
            self._failures.pop(lease.run_id, None)
            self.stats.given_up += 1
        try:
            held = self.store.acquire(lease.run_id, self.owner, ttl=30.0)
            self.store.update_run(
                lease.run_id, status=RunStatus.FAILED, metadata={"error": error}, lease=held
            )
            self.store.release(held)
        except (RunBusyError, LeaseLostError, RunNotFoundError):
            pass  # another owner took it meanwhile, or it is gone: theirs to settle
        except PitstopError as failure:
            log.warning(kv(event="error", run=lease.run_id, workflow=workflow,
                           error=f"could not mark the run failed: {_one_line(failure)}"))

    def _due_backoffs(self, free: int) -> list[Lease]:
        """The held runs whose delay is over, with their leases renewed for the execution."""
        now = time.monotonic()
        with self._lock:
            due = sorted((b for b in self._backoffs.values() if b.due <= now), key=lambda b: b.due)
            due = due[:free]
            for backoff in due:
                del self._backoffs[backoff.lease.run_id]
        ready = []
        for backoff in due:
            try:
                ttl = self.workflows[backoff.workflow].lease_ttl
                renewed = self.store.renew(backoff.lease, ttl=ttl)
                ready.append(dataclasses.replace(renewed, workflow=backoff.workflow))
            except LeaseLostError:
                with self._lock:
                    self._failures.pop(backoff.lease.run_id, None)
            except PitstopError as exc:  # the store is away: hold on and try later
                self._back_off(backoff.lease, backoff.workflow, exc)
        return ready

    def _next_backoff_in(self) -> float | None:
        with self._lock:
            if not self._backoffs:
                return None
            return max(0.0, min(b.due for b in self._backoffs.values()) - time.monotonic())

    def _release_backoffs(self) -> None:
        with self._lock:
            held, self._backoffs = list(self._backoffs.values()), {}
        for backoff in held:
            with contextlib.suppress(PitstopError):
                self.store.release(backoff.lease)

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
        tests), and no run of these workflows is held by an owner that may have died: runs of
        a dead owner on this host are taken over at once, and a lease held from another host
        is waited for until it ends or expires (then the run is taken). ``max_runs`` returns
        after that many executions were started.
        """
        restore = self._install_signals() if handle_signals else None
        self._until_idle = until_idle
        started = 0
        store_errors = 0
        log.info(kv(event="started", worker=self.owner, workflows=",".join(self.workflows),
                    concurrency=self.concurrency))
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
                    with self._lock:
                        # Read before claiming: a run finishing during the claim may make
                        # another runnable (a child waking its parent), so a worker that was
                        # busy looks again instead of calling itself idle.
                        was_busy = bool(self._active)
                    try:
                        self._fire_schedules()
                        leases = self._due_backoffs(free)
                        leases += self._claim(free - len(leases)) or self._adopt_orphans(
                            free - len(leases)
                        )
                        work = [(lease, self._workflow_of(lease)) for lease in leases]
                    except StoreError as exc:
                        # The store is away: try again later, never in a tight loop.
                        store_errors += 1
                        pause = self.on_error.delay(min(store_errors, 16))
                        log.warning(kv(event="store_error", worker=self.owner,
                                       retry_in=f"{pause:.1f}s", error=_one_line(exc)))
                        self._stop.wait(pause)
                        continue
                    store_errors = 0
                    for lease, workflow in work:
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
                    backoff = self._next_backoff_in()
                    if (until_idle and not busy and not was_busy and not self._orphans_elsewhere
                            and backoff is None):
                        break
                    if busy:
                        self._slot_freed.wait(min(self.poll_interval, 0.05))
                        self._slot_freed.clear()
                    elif backoff is not None and backoff < self.poll_interval:
                        self._stop.wait(backoff)
                    else:
                        self._wait_for_work()
        finally:
            self._release_backoffs()
            if restore is not None:
                restore()
        log.info(kv(event="stopped", worker=self.owner, executed=self.stats.executed,
                    errors=self.stats.errors,
                    **{f"runs_{k}": n for k, n in sorted(self.stats.by_status.items())}))
        return self.stats

    def _fire_schedules(self) -> None:
        """Enqueue the runs of due schedule ticks of these workflows (at most every
        :data:`SCHEDULE_CHECK` seconds; any worker may, each tick gets one run)."""
        now = time.monotonic()
        if now < self._schedules_checked + SCHEDULE_CHECK:
            return
        self._schedules_checked = now
        from .schedules import fire_due

        try:
            fire_due(self.store, self.workflows)
        except StoreError:
            raise  # the loop's store-error handling waits and tries again
        except PitstopError as exc:  # a schedule that cannot be read: the others still run
            log.warning(kv(event="schedule_error", worker=self.owner, error=_one_line(exc)))

    def _wait_for_work(self) -> None:
        """Wait up to ``poll_interval`` for the store to say a run may be runnable, noticing
        :meth:`stop` within :data:`STOP_CHECK`. A store that cannot signal would only sleep:
        this waits on the stop event instead. One that can (PostgreSQL's NOTIFY) is asked in
        slices, and the worker goes to claim as soon as one says it was signalled."""
        if type(self.store).wait_for_work is Store.wait_for_work:
            self._stop.wait(self.poll_interval)
            return
        deadline = time.monotonic() + self.poll_interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self.store.wait_for_work(min(left, STOP_CHECK)):
                return

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
            log.info(kv(event="signal", worker=self.owner, signal=signum,
                        action="finishing current steps"))
            self.stop()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore


def run_until_idle(
    store: Store,
    *workflows: Workflow,
    concurrency: int = 1,
    on_error: Retry = ON_ERROR,
) -> WorkerStats:
    """Execute every runnable run of ``workflows`` now, then return (cron jobs, tests)."""
    return Worker(store, workflows, concurrency=concurrency, on_error=on_error).run(
        until_idle=True, handle_signals=False
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = ["ON_ERROR", "Worker", "WorkerStats", "run_until_idle"]
