"""What a step's helpers may see of the execution running the step, and ask of it.

``ctx.run_child`` / ``ctx.run_children`` (children.py) and ``ctx.map`` (parallel.py) work
inside a step on behalf of the run. They need a few facts about the run's position (its id,
branch, step position, the checkpoint the step started from, its lease and store), a way to
make queued checkpoints durable first, and to tell the run two things for its next
checkpoint: which child runs it started and which delivered inputs it consumed. The engine's
``Execution`` provides exactly this and keeps every change to its own state in its own
methods, so the helpers never reach into it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..store import Lease, Store


class StepHost(Protocol):
    """The execution running a step, as seen by the step's helpers (read-only facts, two
    notes for the next checkpoint)."""

    @property
    def store(self) -> Store:
        """The store the run is checkpointed to."""

    @property
    def run_id(self) -> str: ...

    @property
    def branch(self) -> str:
        """The run's line: its own id, or the branch a fork started."""

    @property
    def position(self) -> int:
        """The step's position in the run (steps run before it)."""

    @property
    def parent_id(self) -> str | None:
        """The checkpoint the step started from: records made in the step name it."""

    @property
    def lease(self) -> Lease:
        """The run's lease: writes on the run's behalf are fenced by it."""

    @property
    def tracer(self) -> Any:
        """The run's OpenTelemetry tracer, or None when tracing is off (``pitstop.observe``)."""

    def flush(self) -> None:
        """Write the checkpoints still queued for this run (background durability), so that
        records naming ``parent_id`` never refer to a checkpoint not yet written."""

    def note_children_started(self, run_ids: Iterable[str]) -> None:
        """Child runs the step started: the next checkpoint lists them (history)."""

    def note_input_consumed(self, name: str, input_id: str) -> None:
        """A delivered input the step used (a child's result): the next checkpoint
        consumes it, so it is not delivered again."""


__all__ = ["StepHost"]
