"""Stream jobs under SIGKILL: several ``job.run`` processes on one store (SQLite on this host,
PostgreSQL; Redis and JetStream sources), killed at random and restarted while events
arrive. The committed state must equal the uninterrupted counts and the sink stream must
hold every output exactly once. The full-size run (200,000 events, 30 kills, 3 processes)
is ``bench/stream.py --kills``."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("redis")

from conftest import POSTGRES_SKIP, drop_pg_schema, pg_schema_url
from streamkill import run_kill_test

pytestmark = pytest.mark.slow


def test_sqlite_kills_exactly_once(tmp_path: object) -> None:
    name = f"k{uuid.uuid4().hex[:10]}"
    result = run_kill_test(f"sqlite:///{tmp_path}/stream.db", name, partitions=4,
                           events=20_000, kills=8, processes=2, seed=1)
    assert result.kills == 8
    assert result.ok, result


@pytest.mark.skipif(POSTGRES_SKIP is not None, reason=POSTGRES_SKIP or "")
def test_postgres_kills_exactly_once() -> None:
    name = f"k{uuid.uuid4().hex[:10]}"
    schema = f"s_{uuid.uuid4().hex[:12]}"
    try:
        result = run_kill_test(pg_schema_url(schema), name, partitions=4, events=20_000,
                               kills=8, processes=3, seed=2)
    finally:
        drop_pg_schema(schema)
    assert result.kills == 8
    assert result.ok, result


def test_jetstream_kills_exactly_once(tmp_path: object) -> None:
    pytest.importorskip("nats")
    name = f"k{uuid.uuid4().hex[:10]}"
    result = run_kill_test(f"sqlite:///{tmp_path}/stream.db", name, partitions=4,
                           events=20_000, kills=8, processes=2, seed=3, broker="jetstream")
    assert result.kills == 8
    assert result.ok, result


@pytest.mark.skipif(POSTGRES_SKIP is not None, reason=POSTGRES_SKIP or "")
def test_jetstream_postgres_kills_exactly_once() -> None:
    # JetStream positions (stream sequences) with the partitions shared by 3 processes
    # through PostgreSQL leases.
    pytest.importorskip("nats")
    name = f"k{uuid.uuid4().hex[:10]}"
    schema = f"s_{uuid.uuid4().hex[:12]}"
    try:
        result = run_kill_test(pg_schema_url(schema), name, partitions=4, events=20_000,
                               kills=8, processes=3, seed=4, broker="jetstream")
    finally:
        drop_pg_schema(schema)
    assert result.kills == 8
    assert result.ok, result
