"""``show``, ``history`` and ``diff``: one checkpoint's state, a run's checkpoint tree, two
states compared field by field.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from pitstop.display.graph import ends_here, fork_origin
from pitstop.display.runs import step_label
from pitstop.display.text import age, duration, human_bytes, short
from pitstop.failures import failure_in
from pitstop.model import CheckpointSummary, Run, RunStatus

from .children import Family, children_note
from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Session,
    cached_note,
    checkpoint_json,
    find_in_run,
    load_checkpoint,
    resolve,
    run_reference,
    state_view,
)
from .group import command
from .render import Column, local_time, status_cell, styled

if TYPE_CHECKING:
    from pitstop.failures import RunFailure
    from pitstop.stream.status import PartitionStatus


def _header(run: Run, ckpt: CheckpointSummary,
            failure: RunFailure | None) -> list[tuple[str, Any]]:
    meta = ckpt.metadata
    name = meta.get("step_name")
    head = " (head)" if ckpt.id == run.head_id else ""
    waiting = meta.get("waiting_for") or ()
    failed: list[tuple[str, Any]] = []
    if failure is not None:
        attempt = f" (attempt {failure.attempt})" if failure.attempt else ""
        label = "failed step" if meta.get("status") == RunStatus.FAILED.value else "retried step"
        failed = [(label, styled(f"{failure.step or '?'}{attempt}", "bold red")),
                  ("error", styled(failure.headline, "red"))]
    return [
        ("run", f"{run.id} ({run.workflow or 'no workflow'})"),
        ("run status", status_cell(run.status.value)),
        ("checkpoint", ckpt.id + head),
        ("step", f"{ckpt.step}" + (f" · {name}" if name else "")),
        ("status", status_cell(meta.get("status"))),
        *failed,
        ("source", ckpt.source or "-"),
        ("time", f"{local_time(ckpt.created_at)} ({age(ckpt.created_at)} ago)"),
        ("took", duration(_seconds(meta.get("duration")))),
        ("size", f"{human_bytes(ckpt.size)} state, +{human_bytes(ckpt.added)} stored"),
        ("tags", ", ".join(ckpt.tags)),
        ("cached", cached_note(ckpt).removeprefix("cached: ")),
        ("waiting for", ", ".join(waiting)),
        ("next", meta.get("next") or ""),
    ]


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


TIMELINE_CHECKPOINTS = 500
"""The newest checkpoints ``show --timeline`` covers."""

TIMELINE_COLUMNS = [
    Column("start", right=True),
    Column("took", right=True),
    Column("kind"),
    Column("what", max_width=32),
    Column("", max_width=40),
    Column("detail", max_width=48),
]

_SPAN_STYLE = {"retry": "yellow", "failed": "bold red", "wait": "cyan", "child": "magenta",
               "map": "blue"}


def _bar(start: float, end: float, origin: float, scale: float, width: int) -> str:
    """The span as a bar in a ``width``-wide lane from ``origin`` (``scale`` seconds)."""
    left = int((start - origin) / scale * width) if scale else 0
    right = int((end - origin) / scale * width) if scale else 0
    left = min(max(left, 0), width - 1)
    return " " * left + "█" * max(1, min(right, width) - left)


def _show_timeline(s: Session, store: Any, run: Run) -> None:
    from datetime import UTC, datetime

    from pitstop.observe import events, progress, timeline

    spans = timeline(store, run.id, limit=TIMELINE_CHECKPOINTS)
    happened = events(store, run.id, limit=TIMELINE_CHECKPOINTS)
    loops = progress(store, run.id)
    if s.as_json:
        s.out.json({"run": {"id": run.id, "status": run.status.value, "workflow": run.workflow},
                    "timeline": [span.to_json() for span in spans],
                    "events": [event.to_json() for event in happened],
                    "progress": [loop.to_json() for loop in loops]})
        return
    origin = run.created_at.timestamp()
    now = datetime.now(UTC).timestamp()
    last = max([origin, *(span.end or now for span in spans)])
    scale, width = last - origin, 40
    rows = [[
        "+" + duration(span.start - origin),
        duration(span.seconds) if span.end is not None else styled("…", "cyan"),
        styled(span.kind, _SPAN_STYLE.get(span.kind, "")),
        span.label,
        styled(_bar(span.start, span.end or now, origin, scale, width),
               _SPAN_STYLE.get(span.kind, "green")),
        span.detail,
    ] for span in spans]
    s.out.fields([("run", f"{run.id} ({run.workflow or 'no workflow'})"),
                  ("status", status_cell(run.status.value)),
                  ("created", local_time(run.created_at)),
                  *((f"progress {loop.name}", str(loop)) for loop in loops)])
    s.out.line()
    s.out.table(TIMELINE_COLUMNS, rows, title="timeline",
                empty="no timed steps yet (checkpoints before pitstop recorded durations)")
    s.out.line()
    s.out.line("events", "bold")
    for event in happened:
        at = datetime.fromtimestamp(event.at, UTC)
        s.out.line(f"  {local_time(at)}  {event.kind:<9} {event.detail}".rstrip())


@command("show", examples=["pitstop show 7f3a9c", "pitstop show 7f3a9c --checkpoint 1b2c3d4e",
                           "pitstop show 7f3a9c --field 'messages[-1].content'",
                           "pitstop show 7f3a9c --full | less"])
@click.argument("run_id", metavar="RUN")
@click.option("--checkpoint", "-c", "ref", metavar="ID",
              help="A checkpoint of the run (full id or the short id `history` shows). "
                   "Default: the latest.")
@click.option("--field", "-f", "path", metavar="PATH",
              help="Show only this field, whole: a name or a path like messages[3].content.")
@click.option("--full", is_flag=True,
              help="Show long values whole (by default long strings and lists are shortened, "
                   "with a marker; --json is never shortened).")
@click.option("--timeline", "as_timeline", is_flag=True,
              help="Show the run's timeline instead of its state: steps with their "
                   "durations, retries, waits, children and maps, then its events (created, "
                   "claimed, inputs, effects, retries, failures...) and loop progress.")
@click.option("--no-lag", is_flag=True,
              help="A stream partition: do not ask its broker for its lag.")
def show(s: Session, run_id: str, ref: str | None, path: str | None, full: bool,
         as_timeline: bool, no_lag: bool) -> None:
    """Show a run's state (its latest checkpoint, or the one named) with its header.

    For a failed run: the failed step, the exception and its traceback. A loop's progress
    (``ctx.iterate``, ``Checkpointer.iterate``) shows as "32,000 / 300,000" with a rate. A
    stream job's partition shows its position, records, lag (records in the stream after
    the position, where the broker can tell), records/s over its last checkpoints and
    outbox.
    """
    from pitstop.display.state import PathNotFound, lookup, shorten
    from pitstop.failures import failure_in
    from pitstop.serde import to_jsonable

    store = s.store()
    run, at = run_reference(store, run_id)
    if as_timeline:
        _show_timeline(s, store, run)
        return
    if at is not None and ref is not None:
        raise CliError(f"{run_id!r} names a checkpoint already; drop --checkpoint {ref}")
    if at is not None or ref is not None:
        ckpt = load_checkpoint(store, at or find_in_run(store, run.id, str(ref)))
    else:
        latest = store.latest(run.id, strict=False)
        if latest is None:
            raise CliError(f"run {run.id!r} has no checkpoints yet")
        ckpt = latest
    failure = failure_in(ckpt)
    family = Family.of(store, run)
    from pitstop.observe import progress

    loops = progress(store, run.id)
    partition = _partition(store, run, lag=not no_lag)
    view = to_jsonable(state_view(store, ckpt))
    if path is not None:
        try:
            view = lookup(view, path)
        except (PathNotFound, ValueError) as exc:
            raise CliError(f"--field: {exc}") from None
    if s.as_json:
        doc: dict[str, Any] = {
            "run": {"id": run.id, "status": run.status.value, "workflow": run.workflow},
            "checkpoint": checkpoint_json(ckpt, head_id=run.head_id),
            "error": failure.to_json() if failure is not None else None,
            "progress": [loop.to_json() for loop in loops],
            **family.to_json(),
        }
        if partition is not None:
            doc["stream"] = partition.to_json()
        doc.update({"field": path, "value": view} if path is not None else {"state": view})
        s.out.json(doc)
        return
    s.out.fields(_header(run, ckpt, failure) + family.fields()
                 + [(f"progress {loop.name}", str(loop)) for loop in loops]
                 + (_partition_fields(partition, ckpt.id == run.head_id)
                    if partition is not None else [])
                 + ([("field", path)] if path else []))
    family.table(s.out)
    if failure is not None and failure.traceback:
        s.out.line()
        s.out.line(failure.traceback.rstrip("\n"), "red")
    s.out.line()
    shortened = 0
    if not full and path is None:
        view, shortened = shorten(view)
    s.out.value(view)
    if shortened:
        s.out.note(f"{shortened} long value{'s' if shortened != 1 else ''} shortened (marked …); "
                   "--full shows everything, --field PATH one value whole")


def _partition(store: Any, run: Run, *, lag: bool) -> PartitionStatus | None:
    """A stream job's partition run's figures (None for any other run)."""
    if not (run.workflow or "").startswith("stream:"):
        return None
    from pitstop.stream.status import is_partition, partitions_status

    return partitions_status(store, [run], lag=lag)[0] if is_partition(run) else None


def _partition_fields(part: PartitionStatus, shown_head: bool) -> list[tuple[str, Any]]:
    """The partition as of its newest checkpoint (which the shown one may not be)."""
    def number(value: float | None, unit: str = "") -> str:
        return "unknown" if value is None else f"{value:,.0f}{unit}"

    return [
        ("position", f"{part.position or '-'}" + ("" if shown_head else " (at its head)")),
        ("records", f"{part.records:,}"),
        ("lag", number(part.lag, " records behind")),
        ("rate", number(part.records_per_second, " records/s")),
        ("outbox", f"{part.outbox:,} outputs not yet known delivered"),
        ("owner", part.owner or "none (no job.run owns it)"),
    ]


# -- history ---------------------------------------------------------------------------------

HISTORY_COLUMNS = [
    Column(""),
    Column("id", style="bold"),
    Column("step", right=True),
    Column("name", max_width=24),
    Column("source"),
    Column("status"),
    Column("time"),
    Column("took", right=True),
    Column("size", right=True),
    Column("added", right=True),
    Column("tags", max_width=24),
    Column("note", max_width=48),
]


def _note(entry: CheckpointSummary, head_id: str | None, branch_point: bool) -> str:
    notes = []
    if entry.id == head_id:
        notes.append("head")
    if branch_point:
        notes.append("branch point")
    resumed = entry.metadata.get("resumed_from")
    if entry.source == "resume" and resumed:
        notes.append(f"resumed from {short(resumed)}")
    origin = fork_origin(entry)
    if origin is not None and ends_here(entry):
        notes.append(f"forked from {origin.get('run_id')}@{short(origin.get('checkpoint_id'))}")
    failure = failure_in(entry)
    if failure is not None:
        notes.append(f"{failure.headline} (in {failure.step or '?'})")
    started = children_note(entry)
    if started:
        notes.append(started)
    served = cached_note(entry)
    if served:
        notes.append(served)
    return ", ".join(notes)



@command("history", examples=["pitstop history 7f3a9c", "pitstop history 7f3a9c --limit 0 --json"])
@click.argument("run_id", metavar="RUN")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="Show the newest N checkpoints (0: all).")
def history(s: Session, run_id: str, limit: int) -> None:
    """Show a run's checkpoint tree, newest first, with its branches.

    Resuming from an earlier checkpoint starts a branch: the graph shows where branches
    leave (a branch point) and a forked run's origin. Short ids are the last characters of
    checkpoint ids; `show --checkpoint`, `resume --from` and RUN@ID references accept them.
    """
    from .graph import ASCII, UNICODE, layout

    store = s.store()
    run, _ = run_reference(store, run_id)
    run_id = run.id
    entries = store.history(run_id, limit=limit + 1 if limit else None)
    more = bool(limit) and len(entries) > limit
    read, entries = entries, entries[:limit] if limit else entries
    unicode = s.out.rich or (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
    graph = layout(entries, head_id=run.head_id, ends_here=ends_here,
                   glyphs=UNICODE if unicode else ASCII)
    if s.as_json:
        s.out.json({
            "run_id": run.id,
            "status": run.status.value,
            "head_id": run.head_id,
            "forked_from": run.metadata.get("forked_from"),
            "checkpoints": [
                {**checkpoint_json(e, head_id=run.head_id), "branch_point": g.branch_point,
                 "note": _note(e, run.head_id, g.branch_point)}
                for e, g in zip(entries, graph, strict=True)
            ],
            "more": more,
        })
        return
    from pitstop.observe.timelines import step_times
    from pitstop.store.contract.lookup import short_ids

    shown = short_ids(e.id for e in entries)  # unique in the listing, lengthened if need be
    times = step_times(read[::-1])  # (a LangGraph step's: from its parent's timestamp)
    rows = []
    for entry, row in zip(entries, graph, strict=True):
        meta = entry.metadata
        rows.append([
            styled(row.prefix, "magenta"),
            styled(shown[entry.id], "bold green" if entry.id == run.head_id else "bold"),
            str(entry.step),
            step_label(meta),
            entry.source or "-",
            status_cell(meta.get("status")),
            local_time(entry.created_at),
            duration(times[entry.id][1] if entry.id in times else None),
            human_bytes(entry.size),
            "+" + human_bytes(entry.added),
            ", ".join(entry.tags) or "-",
            _note(entry, run.head_id, row.branch_point),
        ])
    origin = run.metadata.get("forked_from")
    title = f"run {run.id} ({run.workflow or 'no workflow'}), {run.status.value}, " \
            f"{run.checkpoints} checkpoints" + (f", forked from {origin}" if origin else "")
    s.out.table(HISTORY_COLUMNS, rows, title=title, empty=f"run {run_id!r} has no checkpoints")
    if more:
        s.out.note(f"older checkpoints not shown: --limit {limit * 4} or --limit 0 for all")


# -- diff ------------------------------------------------------------------------------------


@command("diff", examples=["pitstop diff 7f3a9c@1b2c3d4e 7f3a9c",
                           "pitstop diff 0193c1d2-...-9f1e 7f3a9c-fork --json"])
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--exit-code", is_flag=True, help="Exit with status 1 if the states differ.")
def diff(s: Session, a: str, b: str, exit_code: bool) -> int:
    """Compare two checkpoints' states field by field (added, removed, changed).

    A and B are checkpoint ids, run ids (their latest checkpoint), or RUN@ID with a short
    id from `pitstop history RUN`. Nested paths look like messages[3].content.
    """
    from pitstop.display.state import compact
    from pitstop.display.state import diff as state_diff
    from pitstop.serde import to_jsonable

    store = s.store()
    old, new = (load_checkpoint(store, resolve(store, ref)) for ref in (a, b))
    changes = state_diff(to_jsonable(state_view(store, old)),
                         to_jsonable(state_view(store, new)))
    counts = {op: sum(c.op == op for c in changes) for op in ("added", "removed", "changed")}
    if s.as_json:
        s.out.json({"a": checkpoint_json(old), "b": checkpoint_json(new),
                    "changes": [c.to_json() for c in changes], **counts})
    else:
        for label, ckpt in (("a", old), ("b", new)):
            name = ckpt.metadata.get("step_name")
            s.out.line(f"{label}: {ckpt.id}  run {ckpt.run_id}  step {ckpt.step}"
                       + (f" · {name}" if name else ""), "dim")
        for c in changes:
            if c.op == "added":
                s.out.line(f"+ {c.path}: {compact(c.new)}", "green")
            elif c.op == "removed":
                s.out.line(f"- {c.path}: {compact(c.old)}", "red")
            else:
                s.out.line(f"~ {c.path}: {compact(c.old, 60)} → {compact(c.new, 60)}", "yellow")
        summary = ", ".join(f"{n} {op}" for op, n in counts.items() if n)
        s.out.line(f"{len(changes)} change{'s' if len(changes) != 1 else ''}"
                   + (f": {summary}" if summary else " (identical states)"), "bold")
    return EXIT_PROBLEMS if exit_code and changes else EXIT_OK


__all__ = ["diff", "history", "show"]
