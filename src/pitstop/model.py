"""The records pitstop stores: runs and their immutable checkpoints.

These are plain frozen values. A store hands them out; nothing here talks to a store, so they
can be pickled, compared and printed freely.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Self


class RunStatus(StrEnum):
    """Where a run is in its life.

    ``queued`` runs wait for a worker; ``running`` runs are (or were, if their owner died)
    executing; ``waiting`` runs hold no compute until an input or a timer wakes them.
    """

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Nothing will run again on its own (a failed run can still be resumed by hand)."""
        return self in _FINISHED


_FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


def utc(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


@dataclass(frozen=True, slots=True)
class Run:
    """One execution of a workflow (or one thread of checkpoints, for plain store users).

    ``head_id`` is the checkpoint the run continues from; ``waiting_for`` and ``wake_at``
    mirror its latest checkpoint's metadata so that queries never open a checkpoint.
    """

    id: str
    status: RunStatus
    workflow: str | None
    created_at: datetime
    updated_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=dict)
    head_id: str | None = None
    step: int | None = None
    waiting_for: tuple[str, ...] = ()
    wake_at: datetime | None = None
    checkpoints: int = 0
    bytes: int = 0
    owner: str | None = None
    lease_expires_at: datetime | None = None
    priority: int = 0
    parent_run: str | None = None
    """The run whose step started this one as a child (``ctx.run_child``), or None."""


class CheckpointSummary:
    """A checkpoint without its state: what history listings return.

    Metadata is decoded on first access, so listing thousands of entries costs only what the
    caller reads.
    """

    __slots__ = (
        "_created",
        "_metadata",
        "_metadata_json",
        "added",
        "checksum",
        "id",
        "parent_id",
        "run_id",
        "schema_version",
        "size",
        "step",
    )

    def __init__(
        self,
        *,
        id: str,
        run_id: str,
        parent_id: str | None,
        step: int,
        created_at: datetime | float,
        schema_version: int,
        checksum: str,
        size: int,
        metadata: Mapping[str, Any] | None = None,
        metadata_json: str | None = None,
        added: int | None = None,
    ) -> None:
        self._fill(id, run_id, parent_id, step, created_at, schema_version, checksum, size,
                   metadata_json, added)
        self._metadata: Mapping[str, Any] | None = metadata

    def _fill(
        self,
        id: str,
        run_id: str,
        parent_id: str | None,
        step: int,
        created_at: datetime | float,
        schema_version: int,
        checksum: str,
        size: int,
        metadata_json: str | None,
        added: int | None,
    ) -> None:
        self.id = id
        self.run_id = run_id
        self.parent_id = parent_id
        self.step = step
        self._created: datetime | float = created_at
        self.schema_version = schema_version
        self.checksum = checksum
        self.size = size
        #: Bytes this checkpoint added to the store: its record plus the values it stored that
        #: its parent did not reference (what the step cost; a run's ``bytes`` counts the
        #: same); ``size`` is the whole state. None if the store does not know.
        self.added = added
        self._metadata = None
        self._metadata_json = metadata_json

    @classmethod
    def _from_row(cls, *row: Any) -> Self:
        """Build from a database row (``id, run_id, parent_id, step, created_at,
        schema_version, checksum, size, metadata, added``) without keyword-argument overhead:
        history lists make thousands."""
        self = object.__new__(cls)
        self._fill(*row)
        return self

    @property
    def created_at(self) -> datetime:
        """When the checkpoint was written (UTC)."""
        created = self._created
        if not isinstance(created, datetime):
            created = self._created = datetime.fromtimestamp(created, UTC)
        return created

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The checkpoint's metadata (step name, status, next step, error...), decoded
        on first access."""
        if self._metadata is None:
            self._metadata = json.loads(self._metadata_json) if self._metadata_json else {}
        return self._metadata

    @property
    def source(self) -> str | None:
        """What made this checkpoint: ``step``, ``update``, ``fork``, ``manual``, ``input``."""
        return self.metadata.get("source")

    @property
    def tags(self) -> tuple[str, ...]:
        """The checkpoint's tags (milestones, ``ctx.checkpoint(tag=...)``): kept by retention."""
        return tuple(self.metadata.get("tags", ()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CheckpointSummary):
            return NotImplemented
        return self.id == other.id and self.checksum == other.checksum

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, run_id={self.run_id!r}, "
            f"step={self.step}, parent_id={self.parent_id!r}, source={self.source!r})"
        )


class Checkpoint(CheckpointSummary):
    """An immutable snapshot of a run's state after a step, with its metadata."""

    __slots__ = ("skipped", "state")

    def __init__(
        self, *, state: dict[str, Any], skipped: tuple[str, ...] = (), **summary: Any
    ) -> None:
        super().__init__(**summary)
        self.state = state
        #: With ``latest(..., fallback=True)``: the newer checkpoints passed over, and why.
        self.skipped = skipped

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", fields={sorted(self.state)!r})"


__all__ = ["Checkpoint", "CheckpointSummary", "Run", "RunStatus"]
