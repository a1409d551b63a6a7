"""PostgreSQL indexes stay bounded under retention (pitstop.store.backends.pgindexes).

Checkpoint ids are time-ordered, so their index grows at its right edge; VACUUM reuses a
B-tree page only once it is empty, and one long-lived checkpoint among many deleted ones
keeps its page. These tests reproduce that on the real server (a run that lives on beside
short runs deleted by retention) and show the store's own upkeep rebuilding the index, after
prunes, from several handles at once, and cleaning up after a rebuild cut short.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pitstop
from conftest import PG_URL, POSTGRES_SKIP, drop_pg_schema, pg_schema_url
from pitstop.store import Store

pytestmark = pytest.mark.skipif(POSTGRES_SKIP is not None, reason=str(POSTGRES_SKIP))

ROUND = 300
"""Checkpoints of a short run per round: about two leaf pages of the id index (156 entries
fill one). Fewer would fit in the page the previous round emptied (an insert into a full
page first removes the entries index scans found dead, and splits only if that is not
enough); this many split it, and the page that keeps the round's survivor stays."""


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A store's URL in a schema of its own, dropped afterwards."""
    schema = f"t_ix_{uuid.uuid4().hex[:10]}"
    yield pg_schema_url(schema)
    drop_pg_schema(schema)


@pytest.fixture
def pg() -> Iterator[Any]:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        yield conn


def index_pages(conn: Any, schema: str, name: str) -> int:
    row = conn.execute(
        "SELECT pg_relation_size(c.oid) / current_setting('block_size')::int FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, name)).fetchone()
    return int(row[0])


def vacuum(conn: Any, schema: str) -> None:
    """What autovacuum does (the test server has it off): dead rows' index entries go."""
    from psycopg import sql

    for table in ("pitstop_checkpoints", "pitstop_runs"):
        conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(schema, table)))


def churn(store: Store, conn: Any, rounds: int, start: int = 0,
          after_round: Callable[[], None] = lambda: None) -> list[int]:
    """Each round: one more checkpoint of a run that lives on (kept: retention never
    touches a running run), a short run of ROUND checkpoints that completes, and retention
    deleting the finished run; then a VACUUM. The id index's pages after each round."""
    schema = str(getattr(store, "schema"))  # noqa: B009 - PostgresStore's own
    pages = []
    for r in range(start, start + rounds):
        store.save("keeper", {"round": r})
        for i in range(ROUND):
            store.save(f"brief-{r}", {"i": i},
                       status=pitstop.RunStatus.COMPLETED if i == ROUND - 1 else None)
        vacuum(conn, schema)  # before the prune: the look sees this round's entry counts
        store.prune(pitstop.RetentionPolicy(finished_older_than=0))
        after_round()
        vacuum(conn, schema)
        pages.append(index_pages(conn, schema, "pitstop_checkpoints_id"))
    return pages


@pytest.mark.slow
def test_the_checkpoint_id_index_stays_bounded_under_retention(
        pg_url: str, pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pitstop.store.backends import pgindexes

    # Smaller thresholds than a store's (32 pages, 4 times the need), for a test's size.
    monkeypatch.setattr(pgindexes, "REBUILD_FROM_PAGES", 8)
    monkeypatch.setattr(pgindexes, "REBUILD_ABOVE", 2.0)
    monkeypatch.setattr(pgindexes, "CHECK_EVERY", 1e9)  # the first handle never looks
    with pitstop.open_store(pg_url) as store:
        schema = str(getattr(store, "schema"))  # noqa: B009
        grown = churn(store, pg, rounds=14)
        live = pg.execute(f'SELECT count(*) FROM "{schema}".pitstop_checkpoints').fetchone()[0]
        sizes = {i.name: i for i in pgindexes.index_sizes(pg, schema)}
    # The hypothesis, reproduced: 14 live entries (the keeper's checkpoints) keep a page
    # each; a fresh build needs 3 (meta, one leaf, its parent), or up to 5 while another
    # session of the shared test database holds back VACUUM (a round's dead entries stay).
    assert live == 14
    assert grown[-1] >= 13 and grown[-1] > grown[len(grown) // 2] > grown[0], grown
    assert sizes["pitstop_checkpoints_id"].needed <= 5
    assert sizes["pitstop_checkpoints_id"].sparse, sizes["pitstop_checkpoints_id"]

    monkeypatch.setattr(pgindexes, "CHECK_EVERY", 0.0)  # this one looks after every prune
    with pitstop.open_store(pg_url) as store:
        upkeep = getattr(store, "_index_upkeep")  # noqa: B009
        bounded = churn(store, pg, rounds=10, start=14,
                        after_round=lambda: upkeep.wait(timeout=60))
        assert store.latest("keeper").state == {"round": 23}  # type: ignore[union-attr]
        assert len(store.history("keeper", limit=100)) == 24
    print("id index pages per round:", grown, bounded)
    # Rebuilt whenever it passes 8 pages and twice its need (at most 10): it stays under
    # that and a round's growth, and falls back each time it gets there, however many
    # rounds go through.
    assert max(bounded) <= 10 + 3 < grown[-1], (grown, bounded)
    assert bounded[0] <= 3, (grown, bounded)  # rebuilt after the first prune
    assert sum(1 for a, b in itertools.pairwise(bounded) if b < a - 3) >= 2, \
        (grown, bounded)  # and again each time it got there


@pytest.mark.slow
def test_only_one_handle_rebuilds_at_a_time_and_ids_stay_unique(
        pg_url: str, pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The advisory lock: a handle that finds another rebuilding skips; the unique
    checkpoint id index is valid and unique after a rebuild, and duplicates are refused."""
    from pitstop.store.backends import pgindexes

    monkeypatch.setattr(pgindexes, "REBUILD_FROM_PAGES", 1)
    monkeypatch.setattr(pgindexes, "REBUILD_ABOVE", 0.0)  # every rebuildable index is "sparse"
    with pitstop.open_store(pg_url) as store, pitstop.open_store(pg_url) as other:
        for i in range(20):
            store.save("r", {"i": i})
        key = getattr(store, "_reindex_key")  # noqa: B009
        pg.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            assert getattr(other, "_rebuild_sparse_indexes")() == []  # noqa: B009
        finally:
            pg.execute("SELECT pg_advisory_unlock(%s)", (key,))
        rebuilt = getattr(other, "_rebuild_sparse_indexes")()  # noqa: B009
        assert "pitstop_checkpoints_id" in rebuilt and "pitstop_checkpoints_pkey" in rebuilt
        # Never the keys an INSERT ... ON CONFLICT names (a concurrent rebuild's copy could
        # refuse a racing insert that the conflict clause would have absorbed).
        for kept in ("pitstop_blobs_pkey", "pitstop_blob_refs_pkey", "pitstop_effects_pkey",
                     "pitstop_runs_pkey", "pitstop_inputs_pkey", "pitstop_cache_pkey"):
            assert kept not in rebuilt
        schema = str(getattr(store, "schema"))  # noqa: B009
        valid = pg.execute(
            "SELECT bool_and(ix.indisvalid AND ix.indisunique) FROM pg_index ix "
            "JOIN pg_class c ON c.oid = ix.indexrelid JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname IN "
            "('pitstop_checkpoints_id', 'pitstop_checkpoints_pkey')", (schema,)).fetchone()
        assert valid == (True,)
        head = store.latest("r")
        assert head is not None and head.state == {"i": 19}
        assert store.verify() == []
        import psycopg

        with pytest.raises(psycopg.errors.UniqueViolation):
            pg.execute(f'INSERT INTO "{schema}".pitstop_checkpoints SELECT * FROM '
                       f'"{schema}".pitstop_checkpoints WHERE id = %s', (head.id,))


def test_a_rebuild_cut_short_is_cleaned_up(pg_url: str, pg: Any) -> None:
    """REINDEX CONCURRENTLY stopped midway leaves an invalid ``_ccnew`` copy, which every
    insert still maintains: the next look drops it. An invalid index of another name (not
    pitstop's doing) stays."""
    import psycopg

    with pitstop.open_store(pg_url) as store:
        schema = str(getattr(store, "schema"))  # noqa: B009
        store.save("a", {"x": 1})
        store.save("b", {"x": 1})
        # A failed concurrent unique build leaves its index invalid, as a cut-short rebuild.
        for name in ("pitstop_checkpoints_id_ccnew", "someone_elses"):
            with pytest.raises(psycopg.errors.UniqueViolation):
                pg.execute(f'CREATE UNIQUE INDEX CONCURRENTLY "{name}" '
                           f'ON "{schema}".pitstop_checkpoints (step)')
        invalid = ("SELECT c.relname FROM pg_index ix JOIN pg_class c ON c.oid = ix.indexrelid "
                   "JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE n.nspname = %s AND NOT ix.indisvalid ORDER BY 1")
        assert [r[0] for r in pg.execute(invalid, (schema,))] == [
            "pitstop_checkpoints_id_ccnew", "someone_elses"]
        assert getattr(store, "_rebuild_sparse_indexes")() == []  # noqa: B009 - none sparse
        assert [r[0] for r in pg.execute(invalid, (schema,))] == ["someone_elses"]
        store.save("c", {"x": 1})  # writes go on


def test_a_duplicate_reported_by_a_rebuilt_copy_is_still_a_duplicate(pg_url: str) -> None:
    """While a rebuild runs, the old index or its copy (``..._ccold``/``_ccnew``) may be the
    one that reports a duplicate checkpoint id: the store recognises it all the same."""
    with pitstop.open_store(pg_url) as store:
        for name in ("pitstop_checkpoints_id", "pitstop_checkpoints_id_ccnew",
                     "pitstop_checkpoints_pkey_ccold", "pitstop_checkpoints_id_ccnew1"):
            assert _reported_as_duplicate(store, name)
        assert not _reported_as_duplicate(store, "pitstop_runs_pkey")
        assert not _reported_as_duplicate(store, "pitstop_checkpoints_idx")


def _reported_as_duplicate(store: Store, constraint: str) -> bool:
    """Whether the store takes a unique violation on ``constraint`` for a duplicate
    checkpoint: a real one, raised by the server on an index of that name."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE TEMP TABLE dup (k int CONSTRAINT "{constraint}" UNIQUE)')
        conn.execute("INSERT INTO dup VALUES (1)")
        with pytest.raises(psycopg.errors.UniqueViolation) as raised:
            conn.execute("INSERT INTO dup VALUES (1)")
    assert raised.value.diag.constraint_name == constraint
    return bool(getattr(store, "_duplicate_checkpoint")(raised.value))  # noqa: B009


@pytest.mark.slow
def test_vacuum_rebuilds_and_names_the_sparse_indexes(
        pg_url: str, pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pitstop vacuum` (``pitstop.store.vacuum``) on PostgreSQL: VACUUM, then the same
    rebuilds, named in its report; the size it reports after includes what they gave back."""
    from pitstop.store.backends import pgindexes

    monkeypatch.setattr(pgindexes, "REBUILD_FROM_PAGES", 8)
    monkeypatch.setattr(pgindexes, "CHECK_EVERY", 1e9)
    with pitstop.open_store(pg_url) as store:
        schema = str(getattr(store, "schema"))  # noqa: B009
        grown = churn(store, pg, rounds=14)
        report = pitstop.store.vacuum(store)
        # The id index; the primary key too when this round's deletions left it sparse.
        assert "pitstop_checkpoints_id" in report.reindexed, (grown, report)
        assert set(report.reindexed) <= set(pgindexes.UNIQUE_REBUILT), report
        assert index_pages(pg, schema, "pitstop_checkpoints_id") <= 3
        assert report.after is not None and report.before is not None
        assert report.after <= report.before - (grown[-1] - 3) * 8192
        assert pitstop.store.vacuum(store).reindexed == ()  # nothing left to rebuild
