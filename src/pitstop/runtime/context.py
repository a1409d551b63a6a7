"""``ctx``: what a step can ask of the runtime while it runs."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import LeaseLostError, StoreError, StoreSchemaError, UnsupportedStoreError
from ..logfmt import kv
from .cache import Renewal, Waiting, call_key, claim_owner
from .iteration import Position, Resumable
from .policies import Retry

if TYPE_CHECKING:
    from .engine import Execution

log = logging.getLogger("pitstop.step")
_CALL_WAIT = 600.0  # how long ctx.cached waits for another run computing the same key
_CALL_LEASE = 30.0  # how long a claim outlives a process that died computing it
T = TypeVar("T")

STORE_RETRY = Retry(attempts=6, backoff=0.25, multiplier=2.0, max_delay=4.0)
"""How an effect's store calls ride out a store that is briefly away (a network blip, a
server restart): tried again after 0.25, 0.5, 1, 2 and 4 seconds before the step fails.
Both calls are safe to repeat: a lookup, and a record whose first result wins."""


def _transient(exc: StoreError) -> bool:
    """A store error that waiting may cure (not a bad URL or a schema of another version)."""
    return not isinstance(exc, UnsupportedStoreError | StoreSchemaError)


class Suspend(BaseException):
    """Raised by ``ctx.sleep*`` to park the run until a time. A BaseException so that a
    step's own ``except Exception`` does not swallow it."""

    def __init__(self, wake_at: float) -> None:
        self.wake_at = wake_at


class StepContext:
    """Passed to a step as its second argument.

    Effects and timers are keyed by the run's branch, the step's position in the run and
    the name given, so a step re-executed after a crash finds what its earlier execution
    recorded, while a new branch (``resume(from_checkpoint=...)``) starts afresh.
    """

    def __init__(
        self,
        execution: Execution,
        step: str,
        attempt: int,
        inputs: dict[str, Any],
        timed_out: bool,
    ) -> None:
        self._execution = execution
        self.step = step
        self.attempt = attempt
        self.inputs = inputs
        self.timed_out = timed_out
        self._effects: set[str] = set()
        self._timers = 0
        self._maps: set[str] = set()
        self._children = 0

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that adds the run id and step to each record."""
        return logging.LoggerAdapter(log, {"run_id": self._execution.run_id, "step": self.step})

    @property
    def run_id(self) -> str:
        """The id of the run this step belongs to."""
        return self._execution.run_id

    @property
    def workflow(self) -> str:
        """The name of the run's workflow."""
        return self._execution.wf.name

    @property
    def store(self) -> Any:
        """The store the run is checkpointed to."""
        return self._execution.store

    @property
    def checkpoint_id(self) -> str | None:
        """The checkpoint this step execution started from."""
        return self._execution.parent_id

    def input(self, name: str, default: Any = None) -> Any:
        """The payload delivered for ``name`` (``default`` if it timed out)."""
        return self.inputs.get(name, default)

    # -- effects ---------------------------------------------------------------------------------

    def idempotency_key(self, name: str) -> str:
        """A key that is the same every time this step execution runs this effect: give it
        to external APIs (payments, e-mail) so they drop a repeated request."""
        run = self._execution
        return f"{run.run_id}:{run.branch}:{run.position}:{self.step}:{name}"

    def _claim(self, name: str) -> str:
        if name in self._effects:
            raise ValueError(
                f"run {self.run_id!r}, step {self.step!r}: effect {name!r} used twice in one "
                "step; give each effect its own name (e.g. f'charge-{i}')"
            )
        self._effects.add(name)
        self._execution.flush()  # the record must not refer to a checkpoint still in a queue
        return self.idempotency_key(name)

    def effect(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per run, step execution and name; record its result.

        If this step runs again (after a crash, a retry or a resume), the recorded result is
        returned and ``fn`` is not called. ``fn`` receives ``idempotency_key=`` if it takes
        such a parameter. The one window where ``fn`` can run twice: it returned, and the
        process died before its result was recorded, or its worker was cut off and lost the
        run's lease while ``fn`` ran (``fn`` is never started once the lease may have lapsed:
        :class:`~pitstop.LeaseLostError`); pass the idempotency key on to the external system
        to close it.
        """
        key = self._claim(name)
        run_id = self._execution.run_id
        if self._execution.tracer is None:
            return self._effect(key, name, fn, args, kwargs)
        from ..observe import tracing

        with tracing.span("pitstop.effect", {"pitstop.run.id": run_id,
                                             "pitstop.step.name": self.step,
                                             "pitstop.effect.name": name}) as span:
            replayed: list[bool] = []
            result = self._effect(key, name, fn, args, kwargs, replayed)
            span.set_attribute("pitstop.effect.replayed", bool(replayed))
            return result

    def _effect(self, key: str, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any], replayed: list[bool] | None = None) -> Any:
        store, run_id = self._execution.store, self._execution.run_id
        found, value = self._patiently(name, lambda: store.get_effect(run_id, key))
        if found:
            if replayed is not None:
                replayed.append(True)
            self._count_effect("replayed")
            return value
        self._check_lease(name)
        if _takes_key(fn):
            kwargs["idempotency_key"] = key
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            raise TypeError(f"effect {name!r}: use `await ctx.aeffect(...)` for async functions")
        parent = self._execution.parent_id
        first, recorded = self._patiently(
            name, lambda: store.record_effect_first(run_id, key, result, checkpoint_id=parent)
        )
        self._count_effect("run" if first else "repeated")
        return recorded

    async def aeffect(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`effect` for async steps; ``fn`` may be sync or async."""
        key = self._claim(name)
        store, run_id = self._execution.store, self._execution.run_id
        found, value = await self._apatiently(
            name, lambda: asyncio.to_thread(store.get_effect, run_id, key)
        )
        if found:
            self._count_effect("replayed")
            return value
        self._check_lease(name)
        if _takes_key(fn):
            kwargs["idempotency_key"] = key
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        parent = self._execution.parent_id
        first, recorded = await self._apatiently(
            name,
            lambda: asyncio.to_thread(
                store.record_effect_first, run_id, key, result, checkpoint_id=parent
            ),
        )
        self._count_effect("run" if first else "repeated")
        return recorded

    def _count_effect(self, outcome: str) -> None:
        counting = self._execution.metrics
        if counting is not None:
            counting.effect(outcome)

    def _store_blip(self, name: str, exc: StoreError, attempt: int) -> float:
        """The delay before trying an effect's store call again; re-raises when out of tries."""
        if not _transient(exc) or attempt >= STORE_RETRY.attempts:
            raise exc
        delay = STORE_RETRY.delay(attempt)
        self.log.warning("effect %r: %s; trying the store again in %.2fs", name, exc, delay)
        return delay

    def _check_lease(self, name: str) -> None:
        """Refuse to start an effect's function once this process cannot be sure it still
        holds the run (cut off from the store past the lease's TTL): another worker may have
        taken the run and be running the same effect. The function could still outlive the
        lease once started; the idempotency key closes that."""
        execution = self._execution
        held = getattr(execution, "held", None)
        if held is not None and held.expired():
            log.warning(kv(event="lease-expired", run=execution.run_id, step=self.step,
                           effect=name),
                        extra={"run_id": execution.run_id, "step": self.step})
            raise LeaseLostError(execution.run_id, owner=execution.lease.owner,
                                 token=execution.lease.token, current_token=None)

    def _patiently(self, name: str, call: Callable[[], T]) -> T:
        attempt = 1
        while True:
            try:
                return call()
            except StoreError as exc:
                time.sleep(self._store_blip(name, exc, attempt))
            attempt += 1

    async def _apatiently(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        attempt = 1
        while True:
            try:
                return await call()
            except StoreError as exc:
                await asyncio.sleep(self._store_blip(name, exc, attempt))
            attempt += 1

    # -- results cached across runs --------------------------------------------------------

    def cached(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        ttl: float | timedelta | None = None,
        version: str | None = None,
        key: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)``, or its result cached by any run for the same ``name``,
        arguments (hashed canonically) and code version (a hash of ``fn``'s source, or
        ``version``); ``key(*args, **kwargs)`` replaces the arguments in the key. ``ttl``
        (seconds) expires the result. While another run computes the same key this call waits
        for it (up to 10 minutes) instead of computing it again; a call that raises caches
        nothing."""
        lookup = self._cache_lookup(name, fn, args, kwargs, version, key)
        waiting = Waiting(_CALL_WAIT)
        store = self._execution.store
        while True:
            hit = store.cache_get(lookup)
            if hit is not None:
                return self._served(name, hit)  # type: ignore[no-any-return]
            owner = claim_owner()
            if store.cache_claim(lookup, name, owner, lease=_CALL_LEASE) == "claimed":
                break
            delay = waiting.next_delay()
            if delay is None:
                owner = ""
                break
            time.sleep(delay)
        self._count_lookup(hit=False)
        renewal = Renewal(store, lookup, owner, _CALL_LEASE) if owner else None
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                raise TypeError(f"cached {name!r}: use `await ctx.acached(...)` for async "
                                "functions")
            self._store_cached(lookup, name, result, owner, ttl)
        except BaseException:
            if owner:
                store.cache_abandon(lookup, owner)
            raise
        finally:
            if renewal is not None:
                renewal.stop()
        return result

    async def acached(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        ttl: float | timedelta | None = None,
        version: str | None = None,
        key: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """:meth:`cached` for async steps; ``fn`` may be sync or async."""
        lookup = self._cache_lookup(name, fn, args, kwargs, version, key)
        waiting = Waiting(_CALL_WAIT)
        store = self._execution.store
        while True:
            hit = await asyncio.to_thread(store.cache_get, lookup)
            if hit is not None:
                return self._served(name, hit)
            owner = claim_owner()
            outcome = await asyncio.to_thread(
                store.cache_claim, lookup, name, owner, lease=_CALL_LEASE)
            if outcome == "claimed":
                break
            delay = waiting.next_delay()
            if delay is None:
                owner = ""
                break
            await asyncio.sleep(delay)
        self._count_lookup(hit=False)
        renewal = Renewal(store, lookup, owner, _CALL_LEASE) if owner else None
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            await asyncio.to_thread(self._store_cached, lookup, name, result, owner, ttl)
        except BaseException:
            if owner:
                await asyncio.to_thread(store.cache_abandon, lookup, owner)
            raise
        finally:
            if renewal is not None:
                renewal.stop()
        return result

    def _cache_lookup(
        self, name: str, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any],
        version: str | None, key: Callable[..., Any] | None,
    ) -> str:
        if not isinstance(name, str) or not name:
            raise TypeError(f"run {self.run_id!r}, step {self.step!r}: a cached call's name "
                            f"must be a non-empty string, not {name!r}")
        return call_key(name, fn, args, kwargs, version=version, key=key,
                        run_id=self.run_id, step=self.step)

    def _served(self, name: str, hit: Any) -> Any:
        self._execution.cached_from.append({"call": name, "step": self.step,
                                            "run": hit.entry.run_id})
        self._count_lookup(hit=True)
        return hit.values["value"]

    def _count_lookup(self, *, hit: bool) -> None:
        counting = self._execution.metrics
        if counting is not None:
            counting.metrics.cache_lookup("call", hit)

    def _store_cached(
        self, lookup: str, name: str, result: Any, owner: str, ttl: float | timedelta | None
    ) -> None:
        seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
        self._execution.store.cache_put(
            lookup, name, {"value": result}, owner=owner or None, ttl=seconds,
            run_id=self.run_id, checkpoint_id=self._execution.parent_id,
        )

    # -- parallel work -----------------------------------------------------------------------

    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        /,
        *,
        concurrency: int = 8,
        name: str | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """``[fn(item) for item in items]``, ``concurrency`` items at a time; results in the
        order of ``items``.

        Sync functions run in a pool of ``concurrency`` threads, async ones as tasks on an
        event loop. Each item's result is recorded as soon as it completes (keyed by the
        map's ``name`` — the function's name by default — and the item's index), so when
        this step runs again after a crash or a retry only the items without a result run:
        at most the ``concurrency`` items in flight run again, and for sync items quicker
        than 20 ms also those that started while earlier results were being written (about
        20 ms of their work, at most 256 items; results finishing together share a write).
        An item that raises fails the step with :class:`~pitstop.MapItemError` naming its
        index once the items in flight finished (their results are kept); with
        ``return_exceptions=True`` the exception is that item's result instead (and the
        item runs again if the step does). Results must be serialisable like state.
        """
        from .parallel import MapPlan, is_async_callable, run_map

        if is_async_callable(self._execution.wf.steps[self.step].fn):
            raise TypeError(
                f"run {self.run_id!r}, step {self.step!r}: use `await ctx.amap(...)` in an "
                "async step"
            )
        plan = MapPlan(self, self._execution, fn, items, concurrency=concurrency,
                       name=name, return_exceptions=return_exceptions)
        return run_map(plan)

    async def amap(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        /,
        *,
        concurrency: int = 8,
        name: str | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """:meth:`map` for async steps: async functions run as tasks on this event loop,
        sync ones in a pool of ``concurrency`` threads."""
        from .parallel import MapPlan, run_amap

        plan = MapPlan(self, self._execution, fn, items, concurrency=concurrency,
                       name=name, return_exceptions=return_exceptions)
        return await run_amap(plan)

    def _map_name(self, name: str | None, fn: Callable[..., Any]) -> str:
        """The map's name in its records: the one given (unique in the step), or the
        function's name, numbered from the second map of that function on."""
        if name is not None:
            if not isinstance(name, str) or not name:
                raise TypeError(f"run {self.run_id!r}, step {self.step!r}: a map's name must "
                                f"be a non-empty string, not {name!r}")
            if name in self._maps:
                raise ValueError(
                    f"run {self.run_id!r}, step {self.step!r}: map {name!r} used twice in one "
                    "step; give each map its own name"
                )
            self._maps.add(name)
            return name
        base = getattr(fn, "__name__", None) or type(fn).__name__
        candidate, n = base, 1
        while candidate in self._maps:
            n += 1
            candidate = f"{base}#{n}"
        self._maps.add(candidate)
        return candidate

    # -- child runs ---------------------------------------------------------------------------

    def run_child(self, workflow: Any, input: Any = None, *, run_id: str | None = None) -> Any:
        """Start a run of ``workflow`` (a :class:`~pitstop.Workflow`, or under a worker the
        name of one it runs) as a child of this run; return its
        :class:`~pitstop.ChildResult` once it completed.

        Outside a worker the child runs here, now; under a worker it is queued for the
        pool. If it does not finish at once (it waits for an input, a timer, a worker),
        this run checkpoints as ``waiting`` for it, holding nothing, and this step runs
        again when the child finished (in any process: a worker, or ``resume``), then
        returning at once. A failed or cancelled child raises
        :class:`~pitstop.ChildFailedError` here. ``run_id`` names the child (by default
        it is derived from this run's id and the step's position); a run of that id that
        is not this step's child raises :class:`~pitstop.ChildRunError`, starting nothing.
        """
        return self.run_children([(workflow, input, run_id)] if run_id is not None
                                 else [(workflow, input)], _single=True)[0]

    def run_children(self, children: Iterable[Any], /, *, _single: bool = False) -> list[Any]:
        """:meth:`run_child` for several children at once: ``[(workflow, input), ...]``
        (or ``(workflow, input, run_id)``), all started before any is waited for; returns
        their :class:`~pitstop.ChildResult` s in order once all completed. If some failed,
        :class:`~pitstop.ChildFailedError` names the first (its ``results`` has all)."""
        from .children import run_children
        from .parallel import is_async_callable

        if is_async_callable(self._execution.wf.steps[self.step].fn):
            raise TypeError(
                f"run {self.run_id!r}, step {self.step!r}: use `await ctx.arun_child(...)` / "
                "`await ctx.arun_children(...)` in an async step"
            )
        if self._execution.tracer is None:
            return run_children(self, self._execution, children, single=_single)
        from ..observe import tracing

        with tracing.span("pitstop.children", {"pitstop.run.id": self.run_id,
                                               "pitstop.step.name": self.step}):
            return run_children(self, self._execution, children, single=_single)

    async def arun_child(
        self, workflow: Any, input: Any = None, *, run_id: str | None = None
    ) -> Any:
        """:meth:`run_child` for async steps (children run here run on this loop)."""
        specs = [(workflow, input, run_id)] if run_id is not None else [(workflow, input)]
        from .children import arun_children

        return (await arun_children(self, self._execution, specs, single=True))[0]

    async def arun_children(self, children: Iterable[Any], /) -> list[Any]:
        """:meth:`run_children` for async steps."""
        from .children import arun_children

        return await arun_children(self, self._execution, children, single=False)

    def _next_child(self) -> int:
        """The number of the next child this step execution starts (0, 1, ...)."""
        n = self._children
        self._children += 1
        return n

    # -- resumable iteration ----------------------------------------------------------------------

    def iterate(
        self,
        iterable: Iterable[T],
        *,
        every: int | None = None,
        seconds: float | None = None,
        state: Any = None,
        name: str = "items",
        total: int | None = None,
    ) -> Resumable[T]:
        """Yield the items of ``iterable``, recording the position (and ``state``) every
        ``every`` items or ``seconds`` seconds (default: every second); if this step runs
        again (a crash, a retry), continue after the last recorded position.

        ``state`` is the caller's running value (a total, a cursor); it is recorded with the
        position and, on a resume, comes back as the iteration's ``.state``, so keep it
        there: ``it = ctx.iterate(rows, every=1000, state={"n": 0})`` then
        ``it.state["n"] += 1`` in the loop. Sequences and ranges are resumed by index,
        files by offset, other iterables by skipping the items already done. Items after the
        last recorded position run again after a crash; their ``ctx.effect`` calls return
        the recorded results instead of repeating the effect. ``total`` (default: the
        iterable's ``len()`` if it has one) is what progress displays count towards
        (``pitstop show RUN``, the inspector: "32,000 / 300,000" and a rate).
        """
        x = self._execution
        key = self.idempotency_key(f"iterate:{name}")
        self._claim(f"iterate:{name}")
        found, saved = x.store.get_effect(x.run_id, key)

        def record(position: Position) -> None:
            x.store.record_effects(
                x.run_id, {key: {"position": position, "state": iteration.state}},
                checkpoint_id=x.parent_id, replace=True,
            )

        iteration: Resumable[T] = Resumable(
            iterable,
            start=saved["position"] if found else None,
            every=every,
            seconds=seconds if every is not None or seconds is not None else 1.0,
            due=None,
            record=record,
            done=record,
            total=total,
        )
        iteration.state = saved["state"] if found else state
        return iteration

    # -- checkpoints and timers -------------------------------------------------------------------

    def checkpoint(self, *, tag: str | None = None) -> str:
        """Write a checkpoint now, before something risky: the state as it was when this step
        started (everything earlier steps did is made durable); after a crash the run resumes
        by running this step again. Returns the checkpoint id."""
        return self._execution.force_checkpoint(self.step, tag=tag)

    def sleep_until(self, when: datetime | float) -> None:
        """Park the run until ``when`` without holding a process: the run checkpoints as
        ``waiting``, returns, and whatever resumes due runs continues this step at that time
        (this call then returns at once)."""
        target = when.timestamp() if isinstance(when, datetime) else float(when)
        self._timer(lambda: target)

    def sleep(self, duration: float | timedelta) -> None:
        """:meth:`sleep_until` now + ``duration``. The wake time is fixed on the first call, so
        re-running the step does not push it back."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        self._timer(lambda: time.time() + seconds)

    def _timer(self, target: Callable[[], float]) -> None:
        key = f"{self._execution.position}:{self.step}:{self._timers}"
        self._timers += 1
        wake_at = self._execution.timers.setdefault(key, target())
        if time.time() < wake_at:
            raise Suspend(wake_at)


_TAKES_KEY: dict[object, bool] = {}  # by code object: one inspect per function, not per call


def _takes_key(fn: Callable[..., Any]) -> bool:
    func = getattr(fn, "__func__", fn)
    # A decorator's wrapper shares one code object between every function it wraps, and the
    # signature comes from __wrapped__: such functions are inspected each time.
    code = None if hasattr(func, "__wrapped__") else getattr(func, "__code__", None)
    if code is None:
        return _inspect_takes_key(fn)
    known = _TAKES_KEY.get(code)
    if known is None:
        if len(_TAKES_KEY) > 4096:
            _TAKES_KEY.clear()
        known = _TAKES_KEY[code] = _inspect_takes_key(fn)
    return known


def _inspect_takes_key(fn: Callable[..., Any]) -> bool:
    try:
        return "idempotency_key" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


__all__ = ["StepContext", "Suspend"]
