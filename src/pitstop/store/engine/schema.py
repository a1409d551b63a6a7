"""pitstop's tables: their migrations, their columns and the shapes of the rows read from them.

Everything about the database layout lives here, once:

* :data:`MIGRATIONS` creates and changes the tables and indexes, forward only; a store records
  each version it applied in ``pitstop_schema``. :data:`LATEST_SCHEMA` is the version this
  pitstop reads and writes. A released migration is never edited: a change is a new entry.
  :meth:`SqlBackend.migrate <pitstop.store.engine.backend.SqlBackend.migrate>` applies them.
* Each table's current columns are defined by one class, whose fields are the columns:
  :class:`RunRow` for ``pitstop_runs``,
  :class:`~pitstop.store.encoding.records.CheckpointRecord` for ``pitstop_checkpoints``,
  :class:`InputRecord` and :class:`EffectRecord` for inputs and effect records. The
  :class:`Table` constants and the SQL below (column lists, the checkpoint INSERT, the summary
  and run-with-head SELECTs) are built from those classes, and a row read with those columns
  becomes one by position in the same order (``CheckpointRecord(*row)``), so code reads
  ``run.head_id``, never ``row[6]``. A test migrates a fresh database and checks that these
  columns are exactly the ones the migrations made.

Changing the layout therefore means: append a migration, then change the row class (and its
``to_...`` mapping if the column reaches the model); the SQL follows.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from ...errors import CorruptCheckpointError
from ...model import CheckpointSummary, Run, RunStatus, utc
from ..encoding.records import CheckpointRecord, check_text
from .rowcheck import run_problem

# --------------------------------------------------------------------------------------------
# Migrations. {blob}, {real}, {bigint} and {without_rowid} are filled in by the dialect; a
# statement beginning "/* postgresql only */ " (or another dialect's name) runs on it alone.
# --------------------------------------------------------------------------------------------

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "runs, checkpoints, content-addressed values, inputs, effect records",
        [
            """CREATE TABLE pitstop_runs (
                run_id TEXT PRIMARY KEY,
                workflow TEXT,
                status TEXT NOT NULL,
                created_at {real} NOT NULL,
                updated_at {real} NOT NULL,
                metadata TEXT NOT NULL DEFAULT '{{}}',
                head_id TEXT,
                step INTEGER,
                waiting_for TEXT,
                wake_at {real},
                checkpoints INTEGER NOT NULL DEFAULT 0,
                bytes {bigint} NOT NULL DEFAULT 0,
                lease_owner TEXT,
                lease_expires {real},
                fence {bigint} NOT NULL DEFAULT 0,
                priority INTEGER NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX pitstop_runs_created ON pitstop_runs (created_at)",
            # None of these indexes covers a column every checkpoint assigns (head_id, step,
            # updated_at, counters): a step's save then writes no index page of this table.
            "CREATE INDEX pitstop_runs_status ON pitstop_runs (status, created_at)",
            # What workers claim: queued runs and runs whose owner may have died, by
            # priority then age; waiting runs by the time they become due.
            "CREATE INDEX pitstop_runs_runnable ON pitstop_runs (priority DESC, created_at) "
            "WHERE status IN ('queued', 'running')",
            "CREATE INDEX pitstop_runs_waking ON pitstop_runs (wake_at) "
            "WHERE status = 'waiting'",
            """CREATE TABLE pitstop_checkpoints (
                id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                parent_id TEXT,
                step INTEGER NOT NULL,
                created_at {real} NOT NULL,
                schema_version INTEGER NOT NULL,
                metadata TEXT NOT NULL,
                fields {blob} NOT NULL,
                size {bigint} NOT NULL,
                added {bigint} NOT NULL,
                checksum TEXT NOT NULL,
                PRIMARY KEY (run_id, id)
            ){without_rowid}""",
            # Clustered by run, so a run's history is one range scan; ids are unique too.
            "CREATE UNIQUE INDEX pitstop_checkpoints_id ON pitstop_checkpoints (id)",
            """CREATE TABLE pitstop_blobs (
                hash {blob} PRIMARY KEY,
                data {blob} NOT NULL,
                size {bigint} NOT NULL,
                created_at {real} NOT NULL
            )""",
            """CREATE TABLE pitstop_blob_refs (
                run_id TEXT NOT NULL,
                hash {blob} NOT NULL,
                PRIMARY KEY (run_id, hash)
            ){without_rowid}""",
            "CREATE INDEX pitstop_blob_refs_hash ON pitstop_blob_refs (hash)",
            """CREATE TABLE pitstop_inputs (
                id TEXT PRIMARY KEY,
                run_id TEXT NOT NULL,
                name TEXT NOT NULL,
                payload {blob} NOT NULL,
                hash {blob} NOT NULL,
                created_at {real} NOT NULL,
                consumed_by TEXT
            )""",
            "CREATE INDEX pitstop_inputs_run ON pitstop_inputs (run_id, name)",
            """CREATE TABLE pitstop_effects (
                run_id TEXT NOT NULL,
                key TEXT NOT NULL,
                checkpoint_id TEXT,
                result {blob} NOT NULL,
                hash {blob} NOT NULL,
                created_at {real} NOT NULL,
                PRIMARY KEY (run_id, key)
            )""",
            "CREATE INDEX pitstop_effects_checkpoint ON pitstop_effects (run_id, checkpoint_id)",
        ],
    ),
    (
        2,
        "large values in a blob store: where a value lives when it is not in the table",
        ["ALTER TABLE pitstop_blobs ADD COLUMN location TEXT"],
    ),
    (
        3,
        "chunked values: field maps may hold a manifest; a chunk row may be an alias, the "
        "first `size` stored bytes of the chunk `alias` (a growing list's superseded last "
        "chunk, kept without its bytes)",
        [
            "ALTER TABLE pitstop_blobs ADD COLUMN alias {blob}",
            "CREATE INDEX pitstop_blobs_alias ON pitstop_blobs (alias) WHERE alias IS NOT NULL",
        ],
    ),
    (
        4,
        "child runs: the run that started a run (ctx.run_child), indexed for listing a "
        "parent's children and for waking the parent when the last one finishes",
        [
            "ALTER TABLE pitstop_runs ADD COLUMN parent_run TEXT",
            "CREATE INDEX pitstop_runs_parent ON pitstop_runs (parent_run, created_at) "
            "WHERE parent_run IS NOT NULL",
        ],
    ),
    (
        5,
        "PostgreSQL keeps values' bytes out of line uncompressed: pitstop compresses what "
        "pays itself, and pglz tried again over every chunk on write and read (a restored "
        "conversation: 2-3x the time); rows written before keep their storage",
        ["/* postgresql only */ ALTER TABLE pitstop_blobs ALTER COLUMN data SET STORAGE EXTERNAL"],
    ),
    (
        6,
        "blob-store values packed: the values one save adds share one file (a pack), each "
        "at `pack_offset` in the pack `pack` (its `size` bytes); rows without a pack keep a "
        "file of their own, named by their hash",
        [
            "ALTER TABLE pitstop_blobs ADD COLUMN pack TEXT",
            "ALTER TABLE pitstop_blobs ADD COLUMN pack_offset {bigint}",
            # What garbage collection asks once it has deleted values: is anything left in
            # their packs.
            "CREATE INDEX pitstop_blobs_pack ON pitstop_blobs (pack) WHERE pack IS NOT NULL",
        ],
    ),
    (
        7,
        "PostgreSQL keeps value rows of up to a page inline: a sealed chunk (a message or "
        "two, 2-8 KiB) went to TOAST as a 1,996-byte and a small piece, each a row and an "
        "index entry of its own, and cost the server a TOAST look-up per chunk on every "
        "restore; rows written before stay where they are",
        ["/* postgresql only */ ALTER TABLE pitstop_blobs SET (toast_tuple_target = 8160)"],
    ),
    (
        8,
        "records attached to a checkpoint (an integration's pending writes) kept in its row: "
        "a LangGraph step wrote a pitstop_effects row and two index entries for them, three "
        "b-trees, where appending to the previous checkpoint's row touches the page the new "
        "checkpoint goes to; rows of pitstop_effects written before stay valid",
        ["ALTER TABLE pitstop_checkpoints ADD COLUMN writes {blob}"],
    ),
    (
        9,
        "PostgreSQL leaves 15% of each checkpoint page free: appending a step's pending "
        "writes to the previous checkpoint's row needs room for its new version on that page "
        "to be a HOT update (no index entries); once VACUUM had published the pages' free "
        "space, new rows filled it and up to 44% of the appends moved the row and wrote both "
        "indexes (LangGraph, 30,000 steps: 1,992 WAL bytes/step, 1,542 with the reserve); "
        "pages written before keep their layout",
        ["/* postgresql only */ ALTER TABLE pitstop_checkpoints SET (fillfactor = 85)"],
    ),
    (
        10,
        "a value's row names the run that stored it (`run_id`), which then references it "
        "without a pitstop_blob_refs row: each chunk cost a reference row and two index "
        "entries besides its own row (on PostgreSQL ~170 bytes, a third of a 10,000-key dict's "
        "store after 200 saves); garbage collection finds a run's own values by walking its "
        "checkpoints; rows written before have none and keep their references",
        ["ALTER TABLE pitstop_blobs ADD COLUMN run_id TEXT"],
    ),
    (
        11,
        "results cached across runs (a step's updates or a ctx.cached call's result) by "
        "key: the field map of the stored result (its values are content-addressed values "
        "referenced as the pseudo-run `pitstop-cache:KEY`), its expiry, and while it is "
        "computed the claim (owner, lease expiry) that makes other workers wait for it",
        [
            """CREATE TABLE pitstop_cache (
                key TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                run_id TEXT,
                checkpoint_id TEXT,
                fields {blob},
                checksum TEXT,
                size {bigint} NOT NULL DEFAULT 0,
                created_at {real} NOT NULL,
                expires_at {real},
                claim_owner TEXT,
                claim_expires {real}
            )""",
            "CREATE INDEX pitstop_cache_name ON pitstop_cache (name, created_at)",
            "CREATE INDEX pitstop_cache_expiry ON pitstop_cache (expires_at) "
            "WHERE expires_at IS NOT NULL",
        ],
    ),
    (
        12,
        "schedules: a workflow started on a cron expression in a timezone; `next_tick` is "
        "the first tick no worker has started yet (advanced by compare-and-set, so however "
        "many workers look, each tick's run id, derived from the schedule and the tick, is "
        "enqueued until one advances it), `last_run` the run of the latest tick started",
        [
            """CREATE TABLE pitstop_schedules (
                name TEXT PRIMARY KEY,
                workflow TEXT NOT NULL,
                cron TEXT NOT NULL,
                timezone TEXT NOT NULL,
                input {blob} NOT NULL,
                input_hash {blob} NOT NULL,
                catchup TEXT NOT NULL,
                overlap TEXT NOT NULL,
                paused INTEGER NOT NULL DEFAULT 0,
                created_at {real} NOT NULL,
                next_tick {real} NOT NULL,
                last_run TEXT
            )""",
            "CREATE INDEX pitstop_schedules_workflow ON pitstop_schedules (workflow)",
        ],
    ),
]

LATEST_SCHEMA = MIGRATIONS[-1][0]
"""The schema version this pitstop reads and writes. Read as ``schema.LATEST_SCHEMA`` at call
time (by :meth:`SqlBackend.migrate <pitstop.store.engine.backend.SqlBackend.migrate>`), so a
test can create a store as an older release did (``tests/oldstore.py``); the rows in it are
written with plain SQL, never by this pitstop's writer, which writes only today's rows."""

SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS pitstop_schema (version INTEGER PRIMARY KEY, "
    "description TEXT NOT NULL, applied_at {real} NOT NULL)"
)
"""Where a store records the migrations applied to it (created before the first one runs)."""


def check_id(kind: str, value: str) -> None:
    """Ids and names are TEXT keys of the tables above: non-empty, at most 512 characters,
    and text every backend stores: PostgreSQL refuses NUL, and no UTF-8 holds a lone
    surrogate; SQLite took a NUL, which ``verify`` then reported as a damaged row."""
    if type(value) is str and 0 < len(value) <= 512 and value.isascii() and "\x00" not in value:
        return  # (the usual id, without check_text's call: a save checks one)
    if not isinstance(value, str) or not value or len(value) > 512:
        raise ValueError(f"{kind} must be a non-empty string of at most 512 characters")
    check_text(kind, value)



# --------------------------------------------------------------------------------------------
# Row classes: one per table, its fields the table's columns (the order every SELECT and
# INSERT built from it uses).
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunRecord:
    """A run's own columns of ``pitstop_runs``: the row without its lease (what an export
    holds: a lease belongs to a process, not to the run)."""

    run_id: str
    workflow: str | None
    status: str
    created_at: float
    updated_at: float
    metadata: str
    """The run's metadata as stored (JSON text)."""
    head_id: str | None
    step: int | None
    waiting_for: str | None
    """JSON list of input names, as stored, or None."""
    wake_at: float | None
    checkpoints: int
    bytes: int
    priority: int
    parent_run: str | None
    """The run whose step started this one (``ctx.run_child``), or None. Exported with the
    run, so a family moved between stores keeps its links."""


@dataclass(slots=True)
class RunRow(RunRecord):
    """A whole ``pitstop_runs`` row: the run's own columns, then its lease."""

    lease_owner: str | None
    lease_expires: float | None
    fence: int
    """The fencing token: grows each time the run changes hands (see :class:`~pitstop.Lease`)."""

    def to_run(self) -> Run:
        """The row as a :class:`Run`; a damaged row (no checksum covers it: it changes on
        every step) is :class:`~pitstop.CorruptCheckpointError` naming the run and field."""
        try:
            run = Run(
                id=self.run_id,
                status=RunStatus(self.status),
                workflow=self.workflow,
                created_at=utc(self.created_at),  # type: ignore[arg-type]
                updated_at=utc(self.updated_at),  # type: ignore[arg-type]
                metadata=json.loads(self.metadata) if self.metadata else {},
                head_id=self.head_id,
                step=self.step,
                waiting_for=tuple(json.loads(self.waiting_for)) if self.waiting_for else (),
                wake_at=utc(self.wake_at),
                checkpoints=self.checkpoints,
                bytes=self.bytes,
                owner=self.lease_owner,
                lease_expires_at=utc(self.lease_expires),
                priority=self.priority,
                parent_run=self.parent_run,
            )
        except (ValueError, TypeError, OverflowError, OSError) as exc:
            problem = run_problem(self) or f"unreadable ({exc})"
        else:
            if isinstance(run.metadata, dict):
                return run
            problem = run_problem(self) or "metadata is not a JSON object"
        raise CorruptCheckpointError(f"damaged run row: {problem}", run_id=str(self.run_id))


@dataclass(frozen=True, slots=True)
class InputRecord:
    """A ``pitstop_inputs`` row: a delivered input, its payload framed and content-hashed like
    a field value."""

    id: str
    run_id: str
    name: str
    payload: bytes
    hash: bytes
    created_at: float
    consumed_by: str | None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """A ``pitstop_effects`` row: a recorded effect result (or integration write)."""

    run_id: str
    key: str
    checkpoint_id: str | None
    result: bytes
    hash: bytes
    created_at: float


@dataclass(frozen=True, slots=True)
class CacheRow:
    """A ``pitstop_cache`` row: a cached result (``fields`` None while it is computed)."""

    key: str
    name: str
    """The step or ``ctx.cached`` name the key was made for."""
    run_id: str | None
    """The run whose computation stored the result."""
    checkpoint_id: str | None
    fields: bytes | None
    """The result's field map, encoded like a checkpoint's; None while claimed."""
    checksum: str | None
    size: int
    created_at: float
    expires_at: float | None
    claim_owner: str | None
    claim_expires: float | None


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A ``pitstop_schedules`` row: a workflow started on a cron expression."""

    name: str
    workflow: str
    cron: str
    timezone: str
    input: bytes
    """The input of each run, framed and content-hashed like a field value."""
    input_hash: bytes
    catchup: str
    overlap: str
    paused: int
    created_at: float
    next_tick: float
    """The first tick (epoch seconds) not started yet."""
    last_run: str | None


class Table(NamedTuple):
    """A table's name and its columns, in the order of its row class's fields."""

    name: str
    columns: tuple[str, ...]

    def column_list(self, prefix: str = "") -> str:
        """``a, b, c`` (``prefix`` before each, e.g. a table alias and a dot)."""
        return ", ".join(prefix + column for column in self.columns)

    def insert(self, columns: tuple[str, ...] | None = None) -> str:
        """``INSERT INTO table (columns...) VALUES (?, ...)`` for these (default: all) columns."""
        columns = columns or self.columns
        marks = ", ".join("?" * len(columns))
        return f"INSERT INTO {self.name} ({', '.join(columns)}) VALUES ({marks})"


def _field_names(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


RUNS = Table("pitstop_runs", _field_names(RunRow))
CHECKPOINTS = Table("pitstop_checkpoints", _field_names(CheckpointRecord))
BLOBS = Table(
    "pitstop_blobs",
    ("hash", "data", "size", "created_at", "location", "alias", "pack", "pack_offset", "run_id"),
)
"""Content-addressed values: framed bytes by hash (``location``: in a blob store instead,
at ``pack_offset`` in the pack file ``pack`` if it has one; ``alias``: a chunk stored as
the first ``size`` bytes of the chunk ``alias``; ``run_id``: the run that stored it, its
*owner*, which references it without a row in ``pitstop_blob_refs``)."""
BLOB_REFS = Table("pitstop_blob_refs", ("run_id", "hash"))
"""Which runs reference which values, besides each value's owner: what garbage collection
counts."""
INPUTS = Table("pitstop_inputs", _field_names(InputRecord))
EFFECTS = Table("pitstop_effects", _field_names(EffectRecord))
CACHE = Table("pitstop_cache", _field_names(CacheRow))
SCHEDULES = Table("pitstop_schedules", _field_names(ScheduleRow))
TABLES = (RUNS, CHECKPOINTS, BLOBS, BLOB_REFS, INPUTS, EFFECTS, CACHE, SCHEDULES)

RUN_ID = RUNS.columns.index("run_id")
"""Where ``run_id`` is in a row of :data:`SELECT_RUN`: for a row too damaged to become a
:class:`RunRow`, whose run must still be named."""

EXPORTED_RUN_COLUMNS = _field_names(RunRecord)
assert set(EXPORTED_RUN_COLUMNS) <= set(RUNS.columns)

# -- SQL built from the row classes ----------------------------------------------------------

SELECT_RUN = f"SELECT {RUNS.column_list()} FROM pitstop_runs"
SELECT_CHECKPOINT = f"SELECT {CHECKPOINTS.column_list()} FROM pitstop_checkpoints"
# A constant, not an f-string at the call: SQLite's statement cache then finds it by identity.
INSERT_CHECKPOINT = CHECKPOINTS.insert()
UNATTACHED_COLUMNS = CHECKPOINTS.columns[:-1]
"""pitstop_checkpoints' columns but ``writes`` (the last): what a save with nothing attached
inserts, the INSERT of a release before migration 8 (which tests play on older schemas)."""
assert CHECKPOINTS.columns[-1] == "writes"
INSERT_UNATTACHED_CHECKPOINT = CHECKPOINTS.insert(UNATTACHED_COLUMNS)

APPEND_ATTACHED = (
    "UPDATE pitstop_checkpoints SET writes = CAST(COALESCE(writes || ?, ?) AS {blob}) "
    "WHERE run_id = ? AND id = ?"
)
"""Appends framed records (the parameter, twice) to a checkpoint's ``writes``; a template
whose column type the dialect fills in (SQLite's ``||`` makes text of two blobs)."""
SELECT_ATTACHED = (
    "SELECT key, result, hash FROM pitstop_effects WHERE run_id = ? AND checkpoint_id = ? "
    "UNION ALL SELECT NULL, writes, NULL FROM pitstop_checkpoints "
    "WHERE run_id = ? AND id = ? AND writes IS NOT NULL"
)
"""What is attached to a checkpoint, in one round trip: effect records naming it (stores
from before migration 8, or records attached before the checkpoint existed), then its row's
framed records (key and hash NULL)."""

FOOTPRINT = "added + LENGTH(fields) + LENGTH(metadata)"
"""SQL for :attr:`CheckpointRecord.footprint
<pitstop.store.encoding.records.CheckpointRecord.footprint>`."""

# A summary row is what CheckpointSummary._from_row takes, in the order of its _fill
# parameters: each a checkpoints column, but for the metadata JSON and the footprint.
_SUMMARY_SOURCES = {"metadata_json": "metadata", "added": FOOTPRINT}
SUMMARY_COLUMNS = tuple(
    _SUMMARY_SOURCES.get(name, name)
    for name in list(inspect.signature(CheckpointSummary._fill).parameters)[1:]
)
assert set(SUMMARY_COLUMNS) - {FOOTPRINT} <= set(CHECKPOINTS.columns)
SELECT_SUMMARY = f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM pitstop_checkpoints"

# A run and its head checkpoint in one query (one round trip when a worker picks a run up):
# the first len(RUNS.columns) values are the RunRow, the rest the head's CheckpointRecord
# (all None without a head).
SELECT_RUN_AND_HEAD = (
    f"SELECT {RUNS.column_list('r.')}, {CHECKPOINTS.column_list('c.')} "
    "FROM pitstop_runs r LEFT JOIN pitstop_checkpoints c ON c.id = r.head_id "
    "WHERE r.run_id = ?"
)
RUN_COLUMN_COUNT = len(RUNS.columns)


__all__ = [
    "BLOBS",
    "BLOB_REFS",
    "CACHE",
    "CHECKPOINTS",
    "EFFECTS",
    "INPUTS",
    "LATEST_SCHEMA",
    "MIGRATIONS",
    "RUNS",
    "RUN_ID",
    "SCHEDULES",
    "SCHEMA_TABLE",
    "TABLES",
    "CacheRow",
    "EffectRecord",
    "InputRecord",
    "RunRecord",
    "RunRow",
    "ScheduleRow",
    "Table",
    "check_id",
]
