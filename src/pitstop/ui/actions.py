"""What the inspector's buttons do: send an input, cancel, fork with edits, resume.

Every action is checked before anything is written (an unknown run is a 404, a run that does
not wait for that input a 409, a bad edit a 422, via the exceptions below), and records who
did it and when in the run's metadata (``ui_actions``, the newest last). Running a workflow
needs its code: with ``--workflow`` the server resumes runs itself, on a thread of its own
(holding the run's lease only while the run executes, as any worker would); without, it says
that a worker must pick the run up, and queues forks for one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import InputError, PitstopError, RunBusyError, UnregisteredTypeError
from ..model import Run, RunStatus
from ..store import Lease, Store
from . import langgraph_view
from .security import Identity

if TYPE_CHECKING:
    from ..runtime import Workflow

log = logging.getLogger("pitstop.ui")

AUDIT_KEPT = 50
"""Actions remembered per run."""


class ActionError(Exception):
    """An action refused, with the HTTP status that says why (409: not now, 422: bad input,
    403: not allowed)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _worker_hint(workflow: str | None) -> str:
    name = workflow or "its workflow"
    return (f"a worker for {name} must pick it up (pitstop worker --workflow MODULE:ATTR), "
            "or start the inspector with --workflow")


class Actions:
    def __init__(self, store: Store, workflows: Iterable[Workflow]) -> None:
        self.store = store
        self.workflows: dict[str, Workflow] = {wf.name: wf for wf in workflows}
        self._lock = threading.Lock()
        self.resuming: set[str] = set()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    # -- audit ------------------------------------------------------------------------------

    def _entry(self, who: Identity, action: str, **details: Any) -> dict[str, Any]:
        return {"action": action, "by": who.name,
                "at": datetime.now(UTC).isoformat(timespec="seconds"), **details}

    def _record(self, run: Run, entry: Mapping[str, Any], **changes: Any) -> Run:
        kept = run.metadata.get("ui_actions")
        history = list(kept)[-(AUDIT_KEPT - 1):] if isinstance(kept, list) else []
        return self.store.update_run(run.id, metadata={"ui_actions": [*history, dict(entry)]},
                                     **changes)

    # -- send --------------------------------------------------------------------------------

    def send(self, run_id: str, name: str, payload: Any, who: Identity) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run.status.finished:
            raise ActionError(409, f"run {run_id!r} has {run.status.value}; it takes no input")
        if run.status is not RunStatus.WAITING or name not in run.waiting_for:
            waits = ", ".join(run.waiting_for) if run.status is RunStatus.WAITING else ""
            raise ActionError(
                409, f"run {run_id!r} is not waiting for {name!r}"
                + (f" (it waits for: {waits})" if waits else f" (it is {run.status.value})"))
        pending = self._pending(run_id)
        if name in pending:
            raise ActionError(409, f"run {run_id!r} already has an input {name!r} that it has "
                                   "not consumed yet")
        # Recorded first: once the input is stored a worker may take the run at once, and
        # then its lease would refuse the record.
        before = run
        run = self._record(run, self._entry(who, "input", name=name))
        try:
            delivered = self.store.send(run_id, name, payload)
        except InputError as exc:
            self._undo(before)
            raise ActionError(409, str(exc)) from None
        except PitstopError as exc:
            self._undo(before)
            raise ActionError(422, str(exc)) from None
        remaining = [w for w in run.waiting_for if w not in pending and w != name]
        resumed = False
        if not remaining:
            resumed = self._resume_in_background(run)
        if remaining:
            message = f"delivered {name!r}; run {run_id} still waits for {', '.join(remaining)}"
        elif resumed:
            message = f"delivered {name!r}; resuming run {run_id} here"
        else:
            message = f"delivered {name!r}; {_worker_hint(run.workflow)}"
        return {"run_id": run_id, "input_id": delivered.id, "name": name,
                "waiting_for": remaining, "ready": not remaining, "resumed": resumed,
                "message": message}

    def _pending(self, run_id: str) -> set[str]:
        try:
            return set(self.store.inputs(run_id))
        except PitstopError:
            return set()

    def _undo(self, before: Run) -> None:
        try:
            self.store.update_run(before.id, metadata={
                "ui_actions": before.metadata.get("ui_actions", [])})
        except PitstopError:
            log.warning("could not take back the record of a refused input on run %s",
                        before.id)

    # -- cancel ------------------------------------------------------------------------------

    def cancel(self, run_id: str, who: Identity) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run.status is RunStatus.COMPLETED:
            raise ActionError(409, f"run {run_id!r} has completed; there is nothing to cancel")
        previous = run.status.value
        if run.status is not RunStatus.CANCELLED:
            self._record(run, self._entry(who, "cancel", previous=previous),
                         status=RunStatus.CANCELLED)
            message = f"cancelled run {run_id} (was {previous})"
        else:
            message = f"run {run_id} was already cancelled"
        return {"run_id": run_id, "status": "cancelled", "previous": previous,
                "message": message}

    # -- fork --------------------------------------------------------------------------------

    def fork(
        self,
        checkpoint_id: str,
        edits: Mapping[str, Any],
        who: Identity,
        *,
        add: bool = False,
        new_run_id: str | None = None,
    ) -> dict[str, Any]:
        from ..store.contract.base import UNSET

        summary = self.store.summary(checkpoint_id)
        origin = self.store.get_run(summary.run_id)
        if langgraph_view.is_thread(origin.workflow):
            raise ActionError(409, "LangGraph threads are forked from LangGraph itself "
                                   "(graph.update_state with this checkpoint's config)")
        if new_run_id is not None:
            try:
                self.store.get_run(new_run_id)
            except PitstopError:
                pass
            else:
                raise ActionError(409, f"a run {new_run_id!r} exists already")
        try:
            source = self.store.get(checkpoint_id)
        except UnregisteredTypeError as exc:
            raise ActionError(422, f"{exc}; start the inspector with --workflow so that its "
                                   "classes are registered") from None
        workflow = self.workflows.get(origin.workflow or "")
        update = _apply_edits(source.state, edits, add=add, workflow=workflow)
        runnable = origin.workflow is not None
        status = RunStatus.RUNNING if workflow is not None or not runnable else RunStatus.QUEUED
        entry = self._entry(who, "fork", checkpoint_id=checkpoint_id, fields=sorted(update))
        ckpt = self.store.fork(
            checkpoint_id, new_run_id=new_run_id, update=update, workflow=UNSET, status=status,
            metadata={"forked_by": who.name, "forked_at": entry["at"]},
        )
        forked = self.store.get_run(ckpt.run_id)
        self._record(forked, entry)
        resumed = workflow is not None and self._resume_in_background(forked)
        if resumed:
            message = f"forked run {ckpt.run_id}; running it here"
        elif runnable:
            message = f"forked run {ckpt.run_id}, queued: {_worker_hint(origin.workflow)}"
        else:
            message = f"forked run {ckpt.run_id} (it has no workflow to run)"
        return {"run_id": ckpt.run_id, "checkpoint_id": ckpt.id, "status": status.value,
                "fields": sorted(update), "resumed": resumed, "message": message}

    # -- rerun from a step ------------------------------------------------------------------

    def rerun(
        self,
        run_id: str,
        from_step: str,
        edits: Mapping[str, Any],
        who: Identity,
        *,
        new_run_id: str | None = None,
    ) -> dict[str, Any]:
        """``wf.rerun`` from the inspector: the same checks (the run stopped, the step
        reached, the edits valid: RerunError and FieldEditError, nothing written), then the
        new run resumed here."""
        from ..runtime.rerun import start_rerun

        run = self.store.get_run(run_id)
        workflow = self.workflows.get(run.workflow or "")
        if workflow is None:
            raise ActionError(409, f"this inspector cannot rerun {run.workflow or 'this run'}: "
                                   "start it with --workflow for its workflow")
        if run.status in (RunStatus.RUNNING, RunStatus.QUEUED):
            raise ActionError(409, f"run {run_id!r} is still {run.status.value}; rerun it "
                                   "once it stopped (or cancel it)")
        rerun_id = start_rerun(self.store, workflow, run_id, from_step, dict(edits) or None,
                               new_run_id)
        rerun = self.store.get_run(rerun_id)
        self._record(rerun, self._entry(who, "rerun", run_id=run_id, from_step=from_step,
                                        fields=sorted(edits)))
        resumed = self._resume_in_background(rerun)
        return {"run_id": rerun_id, "from_step": from_step, "fields": sorted(edits),
                "resumed": resumed,
                "message": f"rerun {rerun_id} of {run_id} from step {from_step!r}; "
                           "running it here"}

    # -- resume ------------------------------------------------------------------------------

    def resume(self, run_id: str, who: Identity) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
            raise ActionError(409, f"run {run_id!r} has {run.status.value}; it cannot resume")
        if self.workflows.get(run.workflow or "") is None:
            raise ActionError(409, f"this inspector cannot run {run.workflow or 'this run'}: "
                                   + _worker_hint(run.workflow))
        if run.status is RunStatus.WAITING:
            missing = [w for w in run.waiting_for if w not in self._pending(run_id)]
            if missing:
                raise ActionError(409, f"run {run_id!r} still waits for {', '.join(missing)}")
        if run_id in self.resuming:
            raise ActionError(409, f"run {run_id!r} is being resumed already")
        self._record(run, self._entry(who, "resume"))
        self._resume_in_background(run)
        return {"run_id": run_id, "resumed": True, "message": f"resuming run {run_id} here"}

    def _resume_in_background(self, run: Run) -> bool:
        workflow = self.workflows.get(run.workflow or "")
        if workflow is None:
            return False
        with self._lock:
            if run.id in self.resuming:
                return True
            self.resuming.add(run.id)
        thread = threading.Thread(target=self._resume, args=(workflow, run.id),
                                  name=f"pitstop-ui-resume-{run.id}", daemon=True)
        thread.start()
        return True

    # -- runs made ready elsewhere ---------------------------------------------------------

    def start_watching(self, interval: float) -> None:
        """Start :meth:`watch` on a thread of its own, once (a no-op without workflows)."""
        with self._lock:
            if not self.workflows or self._watcher is not None:
                return
            self._stop = threading.Event()
            self._watcher = threading.Thread(target=self.watch, args=(self._stop, interval),
                                             name="pitstop-ui-watch", daemon=True)
        self._watcher.start()

    def stop_watching(self) -> None:
        self._stop.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.join(timeout=5)

    def watch(self, stop: threading.Event, interval: float) -> None:
        """Until ``stop``: resume the runs of our workflows that became due while waiting
        (an input sent by ``pitstop send`` or ``pitstop.send`` in another process, a timer),
        as a worker would, but never queued runs: those are a worker's. Claimed with a lease,
        so a worker or another inspector never runs the same run at the same time."""
        from ..runtime.leases import owner_id

        names = list(self.workflows)
        owner = f"{owner_id()}/ui"
        while not stop.is_set():
            try:
                leases = self.store.claim(owner, workflows=names, limit=4, waiting_only=True)
            except PitstopError:
                log.warning("could not look for runs to resume", exc_info=True)
                leases = []
            for lease in leases:
                workflow = self.workflows[lease.workflow or ""]
                with self._lock:
                    if lease.run_id in self.resuming:  # one of ours already: let it be
                        self.store.release(lease)
                        continue
                    self.resuming.add(lease.run_id)
                threading.Thread(target=self._resume, args=(workflow, lease.run_id, lease),
                                 name=f"pitstop-ui-resume-{lease.run_id}", daemon=True).start()
            if not leases:
                self.store.wait_for_work(interval)

    def _resume(self, workflow: Workflow, run_id: str, lease: Lease | None = None) -> None:
        try:
            result = workflow.resume(self.store, run_id, lease=lease)
            log.info("run %s resumed: %s", run_id, result.status.value)
        except RunBusyError:
            log.info("run %s is owned by another process (a worker took it)", run_id)
        except Exception:
            log.exception("resuming run %s failed", run_id)
        finally:
            with self._lock:
                self.resuming.discard(run_id)


def _apply_edits(state: Mapping[str, Any], edits: Mapping[str, Any], *, add: bool,
                 workflow: Workflow | None) -> dict[str, Any]:
    """The fork's update, by the rules of ``pitstop fork --set``: values converted to the
    field's type (a registered dataclass, a model, a tuple...), unknown fields refused unless
    ``add``, paths like ``plan.goal`` edit inside a field."""
    from ..edits import apply_field_edits

    try:
        return apply_field_edits(state, edits, add=add,
                                 state_type=workflow.state_type if workflow else None)
    except (ValueError, TypeError, PitstopError) as exc:
        raise ActionError(422, str(exc)) from None


__all__ = ["ActionError", "Actions"]
