"""``pitstop stream status JOB``: a stream job's partitions at a glance."""

from __future__ import annotations

import click

from .common import EXIT_PROBLEMS, CliError, Session
from .group import command
from .render import Column


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@command("stream", examples=["pitstop stream status clicks",
                             "pitstop stream status clicks --json"])
@click.argument("action", type=click.Choice(["status"]))
@click.argument("job")
@click.option("--no-lag", is_flag=True, help="Do not ask the broker for each partition's lag.")
def stream(s: Session, action: str, job: str, no_lag: bool) -> int:
    """Show a stream job's partitions: status, owner, position, lag (records behind the
    stream's end), records/s over the last 8 checkpoints, the last checkpoint's age and
    its outbox (outputs not yet known delivered). Exits 1 if a partition failed."""
    from pitstop.stream.status import job_status

    parts = job_status(s.store(), job, lag=not no_lag)
    if not parts:
        raise CliError(f"no stream job {job!r} in this store (its partitions are the runs "
                       f"{job}/0, {job}/1, …)")
    if s.as_json:
        s.out.json({"job": job, "partitions": [p.to_json() for p in parts]})
    else:
        s.out.table(
            [Column("partition", right=True), Column("status"), Column("owner"),
             Column("position"), Column("lag", right=True), Column("records", right=True),
             Column("rec/s", right=True), Column("checkpoint", right=True),
             Column("outbox", right=True)],
            [[str(p.partition), p.status, p.owner or "", p.position or "",
              "" if p.lag is None else f"{p.lag:,}", f"{p.records:,}",
              "" if p.records_per_second is None else f"{p.records_per_second:,.0f}",
              _age(p.checkpoint_age), str(p.outbox)] for p in parts],
            title=f"stream job {job}",
        )
        for p in parts:
            if p.error:
                s.out.note(f"partition {p.partition}: {p.error}")
    return EXIT_PROBLEMS if any(p.status == "failed" for p in parts) else 0
