"""A bounded soak on PostgreSQL: mixed workflows, LangGraph threads, training-style loops and
stream jobs, with a worker, a loop or a stream process killed (SIGKILL) every few seconds and
retention on.

    python bench/soak.py --minutes 30          # the default: half an hour
    python bench/soak.py --minutes 5 --json    # a short one, figures as JSON

Processes: one long-lived worker (never killed: its RSS is sampled), two workers killed at
random and restarted, loop processes (a ``pitstop.Checkpointer`` loop of 40 iterations,
killed too and restarted until they finish), two stream job processes (a count per user over
a Redis stream of 4 partitions, every fifth count emitted to a ``RedisStreamSink``; killed
and restarted like the workers) fed by the driver all along, and this driver, which queues
runs, runs LangGraph threads on the same store (a small StateGraph through ``PitstopSaver``), checks
every run as it completes and deletes finished runs older than 20 s (retention), as a
service keeping a bounded history would.

What it counts:

* lost: a run queued (or a loop started) that never completed by the end (after a drain);
* torn: a completed run, thread or loop whose state does not add up (steps missing, a
  message list of the wrong length, a loop's sum not its iterations'), or a checkpoint
  that does not load, or ``verify`` problems at the end;
* repeated: an effect whose function ran again after its result was recorded (the journal
  every process appends to), or a step whose effect ran in two step executions;
* the stream job: its state against the counts of what was produced, and the sink's
  duplicates (an output id twice) and gaps (an output expected and not there);
* the long-lived worker's RSS after warm-up (the first fifth) and at the end;
* the store's size (its tables and indexes, dead rows included until autovacuum reclaims
  them) sampled every 10 s: flat under retention (workflow runs: ``keep_last=2``, then
  deleted 20 s after they finish; threads and loops: deleted once checked);
* per relation, at each sample: every table's heap, indexes, TOAST and counted rows, every
  index's size (``relation_growth``: medians over the first and last fifth of the steady
  state), what each VACUUM left dead and the oldest transaction open then, and at the end
  each table's size after ``VACUUM FULL`` (its live rows alone), and how many times each
  index was rebuilt by pitstop's index upkeep (its oid changed). ``--samples FILE`` writes
  them as they are taken; ``--keep-schema`` leaves the store for inspection.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, TypedDict

HERE = Path(__file__).resolve().parent
# bench/langgraph.py would shadow the langgraph package: this directory off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "src"))

import pitstop  # noqa: E402


class GraphState(TypedDict):
    """A LangGraph thread's state: each node appends the length it saw."""

    log: Annotated[list[int], operator.add]


PG = os.environ.get("PITSTOP_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("PITSTOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
LOOP_ITERS = 40
STREAM_PARTITIONS = 4
EMIT_EVERY = 5
"""A user's count emits an output at every multiple of this."""


# -- the workflows (imported by the worker processes) -----------------------------------------


def workflows(journal: str) -> list[pitstop.Workflow]:
    mixed = pitstop.Workflow("soak-mixed", lease_ttl=3,
                             retention=pitstop.RetentionPolicy(keep_last=2))

    def note(line: str) -> None:
        with open(journal, "a") as f:
            f.write(line + "\n")

    @mixed.step
    def begin(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        key = ctx.idempotency_key("charge")
        ctx.effect("charge", lambda: note(f"call {key}"))
        note(f"recorded {key}")
        return {"messages": pitstop.Append([{"role": "user", "n": 0}]), "turn": 0}

    @mixed.step
    def talk(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        turn = state["turn"] + 1
        time.sleep(random.uniform(0.01, 0.08))
        update = {"messages": pitstop.Append([{"role": "ai", "n": turn, "text": "x" * 200}]),
                  "turn": turn}
        return pitstop.goto("talk", update) if turn < 8 else update

    @mixed.step
    def finish(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        key = ctx.idempotency_key("notify")
        ctx.effect("notify", lambda: note(f"call {key}"))
        note(f"recorded {key}")
        return {"done": True}

    return [mixed]


def worker_main(url: str, journal: str) -> None:
    with pitstop.open_store(url) as store:
        pitstop.Worker(store, workflows(journal), concurrency=3, poll_interval=0.2).run()


def stream_job(name: str) -> Any:
    from pitstop import stream

    job = stream.Job(name, source=stream.RedisStream(REDIS, name, partitions=STREAM_PARTITIONS),
                     sink=stream.RedisStreamSink(REDIS, f"{name}-out"),
                     every=200, seconds=1.0, lease_ttl=3.0)

    @job.handler
    def count(state: Any, record: Any, emit: Any) -> None:
        user = record.value["user"]
        state[user] = state.get(user, 0) + 1
        if state[user] % EMIT_EVERY == 0:
            emit(user, state[user])

    return job


def stream_main(url: str, name: str) -> None:
    with pitstop.open_store(url) as store:
        stream_job(name).run(store)


def loop_main(url: str, run_id: str) -> None:
    with pitstop.Checkpointer(url, run_id, retention=pitstop.RetentionPolicy(keep_last=2)) as ck:
        state = ck.restore({"i": 0, "sum": 0})
        while state["i"] < LOOP_ITERS:
            time.sleep(0.05)
            state = {"i": state["i"] + 1, "sum": state["sum"] + state["i"]}
            ck.save(state)


# -- the driver -------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def store_tables(schema: str) -> dict[str, dict[str, int]]:
    """Each table's size (with its indexes and TOAST), live and dead rows."""
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup "
            "FROM pg_stat_user_tables WHERE schemaname = %s ORDER BY 2 DESC",
            (schema,)).fetchall()
    return {name: {"bytes": size, "live": live, "dead": dead}
            for name, size, live, dead in rows}


def autovacuum_on() -> bool:
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return bool(row) and row[0] == "on"


def vacuum(schema: str) -> dict[str, Any]:
    """A plain VACUUM of the store's tables: what autovacuum does (deleted rows' space made
    reusable; nothing locked), for a server where it is off. Returns what it could not
    remove (dead rows some snapshot may still see: ``n_dead_tup`` right after) and the oldest
    transaction open in the database then (another session's snapshot holds those rows)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s", (schema,))]
        for table in tables:
            conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(schema, table)))
        row = conn.execute(
            "SELECT COALESCE(SUM(n_dead_tup), 0) FROM pg_stat_user_tables "
            "WHERE schemaname = %s", (schema,)).fetchone()
        oldest = conn.execute(
            "SELECT COALESCE(MAX(EXTRACT(EPOCH FROM now() - xact_start)), 0) "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()").fetchone()
    return {"dead_left": int(row[0]) if row else 0,
            "oldest_xact_s": round(float(oldest[0]), 1) if oldest else 0.0}


def store_bytes(schema: str) -> int:
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
            "AND c.relkind IN ('r', 't', 'm')", (schema,)).fetchone()
    return int(row[0]) if row else 0


def relation_sizes(schema: str) -> dict[str, dict[str, int]]:
    """Per table: its heap, its indexes, its TOAST (with the TOAST index) and its live rows
    (counted, not estimated); per index: its own size. What names the relation that grows."""
    import psycopg
    from psycopg import sql

    out: dict[str, dict[str, int]] = {}
    with psycopg.connect(PG, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT c.oid, c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), "
            "pg_indexes_size(c.oid), "
            "COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY c.relname", (schema,)).fetchall()
        for _, name, total, heap, indexes, toast in tables:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(schema, name))).fetchone()
            out[name] = {"total": total, "heap": heap, "indexes": indexes, "toast": toast,
                         "rows": int(row[0]) if row else 0}
        for name, size, oid in conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid), c.oid::int FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'i' ORDER BY c.relname", (schema,)):
            # the oid changes when pitstop rebuilds the index (REINDEX CONCURRENTLY)
            out[f"index {name}"] = {"total": size, "oid": oid}
    return out


def index_rebuilds(samples: list[tuple[float, dict[str, dict[str, int]]]]) -> dict[str, int]:
    """Per index: how many times its oid changed between two samples (a rebuild by
    pitstop's index upkeep; two within one sampling interval count once)."""
    seen: dict[str, int] = {}
    rebuilds: dict[str, int] = defaultdict(int)
    for _, rels in samples:
        for name, rel in rels.items():
            oid = rel.get("oid")
            if oid is None:
                continue
            if name in seen and seen[name] != oid:
                rebuilds[name.removeprefix("index ")] += 1
            seen[name] = oid
    return dict(rebuilds)


def relation_growth(samples: list[tuple[float, dict[str, dict[str, int]]]],
                    start: float) -> dict[str, dict[str, Any]]:
    """Each relation's median over the first and the last fifth of the steady state (from
    ``start`` seconds on): which one grows, by how much, and whether its rows grew too."""
    import statistics

    steady = [rels for t, rels in samples if t >= start]
    if len(steady) < 2:
        return {}
    fifth = max(1, len(steady) // 5)
    first, last = steady[:fifth], steady[-fifth:]
    growth: dict[str, dict[str, Any]] = {}
    for name in sorted(set().union(*steady)):
        entry: dict[str, Any] = {}
        for field in ("total", "heap", "indexes", "toast", "rows"):
            a = [r[name][field] for r in first if field in r.get(name, {})]
            b = [r[name][field] for r in last if field in r.get(name, {})]
            if a and b:
                entry[field] = [statistics.median(a), statistics.median(b)]
        growth[name] = entry
    return growth


def rows_of_deleted_runs(schema: str) -> dict[str, int]:
    """Rows that name a run no longer in ``pitstop_runs`` (what a deletion left behind), and
    value rows nothing references (no reference row, no alias, no live owner). All 0 when
    retention deletes everything a run had."""
    import psycopg
    from psycopg import sql

    gone = ("NOT EXISTS (SELECT 1 FROM {s}.pitstop_runs r WHERE r.run_id = t.run_id)")
    checks = {table: f"SELECT count(*) FROM {{s}}.{table} t WHERE " + gone
              for table in ("pitstop_checkpoints", "pitstop_effects", "pitstop_inputs",
                            "pitstop_blob_refs")}
    checks["pitstop_blobs owned by a deleted run"] = (
        "SELECT count(*) FROM {s}.pitstop_blobs t WHERE t.run_id IS NOT NULL AND " + gone)
    checks["pitstop_blobs unreferenced"] = (
        "SELECT count(*) FROM {s}.pitstop_blobs t WHERE (t.run_id IS NULL OR " + gone + ") "
        "AND NOT EXISTS (SELECT 1 FROM {s}.pitstop_blob_refs f WHERE f.hash = t.hash) "
        "AND NOT EXISTS (SELECT 1 FROM {s}.pitstop_blobs a WHERE a.alias = t.hash)")
    out: dict[str, int] = {}
    with psycopg.connect(PG) as conn:  # one snapshot for every count
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for name, query in checks.items():
            row = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema))).fetchone()
            out[name] = int(row[0]) if row else 0
    return out


def compacted(schema: str) -> dict[str, int]:
    """Each table's size (with indexes and TOAST) after ``VACUUM FULL`` rewrote it: what its
    live rows take, against which the size before shows the free space kept for reuse."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s", (schema,))]
        for table in tables:
            conn.execute(sql.SQL("VACUUM FULL {}").format(sql.Identifier(schema, table)))
    return {name: rel["total"] for name, rel in relation_sizes(schema).items()
            if not name.startswith("index ")}


def stream_checkpoint_rows(schema: str, job: str) -> int:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM {} WHERE run_id LIKE %s").format(
                sql.Identifier(schema, "pitstop_checkpoints")), (f"{job}/%",)).fetchone()
    return int(row[0]) if row else 0


class Soak:
    def __init__(self, minutes: float, kill_every: float, vacuum_every: float | None,
                 streams: bool = True, keep_schema: bool = False,
                 samples_to: Path | None = None) -> None:
        self.streams = streams
        self.keep_schema = keep_schema
        self.samples_to = samples_to
        self.relations: list[tuple[float, dict[str, dict[str, int]]]] = []
        self.vacuums: list[tuple[float, dict[str, Any]]] = []
        """After each VACUUM: the dead rows it left, the oldest transaction open then."""
        self.seconds = minutes * 60
        self.autovacuum = autovacuum_on()
        # pitstop leaves deleted rows to PostgreSQL's autovacuum (on by default); where the
        # server has it off, the soak vacuums as it would, or the size measures the setting.
        self.vacuum_every = vacuum_every if vacuum_every is not None else (
            None if self.autovacuum else 30.0)
        self.kill_every = kill_every
        self.schema = f"soak_{uuid.uuid4().hex[:8]}"
        sep = "&" if "?" in PG else "?"
        self.url = f"{PG}{sep}schema={self.schema}"
        self.place = Path(f"/tmp/pitstop-soak-{self.schema}")
        self.place.mkdir()
        self.journal = str(self.place / "journal")
        Path(self.journal).touch()
        self.store = pitstop.open_store(self.url)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.loops: dict[str, subprocess.Popen[bytes] | None] = {}
        self.queued: set[str] = set()
        self.checked: set[str] = set()
        self.threads_done = 0
        self.threads_started = 0
        self.torn: list[str] = []
        self.kills = 0
        self.stream_kills = 0
        self.rss: list[tuple[float, int]] = []
        self.sizes: list[tuple[float, int]] = []
        self.stream_rows: list[tuple[float, int]] = []
        """The stream job's checkpoint rows (its partitions' base and deltas since) over time."""
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.stream_name = f"soak{uuid.uuid4().hex[:8]}"
        self.produced: dict[str, int] = defaultdict(int)
        self.last_ids: dict[int, str] = {}
        import redis

        self.redis = redis.Redis.from_url(REDIS)

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
        return subprocess.Popen([sys.executable, __file__, *args], env=env,
                                stdout=subprocess.DEVNULL,
                                stderr=open(self.place / f"{name}.log", "ab"))

    def start_workers(self) -> None:
        for name in ("steady", "w2", "w3"):
            self.procs[name] = self.spawn(name, "worker", self.url, self.journal)
        for name in ("s1", "s2") if self.streams else ():
            self.procs[name] = self.spawn_stream(name)

    def spawn_stream(self, name: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, "stream", self.url, self.stream_name)

    def produce(self, count: int) -> None:
        """``count`` events to the stream job's partitions (users at random)."""
        from pitstop.stream import partition_of

        users = [f"user{random.randrange(500)}" for _ in range(count)]
        with self.redis.pipeline(transaction=False) as pipe:
            for user in users:
                pipe.xadd(f"{self.stream_name}:{partition_of(user, STREAM_PARTITIONS)}",
                          {"user": user, "key": user})
            ids = pipe.execute()
        for user, entry in zip(users, ids, strict=True):
            self.produced[user] += 1
            self.last_ids[partition_of(user, STREAM_PARTITIONS)] = entry.decode()

    def stream_caught_up(self) -> bool:
        for partition, last in self.last_ids.items():
            head = self.store.latest(f"{self.stream_name}/{partition}")
            if head is None or head.state.get("position") != last:
                return False
        return True

    def stream_result(self) -> dict[str, Any]:
        """The stream job's state against what was produced; the sink's duplicates and gaps
        (after one more uninterrupted run delivers any outbox left)."""
        from collections import Counter

        job = stream_job(self.stream_name)
        job.run(self.store, idle_exit=0.5)
        state = job.state(self.store)
        found = self.redis.xrange(f"{self.stream_name}-out")
        ids = Counter(fields[b"id"] for _, fields in found)
        pairs = Counter((fields[b"key"].decode(), json.loads(fields[b"value"]))
                        for _, fields in found)
        wanted = Counter((user, n) for user, total in self.produced.items()
                         for n in range(EMIT_EVERY, total + 1, EMIT_EVERY))
        names = [f"{self.stream_name}:{p}" for p in range(STREAM_PARTITIONS)]
        names += [f"{self.stream_name}-out"]
        names += [k.decode() for k in self.redis.scan_iter(f"{self.stream_name}-out:delivered:*")]
        self.redis.delete(*names)
        return {
            "stream_events": sum(self.produced.values()),
            "stream_state_exact": state == dict(self.produced),
            "stream_outputs": len(found),
            "stream_duplicates": sum(n - 1 for n in ids.values() if n > 1),
            "stream_gaps": sum((wanted - pairs).values()),
            "stream_unexpected": sum((pairs - wanted).values()),
        }

    def kill_one(self) -> None:
        victims = ["w2", "w3", *(["s1", "s2"] if self.streams else []),
                   *(r for r, p in self.loops.items() if p)]
        name = random.choice(victims)
        proc = self.procs.get(name) if name in self.procs else self.loops[name]
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.kills += 1
        if name in ("s1", "s2"):
            self.stream_kills += 1
            self.procs[name] = self.spawn_stream(name)
        elif name in self.procs:
            self.procs[name] = self.spawn(name, "worker", self.url, self.journal)
        else:
            self.loops[name] = self.spawn(name, "loop", self.url, name)

    def enqueue(self) -> None:
        wf = workflows(self.journal)[0]
        run_id = f"m-{uuid.uuid4().hex[:10]}"
        wf.enqueue(self.store, {"messages": []}, run_id=run_id)
        self.queued.add(run_id)

    def start_loop(self) -> None:
        run_id = f"loop-{uuid.uuid4().hex[:8]}"
        self.loops[run_id] = self.spawn(run_id, "loop", self.url, run_id)

    def tend_loops(self) -> None:
        for run_id, proc in list(self.loops.items()):
            if proc is None or proc.poll() is None:
                continue
            head = self.store.latest(run_id)
            if head is not None and head.state["i"] >= LOOP_ITERS:
                if head.state["sum"] != sum(range(LOOP_ITERS)):
                    self.torn.append(f"{run_id}: loop sum {head.state['sum']}")
                self.loops[run_id] = None
                self.store.delete_run(run_id)  # retention: a finished loop goes
            else:  # it died on its own (or was killed between our checks): go on
                self.loops[run_id] = self.spawn(run_id, "loop", self.url, run_id)

    def check_completed(self) -> None:
        for run in self.store.runs(status="completed", limit=500):
            if run.id in self.checked or not run.id.startswith("m-"):
                continue
            try:
                head = self.store.latest(run.id)
            except pitstop.PitstopError as exc:
                self.torn.append(f"{run.id}: {exc}")
                self.checked.add(run.id)
                continue
            state = head.state if head is not None else {}
            if not state.get("done") or state.get("turn") != 8 or [
                    m["n"] for m in state.get("messages", [])] != list(range(9)):
                self.torn.append(f"{run.id}: state {str(state)[:200]}")
            self.checked.add(run.id)

    def langgraph_threads(self) -> None:
        from langgraph.graph import END, START, StateGraph

        from pitstop.integrations.langgraph import PitstopSaver

        graph = StateGraph(GraphState)
        graph.add_node("a", lambda s: {"log": [len(s["log"])]})
        graph.add_node("b", lambda s: {"log": [len(s["log"])]})
        graph.add_edge(START, "a")
        graph.add_edge("a", "b")
        graph.add_edge("b", END)
        saver = PitstopSaver(self.store)
        app = graph.compile(checkpointer=saver)
        while not self.stop.is_set():
            thread = f"t-{uuid.uuid4().hex[:8]}"
            config = {"configurable": {"thread_id": thread}}
            with self.lock:
                self.threads_started += 1
            try:
                for _ in range(5):
                    app.invoke({"log": []}, config)
                log = app.get_state(config).values["log"]
                if log != list(range(10)):
                    self.torn.append(f"thread {thread}: log {log}")
                with self.lock:
                    self.threads_done += 1
                saver.delete_thread(thread)  # retention: a finished conversation goes
            except pitstop.PitstopError as exc:
                self.torn.append(f"thread {thread}: {exc}")
            time.sleep(0.2)

    def repeated(self) -> list[str]:
        kinds: dict[str, list[str]] = defaultdict(list)
        for line in Path(self.journal).read_text().splitlines():
            kind, _, key = line.partition(" ")
            kinds[key].append(kind)
        bad = []
        for key, seen in kinds.items():
            first = seen.index("recorded") if "recorded" in seen else len(seen)
            if "call" in seen[first:]:
                bad.append(key)
        return bad

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.start_workers()
        graphs = threading.Thread(target=self.langgraph_threads, daemon=True)
        graphs.start()
        next_kill = started + self.kill_every
        next_sample = started
        next_prune = started + 20
        next_vacuum = started + (self.vacuum_every or 0)
        end = started + self.seconds
        while time.monotonic() < end:
            now = time.monotonic()
            if len(self.queued) - len(self.checked) < 30:
                for _ in range(3):
                    self.enqueue()
            if sum(1 for p in self.loops.values() if p is not None) < 2:
                self.start_loop()
            if self.streams:
                self.produce(20)  # ~100 events a second
            if now >= next_kill:
                self.kill_one()
                next_kill = now + random.uniform(0.5, 1.5) * self.kill_every
            if now >= next_sample:
                self.rss.append((now - started, rss_kib(self.procs["steady"].pid)))
                self.sizes.append((now - started, store_bytes(self.schema)))
                self.stream_rows.append((now - started, stream_checkpoint_rows(
                    self.schema, self.stream_name)))
                self.relations.append((now - started, relation_sizes(self.schema)))
                if self.samples_to is not None:  # as it goes: a cut-short run still tells
                    self.samples_to.write_text(json.dumps(
                        {"schema": self.schema, "sizes": self.sizes,
                         "relations": self.relations, "vacuums": self.vacuums}))
                next_sample = now + 10
            if self.vacuum_every and now >= next_vacuum:
                self.vacuums.append((now - started, vacuum(self.schema)))
                next_vacuum = now + self.vacuum_every
            if now >= next_prune:
                self.check_completed()
                self.store.prune(pitstop.RetentionPolicy(finished_older_than=20))
                next_prune = now + 10
            self.tend_loops()
            time.sleep(0.2)
        self.stop.set()
        graphs.join(timeout=60)
        drain_until = time.monotonic() + 90  # no more kills: everything queued finishes
        while time.monotonic() < drain_until:
            self.check_completed()
            self.tend_loops()
            if self.checked >= self.queued and not any(self.loops.values()) \
                    and (not self.streams or self.stream_caught_up()):
                break
            time.sleep(0.5)
        self.check_completed()
        tables = store_tables(self.schema)
        problems = self.store.verify()
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(timeout=30)
        streamed = self.stream_result() if self.streams else {}
        warm = [kib for t, kib in self.rss if t >= self.seconds / 5] or [0]
        sizes = [size for _, size in self.sizes]
        third = max(1, len(sizes) // 3)
        result = {
            "minutes": self.seconds / 60,
            "server_autovacuum": self.autovacuum,
            "vacuum_every_s": self.vacuum_every,
            "kills": self.kills,
            "stream_kills": self.stream_kills,
            "runs_queued": len(self.queued),
            "runs_completed_and_checked": len(self.checked & self.queued),
            "langgraph_threads": self.threads_done,
            "loops": len(self.loops),
            "loops_unfinished": sum(1 for p in self.loops.values() if p is not None),
            "lost": len(self.queued - self.checked)
            + sum(1 for p in self.loops.values() if p is not None)
            + (self.threads_started - self.threads_done - len(
                [t for t in self.torn if t.startswith("thread")])),
            "torn": len(self.torn) + len(problems),
            "torn_examples": self.torn[:5] + [str(p) for p in problems[:5]],
            "repeated": len(self.repeated()),
            **streamed,
            "steady_rss_kib_after_warmup": warm[0],
            "steady_rss_kib_end": warm[-1],
            "steady_rss_growth": round(warm[-1] / warm[0] - 1, 3) if warm[0] else None,
            "store_bytes_first_third_max": max(sizes[:third]) if sizes else 0,
            "store_bytes_last_third_max": max(sizes[-third:]) if sizes else 0,
            "store_bytes_end": sizes[-1] if sizes else 0,
            "store_bytes_samples": sizes,
            "stream_checkpoint_rows_samples": [rows for _, rows in self.stream_rows],
            "steady_rss_kib_samples": [kib for _, kib in self.rss],
            "tables_at_end": tables,
            "relations_at_end": relation_sizes(self.schema),
            "rows_of_deleted_runs": rows_of_deleted_runs(self.schema),
            # last, the workers stopped: VACUUM FULL locks each table while it rewrites it
            "tables_after_vacuum_full": compacted(self.schema),
            # steady state: after the first fifth (warm-up), as for the RSS
            "relation_growth": relation_growth(self.relations, self.seconds / 5),
            "index_rebuilds": index_rebuilds(self.relations),
            "vacuums": self.vacuums,
            "schema": self.schema,
        }
        self.store.close()
        if not self.keep_schema:
            import psycopg

            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "stream":
        stream_main(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "loop":
        loop_main(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=4.0,
                        help="seconds between kills, on average")
    parser.add_argument("--vacuum-every", type=float, default=None, metavar="SECONDS",
                        help="VACUUM the store's tables this often (default: every 30 s if "
                             "the server's autovacuum is off, else never)")
    parser.add_argument("--no-streams", action="store_true",
                        help="without the stream job (a baseline for the store's size)")
    parser.add_argument("--keep-schema", action="store_true",
                        help="leave the store's schema in place at the end (to inspect it)")
    parser.add_argument("--samples", type=Path, default=None, metavar="FILE",
                        help="write the per-relation samples to FILE as they are taken")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    result = Soak(options.minutes, options.kill_every, options.vacuum_every,
                  streams=not options.no_streams, keep_schema=options.keep_schema,
                  samples_to=options.samples).run()
    print(json.dumps(result, indent=None if options.json else 2))


if __name__ == "__main__":
    main()
