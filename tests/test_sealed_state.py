"""Encryption at rest of a state's values kept in the database (inline fields, value rows,
chunks and chunk-tree nodes), on SQLite and PostgreSQL: every column of every row of every
table is read raw and searched for markers the state holds (a string, an int inside a dict,
list items, a chunked list grown by ``Append``, a dict changed by ``Merge``); none is
there. ``rekey`` seals them again; a wrong key is refused naming the run and checkpoint."""

from __future__ import annotations

import functools
import io
import os
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import CorruptCheckpointError, Encryption, EncryptionKeyError

pytest.importorskip("cryptography")

from pitstop import archive
from pitstop.store.encoding.records import decode_field_map
from pitstop.store.encoding.sealed import is_sealed, key_id_of
from pitstop.store.engine.rekey import rekey

K1, K2 = os.urandom(32), os.urandom(32)
TEXT = "zq-7f3a-marker"
NUMBER = 0x5EC12E7  # msgpack: 0xce and these four bytes
NUMBER_BYTES = struct.pack(">I", NUMBER)


def ring(*ids: str, keys: dict[str, bytes] | None = None) -> Encryption:
    every = keys or {"k1": K1, "k2": K2}
    return Encryption(keys={i: every[i] for i in ids}, current=ids[0])


@pytest.fixture
def opener(open_shared: Callable[..., pitstop.Store], tmp_path: Path
           ) -> Callable[..., pitstop.Store]:
    return functools.partial(open_shared, blobs=str(tmp_path / "blobs"))


def fill(store: pitstop.Store) -> list[str]:
    """Checkpoints whose every kind of stored value holds the markers; their ids."""
    log = [f"{TEXT} turn {i} " + "x" * 40 for i in range(600)]  # ~40 KiB: chunked
    state: dict[str, Any] = {
        "note": f"{TEXT}",  # inline
        "doc": f"{TEXT} " * 40,  # a whole value row
        "cfg": {"limit": NUMBER, "tag": TEXT},
        "items": [TEXT, NUMBER, 3],
        "log": log,
        "table": {f"k{i}": [TEXT, NUMBER, i] for i in range(400)},  # a chunked dict
    }
    ids = [store.save("r", state).id]
    for turn in range(3):
        ids.append(store.save("r", {
            **state,
            "log": pitstop.Append([f"{TEXT} appended {turn}"]),
            "table": pitstop.Merge({f"new{turn}": {"n": NUMBER, "t": TEXT}}),
            "note": f"{TEXT}{turn}",
        }).id)
    store.save("other", {"items": [TEXT, NUMBER, 3], "note": TEXT})  # equal values
    return ids


def check(store: pitstop.Store, ids: list[str]) -> None:
    state = store.get(ids[-1]).state
    assert state["note"] == f"{TEXT}2"
    assert state["cfg"] == {"limit": NUMBER, "tag": TEXT}
    assert len(state["log"]) == 603 and state["log"][-1] == f"{TEXT} appended 2"
    assert state["table"]["new1"] == {"n": NUMBER, "t": TEXT}
    assert state["items"] == [TEXT, NUMBER, 3]
    assert store.get(ids[0]).state["doc"] == f"{TEXT} " * 40


def raw_rows(url: str) -> list[tuple[str, str, bytes]]:
    """(table, column, value as bytes) of every column of every row of every table."""
    out: list[tuple[str, str, bytes]] = []

    def add(table: str, columns: list[str], rows: list[Any]) -> None:
        for row in rows:
            for column, value in zip(columns, row, strict=True):
                if isinstance(value, bytes | bytearray | memoryview):
                    data = bytes(value)
                elif isinstance(value, int) and not isinstance(value, bool):
                    data = struct.pack(">q", value) + str(value).encode()
                else:
                    data = str(value).encode()
                out.append((table, column, data))

    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"))
        tables = [name for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            cursor = connection.execute(f'SELECT * FROM "{table}"')
            add(table, [d[0] for d in cursor.description], cursor.fetchall())
        connection.close()
        return out
    import psycopg

    base, _, schema = url.partition("?schema=")
    with psycopg.connect(base) as connection:
        tables = [name for (name,) in connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,))]
        assert "pitstop_blobs" in tables
        for table in tables:
            cursor = connection.execute(f'SELECT * FROM "{schema}"."{table}"')
            assert cursor.description is not None
            add(table, [d.name for d in cursor.description], cursor.fetchall())
    return out


def leaks(rows: list[tuple[str, str, bytes]]) -> list[tuple[str, str]]:
    return sorted({(table, column) for table, column, data in rows
                   if TEXT.encode() in data or NUMBER_BYTES in data})


def test_no_marker_is_left_in_any_row(
    opener: Callable[..., pitstop.Store], shared_url: str, tmp_path: Path
) -> None:
    plain_url = f"sqlite:///{tmp_path / 'plain.db'}"
    with pitstop.open_store(plain_url) as plain:
        fill(plain)  # the search finds them in a plain store: it would see a leak
    assert ("pitstop_blobs", "data") in leaks(raw_rows(plain_url))
    store = opener(encryption=ring("k1"))
    ids = fill(store)
    check(store, ids)
    with opener(encryption=ring("k1")) as fresh:  # nothing cached: read from the rows
        check(fresh, ids)
    rows = raw_rows(shared_url)
    assert leaks(rows) == []
    for path in (tmp_path / "blobs").rglob("*"):
        assert not path.is_file() or TEXT.encode() not in path.read_bytes()
    # history lists without the keys (metadata is plaintext); the state is refused
    with opener() as keyless:
        assert {c.id for c in keyless.history("r")} == set(ids)
        assert sorted(run.id for run in keyless.runs()) == ["other", "r"]


def test_rekey_seals_the_state_again(
    opener: Callable[..., pitstop.Store], shared_url: str
) -> None:
    store = opener(encryption=ring("k1"))
    ids = fill(store)
    store.close()
    store = opener(encryption=ring("k2", "k1"))
    assert rekey(store, "k2") > 0
    assert rekey(store, "k2") == 0
    sealed: list[bytes] = []
    for table, column, data in raw_rows(shared_url):
        if table == "pitstop_blobs" and column == "data" and data:
            sealed.append(data)
        if table == "pitstop_checkpoints" and column == "fields":
            sealed += [ref.inline for ref in decode_field_map(data).values()
                       if ref.inline is not None]
    assert sealed and all(is_sealed(v) and key_id_of(v) == "k2" for v in sealed)
    with opener(encryption=ring("k2")) as without_k1:
        check(without_k1, ids)
        assert without_k1.verify() == []
    assert leaks(raw_rows(shared_url)) == []


def test_a_wrong_key_names_the_run_and_checkpoint(
    opener: Callable[..., pitstop.Store],
) -> None:
    ids = fill(opener(encryption=ring("k1")))
    other_id = opener(encryption=ring("k2"))  # a ring without k1
    with pytest.raises(EncryptionKeyError, match=rf"run 'r': checkpoint {ids[-1]}: .*'k1'"):
        other_id.get(ids[-1])
    forged = ring("k1", keys={"k1": os.urandom(32)})  # k1's id, other bytes
    with opener(encryption=forged) as wrong:
        with pytest.raises(CorruptCheckpointError, match=rf"run 'r'.*{ids[-1]}") as info:
            wrong.get(ids[-1])
        assert "fails authentication under key 'k1'" in str(info.value)
        assert [c.id for c in wrong.history("r")]  # listing needs no key


def test_a_tampered_chunk_is_corruption(
    opener: Callable[..., pitstop.Store],
) -> None:
    store = opener(encryption=ring("k1"))
    ids = fill(store)

    def flip(tx: Any) -> None:  # a byte of every chunk of the log, the last one's too
        for key, row in tx.all("SELECT hash, data FROM pitstop_blobs WHERE location IS NULL"):
            data = bytes(row)
            if len(data) > 1000:
                altered = data[:-20] + bytes([data[-20] ^ 1]) + data[-19:]
                tx.run("UPDATE pitstop_blobs SET data = ? WHERE hash = ?", (altered, key))

    store._tx(flip, write=True)  # type: ignore[attr-defined]
    with opener(encryption=ring("k1")) as fresh:
        with pytest.raises(CorruptCheckpointError, match="fails authentication"):
            fresh.get(ids[-1])
        assert any("fails authentication" in p.message for p in fresh.verify())


def test_a_memory_store_refuses_encryption() -> None:
    """Nothing of it is at rest: refused, not silently dropped."""
    with pytest.raises(pitstop.UnsupportedStoreError, match="nothing at rest"):
        pitstop.open_store("memory://", encryption=ring("k1"))


def test_export_opens_the_state_and_import_seals_it_again(
    opener: Callable[..., pitstop.Store], tmp_path: Path
) -> None:
    """An archive of a sealed store is plaintext (portable to any store); imported into a
    sealed store, its inline values and rows are sealed again."""
    source = opener(encryption=ring("k1"))
    ids = fill(source)
    data = source.export_run("r")
    with pitstop.open_store(f"sqlite:///{tmp_path / 'plain.db'}") as plain:
        plain.import_run(data)
        check(plain, ids)
        assert plain.verify() == []
    sealed_url = f"sqlite:///{tmp_path / 'sealed.db'}"
    with pitstop.open_store(sealed_url, blobs=str(tmp_path / "b2"),
                            encryption=ring("k2")) as sealed:
        sealed.import_run(data)
        check(sealed, ids)
        assert sealed.verify() == []
    assert leaks(raw_rows(sealed_url)) == []


def test_a_value_just_under_the_threshold_is_sealed_wherever_it_goes(
    opener: Callable[..., pitstop.Store], shared_url: str, tmp_path: Path
) -> None:
    """Sealed, a value a few bytes under ``blob_threshold`` is over it: it goes to the blob
    store (sealed there again) and reads back; nothing of it is plaintext anywhere."""
    store = opener(encryption=ring("k1"), blob_threshold=100_000)
    value = TEXT.encode() + os.urandom(100_000 - 21 - len(TEXT))  # a chunk: 20 bytes under
    saved = store.save("r", {"v": value})
    external = store._tx(lambda tx: tx.all(  # type: ignore[attr-defined]
        "SELECT size FROM pitstop_blobs WHERE location IS NOT NULL"))
    assert [size for (size,) in external] == [100_000 - 20 + 48]  # sealed once, here
    with opener(encryption=ring("k1"), blob_threshold=100_000) as fresh:
        assert fresh.get(saved.id).state["v"] == value
        assert fresh.verify() == []
    assert leaks(raw_rows(shared_url)) == []
    for path in (tmp_path / "blobs").rglob("*"):
        assert not path.is_file() or TEXT.encode() not in path.read_bytes()


def whole_value_keys(url: str) -> set[bytes]:
    """The content keys of the whole values (not chunks: 32 bytes) in a store's table."""
    return {data for table, column, data in raw_rows(url)
            if table == "pitstop_blobs" and column == "hash" and len(data) == 32}


def plain_hashes(tmp_path: Path) -> set[bytes]:
    """The SHA-256 content keys of :func:`fill`'s whole values, as a plain store has them."""
    url = f"sqlite:///{tmp_path / 'plain-keys.db'}"
    with pitstop.open_store(url) as plain:
        fill(plain)
    found = whole_value_keys(url)
    assert found  # ("doc", at least)
    return found


def found_anywhere(url: str, wanted: set[bytes]) -> list[tuple[str, str]]:
    return sorted({(table, column) for table, column, data in raw_rows(url)
                   if any(key in data for key in wanted)})


def test_whole_values_are_under_keyed_addresses(
    opener: Callable[..., pitstop.Store], shared_url: str, tmp_path: Path
) -> None:
    """No plain SHA-256 of a whole value of the state is anywhere in a sealed store (the
    value table's keys, the field maps): someone reading it cannot confirm a guess of a
    value from its key. The same value under another key ring has another address."""
    plain = plain_hashes(tmp_path)
    store = opener(encryption=ring("k1"))
    ids = fill(store)
    assert found_anywhere(shared_url, plain) == []
    addressed = whole_value_keys(shared_url)
    assert len(addressed) == len(plain)  # deduplicated as before
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    with pitstop.open_store(other_url, encryption=ring("k2")) as other:
        fill(other)
    assert not addressed & whole_value_keys(other_url)
    before = len(whole_value_keys(shared_url))
    store.save("r", store.get(ids[-1]).state)  # unchanged: no new row
    assert len(whole_value_keys(shared_url)) == before
    with opener(encryption=ring("k1")) as fresh:
        check(fresh, ids)
        assert fresh.verify() == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_export_carries_plain_keys_and_an_import_addresses_them_again(
    opener: Callable[..., pitstop.Store], tmp_path: Path, stream: bool
) -> None:
    """An archive of a sealed store has every value under its SHA-256 (any store can check
    it); imported into a plain store it verifies, into a store sealed with another key its
    values get that store's addresses."""
    plain = plain_hashes(tmp_path)
    source = opener(encryption=ring("k1"))
    ids = fill(source)
    out = io.BytesIO()
    if stream:
        archive.write_archive(source, "r", out)
    else:
        exported = source.export_run("r")
        exported.verify()
        archive._write(exported, source, out, None)
    _, data = archive.read_archive(io.BytesIO(out.getvalue()))
    assert {key for key in data.blobs if len(key) == 32} <= plain
    plain_url = f"sqlite:///{tmp_path / 'into-plain.db'}"
    with pitstop.open_store(plain_url) as into_plain:
        into_plain.import_run(data)
        check(into_plain, ids)
        assert into_plain.verify() == []
    sealed_url = f"sqlite:///{tmp_path / 'into-sealed.db'}"
    with pitstop.open_store(sealed_url, blobs=str(tmp_path / "b2"),
                            encryption=ring("k2")) as sealed:
        _, data = archive.read_archive(io.BytesIO(out.getvalue()))
        sealed.import_run(data)
        check(sealed, ids)
        assert sealed.verify() == []
        sealed.save("r", {**sealed.get(ids[-1]).state, "note": "after import"})
        assert sealed.verify() == []
    assert found_anywhere(sealed_url, plain) == []
    assert leaks(raw_rows(sealed_url)) == []


def test_a_save_after_rotation_and_rekey(
    opener: Callable[..., pitstop.Store], shared_url: str, tmp_path: Path
) -> None:
    """Values addressed under k1 read and verify once k1 has left the ring (the seal under
    k2 binds the address); a save after the rotation (new values under k2's addresses)
    reads back, verifies and exports to a plain store."""
    plain = plain_hashes(tmp_path)
    ids = fill(opener(encryption=ring("k1")))
    with opener(encryption=ring("k2", "k1")) as both:
        assert rekey(both, "k2") > 0
    with opener(encryption=ring("k2")) as store:
        check(store, ids)
        assert store.verify() == []
        state = store.get(ids[-1]).state
        saved = store.save("r", {**state, "doc": f"{TEXT} rotated " * 40}).id
        assert store.get(saved).state["doc"] == f"{TEXT} rotated " * 40
        assert store.get(ids[0]).state["doc"] == f"{TEXT} " * 40
        assert store.verify() == []
        data = store.export_run("r")
    assert found_anywhere(shared_url, plain) == []
    with pitstop.open_store(f"sqlite:///{tmp_path / 'plain.db'}") as into_plain:
        into_plain.import_run(data)
        assert into_plain.get(saved).state["doc"] == f"{TEXT} rotated " * 40
        assert into_plain.verify() == []
