"""``stats(exact=False)``: bounded work at any size, exact where counts are small (issue #18).

``pitstop stats`` on a PostgreSQL store of a million runs must answer fast, and counting a
million rows cannot. So counts up to ``STATS_EXACT_UP_TO`` stay exact (a bounded index range)
and larger ones are estimated from a sample of pages, flagged in ``StoreStats.estimated``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

import pitstop
from clitools import pitstop_exe
from conftest import PG_URL, POSTGRES_SKIP, drop_pg_schema, pg_schema_url
from pitstop.store import Store
from pitstop.store.engine import maintenance


def test_a_small_store_is_counted_exactly_either_way(store: Store) -> None:
    wf = pitstop.Workflow("counted")

    @wf.step
    def only(state: dict[str, int]) -> dict[str, int]:
        return {"n": state["n"] + 1, "blob": "x" * 5000}

    for n in range(3):
        wf.start(store, {"n": n})
    wf.enqueue(store, {"n": 9})
    exact, bounded = store.stats(), store.stats(exact=False)
    assert bounded == exact
    assert bounded.estimated == frozenset()
    assert dict(bounded.runs_by_status) == {"completed": 3, "queued": 1}


@pytest.fixture
def big_pg() -> Iterator[tuple[str, str]]:
    """A PostgreSQL store with 30,000 completed runs and 40 queued ones (filled by SQL, never
    analyzed), and its schema name."""
    if POSTGRES_SKIP:
        pytest.skip(POSTGRES_SKIP)
    import psycopg

    schema = f"t_stats_{uuid.uuid4().hex[:10]}"
    url = pg_schema_url(schema)
    pitstop.open_store(url).close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("ALTER TABLE pitstop_runs SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at) "
            "SELECT 'r' || i, 'bulk', CASE WHEN i <= 40 THEN 'queued' ELSE 'completed' END, "
            "i, i FROM generate_series(1, 30040) i"
        )
    yield url, schema
    drop_pg_schema(schema)


def test_large_counts_are_estimated_and_say_so(big_pg: tuple[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url, schema = big_pg
    # A smaller sample than the default, so this small table is sampled rather than read.
    monkeypatch.setattr(maintenance, "STATS_SAMPLED_PAGES", 40)
    with pitstop.open_store(url) as store:
        exact = store.stats()
        assert dict(exact.runs_by_status) == {"completed": 30000, "queued": 40}
        assert exact.estimated == frozenset()

        bounded = store.stats(exact=False)
        assert bounded.runs_by_status["queued"] == 40  # small: exact
        assert bounded.estimated == {"runs", "runs_by_status.completed"}
        # Never analyzed: the sample scaled up, noisy, but never below what was counted.
        assert 10_000 < bounded.runs_by_status["completed"] < 60_000
        assert bounded.checkpoints == exact.checkpoints  # none: exact

        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'ANALYZE "{schema}".pitstop_runs')
        analyzed = store.stats(exact=False)
        # Analyzed: the measured density times the pages, shared out by the sample.
        assert abs(analyzed.runs - 30040) < 30040 * 0.05
        assert analyzed.runs_by_status["queued"] == 40


@pytest.mark.slow
def test_the_cli_marks_estimates_and_counts_exactly_when_asked(
    big_pg: tuple[str, str],
) -> None:
    url, _ = big_pg
    shown = pitstop_exe("stats", store=url)
    assert shown.code == 0, shown.err
    runs_line = next(line for line in shown.out.splitlines() if line.startswith("runs:"))
    assert runs_line.startswith("runs:        ~") and "completed, 40 queued)" in runs_line
    assert "~: estimated from a sample of the table; --exact counts every row" in shown.out
    doc = json.loads(pitstop_exe("stats", "--json", "--exact", store=url).out)
    assert doc["runs"] == 30040 and doc["estimated"] == []
