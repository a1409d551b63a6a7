"""The schema module: each table's columns are defined once, by its row class, and match what
the migrations create on every backend."""

from __future__ import annotations

from typing import Any

from pitstop import RunStatus, Store
from pitstop.store.engine import schema


def _columns(store: Store, table: str) -> tuple[str, ...]:
    """The columns of ``table`` as the database reports them, in table order."""

    def read(tx: Any) -> list[Any]:
        if store.dialect.name == "sqlite":  # type: ignore[attr-defined]
            return [row[1] for row in tx.all(f"PRAGMA table_info({table})")]
        return tx.column(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
            (table,),
        )

    return tuple(store._tx(read))  # type: ignore[attr-defined]


def test_row_classes_name_exactly_the_columns_the_migrations_create(store: Store) -> None:
    assert store.schema_version() == schema.LATEST_SCHEMA  # type: ignore[attr-defined]
    for table in schema.TABLES:  # (in any order: every SELECT names its columns)
        assert sorted(_columns(store, table.name)) == sorted(table.columns), table.name


def test_sql_is_built_from_the_row_classes() -> None:
    assert schema.SELECT_CHECKPOINT.startswith(
        "SELECT id, run_id, parent_id, step, created_at, schema_version, metadata, fields, "
    )
    assert schema.INSERT_CHECKPOINT.count("?") == len(schema.CHECKPOINTS.columns)
    # A lease belongs to a process, a parent link to the store the parent lives in.
    assert set(schema.EXPORTED_RUN_COLUMNS) == set(schema.RUNS.columns) - {
        "lease_owner", "lease_expires", "fence"
    }


def test_rows_read_by_name_round_trip_to_the_model(store: Store) -> None:
    store.create_run("r", workflow="wf", metadata={"k": "v"}, priority=3)
    run, head = store.latest_with_run("r")
    assert (run.id, run.workflow, run.metadata, run.priority, head) == ("r", "wf", {"k": "v"}, 3,
                                                                         None)
    first = store.save("r", {"a": 1}, metadata={"waiting_for": ["go"]}, status=RunStatus.WAITING)
    run, head = store.latest_with_run("r")
    assert head is not None and head.id == first.id and head.state == {"a": 1}
    assert (run.head_id, run.step, run.waiting_for, run.checkpoints) == (first.id, 0, ("go",), 1)
    summary = store.summary(first.id)
    assert (summary.id, summary.run_id, summary.step, summary.added) == (
        first.id, "r", 0, first.added
    )
