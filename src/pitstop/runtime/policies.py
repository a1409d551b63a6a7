"""How often to checkpoint, how to retry, and what a step may return to route the run."""

from __future__ import annotations

import random
from collections.abc import Mapping
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

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("every must be >= 1")
        if self.seconds is not None and self.seconds < 0:
            raise ValueError("seconds must be >= 0")

    @classmethod
    def every_step(cls) -> CheckpointPolicy:
        return cls()

    @classmethod
    def every_n_steps(cls, n: int) -> CheckpointPolicy:
        return cls(every=n)

    @classmethod
    def every_seconds(cls, seconds: float | timedelta) -> CheckpointPolicy:
        s = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        return cls(every=1_000_000_000, seconds=s)

    @classmethod
    def milestones(cls) -> CheckpointPolicy:
        return cls(milestones_only=True)

    def due(self, *, steps_since: int, seconds_since: float, milestone: bool) -> bool:
        if milestone:
            return True
        if self.milestones_only:
            return False
        if self.seconds is not None and seconds_since >= self.seconds:
            return True
        return steps_since >= self.every


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


__all__ = [
    "CheckpointPolicy",
    "Finish",
    "Goto",
    "Retry",
    "StepOptions",
    "WorkflowDurability",
    "finish",
    "goto",
]
