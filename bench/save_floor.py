"""The least a checkpoint save can cost on SQLite, against the raw INSERT+COMMIT floor
(issue #33, target 1: ``store.save`` of ~1 KiB <= 2x that floor, same ``synchronous``).

    .venv/bin/python bench/save_floor.py               # 15 interleaved rounds
    .venv/bin/python bench/save_floor.py --rounds 31

``bench/pages.py`` prices each b-tree a save writes. This bench asks the question above it:
what would the *thinnest conceivable* save cost, whatever its layout and data model? Each
variant below is a hand-written save in plain ``sqlite3`` (WAL, ``synchronous=NORMAL``, as
the store's default ``normal`` durability), timed in the same interleaved rounds as the
floor, the store's ``store.save`` and each part alone:

* **the floor**: ``BEGIN IMMEDIATE``, one ``INSERT`` of the state's serialised bytes into a
  two-column rowid table, ``COMMIT`` (``bench/store.py``'s floor).
* **a thin save** does what no checkpoint can skip, in the fewest Python calls: serialise
  each field (one ``ormsgpack.packb`` each), keep the parent's entry for a field whose bytes
  did not change, inline a small one and hash a larger one, pack the field map, make a
  time-ordered id (``pitstop.ids.new_id``) and the record's checksum (SHA-256 over the
  record, as the store's), then write one 11-column checkpoint row. (It writes no value
  rows: in this state only the counter changes, and it is inlined.)
* **layouts** for that row, from the least to the store's:
  1. a rowid table with no index and no run row at all: no history by run, no lookup by
     id, no head (nothing a store can serve; the floor of any row with a checkpoint's
     columns);
  2. the best data model that still serves a run's history and head: the table keyed by
     (run_id, id), no id index, the head derived (the lease and the run's latest
     checkpoint read, not written);
  3. the store's layout and data model: the same table plus the unique id index, and the
     run row's conditional ``UPDATE`` (head, step, counters).
* **parts alone**: the thin Python with no SQL; layout 1's SQL with no Python (a fresh id
  and row each call); and a save's Python and SQL called back to back, to show what running
  them together costs beyond their sum (caches: a loop of nothing but SQL keeps SQLite's
  code and data hot).

Every database first gets 4,000 saves over 20 runs, so the b-trees have interior pages as
in a used store; the measured run is one in the middle. Times are medians of each round's
median; ratios are medians of each round's ratio to the floor.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ormsgpack
from _common import base_state, median_of, median_ratio, median_time, save_results, table

import pitstop
from pitstop.ids import new_id

INLINE_MAX = 40  # the store's: a field serialising to fewer bytes is kept in the field map

_COLUMNS = (
    "id TEXT NOT NULL, run_id TEXT NOT NULL, parent_id TEXT, step INTEGER NOT NULL, "
    "created_at REAL NOT NULL, schema_version INTEGER NOT NULL, metadata TEXT NOT NULL, "
    "fields BLOB NOT NULL, size INTEGER NOT NULL, added INTEGER NOT NULL, "
    "checksum TEXT NOT NULL"
)
_RUNS = (
    "CREATE TABLE r (run_id TEXT PRIMARY KEY, head_id TEXT, step INTEGER, "
    "updated_at REAL, checkpoints INTEGER, lease_owner TEXT, lease_expires REAL)"
)
_INSERT = (
    "INSERT INTO c (id, run_id, parent_id, step, created_at, schema_version, metadata, "
    "fields, size, added, checksum) VALUES (?, ?, ?, ?, ?, 0, '{}', ?, ?, 0, ?)"
)
BARE, DERIVED, STORE_MODEL = "bare", "derived", "store"
LAYOUTS = {
    BARE: [f"CREATE TABLE c (seq INTEGER PRIMARY KEY, {_COLUMNS})"],
    DERIVED: [f"CREATE TABLE c ({_COLUMNS}, PRIMARY KEY (run_id, id)) WITHOUT ROWID"],
    STORE_MODEL: [
        f"CREATE TABLE c ({_COLUMNS}, PRIMARY KEY (run_id, id)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX c_id ON c (id)",
    ],
}


def connect(path: Path, ddl: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for statement in ddl:
        conn.execute(statement)
    return conn


class ThinSave:
    """A checkpoint save with the fewest Python calls that still does a save's work, for one
    run of one database (``conn`` None: the Python alone)."""

    def __init__(self, conn: sqlite3.Connection | None, run_id: str, model: str) -> None:
        self.conn, self.run_id, self.model = conn, run_id, model
        self.head: str | None = None
        self.step = 0
        self.parent_raw: dict[str, bytes] = {}
        self.parent_entries: dict[str, list[Any]] = {}

    def prepare(self, state: dict[str, Any]) -> tuple[str, float, bytes, str]:
        raws: dict[str, bytes] = {}
        entries: dict[str, list[Any]] = {}
        for name, value in state.items():
            raw = ormsgpack.packb(value)
            if self.parent_raw.get(name) == raw:
                entries[name] = self.parent_entries[name]
            elif len(raw) < INLINE_MAX:
                entries[name] = [name, b"\0" + raw]
            else:
                entries[name] = [name, hashlib.sha256(raw).digest(), len(raw)]
            raws[name] = raw
        fields = ormsgpack.packb(list(entries.values()))
        checkpoint_id, now = new_id(self.head), time.time()
        checksum = hashlib.sha256(ormsgpack.packb(
            [checkpoint_id, self.run_id, self.head, self.step, now, 0, {}, fields])).hexdigest()
        self.parent_raw, self.parent_entries = raws, entries
        return checkpoint_id, now, fields, checksum[:32]

    def save(self, state: dict[str, Any]) -> None:
        checkpoint_id, now, fields, checksum = self.prepare(state)
        conn = self.conn
        if conn is not None:
            conn.execute("BEGIN IMMEDIATE")
            if self.model == DERIVED:
                conn.execute("SELECT lease_owner, lease_expires FROM r WHERE run_id = ?",
                             (self.run_id,)).fetchone()
                head = conn.execute("SELECT id FROM c WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                                    (self.run_id,)).fetchone()
                assert (head and head[0]) == self.head, "another writer moved the head"
            elif self.model == STORE_MODEL:
                conn.execute(
                    "UPDATE r SET head_id = ?, step = ?, updated_at = ?, "
                    "checkpoints = checkpoints + 1 WHERE run_id = ? AND head_id IS ? AND "
                    "(lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= ?)",
                    (checkpoint_id, self.step, now, self.run_id, self.head, now))
            conn.execute(_INSERT, (checkpoint_id, self.run_id, self.head, self.step, now,
                                   fields, 900, checksum))
            conn.execute("COMMIT")
        self.head = checkpoint_id
        self.step += 1


def operations(tmp: Path, history: int) -> dict[str, Callable[[], None]]:
    counter = iter(range(10**9))
    payload = ormsgpack.packb(base_state(i=0))
    floor = connect(tmp / "floor.db", ["CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB)"])

    def floor_save() -> None:
        floor.execute("BEGIN IMMEDIATE")
        floor.execute("INSERT INTO t (id, data) VALUES (?, ?)", (next(counter), payload))
        floor.execute("COMMIT")

    thin: dict[str, ThinSave] = {}
    for model, ddl in LAYOUTS.items():
        conn = connect(tmp / f"{model}.db", [_RUNS, *ddl])
        runs = [ThinSave(conn, str(uuid.uuid4()), model) for _ in range(20)]
        conn.executemany("INSERT INTO r (run_id, step, checkpoints) VALUES (?, 0, 0)",
                         [(run.run_id,) for run in runs])
        for i in range(history):
            runs[i % 20].save(base_state(i=i))
        thin[model] = runs[10]
    store = pitstop.open_store(f"sqlite:///{tmp / 'store.db'}")
    for i in range(history):
        store.save(f"run-{i % 20}", base_state(i=i))
    python_alone = ThinSave(None, "python-alone", BARE)
    bare_sql = connect(tmp / "bare-sql.db", LAYOUTS[BARE])
    fields = os.urandom(150)

    def sql_alone() -> None:
        checkpoint_id = str(uuid.UUID(int=next(counter)))
        bare_sql.execute("BEGIN IMMEDIATE")
        bare_sql.execute(_INSERT, (checkpoint_id, "run", checkpoint_id, 1, 1.0, fields, 900,
                                   "0" * 32))
        bare_sql.execute("COMMIT")

    def both_apart() -> None:
        python_alone.save(base_state(i=next(counter)))
        sql_alone()

    return {
        "the floor: INSERT + COMMIT of the state's bytes": floor_save,
        "thin save, 1: rowid table, no index, no run row": lambda: thin[BARE].save(
            base_state(i=next(counter))),
        "thin save, 2: key (run_id, id), no id index, head derived": lambda: thin[
            DERIVED].save(base_state(i=next(counter))),
        "thin save, 3: the store's layout and run-row UPDATE": lambda: thin[
            STORE_MODEL].save(base_state(i=next(counter))),
        "store.save": lambda: store.save("run-10", base_state(i=next(counter))),
        "the thin save's Python alone": lambda: python_alone.save(base_state(i=next(counter))),
        "layout 1's SQL alone": sql_alone,
        "the two above, back to back": both_apart,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=200, help="saves timed per round")
    parser.add_argument("--history", type=int, default=4000)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        ops = operations(Path(tmp), args.history)
        samples: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(args.rounds):
            for name, op in ops.items():
                samples[name].append(median_time(op, args.repeat, warmup=20))
    floor = next(iter(samples.values()))
    rows = [[name, f"{median_of(times) * 1e6:.1f} µs", f"{median_ratio(times, floor):.2f}x",
             f"{min(a / b for a, b in zip(times, floor, strict=True)):.2f}-"
             f"{max(a / b for a, b in zip(times, floor, strict=True)):.2f}x"]
            for name, times in samples.items()]
    markdown = table(["save (SQLite, synchronous=NORMAL)", "median", "vs floor",
                      "rounds' range"], rows)
    markdown += (f"\n\n{args.rounds} rounds of {args.repeat}, load average "
                 f"{load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(markdown)
    save_results("save_floor", "bench/save_floor.py", {
        name: {"median_s": median_of(times), "ratio": median_ratio(times, floor)}
        for name, times in samples.items()}, markdown)


if __name__ == "__main__":
    main()
