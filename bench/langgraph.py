"""LangGraph checkpointers side by side: LangGraph's own savers vs PitstopSaver.

    python bench/langgraph.py [--steps 200] [--repeats 5] [--no-pg] [--durability sync]
    python bench/langgraph.py --replay [--steps 200] [--repeats 9] [--no-pg]

One graph: a node increments a counter and routes back to itself until it reaches ``--steps``
(one checkpoint per step). Three variants of its state:

* ``small``: just the counter;
* ``str 1MiB``: plus a 1 MiB string that no step changes (base64 of random bytes, so that
  compression cannot hide the difference: it shrinks to ~3/4 at best);
* ``list 1MiB``: plus a 1 MiB list of 64-character strings that no step changes.

Savers, each on a fresh database (a new file, or a new PostgreSQL schema):

* ``InMemorySaver (no I/O)``: LangGraph's in-memory saver, the cost of the graph itself with
  a checkpointer that writes nothing anywhere (no saver can make a step cheaper than this);
* ``floor: INSERT/COMMIT``: the same plus one ``INSERT`` + ``COMMIT`` per ``put``
  of the serialised checkpoint and its step's writes, into a rowid table with no index
  (``synchronous=NORMAL``): the least any durable saver on SQLite can spend in saver; and
  ``floor, keyed (thread, id)``, the same into a table keyed by thread and checkpoint id,
  the least b-tree a saver that can read a thread back needs (issue #33's floors);
* ``SqliteSaver`` as its docs create it (WAL, SQLite's default ``synchronous=FULL``: an fsync
  per commit) and ``SqliteSaver NORMAL`` (``synchronous=NORMAL``, no fsync per commit);
* ``PitstopSaver sqlite full`` (``?durability=full``: an fsync per commit, like SqliteSaver's
  default) and ``PitstopSaver sqlite`` (pitstop's default ``normal``, like SQLite NORMAL);
* ``PostgresSaver`` (``setup()`` in a fresh schema) and ``PitstopSaver postgres``.

Measured:

* **ms/step**: wall time of one ``invoke`` of the whole graph on a new thread divided by the
  steps, median of ``--repeats``; also the time during which at least one call to the
  saver's ``put``, ``put_writes`` or ``get_tuple`` is running, per step (also a median):
  LangGraph runs ``put_writes`` and ``put`` concurrently on two threads, so overlapping calls
  are counted once. LangGraph runs with ``durability="sync"`` by default here so each step waits
  for its checkpoint; with ``"async"`` puts overlap the next step.
* **bytes**: after one invocation (one thread) on its own fresh database. SQLite: the file
  size after ``wal_checkpoint(TRUNCATE)`` (page_count * page_size), for both savers; pitstop's
  logical ``store.stats().bytes`` (records + stored values) is shown in brackets.
  PostgreSQL: ``pg_total_relation_size`` (table + indexes + TOAST) summed over the saver's
  tables in its schema, for both savers.

Ratios compare each PitstopSaver row with the LangGraph saver on the same database and with
the same durability: ``speed`` = their ms/step / ours, ``bytes`` = their bytes / ours; time
ratios are medians of per-round ratios (the rounds are interleaved, so a slow moment of the
machine hits both sides of a ratio).

Targets (issue #13), checked at the end of a run: on the ``small`` variant, the time inside
the saver per step is at most 0.6x ``SqliteSaver``'s on SQLite (each durability against its
like) and at most 0.5x ``PostgresSaver``'s on PostgreSQL; on every variant the wall time per
step is not worse than the reference saver's on the same database and durability.

``--replay`` measures the savers alone, without LangGraph's threads: the ``put`` and
``put_writes`` calls one ``small`` invocation makes (recorded once, on LangGraph's
``InMemorySaver``, so every saver gets the same calls) are replayed on a new thread of each
saver, in turns (saver A, B, C, A, B...) after one warm-up replay. It prints the median
µs/step and, per PitstopSaver row, the median of the per-round ratios ours / theirs (lower is
better): the machine's noise moves single numbers far more than ratios measured in one round.

``--floor`` measures the SQL alone, on SQLite: the rows one ``small`` invocation left in each
saver's tables are written again, step by step, into a fresh database with the same schema,
by the statements each saver sends (no Python serialisation, no LangGraph): ``SqliteSaver``'s
two one-statement transactions per step; PitstopSaver's one transaction per step (BEGIN
IMMEDIATE, the head's compare-and-set UPDATE, the checkpoint INSERT, the UPDATE appending
the previous step's pending writes to that step's checkpoint row, COMMIT); and, for
comparison, those writes as one row per task in ``pitstop_effects`` and its two indexes
(what PitstopSaver did before schema 8), in the same transaction or in one of their own
(before it held them for the next checkpoint). It bounds what any change to the savers'
Python can reach. Each row also gives the WAL pages one step writes (below).

``--pages`` counts, for ``SqliteSaver NORMAL`` and ``PitstopSaver sqlite`` running one
``small`` invocation, the SQL statements per step and the WAL pages per commit, by the table
or index each page belongs to (SQLite's ``dbstat``): what a commit costs beyond its
statements is mostly those pages (each one a frame written to the WAL, and with
``synchronous=FULL`` part of the fsync).
"""

from __future__ import annotations

import argparse
import base64
import os
import sqlite3
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict, cast

# Run as a script, this file's directory comes first on sys.path and its name would shadow
# the langgraph package.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

import pitstop
from pitstop.integrations.langgraph import PitstopSaver
from pitstop.store.encoding.attached import frame_records, read_frames
from pitstop.store.engine.schema import APPEND_ATTACHED, UNATTACHED_COLUMNS

PG_URL = os.environ.get("PITSTOP_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MiB = 1024 * 1024


class State(TypedDict, total=False):
    counter: int
    big: Any


def build_graph(steps: int) -> StateGraph[State]:
    def step(state: State) -> State:
        return {"counter": state["counter"] + 1}

    def route(state: State) -> str:
        return "step" if state["counter"] < steps else END

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route)
    return builder


def payloads() -> dict[str, Any]:
    text = base64.b64encode(os.urandom(MiB * 3 // 4)).decode()
    items = [base64.b64encode(os.urandom(48)).decode() for _ in range(MiB // 64)]
    return {"small": None, "str 1MiB": text, "list 1MiB": items}


# -- savers on fresh databases ------------------------------------------------------------------


@dataclass
class Opened:
    saver: BaseCheckpointSaver[Any]
    size: Callable[[], tuple[int, int | None]]
    """(bytes as measured for the table, pitstop's logical bytes or None)."""


Factory = Callable[[], AbstractContextManager[Opened]]


def _sqlite_file_size(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int(pages * page_size)
    finally:
        conn.close()


@contextmanager
def memory_saver() -> Iterator[Opened]:
    """LangGraph's in-memory saver: no I/O, so its row is what the graph itself costs."""
    from langgraph.checkpoint.memory import InMemorySaver

    yield Opened(InMemorySaver(), lambda: (0, None))


@contextmanager
def floor_saver(keyed: bool) -> Iterator[Opened]:
    """The least a durable saver can do on SQLite: LangGraph's in-memory saver (its
    serialisation and bookkeeping) plus, per ``put``, one ``INSERT`` + ``COMMIT`` of the
    serialised checkpoint and the step's pending writes, ``synchronous=NORMAL``. Into a
    rowid table with no index (``keyed`` False: no reader could find a thread's checkpoints
    in it), or into a table keyed by (thread, checkpoint id), the one b-tree a saver needs
    to answer ``get_tuple`` from disk. Floors for issue #33's in-saver target, not savers."""
    from langgraph.checkpoint.memory import InMemorySaver

    class FloorSaver(InMemorySaver):
        def __init__(self, conn: sqlite3.Connection) -> None:
            super().__init__()
            self.conn = conn
            self.pending: list[Any] = []

        def put_writes(self, config: Any, writes: Any, task_id: str,
                       task_path: str = "") -> None:
            super().put_writes(config, writes, task_id, task_path)
            self.pending.extend(self.serde.dumps_typed(value) for _, value in writes)

        def put(self, config: Any, checkpoint: Any, metadata: Any,
                new_versions: Any) -> Any:
            saved = super().put(config, checkpoint, metadata, new_versions)
            row = self.serde.dumps_typed([checkpoint, self.pending])[1]
            self.pending = []
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO c (thread_id, id, data) VALUES (?, ?, ?)",
                              (config["configurable"]["thread_id"], checkpoint["id"], row))
            self.conn.execute("COMMIT")
            return saved

    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        path = os.path.join(tmp, "floor.db")
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE c (thread_id TEXT, id TEXT, data BLOB, PRIMARY KEY (thread_id, id)) "
            "WITHOUT ROWID" if keyed else
            "CREATE TABLE c (seq INTEGER PRIMARY KEY, thread_id TEXT, id TEXT, data BLOB)")
        try:
            yield Opened(FloorSaver(conn), lambda: (_sqlite_file_size(path), None))
        finally:
            conn.close()


@contextmanager
def sqlite_saver(synchronous: str | None) -> Iterator[Opened]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with tempfile.TemporaryDirectory(prefix="bench-lg-") as tmp:
        path = os.path.join(tmp, "langgraph.db")
        with SqliteSaver.from_conn_string(path) as saver:
            saver.setup()
            if synchronous:
                saver.conn.execute(f"PRAGMA synchronous={synchronous}")
            yield Opened(saver, lambda: (_sqlite_file_size(path), None))


@contextmanager
def pitstop_sqlite(durability: str) -> Iterator[Opened]:
    with tempfile.TemporaryDirectory(prefix="bench-pitstop-") as tmp:
        path = os.path.join(tmp, "pitstop.db")
        store = pitstop.open_store(f"sqlite:///{path}?durability={durability}")
        try:
            yield Opened(
                PitstopSaver(store), lambda: (_sqlite_file_size(path), store.stats().bytes)
            )
        finally:
            store.close()


def _schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}schema={schema}"


def _pg_size(schema: str) -> int:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchone()
        return int(row[0]) if row else 0


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def postgres_saver() -> Iterator[Opened]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    schema = f"bench_lg_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        with PostgresSaver.from_conn_string(
            f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
        ) as saver:
            saver.setup()
            yield Opened(saver, lambda: (_pg_size(schema), None))
    finally:
        _drop_schema(schema)


@contextmanager
def pitstop_postgres() -> Iterator[Opened]:
    schema = f"bench_ps_{uuid.uuid4().hex[:10]}"
    store = pitstop.open_store(_schema_url(schema))
    try:
        yield Opened(PitstopSaver(store), lambda: (_pg_size(schema), store.stats().bytes))
    finally:
        store.close()
        _drop_schema(schema)


# -- measuring -----------------------------------------------------------------------------------


class SaverClock:
    """Time during which at least one call to a saver's hot methods is running.

    LangGraph runs ``put_writes`` (on the task's thread) and ``put`` (on its background
    executor) at the same time; summing their durations would count the overlap twice and
    favour a saver that makes them wait for each other. Counted here: wall time with any
    call in flight, whatever the thread.
    """

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        self.seconds = 0.0
        self._active = 0
        self._since = 0.0
        self._lock = threading.Lock()
        for name in ("put", "put_writes", "get_tuple"):
            method = getattr(saver, name)

            def timed(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                self._enter()
                try:
                    return _method(*args, **kwargs)
                finally:
                    self._leave()

            setattr(saver, name, timed)

    def _enter(self) -> None:
        with self._lock:
            if not self._active:
                self._since = time.perf_counter()
            self._active += 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if not self._active:
                self.seconds += time.perf_counter() - self._since


def invoke(
    saver: BaseCheckpointSaver[Any], steps: int, big: Any, durability: str
) -> tuple[float, float]:
    """One invocation on a new thread: (wall ms/step, in-saver ms/step)."""
    graph = build_graph(steps).compile(checkpointer=saver)
    clock = SaverClock(saver)
    state: State = {"counter": 0} if big is None else {"counter": 0, "big": big}
    config: Any = {
        "configurable": {"thread_id": uuid.uuid4().hex},
        "recursion_limit": steps + 10,
    }
    start = time.perf_counter()
    result = graph.invoke(state, config, durability=durability)  # type: ignore[arg-type]
    wall = time.perf_counter() - start
    assert result["counter"] == steps
    return wall / steps * 1000, clock.seconds / steps * 1000


@dataclass
class Row:
    database: str
    saver: str
    variant: str
    rounds: list[tuple[float, float]]
    """(wall ms/step, in-saver ms/step) of each interleaved round."""
    bytes: int
    logical: int | None
    baseline: str | None

    @property
    def ms(self) -> float:
        return statistics.median(r[0] for r in self.rounds)

    @property
    def saver_ms(self) -> float:
        return statistics.median(r[1] for r in self.rounds)


def ratio(ours: Row, theirs: Row, column: int) -> float:
    """Median over rounds of ours / theirs (wall: column 0, in saver: column 1)."""
    return statistics.median(
        a[column] / b[column] for a, b in zip(ours.rounds, theirs.rounds, strict=True)
    )


TARGETS = {"sqlite": 0.6, "postgres": 0.5}
"""Issue #13: in-saver time per step on the small state, ours / the reference saver's."""


def measure(
    savers: list[tuple[str, str, Factory, str | None]],
    variant: str,
    big: Any,
    args: argparse.Namespace,
) -> list[Row]:
    """Bytes: one thread per saver on a fresh database. Time: every saver on another fresh
    database, warmed up by one run, then the repeats taken in turns (saver A, B, C, A, B...)
    so that a noisy moment on the machine hits them all alike."""
    sizes = {}
    for _, name, factory, _ in savers:
        with factory() as opened:
            invoke(opened.saver, args.steps, big, args.durability)
            sizes[name] = opened.size()
    times: dict[str, list[tuple[float, float]]] = {name: [] for _, name, _, _ in savers}
    with ExitStack() as stack:
        opened_all = [(name, stack.enter_context(factory())) for _, name, factory, _ in savers]
        for _, opened in opened_all:
            invoke(opened.saver, args.steps, big, args.durability)
        for _ in range(args.repeats):
            for name, opened in opened_all:
                times[name].append(invoke(opened.saver, args.steps, big, args.durability))
    return [
        Row(database, name, variant, times[name], sizes[name][0], sizes[name][1], baseline)
        for database, name, _, baseline in savers
    ]


# -- replaying the saver calls of one invocation --------------------------------------------------


def record_calls(steps: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The put/put_writes calls (deep copies of their arguments) of one ``small`` invocation."""
    import copy

    from langgraph.checkpoint.memory import InMemorySaver

    calls: list[tuple[str, tuple[Any, ...]]] = []

    class Recorder(InMemorySaver):
        def put(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(("put", copy.deepcopy(args)))
            return super().put(*args, **kwargs)

        def put_writes(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(("put_writes", copy.deepcopy(args)))
            return super().put_writes(*args, **kwargs)

    graph = build_graph(steps).compile(checkpointer=Recorder())
    config: Any = {"configurable": {"thread_id": "recorded"}, "recursion_limit": steps + 10}
    graph.invoke({"counter": 0}, config, durability="sync")
    return calls


def replay(
    saver: BaseCheckpointSaver[Any], calls: list[tuple[str, tuple[Any, ...]]], steps: int
) -> float:
    """µs per step to make the recorded calls on a new thread of ``saver``."""
    thread = uuid.uuid4().hex
    prepared = [
        (
            getattr(saver, kind),
            ({**args[0], "configurable": {**args[0]["configurable"], "thread_id": thread}},
             *args[1:]),
        )
        for kind, args in calls
    ]
    start = time.perf_counter()
    for method, arguments in prepared:
        method(*arguments)
    return (time.perf_counter() - start) / steps * 1e6


def run_replay(
    savers: list[tuple[str, str, Factory, str | None]], args: argparse.Namespace
) -> None:
    calls = record_calls(args.steps)
    times: dict[str, list[float]] = {name: [] for _, name, _, _ in savers}
    with ExitStack() as stack:
        opened = [(name, stack.enter_context(factory()).saver) for _, name, factory, _ in savers]
        for _, saver in opened:
            replay(saver, calls, args.steps)
        for _ in range(args.repeats):
            for name, saver in opened:
                times[name].append(replay(saver, calls, args.steps))
    print(f"{'database':9} {'saver':26} {'us/step':>8} {'ours/theirs':>12}")
    print("-" * 58)
    for database, name, _, baseline in savers:
        ratio = ""
        if baseline:
            ratios = [a / b for a, b in zip(times[name], times[baseline], strict=True)]
            ratio = f"{statistics.median(ratios):11.2f}x"
        print(f"{database:9} {name:26} {statistics.median(times[name]):8.1f} {ratio:>12}")


# -- the SQL alone ---------------------------------------------------------------------------------

_MOVE_HEAD = (
    "UPDATE pitstop_runs SET head_id = ?, step = ?, updated_at = ?, "
    "checkpoints = checkpoints + 1, bytes = bytes + ? WHERE run_id = ? AND head_id IS ? "
    "AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= ?)"
)


def run_floor(args: argparse.Namespace) -> None:
    """Time each saver's SQL for one invocation's rows (see the module docs)."""
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        lg_rows, ps_rows = _recorded_rows(tmp, args.steps)
        shapes: dict[str, Callable[[sqlite3.Connection, int], None]] = {
            "SqliteSaver NORMAL: put + put_writes": lambda c, n: _sqlite_saver_sql(c, lg_rows, n),
            "PitstopSaver: one transaction per step": lambda c, n: _pitstop_sql(
                c, ps_rows, n, "inline"),
            "(writes as effect rows: before schema 8)": lambda c, n: _pitstop_sql(
                c, ps_rows, n, "grouped"),
            "(effect rows in a transaction of their own)": lambda c, n: _pitstop_sql(
                c, ps_rows, n, "apart"),
        }
        templates = {"SqliteSaver NORMAL: put + put_writes": os.path.join(tmp, "lg.db")}
        times: dict[str, list[float]] = {name: [] for name in shapes}
        pages: dict[str, float] = {}
        conns = {}
        paths = {}
        for i, name in enumerate(shapes):
            path = paths[name] = os.path.join(tmp, f"floor{i}.db")
            _copy_schema(templates.get(name, os.path.join(tmp, "ps.db")), path)
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conns[name] = conn
        for round_ in range(args.repeats + 1):
            for name, write in shapes.items():
                start = time.perf_counter()
                write(conns[name], round_)
                if round_:
                    times[name].append((time.perf_counter() - start) / args.steps * 1e6)
        for name, write in shapes.items():
            # One more round, untimed, into a WAL started afresh and never checkpointed:
            # its frames are that round's pages.
            conns[name].execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conns[name].execute("PRAGMA wal_autocheckpoint=0")
            write(conns[name], args.repeats + 1)
            per_commit, _, commits = wal_pages(paths[name])
            pages[name] = per_commit * commits / args.steps
        base = times["SqliteSaver NORMAL: put + put_writes"]
        print(f"{'SQL of one step (synchronous=NORMAL)':42} {'us/step':>8} {'vs SqliteSaver':>15} "
              f"{'WAL pages':>10}")
        print("-" * 78)
        for name, series in times.items():
            ratios = statistics.median(a / b for a, b in zip(series, base, strict=True))
            print(f"{name:42} {statistics.median(series):8.1f} {ratios:14.2f}x "
                  f"{pages[name]:10.2f}")
        print("\n(WAL pages: per step, in one more round written into an empty WAL)")
        for conn in conns.values():
            conn.close()


CHECKPOINT_COLUMNS = UNATTACHED_COLUMNS
"""pitstop_checkpoints' columns but the attached writes, in the order of the rows
``_recorded_rows`` reads (the writes come apart, as effect rows)."""


def _recorded_rows(tmp: str, steps: int) -> tuple[Any, Any]:
    """The rows one small invocation leaves in each saver's tables, in write order."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(os.path.join(tmp, "lg.db")) as saver:
        saver.setup()
        invoke(saver, steps, None, "sync")
        cur = saver.conn.cursor()
        checkpoints = cur.execute("SELECT * FROM checkpoints ORDER BY checkpoint_id").fetchall()
        writes = cur.execute("SELECT * FROM writes ORDER BY checkpoint_id, task_id, idx").fetchall()
    store = pitstop.open_store(f"sqlite:///{os.path.join(tmp, 'ps.db')}")
    try:
        invoke(PitstopSaver(store), steps, None, "sync")
        (run_id,) = [r.id for r in store.runs(limit=None)]
    finally:
        store.close()
    conn = sqlite3.connect(os.path.join(tmp, "ps.db"))
    try:
        ckpts = conn.execute(
            f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM pitstop_checkpoints "
            "WHERE run_id = ? ORDER BY id", (run_id,)
        ).fetchall()
        effects = conn.execute(
            "SELECT * FROM pitstop_effects WHERE run_id = ? ORDER BY key", (run_id,)
        ).fetchall()
        # The writes kept in checkpoint rows, as the effect rows they were before schema 8.
        for ckpt_id, framed, at in conn.execute(
            "SELECT id, writes, created_at FROM pitstop_checkpoints "
            "WHERE run_id = ? AND writes IS NOT NULL ORDER BY id", (run_id,)
        ):
            effects += [(run_id, key, ckpt_id, result, h, at)
                        for key, result, h, _ in read_frames(framed)]
    finally:
        conn.close()
    return (checkpoints, writes), (ckpts, effects)


def _copy_schema(source: str, target: str) -> None:
    """An empty database with ``source``'s tables and indexes."""
    src = sqlite3.connect(source)
    statements = [row[0] for row in src.execute(
        "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
        "ORDER BY type = 'index'"
    )]
    src.close()
    dst = sqlite3.connect(target)
    for statement in statements:
        dst.execute(statement)
    dst.commit()
    dst.close()


def _sqlite_saver_sql(conn: sqlite3.Connection, rows: Any, round_: int) -> None:
    checkpoints, writes = rows
    thread = f"floor-{round_}"
    by_checkpoint: dict[str, list[Any]] = {}
    for w in writes:
        by_checkpoint.setdefault(w[2], []).append((thread, *w[1:]))
    marks_w = ", ".join("?" * len(writes[0])) if writes else ""
    marks_c = ", ".join("?" * len(checkpoints[0]))
    for ckpt in checkpoints:
        step_writes = by_checkpoint.get(ckpt[2], [])
        if step_writes:
            conn.execute("BEGIN")
            conn.executemany(f"INSERT OR REPLACE INTO writes VALUES ({marks_w})", step_writes)
            conn.execute("COMMIT")
        conn.execute("BEGIN")
        conn.execute(f"INSERT OR REPLACE INTO checkpoints VALUES ({marks_c})", (thread, *ckpt[1:]))
        conn.execute("COMMIT")


def _pitstop_sql(conn: sqlite3.Connection, rows: Any, round_: int, writes: str) -> None:
    """PitstopSaver's statements for the recorded rows; ``writes``: how a step's pending
    writes are stored: ``inline`` (appended to their checkpoint's row in the next
    checkpoint's transaction, as the saver does), ``grouped`` (effect rows in that
    transaction, as it did before schema 8) or ``apart`` (effect rows in a transaction of
    their own)."""
    ckpts, effects = rows
    run_id = f"floor-{round_}"
    now = time.time()
    conn.execute(
        "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at) "
        "VALUES (?, 'langgraph', 'running', ?, ?)", (run_id, now, now),
    )
    by_checkpoint: dict[str, list[Any]] = {}
    for e in effects:
        by_checkpoint.setdefault(e[2], []).append((run_id, *e[1:]))
    head = None
    pending: list[Any] = []
    insert = (
        f"INSERT INTO pitstop_checkpoints ({', '.join(CHECKPOINT_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(CHECKPOINT_COLUMNS))})"
    )
    for c in ckpts:
        ckpt_id = f"{c[0]}-{round_}"
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        cur.execute(_MOVE_HEAD, (ckpt_id, c[3], now, 100, run_id, head, now))
        cur.execute(insert, (ckpt_id, run_id, head, *c[3:]))
        if pending and writes == "grouped":
            _insert_effects(cur, pending)
        elif pending and writes == "inline":
            packed = frame_records(((e[1], e[3], e[4]) for e in pending), replace=False)
            cur.execute(_APPEND, (packed, packed, run_id, head))
        cur.execute("COMMIT")
        pending = [(*e[:2], ckpt_id, *e[3:]) for e in by_checkpoint.get(c[0], [])]
        if pending and writes == "apart":
            _insert_effects(cur, pending)
        head = ckpt_id


_APPEND = APPEND_ATTACHED.format(blob="BLOB")


def _insert_effects(cur: sqlite3.Cursor, rows: list[Any]) -> None:
    marks = ", ".join(["(" + ", ".join("?" * len(rows[0])) + ")"] * len(rows))
    cur.execute(f"INSERT INTO pitstop_effects VALUES {marks} ON CONFLICT (run_id, key) DO NOTHING",
                [v for row in rows for v in row])


# -- WAL pages per commit ----------------------------------------------------------------------

_WAL_HEADER = 32
_FRAME_HEADER = 24


def wal_pages(path: str) -> tuple[float, Counter[str], int]:
    """Pages per commit in the WAL of the SQLite file ``path`` (its frames since SQLite last
    started it over: those carrying the header's salts), per commit by the table or index
    each page belongs to (``dbstat``; ``?`` for pages it does not name), and the commits."""
    with open(path + "-wal", "rb") as f:
        data = f.read()
    if len(data) < _WAL_HEADER:
        return 0.0, Counter(), 0
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    frames: list[int] = []
    commits = 0
    offset = _WAL_HEADER
    while offset + _FRAME_HEADER + page_size <= len(data):
        header = data[offset : offset + _FRAME_HEADER]
        if header[8:16] != salts:
            break  # a frame of an earlier pass over the file
        page, commit = struct.unpack(">II", header[:8])
        frames.append(page)
        commits += commit != 0
        offset += _FRAME_HEADER + page_size
    owner: dict[int, str] = {}
    conn = sqlite3.connect(path)
    try:
        owner = dict(conn.execute("SELECT pageno, name FROM dbstat"))
    except sqlite3.Error:
        pass  # SQLite built without dbstat: totals only
    finally:
        conn.close()
    if not commits:
        return 0.0, Counter(), 0
    by_tree = Counter(owner.get(page, "?") for page in frames)
    return len(frames) / commits, Counter({k: v / commits for k, v in by_tree.items()}), commits


def run_pages(args: argparse.Namespace) -> None:
    """Statements per step and WAL pages per commit of one small invocation (module docs)."""
    with tempfile.TemporaryDirectory(prefix="bench-pages-") as tmp:
        from langgraph.checkpoint.sqlite import SqliteSaver

        lg_path = os.path.join(tmp, "langgraph.db")
        ps_path = os.path.join(tmp, "pitstop.db")
        for name, path in (("SqliteSaver NORMAL", lg_path), ("PitstopSaver sqlite", ps_path)):
            statements: Counter[str] = Counter()

            def count(sql: str, statements: Counter[str] = statements) -> None:
                statements[" ".join(sql.split()[:3])] += 1

            if path == lg_path:
                with SqliteSaver.from_conn_string(path) as lg:
                    lg.setup()
                    lg.conn.execute("PRAGMA synchronous=NORMAL")
                    invoke(lg, args.steps, None, "sync")  # warm-up: a first thread
                    lg.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # count from here
                    lg.conn.set_trace_callback(count)
                    invoke(lg, args.steps, None, "sync")
                    lg.conn.set_trace_callback(None)
                    per_commit, by_tree, _ = wal_pages(path)
            else:
                store = pitstop.open_store(f"sqlite:///{path}")
                try:
                    saver = PitstopSaver(store)
                    invoke(saver, args.steps, None, "sync")
                    # The store's own connection (a private part: this is a diagnostic).
                    conn = cast(Any, store)._connection()
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    conn.set_trace_callback(count)
                    invoke(saver, args.steps, None, "sync")
                    saver.close()
                    conn.set_trace_callback(None)
                    per_commit, by_tree, _ = wal_pages(path)
                finally:
                    store.close()
            commits = sum(n for sql, n in statements.items() if sql.upper().startswith("COMMIT"))
            print(f"{name}: {sum(statements.values()) / args.steps:.2f} statements/step, "
                  f"{commits / args.steps:.2f} commits/step, {per_commit:.2f} WAL pages/commit "
                  f"({per_commit * commits / args.steps:.2f}/step)")
            for sql, n in statements.most_common(6):
                print(f"  {n / args.steps:6.2f}  {sql}")
            for tree, n in by_tree.most_common():
                if n >= 0.01:
                    print(f"  {n:6.2f}  pages/commit of {tree}")
            print()


def _mib(n: int) -> str:
    return f"{n / MiB:8.2f} MiB" if n >= 100 * 1024 else f"{n / 1024:8.1f} KiB"


def report(rows: list[Row]) -> None:
    by_key = {(r.database, r.saver, r.variant): r for r in rows}
    header = (
        f"{'database':9} {'variant':10} {'saver':26} {'ms/step':>8} {'in saver':>9} "
        f"{'stored':>13} {'(logical)':>13} {'speed':>7} {'in-saver':>9} {'bytes':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ratios = ""
        if r.baseline:
            base = by_key[(r.database, r.baseline, r.variant)]
            ratios = (
                f"{1 / ratio(r, base, 0):6.2f}x {1 / ratio(r, base, 1):8.2f}x "
                f"{base.bytes / r.bytes:7.1f}x"
            )
        logical = f"({_mib(r.logical).strip()})" if r.logical is not None else ""
        print(
            f"{r.database:9} {r.variant:10} {r.saver:26} {r.ms:8.3f} {r.saver_ms:9.3f} "
            f"{_mib(r.bytes):>13} {logical:>13} {ratios}"
        )


def check_targets(rows: list[Row]) -> None:
    """Print each #13 target with this run's figure and whether it is met."""
    by_key = {(r.database, r.saver, r.variant): r for r in rows}
    print("\ntargets (ours / theirs, median of per-round ratios):")
    for r in rows:
        if not r.baseline:
            continue
        base = by_key[(r.database, r.baseline, r.variant)]
        wall = ratio(r, base, 0)
        print(f"  {r.variant:10} {r.saver:26} wall {wall:5.2f}x of {r.baseline:20} "
              f"(<= 1.00: {'met' if wall <= 1 else 'NOT met'})")
        limit = TARGETS.get(r.database)
        if r.variant == "small" and limit is not None:
            inside = ratio(r, base, 1)
            print(f"  {r.variant:10} {r.saver:26} in saver {inside:5.2f}x of {r.baseline:16} "
                  f"(<= {limit}: {'met' if inside <= limit else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds per saver (default 5, or 9 with --replay)")
    parser.add_argument("--durability", choices=["sync", "async", "exit"], default="sync",
                        help="LangGraph's durability mode for every invocation")
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--variants", default="small,str 1MiB,list 1MiB")
    parser.add_argument("--replay", action="store_true",
                        help="replay one small invocation's put/put_writes calls, no LangGraph")
    parser.add_argument("--floor", action="store_true",
                        help="time each saver's SQL alone for one small invocation (SQLite)")
    parser.add_argument("--pages", action="store_true",
                        help="statements and WAL pages per step of one small invocation")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 9 if args.replay or args.floor else 5
    if args.pages:
        print(f"one {args.steps}-step invocation, SQLite {sqlite3.sqlite_version}\n")
        run_pages(args)
        return 0
    if args.floor:
        print(f"the SQL of one {args.steps}-step invocation, {args.repeats} rounds, "
              f"SQLite {sqlite3.sqlite_version}\n")
        run_floor(args)
        return 0
    savers: list[tuple[str, str, Factory, str | None]] = [
        ("memory", "InMemorySaver (no I/O)", memory_saver, None),
        ("sqlite", "floor: INSERT/COMMIT", lambda: floor_saver(False), "SqliteSaver NORMAL"),
        ("sqlite", "floor, keyed (thread, id)", lambda: floor_saver(True), "SqliteSaver NORMAL"),
        ("sqlite", "SqliteSaver", lambda: sqlite_saver(None), None),
        ("sqlite", "PitstopSaver sqlite full", lambda: pitstop_sqlite("full"), "SqliteSaver"),
        ("sqlite", "SqliteSaver NORMAL", lambda: sqlite_saver("NORMAL"), None),
        ("sqlite", "PitstopSaver sqlite", lambda: pitstop_sqlite("normal"), "SqliteSaver NORMAL"),
    ]
    if not args.no_pg:
        savers += [
            ("postgres", "PostgresSaver", postgres_saver, None),
            ("postgres", "PitstopSaver postgres", pitstop_postgres, "PostgresSaver"),
        ]
    if args.replay:
        print(
            f"replay of one {args.steps}-step invocation's saver calls, {args.repeats} rounds, "
            f"python {sys.version.split()[0]}\n"
        )
        run_replay(savers, args)
        return 0
    print(
        f"{args.steps} steps, median of {args.repeats}, LangGraph durability={args.durability}, "
        f"python {sys.version.split()[0]}\n"
    )
    data = payloads()
    variants = [v.strip() for v in args.variants.split(",")]
    rows = [row for variant in variants for row in measure(savers, variant, data[variant], args)]
    report(rows)
    check_targets(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
