"""The content addresses of chunks in a sealed store, on SQLite and PostgreSQL: keyed, so that
no one without the key can compute a chunk's key from a guess of it, nor see that two stores
hold the same chunk; equal chunks in one store still deduplicate; a key rotation, ``rekey``
and export/import (to a store with other keys, or none) keep every chunk readable."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import Encryption

pytest.importorskip("cryptography")

from pitstop.serde import chunks as chunking
from pitstop.serde.chunkkeys import (
    KEY_KEYED,
    KEY_XXH3,
    ChunkKeys,
    chunk_key,
    is_keyed,
)
from pitstop.store.encoding.records import decode_field_map
from pitstop.store.engine.rekey import rekey

np = pytest.importorskip("numpy")
K1, K2, K3 = os.urandom(32), os.urandom(32), os.urandom(32)
MESSAGES = [f"message {i}: " + os.urandom(90).hex() for i in range(300)]  # ~57 kB: a list
TABLE = {f"user-{i}": {"n": i, "note": f"typed by user {i}"} for i in range(2000)}  # ~nodes
DOC = os.urandom(60_000)  # bytes: one chunk, a row of the table
WEIGHTS = np.random.default_rng(5).standard_normal(1 << 19, dtype=np.float32)  # 2 MiB: blobs


def ring(*ids: str) -> Encryption:
    every = {"k1": K1, "k2": K2, "k3": K3}
    return Encryption(keys={i: every[i] for i in ids}, current=ids[0])


def state() -> dict[str, Any]:
    return {"messages": list(MESSAGES), "table": dict(TABLE), "doc": DOC, "w": WEIGHTS}


@pytest.fixture
def opener(open_shared: Callable[..., pitstop.Store], tmp_path: Path
           ) -> Callable[..., pitstop.Store]:
    return functools.partial(open_shared, blobs=str(tmp_path / "blobs"), blob_threshold=200_000)


def stored_chunk_keys(store: pitstop.Store) -> set[bytes]:
    """Every chunk key of the value table, and every chunk key in a manifest's root."""
    def read(tx: Any) -> set[bytes]:
        out = {bytes(h) for (h,) in tx.all("SELECT hash FROM pitstop_blobs")}
        for (fields,) in tx.all("SELECT fields FROM pitstop_checkpoints"):
            for ref in decode_field_map(bytes(fields)).values():
                if ref.manifest is not None:
                    out.update(e.key for e in chunking.decode_manifest(ref.manifest).root)
        return {key for key in out if len(key) == chunking.KEY_SIZE}

    return store._tx(read)  # type: ignore[attr-defined, no-any-return]


def guesses(fmt: int = 0) -> set[bytes]:
    """The chunk keys anyone can compute from the plaintext alone (no key): every chunk and
    node the chunker makes of each value, at every cut a store uses."""
    from pitstop.serde.codec import MsgpackSerializer

    dumps = MsgpackSerializer().dumps
    out: set[bytes] = set()
    for value in state().values():
        for params in (chunking.DICT_PARAMS, chunking.SEALED_DICT_PARAMS):
            split = chunking.split(value, dumps, ChunkKeys(fmt), dict_params=params)
            assert split is not None
            out |= set(split.new) | split.layout.keys()
    return out


def rows(store: pitstop.Store) -> int:
    return int(store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.one("SELECT COUNT(*) FROM pitstop_blobs")[0]))


def packs(tmp_path: Path) -> set[Path]:
    return set((tmp_path / "blobs").rglob("*.pack"))


def test_a_chunk_key_cannot_be_computed_from_a_guess_nor_matched_across_stores(
    opener: Callable[..., pitstop.Store], tmp_path: Path,
) -> None:
    guessed = guesses()
    # Without encryption the leak is there: the guessed keys are the stored ones.
    with pitstop.open_store(f"sqlite:///{tmp_path / 'plain.db'}", blobs=str(tmp_path / "pb"),
                            blob_threshold=200_000) as plain:
        plain.save("r", state())
        assert stored_chunk_keys(plain) <= guessed
    sealed = opener(encryption=ring("k1"))
    saved = sealed.save("r", state())
    keys = stored_chunk_keys(sealed)
    assert keys and all(key[0] == KEY_KEYED for key in keys)
    assert not keys & guessed  # not one chunk, node or root entry confirms a guess
    # equal chunks under another key: other addresses
    with pitstop.open_store(f"sqlite:///{tmp_path / 'other.db'}", blobs=str(tmp_path / "ob"),
                            blob_threshold=200_000, encryption=ring("k2")) as other:
        other.save("r", state())
        assert not stored_chunk_keys(other) & keys
    with opener(encryption=ring("k1")) as fresh:
        got = fresh.get(saved.id).state
        assert got["messages"] == MESSAGES and got["table"] == TABLE and got["doc"] == DOC
        np.testing.assert_array_equal(got["w"], WEIGHTS)
        assert fresh.verify() == []


def test_equal_chunks_in_a_sealed_store_are_stored_once(
    opener: Callable[..., pitstop.Store], tmp_path: Path,
) -> None:
    opener(encryption=ring("k1")).save("a", state())
    held, written = rows(opener()), packs(tmp_path)
    with opener(encryption=ring("k1")) as fresh:  # no layout in memory: found by their keys
        fresh.save("a", state())  # an unchanged re-save: its keys are the parent's
        assert rows(fresh) == held and packs(tmp_path) == written
        fresh.save("b", state())  # another run: every chunk found by its key
        assert rows(fresh) == held  # not one new chunk, node or value
        again = fresh.save("b", {**state(), "messages": [*MESSAGES, "one more"]})
        assert rows(fresh) - held <= 3  # the last chunk, a node or two
        assert fresh.get(again.id).state["messages"][-1] == "one more"


def test_a_rotation_keys_new_chunks_under_the_new_key_and_rekey_keeps_them_readable(
    opener: Callable[..., pitstop.Store], tmp_path: Path,
) -> None:
    first = opener(encryption=ring("k1")).save("a", state())
    under_k1 = stored_chunk_keys(opener())
    rotated = opener(encryption=ring("k2", "k1"))
    assert rotated.get(first.id).state["table"] == TABLE  # keyed under k1, read under k2's
    second = rotated.save("b", state())  # written again once, under k2's keys
    under_k2 = stored_chunk_keys(rotated) - under_k1
    assert under_k2 and not under_k2 & guesses()
    held = rows(rotated)
    third = rotated.save("c", state())
    assert rows(rotated) == held  # and deduplicated from then on
    assert rekey(rotated, "k2") > 0
    with opener(encryption=ring("k2")) as only_k2:  # k1 gone: authenticated, not hashed
        for saved in (first, second, third):
            got = only_k2.get(saved.id).state
            assert got["messages"] == MESSAGES and got["table"] == TABLE
            np.testing.assert_array_equal(got["w"], WEIGHTS)
        assert only_k2.verify() == []
        assert only_k2.save("d", state()) and rows(only_k2) == held  # k2's keys: found


@pytest.mark.parametrize("stream", [False, True])
def test_an_export_carries_plain_keys_and_an_import_keys_them_again(
    opener: Callable[..., pitstop.Store], tmp_path: Path, stream: bool,
) -> None:
    source = opener(encryption=ring("k1"))
    source.save("r", state())
    saved = source.save("r", {**state(), "messages": [*MESSAGES, "later"]})
    data = source.export_run("r", stream=stream)
    archived = {key for key in data.blobs if len(key) == chunking.KEY_SIZE}
    assert archived and not any(is_keyed(key) for key in archived)  # no key of k1 travels
    for record in data.checkpoints:
        for ref in record.field_map().values():
            if ref.manifest is not None:
                assert all(e.key[0] == KEY_XXH3
                           for e in chunking.decode_manifest(ref.manifest).root)
    data.verify()
    source_keys = stored_chunk_keys(source)

    def check(store: pitstop.Store) -> None:
        got = store.get(saved.id).state
        assert got["messages"] == [*MESSAGES, "later"] and got["table"] == TABLE
        assert got["doc"] == DOC
        np.testing.assert_array_equal(got["w"], WEIGHTS)
        assert store.verify() == []

    with pitstop.open_store(f"sqlite:///{tmp_path / 'plain.db'}", blobs=str(tmp_path / "pb"),
                            blob_threshold=200_000) as plain:
        plain.import_run(data)
        check(plain)
        assert all(key[0] == KEY_XXH3 for key in stored_chunk_keys(plain))
    with pitstop.open_store(f"sqlite:///{tmp_path / 'sealed.db'}", blobs=str(tmp_path / "sb"),
                            blob_threshold=200_000, encryption=ring("k2")) as other:
        other.import_run(data)
        check(other)
        keys = stored_chunk_keys(other)
        assert all(key[0] == KEY_KEYED for key in keys) and not keys & source_keys
        held = rows(other)
        # An imported chunk is found by a save's keys (an array's, cut at fixed offsets; a
        # list or dict is cut where this store's key says, so a new save cuts it anew).
        other.save("again", {"w": WEIGHTS, "doc": DOC})
        assert rows(other) == held


def test_an_archive_file_of_a_sealed_store_round_trips(
    opener: Callable[..., pitstop.Store], tmp_path: Path,
) -> None:
    from pitstop.archive import import_archive, read_archive, write_archive

    source = opener(encryption=ring("k1"))
    saved = source.save("r", state())
    path = tmp_path / "r.pitstop"
    write_archive(source, "r", path)
    raw = path.read_bytes()
    assert not any(key in raw for key in stored_chunk_keys(source))
    with pitstop.open_store(f"sqlite:///{tmp_path / 'sealed.db'}", blobs=str(tmp_path / "sb"),
                            blob_threshold=200_000, encryption=ring("k3")) as other:
        import_archive(other, read_archive(path)[1])
        assert other.get(saved.id).state["table"] == TABLE
        assert other.verify() == []


def test_chunk_keys_check_under_every_key_of_the_ring() -> None:
    fmt = 0
    k1 = ring("k1").chunk_keys(fmt)
    both = ring("k2", "k1").chunk_keys(fmt)
    raw = b"a chunk of a list"
    keyed = k1(raw)
    assert keyed[0] == KEY_KEYED and keyed != chunk_key(fmt, raw)
    assert keyed == k1.keyed_from(chunk_key(fmt, raw))
    assert both(raw) != keyed  # new chunks: under the current key
    assert both.check(keyed, fmt, raw) and k1.check(keyed, fmt, raw)
    assert not ring("k2").chunk_keys(fmt).check(keyed, fmt, raw)
    assert not k1.check(keyed, fmt, raw + b"!")
    assert not ChunkKeys(fmt).check(keyed, fmt, raw)  # no secret: no keyed check
    assert ChunkKeys(fmt).check(chunk_key(fmt, raw), fmt, raw)
