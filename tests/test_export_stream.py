"""``pitstop export`` streams a run's records, not only its values.

A run with very many checkpoints, inputs and effect records is read a page of rows at a time
into temporary files (``Store.export_run(stream=True)``, ``pitstop.store.engine.spool``), inside
the export's one read transaction: memory holds a page, not the run. The archive is byte for
byte the one written from the same records held in lists, and imports back whole. Real
SQLite files and PostgreSQL schemas.
"""

from __future__ import annotations

import datetime as dt
import io
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import BACKENDS, drop_pg_schema, pg_schema_url
from pitstop import archive
from pitstop.store.engine import spool

SQL_BACKENDS = [b for b in BACKENDS if b != "memory"]


class _Fixed(dt.datetime):
    """The archive header's ``created``, fixed: two exports of one store then match."""

    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> _Fixed:
        return cls(2026, 12, 2, 8, 0, 0, tzinfo=dt.UTC)


def _url(backend: str, tmp_path: Path, name: str) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / f'{name}.db'}"
        return
    schema = f"x_{name}_{uuid.uuid4().hex[:10]}"
    yield pg_schema_url(schema)
    drop_pg_schema(schema)


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def source(backend: str, tmp_path: Path) -> Iterator[str]:
    yield from _url(backend, tmp_path, "source")


@pytest.fixture
def target(backend: str, tmp_path: Path) -> Iterator[str]:
    yield from _url(backend, tmp_path, "target")


asks = pitstop.Workflow("asks")


@asks.step(wait_for="first")
def one(state: dict[str, Any], first: Any) -> dict[str, Any]:
    return {"got": [first]}


@asks.step(wait_for="second")
def two(state: dict[str, Any], second: Any) -> dict[str, Any]:
    return {"got": [*state["got"], second]}


def _fill(store: pitstop.Store, *, checkpoints: int, effects: int, pad: int) -> None:
    """Run "r": ``checkpoints`` checkpoints with ``pad`` bytes of metadata each and
    ``effects`` effect records; run "w": a workflow that consumed two inputs."""
    for n in range(checkpoints):
        store.save("r", {"n": n, "blob": bytes([n % 256]) * 3000 if n % 9 == 0 else b"x"},
                   metadata={"i": n, "pad": f"{n:06d}" * (pad // 6)})
    for start in range(0, effects, 250):
        store.record_effects("r", {f"e{k:05d}": {"k": k, "pad": "p" * pad}
                                   for k in range(start, min(start + 250, effects))})
    asks.start(store, {}, run_id="w")
    for name in ("first", "second"):
        pitstop.send(store, "w", name, {"name": name})
        asks.resume(store, "w")


def _archive(store: pitstop.Store, run_id: str, *, stream: bool) -> bytes:
    out = io.BytesIO()
    if stream:
        archive.write_archive(store, run_id, out)
    else:  # the records held in lists, as export_run without stream=True reads them
        data = store.export_run(run_id)
        data.verify()
        archive._write(data, store, out, None)
    return out.getvalue()


def test_a_streamed_export_matches_one_from_lists_and_imports_back(
    source: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive, "datetime", _Fixed)
    monkeypatch.setattr(spool, "PAGE", 7)  # many pages: keyset paging across page ends
    with pitstop.open_store(source) as store:
        _fill(store, checkpoints=60, effects=45, pad=60)
        exported = store.export_run("r", stream=True)
        assert isinstance(exported.checkpoints, spool.RecordSpool)
        assert [c.id for c in exported.checkpoints] == [h.id for h in
                                                        reversed(store.history("r", limit=None))]
        assert len(exported.effects) == 45 and len(list(exported.effects)) == 45
        assert [c.id for c in exported.checkpoints] == [c.id for c in exported.checkpoints]
        streamed = {r: _archive(store, r, stream=True) for r in ("r", "w")}
        for run_id, data in streamed.items():
            assert data == _archive(store, run_id, stream=False), run_id
        heads = {r: store.latest(r) for r in ("r", "w")}
        effects = store.effects("r")
    with pitstop.open_store(target) as copy:
        for run_id, data in streamed.items():
            info, read = archive.read_archive(io.BytesIO(data))
            assert info.counts["checkpoints"] == len(read.checkpoints)
            archive.import_archive(copy, read)
            head = heads[run_id]
            assert head is not None
            again = copy.latest(run_id)
            assert again is not None and again.id == head.id and again.state == head.state
        assert len(copy.history("r", limit=None)) == 60
        assert copy.effects("r") == effects and len(effects) == 45
        assert [i.name for i in copy.inputs("w", pending=False).values()] == ["first", "second"]
        assert copy.verify() == []


@pytest.mark.slow
def test_export_memory_does_not_grow_with_the_records(
    source: str, target: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """4,000 records of about 3 KB each (12 MB): the export's Python heap peaks at a page of
    rows and a spool's in-memory part (set to 256 KiB here), not at the records' size, as
    it did when they were read into lists."""
    monkeypatch.setattr(spool, "IN_MEMORY", 256 << 10)
    monkeypatch.setattr(spool, "PAGE", 200)
    with pitstop.open_store(source) as store:
        _fill(store, checkpoints=2000, effects=2000, pad=3000)
        store.get_run("r")  # (the connection and its statement cache, before measuring)
        path = tmp_path / "r.pitstop"
        tracemalloc.start()
        try:
            info = archive.write_archive(store, "r", path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert info.counts["checkpoints"] == 2000 and info.counts["effects"] == 2000
        head = store.latest("r")
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB"
    with pitstop.open_store(target) as copy:
        _, data = archive.read_archive(path)
        archive.import_archive(copy, data)
        again = copy.latest("r")
        assert head is not None and again is not None and again.state == head.state
        assert len(copy.history("r", limit=None)) == 2000
        assert copy.get_effect("r", "e01999") == (True, {"k": 1999, "pad": "p" * 3000})
        assert copy.verify() == []
