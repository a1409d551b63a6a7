"""A run as JSON: the fields of its row, for ``pitstop runs --json`` and the inspector's API;
and the step a checkpoint is listed under in both histories."""

from __future__ import annotations

from collections.abc import Mapping
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


def step_label(metadata: Mapping[str, Any]) -> str:
    """The step a checkpoint belongs to in a history: the one that ran before it, or, for a
    checkpoint that stopped a run in a step (waiting for its input or timer, failed), that
    step."""
    if metadata.get("status") in ("waiting", "failed") and metadata.get("next"):
        return str(metadata["next"])
    return str(metadata.get("step_name") or "-")


__all__ = ["run_json", "step_label"]
