"""The test command on a machine whose PostgreSQL lacks the database named by
PITSTOP_TEST_POSTGRES_URL creates it; without a usable server the PostgreSQL tests are
skipped with a one-line reason, not failed with driver tracebacks. Checked by running
pytest itself in a subprocess on one PostgreSQL test."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from conftest import PG_URL, POSTGRES_SKIP, ROOT

TARGET = "tests/test_postgres.py::test_schema_is_created_and_isolated"
# Plugins the target does not use, off: their imports were 80% of each run's CPU (4.7 s of
# 5.5 s here), and conftest's database check, the thing under test, runs all the same.
UNUSED_PLUGINS = ["langsmith_plugin", "schemathesis", "hypothesispytest", "anyio"]


def pytest_run(url: str) -> subprocess.CompletedProcess[str]:
    plugins_off = [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *plugins_off,
         TARGET],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PITSTOP_TEST_POSTGRES_URL": url},
    )


@pytest.mark.skipif(POSTGRES_SKIP is not None, reason=str(POSTGRES_SKIP))
@pytest.mark.slow
def test_a_missing_test_database_is_created() -> None:
    import psycopg

    name = f"pitstop_missing_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(PG_URL)
    url = urlunsplit(parts._replace(path="/" + name))
    try:
        done = pytest_run(url)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 passed" in done.stdout
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.mark.slow
def test_an_unusable_server_skips_the_postgres_tests_with_one_line() -> None:
    done = pytest_run("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    reason = next(line for line in done.stdout.splitlines() if line.startswith("SKIPPED"))
    assert "PostgreSQL on 127.0.0.1:1 is not usable" in reason
    assert "Traceback" not in done.stdout + done.stderr
