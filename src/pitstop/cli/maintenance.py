"""Looking after a store: ``stats``, ``verify``, ``migrate``, ``prune``, ``vacuum``, and moving
runs between stores with ``export``/``import``.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pitstop.display.text import human_bytes, short
from pitstop.errors import RunExistsError, StoreSchemaError
from pitstop.store.backends.vacuum import Space, VacuumReport, free_bytes, free_space
from pitstop.store.backends.vacuum import vacuum as vacuum_store

from .common import EXIT_OK, EXIT_PROBLEMS, CliError, Session, connect, run_reference
from .group import DURATION, command
from .render import Column, local_time

if TYPE_CHECKING:
    from pitstop.store.contract.base import Progress


@command("stats", examples=["pitstop stats", "pitstop stats --store postgresql://db/pitstop",
                            "pitstop stats --exact --json"])
@click.option("--exact", is_flag=True,
              help="Count every row (slow on a large PostgreSQL store). By default a count "
                   "past 10,000 may be estimated there from a sample (shown with ~).")
def stats(s: Session, exact: bool) -> None:
    """Show counts and bytes held by the store.

    Counts up to 10,000 (runs of a status, checkpoints, values) are always exact; on
    PostgreSQL larger ones are estimated from a sample of about 2 MiB of the table (a few
    percent off), so the command stays fast at millions of runs; --exact counts them all.
    """
    store = s.store()
    st = store.stats(exact=exact)
    free = free_bytes(store)
    if s.as_json:
        s.out.json({"runs": st.runs, "runs_by_status": dict(st.runs_by_status),
                    "checkpoints": st.checkpoints, "values": st.blobs, "bytes": st.bytes,
                    "effects": st.effects, "effect_bytes": st.effect_bytes,
                    "inputs": st.inputs, "input_bytes": st.input_bytes,
                    "value_refs": st.value_refs, "attached_bytes": st.attached_bytes,
                    "all_bytes": st.all_bytes,
                    "file_bytes": st.file_bytes, "free_bytes": free,
                    "cache_entries": st.cache_entries, "estimated": sorted(st.estimated)})
        return

    def count(n: int, name: str) -> str:
        return f"~{n}" if name in st.estimated else str(n)

    by_status = ", ".join(f"{count(n, f'runs_by_status.{k}')} {k}"
                          for k, n in sorted(st.runs_by_status.items()))
    s.out.fields([
        ("store", store.url),
        ("runs", count(st.runs, "runs") + (f" ({by_status})" if by_status else "")),
        ("checkpoints", count(st.checkpoints, "checkpoints")),
        ("values", count(st.blobs, "blobs")),
        ("value refs", count(st.value_refs, "value_refs")),
        ("effects", f"{count(st.effects, 'effects')} ({human_bytes(st.effect_bytes)})"),
        ("inputs", f"{count(st.inputs, 'inputs')} ({human_bytes(st.input_bytes)})"),
        ("attached", human_bytes(st.attached_bytes)),
        ("cached", f"{st.cache_entries} results"),
        ("bytes", f"{'~' if 'bytes' in st.estimated else ''}{human_bytes(st.bytes)} "
                  f"({count(st.bytes, 'bytes')} bytes of records and values)"),
        ("all records", f"{'~' if st.estimated else ''}{human_bytes(st.all_bytes)} "
                        "(with effects, inputs and attached records)"),
        ("on disk", human_bytes(st.file_bytes) if st.file_bytes is not None else ""),
    ])
    if st.estimated:
        s.out.note("~: estimated from a sample of the table; --exact counts every row")
    if free:
        s.out.note(f"{human_bytes(free)} of the file is free (deleted checkpoints); "
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
    """Check every record's checksum and every reference, every run row and head, and the
    database's own check of its indexes (SQLite's integrity check, PostgreSQL's amcheck);
    exit 1 and list each problem."""
    store = s.store()
    checked: list[int] = [0]
    with s.out.progress("verifying") as bar:
        problems = store.verify(progress=_tracking(bar, checked))
    notes = list(getattr(problems, "notes", ()))
    if s.as_json:
        s.out.json({"ok": not problems, "checked": checked[0], "problems": [
            {"kind": p.kind, "id": p.id, "run_id": p.run_id, "message": p.message}
            for p in problems
        ], "notes": notes})
    else:
        for note in notes:
            s.out.line(f"note: {note}", "yellow")
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
                    "effects": report.effects, "effect_bytes": report.effect_bytes,
                    "inputs": report.inputs, "input_bytes": report.input_bytes,
                    "cache_entries": report.cache_entries,
                    "vacuumed": _vacuum_json(vacuumed), "space": _space_json(space)})
        return
    verb = "would delete" if dry_run else "deleted"
    s.out.line(
        f"{verb} {len(report.checkpoints)} checkpoints ({len(report.runs)} whole runs) and "
        f"{report.blobs} values: {human_bytes(report.bytes_reclaimed)} "
        f"({report.bytes_reclaimed} bytes) {'would be ' if dry_run else ''}reclaimed",
        "yellow" if dry_run else "green",
    )
    if report.effects or report.inputs:
        s.out.line(f"with them: {report.effects} effect records "
                   f"({human_bytes(report.effect_bytes)}), {report.inputs} inputs "
                   f"({human_bytes(report.input_bytes)})")
    if report.runs:
        s.out.line("whole runs: " + ", ".join(report.runs))
    if report.cache_entries:
        s.out.line(f"expired cached results: {report.cache_entries}")
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
    return {"backend": space.backend, "size": space.size, "file": space.file,
            "wal": space.wal, "free": space.free, "advice": space.advice}


def _vacuum_json(report: VacuumReport | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {"backend": report.backend, "before": report.before, "after": report.after,
            "returned": report.returned, "full": report.full,
            "reindexed": list(report.reindexed)}


def _say_space(s: Session, space: Space) -> None:
    """After a prune: the space is not given back by itself; say what does it."""
    if space.backend == "sqlite":
        log = f" (and a {human_bytes(space.wal)} write-ahead log beside it)" if space.wal else ""
        if space.free:
            s.out.note(f"the SQLite file is {human_bytes(space.file)}{log}, "
                       f"{human_bytes(space.free)} of it free for new checkpoints; "
                       "`pitstop vacuum` (or prune --vacuum) gives that back to the file "
                       "system")
        else:
            s.out.note(f"the SQLite file is {human_bytes(space.file)}{log}: the freed space "
                       "went back to the file system")
    elif space.backend == "postgresql":
        s.out.note(space.advice)


def _say_vacuumed(s: Session, report: VacuumReport) -> None:
    s.out.line(f"vacuumed: {human_bytes(report.before)} → {human_bytes(report.after)} "
               f"({human_bytes(report.returned)} given back)", "green")
    if report.reindexed:
        s.out.line(f"rebuilt {len(report.reindexed)} sparse index"
                   f"{'es' if len(report.reindexed) > 1 else ''}: {', '.join(report.reindexed)}")
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


__all__ = ["export", "import_", "migrate", "prune", "stats", "vacuum", "verify"]


# -- encryption at rest ---------------------------------------------------------------------------


@command("rekey", examples=[
    "PITSTOP_KEYS=k2=...,k1=... pitstop rekey --to k2 "
    "--store 'sqlite:///runs.db?encryption=env:PITSTOP_KEYS'"])
@click.option("--to", "to", required=True, metavar="KEY_ID",
              help="The key every blob value is sealed under afterwards (one of the ring's).")
def rekey(s: Session, to: str) -> None:
    """Seal every value in the blob store again under one key.

    Run after making a new key current: values sealed under older keys (or written before
    the store was sealed) are sealed under KEY_ID, a batch at a time beside normal work;
    then the old keys can leave the ring. Safe to stop and run again.
    """
    from pitstop.store.engine.rekey import rekey as rekey_store

    store = s.store()
    count = rekey_store(store, to)
    if s.as_json:
        s.out.json({"resealed": count, "key": to})
    else:
        s.out.line(f"{count} values sealed again under key {to!r}", "green")
