"""``pitstop schedule add | ls | rm | pause``: workflows started on a cron expression."""

from __future__ import annotations

from typing import Any

import click

from .common import Session, load_workflow
from .control import INPUT_HELP, WORKFLOW_HELP, _input
from .group import command, subgroup
from .render import Column, local_time

schedule = subgroup(
    "schedule", "Start a workflow on a cron expression: one run per tick, by any worker.",
    examples=["pitstop schedule add nightly --workflow flows:report --cron '0 2 * * *' "
              "--timezone Europe/Berlin", "pitstop schedule ls"],
)

SCHEDULE_COLUMNS = [
    Column("name", style="bold"),
    Column("workflow"),
    Column("cron"),
    Column("timezone"),
    Column("catchup"),
    Column("overlap"),
    Column("state"),
    Column("next ticks", max_width=60),
    Column("last run", max_width=40),
]


def _json(item: Any) -> dict[str, Any]:
    return {
        "name": item.name, "workflow": item.workflow, "cron": item.cron,
        "timezone": item.timezone, "catchup": item.catchup, "overlap": item.overlap,
        "paused": item.paused, "next_tick": item.next_tick.timestamp(),
        "upcoming": [t.isoformat() for t in item.upcoming(5)], "last_run": item.last_run,
    }


@command("add", group=schedule, examples=[
    "pitstop schedule add nightly --workflow flows:report --cron '0 2 * * *' "
    "--timezone Europe/Berlin --input '{\"scope\": \"all\"}' --catchup latest"])
@click.argument("name")
@click.option("--workflow", "spec", metavar="MODULE:ATTR", required=True,
              envvar="PITSTOP_WORKFLOW", help=WORKFLOW_HELP)
@click.option("--cron", required=True,
              help="Five fields (minute hour day month weekday), or six with leading seconds.")
@click.option("--timezone", default="UTC", show_default=True, help="An IANA timezone name.")
@click.option("--input", "input_text", metavar="JSON|@FILE|-", help=INPUT_HELP)
@click.option("--catchup", type=click.Choice(["none", "latest", "all"]), default="latest",
              show_default=True, help="Ticks missed while no worker ran: none, the newest, all.")
@click.option("--overlap", type=click.Choice(["skip", "queue", "allow"]), default="skip",
              show_default=True, help="A tick while the previous run still goes.")
def add(s: Session, name: str, spec: str, cron: str, timezone: str, input_text: str | None,
        catchup: str, overlap: str) -> None:
    """Create (or redefine) schedule NAME; any `pitstop worker` serving the workflow starts
    its runs. A cron expression that does not parse or an unknown timezone is refused
    (exit 2) with the reason."""
    workflow = load_workflow(spec)
    fields = _input(workflow, input_text)
    store = s.store(create=True, upgrade=True)
    made = workflow.schedule(store, name, cron=cron, timezone=timezone, input=fields,
                             catchup=catchup, overlap=overlap)
    if s.as_json:
        s.out.json(_json(made))
        return
    s.out.fields([("schedule", made.name), ("workflow", made.workflow), ("cron", made.cron),
                  ("timezone", made.timezone),
                  ("next ticks", ", ".join(local_time(t) for t in made.upcoming(3)))])


@command("ls", group=schedule, examples=["pitstop schedule ls", "pitstop schedule ls --json"])
def ls(s: Session) -> None:
    """List schedules with their next ticks and latest run."""
    from pitstop.runtime.schedules import schedules

    found = schedules(s.store())
    if s.as_json:
        s.out.json([_json(item) for item in found])
        return
    rows = [[item.name, item.workflow, item.cron, item.timezone, item.catchup, item.overlap,
             "paused" if item.paused else "active",
             ", ".join(local_time(t) for t in item.upcoming(2)), item.last_run or "-"]
            for item in found]
    s.out.table(SCHEDULE_COLUMNS, rows, title="schedules", empty="no schedules")


@command("rm", group=schedule, examples=["pitstop schedule rm nightly"])
@click.argument("name")
def rm(s: Session, name: str) -> None:
    """Remove schedule NAME (the runs it started stay)."""
    s.store().schedule_delete(name)
    if s.as_json:
        s.out.json({"removed": name})
    else:
        s.out.line(f"removed schedule {name}", "green")


@command("pause", group=schedule, examples=["pitstop schedule pause nightly",
                                            "pitstop schedule pause nightly --resume"])
@click.argument("name")
@click.option("--resume", is_flag=True,
              help="Resume it instead: ticks from now on start runs (missed ones do not).")
def pause(s: Session, name: str, resume: bool) -> None:
    """Pause schedule NAME: no tick starts a run until `--resume`."""
    from pitstop.runtime.schedules import tick_after

    store = s.store()
    if resume:
        rows = store.schedule_rows(name=name)
        if not rows:
            store.schedule_pause(name, False)  # raises: no such schedule
        row = rows[0]
        import time

        store.schedule_pause(name, False,
                             next_tick=tick_after(row.cron, row.timezone, time.time(), name))
    else:
        store.schedule_pause(name, True)
    if s.as_json:
        s.out.json({"name": name, "paused": not resume})
    else:
        s.out.line(f"{'resumed' if resume else 'paused'} schedule {name}", "green")
