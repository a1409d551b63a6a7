"""A run as JSON: the fields of its row, for ``pitstop runs --json`` and the inspector's API."""

from __future__ import annotations

from typing import Any

from ..model import Run
from ..serde import to_jsonable


def run_json(run: Run) -> dict[str, Any]:
    """The run row's own fields (no checkpoint is read); callers add what they know besides
    (the CLI the lease and the failure, the inspector what the head checkpoint says).
    Metadata is whatever JSON a store user wrote: it goes through :func:`~pitstop.serde.to_jsonable`
    so the document stays valid JSON (no bare ``Infinity``)."""
    return {
        "id": run.id,
        "status": run.status.value,
        "workflow": run.workflow,
        "step": run.step,
        "waiting_for": list(run.waiting_for),
        "wake_at": run.wake_at,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "checkpoints": run.checkpoints,
        "bytes": run.bytes,
        "head_id": run.head_id,
        "owner": run.owner,
        "lease_expires_at": run.lease_expires_at,
        "priority": run.priority,
        "parent_run": run.parent_run,
        "metadata": to_jsonable(dict(run.metadata)),
    }


__all__ = ["run_json"]
