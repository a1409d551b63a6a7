"""Why a run failed: the failed step, the exception and its traceback, as stored.

A step that raises (after its retries) marks the run ``failed`` and writes a checkpoint whose
metadata holds ``error``: the exception's type and message, the step, the attempt, the
formatted traceback and the time. That checkpoint is the failed run's head, so the answer
is one read of a checkpoint summary (no state is loaded). Checkpoints written before a retry
(``source="retry"``) carry the error of the attempt that was retried, in the same shape.

:class:`RunFailure` is that record for the CLI (``pitstop show``, ``runs``), the web
inspector and any code that reports failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .model import CheckpointSummary, Run, RunStatus

if TYPE_CHECKING:
    from .store import Store


@dataclass(frozen=True, slots=True)
class RunFailure:
    """The error recorded in a checkpoint: what failed, where, and the traceback."""

    run_id: str
    checkpoint_id: str
    step: str | None
    """The step that raised (the one a resume retries)."""
    type: str
    """The exception's class, with its module unless it is a builtin (``ValueError``,
    ``httpx.ReadTimeout``); pitstop's own failures use names like ``UnknownStep``."""
    message: str
    attempt: int | None = None
    """Which attempt of the step raised (1 for the first; retries count up)."""
    traceback: str | None = None
    at: datetime | None = None

    @property
    def headline(self) -> str:
        """``ValueError: no budget``: type and the first line of the message."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type}: {first}" if first else self.type

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "checkpoint_id": self.checkpoint_id,
            "step": self.step,
            "type": self.type,
            "message": self.message,
            "attempt": self.attempt,
            "traceback": self.traceback,
            "at": self.at.isoformat() if self.at is not None else None,
        }


def failure_in(checkpoint: CheckpointSummary) -> RunFailure | None:
    """The error a checkpoint records (a failed run's head, or a retry's), else None."""
    meta = checkpoint.metadata
    error = meta.get("error")
    if not isinstance(error, Mapping):
        return None
    attempt = error.get("attempt")
    at = error.get("at")
    return RunFailure(
        run_id=checkpoint.run_id,
        checkpoint_id=checkpoint.id,
        step=error.get("step") or meta.get("next"),
        type=str(error.get("type") or "Error"),
        message=str(error.get("message") or ""),
        attempt=attempt if isinstance(attempt, int) else None,
        traceback=error.get("traceback") if isinstance(error.get("traceback"), str) else None,
        at=datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else None,
    )


def run_failure(store: Store, run: Run) -> RunFailure | None:
    """Why ``run`` failed (from its head checkpoint), or None if it has not failed."""
    if run.status is not RunStatus.FAILED or run.head_id is None:
        return None
    return failure_in(store.summary(run.head_id))


__all__ = ["RunFailure", "failure_in", "run_failure"]
