"""What only a shared PostgreSQL server adds to the store contract, tested on a real server.

The contract suite already runs every store behaviour against PostgreSQL. These tests cover
what SQLite cannot show: several processes migrating, saving and collecting garbage at the
same moment, connection options, servers that are down or silent, connections that die under
the store, and passwords kept out of every message. Each test uses its own schema.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import pitstop
from pitstop import RunStatus, StoreError, StoreSchemaError

psycopg = pytest.importorskip("psycopg")
postgres = pytest.importorskip("pitstop.store.backends.postgres")

from conftest import PG_URL, drop_pg_schema, pg_schema_url, run_python  # noqa: E402
from oldstore import store_at, write_old  # noqa: E402
from pitstop.store.engine import schema as store_schema  # noqa: E402

PostgresStore = postgres.PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_pg_schema(name)


@pytest.fixture
def url(schema: str) -> str:
    return pg_schema_url(schema)


def _query(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Look at the server directly, not through the store under test."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _show(store: Any, setting: str) -> str:
    """A setting as the store's own pooled connections see it."""
    return str(store._tx(lambda tx: tx.one(f"SHOW {setting}"))[0])


def _run_at_once(jobs: list[tuple[str, list[str]]], delay: float = 1.5) -> list[str]:
    """Run each ``(code, args)`` in its own interpreter, all starting their work at the same
    instant (passed as the last argument, so imports are done by then); their stdout."""
    start = str(time.time() + delay)
    with ThreadPoolExecutor(len(jobs)) as pool:
        done = list(pool.map(lambda job: run_python(job[0], *job[1], start), jobs))
    for proc in done:
        assert proc.returncode == 0, proc.stderr
    return [proc.stdout for proc in done]


# -- schema: concurrent creation and upgrades ---------------------------------------------------

OPEN = """
import sys, time
import pitstop
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
with pitstop.open_store(sys.argv[1]) as store:
    print(store.schema_version())
"""


@pytest.mark.slow
def test_processes_opening_a_new_schema_at_once_all_succeed(url: str, schema: str) -> None:
    outputs = _run_at_once([(OPEN, [url])] * 4)
    assert [int(out) for out in outputs] == [store_schema.LATEST_SCHEMA] * 4
    applied = _query(
        f'SELECT version, COUNT(*) FROM "{schema}".pitstop_schema GROUP BY version ORDER BY 1'
    )
    assert applied == [(version, 1) for version, _, _ in store_schema.MIGRATIONS]


def test_a_store_at_the_oldest_schema_is_upgraded_on_open(url: str, schema: str) -> None:
    oldest = store_schema.MIGRATIONS[0][0]
    # A store made by a release that knew only the first migration.
    first, second = write_old(url, oldest, lambda old: (
        old.save("r", {"doc": "x" * 10_000, "n": 1}, workflow="wf"),
        old.save("r", {"doc": "x" * 10_000, "n": 2}),
    ))
    with store_at(url, oldest) as old:
        # That release's INSERT (this one reads columns the first schema lacks).
        old._tx(lambda tx: tx.run(
            "INSERT INTO pitstop_runs (run_id, status, created_at, updated_at, metadata) "
            "VALUES (?, ?, ?, ?, ?)",
            ("queued", RunStatus.QUEUED.value, time.time(), time.time(), '{"k": "v"}'),
        ), write=True)
    if oldest < store_schema.LATEST_SCHEMA:
        with pytest.raises(StoreSchemaError, match="migrate"):
            PostgresStore(url, auto_migrate=False)
    with PostgresStore(url) as new:
        assert new.schema_version() == store_schema.LATEST_SCHEMA
        assert new.get(first.id).state == {"doc": "x" * 10_000, "n": 1}
        assert new.latest("r").id == second.id  # type: ignore[union-attr]
        assert new.get_run("queued").metadata == {"k": "v"}
        assert new.verify() == []
        new.save("r", {"doc": "y", "n": 3})
    applied = _query(f'SELECT version FROM "{schema}".pitstop_schema ORDER BY 1')
    assert [v for (v,) in applied] == [version for version, _, _ in store_schema.MIGRATIONS]


def test_migrations_can_run_inside_a_transaction() -> None:
    """Each migration runs in one transaction, under the migration lock; PostgreSQL refuses
    some statements there (CREATE INDEX CONCURRENTLY), so no migration may use them."""
    for version, _, statements in store_schema.MIGRATIONS:
        for statement in statements:
            assert "CONCURRENTLY" not in statement.upper(), version


def test_schema_is_created_and_isolated(url: str, schema: str) -> None:
    with PostgresStore(url) as store:
        assert store.schema == schema
        store.save("r", {"a": 1})
        assert _show(store, "search_path") == schema
        tables = _query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        )
        assert {"pitstop_runs", "pitstop_checkpoints", "pitstop_blobs"} <= {t for (t,) in tables}
        assert (store.stats().file_bytes or 0) > 0


def test_any_schema_name_is_quoted_never_interpolated() -> None:
    name = f'Odd "Name"; DROP {uuid.uuid4().hex[:6]}'
    try:
        with PostgresStore(PG_URL, schema=name) as store:
            first = store.save("r", {"a": 1})
        with PostgresStore(PG_URL, schema=name) as store:
            assert store.get(first.id).state == {"a": 1}
            assert store.schema_version() == store_schema.LATEST_SCHEMA
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(name)
                )
            )


def test_without_a_schema_option_the_current_schema_is_used(schema: str) -> None:
    _query(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    # libpq's own options parameter passes through: the server's search_path decides.
    with PostgresStore(f"{PG_URL}{sep}options=-csearch_path%3D{schema}") as store:
        assert store.schema == schema
        store.save("r", {"a": 1})
    assert _query(f'SELECT COUNT(*) FROM "{schema}".pitstop_runs') == [(1,)]


# -- connection options ----------------------------------------------------------------------


def test_url_options_are_applied_and_keywords_override_them(url: str) -> None:
    with PostgresStore(url + "&statement_timeout=2&application_name=from-url&pool_max=3") as s:
        assert _show(s, "statement_timeout") == "2s"
        assert _show(s, "application_name") == "from-url"
        assert s.pool_max == 3
        assert "statement_timeout" in s.url  # the URL is kept as given (password aside)
    with PostgresStore(
        url + "&statement_timeout=2", statement_timeout=0.25, application_name="kw"
    ) as s:
        assert _show(s, "statement_timeout") == "250ms"
        assert _show(s, "application_name") == "kw"
        started = time.monotonic()
        with pytest.raises(StoreError, match="statement timeout"):
            s._tx(lambda tx: tx.one("SELECT pg_sleep(5)"))
        assert time.monotonic() - started < 3


def test_durability_maps_to_synchronous_commit(url: str) -> None:
    with PostgresStore(url) as normal:
        assert normal.durability == "normal"
        assert _show(normal, "synchronous_commit") == "off"
    with PostgresStore(url + "&durability=full") as full:
        assert _show(full, "synchronous_commit") == "on"
        # One commit may ask for less (or, on a "normal" store, more) than the default.
        assert full.save("r", {"a": 1}, durability="normal").state == {"a": 1}


def test_bad_options_are_rejected(url: str) -> None:
    with pytest.raises(pitstop.UnsupportedStoreError, match="pool_max"):
        PostgresStore(url + "&pool_max=lots")
    with pytest.raises(pitstop.UnsupportedStoreError, match="pool_min"):
        PostgresStore(url, pool_min=5, pool_max=2)
    with pytest.raises(StoreError, match="no_such_libpq_option"):
        PostgresStore(url + "&no_such_libpq_option=1")


# -- unreachable servers and lost connections -------------------------------------------------


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or "postgres"
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def test_a_down_server_fails_fast_with_one_line_naming_it() -> None:
    secret = "hunter2-Secret"
    bad = f"postgresql://app:{secret}@127.0.0.1:1/appdb?schema=s"
    for open_ in (PostgresStore, pitstop.open_store):
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            open_(bad)
        assert time.monotonic() - started < 5
        message = str(info.value)
        assert "127.0.0.1:1" in message
        assert "appdb" in message
        assert "unreachable" in message
        assert secret not in message
        assert "app:***@" in message
        assert "\n" not in message
        assert info.value.__cause__ is None  # no psycopg traceback chained to it
        assert info.value.__suppress_context__


@pytest.mark.slow
def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:  # accepts TCP connections, never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreError, match="unreachable"):
            PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/test", connect_timeout=2)
        assert time.monotonic() - started < 6


class _Proxy:
    """A TCP relay to the real server that can cut every connection or stop listening:
    a server restart and a server that went down, seen from the client."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.sockets.clear()

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() and refuses new connections
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.cut()


@pytest.fixture
def proxied(schema: str) -> Iterator[tuple[_Proxy, str]]:
    parts = urlsplit(PG_URL)
    proxy = _Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = parts.netloc.rpartition("@")
    via = urlunsplit(
        parts._replace(netloc=f"{netloc[0]}{netloc[1]}127.0.0.1:{proxy.port}")
    )
    sep = "&" if "?" in via else "?"
    yield proxy, f"{via}{sep}schema={schema}&connect_timeout=2"
    proxy.stop()


@pytest.mark.slow
def test_lost_connections_are_replaced_and_the_work_retried(
    proxied: tuple[_Proxy, str],
) -> None:
    proxy, url = proxied
    with PostgresStore(url, pool_min=2) as store:
        first = store.save("r", {"n": 1})
        proxy.cut()  # every pooled connection dies, as in a server restart
        assert store.latest("r").id == first.id  # type: ignore[union-attr]  # a read
        proxy.cut()
        second = store.save("r", {"n": 2})  # a write, retried on a fresh connection
        assert [c.id for c in store.history("r")] == [second.id, first.id]  # written once


@pytest.mark.slow
def test_a_server_going_down_under_an_open_store_fails_within_connect_timeout(
    proxied: tuple[_Proxy, str],
) -> None:
    proxy, url = proxied
    with PostgresStore(url) as store:
        store.save("r", {"n": 1})
        proxy.stop()
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            store.save("r", {"n": 2})
        assert time.monotonic() - started < 6
        message = str(info.value)
        assert f"127.0.0.1:{proxy.port}" in message
        assert "unreachable" in message
        assert "\n" not in message


# -- connections kept between statements ----------------------------------------------------


def _backend_pid(store: Any) -> int:
    return int(store._tx(lambda tx: tx.one("SELECT pg_backend_pid()"))[0])


def test_steps_keep_their_connection_and_a_dead_one_is_replaced(url: str) -> None:
    with PostgresStore(url) as store:
        first = store.save("r", {"n": 1})
        pid = _backend_pid(store)
        assert _backend_pid(store) == pid  # kept, not handed back to the pool
        _query("SELECT pg_terminate_backend(%s)", (pid,))
        # The kept connection died under the store: the step is retried on a new one and
        # written once, as with a pooled connection.
        second = store.save("r", {"n": 2})
        third = store.save("r", {"n": 3})
        assert _backend_pid(store) != pid
        assert [c.id for c in store.history("r")] == [third.id, second.id, first.id]


def test_kept_connections_never_starve_another_thread(url: str) -> None:
    # Two connections at most, four threads saving at once: a connection is kept out of
    # the pool only while the pool has another to give, so a thread waiting in the pool is
    # never left waiting out its timeout while a connection idles here.
    with PostgresStore(url, pool_max=2, connect_timeout=2, busy_timeout=2) as store:
        def steps(who: int) -> int:
            for n in range(40):
                store.save(f"r{who}", {"n": n})
            return who

        with ThreadPoolExecutor(4) as threads:
            assert sorted(threads.map(steps, range(4))) == [0, 1, 2, 3]
        assert len(store._kept) <= 1
        assert all(len(store.history(f"r{who}")) == 40 for who in range(4))


def test_a_forked_child_never_uses_the_parents_kept_connection(url: str) -> None:
    with PostgresStore(url) as store:
        store.save("parent", {"n": 1})
        parents = _backend_pid(store)
        assert store._kept  # the parent's connection, kept for its next statement
        with warnings.catch_warnings():  # 3.12+ warns of fork in a threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child opens a pool of its own
            ok = False
            try:
                # (A shared socket breaks only when both processes use it at once: the
                # child asks which server process answers it.)
                ok = store.save("child", {"n": 1}).run_id == "child" \
                    and _backend_pid(store) != parents
            finally:
                os._exit(0 if ok else 1)
        deadline = time.monotonic() + 30
        while not (done := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child's save never finished")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(done[1]) == 0
        # The parent's kept connection still speaks the protocol where it left off.
        assert store.save("parent", {"n": 2}).state == {"n": 2}
        assert [c.step for c in store.history("parent")] == [1, 0]
        assert store.latest("child").state == {"n": 1}  # type: ignore[union-attr]


def test_waiting_workers_wake_when_another_connection_queues_work(url: str) -> None:
    with PostgresStore(url) as worker, PostgresStore(url) as client:
        started = time.monotonic()
        # nothing to say: waits its timeout out (and now listens), and says it was not woken
        assert worker.wait_for_work(0.2) is False
        assert time.monotonic() - started >= 0.15
        woke = threading.Event()
        answers: list[bool] = []
        waiter = threading.Thread(
            target=lambda: (answers.append(worker.wait_for_work(10)), woke.set()))
        waiter.start()
        time.sleep(0.2)
        started = time.monotonic()
        client.create_run("q", workflow="wf", status=RunStatus.QUEUED)
        assert woke.wait(5)
        assert time.monotonic() - started < 2
        waiter.join()
        assert answers == [True]  # the worker claims at once, not after its poll interval


# -- secrets ---------------------------------------------------------------------------------


def test_passwords_never_appear_in_urls_reprs_or_errors(url: str) -> None:
    secret = urlsplit(PG_URL).password or "hunter2-Secret"  # trust auth ignores a password
    with PostgresStore(_with_password(url, secret)) as store:
        for text in (store.url, repr(store)):
            assert secret not in text
            assert ":***@" in text
        with pytest.raises(StoreError) as info:
            store._tx(lambda tx: tx.one("SELECT * FROM no_such_table"))
        assert secret not in str(info.value)
        assert "no_such_table" in str(info.value)


# -- concurrency across processes --------------------------------------------------------------

CONTEND = """
import json, sys, time
import pitstop
from pitstop import ConflictError
store = pitstop.open_store(sys.argv[1])
me, base = sys.argv[2], sys.argv[3]
time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
out = {}
def attempt(key, **options):
    try:
        store.save(key, {"who": me}, **options)
        out[key] = "won"
    except ConflictError:
        out[key] = "lost"
attempt("shared", parent_id=base, expected_head=base)
for k in range(20):
    attempt(f"new-{k}", expected_head=None)  # both create the run: one insert loses
store.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_conditional_saves_from_two_processes_exactly_one_wins(url: str) -> None:
    with PostgresStore(url) as store:
        base = store.save("shared", {"who": "parent"})
        jobs = [(CONTEND, [url, who, base.id]) for who in ("a", "b")]
        a, b = (json.loads(out) for out in _run_at_once(jobs))
        assert a.keys() == b.keys()
        assert len(a) == 21
        for key in a:
            assert sorted([a[key], b[key]]) == ["lost", "won"], key
            winner = "a" if a[key] == "won" else "b"
            assert store.latest(key).state == {"who": winner}  # type: ignore[union-attr]
        assert len(store.history("shared")) == 2
        assert all(len(store.history(f"new-{k}")) == 1 for k in range(20))


SAVER = """
import sys, time
import pitstop
from pitstop import CheckpointNotFoundError, RunNotFoundError
store = pitstop.open_store(sys.argv[1])
me, other = sys.argv[2], sys.argv[3]
time.sleep(max(0.0, float(sys.argv[5]) - time.time()))
until = time.time() + float(sys.argv[4])
shared = ["shared-%d-" % n + "v" * 2000 for n in range(3)]  # the same values in every run
i = forks = 0
while time.time() < until:
    store.save(f"{me}-{i % 3}", {"doc": shared[i % 3], "next": shared[(i + 1) % 3], "i": i})
    if i % 4 == 0:
        # A fork shares its source's values without sending them again.
        source = store.latest(f"{other}-{i % 3}")
        if source is not None:
            try:
                store.fork(source.id, new_run_id=f"{me}-fork-{i}")
                forks += 1
            except (CheckpointNotFoundError, RunNotFoundError):
                pass  # deleted under us: refused, never half-written
    i += 1
store.close()
print(i, forks)
"""

COLLECTOR = """
import random, sys, time
import pitstop
from pitstop import RetentionPolicy, RunNotFoundError
store = pitstop.open_store(sys.argv[1])
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
until = time.time() + float(sys.argv[2])
rng = random.Random(7)
deleted = 0
while time.time() < until:
    store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
    for run in rng.sample(store.runs(limit=None), 2) if len(store.runs()) > 2 else []:
        try:
            store.delete_run(run.id)
            deleted += 1
        except RunNotFoundError:
            pass
store.close()
print(deleted)
"""


@pytest.mark.slow
def test_prune_and_delete_racing_saves_never_lose_a_shared_value(url: str) -> None:
    seconds = "3"
    saver_a, saver_b, collector = _run_at_once(
        [
            (SAVER, [url, "a", "b", seconds]),
            (SAVER, [url, "b", "a", seconds]),
            (COLLECTOR, [url, seconds]),
        ]
    )
    saves = int(saver_a.split()[0]) + int(saver_b.split()[0])
    assert saves > 50  # the race really ran
    assert int(collector) > 0
    with PostgresStore(url) as store:
        assert store.verify() == []
        for run in store.runs(limit=None):
            if run.head_id is not None:
                assert store.latest(run.id) is not None


def test_a_claim_reads_the_queue_in_index_order_without_statistics(url: str) -> None:
    """Right after a burst of enqueues, before anything analyzed the runs table, the planner
    guessed a handful of runnable rows and read every one of them (bitmap scan and sort:
    40 ms at 30,000 queued, growing with the queue). The claim's plan must be the
    index-ordered scan that stops at the first runs it can lease, whatever the statistics."""
    with pitstop.open_store(url) as store:
        schema = store.schema  # type: ignore[attr-defined]
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(
                "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at) "
                "SELECT 'q' || i, 'jobs', 'queued', i, i FROM generate_series(1, 30000) i"
            )
            assert conn.execute(
                "SELECT reltuples < 0 FROM pg_class WHERE oid = 'pitstop_runs'::regclass"
            ).fetchone() == (True,)  # never analyzed
        sql, params = store._claim_statement("me", ["jobs"], 1, time.time(), 30.0)  # type: ignore[attr-defined]
        plan = "\n".join(row[0] for row in store._claim_write("EXPLAIN " + sql, params))  # type: ignore[attr-defined]
        assert "Index Scan using pitstop_runs_runnable" in plan, plan
        assert "Bitmap" not in plan, plan
        [lease] = store.claim("me", workflows=["jobs"])
        assert lease.run_id == "q1"  # the oldest
        assert store.get_run("q1").status is RunStatus.RUNNING
