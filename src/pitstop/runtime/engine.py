"""The run loop: execute steps, checkpoint, wait, retry, fail, finish.

The loop is written once, as a generator that *yields* what it needs done (call a step, do
store I/O, sleep). A synchronous driver and an asyncio driver perform those operations, so
``start`` and ``astart`` share every rule instead of keeping two copies that drift apart.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..delta import Delta
from ..errors import CacheKeyError, LeaseLostError, PitstopError, StepFailedError
from ..logfmt import kv
from ..model import Checkpoint, RunStatus, utc
from ..observe import metrics, tracing
from ..store import Lease, RunControl, SaveOptions, SaveRequest, Store
from ..store.contract.save import NO_CONTROL
from .cache import CachePolicy, Renewal, Waiting, claim_owner, step_key
from .children import WaitForChildren
from .context import StepContext, Suspend
from .leases import keeper
from .policies import CheckpointPolicy, Finish, Goto, Retry
from .state import merged, tracked, with_deltas
from .writer import writer_for

if TYPE_CHECKING:
    from .workflow import StepSpec, Workflow

log = logging.getLogger("pitstop.runtime")


@dataclass(frozen=True)
class RunResult:
    """Where a run stands after ``start``/``resume``/``fork`` returned."""

    run_id: str
    status: RunStatus
    state: Any
    checkpoint_id: str | None
    waiting_for: tuple[str, ...] = ()
    wake_at: datetime | None = None
    error: Mapping[str, Any] | None = field(default=None, repr=False)
    step: str | None = None
    """The step the run stopped at (waiting, failed), or the last one it ran."""

    @property
    def done(self) -> bool:
        """True if the run completed or was cancelled: nothing more will run."""
        return self.status in (RunStatus.COMPLETED, RunStatus.CANCELLED)

    def raise_for_status(self) -> RunResult:
        """Raise :class:`StepFailedError` if the run failed; return self otherwise."""
        if self.status is RunStatus.FAILED:
            raise StepFailedError(self.run_id, self.step, self.error or {})
        return self


# -- operations the loop asks its driver to perform ------------------------------------------------


class _Io:
    """Blocking store I/O: called directly (sync) or in a thread (async)."""

    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs


class _Call:
    """A user step: may return an awaitable."""

    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs


class _Sleep:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Op = _Io | _Call | _Sleep
T = TypeVar("T")
Loop = Generator[Op, Any, RunResult]


_STOPS = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.WAITING})
"""Statuses a run stops executing at: their checkpoint releases the run's lease."""

# Exceptions a step raises to stop the run for a while, not errors: its span says which.
_CONTROL = (Suspend, WaitForChildren)


# What steps return most, never awaitable: inspect.isawaitable asks the Awaitable ABC, which
# is slower than the rest of this loop's turn.
_NEVER_AWAITED = frozenset({dict, type(None), Goto, Finish})


def drive_sync(loop: Generator[Op, Any, T]) -> T:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = loop.send(value) if error is None else loop.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            if isinstance(op, _Sleep):
                time.sleep(op.seconds)
            else:
                value = op.fn(*op.args, **op.kwargs)
                if isinstance(op, _Call) and type(value) not in _NEVER_AWAITED \
                        and inspect.isawaitable(value):
                    value = _run_coroutine(value)
        except BaseException as exc:
            error = exc


def _run_coroutine(awaitable: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(awaitable))
    awaitable.close()
    raise RuntimeError(
        "an async step cannot run inside a running event loop from the sync API; "
        "use `await wf.astart(...)` / `await wf.aresume(...)`"
    )


async def _await(awaitable: Any) -> Any:
    return await awaitable


async def drive_async(loop: Loop) -> RunResult:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = loop.send(value) if error is None else loop.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            if isinstance(op, _Sleep):
                await asyncio.sleep(op.seconds)
            elif isinstance(op, _Io):
                value = await asyncio.to_thread(op.fn, *op.args, **op.kwargs)
            else:
                value = op.fn(*op.args, **op.kwargs)
                if inspect.isawaitable(value):
                    value = await value
        except BaseException as exc:
            error = exc


# -- one execution of a run ----------------------------------------------------------------------


class Execution:
    """The state of one process executing one run, from a checkpoint until it stops."""

    def __init__(
        self,
        wf: Workflow,
        store: Store,
        run_id: str,
        lease: Lease,
        *,
        policy: CheckpointPolicy,
    ) -> None:
        self.wf = wf
        self.store = store
        self.run_id = run_id
        self.lease = lease
        self.policy = policy
        # An automatic interval measures this run's checkpoint costs (fixed policies need no
        # state of their own: steps_since and checkpointed_at below are enough).
        self.schedule = policy.schedule() if policy.overhead is not None else None
        self.background = wf.durability == "background"
        self.durability: Any = None if self.background else wf.durability
        self.writer = writer_for(store) if self.background else None
        # run position, restored from the starting checkpoint by `run`
        self.parent_id: str | None = None
        self.branch = run_id
        self.position = 0
        self.fields: dict[str, Any] = {}
        self.next: str | None = None
        self.last_step: str | None = None
        self.completed: list[str] = []
        self.attempts: dict[str, int] = {}
        # Attempts of a step made before its retries were renewed (a manual resume of a failed
        # run, a parked retry): `attempts` counts every attempt, the Retry budget the rest.
        self.renewed_at: dict[str, int] = {}
        self.timers: dict[str, float] = {}
        self.deadlines: dict[str, float] = {}
        self.retries: dict[str, int] = {}  # "position:step" -> times parked for retry_failed
        self.retry_failed: Retry | None = None
        self.changed: set[str] | None = set()
        # Fields changed only by Append/Merge since the last checkpoint, with their combined
        # delta (None: also replaced whole). Replaced, never mutated, like `fields`.
        self.deltas: dict[str, Delta | None] = {}
        self.step_start_deltas: dict[str, Delta | None] = {}
        self.consumed: dict[str, str] = {}
        self.steps_since = 0
        self.checkpointed_at = time.monotonic()
        self.stop: threading.Event | None = None
        self.run_status: RunStatus | None = None  # the run's status in the store, as known
        self.checkpointed = False
        self.content = wf.change_detection == "content"
        self.tags: list[str] = []
        self.step_start_fields: dict[str, Any] = {}
        self.step_start_changed: set[str] | None = set()
        self.released = False
        # The run that started this one (ctx.run_child): told when this run finishes.
        self.parent_run: str | None = None
        self.children_started: list[str] = []  # since the last checkpoint, for history
        # The timeline (see _metadata): when the first step since the last checkpoint began
        # and how long step code ran since, all attempts; the lease owner on this execution's
        # first save (who claimed the run). Two clock reads a step, two numbers a checkpoint.
        self.work_started: float | None = None
        self.work_seconds = 0.0
        self.claimed_by: str | None = lease.owner
        # Tracing (pitstop.observe.tracing): None when off, and then each step and save
        # checks this one attribute, nothing more.
        self.tracer: Any = tracing.tracer()
        self.run_span: tracing.RunSpan | None = None
        self.trace_links: list[Any] = []
        self.size_warning: int | None = wf.size_warning or store.size_warning
        self.size_warned = False
        counting = metrics.current()  # None unless metrics are on (pitstop.observe.metrics)
        self.metrics = None if counting is None else counting.for_workflow(wf.name)
        # Steps and ctx.cached calls served from the cache since the last checkpoint, and
        # the runs that computed them: history shows "cached".
        self.cached_from: list[dict[str, Any]] = []
        self.claim: StepClaim | None = None  # the running step's cache claim
        # Steps served from the cache since the last checkpoint: the policy does not count
        # them (redoing one after a crash is one lookup), so a rerun of cached steps writes
        # one checkpoint where the first step that runs is, not one per cached step.
        self.served_since = 0
        self.served = False  # the current step was served from the cache (it did not run)

    # -- checkpoints -----------------------------------------------------------------------------

    def _metadata(self, status: RunStatus, source: str, extra: Mapping[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "source": source,
            "status": status.value,
            "step_name": self.last_step,
            "next": self.next,
            "completed": self.completed,
        }
        if self.branch != self.run_id:  # the run's own line needs no name
            meta["branch"] = self.branch
        if self.attempts:
            meta["attempts"] = self.attempts
        if self.renewed_at:
            meta["renewed_at"] = self.renewed_at
        if self.timers:
            meta["timers"] = self.timers
        if self.deadlines:
            meta["deadlines"] = self.deadlines
        if self.retries:
            meta["retries"] = self.retries
        if self.consumed:
            meta["inputs"] = self.consumed
        if self.tags:
            meta["tags"] = self.tags
        if self.children_started:
            meta["children"] = self.children_started
        if self.work_started is not None:
            # Milliseconds and microseconds: what a timeline shows, in fewer bytes of JSON.
            meta["started_at"] = int(self.work_started * 1000) / 1000  # never after the save
            meta["duration"] = round(self.work_seconds, 6)
        if self.claimed_by is not None:
            meta["claimed_by"] = self.claimed_by
        if self.cached_from:
            meta["cached"] = self.cached_from
        meta.update(extra)
        return meta

    def _save(
        self,
        fields: Mapping[str, Any],
        changed: set[str] | None,
        status: RunStatus,
        *,
        source: str = "step",
        sync: bool = False,
        waiting_for: Sequence[str] | None = None,
        wake_at: float | None = None,
        error: Any = None,
        **extra: Any,
    ) -> Generator[Op, Any, str]:
        # The run stops after a checkpoint with one of these statuses: the same write gives
        # its lease up (one round trip less, and never "waiting" yet still owned). A run
        # handed back unfinished (a worker stopping) is released separately, which also
        # tells other workers it can be taken.
        release = status in _STOPS
        started = time.monotonic()
        # The save's span is made once it is known, with a start time (one attribute pass,
        # no updates of a live span: an SDK span costs tens of microseconds).
        span_start = None if self.run_span is None or not self.run_span.traced \
            else time.time_ns()
        # Run control travels beside the checkpoint's metadata, not inside it: the store
        # moves the run's row (status, wait columns, a child's outcome) only as told here.
        # The metadata keeps the same facts for history and the inspector.
        metadata = self._metadata(status, source, extra)
        if waiting_for is not None:
            metadata["waiting_for"] = waiting_for
        if wake_at is not None:
            metadata["wake_at"] = wake_at
        if error is not None:
            metadata["error"] = error
        control = NO_CONTROL
        if status is not self.run_status or not self.checkpointed or waiting_for is not None \
                or wake_at is not None:
            control = RunControl(
                # Only a change of status is sent: the store then leaves the run's status
                # and wait columns (and their indexes) alone on an ordinary step.
                status=None if status is self.run_status else status,
                workflow=None if self.checkpointed else self.wf.name,
                waiting_for=waiting_for,
                wake_at=wake_at,
                error=error,
                deliver_to=self.parent_run,
            )
        prepared = self.store.prepare_request(SaveRequest(
            self.run_id,
            fields,
            changed,
            parent_id=self.parent_id,
            step=self.position,
            metadata=metadata,
            schema_version=self.wf.version,
            control=control,
            options=SaveOptions(
                # The run's head is this execution's last checkpoint: saying so makes the
                # write refuse a fork outright, and lets the store skip re-referencing
                # shared values.
                expected_head=self.parent_id,
                lease=self.lease,
                release=release,
                consumed_inputs=tuple(self.consumed.values()),
                durability=self.durability,
            ),
        ))
        saved = None
        if self.writer is not None and not sync and status is RunStatus.RUNNING:
            self.writer.submit(prepared)
        else:
            if self.writer is not None:
                yield _Io(self.writer.flush, self.run_id)
            if release:
                keeper.untrack(self.held)  # no renewal may race the release
            saved = yield _Io(self.store.commit, prepared)
            self.released = release
            if self.metrics is not None:
                # The metadata's status string: RunStatus.value is a Python property (~0.4 µs).
                self.metrics.saved_checkpoint(metadata["status"], time.monotonic() - started,
                                              saved.added if saved is not None else None)
        if span_start is not None:
            self._trace_save(span_start, prepared.checkpoint_id, metadata["status"], source,
                             saved)
        if self.size_warning is not None and saved is not None and not self.size_warned \
                and saved.size >= self.size_warning:
            self._warn_size(saved, self.size_warning)
        self.parent_id = prepared.checkpoint_id
        self.run_status = status
        self.checkpointed = True
        self.consumed = {}
        self.tags = []
        self.children_started = []
        self.claimed_by = None
        if source == "manual":  # ctx.checkpoint() inside a step: the rest of it is new work
            self.work_started, self.work_seconds = time.time(), 0.0
        elif source != "retry":  # a step's retries count in the checkpoint it ends with
            self.work_started = None
            self.work_seconds = 0.0
        self.cached_from = []
        self.steps_since = 0
        self.served_since = 0
        self.checkpointed_at = time.monotonic()
        if self.schedule is not None:
            self.schedule.taken(self.checkpointed_at - started)
        return prepared.checkpoint_id

    def _trace_save(self, start: int, checkpoint_id: str, status: str, source: str,
                    saved: Checkpoint | None) -> None:
        """The ``pitstop.checkpoint.save`` span of a save that started at ``start`` (ns)."""
        assert self.run_span is not None
        attributes: dict[str, Any] = {
            "pitstop.run.id": self.run_id, "pitstop.checkpoint.id": checkpoint_id,
            "pitstop.checkpoint.step": self.position, "pitstop.checkpoint.status": status,
            "pitstop.checkpoint.source": source, "db.system.name": tracing.db_system(self.store),
            "db.operation.name": "save"}
        if saved is not None:
            attributes["pitstop.checkpoint.bytes"] = saved.added or 0
        self.tracer.start_span("pitstop.checkpoint.save", context=self.run_span.context,
                               attributes=attributes, start_time=start).end()

    def _warn_size(self, saved: Checkpoint, limit: int) -> None:
        """A checkpoint reached ``size_warning`` (once an execution; see flag_size)."""
        from ..observe.usage import flag_size

        self.size_warned = True
        flag_size(self.store, saved, limit, workflow=self.wf.name,
                  lease=None if self.released else self.lease)  # a stopping save gave it up

    def _no_changes(self) -> set[str] | None:
        """What "nothing changed since the last checkpoint" is: an empty set, or None when
        every field is compared by content (``change_detection="content"``)."""
        return None if self.content else set()

    def checkpoint(self, status: RunStatus, **kw: Any) -> Generator[Op, Any, str]:
        changed, self.changed = self.changed, self._no_changes()
        deltas, self.deltas = self.deltas, {}
        return (yield from self._save(with_deltas(self.fields, deltas), changed, status, **kw))

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush(self.run_id)

    # -- what a step's helpers tell the run (see runtime/host.py) ------------------------------

    def note_children_started(self, run_ids: Iterable[str]) -> None:
        self.children_started.extend(run_ids)

    def note_input_consumed(self, name: str, input_id: str) -> None:
        self.consumed[name] = input_id

    def force_checkpoint(self, step: str, *, tag: str | None) -> str:
        """``ctx.checkpoint()``: the step-start state, synchronously, run continues."""
        extra: dict[str, Any] = {"tags": [tag]} if tag else {}
        next_, self.next = self.next, step
        try:
            return drive_sync(
                self._save(
                    with_deltas(self.step_start_fields, self.step_start_deltas),
                    self.step_start_changed,
                    RunStatus.RUNNING,
                    source="manual",
                    sync=True,
                    **extra,
                )
            )
        finally:
            self.next = next_
            # Everything up to the step's start is now durable.
            self.step_start_changed = self._no_changes()
            self.changed = self._no_changes()
            self.step_start_deltas = self.deltas = {}

    # -- the loop ------------------------------------------------------------------------------

    def restore(self, ckpt: Checkpoint, *, branch: str | None = None) -> None:
        meta = ckpt.metadata
        fields = dict(ckpt.state)
        changed = self._no_changes()
        if ckpt.schema_version != self.wf.version:
            fields = self.wf._migrate(fields, ckpt)
            changed = None  # compare every field by content on the next checkpoint
        self.fields = fields
        self.changed = changed
        self.deltas = {}
        self.parent_id = ckpt.id
        self.branch = branch or meta.get("branch") or self.run_id
        self.position = ckpt.step
        self.next = meta.get("next", self.wf.first_step) if "next" in meta else self.wf.first_step
        self.last_step = meta.get("step_name")
        self.completed = list(meta.get("completed", ()))
        self.attempts = dict(meta.get("attempts", {}))
        self.renewed_at = dict(meta.get("renewed_at", {}))
        self.timers = dict(meta.get("timers", {}))
        self.deadlines = dict(meta.get("deadlines", {}))
        self.retries = dict(meta.get("retries", {}))

    def result(self, status: RunStatus, **kw: Any) -> RunResult:
        return RunResult(
            run_id=self.run_id,
            status=status,
            state=self.wf.adapter.view(self.fields),
            checkpoint_id=self.parent_id,
            **kw,
        )

    def run(self, start_status: RunStatus) -> Loop:
        """The loop for a driver: executes from the restored checkpoint until it stops."""
        if self.tracer is None:
            return self._run(start_status)
        return self._traced(start_status)

    def _traced(self, start_status: RunStatus) -> Loop:
        span = self.run_span = tracing.RunSpan(
            self.tracer, self.wf.name, self.run_id, start_status.value, self.trace_links)
        try:
            result = yield from self._run(start_status)
        except BaseException as exc:
            span.end(None, exc)
            raise
        span.end(result.status.value)
        return result

    def _run(self, start_status: RunStatus) -> Loop:
        self.run_status = start_status
        self.held = keeper.track(self.store, self.lease, self.wf.lease_ttl)
        try:
            return (yield from self._loop(start_status))
        except LeaseLostError:
            run = self.store.get_run(self.run_id)
            if run.status is RunStatus.CANCELLED:
                return self.result(RunStatus.CANCELLED, step=self.next)
            raise
        finally:
            keeper.untrack(self.held)
            if self.claim is not None:  # stopped inside a claimed step (lease lost, ^C)
                self._abandon()
            try:
                if self.writer is not None:
                    self.writer.flush(self.run_id)
            finally:
                if not self.released:
                    # Fenced: a no-op if another owner took the run meanwhile.
                    self.store.release(self.lease)

    def _loop(self, start_status: RunStatus) -> Loop:
        wf = self.wf
        while True:
            if self.held.lost:
                raise LeaseLostError(
                    self.run_id, owner=self.lease.owner, token=self.lease.token, current_token=None
                )
            if self.stop is not None and self.stop.is_set() and self.next is not None:
                # A worker shutting down: make what ran durable and give the run back.
                if self.steps_since or self.changed:
                    yield from self.checkpoint(RunStatus.RUNNING, sync=True)
                return self.result(RunStatus.RUNNING, step=self.next)
            if self.next is None:
                if start_status is not RunStatus.COMPLETED or self.steps_since or self.changed:
                    yield from self.checkpoint(RunStatus.COMPLETED, sync=True)
                return self.result(RunStatus.COMPLETED, step=self.last_step)
            spec = wf.steps.get(self.next)
            if spec is None:
                return (yield from self._fail(
                    {"type": "UnknownStep", "message": f"no step named {self.next!r} in "
                     f"workflow {wf.name!r} (steps: {', '.join(wf.steps)})"}
                ))
            if self.position >= wf.max_steps:
                return (yield from self._fail(
                    {"type": "MaxStepsExceeded", "message": f"run exceeded max_steps="
                     f"{wf.max_steps} (a loop that never ends?)"}
                ))

            inputs: dict[str, Any] = {}
            timed_out = False
            if spec.options.wait_for:
                delivered = yield _Io(self.store.inputs, self.run_id)
                missing = [n for n in spec.options.wait_for if n not in delivered]
                if missing:
                    deadline = self._deadline(spec)
                    if deadline is None or time.time() < deadline:
                        return (yield from self._wait(start_status, spec, missing, deadline))
                    timed_out = True
                for name in spec.options.wait_for:
                    if name in delivered:
                        inputs[name] = self._typed_input(spec, name,
                                                         delivered[name].payload)
                        self.consumed[name] = delivered[name].id

            attempt = self.attempts.get(spec.name, 0) + 1
            ctx = StepContext(self, spec.name, attempt, inputs, timed_out)
            view = wf.adapter.view(self.fields)
            # Both are replaced, never mutated, when the step's updates are applied, so these
            # references keep the step-start values for a failure, a sleep or ctx.checkpoint().
            self.step_start_fields = self.fields
            self.step_start_changed = self.changed
            self.step_start_deltas = self.deltas
            if self.run_span is None:
                invoke = spec.invoke
            elif self.run_span.traced:
                invoke = tracing.traced_step(
                    self.tracer, self.run_span.context, spec.invoke,
                    {"pitstop.run.id": self.run_id, "pitstop.step.name": spec.name,
                     "pitstop.step.position": self.position, "pitstop.step.attempt": attempt},
                    _CONTROL)
            else:  # sampled out: the run's context only (user spans stay unsampled)
                invoke = tracing.in_context(self.run_span.context, spec.invoke)
            began = time.time()
            if self.work_started is None:
                self.work_started = began
            self.claim = None
            self.served = False
            try:
                try:
                    if spec.options.cache is None:
                        output = yield _Call(invoke, view, ctx, inputs)
                    else:
                        output = yield from self._cached_step(spec, invoke, view, ctx, inputs)
                finally:
                    # From the step's start, or from a ctx.checkpoint() it took meanwhile.
                    self.work_seconds += time.time() - max(began, self.work_started or began)
            except Suspend as suspend:
                self._abandon()
                self.changed = self.step_start_changed
                self.deltas = self.step_start_deltas
                return (yield from self._sleep(spec, suspend.wake_at))
            except WaitForChildren as children:
                self._abandon()
                self.changed = self.step_start_changed
                self.deltas = self.step_start_deltas
                return (yield from self._wait_children(spec, children.names))
            except CacheKeyError:
                raise  # a key that cannot be made: the caller's error, not the step's
            except LeaseLostError:
                raise  # the run is another worker's now: no retry, no failure written
            except Exception as exc:
                if self.metrics is not None:
                    self.metrics.errors.inc()
                self._abandon()
                retry = spec.options.retry or wf.retry
                self.attempts[spec.name] = attempt
                error = _describe(exc, spec.name, attempt)
                budget = attempt - self.renewed_at.get(spec.name, 0)  # since renewed
                if retry is not None and retry.retries(exc, budget):
                    self.changed = self.step_start_changed
                    self.deltas = self.step_start_deltas
                    yield from self.checkpoint(RunStatus.RUNNING, source="retry", error=error)
                    delay = retry.delay(budget)
                    log.info(kv(event="retry", run=self.run_id, step=spec.name, attempt=attempt,
                                delay=f"{delay:g}s", error=f"{error['type']}: {exc}"),
                             extra={"run_id": self.run_id, "step": spec.name,
                                    "attempt": attempt})
                    yield _Sleep(delay)
                    continue
                self.changed = self.step_start_changed
                self.deltas = self.step_start_deltas
                return (yield from self._fail(error, step=spec.name))

            if self.metrics is not None:
                self.metrics.ok.inc()
            # A step served from the cache did not run: nothing was assigned on its view and
            # its cached result is all it changes. (Comparing the whole state field by field
            # after each of a rerun's served steps was ~12% of the rerun's instructions.)
            updates = {} if self.served else wf.adapter.changes(view, self.fields)
            route: str | None
            output_kind: list[Any]
            if isinstance(output, Goto):
                route = output.target
                output_kind = ["goto", route]
                output = output.update
            elif isinstance(output, Finish):
                route = None
                output_kind = ["finish"]
                output = output.update
            else:
                route = wf.next_after(spec.name)
                output_kind = ["next"]
            if output is not None:
                updates.update(wf.adapter.updates_from(output, self.fields))
            self.fields = merged(self.fields, updates)
            self.deltas = tracked(self.deltas, updates)
            if self.changed is not None:
                self.changed = self.changed.union(updates)
            if spec.name not in self.completed:
                self.completed.append(spec.name)
            self.attempts.pop(spec.name, None)
            self.renewed_at.pop(spec.name, None)
            self._clear_step_state(spec.name)
            self.last_step = spec.name
            self.position += 1
            self.next = route
            self.steps_since += 1
            if self.claim is not None:
                yield from self._store_step_result(self.claim, updates, output_kind)

            if route is not None and route not in wf.steps:
                return (yield from self._fail(
                    {"type": "UnknownStep", "message": f"step {spec.name!r} routed to "
                     f"{route!r}, which is not a step of {wf.name!r}"}, step=spec.name
                ))
            tags = list(spec.options.tags) or ([spec.name] if spec.options.milestone else [])
            if tags:
                self.tags = tags
            if route is None:
                continue  # the completion checkpoint is written at the top of the loop
            due = spec.options.checkpoint
            if due is None:
                if spec.options.milestone:
                    due = True
                elif wf.steps[route].options.wait_for:
                    continue  # the wait writes the checkpoint (or the step runs at once)
                else:
                    due = bool(self.consumed) or (
                        self.schedule.due() if self.schedule is not None else self.policy.due(
                            steps_since=self.steps_since - self.served_since,
                            seconds_since=time.monotonic() - self.checkpointed_at,
                            milestone=False,
                        )
                    )
            if due:
                yield from self.checkpoint(RunStatus.RUNNING)

    def _trace_wait(self, spec: StepSpec, *, inputs: list[str] | None = None,
                    wake_at: float | None = None, children: list[str] | None = None) -> None:
        """A ``pitstop.wait`` span (no duration: the wait itself holds no process)."""
        if self.run_span is None or not self.run_span.traced:
            return
        attributes: dict[str, Any] = {"pitstop.run.id": self.run_id,
                                      "pitstop.step.name": spec.name}
        if inputs:
            attributes["pitstop.wait.inputs"] = list(inputs)
        if children:
            attributes["pitstop.wait.children"] = list(children)
        if wake_at is not None:
            attributes["pitstop.wait.wake_at"] = wake_at
        tracing.event_span(self.tracer, self.run_span.context, "pitstop.wait", attributes)
    # -- steps served from the cache (see pitstop.runtime.cache) --------------------------------

    def _cached_step(
        self, spec: StepSpec, invoke: Callable[..., Any], view: Any, ctx: StepContext,
        inputs: Mapping[str, Any],
    ) -> Generator[Op, Any, Any]:
        """The step's output from the cache, or from running it under a claim (kept in
        ``self.claim`` for :meth:`_store_step_result`, or :meth:`_abandon` if the step
        fails); waits while another worker computes the same key."""
        policy: CachePolicy = spec.options.cache
        key = step_key(self.wf.name, spec.name, spec.fn, policy, self.fields, view, inputs,
                       self.run_id)
        waiting: Waiting | None = None
        owner = ""
        while True:
            hit = yield _Io(self.store.cache_get, key)
            if hit is not None:
                self.cached_from.append({"step": spec.name, "run": hit.entry.run_id})
                self.served_since += 1
                self.served = True
                if log.isEnabledFor(logging.INFO):
                    log.info(kv(event="cached", run=self.run_id, step=spec.name,
                                source=hit.entry.run_id),
                             extra={"run_id": self.run_id, "step": spec.name})
                if self.metrics is not None:
                    self.metrics.metrics.cache_lookup("step", True)
                return _cached_output(hit.values)
            owner = owner or claim_owner()
            outcome = yield _Io(self.store.cache_claim, key, spec.name, owner,
                                lease=policy.lease)
            if outcome == "claimed":
                break
            waiting = waiting or Waiting(policy.wait)
            delay = waiting.next_delay()
            if delay is None:  # waited long enough: compute it here, unclaimed
                if self.metrics is not None:
                    self.metrics.metrics.cache_lookup("step", False)
                self.claim = StepClaim(key, spec.name, None, None, policy.seconds)
                return (yield _Call(invoke, view, ctx, inputs))
            yield _Sleep(delay)
        if self.metrics is not None:
            self.metrics.metrics.cache_lookup("step", False)
        self.claim = StepClaim(key, spec.name, owner,
                               Renewal(self.store, key, owner, policy.lease), policy.seconds)
        return (yield _Call(invoke, view, ctx, inputs))

    def _abandon(self) -> None:
        """The claimed step failed (or parked): nothing is cached, others may claim it."""
        claim, self.claim = self.claim, None
        if claim is None or claim.owner is None:
            return
        claim.stop()
        try:
            self.store.cache_abandon(claim.key, claim.owner)
        except PitstopError as exc:  # the claim lapses by itself
            log.warning("cache claim %s not given up: %s", claim.key, exc)

    def _store_step_result(
        self, claim: StepClaim, updates: Mapping[str, Any], kind: list[Any]
    ) -> Generator[Op, Any, None]:
        values: dict[str, Any] = {"route": kind}
        for name in updates:
            values["field:" + name] = self.fields[name]
        try:
            yield _Io(self.store.cache_put, claim.key, claim.name, values, owner=claim.owner,
                      ttl=claim.ttl, run_id=self.run_id, checkpoint_id=self.parent_id)
        except BaseException:
            self._abandon()
            raise
        claim.stop()
        self.claim = None

    def _clear_step_state(self, step: str) -> None:
        """Forget the finished step's timers, input deadlines and retries of the run."""
        if not self.timers and not self.deadlines and not self.retries:
            return
        prefix = f"{self.position}:{step}"
        tables: tuple[dict[str, Any], ...] = (self.timers, self.deadlines, self.retries)
        for table in tables:
            for key in [k for k in table if k == prefix or k.startswith(prefix + ":")]:
                del table[key]

    def _deadline(self, spec: StepSpec) -> float | None:
        timeout = spec.options.timeout
        if timeout is None:
            return None
        key = f"{self.position}:{spec.name}"
        return self.deadlines.setdefault(key, time.time() + timeout)

    def _wait(
        self,
        start_status: RunStatus,
        spec: StepSpec,
        missing: list[str],
        deadline: float | None,
    ) -> Generator[Op, Any, RunResult]:
        already = (
            start_status is RunStatus.WAITING and not self.steps_since and not self.changed
        )
        self._trace_wait(spec, inputs=missing, wake_at=deadline)
        if not already:
            yield from self.checkpoint(
                RunStatus.WAITING,
                sync=True,
                waiting_for=missing,
                **({"wake_at": deadline} if deadline else {}),
                **({"show": list(spec.options.show)} if spec.options.show else {}),
                **({"input_schemas": spec.input_json_schemas()} if spec.options.input_schemas
                   else {}),
            )
        return self.result(
            RunStatus.WAITING, waiting_for=tuple(missing), wake_at=utc(deadline), step=spec.name
        )

    @staticmethod
    def _typed_input(spec: StepSpec, name: str, payload: Any) -> Any:
        """A delivered payload as the type the step declared for it (checked at send)."""
        declared = spec.options.input_schemas.get(name)
        if declared is None:
            return payload
        from ..schemas import convert

        return convert(declared, payload)

    def _sleep(self, spec: StepSpec, wake_at: float) -> Generator[Op, Any, RunResult]:
        self.fields = self.step_start_fields
        self.deltas = self.step_start_deltas
        self.next = spec.name
        self._trace_wait(spec, wake_at=wake_at)
        yield from self.checkpoint(RunStatus.WAITING, sync=True, wake_at=wake_at)
        return self.result(RunStatus.WAITING, wake_at=utc(wake_at), step=spec.name)

    def _wait_children(self, spec: StepSpec, names: list[str]) -> Generator[Op, Any, RunResult]:
        """Park the run until its unfinished children finish: the step runs again then.
        The transaction finishing the last child makes the run runnable (see
        :mod:`pitstop.store.engine.children`), and so does this checkpoint if they all finished
        since the step looked."""
        self.fields = self.step_start_fields
        self.deltas = self.step_start_deltas
        self.next = spec.name
        self._trace_wait(spec, children=names)
        yield from self.checkpoint(RunStatus.WAITING, sync=True, waiting_for=names)
        return self.result(RunStatus.WAITING, waiting_for=tuple(names), step=spec.name)

    def renew_attempts(self, step: str) -> None:
        """Give ``step`` a fresh set of its retries; its attempt count goes on (the error and
        ``ctx.attempt`` say how many times it ran in all)."""
        if step in self.attempts:
            self.renewed_at[step] = self.attempts[step]

    def _fail(
        self, error: dict[str, Any], *, step: str | None = None
    ) -> Generator[Op, Any, RunResult]:
        if step is not None:
            if self.step_start_fields:
                self.fields = self.step_start_fields
                self.deltas = self.step_start_deltas
            self.next = step
            retry = self.retry_failed
            key = f"{self.position}:{step}"
            parked = self.retries.get(key, 0) + 1
            if retry is not None and parked < retry.attempts:
                # Park the run instead of failing it: a worker takes it up again when due,
                # with a fresh set of the step's own retries.
                self.retries[key] = parked
                self.renew_attempts(step)
                wake_at = time.time() + retry.delay(parked)
                yield from self.checkpoint(
                    RunStatus.WAITING, sync=True, source="retry", error=error, wake_at=wake_at
                )
                return self.result(
                    RunStatus.WAITING, error=error, wake_at=utc(wake_at), step=step
                )
        yield from self.checkpoint(RunStatus.FAILED, sync=True, error=error)
        return self.result(RunStatus.FAILED, error=error, step=step or self.next)


@dataclass
class StepClaim:
    """A step computed under a cache claim (``owner`` None: computed after waiting too long
    for another claimant, unclaimed): its result is stored when the step succeeds."""

    key: str
    name: str
    owner: str | None
    renewal: Renewal | None
    ttl: float | None

    def stop(self) -> None:
        if self.renewal is not None:
            self.renewal.stop()


def _cached_output(values: Mapping[str, Any]) -> Any:
    """A cached step result as the step's own return value would have been."""
    updates = {name[len("field:"):]: value for name, value in values.items()
               if name.startswith("field:")}
    kind = values.get("route") or ["next"]
    if kind[0] == "goto":
        return Goto(kind[1], updates)
    if kind[0] == "finish":
        return Finish(updates)
    return updates


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _describe(exc: BaseException, step: str, attempt: int) -> dict[str, Any]:
    # The traceback starts at the user's step: the frames of pitstop's own loop and drivers
    # above it say nothing about why the step failed.
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "step": step,
        "attempt": attempt,
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
        "at": time.time(),
    }


__all__ = ["Execution", "RunResult", "drive_async", "drive_sync"]
