"""``pitstop runs``: the listing operators run most, so it reads run rows (never a
checkpoint's state; for running runs their loops' position records, for stream partitions
their head's summary) and says in one column what each run needs or why it stopped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from pitstop.display.runs import run_json
from pitstop.display.text import age, human_bytes
from pitstop.model import Run, RunStatus

from .common import EXIT_PROBLEMS, CliError, Session, run_reference
from .group import SINCE, STATUSES, command
from .render import Cell, Column, status_cell, styled

if TYPE_CHECKING:
    from pitstop.failures import RunFailure
    from pitstop.owners import Ownership
    from pitstop.store.contract.base import Problem
    from pitstop.stream.status import PartitionStatus

RUN_COLUMNS = [
    Column("id", style="bold", max_width=40),
    Column("status"),
    Column("workflow", max_width=30),
    Column("step", right=True),
    Column("age", right=True),
    Column("size", right=True),
    Column("checkpoints", right=True),
    Column("detail", max_width=100),  # (a stream partition: position, lag, rate, hint)
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
    workflow = run.workflow or ""
    if lease.state == "released" and workflow.startswith("stream:"):
        # A stream job's partition between job.run calls (pitstop.stream).
        return f"no owner: pitstop stream status {workflow[7:]}"
    if lease.state == "released" or (run.status is RunStatus.QUEUED and lease.state == "none"):
        return "waiting for a worker"
    if lease.state == "held":
        return f"{_lease_text(lease, now)} ({lease.owner})"
    return "-"


def _size_cell(run: Run) -> Cell:
    """The run's bytes; marked ``(!)`` when a checkpoint passed its ``size_warning``."""
    text = human_bytes(run.bytes)
    warning = run.metadata.get("size_warning") if hasattr(run.metadata, "get") else None
    return styled(f"{text} (!)", "yellow") if isinstance(warning, dict) else text


def listed_json(run: Run, lease: Ownership, failure: RunFailure | None,
                progress: str | None = None,
                partition: PartitionStatus | None = None) -> dict[str, Any]:
    """A run as ``pitstop runs --json`` lists it: its row, its lease, its error if failed,
    its loops' progress if it runs (or a stream partition's records, position, lag and
    rate, and its figures under ``stream``)."""
    doc = run_json(run)
    doc["lease"] = lease.state
    doc["progress"] = progress
    if partition is not None:
        doc["stream"] = partition.to_json()
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
@click.option("--no-lag", is_flag=True,
              help="Do not ask stream jobs' brokers for their partitions' lag.")
def runs(
    s: Session, *, statuses: tuple[str, ...], workflow: str | None, since: datetime | None,
    limit: int, offset: int, parent: str | None, no_lag: bool,
) -> None:
    """List runs, newest first: status, position, size (``(!)``: past its size_warning), and
    what each waits for, why it failed, or who holds it (``running, owner gone``: its owner
    died; a worker takes it), after a running loop's progress or a stream partition's
    records, position, lag (records in the stream after its position: one request per
    broker) and records/s over its last checkpoints."""
    from pitstop.failures import run_failure
    from pitstop.observe.timelines import listed_progress
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
    partitions = _partitions(store, found, lag=not no_lag)
    progresses = [_partition_text(partitions[r.id]) if r.id in partitions
                  else listed_progress(store, r) for r in found]
    if s.as_json:
        s.out.json({"runs": [listed_json(r, lease, failure, progress, partitions.get(r.id))
                             for r, lease, failure, progress
                             in zip(found, leases, failures, progresses, strict=True)],
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
            _size_cell(r),
            str(r.checkpoints),
            _with_progress(_detail(r, lease, failure, now), progress),
        ]
        for r, lease, failure, progress in zip(found, leases, failures, progresses, strict=True)
    ]
    s.out.table(RUN_COLUMNS, rows, empty="no runs match")
    if more:
        s.out.note(f"more runs: --offset {offset + limit} for the next page")
    _report_damaged(found_all.damaged)


def _partitions(store: Any, found: list[Run], *, lag: bool) -> dict[str, PartitionStatus]:
    """The stream partitions among ``found``, by run id (pitstop.stream is imported only
    when there is one: a listing of other runs loads nothing of it)."""
    if not any((r.workflow or "").startswith("stream:") for r in found):
        return {}
    from pitstop.stream.status import is_partition, partitions_status

    parts = partitions_status(store, [r for r in found if is_partition(r)], lag=lag)
    return {p.run_id: p for p in parts}


def _partition_text(part: PartitionStatus) -> str:
    from pitstop.stream.status import progress_text

    return progress_text(part)


def _with_progress(detail: Cell, progress: str | None) -> Cell:
    """The loops' progress first (what an operator watching a long run asks), then the
    detail."""
    if progress is None:
        return detail
    text, style = (detail, "") if isinstance(detail, str) else detail
    return styled(progress if text == "-" else f"{progress} · {text}", style)


def _report_damaged(damaged: list[Problem]) -> None:
    """Runs left out of a listing because their rows are damaged: one line, exit status 1."""
    if damaged:
        named = "; ".join(f"{p.id!r} ({p.message})" for p in damaged[:3])
        rest = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
        raise CliError(f"{len(damaged)} damaged run row{'s' if len(damaged) > 1 else ''} not "
                       f"listed: {named}{rest}; run `pitstop verify`", EXIT_PROBLEMS)


__all__ = ["listed_json", "runs"]
