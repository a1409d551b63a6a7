"""``pitstop cache ls | clear``: the results cached across runs (``CachePolicy``,
``ctx.cached``)."""

from __future__ import annotations

from datetime import timedelta

import click

from pitstop.display.text import age, human_bytes
from pitstop.model import utc

from .common import Session
from .group import DURATION, command, subgroup
from .render import Column, local_time

cache = subgroup("cache", "List and clear results cached across runs (CachePolicy, ctx.cached).",
                 examples=["pitstop cache ls", "pitstop cache clear --step fetch"])

CACHE_COLUMNS = [
    Column("name", max_width=32),
    Column("created"),
    Column("expires"),
    Column("size", right=True),
    Column("run", max_width=40),
    Column("key", max_width=40),
]


@command("ls", group=cache, examples=["pitstop cache ls", "pitstop cache ls --step fetch --json"])
@click.option("--step", "name", metavar="NAME", help="Only the results of this step or call.")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="Show the newest N (0: all).")
def ls(s: Session, name: str | None, limit: int) -> None:
    """List cached results, newest first (their values are not read)."""
    entries = s.store().cache_entries(name=name, limit=limit or None)
    if s.as_json:
        s.out.json([
            {"key": e.key, "name": e.name, "run_id": e.run_id, "checkpoint_id": e.checkpoint_id,
             "size": e.size, "created_at": e.created_at, "expires_at": e.expires_at,
             "computing": e.computing}
            for e in entries
        ])
        return
    rows = [
        [e.name, f"{local_time(utc(e.created_at))} ({age(utc(e.created_at))} ago)",
         "computing" if e.computing else (local_time(utc(e.expires_at)) if e.expires_at
                                          else "never"),
         human_bytes(e.size), e.run_id or "-", e.key]
        for e in entries
    ]
    s.out.table(CACHE_COLUMNS, rows, title="cached results", empty="no cached results")


@command("clear", group=cache, examples=["pitstop cache clear --step fetch",
                                         "pitstop cache clear --older-than 7d"])
@click.option("--step", "name", metavar="NAME", help="Only the results of this step or call.")
@click.option("--older-than", type=DURATION, metavar="AGE",
              help="Only results stored longer ago than AGE (30s, 15m, 2h, 7d, 1w).")
@click.option("--expired", is_flag=True, help="Only results whose ttl has passed.")
def clear(s: Session, name: str | None, older_than: timedelta | None, expired: bool) -> None:
    """Delete cached results (all, or those the options select) and the values only they
    held; checkpoints keep theirs. Results being computed are left alone."""
    deleted = s.store().cache_clear(
        name=name, older_than=older_than.total_seconds() if older_than else None,
        expired_only=expired,
    )
    if s.as_json:
        s.out.json({"deleted": deleted})
        return
    s.out.line(f"deleted {deleted} cached result{'s' if deleted != 1 else ''}", "green")
