"""Which pages and statements one small save writes on SQLite (issue #33, target 1).

    .venv/bin/python bench/pages.py              # the store's save, then the layouts
    .venv/bin/python bench/pages.py --saves 500  # more saves counted
    valgrind --tool=callgrind .venv/bin/python bench/pages.py --instructions 0 --saves 2000

Two parts, both counted exactly (page counts do not depend on the machine's load):

* **The store.** ``store.save`` of the ~1 KiB state of ``bench/store.py`` after a history of
  other runs' saves (so the b-trees have interior pages, as in a used store). The WAL's frames
  are read back from the file (a commit's frames end with one whose "database size" field is
  set), each frame's page is named by ``dbstat`` (table or index, leaf or interior), and the
  statements a save runs come from the connection's trace callback. The store's background
  WAL checkpointer is held off while counting (its passive checkpoints let SQLite start the
  WAL over); nothing else is changed.
* **Layouts.** The same two statements a save runs (the run row's conditional UPDATE, the
  checkpoint INSERT of a row of the same size) against candidate layouts of the checkpoint
  table, in plain ``sqlite3``: WAL frames per commit by b-tree; then, in interleaved rounds,
  the two statements' median time, a run's history listed and a checkpoint got by id, as
  ratios to the current layout and to the floor (an INSERT into a rowid table and COMMIT),
  with ``store.save`` timed in the same rounds. The query plans of the list and the get are
  printed for each layout. ``--trials`` repeats it on fresh databases (where the counted
  run's keys fall in the b-trees decides how often a leaf splits).
"""

from __future__ import annotations

import argparse
import collections
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from _common import base_state, median_of, median_ratio, median_time, table, wal_commits

import pitstop
from pitstop.store.backends import sqlite as sqlite_backend


def by_btree(conn: sqlite3.Connection, commits: list[list[int]]) -> dict[str, float]:
    """Pages written per commit (mean), by the b-tree and page kind they belong to."""
    owners = {pgno: f"{name} ({kind})" for pgno, name, kind in
              conn.execute("SELECT pageno, name, pagetype FROM dbstat")}
    counts: collections.Counter[str] = collections.Counter()
    for pages in commits:
        for page in set(pages):
            counts[owners.get(page, "freelist/new")] += 1
    return {owner: n / len(commits) for owner, n in counts.most_common()}


def store_saves(saves: int, history: int, changed: bool) -> dict[str, object]:
    held = sqlite_backend._WalCheckpointer.poke
    sqlite_backend._WalCheckpointer.poke = lambda self, commits=0: None  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "pages.db"
            store = pitstop.open_store(f"sqlite:///{path}")
            for i in range(history):
                store.save(f"other-{i % 20}", base_state(i=i))
            store.save("measured", base_state(i=-1))
            conn = sqlite3.connect(path)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            statements: list[str] = []
            writer = store._conn  # type: ignore[attr-defined]  # the store's one connection
            writer.set_trace_callback(statements.append)
            hint = ["i"] if changed else None
            for i in range(saves):
                store.save("measured", base_state(i=i), changed=hint)
            writer.set_trace_callback(None)
            commits = wal_commits(Path(f"{path}-wal"))
            pages = by_btree(conn, commits)
            row = conn.execute(
                "SELECT LENGTH(fields), LENGTH(metadata) FROM pitstop_checkpoints "
                "WHERE run_id = 'measured' ORDER BY id DESC LIMIT 1").fetchone()
            conn.close()
            store.close()
    finally:
        sqlite_backend._WalCheckpointer.poke = held  # type: ignore[method-assign]
    per_save = len(statements) // saves
    return {
        "frames": statistics.mean(map(len, commits)),
        "pages": pages,
        "statements": [" ".join(s.split())[:110] for s in statements[-per_save:]],
        "fields_bytes": row[0],
    }


# -- layouts ----------------------------------------------------------------------------------

_COLUMNS = (
    "id TEXT NOT NULL, run_id TEXT NOT NULL, parent_id TEXT, step INTEGER NOT NULL, "
    "created_at REAL NOT NULL, schema_version INTEGER NOT NULL, metadata TEXT NOT NULL, "
    "fields BLOB NOT NULL, size INTEGER NOT NULL, added INTEGER NOT NULL, "
    "checksum TEXT NOT NULL, writes BLOB"
)
STORE = "store.save of the ~1 KiB state (pitstop, the current layout, all of it)"
FLOOR = "the floor: rowid table, no index, no run-row UPDATE *"
DERIVED = "current, head derived: the run's row and head read, not written *"
LAYOUTS = {
    "current: WITHOUT ROWID, key (run_id, id); unique index (id)": [
        f"CREATE TABLE c ({_COLUMNS}, PRIMARY KEY (run_id, id)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX c_id ON c (id)",
    ],
    "WITHOUT ROWID, key (id); index (run_id, id)": [
        f"CREATE TABLE c ({_COLUMNS}, PRIMARY KEY (id)) WITHOUT ROWID",
        "CREATE INDEX c_run ON c (run_id, id)",
    ],
    "rowid table; unique index (id); index (run_id, id)": [
        f"CREATE TABLE c (seq INTEGER PRIMARY KEY, {_COLUMNS})",
        "CREATE UNIQUE INDEX c_id ON c (id)",
        "CREATE INDEX c_run ON c (run_id, id)",
    ],
    "rowid table; unique (id); index (run_id) [+rowid]": [
        f"CREATE TABLE c (seq INTEGER PRIMARY KEY, {_COLUMNS}, UNIQUE (id))",
        "CREATE INDEX c_run ON c (run_id)",
    ],
    "no id index (WITHOUT ROWID, key (run_id, id)) *": [
        f"CREATE TABLE c ({_COLUMNS}, PRIMARY KEY (run_id, id)) WITHOUT ROWID",
    ],
    "rowid table, no index at all *": [f"CREATE TABLE c (seq INTEGER PRIMARY KEY, {_COLUMNS})"],
    DERIVED: [
        f"CREATE TABLE c ({_COLUMNS}, PRIMARY KEY (run_id, id)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX c_id ON c (id)",
    ],
    FLOOR: [f"CREATE TABLE c (seq INTEGER PRIMARY KEY, {_COLUMNS})"],
}
"""Candidate layouts of the checkpoint table. Those marked * cannot serve the store's
queries (a checkpoint by id alone, a run's history), or (``DERIVED``) the store's data model
as it is (a run's head, step and counters kept in its row): they show what each b-tree and
the run's row cost."""
RUN_ROW = {FLOOR: "none", DERIVED: "read"}
"""What a save does to the run's row, where not the store's conditional UPDATE: nothing, or
read it (the lease) and the run's latest checkpoint (a head derived from the checkpoints)."""

_RUNS = (
    "CREATE TABLE r (run_id TEXT PRIMARY KEY, status TEXT, updated_at REAL, head_id TEXT, "
    "step INTEGER, checkpoints INTEGER, bytes INTEGER, lease_owner TEXT, lease_expires REAL)"
)

_LIST = ("SELECT id, parent_id, step, created_at, metadata, size FROM c WHERE run_id = ? "
         "ORDER BY id")
_GET = "SELECT * FROM c WHERE id = ?"


def _uuid7() -> str:
    """A time-ordered id like the store's checkpoint ids."""
    ms = time.time_ns() // 1_000_000
    return str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (uuid.uuid4().int & ((1 << 76) - 1))))


class Layout:
    """A database with one layout and 20 runs; :meth:`save` is a save's two statements."""

    def __init__(self, path: Path, ddl: list[str], fields: bytes, run_row: str,
                 page_size: int) -> None:
        self.run_row = run_row
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute(f"PRAGMA page_size={page_size}")
        self.path = path
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self.conn.execute(_RUNS)
        for statement in ddl:
            self.conn.execute(statement)
        self.runs = [str(uuid.uuid4()) for _ in range(20)]
        self.conn.executemany("INSERT INTO r VALUES (?, 'running', 0, NULL, 0, 0, 0, NULL, NULL)",
                              [(r,) for r in self.runs])
        self.fields = fields
        self.step = 0
        self.head = ""

    def history(self) -> None:
        """A run's history as the store lists it: summaries by run, in id order."""
        self.conn.execute(_LIST, (self.runs[10],)).fetchall()

    def get(self) -> None:
        """A checkpoint by its id alone (``store.get``)."""
        self.conn.execute(_GET, (self.head,)).fetchall()

    def save(self, run_id: str | None = None) -> None:
        self.step += 1
        run_id = run_id or self.runs[10]
        cid, now = _uuid7(), time.time()
        self.head = cid
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        if self.run_row == "read":
            c.execute("SELECT lease_owner, lease_expires FROM r WHERE run_id = ?",
                      (run_id,)).fetchone()
            c.execute("SELECT id FROM c WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                      (run_id,)).fetchone()
        elif self.run_row == "update":
            c.execute(
                "UPDATE r SET head_id = ?, step = ?, updated_at = ?, "
                "checkpoints = checkpoints + 1, bytes = bytes + ? WHERE run_id = ? AND "
                "(lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= ?)",
                (cid, self.step, now, 400, run_id, now))
        c.execute(
            "INSERT INTO c (id, run_id, parent_id, step, created_at, schema_version, metadata, "
            "fields, size, added, checksum) VALUES (?, ?, ?, ?, ?, 0, '{}', ?, 752, 0, ?)",
            (cid, run_id, cid, self.step, now, self.fields, "0" * 32))
        c.execute("COMMIT")


def _store_save(store: pitstop.Store) -> Callable[[], None]:
    counter = iter(range(10**9))

    def save() -> None:
        store.save("run-10", base_state(i=next(counter)))

    return save


def layouts(saves: int, history: int, fields_bytes: int, rounds: int,
            trials: int, page_size: int) -> list[list[str]]:
    """Each trial: a fresh database per layout, ``history`` saves over 20 runs, then
    ``saves`` of one of them counted (where that run's keys fall in the b-trees decides how
    often a leaf splits: trials vary it), then ``rounds`` interleaved rounds timing a save,
    a listing of the run's history and a get by id in every layout."""
    frames: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    pages: dict[str, list[dict[str, float]]] = {name: [] for name in LAYOUTS}
    samples: dict[str, list[float]] = {name: [] for name in [*LAYOUTS, STORE]}
    listing: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    getting: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    plans: dict[str, str] = {}
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            dbs = {}
            for n, (name, ddl) in enumerate(LAYOUTS.items()):
                db = Layout(Path(tmp) / f"l{n}.db", ddl, os.urandom(fields_bytes),
                            RUN_ROW.get(name, "update"), page_size)
                for i in range(history):
                    db.save(db.runs[i % 20])
                db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                for _ in range(saves):
                    db.save()
                commits = wal_commits(Path(f"{db.path}-wal"))
                frames[name].append(statistics.mean(map(len, commits)))
                pages[name].append(by_btree(db.conn, commits))
                plans[name] = "; ".join(
                    " / ".join(row[-1] for row in db.conn.execute(f"EXPLAIN QUERY PLAN {q}", a))
                    for q, a in ((_LIST, ("r",)), (_GET, ("x",))))
                dbs[name] = db
            store = pitstop.open_store(f"sqlite:///{Path(tmp) / 'store.db'}")
            for i in range(history):
                store.save(f"run-{i % 20}", base_state(i=i))
            save = _store_save(store)

            for _ in range(rounds):
                for name, db in dbs.items():
                    db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    samples[name].append(median_time(db.save, 40, warmup=5))
                    listing[name].append(median_time(db.history, 3, warmup=1))
                    getting[name].append(median_time(db.get, 20, warmup=2))
                samples[STORE].append(median_time(save, 40, warmup=5))
            for db in dbs.values():
                db.conn.close()
            store.close()
    print(f"query plans (list: {_LIST}; get: {_GET}):")
    for name, plan in plans.items():
        print(f"  {name}: {plan}")
    print("frames per commit in each trial: "
          + "; ".join(f"{name.split(':')[0][:24]} {[round(f, 2) for f in fs]}"
                      for name, fs in frames.items()))
    current = next(iter(LAYOUTS))
    rows = []
    for name in LAYOUTS:
        run_row = statistics.mean(p.get("r (leaf)", 0.0) for p in pages[name])
        rows.append([name, f"{statistics.mean(frames[name]):.2f}", f"{run_row:.2f}",
                     f"{statistics.mean(frames[name]) - run_row:.2f}",
                     f"{median_of(samples[name]) * 1e6:.0f} µs",
                     f"{median_ratio(samples[name], samples[current]):.2f}",
                     f"{median_ratio(samples[name], samples[FLOOR]):.2f}",
                     f"{median_ratio(listing[name], listing[current]):.2f}",
                     f"{median_ratio(getting[name], getting[current]):.2f}"])
    rows.append([STORE, "", "", "", f"{median_of(samples[STORE]) * 1e6:.0f} µs",
                 f"{median_ratio(samples[STORE], samples[current]):.2f}",
                 f"{median_ratio(samples[STORE], samples[FLOOR]):.2f}", "", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--saves", type=int, default=300)
    parser.add_argument("--history", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds per trial")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--page-size", type=int, default=4096,
                        help="the layouts' page size (the store's is SQLite's default, 4096)")
    parser.add_argument("--instructions", type=int, metavar="LAYOUT",
                        help="only build layout number LAYOUT (0: current) and make --saves "
                        "saves, for callgrind: run with --saves 0 and 2000, subtract")
    args = parser.parse_args()
    if args.instructions is not None:
        name = list(LAYOUTS)[args.instructions]
        with tempfile.TemporaryDirectory() as tmp:
            db = Layout(Path(tmp) / "one.db", LAYOUTS[name], b"\1" * 144,
                        RUN_ROW.get(name, "update"), args.page_size)
            for i in range(args.history):
                db.save(db.runs[i % 20])
            for _ in range(args.saves):
                db.save()
            db.conn.close()
        return
    cases = ((0, False, "a fresh store, one run"),
             (args.history, False, f"after {args.history} saves of 20 other runs"),
             (args.history, True, "the same, changed=['i']"))
    for history, changed, what in cases:
        found = store_saves(args.saves, history, changed)
        print(f"store.save of ~1 KiB, {what}: {found['frames']:.2f} WAL frames per commit "
              f"(checkpoint row's field map: {found['fields_bytes']} B)")
        pages = found["pages"]
        assert isinstance(pages, dict)
        for owner, n in pages.items():
            print(f"  {n:5.2f}  {owner}")
        print("  statements of one save:")
        for statement in found["statements"]:  # type: ignore[attr-defined]
            print("   ", statement)
    fields_bytes = int(found["fields_bytes"])  # type: ignore[call-overload]
    print()
    print(table(["checkpoint table layout", "WAL frames/commit", "run row pages",
                 "checkpoint pages", "save's SQL (median)", "vs current", "vs floor",
                 "list history vs current", "get by id vs current"],
                layouts(args.saves, args.history, fields_bytes, args.rounds, args.trials,
                        args.page_size)))


if __name__ == "__main__":
    main()
