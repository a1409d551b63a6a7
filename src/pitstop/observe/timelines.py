"""A run's timeline, its event list and its loops' progress, read from what the store holds.

The runtime writes two numbers into each checkpoint's metadata: ``started_at`` (when the first
step since the previous checkpoint began, epoch seconds) and ``duration`` (seconds step code
ran since then, every attempt of a retried step included); its first save after claiming a
run adds ``claimed_by`` (the lease owner). A :class:`~pitstop.Checkpointer` writes the same
two numbers per save (the loop's time since its previous save). Everything else comes from
rows the store keeps anyway: the run (created, status, fork origin), checkpoint metadata
(status, step, errors, waits, children started), input rows and effect rows (their keys and
times, never their values), child runs. Listing never deserialises state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..model import CheckpointSummary, Run, RunStatus

EFFECT_ROWS_MAX = 10_000
"""Effect rows a timeline reads at most (a map of a million items is summarised from these)."""


@dataclass(frozen=True, slots=True)
class Span:
    """Something that took time in a run: a step (or the steps one checkpoint covers), a
    failed attempt, a wait, a child run, a map's items, a loop's stretch between saves."""

    kind: str
    """``step``, ``retry`` (an attempt that failed and was retried), ``failed``, ``wait``,
    ``child``, ``map`` or ``loop``."""
    label: str
    start: float
    """Epoch seconds."""
    end: float | None
    """Epoch seconds; None while it lasts (a wait not over, a child still running)."""
    checkpoint_id: str | None = None
    detail: str = ""

    @property
    def seconds(self) -> float | None:
        """How long it took (None while it lasts)."""
        return None if self.end is None else max(0.0, self.end - self.start)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "start": self.start, "end": self.end,
                "seconds": self.seconds, "checkpoint_id": self.checkpoint_id,
                "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a run, at one moment."""

    at: float
    """Epoch seconds."""
    kind: str
    """``created``, ``forked``, ``claimed``, ``input``, ``effect``, ``map``, ``child``,
    ``retried``, ``waiting``, ``failed``, ``completed``, ``cancelled``, ``edited``."""
    detail: str
    checkpoint_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "detail": self.detail,
                "checkpoint_id": self.checkpoint_id}


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a resumable loop (``ctx.iterate``, ``Checkpointer.iterate``) got, as last
    recorded: ``str()`` gives ``32,000 / 300,000 (10.7%) · 1,250/s``."""

    name: str
    done: int
    total: int | None
    rate: float | None
    """Items a second since the process running it started (None if not measurable)."""
    at: float | None
    """When this position was recorded (epoch seconds)."""
    step: str | None = None
    """The workflow step iterating (``ctx.iterate``), None for a ``Checkpointer`` loop."""

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None

    @property
    def remaining_seconds(self) -> float | None:
        """At the recorded rate, the time to the end (None if unknown)."""
        if self.total is None or not self.rate:
            return None
        return max(0, self.total - self.done) / self.rate

    def __str__(self) -> str:
        text = f"{self.done:,}" + (f" / {self.total:,}" if self.total is not None else "")
        if self.fraction is not None:
            text += f" ({self.fraction:.1%})"
        if self.rate is not None:
            text += f" · {self.rate:,.0f}/s" if self.rate >= 10 else f" · {self.rate:.2g}/s"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "step": self.step, "done": self.done, "total": self.total,
                "rate": self.rate, "at": self.at, "text": str(self)}


# -- reading ------------------------------------------------------------------------------------


def _record_rows(store: Any, run_id: str) -> tuple[list[Any], list[Any]]:
    """The run's input rows (name, time, consumer) and effect rows (key, time): columns
    only, never a payload."""

    def read(tx: Any) -> tuple[list[Any], list[Any]]:
        inputs = tx.all("SELECT name, created_at, consumed_by FROM pitstop_inputs "
                        "WHERE run_id = ? ORDER BY created_at", (run_id,))
        effects = tx.all("SELECT key, created_at FROM pitstop_effects WHERE run_id = ? "
                         "ORDER BY created_at LIMIT ?", (run_id, EFFECT_ROWS_MAX))
        return inputs, effects

    return store._tx(read)  # type: ignore[no-any-return]


def _effect_name(run_id: str, key: str) -> tuple[str | None, str]:
    """(step, name) of an effect key ``run:branch:position:step:name`` (see
    ``StepContext.idempotency_key``); (None, key) for a key of another shape."""
    parts = key.removeprefix(run_id + ":").split(":", 3)
    return (parts[2], parts[3]) if len(parts) == 4 else (None, key)


def _map_name(name: str) -> str | None:
    """The map of a map item's record name ``map[fn][index]``, else None."""
    if name.startswith("map[") and name.endswith("]") and "][" in name:
        return name[4:name.rindex("][")]
    return None


def _history(store: Any, run_id: str, limit: int | None) -> list[CheckpointSummary]:
    return list(reversed(store.history(run_id, limit=limit)))  # oldest first


def _ts(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one: metadata is data, whatever wrote it."""
    return value if isinstance(value, Mapping) else {}


def _langgraph_ts(meta: Mapping[str, Any]) -> float | None:
    """The ``ts`` LangGraph gave a checkpoint when it made it (PitstopSaver keeps it in
    ``langgraph.checkpoint``), epoch seconds; None if there is none."""
    ts = _mapping(_mapping(meta.get("langgraph")).get("checkpoint")).get("ts")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


def step_times(entries: list[CheckpointSummary]) -> dict[str, tuple[float, float]]:
    """Checkpoint id -> (when its work began, seconds it took), of ``entries`` (oldest
    first): as the runtime recorded them (``started_at``, ``duration``), or, for a LangGraph
    superstep saved by PitstopSaver, worked out here from the timestamps LangGraph wrote: from
    its parent's ``ts`` (or, for an invocation's first step, from when the saver read the
    parent: ``langgraph.started``) to its own. Nothing is measured at ``put``; a step whose
    parent is not among ``entries`` has no time."""
    times: dict[str, tuple[float, float]] = {}
    stamps: dict[str, float] = {}
    for entry in entries:
        meta = entry.metadata
        started = _ts(meta.get("started_at"))
        if started is not None:
            times[entry.id] = (started, _ts(meta.get("duration")) or 0.0)
            continue
        ts = _langgraph_ts(meta) if "langgraph" in meta else None
        if ts is None:
            continue
        stamps[entry.id] = ts
        if entry.source != "loop":
            continue  # an input, an update_state: no node ran
        began = _ts(_mapping(meta.get("langgraph")).get("started"))
        if began is None and entry.parent_id is not None:
            began = stamps.get(entry.parent_id)
        if began is not None:
            times[entry.id] = (began, max(0.0, ts - began))
    return times


def _wait_label(meta: Mapping[str, Any]) -> str:
    if meta.get("source") == "retry":
        return "retry backoff"
    waiting = meta.get("waiting_for")
    if isinstance(waiting, list) and waiting:
        return "waiting for " + ", ".join(str(name) for name in waiting)
    wake = _ts(meta.get("wake_at"))
    if wake is not None:
        return "sleeping until " + time.strftime("%H:%M:%S", time.localtime(wake))
    return "waiting"


def _error_text(meta: Mapping[str, Any]) -> str:
    error = meta.get("error")
    if not isinstance(error, Mapping):
        return ""
    return f"{error.get('type', 'error')}: {error.get('message', '')}".strip()


def timeline(
    store: Any, run_id: str, *, limit: int | None = None, children: int | None = 100
) -> list[Span]:
    """The run's spans in the order they started: steps (with their durations), failed
    attempts, waits, child runs (the first ``children``) and maps. ``limit`` reads only the
    newest checkpoints."""
    run: Run = store.get_run(run_id)
    entries = _history(store, run_id, limit)
    spans: list[Span] = []
    previous_step: int | None = None
    times = step_times(entries)
    for i, entry in enumerate(entries):
        meta = entry.metadata
        timed = times.get(entry.id)
        status = meta.get("status")
        if timed is not None:
            started, duration = timed
            name = str(meta.get("step_name") or "")
            detail = ""
            if entry.source == "retry":
                error = _mapping(meta.get("error"))
                kind = "retry"
                name = str(error.get("step") or meta.get("next") or name)
                detail = f"attempt {error.get('attempt', '?')}: {_error_text(meta)}"
            elif status == RunStatus.FAILED.value:
                kind, detail = "failed", _error_text(meta)
                name = str(_mapping(meta.get("error")).get("step") or meta.get("next") or name)
            elif entry.source == "loop" and "langgraph" not in meta:  # a Checkpointer's
                kind, name = "loop", f"iteration {meta.get('iteration', '?')}"
            else:
                kind = "step"
                covered = entry.step - previous_step if previous_step is not None else 1
                if covered > 1:
                    detail = f"{covered} steps"
            spans.append(Span(kind, name or "step", started, started + duration, entry.id,
                              detail))
        previous_step = entry.step
        if status == RunStatus.WAITING.value:
            following = entries[i + 1] if i + 1 < len(entries) else None
            end: float | None
            if following is not None:
                end = _ts(following.metadata.get("started_at")) or \
                    following.created_at.timestamp()
            elif run.head_id == entry.id and run.status is RunStatus.WAITING:
                end = None
            else:
                end = run.updated_at.timestamp()
            spans.append(Span("wait", _wait_label(meta), entry.created_at.timestamp(), end,
                              entry.id))
    for child in store.children(run_id, limit=children) if children != 0 else ():
        end = child.updated_at.timestamp() if child.status.finished else None
        spans.append(Span("child", child.id, child.created_at.timestamp(), end,
                          detail=f"{child.workflow or '-'}, {child.status.value}"))
    _, effects = _record_rows(store, run_id)
    maps: dict[tuple[str | None, str], list[float]] = {}
    for key, created in effects:
        step, name = _effect_name(run_id, key)
        map_name = _map_name(name)
        if map_name is not None:
            maps.setdefault((step, map_name), []).append(float(created))
    for (step, map_name), stamps in maps.items():
        spans.append(Span("map", map_name, min(stamps), max(stamps),
                          detail=f"{len(stamps):,} items recorded" + (f" in {step}" if step
                                                                     else "")))
    spans.sort(key=lambda span: span.start)
    return spans


def events(store: Any, run_id: str, *, limit: int | None = None) -> list[Event]:
    """What happened to the run, oldest first: created (or forked), claimed by whom, inputs
    received, effects recorded (a map's items as one event), children started, retries,
    waits, failures, completion, cancellation, edits."""
    run: Run = store.get_run(run_id)
    first: list[Event] = [Event(run.created_at.timestamp(), "created",
                                f"workflow {run.workflow}" if run.workflow else "")]
    origin = run.metadata.get("forked_from")
    if origin:
        first.append(Event(run.created_at.timestamp(), "forked", f"from {origin}"))
    found: list[Event] = []
    for entry in _history(store, run_id, limit):
        meta = entry.metadata
        at = entry.created_at.timestamp()
        owner = meta.get("claimed_by")
        if owner:
            found.append(Event(_ts(meta.get("started_at")) or at, "claimed", f"by {owner}",
                               entry.id))
        children = meta.get("children")
        for child in children if isinstance(children, list) else ():
            found.append(Event(at, "child", f"started {child}", entry.id))
        status = meta.get("status")
        step = meta.get("step_name") or meta.get("next") or ""
        if entry.source == "retry":
            error = _mapping(meta.get("error"))
            found.append(Event(at, "retried", f"{error.get('step') or step} attempt "
                               f"{error.get('attempt', '?')}: {_error_text(meta)}", entry.id))
        elif status == RunStatus.FAILED.value:
            found.append(Event(at, "failed", f"{step}: {_error_text(meta)}", entry.id))
        elif status == RunStatus.WAITING.value:
            found.append(Event(at, "waiting", _wait_label(meta), entry.id))
        elif status == RunStatus.COMPLETED.value:
            found.append(Event(at, "completed", "", entry.id))
        elif entry.source in ("update", "fork"):
            kind = "edited" if entry.source == "update" else "forked"
            found.append(Event(at, kind, str(meta.get("reason") or ""), entry.id))
    inputs, effects = _record_rows(store, run_id)
    for name, created, consumed_by in inputs:
        found.append(Event(float(created), "input", f"{name} received" +
                           (f", consumed by {consumed_by}" if consumed_by else ", pending")))
    maps: dict[str, list[float]] = {}
    for key, created in effects:
        step_name, name = _effect_name(run_id, key)
        map_name = _map_name(name)
        if map_name is not None:
            maps.setdefault(map_name, []).append(float(created))
        elif name.startswith("iterate:"):
            continue  # a loop's position, shown as progress
        else:
            found.append(Event(float(created), "effect",
                               f"{name}" + (f" in {step_name}" if step_name else "")))
    for map_name, times in maps.items():
        found.append(Event(min(times), "map", f"{map_name}: {len(times):,} items recorded"))
    if run.status is RunStatus.CANCELLED:
        found.append(Event(run.updated_at.timestamp(), "cancelled", ""))
    # Creation first whatever the clocks say (a step's start is kept to the millisecond).
    found.sort(key=lambda event: event.at)
    return first + found


def _progress_of(name: str, position: Mapping[str, Any], step: str | None
                 ) -> Progress | None:
    """A recorded position as progress; None if it is not one (odd metadata)."""
    done, total, at = position.get("index", 0), position.get("total"), position.get("at")
    if type(done) is not int or (total is not None and type(total) is not int):
        return None
    when = _ts(at)
    rate: float | None = None
    since = position.get("since")
    if when is not None and isinstance(since, list) and len(since) == 2 \
            and type(since[0]) is int and isinstance(since[1], int | float):
        elapsed = when - float(since[1])
        if elapsed > 0 and done >= since[0]:
            rate = (done - since[0]) / elapsed
    return Progress(name, done, total, rate, when, step)


def progress(store: Any, run_id: str) -> list[Progress]:
    """The run's loops as last recorded: a ``Checkpointer``'s iterations (from its latest
    checkpoint's metadata) and the ``ctx.iterate`` loops of the run's latest step that
    iterated (from their position records)."""
    run: Run = store.get_run(run_id)
    found: list[Progress] = []
    if run.head_id is not None:
        positions = _mapping(store.summary(run.head_id).metadata.get("iterate"))
        for name, position in positions.items():
            loop = _progress_of(str(name), position, None) if isinstance(position, Mapping) \
                else None
            if loop is not None:
                found.append(loop)
    # Only the loops' position records (a map's million item records stay in the table;
    # the live run page asks this at every tick).
    keys = store._tx(lambda tx: tx.column(
        "SELECT key FROM pitstop_effects WHERE run_id = ? AND key LIKE ?",
        (run_id, "%:iterate:%")))
    loops: dict[str, tuple[int, str | None, str]] = {}
    for key in keys:
        parts = key.removeprefix(run_id + ":").split(":", 3)
        if len(parts) == 4 and parts[3].startswith("iterate:") and parts[1].isdigit():
            loops[key] = (int(parts[1]), parts[2], parts[3].removeprefix("iterate:"))
    if loops:
        newest = max(position for position, _, _ in loops.values())
        for key, (position, step, name) in loops.items():
            if position != newest:
                continue
            recorded, value = store.get_effect(run_id, key)
            if recorded and isinstance(value, Mapping) and \
                    isinstance(value.get("position"), Mapping):
                loop = _progress_of(name, value["position"], step)
                if loop is not None:
                    found.append(loop)
    return found


def listed_progress(store: Any, run: Run, head: Any = None) -> str | None:
    """A line for a run list (``pitstop runs``, the inspector's runs page): a running
    run's loops (``rows 32,000 / 300,000 (10.7%) · 1,250/s``) or a stream partition's records
    (from its head checkpoint's summary: ``head``, if the caller read it). None for other
    runs: a list reads no more than its running runs' position records."""
    workflow = run.workflow or ""
    if workflow.startswith("stream:"):
        if run.head_id is None:
            return None
        summary = head if head is not None else store.summary(run.head_id)
        records = _mapping(summary.metadata.get("stream")).get("records")
        return f"{records:,} records" if type(records) is int else None
    if run.status is not RunStatus.RUNNING:
        return None
    loops = progress(store, run.id)
    return "; ".join(f"{loop.name} {loop}" for loop in loops) or None


__all__ = ["EFFECT_ROWS_MAX", "Event", "Progress", "Span", "events", "listed_progress",
           "progress", "step_times", "timeline"]
