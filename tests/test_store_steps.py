"""``save_step`` (pitstop.store.engine.steps): a step's small checkpoint planned without the
value codec, exactly as the shared path plans it, and written by the same writer (refusals
included); nothing written whenever it is not that case (the shared path then takes the save
and its rules apply)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import SHARED_BACKENDS, drop_pg_schema, pg_schema_url
from pitstop import ConflictError, RunBusyError, RunStatus
from pitstop.store import SaveRequest
from pitstop.store.engine.sql import SqlStore

_COLUMNS = "id, run_id, parent_id, step, schema_version, metadata, fields, size, added, writes"
_RUN = "run_id, workflow, status, head_id, step, waiting_for, wake_at, checkpoints, bytes"


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:  # (every backend: see conftest)
    opened = pitstop.open_store(store_url)
    assert isinstance(opened, SqlStore) and opened.step_saves
    yield opened
    opened.close()


@pytest.fixture
def second_url(store_url: str, tmp_path: Path) -> Iterator[str]:
    """Another fresh store of ``store_url``'s backend."""
    if store_url.startswith("postgresql"):
        schema = f"t_{uuid.uuid4().hex[:12]}"
        yield pg_schema_url(schema)
        drop_pg_schema(schema)
    else:
        yield f"sqlite:///{tmp_path / 'second.db'}"


def _rows(store: SqlStore, sql: str) -> list[Any]:
    return store._query(sql)


def _steps(store: SqlStore, *, step_path: bool) -> None:
    """A run of a few steps with records attached, through either path."""
    store.create_run("r", workflow="w")
    first = store.save("r", {"n": b"\x00", "same": b"kept", "again": b"\xc0"},
                       checkpoint_id="c0", metadata={"source": "input"})
    assert first.id == "c0"
    # ("again": named changed, its bytes the parent's, as a LangGraph branch channel's None.)
    steps: list[dict[str, Any]] = [
        {"state": {"n": b"\x01", "same": None, "again": b"\xc0"}, "changed": ["n", "again"],
         "status": RunStatus.RUNNING, "workflow": "w",
         "attach": {"c0": {"c0/t": b"writes of step 0"}}},
        {"state": {"n": b"\x02", "same": None, "again": b"\xc0", "new": b"x"},
         "changed": ["n", "again", "new"],
         "attach": {"c1": {"c1/t": b"one", "c1/u": b"two", "c1/big": b"zstd " * 2000},
                    "c2": {"c2/t": b"own"}}},
        {"state": {"n": b"\x03", "same": None}, "changed": ["n"], "step": 9,
         "attach": {"later": {"later/t": b"on a checkpoint not written yet"}}},
    ]
    for i, options in enumerate(steps, start=1):
        state = options.pop("state")
        parent = f"c{i - 1}"
        kwargs = {"parent_id": parent, "expected_head": parent, "checkpoint_id": f"c{i}",
                  "metadata": {"source": "loop", "i": i}, **options}
        if step_path:
            assert store.save_step(SaveRequest.of("r", state, **kwargs))
        else:
            store.save("r", state, **kwargs)


@pytest.mark.parametrize("store_url", SHARED_BACKENDS, indirect=True)
def test_a_step_is_written_as_the_shared_path_writes_it(store_url: str, second_url: str) -> None:
    # PostgreSQL sends both as its one statement; SQLite runs write_checkpoint for both.
    shared = pitstop.open_store(store_url)
    stepped = pitstop.open_store(second_url)
    assert isinstance(shared, SqlStore) and isinstance(stepped, SqlStore)
    _steps(shared, step_path=False)
    _steps(stepped, step_path=True)
    for sql in (f"SELECT {_COLUMNS} FROM pitstop_checkpoints ORDER BY id",
                f"SELECT {_RUN} FROM pitstop_runs",
                "SELECT run_id, key, checkpoint_id, result, hash FROM pitstop_effects"):
        assert _rows(stepped, sql) == _rows(shared, sql)
    for opened in (shared, stepped):
        assert opened.verify() == []  # every checksum (records, attached frames) holds
        assert opened.get("c2").state == {"n": b"\x02", "same": b"kept", "again": b"\xc0",
                                          "new": b"x"}
        assert opened.get("c3").state == {"n": b"\x03", "same": b"kept"}
        assert opened.get("c3").step == 9
        assert opened.attachments("r", "c1") == {
            "c1/t": b"one", "c1/u": b"two", "c1/big": b"zstd " * 2000}
        assert opened.attachments("r", "later") == {
            "later/t": b"on a checkpoint not written yet"}
    assert stepped.stats().bytes == shared.stats().bytes
    shared.close()
    stepped.close()


def test_what_is_not_a_step_is_left_to_the_shared_path(store: SqlStore) -> None:
    store.create_run("r")
    store.save("r", {"n": b"\x00"}, checkpoint_id="c0")
    before = _rows(store, f"SELECT {_COLUMNS} FROM pitstop_checkpoints")

    def step(state: dict[str, Any] | None = None, **options: Any) -> bool:
        kwargs: dict[str, Any] = {"parent_id": "c0", "expected_head": "c0",
                                  "checkpoint_id": "c1", "changed": ["n"], **options}
        return store.save_step(SaveRequest.of("r", {"n": b"\x01"} if state is None else state,
                                              **kwargs))

    assert not step(expected_head=pitstop.store.contract.base.UNSET)  # a branch: any head
    assert not step(status=RunStatus.WAITING)
    assert not step(metadata={"waiting_for": ["x"]})
    assert not step({"n": b"x" * 100})  # too long to keep inline
    assert not step({"n": [b"\x01"]})  # not a byte string
    assert not step({"n": b"\x01", "gone": None})  # unchanged, yet not in the parent
    assert not step(parent_id="nowhere", expected_head="nowhere")  # parent not known here
    assert _rows(store, f"SELECT {_COLUMNS} FROM pitstop_checkpoints") == before
    # The head moved: nothing written, refused by the one writer as the shared path is.
    store.save("r", {"n": b"\x05"}, checkpoint_id="c5")
    with pytest.raises(ConflictError) as info:
        step()
    assert info.value.actual == "c5"
    with pytest.raises(ConflictError) as info:
        store.save("r", {"n": b"\x01"}, parent_id="c0", expected_head="c0", changed=["n"],
                   checkpoint_id="c1")
    assert info.value.actual == "c5"
    # A lease another owner holds.
    store.acquire("r", "someone", ttl=60)
    with pytest.raises(RunBusyError):
        step(parent_id="c5", expected_head="c5")
    with pytest.raises(RunBusyError):
        store.save("r", {"n": b"\x01"}, parent_id="c5", expected_head="c5",
                   changed=["n"], checkpoint_id="c1")
    assert store.get_run("r").head_id == "c5"


def test_an_id_already_taken_is_refused_as_the_shared_path_refuses_it(store: SqlStore) -> None:
    store.create_run("r")
    store.create_run("other")
    store.save("other", {"n": b"\x00"}, checkpoint_id="taken")
    store.save("r", {"n": b"\x00"}, checkpoint_id="c0")
    with pytest.raises(ConflictError, match="already exists"):
        store.save_step(SaveRequest.of("r", {"n": b"\x01"}, parent_id="c0", expected_head="c0",
                                       changed=["n"], checkpoint_id="taken"))
    assert store.get_run("r").head_id == "c0"  # rolled back with the insert
    with pytest.raises(ConflictError, match="already exists"):
        store.save("r", {"n": b"\x01"}, parent_id="c0", expected_head="c0", changed=["n"],
                   checkpoint_id="taken")

