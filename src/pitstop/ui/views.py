"""What the pages and the JSON API show, read from a store through its public API only.

Each function here makes a bounded number of store calls (a page of runs and one summary of
each head, a page of history, one checkpoint) and returns plain data: the API serialises it,
the templates render it. Nothing takes a lease or writes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..display.graph import ends_here, fork_origin
from ..display.runs import run_json, step_label
from ..errors import PitstopError
from ..failures import failure_in
from ..model import Checkpoint, CheckpointSummary, Run, RunStatus
from ..owners import ownership
from ..serde import to_jsonable
from ..store import Store
from . import langgraph_view
from .graph import layout

STATUSES = [s.value for s in RunStatus]
PAGE = 50
"""Runs on one page."""
HISTORY_PAGE = 100
"""Checkpoints drawn on one page of a run's tree (older ones are a click away)."""


def now() -> datetime:
    return datetime.now(UTC)


# -- filters -------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunFilter:
    """The filters of the runs page and of ``GET /api/runs`` (both take the same query)."""

    statuses: list[str] = field(default_factory=list)
    workflow: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    id_prefix: str | None = None
    since: datetime | None = None
    since_text: str = ""
    meta_text: list[str] = field(default_factory=list)
    parent: str | None = None
    """Only the children of this run (its full id, as ``pitstop runs --parent``)."""

    @classmethod
    def parse(
        cls,
        *,
        statuses: Sequence[str] = (),
        workflow: str | None = None,
        meta: Sequence[str] = (),
        id_prefix: str | None = None,
        since: str | None = None,
        parent: str | None = None,
    ) -> RunFilter:
        """From query parameters; ValueError naming the one that is wrong."""
        from ..display.text import parse_since

        found = cls(workflow=workflow or None, id_prefix=id_prefix or None,
                    parent=parent or None)
        for status in statuses:
            if status not in STATUSES:
                raise ValueError(f"status {status!r}: one of {', '.join(STATUSES)}")
            if status not in found.statuses:
                found.statuses.append(status)
        for item in meta:
            if not item:
                continue
            key, sep, text = item.partition("=")
            if not sep or not key:
                raise ValueError(f"meta {item!r} must look like key=value (tier=2, team=ops)")
            try:
                value: Any = json.loads(text)
            except json.JSONDecodeError:
                value = text
            if not _filterable(value):
                raise ValueError(f"meta {item!r}: numbers must be finite and fit in 64 bits")
            found.metadata[key] = value
            found.meta_text.append(item)
        if since:
            try:
                found.since = parse_since(since)
            except (ValueError, OverflowError) as exc:
                raise ValueError(f"since: {exc}") from None
            found.since_text = since
        return found

    def store_filters(self) -> dict[str, Any]:
        return {
            "status": self.statuses or None,
            "workflow": self.workflow,
            "metadata": self.metadata or None,
            "id_prefix": self.id_prefix,
            "since": self.since,
            "parent_run": self.parent,
        }

    def query(self, *, status: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """These filters as query parameters (for links), with other statuses if given."""
        pairs = [("status", s) for s in (self.statuses if status is None else status)]
        if self.workflow:
            pairs.append(("workflow", self.workflow))
        pairs.extend(("meta", m) for m in self.meta_text)
        if self.id_prefix:
            pairs.append(("id", self.id_prefix))
        if self.since_text:
            pairs.append(("since", self.since_text))
        if self.parent:
            pairs.append(("parent", self.parent))
        return pairs

    @property
    def active(self) -> bool:
        return bool(self.query())


def _filterable(value: Any) -> bool:
    """A metadata filter value both backends can bind and compare."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return -(1 << 63) <= value < (1 << 63)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_filterable(v) for v in value)
    if isinstance(value, dict):
        return all(_filterable(v) for v in value.values())
    return False


def text_or_none(value: Any) -> str | None:
    """A metadata value that should be a name, as one (metadata is whatever JSON a plain
    store user wrote)."""
    return None if value is None else str(value)


# -- runs ----------------------------------------------------------------------------------------


def error_of(entry: CheckpointSummary) -> dict[str, Any] | None:
    """The error a checkpoint records (type, message, step, attempt, traceback), if any."""
    failure = failure_in(entry)
    return failure.to_json() if failure is not None else None


def run_row(run: Run, head: CheckpointSummary | None) -> dict[str, Any]:
    """One run as the runs page and ``GET /api/runs`` show it."""
    meta = head.metadata if head is not None else {}
    error = error_of(head) if run.status is RunStatus.FAILED and head is not None else None
    waiting = run.status is RunStatus.WAITING
    owned = ownership(run)
    lease_live = owned.state in ("held", "owner_gone", "expired")
    return {
        **run_json(run),
        "step_name": text_or_none(meta.get("step_name")),
        "next_step": text_or_none(meta.get("next")),
        "waiting_since": head.created_at if waiting and head is not None else None,
        # a stale owner (its lease gone) is not shown as if it still held the run
        "owner": run.owner if lease_live else None,
        "lease_expires_at": run.lease_expires_at if lease_live else None,
        "lease": owned.state,
        "idle": langgraph_view.is_thread(run.workflow)
        and langgraph_view.idle(run.status.value, meta),
        "error": None if error is None else {
            "type": str(error.get("type", "")),
            "message": str(error.get("message", "")),
            "step": text_or_none(error.get("step")),
        },
    }


def _head(store: Store, run: Run) -> CheckpointSummary | None:
    if run.head_id is None:
        return None
    try:
        return store.summary(run.head_id)
    except PitstopError:  # pruned or damaged meanwhile: the row still shows the run
        return None


def _heads(store: Store, runs: Sequence[Run]) -> dict[str, CheckpointSummary]:
    """The runs' head summaries in one read (a missing or damaged head leaves its row
    without the step name and error, like :func:`_head`)."""
    try:
        return store.summaries(r.head_id for r in runs if r.head_id is not None)
    except PitstopError:  # a damaged record among them: read one by one, skipping it
        return {r.head_id: h for r in runs if r.head_id and (h := _head(store, r)) is not None}


def _listed_progress(store: Store, run: Run, head: CheckpointSummary | None) -> str | None:
    """A running loop's progress, or a stream partition's records (see
    :func:`pitstop.observe.timelines.listed_progress`); None if it cannot be read."""
    from ..observe.timelines import listed_progress

    if run.status is not RunStatus.RUNNING and not (run.workflow or "").startswith("stream:"):
        return None
    try:
        return listed_progress(store, run, head)
    except PitstopError:  # a damaged record: the row shows no progress
        return None


def list_runs(
    store: Store, filters: RunFilter, *, before: str | None = None, limit: int = PAGE
) -> dict[str, Any]:
    """A page of runs newest first, with counts per status for the same filters (the status
    filter aside, so the status tabs can say what each would show)."""
    listed = store.runs(**filters.store_filters(), before=before, limit=limit + 1)
    more = len(listed) > limit
    found = listed[:limit]
    counting = filters.store_filters()
    counting.pop("status")
    counts = store.count_runs(**counting)
    heads = _heads(store, found)
    rows = [run_row(r, heads.get(r.head_id or "")) for r in found]
    for run, row in zip(found, rows, strict=True):
        row["progress"] = _listed_progress(store, run, heads.get(run.head_id or ""))
    return {
        "runs": rows,
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "total": sum(counts.get(s, 0) for s in (filters.statuses or STATUSES)),
        "next": found[-1].id if more and found else None,
        "damaged": [{"id": p.id, "message": p.message} for p in listed.damaged],
    }


def inbox(store: Store, *, limit: int = PAGE) -> dict[str, Any]:
    """Runs waiting for an input, oldest first, each with the input names and what the run
    shows the approver: the state fields its waiting step names (``show=`` on the step),
    or the whole state."""
    count, waiting = oldest_waiting(store, limit)
    items = []
    for run in waiting:
        head = store.latest(run.id, strict=False) if run.head_id else None
        row = run_row(run, head)
        row["pending"] = sorted(_pending(store, run.id))
        row["asks"] = [name for name in run.waiting_for if name not in row["pending"]]
        row["forms"] = input_forms(head, row["asks"])
        row["shown"], row["shown_fields"] = _shown(run, head)
        items.append(row)
    items.sort(key=lambda r: (r["waiting_since"] or r["updated_at"], r["id"]))
    return {"runs": items, "count": count}


def oldest_waiting(store: Store, limit: int) -> tuple[int, list[Run]]:
    """How many runs wait, and the ``limit`` oldest of those waiting for an input (runs
    waiting only for a timer or for child runs are not for a person). Runs come newest
    first, so the oldest are the last page: one count, then one read at that offset of the
    status index."""
    count = store.count_runs(status=RunStatus.WAITING).get("waiting", 0)
    found: list[Run] = []
    offset = count
    while offset > 0 and len(found) < limit:
        page = max(limit * 2, 100)
        offset = max(0, offset - page)
        batch = store.runs(status=RunStatus.WAITING, limit=page, offset=offset)
        # A run waiting only for its child runs (inputs "child:...") is not for a person.
        found.extend(r for r in reversed(batch)
                     if any(not w.startswith("child:") for w in r.waiting_for))
    return count, found[:limit]


def _pending(store: Store, run_id: str) -> set[str]:
    try:
        return set(store.inputs(run_id))
    except PitstopError:
        return set()


def input_forms(head: CheckpointSummary | None, names: Sequence[str]) -> dict[str, Any]:
    """What the send form of each input starts from: for an input the waiting step declared
    (``input_schema=``), a payload of its fields (defaults, else empty values), the fields
    with their types, and approve/reject buttons if it has a boolean ``approved``; for an
    undeclared one nothing (an empty editor: no payload the workflow did not declare)."""
    import json

    from ..schemas import template

    declared = head.metadata.get("input_schemas") if head is not None else None
    forms: dict[str, Any] = {}
    for name in names:
        schema = declared.get(name) if isinstance(declared, Mapping) else None
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            forms[name] = {"template": "", "fields": [], "decide": False}
            continue
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        fields = [{"name": str(field), "type": _type_label(sub), "required": field in required}
                  for field, sub in properties.items() if isinstance(sub, Mapping)]
        approved = properties.get("approved")
        start = template(dict(schema))
        decide = isinstance(approved, Mapping) and approved.get("type") == "boolean"
        forms[name] = {
            "template": json.dumps(start),
            "fields": fields,
            "decide": decide,
            "approve": json.dumps({**start, "approved": True}) if decide else "",
            "reject": json.dumps({**start, "approved": False}) if decide else "",
        }
    return forms


def _type_label(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(json_text(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " | ".join(_type_label(o) for o in schema["anyOf"] if isinstance(o, Mapping))
    return str(schema.get("title") or schema.get("type") or "any")


def json_text(value: Any) -> str:
    import json

    return json.dumps(value)


def _shown(run: Run, head: Checkpoint | None) -> tuple[dict[str, Any], list[str]]:
    if head is None:
        return {}, []
    state: Mapping[str, Any] = head.state
    if langgraph_view.is_thread(run.workflow):
        state = langgraph_view.channels(state)
    wanted = head.metadata.get("show")
    if isinstance(wanted, list) and wanted:
        names = [str(n) for n in wanted if n in state]
        return {n: state[n] for n in names}, names
    return dict(state), []


# -- one run -------------------------------------------------------------------------------------


def checkpoint_row(entry: CheckpointSummary, *, head_id: str | None) -> dict[str, Any]:
    meta = entry.metadata
    origin = fork_origin(entry) if ends_here(entry) else None
    tags = [str(t) for t in entry.tags]
    return {
        "id": entry.id,
        "run_id": entry.run_id,
        "parent_id": entry.parent_id,
        "step": entry.step,
        "step_name": text_or_none(meta.get("step_name")),
        "step_label": step_label(meta),  # the step it stopped in, for a waiting checkpoint
        "next_step": text_or_none(meta.get("next")),
        "source": text_or_none(entry.source),
        "status": text_or_none(meta.get("status")),
        "created_at": entry.created_at,
        "size": entry.size,
        "added": entry.added,
        "tags": tags,
        "milestone": bool(tags),
        "head": entry.id == head_id,
        "waiting_for": [str(w) for w in meta.get("waiting_for") or ()],
        "resumed_from": text_or_none(meta.get("resumed_from")) if entry.source == "resume"
        else None,
        "forked_from": to_jsonable(dict(origin)) if origin else None,
        "error": to_jsonable(error_of(entry)),
        "cached": [to_jsonable(dict(item)) for item in meta.get("cached") or ()
                   if isinstance(item, dict)],
    }


def history(
    store: Store, run: Run, *, before: str | None = None, limit: int = HISTORY_PAGE
) -> dict[str, Any]:
    """A page of the run's checkpoint tree, newest first, with the lanes to draw it."""
    entries = store.history(run.id, limit=limit + 1, before=before)
    more = len(entries) > limit
    entries = entries[:limit]
    rows = layout(entries, ends_here=ends_here)
    return {
        "run_id": run.id,
        "head_id": run.head_id,
        "checkpoints": [
            {**checkpoint_row(e, head_id=run.head_id), "branch_point": g.branch_point,
             "lane": g.lanes.col}
            for e, g in zip(entries, rows, strict=True)
        ],
        "graph": rows,
        "next": entries[-1].id if more and entries else None,
    }


def run_detail(store: Store, run_id: str) -> dict[str, Any]:
    """The run page's header: the run, its head's position and error, inputs, forks."""
    run = store.get_run(run_id)
    head = _head(store, run)
    row = run_row(run, head)
    row["error"] = error_of(head) if run.status is RunStatus.FAILED and head else None
    row["pending"] = sorted(_pending(store, run.id))
    row["asks"] = [n for n in run.waiting_for if n not in row["pending"]]
    row["forms"] = input_forms(head, row["asks"])
    origin = run.metadata.get("forked_from")
    row["forked_from"] = str(origin) if isinstance(origin, str) else None
    row["forks"] = []  # forks_of(): a scan of every run's metadata, asked for separately
    row["langgraph"] = langgraph_view.is_thread(run.workflow)
    if row["langgraph"] and run.status is RunStatus.RUNNING and head is not None \
            and langgraph_view.next_nodes(head.metadata) is None:
        # The saver did not record LangGraph's next nodes: tell them from the head's
        # channels (one run's head, read on this page only, never for a listing).
        try:
            fields = store.get(head.id, strict=False).state.keys()
        except PitstopError:
            fields = None
        row["idle"] = langgraph_view.idle(run.status.value, head.metadata, fields)
    actions = run.metadata.get("ui_actions")
    row["actions"] = list(actions)[-10:] if isinstance(actions, list) else []
    row["parent"], row["children"] = family(store, run)
    return row


TIMELINE_CHECKPOINTS = 200
"""The newest checkpoints the run page's timeline covers (a long run: its recent past)."""


def run_timeline(store: Store, run_id: str) -> dict[str, Any]:
    """The run page's timeline: spans placed on a 0-1000 lane (an SVG's coordinates: the
    page's CSP forbids inline styles), events, loop progress (see :mod:`pitstop.observe`)."""
    from ..observe import events, progress, timeline

    run = store.get_run(run_id)
    spans = timeline(store, run_id, limit=TIMELINE_CHECKPOINTS, children=CHILDREN_SHOWN)
    origin = run.created_at.timestamp()
    now = time.time()
    last = max([origin, *(span.end or now for span in spans)])
    scale = (last - origin) or 1.0
    rows = []
    for span in spans:
        row = span.to_json()
        left = (span.start - origin) / scale * 1000
        right = ((span.end or now) - origin) / scale * 1000
        row["x"], row["width"] = round(left, 1), round(max(right - left, 2.0), 1)
        row["offset"] = span.start - origin
        row["open"] = span.end is None
        rows.append(row)
    happened = events(store, run_id, limit=TIMELINE_CHECKPOINTS)
    return {"spans": rows, "events": [event.to_json() for event in happened],
            "progress": [loop.to_json() for loop in progress(store, run_id)],
            "total_seconds": last - origin}


CHILDREN_SHOWN = 20
"""Children the run page and ``GET /api/runs/{id}`` list by name (the counts cover all)."""


def family(store: Store, run: Run) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The run that started this one (where and in which step), and this run's children:
    counted by status, the first :data:`CHILDREN_SHOWN` listed (one count over the parent
    index and one page of runs, however many children there are; as ``pitstop show``)."""
    parent = None
    if run.parent_run is not None:
        link = run.metadata.get("parent")
        link = link if isinstance(link, Mapping) else {}
        parent = {"run_id": run.parent_run,
                  "checkpoint_id": text_or_none(link.get("checkpoint_id")),
                  "step": text_or_none(link.get("step"))}
    counts, first = store.children_summary(run.id, first=CHILDREN_SHOWN)
    return parent, {
        "total": sum(counts.values()),
        "counts": {s: counts[s] for s in STATUSES if counts.get(s)},
        "first": [{"id": c.id, "status": c.status.value, "workflow": c.workflow,
                   "waiting_for": list(c.waiting_for)} for c in first],
    }


def stream_job(store: Store, job: str, *, lag: bool = True) -> dict[str, Any] | None:
    """A stream job's partitions and their sum (``pitstop stream status``'s data), or None
    when the store holds no partition of ``job``."""
    from ..stream.status import job_status, summarise

    parts = job_status(store, job, lag=lag)
    if not parts:
        return None
    return {"job": job, "summary": summarise(parts).to_json(),
            "partitions": [p.to_json() for p in parts]}


def stream_of(run: Run) -> str | None:
    """The stream job a partition run (workflow ``stream:JOB``) belongs to."""
    workflow = run.workflow or ""
    return workflow[len("stream:"):] if workflow.startswith("stream:") else None


def forks_of(store: Store, run_id: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """The runs forked from this one. Nothing indexes metadata, so this reads every run's:
    the run page asks for it on demand, not on every load."""
    store.get_run(run_id)
    return [{"id": f.id, "status": f.status.value, "created_at": f.created_at}
            for f in store.runs(metadata={"forked_from": run_id}, limit=limit)]


def checkpoint_detail(store: Store, ckpt: Checkpoint, run: Run) -> dict[str, Any]:
    """A checkpoint with its state (JSON view), metadata, consumed inputs and effects."""
    row = checkpoint_row(ckpt, head_id=run.head_id)
    state: Mapping[str, Any] = ckpt.state
    thread = langgraph_view.is_thread(run.workflow)
    if thread:
        state = langgraph_view.channels(state)
    consumed = ckpt.metadata.get("inputs")
    inputs = []
    if isinstance(consumed, Mapping) and consumed:
        try:
            delivered = {i.id: i for i in store.inputs(run.id, pending=False).values()}
        except PitstopError:
            delivered = {}
        for name, input_id in consumed.items():
            found = delivered.get(str(input_id))
            inputs.append({
                "name": str(name),
                "id": str(input_id),
                "payload": to_jsonable(found.payload) if found else None,
                "created_at": found.created_at if found else None,
            })
    effects: dict[str, Any] = {}
    if ckpt.parent_id is not None:
        try:
            effects = store.effects(run.id, checkpoint_id=ckpt.parent_id)
        except PitstopError:
            effects = {}
    return {
        "checkpoint": row,
        "metadata": to_jsonable(dict(ckpt.metadata)),
        "state": to_jsonable(dict(state)),
        "live_state": state,
        "inputs": inputs,
        "effects": {str(k): to_jsonable(v) for k, v in effects.items()} if not thread else {},
        "conversation": langgraph_view.conversation(state.get("messages")) if thread else [],
        "langgraph": thread,
    }


def diff(old: Checkpoint, new: Checkpoint, *, threads: tuple[bool, bool]) -> list[dict[str, Any]]:
    """Field-level differences from ``old`` to ``new``; changed strings carry a text diff."""
    from ..display.state import diff as state_diff
    from .values import text_diff

    views = []
    for ckpt, thread in zip((old, new), threads, strict=True):
        state: Mapping[str, Any] = ckpt.state
        if thread:
            state = langgraph_view.channels(state)
        views.append(to_jsonable(dict(state)))
    out = []
    for change in state_diff(views[0], views[1]):
        item = change.to_json()
        if change.op == "changed" and isinstance(change.old, str) and isinstance(change.new, str):
            item["text"] = [{"op": op, "text": text} for op, text in
                            text_diff(change.old, change.new)]
        out.append(item)
    return out


__all__ = [
    "HISTORY_PAGE",
    "PAGE",
    "STATUSES",
    "RunFilter",
    "checkpoint_detail",
    "checkpoint_row",
    "diff",
    "history",
    "inbox",
    "list_runs",
    "run_detail",
    "run_row",
]
