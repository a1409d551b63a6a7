"""``du``: the bytes each run, field and step holds (see :mod:`pitstop.observe.usage`)."""

from __future__ import annotations

from typing import Any

import click

from pitstop.display.text import duration, human_bytes, short

from .common import Session, run_reference
from .group import command
from .render import Column, local_time

RUN_COLUMNS = [
    Column("run", style="bold", max_width=40),
    Column("workflow", max_width=20),
    Column("status"),
    Column("checkpoints", right=True),
    Column("total", right=True),
    Column("records", right=True),
    Column("new", right=True),
    Column("shared", right=True),
    Column("effects", right=True),
    Column("inputs", right=True),
    Column("per ckpt", right=True),
    Column("state", right=True),
]

FIELD_COLUMNS = [
    Column("field", style="bold", max_width=40),
    Column("written", right=True),
    Column("versions", right=True),
    Column("checkpoints", right=True),
    Column("without sharing", right=True),
    Column("largest", right=True),
    Column("at head", right=True),
]

STEP_COLUMNS = [
    Column("step", style="bold", max_width=40),
    Column("checkpoints", right=True),
    Column("added", right=True),
    Column("per ckpt", right=True),
    Column("largest", right=True),
    Column("ran", right=True),
]

GROWTH_COLUMNS = [
    Column("checkpoint", style="bold"),
    Column("step", right=True),
    Column("time"),
    Column("state", right=True),
    Column("added", right=True),
    Column("record", right=True),
]


def _size(n: int) -> str:
    return human_bytes(n) if n else "-"


@command("du", examples=["pitstop du", "pitstop du --limit 50 --json", "pitstop du 7f3a9c",
                         "pitstop du 7f3a9c --by field", "pitstop du --by field"])
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("--by", "by", type=click.Choice(["run", "field", "step"]), default=None,
              help="Group by run (the default without RUN), field (bytes each field's values "
                   "hold: its distinct versions, and what it would hold without sharing), or "
                   "step (what each step's checkpoints added; the default with RUN).")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Show the largest N rows (0: all).")
def du(s: Session, run_id: str | None, by: str | None, limit: int) -> None:
    """Show what runs, fields and steps hold in bytes, largest first.

    Per run: total = records (checkpoint rows) + new (values the run stored first) + effects
    + inputs; shared = values it references that other runs stored (deduplicated, counted
    where they were stored); per ckpt = average growth a checkpoint. With RUN: its growth per
    checkpoint too. Computed by SQL aggregates and field maps: no value is read.
    """
    from datetime import UTC, datetime

    from pitstop.observe.usage import fields_usage, growth, runs_usage, steps_usage

    store = s.store()
    run = run_reference(store, run_id)[0] if run_id is not None else None
    by = by or ("step" if run is not None else "run")
    doc: dict[str, Any] = {"by": by, "run_id": run.id if run else None}
    if by == "run":
        usages = runs_usage(store, [run.id] if run else None, limit=limit or None)
        doc["runs"] = [usage.to_json() for usage in usages]
        rows = [[u.run_id, u.workflow or "-", u.status or "-", f"{u.checkpoints:,}",
                 human_bytes(u.total), _size(u.records), _size(u.new), _size(u.shared),
                 _size(u.effects), _size(u.inputs), human_bytes(round(u.per_checkpoint)),
                 human_bytes(u.head_size)] for u in usages]
        table: tuple[list[Column], list[list[Any]], str] = (
            RUN_COLUMNS, rows, "largest runs" if run is None else f"run {run.id}")
    elif by == "field":
        groups = fields_usage(store, run.id if run else None)
        shown = groups[:limit] if limit else groups
        doc["fields"] = [group.to_json() for group in shown]
        rows = [[g.name, ("~" if g.chunked else "") + human_bytes(g.written), f"{g.versions:,}",
                 f"{g.checkpoints:,}", human_bytes(g.referenced), human_bytes(g.largest),
                 _size(g.head)] for g in shown]
        table = (FIELD_COLUMNS, rows, "fields" + (f" of run {run.id}" if run else ""))
    else:
        if run is None:
            raise click.UsageError("--by step needs a RUN")
        groups = steps_usage(store, run.id)
        shown = groups[:limit] if limit else groups
        doc["steps"] = [group.to_json() for group in shown]
        rows = [[g.name, f"{g.checkpoints:,}", human_bytes(g.written),
                 human_bytes(round(g.written / g.checkpoints)) if g.checkpoints else "-",
                 human_bytes(g.largest), duration(g.seconds) if g.seconds else "-"]
                for g in shown]
        table = (STEP_COLUMNS, rows, f"steps of run {run.id}")
    newest = growth(store, run.id, limit=limit or None) if run is not None else []
    if run is not None:
        doc["growth"] = newest
    if s.as_json:
        s.out.json(doc)
        return
    columns, rows, title = table
    s.out.table(columns, rows, title=title, empty="nothing stored")
    if newest:
        s.out.line()
        s.out.table(GROWTH_COLUMNS, [[
            short(g["id"]), str(g["step"]),
            local_time(datetime.fromtimestamp(g["created_at"], UTC)),
            human_bytes(g["size"]), "+" + human_bytes(g["added"]), human_bytes(g["record"]),
        ] for g in newest], title="growth per checkpoint, newest first")
    if by == "field" and any(g.chunked for g in shown):
        s.out.note("~: a chunked value counted whole; its versions share unchanged chunks")


__all__ = ["du"]
