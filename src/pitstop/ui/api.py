"""The JSON API under ``/api``: what the pages use, documented at ``/openapi.json``.

Errors are ``{"message": ..., "status": ...}`` with the status that says why: 401 without
a valid token, 403 for an action on a read-only inspector or a cross-site request, 404 for
an unknown run or checkpoint, 409 for an action the run's state refuses (not waiting for that
input, completed), 422 for a malformed request or an edit that does not fit the state.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..model import Checkpoint, RunStatus
from ..serde import to_jsonable
from ..store import Store
from . import langgraph_view, views
from .actions import ActionError
from .context import UI, ui_of, who
from .security import Identity

Status = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]
assert set(Status.__args__) == {s.value for s in RunStatus}  # type: ignore[attr-defined]

Id = Annotated[str, Path(min_length=1, max_length=512)]


class Problem(BaseModel):
    message: str
    status: int
    detail: list[Any] | None = None


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    meaning = {401: "No valid token", 403: "Read-only inspector, or a cross-site request",
               404: "No such run or checkpoint", 409: "The run's state refuses this",
               422: "Malformed request, or an edit that does not fit the state"}
    return {code: {"model": Problem, "description": meaning[code]} for code in (401, *codes)}


class Failure(BaseModel):
    type: str
    message: str
    step: str | None = None
    attempt: int | None = None
    traceback: str | None = None
    at: datetime | None = None


class RunOut(BaseModel):
    id: str
    status: Status
    workflow: str | None
    step: int | None = Field(description="Position: steps executed so far on this branch.")
    step_name: str | None = Field(description="The last step that ran.")
    next_step: str | None = Field(description="The step the run continues with.")
    waiting_for: list[str]
    waiting_since: datetime | None
    wake_at: datetime | None
    created_at: datetime
    updated_at: datetime
    checkpoints: int
    bytes: int
    head_id: str | None
    owner: str | None = Field(description="Who holds the run's lease now, if anyone.")
    lease_expires_at: datetime | None
    lease: Literal["none", "held", "released", "expired", "owner_gone"] = Field(
        description="held: a live owner runs it; owner_gone: its owner died (a worker on "
                    "its host takes it over); expired; released: handed back for any worker.")
    priority: int
    parent_run: str | None = Field(
        description="The run whose step started this one (ctx.run_child), if any.")
    idle: bool = Field(
        description="A LangGraph thread whose status says running but whose graph has no "
                    "node left to run (LangGraph savers write no status when a graph ends).")
    metadata: dict[str, Any]
    error: Failure | None
    progress: str | None = Field(
        default=None,
        description="A running run's loops (`rows 32,000 / 300,000 (10.7%) · 1,250/s`) or a "
                    "stream partition's records; in run lists only.")


class Damaged(BaseModel):
    id: str = Field(description="The run whose row is damaged.")
    message: str = Field(description="What is wrong with it.")


class RunPage(BaseModel):
    runs: list[RunOut]
    counts: dict[str, int] = Field(description="Runs per status for the other filters.")
    total: int = Field(description="Runs matching every filter.")
    next: str | None = Field(description="Pass as ?before= for the next page (None: last).")
    damaged: list[Damaged] = Field(
        default_factory=list,
        description="Runs of this page left out because their rows are damaged "
                    "(`pitstop verify` lists them).")


class Fork(BaseModel):
    id: str
    status: Status
    created_at: datetime


class ParentLink(BaseModel):
    run_id: str
    checkpoint_id: str | None = Field(description="The parent's checkpoint the step ran from.")
    step: str | None = Field(description="The parent's step that started this run.")


class Child(BaseModel):
    id: str
    status: Status
    workflow: str | None
    waiting_for: list[str]


class Children(BaseModel):
    total: int = Field(description="Every child run, whatever its status.")
    counts: dict[str, int] = Field(description="Children per status (statuses with none left "
                                               "out).")
    first: list[Child] = Field(description="The oldest children (at most 20); the rest: "
                                           "/api/runs?parent=RUN.")


class RunDetail(RunOut):
    parent: ParentLink | None = Field(description="Where the run that started this one was.")
    children: Children = Field(description="The child runs this run's steps started.")
    pending: list[str] = Field(description="Inputs delivered but not consumed yet.")
    asks: list[str] = Field(description="Inputs the run waits for that nobody sent yet.")
    forked_from: str | None
    langgraph: bool
    actions: list[dict[str, Any]] = Field(description="Recent inspector actions on the run.")
    resuming: bool


class CheckpointOut(BaseModel):
    id: str
    run_id: str
    parent_id: str | None
    step: int
    step_name: str | None
    next_step: str | None
    source: str | None
    status: str | None
    created_at: datetime
    size: int
    added: int | None
    tags: list[str]
    milestone: bool
    head: bool
    waiting_for: list[str]
    resumed_from: str | None
    forked_from: dict[str, Any] | None
    error: dict[str, Any] | None
    cached: list[dict[str, Any]] = []
    """Steps and calls served from the result cache since the previous checkpoint, each with
    the run that computed it (``{"step": ..., "run": ...}``)."""


class TreeEntry(CheckpointOut):
    branch_point: bool = Field(description="Several newer checkpoints continue from it.")
    lane: int = Field(description="Column of its branch in the drawn tree.")


class History(BaseModel):
    run_id: str
    head_id: str | None
    checkpoints: list[TreeEntry]
    next: str | None = Field(description="Pass as ?before= for older checkpoints.")


class ConsumedInput(BaseModel):
    name: str
    id: str
    payload: Any = None
    created_at: datetime | None


class Turn(BaseModel):
    role: str
    kind: str = ""
    name: str = ""
    text: str = ""
    tool_calls: list[str] = []
    id: str = ""


class CheckpointDetail(BaseModel):
    checkpoint: CheckpointOut
    metadata: dict[str, Any]
    state: dict[str, Any]
    inputs: list[ConsumedInput]
    effects: dict[str, Any]
    conversation: list[Turn]
    langgraph: bool


class FieldValue(BaseModel):
    checkpoint_id: str
    path: str
    value: Any = None


class Segment(BaseModel):
    op: Literal["equal", "delete", "insert"]
    text: str


class Change(BaseModel):
    op: Literal["added", "removed", "changed"]
    path: str
    old: Any = None
    new: Any = None
    text: list[Segment] | None = None


class Diff(BaseModel):
    a: CheckpointOut
    b: CheckpointOut
    changes: list[Change]


class Inbox(BaseModel):
    runs: list[dict[str, Any]]
    count: int


class SendInput(BaseModel):
    name: str = Field(min_length=1, max_length=512, description="The input the run waits for.")
    payload: Any = Field(description="Any JSON value: what the waiting step receives.")


class Sent(BaseModel):
    run_id: str
    input_id: str
    name: str
    waiting_for: list[str]
    ready: bool
    resumed: bool
    message: str


class Cancelled(BaseModel):
    run_id: str
    status: Literal["cancelled"]
    previous: Status
    message: str


class ForkRequest(BaseModel):
    updates: dict[str, Any] = Field(default_factory=dict,
                                    description="New values of state fields, by name.")
    add: bool = Field(False, description="Allow fields the checkpoint does not have.")
    run_id: str | None = Field(None, min_length=1, max_length=512,
                               description="Id of the new run (default: a new id).")


class RerunRequest(BaseModel):
    from_step: str = Field(min_length=1, max_length=512,
                           description="The step to run again (and everything after it).")
    updates: dict[str, Any] = Field(default_factory=dict,
                                    description="New values of state fields, by name.")
    run_id: str | None = Field(None, min_length=1, max_length=512,
                               description="Id of the new run (default: a new id).")


class Rerun(BaseModel):
    run_id: str
    from_step: str
    fields: list[str]
    resumed: bool
    message: str


class Forked(BaseModel):
    run_id: str
    checkpoint_id: str
    status: Status
    fields: list[str]
    resumed: bool
    message: str


class Resumed(BaseModel):
    run_id: str
    resumed: bool
    message: str


class EscapingJSONResponse(JSONResponse):
    """JSON whose strings may hold a lone surrogate (a Python string can, UTF-8 cannot): it
    is written as its JSON escape ``\\ud800``, which reads back as that very string."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8", "backslashreplace")


def _state_answer(content: dict[str, Any]) -> Response:
    """An answer holding state, written as is: pydantic refuses a string (or a dict key)
    holding a lone surrogate, which a state Python saved may have (the answer was a 422)."""
    return EscapingJSONResponse(jsonable_encoder(content))


class StreamPartition(BaseModel):
    run_id: str
    partition: int
    status: Status
    owner: str | None
    position: str | None = Field(description="The source position of the last checkpoint.")
    records: int = Field(description="Records handled up to the last checkpoint.")
    outbox: int = Field(description="Outputs in the last checkpoint not yet known delivered.")
    checkpoint_age: float | None = Field(description="Seconds since the last checkpoint.")
    records_per_second: float | None = Field(
        description="Records/s over the partition's last 8 checkpoints.")
    lag: int | None = Field(description="Records in the source after the position "
                                        "(None: unknown, or not asked).")
    error: str | None


class StreamSummary(BaseModel):
    partitions: int
    running: int
    failed: int
    records: int
    records_per_second: float | None
    lag: int | None
    outbox: int
    oldest_checkpoint_age: float | None


class StreamJob(BaseModel):
    job: str
    summary: StreamSummary
    partitions: list[StreamPartition]


router = APIRouter(prefix="/api", tags=["api"])


def _checkpoint(store: Store, checkpoint_id: str) -> Checkpoint:
    return store.get(checkpoint_id, strict=False)


@router.get("/runs", response_model=RunPage, responses=_errors(422))
def list_runs(
    ui: Annotated[UI, Depends(ui_of)],
    status: Annotated[list[Status], Query(description="Only these statuses.")] = [],  # noqa: B006
    workflow: Annotated[str | None, Query(max_length=512)] = None,
    meta: Annotated[list[str], Query(description="key=value (value as JSON if it parses)")] = [],  # noqa: B006
    id: Annotated[str | None, Query(max_length=512, description="Run id prefix.")] = None,
    since: Annotated[str | None, Query(max_length=64, description="30m, 2h, 7d or ISO")] = None,
    parent: Annotated[str | None, Query(max_length=512,
                                        description="Only the children of this run.")] = None,
    before: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = views.PAGE,
) -> dict[str, Any]:
    """Runs newest first with counts per status; the runs page's filters."""
    filters = views.RunFilter.parse(statuses=status, workflow=workflow, meta=meta,
                                    id_prefix=id, since=since, parent=parent)
    return views.list_runs(ui.store, filters, before=before, limit=limit)


@router.get("/inbox", response_model=Inbox, responses=_errors())
def inbox(ui: Annotated[UI, Depends(ui_of)]) -> dict[str, Any]:
    """Runs waiting for an input, oldest first, with the state they show."""
    found = views.inbox(ui.store)
    for row in found["runs"]:
        row["shown"] = to_jsonable(row["shown"])
    return found


class Forks(BaseModel):
    runs: list[Fork]


class TimelineSpan(BaseModel):
    kind: str = Field(description="step, retry, failed, wait, child, map or loop")
    label: str
    start: float = Field(description="epoch seconds")
    end: float | None = Field(description="epoch seconds; null while it lasts")
    seconds: float | None
    checkpoint_id: str | None
    detail: str


class TimelineEvent(BaseModel):
    at: float = Field(description="epoch seconds")
    kind: str = Field(description="created, forked, claimed, input, effect, map, child, "
                                  "retried, waiting, failed, completed, cancelled, edited")
    detail: str
    checkpoint_id: str | None


class LoopProgress(BaseModel):
    name: str
    step: str | None
    done: int
    total: int | None
    rate: float | None = Field(description="items a second")
    at: float | None
    text: str = Field(description='e.g. "32,000 / 300,000 (10.7%) · 1,250/s"')


class Timeline(BaseModel):
    spans: list[TimelineSpan]
    events: list[TimelineEvent]
    progress: list[LoopProgress]


@router.get("/runs/{run_id:path}/timeline", response_model=Timeline, responses=_errors(404))
def get_timeline(ui: Annotated[UI, Depends(ui_of)], run_id: Id) -> dict[str, Any]:
    """The run's timeline (steps with durations, retries, waits, children, maps; its newest
    checkpoints), its events and its loops' progress."""
    found = views.run_timeline(ui.store, run_id)
    return {"spans": found["spans"], "events": found["events"],
            "progress": found["progress"]}


@router.get("/runs/{run_id:path}/forks", response_model=Forks, responses=_errors(404))
def get_forks(ui: Annotated[UI, Depends(ui_of)], run_id: Id) -> dict[str, Any]:
    """The runs forked from this one (reads every run's metadata: asked for on demand)."""
    return {"runs": views.forks_of(ui.store, run_id)}


@router.get("/runs/{run_id:path}/history", response_model=History, responses=_errors(404, 422))
def get_history(
    ui: Annotated[UI, Depends(ui_of)],
    run_id: Id,
    before: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = views.HISTORY_PAGE,
) -> dict[str, Any]:
    """The run's checkpoint tree, newest first, a page at a time."""
    run = ui.store.get_run(run_id)
    found = views.history(ui.store, run, before=before, limit=limit)
    found.pop("graph")
    return found


@router.get("/streams/{job}", response_model=StreamJob, responses=_errors(404))
def get_stream(
    ui: Annotated[UI, Depends(ui_of)],
    job: Annotated[str, Path(min_length=1, max_length=512)],
    lag: Annotated[bool, Query(description="Ask the broker for each partition's lag.")] = True,
) -> dict[str, Any]:
    """A stream job (runs ``JOB/0`` …): each partition's position, lag, records/s, last
    checkpoint age and outbox, and the job summed up (what ``pitstop stream status`` shows)."""
    found = views.stream_job(ui.store, job, lag=lag)
    if found is None:
        raise ActionError(404, f"no stream job {job!r} in this store (its partitions are the "
                               f"runs {job}/0, {job}/1, …)")
    return found


@router.get("/checkpoints/{checkpoint_id}", response_model=CheckpointDetail | FieldValue,
            responses=_errors(404, 422))
def get_checkpoint(
    ui: Annotated[UI, Depends(ui_of)],
    checkpoint_id: Id,
    path: Annotated[str | None, Query(max_length=2000,
                                      description="Only this field: messages[3].content")] = None,
) -> Response:
    """A checkpoint: its state, metadata, the inputs it consumed, the effects recorded."""
    from ..display.state import PathNotFound, lookup

    ckpt = _checkpoint(ui.store, checkpoint_id)
    run = ui.store.get_run(ckpt.run_id)
    detail = views.checkpoint_detail(ui.store, ckpt, run)
    if path is not None:
        try:
            value = lookup(detail["state"], path)
        except (PathNotFound, ValueError) as exc:
            raise ActionError(422, f"path: {exc}") from None
        return _state_answer({"checkpoint_id": ckpt.id, "path": path, "value": value})
    detail.pop("live_state")
    return _state_answer(detail)


@router.get("/checkpoints/{checkpoint_id}/diff", response_model=Diff,
            responses=_errors(404, 422))
def get_diff(
    ui: Annotated[UI, Depends(ui_of)],
    checkpoint_id: Id,
    against: Annotated[str | None, Query(max_length=512, description="Default: its parent")] = None,
) -> Response:
    """Field-level changes from ``against`` (default: the parent) to this checkpoint."""
    new = _checkpoint(ui.store, checkpoint_id)
    other = against or new.parent_id
    if other is None:
        raise ActionError(422, f"checkpoint {checkpoint_id} has no parent; name one: ?against=")
    old = _checkpoint(ui.store, other)
    runs = {r: ui.store.get_run(r) for r in {old.run_id, new.run_id}}
    threads = tuple(langgraph_view.is_thread(runs[c.run_id].workflow) for c in (old, new))
    return _state_answer({
        "a": views.checkpoint_row(old, head_id=runs[old.run_id].head_id),
        "b": views.checkpoint_row(new, head_id=runs[new.run_id].head_id),
        "changes": views.diff(old, new, threads=(threads[0], threads[1])),
    })


@router.post("/runs/{run_id:path}/inputs", response_model=Sent, status_code=201,
             responses=_errors(403, 404, 409, 422))
def send_input(
    ui: Annotated[UI, Depends(ui_of)],
    identity: Annotated[Identity, Depends(who)],
    run_id: Id,
    body: Annotated[SendInput, Body()],
) -> dict[str, Any]:
    """Deliver an input to a run waiting for it (resumed here with ``--workflow``)."""
    ui.writable()
    return ui.actions.send(run_id, body.name, body.payload, identity)


@router.post("/runs/{run_id:path}/cancel", response_model=Cancelled,
             responses=_errors(403, 404, 409))
def cancel_run(
    ui: Annotated[UI, Depends(ui_of)],
    identity: Annotated[Identity, Depends(who)],
    run_id: Id,
) -> dict[str, Any]:
    """Cancel a run: no worker takes it again; its owner's next write is refused."""
    ui.writable()
    return ui.actions.cancel(run_id, identity)


@router.post("/runs/{run_id:path}/resume", response_model=Resumed, status_code=202,
             responses=_errors(403, 404, 409))
def resume_run(
    ui: Annotated[UI, Depends(ui_of)],
    identity: Annotated[Identity, Depends(who)],
    run_id: Id,
) -> dict[str, Any]:
    """Resume the run on this server (needs ``--workflow`` for its workflow)."""
    ui.writable()
    return ui.actions.resume(run_id, identity)


@router.post("/checkpoints/{checkpoint_id}/fork", response_model=Forked, status_code=201,
             responses=_errors(403, 404, 409, 422))
def fork_checkpoint(
    ui: Annotated[UI, Depends(ui_of)],
    identity: Annotated[Identity, Depends(who)],
    checkpoint_id: Id,
    body: Annotated[ForkRequest, Body()],
    request: Request,
    response: Response,
) -> dict[str, Any]:
    """A new run from this checkpoint with edited fields (``pitstop fork --set`` rules)."""
    ui.writable()
    found = ui.actions.fork(checkpoint_id, body.updates, identity, add=body.add,
                            new_run_id=body.run_id)
    base = request.scope.get("root_path", "")
    response.headers["Location"] = f"{base}/api/runs/{quote(found['run_id'], safe='')}"
    return found


@router.post("/runs/{run_id:path}/rerun", response_model=Rerun, status_code=201,
             responses=_errors(403, 404, 409, 422))
def rerun_run(
    ui: Annotated[UI, Depends(ui_of)],
    identity: Annotated[Identity, Depends(who)],
    run_id: Id,
    body: Annotated[RerunRequest, Body()],
    request: Request,
    response: Response,
) -> dict[str, Any]:
    """A new run from the checkpoint before ``from_step`` last ran, with optional edits
    (``wf.rerun`` rules; needs ``--workflow`` for the run's workflow)."""
    ui.writable()
    found = ui.actions.rerun(run_id, body.from_step, body.updates, identity,
                             new_run_id=body.run_id)
    base = request.scope.get("root_path", "")
    response.headers["Location"] = f"{base}/api/runs/{quote(found['run_id'], safe='')}"
    return found


# Last of the /runs/ routes: a run id may hold "/" (stream partitions "JOB/0"), so
# "/runs/{run_id:path}" would also match (or answer OPTIONS for) "/runs/X/history".
@router.get("/runs/{run_id:path}", response_model=RunDetail, responses=_errors(404))
def get_run(ui: Annotated[UI, Depends(ui_of)], run_id: Id) -> dict[str, Any]:
    """One run: status, position, what it waits for, its failure, where it was forked from."""
    detail = views.run_detail(ui.store, run_id)
    detail.pop("forks")
    detail["resuming"] = run_id in ui.actions.resuming
    return detail


__all__ = ["router"]
