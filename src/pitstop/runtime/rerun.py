"""Rerunning a run from a named step: where the new branch starts, and what it is given.

``wf.rerun(store, run_id, from_step=...)`` starts a new run (a fork) from the checkpoint
taken just before ``from_step`` last ran in the source run, with an optional edit; the
steps before it are not executed again, and the steps after it that have a
:class:`~pitstop.CachePolicy` are served from the cache while their key is unchanged (a
step whose inputs changed runs, and so does everything its changed outputs reach).

Child runs and map fan-outs follow from that: a step served from the cache starts no child
and maps nothing; a step that runs again starts its children under the new run's id, so a
child whose inputs changed is never reused, and one that did not change is served from the
cache if its own steps (or the ``ctx.cached`` calls around it) are cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import RerunError
from ..model import CheckpointSummary, RunStatus

if TYPE_CHECKING:
    from ..store import Store
    from .workflow import Workflow

_BUSY = (RunStatus.RUNNING, RunStatus.QUEUED)


def _ancestry(store: Store, run_id: str, head_id: str | None) -> list[CheckpointSummary]:
    """The run's checkpoints from its head back to its first, along parent links (the
    branch the run is on now; abandoned branches are not what "last ran" means)."""
    by_id = {c.id: c for c in store.history(run_id, limit=None)}
    line: list[CheckpointSummary] = []
    current = by_id.get(head_id) if head_id else None
    while current is not None:
        line.append(current)
        current = by_id.get(current.parent_id) if current.parent_id else None
    return line


def rerun_point(store: Store, wf: Workflow, run_id: str, from_step: str) -> CheckpointSummary:
    """The checkpoint a rerun from ``from_step`` starts at; :class:`~pitstop.RerunError`
    (nothing written) if the run is still running or never reached the step."""
    run = store.get_run(run_id)
    if run.workflow != wf.name:
        raise RerunError(f"belongs to workflow {run.workflow!r}, not {wf.name!r}",
                         run_id=run_id, step=from_step)
    if from_step not in wf.steps:
        raise RerunError(f"workflow {wf.name!r} has no step {from_step!r} "
                         f"(steps: {', '.join(wf.steps)})", run_id=run_id, step=from_step)
    if run.status in _BUSY:
        raise RerunError(f"is still {run.status.value}; rerun it once it stopped "
                         "(or cancel it)", run_id=run_id, step=from_step)
    line = _ancestry(store, run_id, run.head_id)
    # Newest first: the last time the run was about to run the step.
    for ckpt in line:
        if ckpt.metadata.get("next") == from_step:
            return ckpt
    # The policy checkpointed past the step (several steps per checkpoint): the newest
    # checkpoint from before the step ran; the steps between run again (or come from the
    # cache).
    ran = [c for c in line if from_step in (c.metadata.get("completed") or ())]
    if ran:
        oldest = ran[-1]
        for ckpt in line[line.index(oldest) + 1:]:
            if from_step not in (ckpt.metadata.get("completed") or ()):
                return ckpt
    raise RerunError(f"never reached step {from_step!r}; nothing to rerun from",
                     run_id=run_id, step=from_step)


def start_rerun(
    store: Store,
    wf: Workflow,
    run_id: str,
    from_step: str,
    update: Mapping[str, Any] | None,
    new_run_id: str | None,
) -> str:
    """Write the rerun's first checkpoint (a fork of :func:`rerun_point`, edited, set to
    continue at ``from_step``) and return the new run's id."""
    from ..edits import apply_field_edits

    point = rerun_point(store, wf, run_id, from_step)
    updates: dict[str, Any] = {}
    if update:
        source = store.get(point.id)
        # As `fork --set` does: unknown fields and values of the wrong type are refused
        # (FieldEditError) before anything is written.
        updates = apply_field_edits(source.state, update, state_type=wf.state_type)
    next_step = point.metadata.get("next") or from_step
    ckpt = store.fork(
        point.id,
        new_run_id=new_run_id,
        update=updates,
        workflow=wf.name,
        metadata={"next": next_step, "attempts": {}, "cached": [], "children": [],
                  "rerun_of": {"run_id": run_id, "from_step": from_step}},
    )
    return ckpt.run_id


__all__ = ["rerun_point", "start_rerun"]
