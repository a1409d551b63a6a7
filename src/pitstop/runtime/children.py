"""Child runs: ``ctx.run_child`` / ``ctx.run_children`` start runs linked to the step's run.

A child is an ordinary run (queued, claimed, checkpointed, resumed like any other) whose row
names its parent (``parent_run``) and whose metadata names the parent's run, checkpoint and
step. Its id is fixed by the parent's position (run, branch, step position, the call's
order in the step), so a step that runs again after a crash, a retry or a wake-up finds the
children its earlier execution started instead of starting them again.

Outside a worker the children run right here, in this process (several at once on
threads); under a worker they are queued, so the pool's workers (any process) take them.
Children still unfinished after that make the step *wait*: the parent checkpoints as
``waiting`` for the inputs ``child:<id>`` and gives everything up. The transaction that
finishes the last child delivers its input and makes the parent runnable (on PostgreSQL a
NOTIFY wakes a worker); the step then runs again, finds every child finished, and continues
with their final states. A failed or cancelled child raises :class:`~pitstop.ChildFailedError`
in the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ChildFailedError, ChildRunError, RunBusyError, RunExistsError
from ..errors import RunNotFoundError as _RunNotFound
from ..model import Checkpoint, Run, RunStatus
from ..store import RunControl, SaveOptions, SaveRequest
from ..store.engine.children import child_input

if TYPE_CHECKING:
    from .context import StepContext
    from .engine import RunResult
    from .host import StepHost
    from .workflow import Workflow

_SERVING: ContextVar[Mapping[str, Workflow] | None] = ContextVar("pitstop_serving", default=None)
"""The workflows of the worker executing this thread's run (None: not a worker)."""
_GRACE: ContextVar[float] = ContextVar("pitstop_child_grace", default=0.0)
"""How long that worker's parents wait in place for children they just queued."""

CHILD_GRACE = 0.25
"""A worker's default ``child_grace``: seconds a step that just queued its children waits,
holding its run, for them to finish before the run checkpoints as waiting. Children that
other worker slots (or processes) finish in that time let the step continue in place: no
waiting checkpoint, no wake-up, no second execution of the step."""

INLINE_CONCURRENCY = 8
"""Children run at once in the parent's process when no worker runs the parent."""


@contextlib.contextmanager
def serving(workflows: Mapping[str, Workflow], grace: float = CHILD_GRACE) -> Iterator[None]:
    """Mark the runs executed inside as a worker's: their children are queued for the pool,
    and waited for in place for up to ``grace`` seconds."""
    token = _SERVING.set(workflows)
    grace_token = _GRACE.set(grace)
    try:
        yield
    finally:
        _GRACE.reset(grace_token)
        _SERVING.reset(token)


class WaitForChildren(BaseException):
    """Raised in a step whose children are not all finished: the run waits for them. A
    BaseException so that a step's own ``except Exception`` does not swallow it."""

    def __init__(self, names: list[str]) -> None:
        self.names = names


@dataclass(frozen=True)
class ChildResult:
    """Where a child run ended: its status, final state and (if it failed) error."""

    run_id: str
    workflow: str
    status: RunStatus
    state: Any
    """The child's final state, as its workflow's state type."""
    checkpoint_id: str | None
    error: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """True if the child completed."""
        return self.status is RunStatus.COMPLETED


@dataclass
class _Child:
    wf: Workflow
    input: Any
    run_id: str
    explicit: bool
    run: Run | None = None
    result: ChildResult | None = None


class ChildPlan:
    """One ``run_child``/``run_children`` call: its children, found or started."""

    def __init__(
        self, ctx: StepContext, host: StepHost, specs: Iterable[Any], *, single: bool
    ) -> None:
        self.ctx = ctx
        self.host = host
        self.store = host.store
        self.serving = _SERVING.get()
        self.grace = _GRACE.get()
        self.started_now = False
        try:
            pairs = list(specs)
        except TypeError:
            raise self._error(
                f"run_children needs a list of (workflow, input) pairs, got {type(specs).__name__}"
            ) from None
        self.children: list[_Child] = []
        seen: set[str] = set()
        for index, spec in enumerate(pairs):
            wf, value, run_id = self._unpack(spec, index, single)
            n = ctx._next_child()
            child_id = run_id if run_id is not None else _default_id(
                host.run_id, host.branch, host.position, n)
            if child_id in seen or child_id == host.run_id:
                raise self._error(f"child run id {child_id!r} given twice")
            seen.add(child_id)
            try:
                wf.adapter.fields_of(value)
            except (TypeError, ValueError) as exc:
                raise self._error(f"input of child {child_id!r} ({wf.name}): {exc}") from None
            self.children.append(_Child(wf, value, child_id, run_id is not None))

    def _error(self, message: str) -> ChildRunError:
        return ChildRunError(message, run_id=self.ctx.run_id, step=self.ctx.step)

    def _unpack(self, spec: Any, index: int, single: bool) -> tuple[Workflow, Any, str | None]:
        from .workflow import Workflow

        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise self._error(f"run_children item {index} must be (workflow, input) or "
                              f"(workflow, input, run_id), got {type(spec).__name__}")
        wf, value = spec[0], spec[1]
        run_id = spec[2] if len(spec) == 3 else None
        if isinstance(wf, str):
            known = self.serving.get(wf) if self.serving is not None else None
            if known is None:
                raise self._error(
                    f"unknown workflow {wf!r}: "
                    + (f"this worker runs {', '.join(sorted(self.serving))}"
                       if self.serving is not None else "pass the Workflow object")
                )
            wf = known
        if not isinstance(wf, Workflow):
            what = "run_child" if single else f"run_children item {index}"
            raise self._error(f"{what} needs a Workflow, got {type(wf).__name__}")
        if not wf.steps:
            raise self._error(f"workflow {wf.name!r} has no steps")
        if self.serving is not None and wf.name not in self.serving:
            raise self._error(
                f"unknown workflow {wf.name!r}: this worker runs "
                f"{', '.join(sorted(self.serving))}; give the worker the child's workflow too"
            )
        if run_id is not None and (not isinstance(run_id, str) or not run_id
                                   or len(run_id) > 512):
            raise self._error(f"child run_id must be a non-empty string of at most 512 "
                              f"characters, not {run_id!r}")
        return wf, value, run_id

    # -- finding and starting ---------------------------------------------------------------

    def find(self) -> None:
        """Match the children to runs started before; refuse a ``run_id`` another run has.
        Writes nothing."""
        host = self.host
        host.flush()  # the children name the step's checkpoint: it must be written first
        mine = {run.id: run for run in self.store.children(host.run_id)}
        for child in self.children:
            run = mine.get(child.run_id)
            if run is not None:
                if run.workflow != child.wf.name or (run.metadata.get("parent") or {}).get(
                    "key"
                ) != self._key(child):
                    raise self._error(
                        f"run {child.run_id!r} is a child of another step or workflow "
                        f"({run.workflow}); give this child another run_id")
                child.run = run
            elif child.explicit:
                try:
                    other = self.store.get_run(child.run_id)
                except _RunNotFound:
                    continue
                raise self._error(
                    f"run {child.run_id!r} already exists ({other.workflow}, {other.status.value},"
                    " not a child of this run); give the child another run_id"
                )

    def _key(self, child: _Child) -> str:
        return self.ctx.idempotency_key(f"child[{child.run_id}]")

    def start(self) -> None:
        """Queue the children not started yet: each run with its input as its first
        checkpoint, a hundred per transaction (see ``Store.start_children``)."""
        host = self.host
        saves = []
        for child in self.children:
            if child.run is not None:
                continue
            metadata = {"parent": {"run_id": host.run_id,
                                   "checkpoint_id": host.parent_id,
                                   "step": self.ctx.step, "key": self._key(child)}}
            prepared = self.store.prepare_request(SaveRequest(
                child.run_id,
                child.wf.adapter.fields_of(child.input),
                step=0,
                metadata={"source": "input", "status": RunStatus.QUEUED.value,
                          "step_name": None, "next": child.wf.first_step, "completed": []},
                schema_version=child.wf.version,
                control=RunControl(status=RunStatus.QUEUED, workflow=child.wf.name),
                options=SaveOptions(expected_head=None),
            ))
            saves.append((prepared, metadata))
        if not saves:
            return
        try:
            self.store.start_children(host.run_id, saves, lease=host.lease)
        except RunExistsError as exc:  # taken between find() and here
            raise self._error(f"run {exc.run_id!r} already exists; give the child "
                              "another run_id") from None
        host.note_children_started(prepared.run_id for prepared, _ in saves)
        self.started_now = True

    # -- running here -----------------------------------------------------------------------

    def runnable_here(self) -> list[_Child]:
        """Children this process runs: all unfinished ones, unless a worker runs the parent."""
        if self.serving is not None:
            return []
        return [c for c in self.children if c.run is None or not c.run.status.finished]

    def run_one(self, child: _Child) -> None:
        # Busy: another process runs it, and it is waited for like any unfinished child.
        with contextlib.suppress(RunBusyError):
            self._took(child, child.wf.resume(self.store, child.run_id))

    async def arun_one(self, child: _Child, gate: asyncio.Semaphore) -> None:
        async with gate:
            with contextlib.suppress(RunBusyError):
                self._took(child, await child.wf.aresume(self.store, child.run_id))

    def _took(self, child: _Child, result: RunResult) -> None:
        if result.status.finished:
            child.result = ChildResult(child.run_id, child.wf.name, result.status, result.state,
                                       result.checkpoint_id, result.error)

    def run_here(self) -> None:
        todo = self.runnable_here()
        if len(todo) == 1:
            self.run_one(todo[0])
        elif todo:
            with ThreadPoolExecutor(min(INLINE_CONCURRENCY, len(todo)),
                                    thread_name_prefix="pitstop-child") as pool:
                list(pool.map(self.run_one, todo))

    async def arun_here(self) -> None:
        todo = self.runnable_here()
        gate = asyncio.Semaphore(INLINE_CONCURRENCY)
        await asyncio.gather(*(self.arun_one(child, gate) for child in todo))

    # -- the outcome --------------------------------------------------------------------------

    def outcome(self) -> list[ChildResult]:
        """The children's results; raises WaitForChildren while some are unfinished, and
        ChildFailedError for the first that failed."""
        host = self.host
        pending = None
        unfinished: list[str] = []
        self._settle()
        self._load_finished()
        for child in self.children:
            if child.result is None:
                unfinished.append(child_input(child.run_id))
                continue
            if pending is None:
                pending = self.store.inputs(host.run_id)
            delivered = pending.get(child_input(child.run_id))
            if delivered is not None:
                host.note_input_consumed(delivered.name, delivered.id)
        if unfinished:
            raise WaitForChildren(unfinished)
        results = [c.result for c in self.children if c.result is not None]
        for result in results:
            if not result.ok:
                raise ChildFailedError(self.ctx.run_id, self.ctx.step, result.run_id,
                                       result.status.value, result.error, results)
        return results

    def _settle(self) -> None:
        """Under a worker, for children this call just queued: wait up to the worker's
        ``child_grace`` for the pool to finish them, so that quick children let the step go
        on in place instead of checkpointing as waiting and being woken. One count of the
        run's unfinished children per look (an index range per status), at growing
        intervals; when none is left, the children are listed once and loaded together."""
        if self.serving is None or not self.started_now or self.grace <= 0:
            return
        if all(c.result is not None or (c.run is not None and c.run.status.finished)
               for c in self.children):
            return
        run_id = self.host.run_id
        deadline = time.monotonic() + self.grace
        pause = 0.005
        while True:
            counts = self.store.count_runs(parent_run=run_id)
            if not any(n for status, n in counts.items() if not RunStatus(status).finished):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        mine = {run.id: run for run in self.store.children(run_id)}
        for child in self.children:
            if child.result is None and child.run_id in mine:
                child.run = mine[child.run_id]

    def _load_finished(self) -> None:
        """The results of the finished children not run here: their final checkpoints read
        together (``Store.get_many``), not one query per child."""
        todo = [c for c in self.children
                if c.result is None and c.run is not None and c.run.status.finished]
        heads = self.store.get_many(c.run.head_id for c in todo
                                    if c.run is not None and c.run.head_id is not None)
        for child in todo:
            assert child.run is not None
            child.result = self._load(child, child.run, heads.get(child.run.head_id or ""))

    def _load(self, child: _Child, run: Run, ckpt: Checkpoint | None) -> ChildResult:
        state: Any = None
        error = run.metadata.get("error")
        if run.head_id is not None:
            if ckpt is None:  # deleted since the run was read: get() names it
                ckpt = self.store.get(run.head_id)
            fields = dict(ckpt.state)
            if ckpt.schema_version != child.wf.version:
                fields = child.wf._migrate(fields, ckpt)
            state = child.wf.adapter.view(fields)
            error = ckpt.metadata.get("error", error)
        return ChildResult(run.id, child.wf.name, run.status, state, run.head_id, error)


def _default_id(run_id: str, branch: str, position: int, n: int) -> str:
    """A child's id when none is given: the parent's, its step position and the child's
    number in the step (and the branch, off the run's own line)."""
    child_id = f"{run_id}.{position}-{n}"
    if branch != run_id:
        child_id += "." + hashlib.sha256(branch.encode()).hexdigest()[:8]
    if len(child_id) > 512:
        digest = hashlib.sha256(child_id.encode()).hexdigest()[:32]
        child_id = f"{run_id[:400]}.{digest}"
    return child_id


def run_children(
    ctx: StepContext, host: StepHost, specs: Iterable[Any], *, single: bool
) -> list[ChildResult]:
    plan = ChildPlan(ctx, host, specs, single=single)
    plan.find()
    plan.start()
    plan.run_here()
    return plan.outcome()


async def arun_children(
    ctx: StepContext, host: StepHost, specs: Iterable[Any], *, single: bool
) -> list[ChildResult]:
    plan = ChildPlan(ctx, host, specs, single=single)
    await asyncio.to_thread(plan.find)
    await asyncio.to_thread(plan.start)
    await plan.arun_here()
    return await asyncio.to_thread(plan.outcome)


__all__ = ["ChildResult", "WaitForChildren", "arun_children", "run_children", "serving"]
