"""How often to checkpoint, how to retry, and what a step may return to route the run."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from ..errors import MapItemError

WorkflowDurability = Literal["full", "normal", "background"]
"""``full``: every checkpoint is on stable storage before the next step starts.
``normal``: every checkpoint survives a crash of the process (not necessarily power loss).
``background``: checkpoints are serialised at once but written by a background thread with a
bounded queue; flushed before any wait, effect record, failure, completion and at exit. A
process killed meanwhile loses the queued checkpoints (at most the queue size), and the run
resumes from the last written one, re-running the steps after it."""


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When the runtime writes a checkpoint after a step.

    Whatever the policy, a checkpoint is also written before a run waits, when a step
    fails, when the run finishes, after a milestone step and on ``ctx.checkpoint()``. Steps
    after the last checkpoint run again after a crash (their ``ctx.effect`` calls do not).
    """

    every: int = 1
    """After every N-th step."""
    seconds: float | None = None
    """Or: after a step once this many seconds have passed since the last checkpoint."""
    milestones_only: bool = False
    """Or: only after steps marked ``milestone=True`` (and the mandatory points above)."""
    overhead: float | None = None
    """Automatic interval (:meth:`auto`): the share of time checkpoints may take."""
    mtbf: float | None = None
    """Automatic interval: mean seconds between failures, for the Young/Daly optimum."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("every must be >= 1")
        if self.seconds is not None and self.seconds < 0:
            raise ValueError("seconds must be >= 0")
        if self.overhead is not None and not 0 < self.overhead < 1:
            raise ValueError("overhead must be between 0 and 1 (0.05 is 5%)")
        if self.mtbf is not None and self.mtbf <= 0:
            raise ValueError("mtbf must be > 0 seconds")

    @classmethod
    def auto(
        cls, overhead: float = 0.05, mtbf: float | timedelta | None = None
    ) -> CheckpointPolicy:
        """Pick the interval from measurements: checkpoints take at most ``overhead`` of the
        time (0.05: 5%).

        The policy measures what each checkpoint it takes costs the caller (the time the
        loop or step was blocked: with asynchronous saves, only the snapshot) and checkpoints
        again once enough work has passed that the cost stays within the budget: an interval
        of ``cost * (1 - overhead) / overhead`` seconds. Given the mean time between failures
        ``mtbf``, it uses the Young/Daly optimum ``sqrt(2 * cost * mtbf)`` instead, which
        minimises the expected time lost to checkpoints plus rework, but never checkpoints
        more often than the budget allows. The first chance after the start (or a resume)
        takes a checkpoint, which is how the cost is first measured.
        """
        seconds = mtbf.total_seconds() if isinstance(mtbf, timedelta) else mtbf
        return cls(every=_NEVER, overhead=overhead, mtbf=seconds)

    def schedule(self, clock: Callable[[], float] = time.monotonic) -> Schedule:
        """A fresh decision-maker for one run (an automatic policy's measurements are per
        run). ``clock`` is for tests."""
        return Schedule(self, clock)

    @classmethod
    def every_seconds(cls, seconds: float | timedelta) -> CheckpointPolicy:
        """Checkpoint after the first step ending ``seconds`` or more after the last one."""
        s = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        return cls(every=_NEVER, seconds=s)

    @classmethod
    def milestones(cls) -> CheckpointPolicy:
        """Checkpoint only where it is always done: milestones, waits, failures, completion."""
        return cls(milestones_only=True)

    def due(self, *, steps_since: int, seconds_since: float, milestone: bool) -> bool:
        """Whether a checkpoint is due after a step, given steps and seconds since the last."""
        if milestone:
            return True
        if self.milestones_only:
            return False
        if self.seconds is not None and seconds_since >= self.seconds:
            return True
        return steps_since >= self.every


_NEVER = 1_000_000_000  # "every" of a policy that counts seconds, not steps


class Schedule:
    """When a policy's next checkpoint is due, for one run: asked once per step or loop
    iteration (:meth:`due`), told what each checkpoint cost (:meth:`taken`)."""

    __slots__ = ("_clock", "_last_call", "_since", "cost", "policy", "step_time", "steps_since")

    def __init__(self, policy: CheckpointPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        self._since = self._last_call = clock()
        self.steps_since = 0
        self.cost: float | None = None
        """Measured seconds a checkpoint blocks the caller (a moving average)."""
        self.step_time: float | None = None
        """Measured seconds between calls of :meth:`due` (a moving average)."""

    @property
    def interval(self) -> float | None:
        """Seconds of work between checkpoints an automatic policy aims at (None: not
        automatic, or no cost measured yet)."""
        budget, cost = self.policy.overhead, self.cost
        if budget is None or cost is None:
            return None
        interval = cost * (1 - budget) / budget
        if self.policy.mtbf is not None:
            interval = max(interval, math.sqrt(2 * cost * self.policy.mtbf))
        return interval

    def due(self, *, milestone: bool = False) -> bool:
        """Whether to checkpoint now (one call per step or iteration; counts it)."""
        now = self._clock()
        step, self._last_call = now - self._last_call, now
        self.step_time = step if self.step_time is None else 0.9 * self.step_time + 0.1 * step
        self.steps_since += 1
        elapsed = now - self._since
        if self.policy.overhead is None:
            return self.policy.due(
                steps_since=self.steps_since, seconds_since=elapsed, milestone=milestone
            )
        interval = self.interval
        if milestone or interval is None:
            return True
        # Due at the call nearest the interval: half a step early rather than a step late.
        return elapsed + self.step_time / 2 >= interval

    def taken(self, cost: float | None = None) -> None:
        """A checkpoint was just written; it blocked the caller ``cost`` seconds. A cost of
        a checkpoint the policy did not ask for (a forced one) may be left out."""
        if cost is not None:
            self.cost = cost if self.cost is None else 0.7 * self.cost + 0.3 * cost
        self._since = self._last_call = self._clock()
        self.steps_since = 0


@dataclass(frozen=True, slots=True)
class Retry:
    """Retry a failing step: ``attempts`` in all, waiting ``backoff * multiplier**n`` between.

    Attempt counts are stored in checkpoints, so a crash does not reset them.
    """

    attempts: int = 1
    backoff: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_delay, self.backoff * self.multiplier ** (attempt - 1))
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Whether a step that raised ``exc`` on attempt ``attempt`` (first: 1) runs again."""
        if attempt >= self.attempts:
            return False
        # A ctx.map item's failure is judged by the item's own exception.
        return isinstance(exc, self.on) or (
            isinstance(exc, MapItemError) and isinstance(exc.error, self.on)
        )


@dataclass(frozen=True, slots=True)
class Goto:
    """Returned by a step: apply ``update``, then continue at step ``target``."""

    target: str
    update: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """Returned by a step: apply ``update`` and end the run now, as completed."""

    update: Mapping[str, Any] | None = None


def goto(step: str, update: Mapping[str, Any] | None = None) -> Goto:
    """Route the run: ``return pitstop.goto("review", {"attempt": 2})`` (branches, loops)."""
    return Goto(step, update)


def finish(update: Mapping[str, Any] | None = None) -> Finish:
    """End the run early as completed, after applying ``update``."""
    return Finish(update)


@dataclass(frozen=True, slots=True)
class StepOptions:
    """What ``@wf.step(...)`` was told about one step."""

    wait_for: tuple[str, ...] = ()
    timeout: float | None = None
    retry: Retry | None = None
    milestone: bool = False
    checkpoint: bool | None = None
    tags: tuple[str, ...] = field(default=())
    show: tuple[str, ...] = field(default=())
    """State fields a person deciding the step's input should see (the inspector's inbox)."""
    cache: Any = None
    """The step's :class:`~pitstop.CachePolicy` (None: never served from the cache)."""


__all__ = [
    "CheckpointPolicy",
    "Finish",
    "Goto",
    "Retry",
    "Schedule",
    "StepOptions",
    "WorkflowDurability",
    "finish",
    "goto",
]
