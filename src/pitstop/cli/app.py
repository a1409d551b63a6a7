"""The ``pitstop`` commands: what each one asks the store and what it shows.

Each command is a thin function: parse its arguments, make one or two store calls, describe
the result to :class:`~pitstop.cli.render.Output`. Opening the store, printing for a terminal,
a pipe or ``--json``, and turning every failure into one line and an exit status are shared
(:func:`command`, :func:`run`), so all commands behave alike.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pitstop.errors import (
    CorruptCheckpointError,
    FieldEditError,
    PitstopError,
    RunExistsError,
    StoreSchemaError,
)
from pitstop.failures import failure_in
from pitstop.model import CheckpointSummary, Run, RunStatus
from pitstop.store.vacuum import Space, VacuumReport, free_space
from pitstop.store.vacuum import vacuum as vacuum_store

from .children import Family, children_note
from .common import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    CliError,
    Session,
    checkpoint_json,
    configure_logging,
    connect,
    find_in_run,
    handling_broken_pipe,
    load_checkpoint,
    load_workflow,
    parse_duration,
    parse_json,
    parse_since,
    resolve,
    run_reference,
    short,
    state_view,
)
from .graph import ends_here, fork_origin
from .render import Cell, Column, age, error_line, human_bytes, local_time, status_cell, styled

if TYPE_CHECKING:
    from pitstop.failures import RunFailure
    from pitstop.owners import Ownership
    from pitstop.runtime import RunResult, Workflow
    from pitstop.store.base import Problem, Progress

STORE_HELP = "Store URL (default: $PITSTOP_STORE, else sqlite:///pitstop.db)."

HELP = """Inspect, steer and maintain pitstop runs.

Every command takes --store URL (or $PITSTOP_STORE; default sqlite:///pitstop.db):
sqlite:///relative.db, sqlite:////absolute.db or postgresql://user@host/db?schema=NAME.
Output is a table on a terminal, plain text when piped, and one JSON document with --json.

RUN is a run id or any unique start of one (01a2326a-2e98). RUN@ID names a checkpoint of
it: ID is the short id `pitstop history` prints, or any unique start or end of the id.

\b
Exit status:
  0  ok
  1  problems found: verify found damage, a command met a corrupt record,
     or a resumed run failed
  2  bad usage or input: unknown option, run or checkpoint, malformed JSON,
     a workflow that does not import, an unusable store (nothing is written)
  3  internal error (a bug: PITSTOP_DEBUG=1 shows the traceback)
"""


class _Ordered(click.Group):
    """Lists commands in the order an operator meets them, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def _version() -> str:
    from pitstop import __version__

    return __version__


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _logging_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-v``, ``-q`` and ``--log-level``: accepted before the command and after it."""
    fn = click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
                      help="Log messages of this level and above to stderr.")(fn)
    fn = click.option("-q", "--quiet", is_flag=True, help="Log errors only.")(fn)
    return click.option("-v", "--verbose", count=True,
                        help="Log more (-v: info, -vv: debug).")(fn)


@click.group(
    cls=_Ordered,
    help=HELP,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="\b\nExample:\n  PITSTOP_STORE=sqlite:///runs.db pitstop runs --status waiting",
)
@click.option("--store", "store_url", metavar="URL", help=STORE_HELP)
@_logging_options
@click.version_option(_version(), "--version", prog_name="pitstop")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, verbose: int, quiet: bool,
        log_level: str | None) -> None:
    ctx.obj = {"store": store_url, "verbose": verbose, "quiet": quiet, "log_level": log_level}


def command(
    name: str, *, examples: Sequence[str], log_level: str = "WARNING", **attrs: Any
) -> Callable[[Callable[..., int | None]], click.Command]:
    """Register a subcommand with what every command has: ``--store``, ``--json``, the
    logging options, an example in its help, a :class:`Session` (closed afterwards) as first
    argument. ``log_level`` is what the command logs without ``-v``/``-q``."""

    def decorate(fn: Callable[..., int | None]) -> click.Command:
        @functools.wraps(fn)
        def invoke(*, store_url: str | None, as_json: bool, verbose: int, quiet: bool,
                   log_level: str | None, **kwargs: Any) -> int:
            root = click.get_current_context().find_root().obj or {}
            configure_logging(
                log_level or root.get("log_level"), default=default_level,
                verbose=verbose + root.get("verbose", 0), quiet=quiet or root.get("quiet", False),
            )
            session = Session(store_url or root.get("store"), as_json=as_json)
            try:
                with handling_broken_pipe():
                    return fn(session, **kwargs) or EXIT_OK
            finally:
                session.close()

        default_level = log_level
        wrapped = _logging_options(invoke)
        wrapped = click.option("--json", "as_json", is_flag=True,
                               help="Print one JSON document (for scripts).")(wrapped)
        wrapped = click.option("--store", "store_url", metavar="URL", help=STORE_HELP)(wrapped)
        epilog = "\b\nExample" + ("s" if len(examples) > 1 else "") + ":\n" + "\n".join(
            f"  {e}" for e in examples
        )
        return cli.command(name, epilog=epilog, **attrs)(wrapped)

    return decorate


class _ParsedType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2
    """A click type from a parse function raising ValueError with a readable message."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SINCE = _ParsedType("since", parse_since)
DURATION = _ParsedType("duration", parse_duration)
STATUSES = [s.value for s in RunStatus]


# -- runs ------------------------------------------------------------------------------------

RUN_COLUMNS = [
    Column("id", style="bold", max_width=40),
    Column("status"),
    Column("workflow", max_width=30),
    Column("step", right=True),
    Column("age", right=True),
    Column("size", right=True),
    Column("checkpoints", right=True),
    Column("detail", max_width=80),
]


def _waiting(run: Run, now: datetime) -> str:
    """What a waiting run needs: input names, and when its timer (a sleep, or the deadline
    of the wait) wakes it."""
    parts = list(run.waiting_for)
    if run.wake_at is not None:
        parts.append("wake due" if run.wake_at <= now else "wakes " + age(run.wake_at, now))
    return ", ".join(parts) or "-"


def _lease_text(lease: Ownership, now: datetime) -> str:
    """The lease as a time from now, never an epoch: ``lease expires in 12s``."""
    if lease.expires_at is None:
        return ""
    if lease.expires_at <= now:
        return f"lease expired {age(lease.expires_at, now)} ago"
    return f"lease expires {age(lease.expires_at, now)}"


def _status_text(run: Run, lease: Ownership) -> str:
    if run.status is RunStatus.RUNNING and lease.owner_gone:
        return "running, owner gone"
    return run.status.value


def _detail(run: Run, lease: Ownership, failure: RunFailure | None, now: datetime) -> Cell:
    """The one thing to know about a run beyond its status, for the DETAIL column."""
    if run.status is RunStatus.WAITING:
        return styled(_waiting(run, now), "yellow")
    if failure is not None:
        return styled(f"{failure.headline} (in {failure.step or '?'})", "red")
    if lease.state == "owner_gone":
        return styled(f"owner {lease.owner} is gone ({_lease_text(lease, now)})", "red")
    if lease.state == "expired":
        return styled(f"{_lease_text(lease, now)}; the next worker takes it", "red")
    if lease.state == "released" or (run.status is RunStatus.QUEUED and lease.state == "none"):
        return "waiting for a worker"
    if lease.state == "held":
        return f"{_lease_text(lease, now)} ({lease.owner})"
    return "-"


def _run_json(run: Run, lease: Ownership | None = None,
              failure: RunFailure | None = None) -> dict[str, Any]:
    doc = {
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
        "metadata": dict(run.metadata),
    }
    if lease is not None:
        doc["lease"] = lease.state
    if failure is not None:
        doc["error"] = {"step": failure.step, "type": failure.type, "message": failure.message,
                        "attempt": failure.attempt}
    return doc


@command("runs", examples=["pitstop runs --status waiting --since 2h",
                           "pitstop runs --workflow vendor-approval --limit 20 --json",
                           "pitstop runs --parent 7f3a9c --status failed"])
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES),
              help="Only runs with this status (repeatable).")
@click.option("--workflow", metavar="NAME", help="Only runs of this workflow.")
@click.option("--since", type=SINCE, metavar="WHEN",
              help="Only runs created since WHEN: a duration back (30m, 2h, 7d) or an ISO date.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Show at most this many.")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Skip this many (paging).")
@click.option("--parent", metavar="RUN", help="Only the child runs RUN's steps started.")
def runs(
    s: Session, *, statuses: tuple[str, ...], workflow: str | None, since: datetime | None,
    limit: int, offset: int, parent: str | None,
) -> None:
    """List runs, newest first: status, position, size, and what each waits for, why it
    failed, or who holds it (``running, owner gone``: its owner died; a worker takes it)."""
    from pitstop.failures import run_failure
    from pitstop.owners import ownership

    store = s.store()
    parent_run = run_reference(store, parent)[0].id if parent is not None else None
    found_all = store.runs(
        status=statuses or None, workflow=workflow, since=since, limit=limit + 1, offset=offset,
        parent_run=parent_run,
    )
    more = len(found_all) > limit
    found = found_all[:limit]
    now = datetime.now(UTC)
    leases = [ownership(r, now) for r in found]
    failures = [run_failure(store, r) for r in found]
    if s.as_json:
        s.out.json({"runs": [_run_json(r, lease, failure)
                             for r, lease, failure in zip(found, leases, failures, strict=True)],
                    "more": more})
        _report_damaged(found_all.damaged)
        return
    rows = [
        [
            r.id,
            styled(_status_text(r, lease), "bold red") if lease.owner_gone
            and r.status is RunStatus.RUNNING else status_cell(r.status.value),
            r.workflow or "-",
            "-" if r.step is None else str(r.step),
            age(r.created_at, now),
            human_bytes(r.bytes),
            str(r.checkpoints),
            _detail(r, lease, failure, now),
        ]
        for r, lease, failure in zip(found, leases, failures, strict=True)
    ]
    s.out.table(RUN_COLUMNS, rows, empty="no runs match")
    if more:
        s.out.note(f"more runs: --offset {offset + limit} for the next page")
    _report_damaged(found_all.damaged)


def _report_damaged(damaged: list[Problem]) -> None:
    """Runs left out of a listing because their rows are damaged: one line, exit status 1."""
    if damaged:
        named = "; ".join(f"{p.id!r} ({p.message})" for p in damaged[:3])
        rest = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
        raise CliError(f"{len(damaged)} damaged run row{'s' if len(damaged) > 1 else ''} not "
                       f"listed: {named}{rest}; run `pitstop verify`", EXIT_PROBLEMS)


# -- show ------------------------------------------------------------------------------------


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
        ("size", f"{human_bytes(ckpt.size)} state, +{human_bytes(ckpt.added)} stored"),
        ("tags", ", ".join(ckpt.tags)),
        ("waiting for", ", ".join(waiting)),
        ("next", meta.get("next") or ""),
    ]


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
def show(s: Session, run_id: str, ref: str | None, path: str | None, full: bool) -> None:
    """Show a run's state (its latest checkpoint, or the one named) with its header.

    For a failed run: the failed step, the exception and its traceback.
    """
    from pitstop.failures import failure_in
    from pitstop.serde import to_jsonable

    from .state import PathNotFound, lookup, shorten

    store = s.store()
    run, at = run_reference(store, run_id)
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
            **family.to_json(),
        }
        doc.update({"field": path, "value": view} if path is not None else {"state": view})
        s.out.json(doc)
        return
    s.out.fields(_header(run, ckpt, failure) + family.fields()
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


# -- history ---------------------------------------------------------------------------------

HISTORY_COLUMNS = [
    Column(""),
    Column("id", style="bold"),
    Column("step", right=True),
    Column("name", max_width=24),
    Column("source"),
    Column("status"),
    Column("time"),
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
    entries = entries[:limit] if limit else entries
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
    rows = []
    for entry, row in zip(entries, graph, strict=True):
        meta = entry.metadata
        rows.append([
            styled(row.prefix, "magenta"),
            styled(short(entry.id), "bold green" if entry.id == run.head_id else "bold"),
            str(entry.step),
            meta.get("step_name") or "-",
            entry.source or "-",
            status_cell(meta.get("status")),
            local_time(entry.created_at),
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
    from pitstop.serde import to_jsonable

    from .state import compact
    from .state import diff as state_diff

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


# -- send, resume, fork, cancel ---------------------------------------------------------------


@command("send", examples=["pitstop send 7f3a9c approval '{\"approved\": true}'",
                           "pitstop send 7f3a9c review @review.json"])
@click.argument("run_id", metavar="RUN")
@click.argument("name")
@click.argument("payload", metavar="JSON|@FILE")
def send(s: Session, run_id: str, name: str, payload: str) -> None:
    """Deliver input NAME to a waiting run (JSON inline, @file.json, or - for stdin).

    The run continues when resumed (`pitstop resume`, or a worker). Refused, with nothing
    stored, if the run does not wait for NAME or has finished.
    """
    value = parse_json(payload, f"the payload of input {name!r}")
    store = s.store()
    run_id = run_reference(store, run_id)[0].id
    delivered = store.send(run_id, name, value)
    run = store.get_run(run_id)
    try:
        pending = set(store.inputs(run_id))
    except PitstopError:  # an undecodable earlier input: say what we know
        pending = {name}
    remaining = [w for w in run.waiting_for if w not in pending]
    if s.as_json:
        s.out.json({"run_id": run_id, "input_id": delivered.id, "name": name,
                    "waiting_for": remaining, "ready": not remaining})
        return
    s.out.line(f"delivered input {name!r} to run {run_id} (input {delivered.id})", "green")
    if remaining:
        s.out.line(f"run {run_id} still waits for: {', '.join(remaining)}")
    else:
        s.out.line(f"run {run_id} waits for nothing more: it continues when resumed "
                   f"(pitstop resume {run_id} --workflow MODULE:ATTR, or a worker)")


def _result(s: Session, result: RunResult) -> int:
    error = dict(result.error) if result.error else None
    if s.as_json:
        s.out.json({
            "run_id": result.run_id,
            "status": result.status.value,
            "step": result.step,
            "waiting_for": list(result.waiting_for),
            "wake_at": result.wake_at,
            "checkpoint_id": result.checkpoint_id,
            "error": error,
        })
    else:
        s.out.fields([
            ("run", result.run_id),
            ("status", status_cell(result.status.value)),
            ("step", result.step or "-"),
            ("waiting for", ", ".join(result.waiting_for)),
            ("wake at", local_time(result.wake_at) if result.wake_at else ""),
            ("checkpoint", result.checkpoint_id or "-"),
            ("error", _headline(error) if error else ""),
        ])
        if error:
            s.out.note(f"pitstop show {result.run_id} shows the traceback")
    return EXIT_PROBLEMS if result.status is RunStatus.FAILED else EXIT_OK


def _headline(error: Mapping[str, Any]) -> str:
    message = str(error.get("message") or "").strip()
    first = message.splitlines()[0] if message else ""
    return f"{error.get('type')}: {first}" if first else str(error.get("type"))


WORKFLOW_HELP = ("The workflow object, as module:attr (the current directory is importable). "
                 "Default: $PITSTOP_WORKFLOW.")


INPUT_HELP = ("The run's input (its first state): JSON inline, @file.json, or - for stdin. "
              "Converted to the workflow's state type like fork --set. Default: no input.")


def _input(workflow: Workflow, text: str | None) -> dict[str, Any]:
    """The ``--input`` of ``start``/``enqueue`` as the workflow's state fields, typed by its
    state type (nested dataclasses built from JSON objects), or one error line."""
    from pitstop.edits import apply_field_edits

    if text is None:
        return {}
    value = parse_json(text, "--input")
    if not isinstance(value, Mapping):
        raise CliError(f"--input must be a JSON object of state fields, not {type(value).__name__}")
    try:
        fields = apply_field_edits({}, value, add=True, state_type=workflow.state_type)
        workflow.adapter.fields_of(fields)  # what start would do: refuse it before writing
    except FieldEditError as exc:
        raise CliError(f"--input: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CliError(f"--input does not fit the state of workflow {workflow.name!r}: "
                       f"{' '.join(str(exc).split())}") from None
    return fields


@command("start", examples=["pitstop start flows:approval --input '{\"vendor\": \"Acme\"}'",
                            "pitstop start flows:approval --input @vendor.json --run-id acme-1",
                            "cat vendor.json | pitstop start flows:approval --input -"])
@click.argument("spec", metavar="MODULE:ATTR")
@click.option("--input", "input_text", metavar="JSON|@FILE|-", help=INPUT_HELP)
@click.option("--run-id", "run_id", metavar="ID", help="Id of the new run (default: a new id).")
def start(s: Session, spec: str, input_text: str | None, run_id: str | None) -> int:
    """Start a run of a workflow and execute it here until it completes, waits or fails.

    MODULE:ATTR names the workflow object (the current directory is importable). Creates
    the store if there is none yet. Exits 1 if the run failed; `pitstop show RUN` says why.
    """
    workflow = load_workflow(spec)
    fields = _input(workflow, input_text)
    store = s.store(create=True, upgrade=True)
    return _result(s, workflow.start(store, fields, run_id=run_id))


@command("enqueue", examples=[
    "pitstop enqueue flows:approval --input '{\"vendor\": \"Acme\"}' --priority 5",
    "pitstop enqueue flows:approval --input @vendor.json --run-id acme-1 --json"])
@click.argument("spec", metavar="MODULE:ATTR")
@click.option("--input", "input_text", metavar="JSON|@FILE|-", help=INPUT_HELP)
@click.option("--run-id", "run_id", metavar="ID", help="Id of the new run (default: a new id).")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Workers take runs of higher priority first.")
def enqueue(s: Session, spec: str, input_text: str | None, run_id: str | None,
            priority: int) -> None:
    """Queue a run of a workflow for a worker (`pitstop worker`) and return at once.

    Creates the store if there is none yet.
    """
    workflow = load_workflow(spec)
    fields = _input(workflow, input_text)
    store = s.store(create=True, upgrade=True)
    run = workflow.enqueue(store, fields, run_id=run_id, priority=priority)
    if s.as_json:
        s.out.json(_run_json(run))
        return
    s.out.line(f"queued run {run.id} ({workflow.name})", "green")
    s.out.note(f"a worker runs it: pitstop worker --workflow {spec}")


@command("resume", examples=["pitstop resume 7f3a9c --workflow flows:approval",
                             "pitstop resume 7f3a9c --from 1b2c3d4e --workflow flows:approval"])
@click.argument("run_id", metavar="RUN")
@click.option("--from", "ref", metavar="ID",
              help="Resume from this earlier checkpoint of the run, on a new branch.")
@click.option("--workflow", "spec", metavar="MODULE:ATTR", required=True,
              envvar="PITSTOP_WORKFLOW", help=WORKFLOW_HELP)
def resume(s: Session, run_id: str, ref: str | None, spec: str) -> int:
    """Continue a run in this process until it completes, waits or fails; print where it is.

    Exits 1 if the run failed.
    """
    workflow = load_workflow(spec)
    store = s.store()
    run, at = run_reference(store, run_id)
    if at is not None and ref is not None:
        raise CliError(f"{run_id!r} names a checkpoint already; drop --from {ref}")
    checkpoint_id = at or (find_in_run(store, run.id, ref) if ref is not None else None)
    return _result(s, workflow.resume(store, run.id, from_checkpoint=checkpoint_id))


def _edits(assignments: Sequence[str]) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    for item in assignments:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise CliError(f"--set {item!r} must look like FIELD=JSON (e.g. --set 'count=3' "
                           "or --set 'plan.goal=\"ship\"')")
        edits[name] = parse_json(text, f"--set {name}")
    return edits


@command("fork", examples=["pitstop fork 7f3a9c@1b2c3d4e --set 'budget=5000' "
                           "--workflow flows:approval",
                           "pitstop fork 7f3a9c --set 'plan.goal=\"ship\"' --workflow flows:wf",
                           "pitstop fork 7f3a9c --workflow flows:approval --run-id 7f3a9c-retry"])
@click.argument("ref", metavar="CHECKPOINT")
@click.option("--set", "assignments", multiple=True, metavar="FIELD=JSON",
              help="Replace a state field, or a value inside one (plan.goal, messages[-1]), "
                   "in the new run (repeatable). The JSON is converted to the type the field "
                   "holds (a dataclass, a pydantic model, a datetime...) or refused.")
@click.option("--add", is_flag=True,
              help="Allow --set to add fields (and mapping keys) the state does not have yet.")
@click.option("--workflow", "spec", metavar="MODULE:ATTR", required=True,
              envvar="PITSTOP_WORKFLOW", help=WORKFLOW_HELP)
@click.option("--run-id", "new_run_id", metavar="NEW", help="Id of the new run (default: new).")
def fork(
    s: Session, ref: str, assignments: tuple[str, ...], add: bool, spec: str,
    new_run_id: str | None,
) -> int:
    """Start a new run from a checkpoint (of any run), optionally with edited fields, and run it.

    CHECKPOINT is a checkpoint id, a run id (its latest checkpoint) or RUN@ID. The source
    run is not changed. An edit naming a field the state does not have, or a value that does
    not fit the field's type, is refused (exit 2) and nothing is written. Exits 1 if the new
    run failed.
    """
    from pitstop.edits import apply_field_edits

    edits = _edits(assignments)
    workflow = load_workflow(spec)
    store = s.store()
    checkpoint_id = resolve(store, ref)
    updates: dict[str, Any] = {}
    if edits:
        source = load_checkpoint(store, checkpoint_id)
        try:
            updates = apply_field_edits(source.state, edits, add=add,
                                        state_type=workflow.state_type)
        except FieldEditError as exc:
            raise CliError(f"--set: {exc} (nothing was written)") from None
    return _result(s, workflow.fork(store, checkpoint_id, update=updates, run_id=new_run_id))


@command("worker", log_level="INFO", examples=[
    "pitstop worker --workflow flows:approval --concurrency 8",
    "pitstop worker --store postgresql://db/app --workflow a:wf --workflow b:wf --until-idle"])
@click.option("--workflow", "specs", metavar="MODULE:ATTR", multiple=True, required=True,
              help="A workflow to run (repeatable). " + WORKFLOW_HELP)
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs executed at once by this process (threads).")
@click.option("--limit", "limits", multiple=True, metavar="WORKFLOW=N",
              help="At most N runs of WORKFLOW at once in this process (repeatable).")
@click.option("--poll", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Seconds between looks for work when the store cannot notify.")
@click.option("--until-idle", is_flag=True, help="Exit once nothing is runnable or running.")
def worker(s: Session, specs: tuple[str, ...], concurrency: int, limits: tuple[str, ...],
           poll: float, until_idle: bool) -> None:
    """Claim and execute runnable runs of the given workflows until stopped.

    Runnable: queued (``wf.enqueue``), waiting with their inputs delivered or their timer
    due, or owned by a worker whose lease expired (it died). Start as many workers as you
    like on every machine that shares the store. SIGTERM or Ctrl-C: each run finishes its
    current step, checkpoints and is handed back; then the worker exits 0.
    """
    from ..runtime import Worker

    caps: dict[str, int] = {}
    for item in limits:
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit():
            raise CliError(f"--limit {item!r} must look like WORKFLOW=N (e.g. --limit approval=2)")
        caps[name] = int(count)
    workflows = [load_workflow(spec) for spec in specs]
    stats = Worker(s.store(), workflows, concurrency=concurrency, poll_interval=poll,
                   limits=caps).run(until_idle=until_idle)
    summary = {"executed": stats.executed, "by_status": dict(stats.by_status),
               "errors": stats.errors}
    if s.as_json:
        s.out.json(summary)
    else:
        done = ", ".join(f"{n} {k}" for k, n in sorted(stats.by_status.items())) or "nothing"
        s.out.line(f"executed {stats.executed} run(s): {done}")


@command("cancel", examples=["pitstop cancel 7f3a9c"])
@click.argument("run_id", metavar="RUN")
def cancel(s: Session, run_id: str) -> None:
    """Cancel a run: it will not be resumed or claimed by workers again.

    Its current owner, if any, loses its lease and its next write is refused.
    """
    store = s.store()
    run, _ = run_reference(store, run_id)
    run_id = run.id
    if run.status is RunStatus.COMPLETED:
        raise CliError(f"run {run_id!r} has completed; there is nothing to cancel")
    if run.status is not RunStatus.CANCELLED:
        store.update_run(run_id, status=RunStatus.CANCELLED)
    if s.as_json:
        s.out.json({"run_id": run_id, "status": "cancelled", "previous": run.status.value})
    elif run.status is RunStatus.CANCELLED:
        s.out.line(f"run {run_id} was already cancelled")
    else:
        s.out.line(f"cancelled run {run_id} (was {run.status.value})", "yellow")


# -- maintenance -------------------------------------------------------------------------------


@command("stats", examples=["pitstop stats", "pitstop stats --store postgresql://db/pitstop"])
def stats(s: Session) -> None:
    """Show counts and bytes held by the store."""
    st = s.store().stats()
    space = free_space(s.store())
    if s.as_json:
        s.out.json({"runs": st.runs, "runs_by_status": dict(st.runs_by_status),
                    "checkpoints": st.checkpoints, "values": st.blobs, "bytes": st.bytes,
                    "file_bytes": st.file_bytes, "free_bytes": space.free})
        return
    by_status = ", ".join(f"{n} {k}" for k, n in sorted(st.runs_by_status.items()))
    s.out.fields([
        ("store", s.store().url),
        ("runs", f"{st.runs}" + (f" ({by_status})" if by_status else "")),
        ("checkpoints", str(st.checkpoints)),
        ("values", str(st.blobs)),
        ("bytes", f"{human_bytes(st.bytes)} ({st.bytes} bytes of records and values)"),
        ("on disk", human_bytes(st.file_bytes) if st.file_bytes is not None else ""),
    ])
    if space.free:
        s.out.note(f"{human_bytes(space.free)} of the file is free (deleted checkpoints); "
                   "`pitstop vacuum` gives it back to the file system")


def _tracking(progress: Progress | None, seen: list[int]) -> Progress:
    """Wrap a progress callback to remember the total the operation reported."""

    def update(done: int, total: int | None) -> None:
        seen[:] = [total if total is not None else done]
        if progress is not None:
            progress(done, total)

    return update


@command("verify", examples=["pitstop verify", "pitstop verify --json"])
def verify(s: Session) -> int:
    """Check every record's checksum and every reference, every run row and head, and (SQLite)
    the database file's own integrity check; exit 1 and list each problem."""
    store = s.store()
    checked: list[int] = [0]
    with s.out.progress("verifying") as bar:
        problems = store.verify(progress=_tracking(bar, checked))
    if s.as_json:
        s.out.json({"ok": not problems, "checked": checked[0], "problems": [
            {"kind": p.kind, "id": p.id, "run_id": p.run_id, "message": p.message}
            for p in problems
        ]})
    else:
        for p in problems:
            s.out.line(f"problem: {p}", "red")
        if problems:
            s.out.line(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found "
                       f"in {checked[0]} records", "bold red")
        else:
            s.out.line(f"ok: {checked[0]} records verified, no problems", "green")
    return EXIT_PROBLEMS if problems else EXIT_OK


@command("migrate", examples=["pitstop migrate --store postgresql://db/pitstop?schema=prod"])
def migrate(s: Session) -> None:
    """Create the store's tables, or upgrade them to this pitstop's schema version."""
    try:
        store = connect(s.url, create=True)
        before = int(getattr(store, "schema_version", lambda: -1)())
    except StoreSchemaError as exc:
        if exc.found is None or exc.needed is None or exc.found > exc.needed:
            raise
        before = exc.found
        store = connect(s.url, create=True, upgrade=True)
    try:
        after = store.migrate()
    finally:
        store.close()
    if before < 0:
        before = after
    if s.as_json:
        s.out.json({"store": store.url, "from": before, "to": after})
    elif before == after:
        s.out.line(f"schema version {after}: already up to date")
    else:
        s.out.line(f"schema version {before} → {after}", "green")


_PRUNE_LISTED = 20
PRUNE_COLUMNS = [Column("run", max_width=40), Column("id"), Column("step", right=True),
                 Column("name", max_width=24), Column("time"), Column("tags", max_width=24)]


@command("prune", examples=["pitstop prune --keep-last 20 --dry-run",
                            "pitstop prune --finished-older-than 30d",
                            "pitstop prune --run 7f3a9c --keep-last 5 --no-keep-milestones"])
@click.option("--keep-last", type=click.IntRange(min=1), metavar="N",
              help="Keep each run's newest N checkpoints.")
@click.option("--keep-milestones/--no-keep-milestones", default=True, show_default=True,
              help="Keep checkpoints tagged as milestones.")
@click.option("--finished-older-than", type=DURATION, metavar="AGE",
              help="Delete whole runs finished longer ago than AGE (30d, 12h).")
@click.option("--run", "run_id", metavar="RUN", help="Only this run.")
@click.option("--dry-run", is_flag=True, help="Show what would go; delete nothing.")
@click.option("--vacuum", "then_vacuum", is_flag=True,
              help="Then give the freed space back to the file system (`pitstop vacuum`).")
def prune(
    s: Session, *, keep_last: int | None, keep_milestones: bool,
    finished_older_than: timedelta | None, run_id: str | None, dry_run: bool,
    then_vacuum: bool,
) -> None:
    """Delete old checkpoints and finished runs by a retention policy.

    A run's head (what it resumes from) is never deleted, and a stored value is deleted only
    when no remaining checkpoint refers to it.
    """
    from pitstop.store import RetentionPolicy

    if keep_last is None and finished_older_than is None:
        raise CliError("say what to prune: --keep-last N and/or --finished-older-than AGE")
    policy = RetentionPolicy(keep_last=keep_last, keep_milestones=keep_milestones,
                             finished_older_than=finished_older_than)
    store = s.store()
    if run_id is not None:
        run_id = run_reference(store, run_id)[0].id
    with s.out.progress("pruning") as bar:
        report = store.prune(policy, run_id=run_id, dry_run=dry_run, progress=bar)
    vacuumed = vacuum_store(store) if then_vacuum and not dry_run else None
    space = free_space(store)
    if s.as_json:
        s.out.json({"dry_run": dry_run, "runs": report.runs, "checkpoints": report.checkpoints,
                    "values": report.blobs, "bytes_reclaimed": report.bytes_reclaimed,
                    "vacuumed": _vacuum_json(vacuumed), "space": _space_json(space)})
        return
    verb = "would delete" if dry_run else "deleted"
    s.out.line(
        f"{verb} {len(report.checkpoints)} checkpoints ({len(report.runs)} whole runs) and "
        f"{report.blobs} values: {human_bytes(report.bytes_reclaimed)} "
        f"({report.bytes_reclaimed} bytes) {'would be ' if dry_run else ''}reclaimed",
        "yellow" if dry_run else "green",
    )
    if report.runs:
        s.out.line("whole runs: " + ", ".join(report.runs))
    if dry_run and report.checkpoints:
        # Still there: say what each one is, so the operator can judge before deleting.
        shown = [store.summary(c) for c in report.checkpoints[:_PRUNE_LISTED]]
        s.out.table(PRUNE_COLUMNS, [
            [c.run_id, short(c.id), str(c.step), c.metadata.get("step_name") or "-",
             local_time(c.created_at), ", ".join(c.tags) or "-"]
            for c in shown
        ])
        rest = len(report.checkpoints) - len(shown)
        if rest:
            s.out.note(f"and {rest} more (--json lists them all)")
    if dry_run:
        s.out.note("dry run: nothing was deleted")
    elif vacuumed is not None:
        _say_vacuumed(s, vacuumed)
    elif report.bytes_reclaimed:
        _say_space(s, space)


def _space_json(space: Space) -> dict[str, Any]:
    return {"backend": space.backend, "size": space.size, "free": space.free,
            "advice": space.advice}


def _vacuum_json(report: VacuumReport | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {"backend": report.backend, "before": report.before, "after": report.after,
            "returned": report.returned, "full": report.full}


def _say_space(s: Session, space: Space) -> None:
    """After a prune: the space is not given back by itself; say what does it."""
    if space.backend == "sqlite":
        s.out.note(f"the SQLite file is still {human_bytes(space.size)}, "
                   f"{human_bytes(space.free)} of it free for new checkpoints; "
                   "`pitstop vacuum` (or prune --vacuum) gives that back to the file system")
    elif space.backend == "postgresql":
        s.out.note(space.advice)


def _say_vacuumed(s: Session, report: VacuumReport) -> None:
    s.out.line(f"vacuumed: {human_bytes(report.before)} → {human_bytes(report.after)} "
               f"({human_bytes(report.returned)} given back)", "green")
    if report.backend == "postgresql" and not report.full:
        s.out.note("plain VACUUM keeps the tables' files at their size (their free space is "
                   "reused for new checkpoints); --full returns it, locking each table")


@command("vacuum", examples=["pitstop vacuum", "pitstop vacuum --full --store postgresql://db/app"])
@click.option("--full", is_flag=True,
              help="PostgreSQL: VACUUM FULL, which returns all free space but locks each "
                   "table while rewriting it (SQLite's VACUUM always does).")
def vacuum(s: Session, full: bool) -> None:
    """Give the space of deleted checkpoints back to the file system.

    Deleting (prune) frees space inside the database, which new checkpoints reuse, but
    files do not shrink by themselves. SQLite: VACUUM rewrites the file (other processes'
    writes wait meanwhile; it needs free disk of about the file's size). PostgreSQL: VACUUM
    (ANALYZE) of pitstop's tables makes dead rows' space reusable and returns only empty
    pages at a table's end; --full runs VACUUM FULL, which returns everything and locks
    each table while it is rewritten (workers wait).
    """
    store = s.store()
    report = vacuum_store(store, full=full)
    if s.as_json:
        s.out.json(_vacuum_json(report))
    elif report.backend == "other":
        s.out.line("nothing to vacuum: this store keeps no files")
    else:
        _say_vacuumed(s, report)


# -- export and import ----------------------------------------------------------------------------


@command("export", examples=["pitstop export 7f3a9c -o 7f3a9c.pitstop",
                             "pitstop export 7f3a9c -o - | ssh ops@db pitstop import -"])
@click.argument("run_id", metavar="RUN")
@click.option("-o", "--output", metavar="FILE",
              help="Archive to write ('-': stdout). Default: RUN.pitstop here.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
def export(s: Session, run_id: str, output: str | None, force: bool) -> None:
    """Write a run (checkpoints, values, inputs, effect records) to a portable archive.

    The archive is compressed and checksummed; `pitstop import` recreates the run bit for
    bit in any store (SQLite, PostgreSQL).
    """
    from pitstop import archive

    store = s.store()
    run_id = run_reference(store, run_id)[0].id
    target = output or archive.default_path(run_id)
    if target == "-":
        if sys.stdout.isatty():
            raise CliError("refusing to write an archive to a terminal; use -o FILE or a pipe")
        dest: Any = sys.stdout.buffer
    else:
        if Path(target).exists() and not force:
            raise CliError(f"{target!r} exists; use --force to overwrite it")
        if not Path(target).parent.is_dir():
            raise CliError(f"cannot write {target!r}: directory {str(Path(target).parent)!r} "
                           "does not exist")
        dest = target
    with s.out.progress("exporting") as bar:
        info = archive.write_archive(store, run_id, dest, progress=bar)
    if target == "-":
        return
    if s.as_json:
        s.out.json({**info.to_json(), "file": target})
        return
    c = info.counts
    s.out.line(f"exported run {run_id} to {target}: {c['checkpoints']} checkpoints, "
               f"{c['values']} values, {c['inputs']} inputs, {c['effects']} effect records, "
               f"{human_bytes(info.bytes)}", "green")
    s.out.note(f"sha256 {info.sha256}")


@command("import", examples=["pitstop import 7f3a9c.pitstop --store postgresql://db/pitstop",
                             "pitstop import 7f3a9c.pitstop --run-id 7f3a9c-copy"])
@click.argument("path", metavar="FILE")
@click.option("--run-id", "new_run_id", metavar="NEW",
              help="Import as a copy named NEW, with fresh checkpoint ids.")
def import_(s: Session, path: str, new_run_id: str | None) -> None:
    """Recreate a run from an archive written by `pitstop export` ('-': stdin).

    Everything is verified before anything is written. Without --run-id the run keeps its
    ids and checksums exactly; a store that already has the run refuses it. With --run-id
    the copy gets fresh checkpoint and input ids (they are unique in a store) in the same
    order, so it can live next to the original.
    """
    from pitstop import archive

    with s.out.progress("reading", in_bytes=True) as bar:
        info, data = archive.read_archive(sys.stdin.buffer if path == "-" else path,
                                          progress=bar)
    store = s.store(create=True, upgrade=True)
    try:
        with s.out.progress("importing") as bar:
            run = archive.import_archive(store, data, run_id=new_run_id, progress=bar)
    except RunExistsError as exc:
        raise CliError(f"run {exc.run_id!r} already exists in this store; import a copy with "
                       "--run-id NEW") from None
    if s.as_json:
        s.out.json({"run_id": run.id, "from_run_id": info.run_id, "checkpoints": run.checkpoints,
                    "archive": info.to_json()})
        return
    copy = f" as {run.id}" if run.id != info.run_id else ""
    s.out.line(f"imported run {info.run_id}{copy}: {run.checkpoints} checkpoints, "
               f"{info.counts.get('values', 0)} values ({run.status.value}, from a "
               f"{info.source.get('kind', '?')} store, exported {info.created})", "green")


# -- the web inspector ---------------------------------------------------------------------------


@cli.command("ui", epilog="\b\nExamples:\n  pitstop ui --store sqlite:///runs.db\n"
             "  PITSTOP_UI_TOKEN=alice:s3cret-token pitstop ui --host 0.0.0.0 "
             "--workflow flows:approval")
@click.option("--store", "store_url", metavar="URL", help=STORE_HELP)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; another than loopback needs a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--token", "tokens", multiple=True, metavar="[NAME:]SECRET",
              envvar="PITSTOP_UI_TOKEN",
              help="Require this token on every page and API call (repeatable; the name is "
                   "what actions record). Default: $PITSTOP_UI_TOKEN.")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option("--workflow", "specs", metavar="MODULE:ATTR", multiple=True,
              help="Resume runs of this workflow here after an input or a fork (repeatable).")
@click.option("--json", "as_json", is_flag=True,
              help="Announce the address as one JSON line (for scripts that start it).")
@_logging_options
def ui(store_url: str | None, host: str, port: int, tokens: tuple[str, ...], read_only: bool,
       specs: tuple[str, ...], as_json: bool, verbose: int, quiet: bool,
       log_level: str | None) -> None:
    """Serve the web inspector and approval inbox (needs pip install 'pitstop[ui]')."""
    root = click.get_current_context().find_root().obj or {}
    configure_logging(log_level or root.get("log_level"), default="WARNING",
                      verbose=verbose + root.get("verbose", 0),
                      quiet=quiet or root.get("quiet", False))
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401

        from pitstop.ui.security import parse_tokens
        from pitstop.ui.server import check_exposure, serve
    except ImportError as exc:
        raise CliError(f"the inspector needs the ui extra: pip install 'pitstop[ui]' ({exc})"
                       ) from None
    try:
        check_exposure(host, parse_tokens(tokens))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    workflows = [load_workflow(spec) for spec in specs]
    session = Session(store_url or root.get("store"), as_json=False)
    try:
        serve(session.store(), host=host, port=port, token=tokens, read_only=read_only,
              workflows=workflows, announce="json" if as_json else "text")
    finally:
        session.close()


# -- entry point ---------------------------------------------------------------------------------


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status. Every failure is one line on stderr."""
    try:
        return int(cli.main(args=argv, prog_name="pitstop", standalone_mode=False) or 0)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        return EXIT_USAGE
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "pitstop"
        error_line(f"{exc.format_message()} (see `{where} --help`)")
        return EXIT_USAGE
    except click.Abort:
        error_line("aborted")
        return 130
    except click.ClickException as exc:
        error_line(exc.format_message())
        return exc.exit_code
    except CliError as exc:
        error_line(str(exc))
        return exc.code
    except CorruptCheckpointError as exc:
        hint = "" if "pitstop verify" in str(exc) else " (run `pitstop verify` for the whole store)"
        error_line(f"{exc}{hint}")
        return EXIT_PROBLEMS
    except (PitstopError, ValueError, OSError) as exc:
        # pitstop's own errors name what and why; ValueError is how the runtime rejects
        # arguments (a checkpoint of another run, a run of another workflow); OSError is a
        # file that cannot be read or written.
        if os.environ.get("PITSTOP_DEBUG"):
            traceback.print_exc()
        error_line(_message(exc))
        return EXIT_USAGE
    except Exception as exc:
        if os.environ.get("PITSTOP_DEBUG"):
            raise
        error_line(f"internal error: {type(exc).__name__}: {exc} "
                   "(PITSTOP_DEBUG=1 shows the traceback; please report it)")
        return EXIT_INTERNAL


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        name = exc.filename if exc.filename is not None else ""
        return f"{name}: {exc.strerror}" if name else exc.strerror
    return str(exc)


__all__ = ["cli", "run"]
