"""Shared fixtures: every contract test runs against every backend, on real databases.

PostgreSQL tests use the server named by ``PITSTOP_TEST_POSTGRES_URL`` (default: the local
server with trust auth). Each test gets its own PostgreSQL schema, dropped afterwards, so tests
never see each other's rows and may run against a database that holds other data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop.store import Store

PG_URL = os.environ.get("PITSTOP_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
ROOT = Path(__file__).resolve().parent.parent


def _have_postgres_backend() -> bool:
    try:
        import pitstop.store.backends.postgres  # noqa: F401
    except ImportError:
        return False
    return True


def _prepare_postgres() -> str | None:
    """Make sure the database ``PG_URL`` names exists: a server without it gets it created
    (a fresh machine, or a URL naming a new database). Returns why the PostgreSQL tests
    cannot run (one line, shown as their skip reason), or None when they can."""
    import psycopg
    from psycopg import conninfo, errors, sql

    where = conninfo.conninfo_to_dict(PG_URL)
    server = f"{where.get('host', 'localhost')}:{where.get('port', 5432)}"
    try:
        psycopg.connect(PG_URL, connect_timeout=5).close()
        return None
    except psycopg.OperationalError as exc:
        message = " ".join(str(exc).split())
        database = where.get("dbname")
        if not database or f'database "{database}" does not exist' not in message:
            return (f"PostgreSQL on {server} is not usable ({message}); "
                    "set PITSTOP_TEST_POSTGRES_URL")
    try:
        admin = conninfo.make_conninfo(PG_URL, dbname="postgres")
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(database))))
    except errors.DuplicateDatabase:
        pass  # another test run created it just now
    except psycopg.Error as exc:
        return (f"database {database!r} does not exist on {server} and cannot be created "
                f"({' '.join(str(exc).split())})")
    return None


POSTGRES_SKIP = _prepare_postgres() if _have_postgres_backend() else None
"""Why the PostgreSQL tests are skipped on this machine, or None: they run."""

BACKENDS = ["sqlite", "memory"] + (["postgres"] if _have_postgres_backend() else [])
SHARED_BACKENDS = [b for b in BACKENDS if b != "memory"]  # memory:// lives in one process


def pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}schema={schema}"


def drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL naming a fresh, empty store of the backend under test."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    elif backend == "memory":
        yield "memory://"
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        yield pg_schema_url(schema)
        drop_pg_schema(schema)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL that several processes (or handles) can share: a SQLite file, or a
    PostgreSQL schema of its own (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        schema = f"s_{uuid.uuid4().hex[:12]}"
        yield pg_schema_url(schema)
        drop_pg_schema(schema)


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[..., Store]]:
    """Opens (more) stores on the URL under test; closes them all at the end."""
    opened: list[Store] = []

    def opener(**options: Any) -> Store:
        s = pitstop.open_store(store_url, **options)
        opened.append(s)
        return s

    yield opener
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Callable[..., Store]) -> Store:
    return open_store()


@pytest.fixture
def open_shared(shared_url: str) -> Iterator[Callable[..., Store]]:
    """Opens stores on ``shared_url`` (a SQLite file or a PostgreSQL schema, several handles
    at once); closes them all at the end. The blob-store and encryption tests make their
    ``opener`` from it with ``functools.partial`` (their blob store, their threshold)."""
    opened: list[Store] = []

    def opener(**options: Any) -> Store:
        s = pitstop.open_store(shared_url, **options)
        opened.append(s)
        return s

    yield opener
    for s in opened:
        s.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests asking for ``store``/``store_url`` run once per backend, unless they choose."""
    already = any("store_url" in m.args[0] for m in metafunc.definition.iter_markers("parametrize"))
    if "store_url" in metafunc.fixturenames and not already:
        metafunc.parametrize("store_url", BACKENDS, indirect=True)


def run_python(code: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a real separate process)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        check=False,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a usable PostgreSQL server, its tests are skipped with the one-line reason
    instead of failing with driver tracebacks."""
    if POSTGRES_SKIP is None:
        return
    skip = pytest.mark.skip(reason=POSTGRES_SKIP)
    for item in items:
        params = getattr(item, "callspec", None)
        uses = params is not None and "postgres" in params.params.values()
        if uses or "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """moto's S3 server on a free loopback port, for the whole session (tests/s3server.py)."""
    pytest.importorskip("obstore")
    pytest.importorskip("moto.server")
    from s3server import start

    server = start()
    yield server
    server.stop()


@pytest.fixture
def s3_blobs(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<a new bucket>/pitstop``, with this process's AWS settings pointing at the
    test server (credentials, region and endpoint from the environment, as in production)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3_server.new_bucket()}/pitstop"
