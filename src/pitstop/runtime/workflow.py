"""``Workflow``: named steps over a state, and the calls that start, resume and fork runs."""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..errors import (
    CheckpointNotFoundError,
    InputError,
    PitstopError,
    RunExistsError,
    RunNotStartedError,
    SchemaVersionError,
    StoreError,
)
from ..ids import new_id
from ..model import Checkpoint, Run, RunStatus
from ..observe import tracing
from ..serde import (
    codec,  # noqa: F401  # see below
    default_registry,
)
from ..store import Input, Lease, RetentionPolicy, RunControl, SaveOptions, SaveRequest, Store
from .cache import CachePolicy
from .engine import Execution, RunResult, drive_async, drive_sync
from .leases import abandon, acquire, owner_id
from .policies import CheckpointPolicy, Retry, StepOptions, WorkflowDurability
from .state import adapter_for

# The codec is imported with the runtime (above), not by the store at a run's first save: a
# store that only lists runs does without it, but a run is created and then its first
# checkpoint saved, and half a second of importing between the two (on a loaded machine)
# would widen the window in which a crash leaves a run without a checkpoint (#18 item 1).

if TYPE_CHECKING:
    from .schedules import Schedule

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("pitstop.runtime")


@dataclass(frozen=True)
class StepSpec:
    name: str
    fn: Callable[..., Any]
    options: StepOptions
    takes_ctx: bool
    input_params: tuple[str, ...]

    def invoke(self, state: Any, ctx: Any, inputs: Mapping[str, Any]) -> Any:
        kwargs = {name: inputs.get(name) for name in self.input_params}
        if self.takes_ctx:
            return self.fn(state, ctx, **kwargs)
        return self.fn(state, **kwargs)

    def input_json_schemas(self) -> dict[str, Any]:
        """The JSON Schema of each declared input, as recorded with the wait (cached)."""
        cached: dict[str, Any] | None = getattr(self, "_json_schemas", None)
        if cached is None:
            from ..schemas import json_schema

            cached = {name: json_schema(tp) for name, tp in self.options.input_schemas.items()}
            object.__setattr__(self, "_json_schemas", cached)
        return cached


class Workflow:
    """Steps that run in declared order over a state, checkpointed as they go.

    >>> wf = pitstop.Workflow("vendor-approval")
    >>> @wf.step
    ... def security_review(state, ctx):
    ...     return {"security_review": "completed"}

    ``state`` is the state type (dict by default; a TypedDict, dataclass or pydantic model);
    its classes are registered for safe serialisation. ``version`` is the schema version of
    the state, with ``@wf.migration`` functions upgrading older checkpoints on load.
    ``size_warning`` (bytes; default: the store's ``size_warning``, else none): a checkpoint
    whose state reaches it is logged with its largest fields, counted in metrics and marked
    on the run (``run.metadata["size_warning"]``, shown by the inspector), once per run
    execution.
    """

    def __init__(
        self,
        name: str,
        *,
        state: Any = None,
        version: int = 1,
        policy: CheckpointPolicy | None = None,
        durability: WorkflowDurability = "normal",
        retry: Retry | None = None,
        retention: RetentionPolicy | None = None,
        lease_ttl: float = 30.0,
        max_steps: int = 100_000,
        change_detection: str = "updates",
        size_warning: int | None = None,
    ) -> None:
        if size_warning is not None and size_warning < 1:
            raise ValueError("size_warning must be a number of bytes >= 1")
        if durability not in ("full", "normal", "background"):
            raise ValueError("durability must be 'full', 'normal' or 'background'")
        if change_detection not in ("updates", "content"):
            raise ValueError("change_detection must be 'updates' or 'content'")
        self.name = name
        self.state_type = state
        self.adapter = adapter_for(state)
        if state is not None and state is not dict:
            default_registry.register_annotations(state)
        self.version = version
        self.policy = policy or CheckpointPolicy()
        self.durability = durability
        self.retry = retry
        self.retention = retention
        self.lease_ttl = lease_ttl
        self.max_steps = max_steps
        self.change_detection = change_detection
        self.size_warning = size_warning
        self.steps: dict[str, StepSpec] = {}
        self._order: list[str] = []
        self._migrations: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, steps={self._order!r})"

    # -- definition ------------------------------------------------------------------------------

    @overload
    def step(self, fn: F, /) -> F: ...

    @overload
    def step(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        wait_for: str | Iterable[str] | None = None,
        timeout: float | timedelta | None = None,
        retry: Retry | None = None,
        milestone: bool = False,
        checkpoint: bool | None = None,
        tags: Iterable[str] = (),
        show: Iterable[str] = (),
        cache: CachePolicy | None = None,
        input_schema: Any = None,
    ) -> Callable[[F], F]: ...

    def step(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        wait_for: str | Iterable[str] | None = None,
        timeout: float | timedelta | None = None,
        retry: Retry | None = None,
        milestone: bool = False,
        checkpoint: bool | None = None,
        tags: Iterable[str] = (),
        show: Iterable[str] = (),
        cache: CachePolicy | None = None,
        input_schema: Any = None,
    ) -> Any:
        """Register a step: ``fn(state, ctx)`` returning updates, ``goto(...)`` or ``finish()``.

        ``wait_for`` names inputs the step needs; while one is missing the run waits (and
        holds nothing). Each arrives as a keyword argument of that name if ``fn`` takes one,
        and in ``ctx.inputs``. ``timeout`` bounds the wait: then the step runs with the input
        ``None`` and ``ctx.timed_out`` true. ``milestone`` always checkpoints after the
        step and tags the checkpoint (kept by retention). ``checkpoint`` forces (True) or
        suppresses (False) the checkpoint after this step whatever the policy. ``show`` names
        the state fields a person deciding the step's inputs needs (recorded with the wait;
        ``pitstop ui``'s inbox shows those instead of the whole state). ``cache`` serves the
        step from a result any run stored for the same inputs and code
        (:class:`~pitstop.CachePolicy`): the step does not run, its updates are applied.
        ``input_schema`` (a pydantic model, TypedDict or dataclass; or ``{input name: type}``
        for several) is the shape of the inputs: recorded with the wait, checked by every
        ``send`` (Python, ``pitstop send``, the inspector) with an
        :class:`~pitstop.InputError` naming the
        field, and the step receives the payload as that type.
        """
        if cache is not None and not isinstance(cache, CachePolicy):
            raise TypeError(f"cache must be a pitstop.CachePolicy, not {type(cache).__name__}")
        waits = (wait_for,) if isinstance(wait_for, str) else tuple(wait_for or ())
        schemas = _input_schemas(input_schema, waits)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        options = StepOptions(
            wait_for=waits,
            timeout=seconds,
            retry=retry,
            milestone=milestone,
            checkpoint=checkpoint,
            tags=tuple(tags),
            show=(show,) if isinstance(show, str) else tuple(show),
            cache=cache,
            input_schemas=schemas,
        )

        def register(fn: F) -> F:
            step_name = name or fn.__name__
            if step_name in self.steps:
                raise ValueError(f"workflow {self.name!r} already has a step {step_name!r}")
            params = list(inspect.signature(fn).parameters.values())
            positional = [
                p for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in waits
            ]
            if not 1 <= len(positional) <= 2:
                raise TypeError(
                    f"step {step_name!r} must take (state) or (state, ctx), plus optional "
                    f"keyword parameters named after its inputs {list(waits)}"
                )
            inputs = tuple(p.name for p in params if p.name in waits)
            self.steps[step_name] = StepSpec(
                step_name, fn, options, takes_ctx=len(positional) == 2, input_params=inputs
            )
            self._order.append(step_name)
            return fn

        if fn is not None:
            return register(fn)
        return register

    def migration(
        self, *, from_version: int
    ) -> Callable[[Callable[[dict[str, Any]], dict[str, Any]]], Callable[..., Any]]:
        """Register ``fn(state_fields: dict) -> dict`` upgrading ``from_version`` to the next."""

        def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[..., Any]:
            if from_version >= self.version:
                raise ValueError(
                    f"migration from version {from_version} is not below the workflow's "
                    f"version {self.version}"
                )
            self._migrations[from_version] = fn
            return fn

        return register

    @property
    def first_step(self) -> str | None:
        """The name of the step a new run starts with (None while there are no steps)."""
        return self._order[0] if self._order else None

    def next_after(self, step: str) -> str | None:
        """The step declared after ``step`` (None after the last one)."""
        i = self._order.index(step)
        return self._order[i + 1] if i + 1 < len(self._order) else None

    def _migrate(self, fields: dict[str, Any], ckpt: Checkpoint) -> dict[str, Any]:
        version = ckpt.schema_version
        if version > self.version:
            raise SchemaVersionError(
                f"checkpoint state has schema version {version}, newer than workflow "
                f"{self.name!r} version {self.version}; deploy the newer code to resume it",
                run_id=ckpt.run_id,
                checkpoint_id=ckpt.id,
            )
        while version < self.version:
            fn = self._migrations.get(version)
            if fn is None:
                raise SchemaVersionError(
                    f"no migration from state version {version} to {version + 1} in workflow "
                    f"{self.name!r} (checkpoint is version {ckpt.schema_version}, code is "
                    f"{self.version}); add @wf.migration(from_version={version})",
                    run_id=ckpt.run_id,
                    checkpoint_id=ckpt.id,
                )
            fields = dict(fn(dict(fields)))
            version += 1
        return fields

    # -- running ----------------------------------------------------------------------------------

    def _new_run(
        self,
        store: Store,
        input: Any,
        run_id: str | None,
        status: RunStatus,
        metadata: Mapping[str, Any] | None,
        priority: int,
        owner: str | None,
    ) -> tuple[str, Lease | None, Checkpoint | None]:
        """Create the run with its input as the first checkpoint.

        Returns the checkpoint it wrote, or None when ``run_id`` names a run this call
        converges on instead: the same workflow started with the same input before (a call
        repeated after an error that left the outcome unknown, or by a retrying client), to
        be continued rather than refused. A run of that id with other input or another
        workflow raises :class:`~pitstop.RunExistsError`.
        """
        if not self._order:
            raise ValueError(f"workflow {self.name!r} has no steps")
        fields = self.adapter.fields_of(input)
        run_id = run_id or new_id()
        try:
            # The run's row and its input checkpoint in one transaction: a crash or a lost
            # connection leaves the whole run (resume continues it, the same start again
            # converges on it) or nothing at all (the same start again creates it).
            prepared = store.prepare_request(SaveRequest(
                run_id,
                fields,
                step=0,
                metadata=self._input_metadata(status),
                schema_version=self.version,
                control=RunControl(status=status, workflow=self.name),
                options=SaveOptions(expected_head=None),
            ))
            ckpt, lease = store.start_run(
                prepared, metadata=metadata, priority=priority, owner=owner, ttl=self.lease_ttl
            )
        except RunExistsError:
            run = store.get_run(run_id)
            if run.head_id is not None:
                self._check_same_start(store, run, fields)
                return run_id, None, None
            if run.workflow != self.name:
                raise
            # Registered by store.create_run without its input (or by a version of pitstop
            # that wrote the two apart, killed in between): write the input now.
            return run_id, *self._first_checkpoint(store, run_id, fields, status, owner)
        return run_id, lease, ckpt

    def _input_metadata(self, status: RunStatus) -> dict[str, Any]:
        return {
            "source": "input",
            "status": status.value,
            "step_name": None,
            "next": self.first_step,
            "completed": [],
        }

    def _first_checkpoint(
        self,
        store: Store,
        run_id: str,
        fields: dict[str, Any],
        status: RunStatus,
        owner: str | None,
    ) -> tuple[Lease | None, Checkpoint]:
        """The input checkpoint of a run whose row exists without one."""
        lease = acquire(store, run_id, owner, ttl=self.lease_ttl) if owner else None
        try:
            ckpt = store.save_request(SaveRequest(
                run_id,
                fields,
                step=0,
                metadata=self._input_metadata(status),
                schema_version=self.version,
                control=RunControl(status=status, workflow=self.name),
                options=SaveOptions(lease=lease, expected_head=None),
            ))
        except BaseException:
            if lease is not None:
                with contextlib.suppress(PitstopError):
                    store.release(lease)
            raise
        return lease, ckpt

    def _check_same_start(self, store: Store, run: Run, fields: dict[str, Any]) -> None:
        """Refuse (RunExistsError) unless ``run`` is this workflow started with ``fields``."""
        if run.workflow != self.name:
            raise RunExistsError(run.id)
        history = store.history(run.id, limit=None)
        first = history[-1] if history else None
        if first is None or first.source != "input" or first.parent_id is not None:
            raise RunExistsError(run.id)
        try:
            same = store.get(first.id).state == fields
        except PitstopError:
            same = False
        if not same:
            raise RunExistsError(run.id)

    def _start(
        self,
        store: Store,
        input: Any,
        run_id: str | None,
        policy: CheckpointPolicy | None,
        metadata: Mapping[str, Any] | None,
        priority: int,
    ) -> tuple[Execution | None, RunResult | None, RunStatus]:
        owner = owner_id()
        try:
            run_id, lease, ckpt = self._new_run(
                store, input, run_id, RunStatus.RUNNING, metadata, priority, owner
            )
        except StoreError as exc:
            # The outcome is unknown (a connection lost while committing, say): whatever of
            # the run was written, this owner is gone, and the same start again converges.
            abandon(owner)
            if run_id is None:
                raise
            log.warning("start of run %r: %s; checking what was written", run_id, exc)
            try:
                run_id, lease, ckpt = self._new_run(
                    store, input, run_id, RunStatus.RUNNING, metadata, priority, owner_id()
                )
            except StoreError:
                raise exc from None
        if ckpt is None:  # started before: continue it
            return self._resume(store, run_id, None, policy, None)
        assert lease is not None
        return self._execution(store, run_id, lease, ckpt, policy), None, RunStatus.RUNNING

    def _execution(
        self,
        store: Store,
        run_id: str,
        lease: Lease,
        ckpt: Checkpoint,
        policy: CheckpointPolicy | None,
        branch: str | None = None,
    ) -> Execution:
        execution = Execution(self, store, run_id, lease, policy=policy or self.policy)
        try:
            execution.restore(ckpt, branch=branch)
        except BaseException:
            store.release(lease)
            raise
        return execution

    def _own(self, run: Run) -> Run:
        if run.workflow != self.name:
            raise ValueError(
                f"run {run.id!r} belongs to workflow {run.workflow!r}, not {self.name!r}"
            )
        return run

    def _resume(
        self,
        store: Store,
        run_id: str,
        from_checkpoint: str | None,
        policy: CheckpointPolicy | None,
        lease: Lease | None,
    ) -> tuple[Execution | None, RunResult | None, RunStatus]:
        run: Run | None = None
        if lease is None:
            run = self._own(store.get_run(run_id))
            lease = acquire(store, run_id, owner_id(), self.lease_ttl)
        try:
            if from_checkpoint is not None:
                if run is None:
                    run = self._own(store.get_run(run_id))
                ckpt = store.get(self._in_run(store, run_id, from_checkpoint))
                if ckpt.run_id != run_id:
                    raise ValueError(
                        f"checkpoint {from_checkpoint} belongs to run {ckpt.run_id!r}, not "
                        f"{run_id!r}; use fork() to start a new run from it"
                    )
                # Record the branch point: history shows it, and the new branch's effects
                # and timers are keyed apart from the old branch's.
                branch = new_id()
                meta = {k: v for k, v in ckpt.metadata.items() if k not in ("error", "tags")}
                meta.update(
                    {"source": "resume", "branch": branch, "resumed_from": ckpt.id,
                     "status": RunStatus.RUNNING.value}
                )
                meta.pop("waiting_for", None)
                meta.pop("wake_at", None)
                ckpt = store.save_request(SaveRequest(
                    run_id,
                    ckpt.state,
                    changed=(),
                    parent_id=ckpt.id,
                    step=ckpt.step,
                    metadata=meta,
                    schema_version=ckpt.schema_version,
                    control=RunControl(status=RunStatus.RUNNING),  # waiting for nothing
                    options=SaveOptions(lease=lease),
                ))
                status = RunStatus.RUNNING
            else:
                # The run as of now that the lease is held (one read with its head): read
                # before the lease, it may have been cancelled since, and must not go on.
                with tracing.span("pitstop.checkpoint.restore", {
                        "pitstop.run.id": run_id, "db.system.name": tracing.db_system(store),
                        "db.operation.name": "restore"}) as span:
                    owned, found = store.latest_with_run(run_id)
                    if span is not None and found is not None:
                        span.set_attribute("pitstop.checkpoint.id", found.id)
                        span.set_attribute("pitstop.checkpoint.bytes", found.size)
                run = self._own(owned)
                if found is None:
                    raise RunNotStartedError(run_id)
                ckpt = found
                status = run.status
                if status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
                    execution = Execution(self, store, run_id, lease, policy=self.policy)
                    execution.restore(ckpt)
                    store.release(lease)
                    return None, execution.result(status, step=execution.last_step), status
        except BaseException:
            store.release(lease)
            raise
        execution = self._execution(store, run_id, lease, ckpt, policy)
        execution.parent_run = run.parent_run
        if execution.tracer is not None:
            execution.trace_links = tracing.links_of(run.metadata)
        if status is RunStatus.FAILED:
            # A manual resume retries the failed step with a fresh set of retries; the
            # attempt counter goes on, so the next error says "attempt 2".
            execution.renew_attempts(execution.next or "")
        return execution, None, status

    def _finish(self, store: Store, result: RunResult) -> RunResult:
        if self.retention is not None and result.status is RunStatus.COMPLETED:
            store.prune(self.retention, run_id=result.run_id)
        return result

    def start(
        self,
        store: Store,
        input: Any = None,
        *,
        run_id: str | None = None,
        policy: CheckpointPolicy | None = None,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> RunResult:
        """Start a run and execute it in this process until it completes, waits or fails.

        The input becomes the first checkpoint, so even a crash in the first step loses
        nothing. Starting ``run_id`` again with the same input continues that run (so a
        start repeated after an error that left its outcome unknown converges on one run);
        raises :class:`~pitstop.RunExistsError` if ``run_id`` is taken by other input or
        another workflow.
        """
        execution, done, status = self._start(store, input, run_id, policy, metadata, priority)
        if execution is None:
            assert done is not None
            return done
        return self._finish(store, drive_sync(execution.run(status)))

    def resume(
        self,
        store: Store,
        run_id: str,
        *,
        from_checkpoint: str | None = None,
        policy: CheckpointPolicy | None = None,
        lease: Lease | None = None,
        stop: threading.Event | None = None,
        retry_failed: Retry | None = None,
    ) -> RunResult:
        """Continue a run from its latest checkpoint (or, on a new branch, from an earlier one).

        Waiting runs continue if their inputs arrived or their timer is due; failed runs
        retry the failed step; finished runs are returned as they are. Raises
        :class:`~pitstop.RunBusyError` while another process owns the run. ``lease`` is one
        already held (a worker's claim); once ``stop`` is set the run checkpoints after its
        current step and returns as ``running``, releasing the run for another owner.
        With ``retry_failed``, a step that fails (after its own retries) parks the run as
        ``waiting``, due again after ``retry_failed.delay(n)`` (what workers resume), up to
        ``retry_failed.attempts - 1`` times before the run fails.
        """
        execution, done, status = self._resume(store, run_id, from_checkpoint, policy, lease)
        if execution is None:
            assert done is not None
            return done
        execution.stop = stop
        execution.retry_failed = retry_failed
        return self._finish(store, drive_sync(execution.run(status)))

    def fork(
        self,
        store: Store,
        checkpoint_id: str,
        *,
        update: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        policy: CheckpointPolicy | None = None,
        add: bool = False,
    ) -> RunResult:
        """Start a new run from an earlier checkpoint (of any run), with edited state.

        ``checkpoint_id`` is a checkpoint id or any short form the CLI takes: a run id (its
        latest checkpoint), ``RUN@ID`` with ID as ``pitstop history`` prints it, a unique
        start of a checkpoint id. ``update`` maps fields (or paths inside them:
        ``"plan.goal"``, ``"messages[-1].content"``) to new values, converted to the type
        the field holds as ``pitstop fork --set`` does; a field the state does not have is
        refused with :class:`~pitstop.FieldEditError` (nothing is written) unless ``add``.
        """
        ckpt = self._fork(store, checkpoint_id, update, run_id, add)
        return self.resume(store, ckpt.run_id, policy=policy)

    def rerun(
        self,
        store: Store,
        run_id: str,
        *,
        from_step: str,
        update: Mapping[str, Any] | None = None,
        new_run_id: str | None = None,
        policy: CheckpointPolicy | None = None,
    ) -> RunResult:
        """Run ``run_id`` again from ``from_step``, as a new run, and execute it here.

        The new run starts from the checkpoint taken before ``from_step`` last ran, with
        ``update`` applied (field paths, validated like ``fork --set``): the steps before it
        are not executed again; steps after it with a :class:`~pitstop.CachePolicy` whose key
        did not change are served from the cache. A run still running or queued, or one that
        never reached the step, raises :class:`~pitstop.RerunError` and nothing is written.
        """
        from .rerun import start_rerun

        rerun_id = start_rerun(store, self, run_id, from_step, update, new_run_id)
        return self.resume(store, rerun_id, policy=policy)

    async def arerun(
        self,
        store: Store,
        run_id: str,
        *,
        from_step: str,
        update: Mapping[str, Any] | None = None,
        new_run_id: str | None = None,
        policy: CheckpointPolicy | None = None,
    ) -> RunResult:
        """:meth:`rerun` for asyncio."""
        import asyncio

        from .rerun import start_rerun

        rerun_id = await asyncio.to_thread(
            start_rerun, store, self, run_id, from_step, update, new_run_id
        )
        return await self.aresume(store, rerun_id, policy=policy)

    async def aschedule(
        self,
        store: Store,
        name: str,
        *,
        cron: str,
        timezone: str = "UTC",
        input: Any = None,
        catchup: str = "latest",
        overlap: str = "skip",
    ) -> Schedule:
        """:meth:`schedule` for asyncio (the store write leaves the loop)."""
        import asyncio

        return await asyncio.to_thread(
            self.schedule, store, name, cron=cron, timezone=timezone, input=input,
            catchup=catchup, overlap=overlap,
        )

    def schedule(
        self,
        store: Store,
        name: str,
        *,
        cron: str,
        timezone: str = "UTC",
        input: Any = None,
        catchup: str = "latest",
        overlap: str = "skip",
    ) -> Schedule:
        """Start a run of this workflow at every tick of ``cron`` in ``timezone``: any
        :class:`~pitstop.Worker` serving the workflow enqueues each tick's run, exactly one
        per tick (its id is ``NAME@YYYYMMDDTHHMMSSZ``). ``catchup`` (``none``, ``latest``,
        ``all``): the ticks missed while no worker ran; ``overlap`` (``skip``, ``queue``,
        ``allow``): a tick while the previous run is still going. Redefining ``name``
        replaces it. A cron expression that does not parse or an unknown timezone raises
        :class:`~pitstop.ScheduleError` with the reason; nothing is stored then.
        """
        from .schedules import add_schedule

        return add_schedule(store, self, name, cron=cron, timezone=timezone, input=input,
                            catchup=catchup, overlap=overlap)

    def _fork(
        self,
        store: Store,
        reference: str,
        update: Mapping[str, Any] | None,
        run_id: str | None,
        add: bool,
    ) -> Checkpoint:
        """The forked run's first checkpoint: the reference resolved, the edits checked (one
        validation for the Python API, the CLI and the inspector)."""
        from ..edits import apply_field_edits
        from ..store.contract.lookup import resolve_checkpoint

        checkpoint_id = resolve_checkpoint(store, reference)
        if update:
            source = store.get(checkpoint_id)
            update = apply_field_edits(source.state, update, add=add, state_type=self.state_type)
        return store.fork(checkpoint_id, new_run_id=run_id, update=update, workflow=self.name)

    @staticmethod
    def _in_run(store: Store, run_id: str, reference: str) -> str:
        """The id of a checkpoint given by its id or by a short form within ``run_id``."""
        from ..store.contract.lookup import find_in_run

        try:
            return store.summary(reference).id
        except CheckpointNotFoundError:
            return find_in_run(store, run_id, reference)

    def enqueue(
        self,
        store: Store,
        input: Any = None,
        *,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> Run:
        """Queue a run for a worker (``pitstop worker``); returns at once.

        Enqueuing ``run_id`` again with the same input returns that run (whatever became of
        it); other input or another workflow raises :class:`~pitstop.RunExistsError`.
        With tracing on, the current trace context is kept with the run: the worker's span
        of it links to the enqueuing trace.
        """
        traceparent = tracing.current_traceparent()
        if traceparent is not None:
            metadata = {**(metadata or {}), tracing.TRACE_KEY: {"enqueued": traceparent}}
        try:
            run_id, _, _ = self._new_run(
                store, input, run_id, RunStatus.QUEUED, metadata, priority, owner=None
            )
        except StoreError as exc:
            if run_id is None:
                raise
            log.warning("enqueue of run %r: %s; checking what was written", run_id, exc)
            try:
                self._new_run(store, input, run_id, RunStatus.QUEUED, metadata, priority, None)
            except StoreError:
                raise exc from None
        return store.get_run(run_id)

    # -- asyncio twins --------------------------------------------------------------------------

    async def astart(
        self,
        store: Store,
        input: Any = None,
        *,
        run_id: str | None = None,
        policy: CheckpointPolicy | None = None,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> RunResult:
        """:meth:`start` for asyncio: ``async def`` steps are awaited, store I/O leaves the loop."""
        import asyncio

        execution, done, status = await asyncio.to_thread(
            self._start, store, input, run_id, policy, metadata, priority
        )
        if execution is None:
            assert done is not None
            return done
        result = await drive_async(execution.run(status))
        return await asyncio.to_thread(self._finish, store, result)

    async def aresume(
        self,
        store: Store,
        run_id: str,
        *,
        from_checkpoint: str | None = None,
        policy: CheckpointPolicy | None = None,
        lease: Lease | None = None,
        retry_failed: Retry | None = None,
    ) -> RunResult:
        """:meth:`resume` for asyncio."""
        import asyncio

        execution, done, status = await asyncio.to_thread(
            self._resume, store, run_id, from_checkpoint, policy, lease
        )
        if execution is None:
            assert done is not None
            return done
        execution.retry_failed = retry_failed
        result = await drive_async(execution.run(status))
        return await asyncio.to_thread(self._finish, store, result)

    async def afork(
        self,
        store: Store,
        checkpoint_id: str,
        *,
        update: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        policy: CheckpointPolicy | None = None,
        add: bool = False,
    ) -> RunResult:
        """:meth:`fork` for asyncio."""
        import asyncio

        ckpt = await asyncio.to_thread(self._fork, store, checkpoint_id, update, run_id, add)
        return await self.aresume(store, ckpt.run_id, policy=policy)


def _input_schemas(declared: Any, waits: tuple[str, ...]) -> dict[str, Any]:
    """``input_schema=`` as {input name: type}, checked."""
    from ..schemas import is_schema_type

    if declared is None:
        return {}
    if not waits:
        raise TypeError("input_schema= describes the inputs of wait_for=; this step waits "
                        "for none")
    chosen = dict(declared) if isinstance(declared, Mapping) else dict.fromkeys(waits, declared)
    for name, tp in chosen.items():
        if name not in waits:
            raise TypeError(f"input_schema names {name!r}, which is not in wait_for={waits}")
        if not is_schema_type(tp):
            raise TypeError(f"input_schema for {name!r} must be a pydantic model, a TypedDict "
                            f"or a dataclass, not {tp!r}")
        default_registry.register_annotations(tp)  # sent as an instance, it is stored as one
    return chosen


def send(store: Store, run_id: str, name: str, payload: Any) -> Input:
    """Deliver input ``name`` to a waiting run, durably. The next resume continues with it.

    Raises :class:`~pitstop.InputError` (storing nothing) if the run has finished or does not
    wait for ``name``. With tracing on, the current trace context is kept with the run (its
    metadata), and the resumed run's span links to it.
    """
    delivered = store.send(run_id, name, payload)
    traceparent = tracing.current_traceparent()
    if traceparent is not None:
        traced = store.get_run(run_id).metadata.get(tracing.TRACE_KEY) or {}
        inputs = {**(traced.get("inputs") or {}), name: traceparent}
        try:
            store.update_run(run_id, metadata={tracing.TRACE_KEY: {**traced, "inputs": inputs}})
        except PitstopError as exc:  # a worker took the run at once: the link is lost, no more
            log.debug("send to run %r: trace context not kept: %s", run_id, exc)
    return delivered


__all__ = ["InputError", "StepSpec", "Workflow", "send"]
