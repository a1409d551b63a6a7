"""Restoring a chunked value (issue #12: a restore within 3x an ``unpackb`` of the same list):
a process that knows the value's layout (it wrote or read it) checks the leaves in a few
tight loops and does not decode the index nodes again; one that does not walks the nodes.
Either way every chunk used is checked, and a damaged one is named."""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

import pytest

from pitstop import CorruptCheckpointError, Store
from pitstop.serde import chunks as chunking
from pitstop.serde import unframe
from pitstop.store.encoding.records import decode_field_map


def _conversation(store: Store, turns: int = 150) -> list[dict[str, Any]]:
    rng = random.Random(9)
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs.append({"i": i, "content": "".join(rng.choices(string.ascii_letters, k=2048))})
        store.save("conv", {"messages": msgs})
    return msgs


def _layout_keys(store: Store, checkpoint_id: str) -> tuple[list[bytes], list[bytes]]:
    """The value's (leaf keys, node keys), from rows alone."""

    def read(tx: Any) -> tuple[list[bytes], list[bytes]]:
        fields = tx.one("SELECT fields FROM pitstop_checkpoints WHERE id = ?", (checkpoint_id,))
        manifest = decode_field_map(bytes(fields[0]))["messages"].manifest
        root = chunking.decode_manifest(manifest).root
        nodes: dict[bytes, bytes] = {}
        pending = [e.key for e in root if e.is_node]
        while pending:
            rows = tx.all(
                "SELECT hash, data FROM pitstop_blobs WHERE hash IN ({})".format(
                    ", ".join("?" * len(pending))
                ),
                pending,
            )
            pending = []
            for h, data in rows:
                nodes[bytes(h)] = raw = unframe(bytes(data))[1]  # compressed on PostgreSQL
                pending += [e.key for e in chunking.unpack_entries(raw) if e.is_node]
        leaves = chunking.expand(root, nodes)
        return [e.key for e in leaves], list(nodes)

    return store._tx(read)  # type: ignore[attr-defined,no-any-return]


def _damage(store: Store, key: bytes) -> None:
    def rot(tx: Any) -> None:
        data, alias = tx.one("SELECT data, alias FROM pitstop_blobs WHERE hash = ?", (key,))
        target = key if alias is None else bytes(alias)
        if alias is not None:
            data = tx.one("SELECT data FROM pitstop_blobs WHERE hash = ?", (target,))[0]
        data = bytes(data)
        tx.run("UPDATE pitstop_blobs SET data = ? WHERE hash = ?",
               (data[:5] + bytes([data[5] ^ 1]) + data[6:], target))

    store._tx(rot, write=True)  # type: ignore[attr-defined]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_known_layout_and_a_fresh_process_restore_the_same(
    open_store: Callable[..., Store],
) -> None:
    writer = open_store()
    msgs = _conversation(writer)
    head = writer.latest("conv")
    assert head is not None and head.state["messages"] == msgs  # the layout is known here
    reader = open_store()  # another handle: knows nothing, walks the nodes
    assert reader.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    assert reader.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_fresh_process_unpacks_each_node_once_to_find_the_next_level(
    open_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that does not know the layout reads the tree a level per query, finding the
    next level from the nodes it has: each node is unpacked once for that, not again at
    every level below it, and once more by the decode. Counted, not timed."""
    writer = open_store()
    msgs = _conversation(writer)
    head = writer.latest("conv")
    assert head is not None
    _leaves, nodes = _layout_keys(writer, head.id)
    assert nodes
    unpacked: list[bytes] = []
    unpack_entries = chunking.unpack_entries

    def counting(data: bytes) -> list[chunking.Entry]:
        unpacked.append(data)
        return unpack_entries(data)

    monkeypatch.setattr(chunking, "unpack_entries", counting)
    reader = open_store()  # knows no layout
    assert reader.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    assert len(unpacked) <= 2 * len(nodes), (len(unpacked), len(nodes))


@pytest.mark.parametrize("store_url", ["sqlite", "memory", "postgres"], indirect=True)
def test_a_list_of_extension_values_restores_a_group_of_leaves_at_a_time(
    open_store: Callable[..., Store], store_url: str
) -> None:
    import datetime

    writer = open_store()
    rng = random.Random(3)
    msgs: list[Any] = []
    for i in range(120):
        text = "".join(rng.choices(string.ascii_letters, k=2048))
        msgs.append({"i": (i, {i}), "at": datetime.date(2026, 1, 1 + i % 28), "content": text})
        writer.save("conv", {"messages": msgs})
    assert writer.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    if store_url != "memory://":  # another handle: no layout known, the nodes walked
        assert open_store().latest("conv").state["messages"] == msgs  # type: ignore[union-attr]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_an_unregistered_class_late_in_a_list_is_named_after_its_rows_were_freed(
    open_store: Callable[..., Store],
) -> None:
    import dataclasses

    from pitstop import SerializationError
    from pitstop.serde import MsgpackSerializer, TypeRegistry

    @dataclasses.dataclass
    class Note:
        text: str

    registry = TypeRegistry()
    registry.register(Note, name="tests.Note")
    writer = open_store(serializer=MsgpackSerializer(registry=registry))
    msgs: list[Any] = _conversation(writer, turns=100)
    msgs.append({"i": 100, "content": Note("late")})  # in the last group of leaves
    writer.save("conv", {"messages": msgs})
    assert writer.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    reader = open_store()  # knows no Note: the groups before it were decoded and freed
    with pytest.raises(SerializationError) as info:
        reader.latest("conv")
    assert "[100]" in (info.value.path or ""), info.value  # where, as a whole decode says
    lenient = reader.latest("conv", strict=False)
    assert lenient is not None and lenient.state["messages"][:100] == msgs[:100]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_damaged_leaf_is_named_by_the_process_that_knows_the_layout(
    open_store: Callable[..., Store],
) -> None:
    store = open_store()
    _conversation(store)
    head = store.latest("conv")
    assert head is not None
    leaves, _ = _layout_keys(store, head.id)
    _damage(store, leaves[len(leaves) // 2])
    # A compressed chunk (PostgreSQL) may fail to decompress before its hash is checked.
    with pytest.raises(CorruptCheckpointError, match=r"checksum mismatch|compressed") as info:
        store.latest("conv")
    assert (info.value.run_id, info.value.field) == ("conv", "messages")
    assert info.value.checkpoint_id == head.id


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("store_url", ["sqlite", "memory", "postgres"], indirect=True)
def test_a_damaged_leaf_is_named_wherever_the_one_pass_decode_meets_it(
    open_store: Callable[..., Store], where: str
) -> None:
    """SQLite checks and decodes a leaf at a time, dropping each row once decoded: damage
    in the first leaf stops it before any row is dropped, later damage after some are; the
    restore then reads the rows again and names the damaged chunk either way."""
    store = open_store()
    _conversation(store, turns=80)
    head = store.latest("conv")
    assert head is not None
    leaves, _ = _layout_keys(store, head.id)
    _damage(store, leaves[{"first": 0, "middle": len(leaves) // 2, "last": -1}[where]])
    with pytest.raises(CorruptCheckpointError, match=r"checksum mismatch|compressed") as info:
        store.latest("conv")
    assert (info.value.run_id, info.value.field, info.value.checkpoint_id) == (
        "conv", "messages", head.id)
    with pytest.raises(CorruptCheckpointError, match=r"checksum mismatch|compressed"):
        store.latest_with_run("conv")


def test_list_from_rows_checks_every_row_and_drops_each_once_decoded() -> None:
    """The one-pass decode of a list's leaves from their rows (SQLite's path): the list and
    its format when every row is a plain row that matches its key; None for a row altered,
    compressed, missing or of another format, for the per-chunk path to read and name.
    ``consume`` empties the caller's rows, unless a chunk is used twice."""
    from pitstop.serde import MsgpackSerializer, frame
    from pitstop.store.encoding.leafrows import list_from_rows

    ser = MsgpackSerializer()
    rng = random.Random(6)
    msgs = [{"i": i, "content": "".join(rng.choices(string.ascii_letters, k=900))}
            for i in range(300)]
    cut = chunking.split(msgs, ser.dumps, ser.format_id)
    assert cut is not None
    leaves = cut.layout.leaves
    assert len(leaves) > 8  # several groups of leaves
    chunks = {key: bytes(raw) for key, raw in cut.new.items()}
    rows = {e.key: frame(chunks[e.key], ser.format_id, compress_threshold=None,
                         checksum=False) for e in leaves}
    readers = {ser.format_id: ser}
    mine = dict(rows)
    assert list_from_rows(readers, leaves, mine, strict=True, consume=True) == (
        ser.format_id, msgs)
    assert mine == {}
    twice = [*leaves, leaves[0]]  # a chunk used twice: the rows are kept
    mine = dict(rows)
    found = list_from_rows(readers, twice, mine, strict=True, consume=True)
    assert found == (ser.format_id, msgs + msgs[: leaves[0].items]) and mine == rows
    assert list_from_rows(readers, [], rows, strict=True) is None
    for key in (leaves[0].key, leaves[len(leaves) // 2].key, leaves[-1].key):
        data = rows[key]
        for bad in (data[:-1] + bytes([data[-1] ^ 1]),  # altered
                    frame(chunks[key], ser.format_id, compress_threshold=1, checksum=False),
                    bytes([7]) + data[1:]):  # another format
            assert list_from_rows(readers, leaves, {**rows, key: bad}, strict=True) is None
        missing = {k: v for k, v in rows.items() if k != key}
        assert list_from_rows(readers, leaves, missing, strict=True, consume=True) is None


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_loads_rows_are_read_alike_plain_aliased_in_files_or_missing(
    open_store: Callable[..., Store], tmp_path: Any
) -> None:
    """A load reads plain rows by a statement of two columns (SQLite) and the others (an
    alias of a grown chunk's prefix, a value in the blob directory) the general way: the
    same rows as the general read, and nothing for a key not stored."""
    store = open_store(blobs=str(tmp_path / "blobs"), blob_threshold=100_000)
    _conversation(store, turns=40)
    store.save("big", {"blob": random.Random(2).randbytes(300_000)})
    keys = store._tx(  # type: ignore[attr-defined]
        lambda tx: [bytes(h) for (h,) in tx.all("SELECT hash FROM pitstop_blobs")])
    kinds = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.all("SELECT alias IS NOT NULL, location IS NOT NULL FROM pitstop_blobs"))
    assert any(a for a, _ in kinds) == store.rewrites_in_place  # type: ignore[attr-defined]
    assert any(f for _, f in kinds)
    wanted = [*keys, b"\x01" + bytes(16), keys[0]]  # one not stored, one asked twice

    def both(tx: Any) -> tuple[dict[bytes, Any], dict[bytes, bytes]]:
        return (store._read_values_deferred(tx, wanted),  # type: ignore[attr-defined]
                store._read_values(tx, wanted))  # type: ignore[attr-defined]

    deferred, plain = store._tx(both)  # type: ignore[attr-defined]
    assert set(deferred) == set(plain) == set(keys)
    for key, data in deferred.items():
        assert (data if type(data) is bytes else data.read()) == plain[key]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_known_layout_restores_from_its_leaves_alone_in_one_query(
    open_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process that knows the layout reads the leaves' rows and no node's, in one
    statement; should it forget the layout between the read and the decode (another
    thread's values pushing it out), the restore reads everything again rather than call
    the absent node rows missing."""
    store = open_store()
    msgs = _conversation(store)
    head = store.latest("conv")
    assert head is not None
    leaves, nodes = _layout_keys(store, head.id)
    assert nodes
    reads: list[list[bytes]] = []
    read_rows = store._read_values_deferred  # type: ignore[attr-defined]

    def counting(tx: Any, hashes: Any) -> Any:
        reads.append(list(hashes))
        return read_rows(tx, hashes)

    monkeypatch.setattr(store, "_read_values_deferred", counting)
    assert store.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    assert len(reads) == 1 and set(reads[0]) == set(leaves)  # no node, one statement

    def forgetting(tx: Any, hashes: Any) -> Any:
        found = counting(tx, hashes)
        store._value_codec._layouts.clear()  # type: ignore[attr-defined]
        return found

    reads.clear()
    monkeypatch.setattr(store, "_read_values_deferred", forgetting)
    assert store.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    assert set(nodes) <= {key for keys in reads for key in keys}  # read again, whole
    _run, latest = store.latest_with_run("conv")
    assert latest is not None and latest.state["messages"] == msgs


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.slow
def test_a_damaged_node_is_found_by_a_fresh_process_and_verify(
    open_store: Callable[..., Store],
) -> None:
    store = open_store()
    _conversation(store)
    head = store.latest("conv")
    assert head is not None
    _, nodes = _layout_keys(store, head.id)
    assert nodes
    _damage(store, nodes[0])
    with pytest.raises(CorruptCheckpointError) as info:
        open_store().latest("conv")
    assert info.value.field == "messages"
    assert any(p.kind == "blob" for p in store.verify())


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_list_chunks_are_compressed_where_every_row_is_kept_and_it_pays(
    open_store: Callable[..., Store],
) -> None:
    """On PostgreSQL (each save's items a row of their own, never rewritten) a list's chunks
    are stored compressed when zstd shrinks them: text does, random bytes do not. Elsewhere
    they are stored as they are (a restore joins them, an open chunk becomes a prefix).
    A restore of a mix of both reads, checks and joins them in one pass."""
    from pitstop.serde.framing import is_compressed

    store = open_store()
    rng = random.Random(4)
    items: list[Any] = []
    for i in range(60):
        text = "".join(rng.choices(string.ascii_letters, k=2048))
        items.append(text if i % 3 else rng.randbytes(2048))
        store.save("mix", {"items": items})
    head = store.latest("mix")
    assert head is not None and head.state["items"] == items
    fresh = open_store().latest("mix")  # walks the nodes, then the same pass
    assert fresh is not None and fresh.state["items"] == items

    def rows(tx: Any) -> list[bytes]:
        return [bytes(d) for (h, d) in tx.all("SELECT hash, data FROM pitstop_blobs")
                if len(bytes(h)) == chunking.KEY_SIZE]

    stored = store._tx(rows)  # type: ignore[attr-defined]
    compressed = sum(map(is_compressed, stored))
    if store.rewrites_in_place:  # type: ignore[attr-defined]
        assert compressed == 0
    else:  # about two in three (the text), never the random bytes
        assert len(stored) // 3 < compressed < len(stored)
    assert store.verify() == []


def test_decompress_many_round_trips_and_refuses_a_corrupt_frame() -> None:
    from pitstop.serde.framing import decompress_many, frame

    rng = random.Random(5)
    raws = [("".join(rng.choices(string.ascii_letters, k=n))).encode() for n in (200, 3000)]
    bodies: list[bytes | memoryview] = [
        memoryview(frame(r, 1, compress_threshold=1, checksum=False))[1:] for r in raws
    ]
    assert [bytes(v) for v in decompress_many(bodies)] == raws
    big = [memoryview(frame(raws[1] * 400, 1, compress_threshold=1))[1:]]  # threads
    assert bytes(decompress_many(big)[0]) == raws[1] * 400
    with pytest.raises(ValueError, match="corrupt"):
        decompress_many([b"\x28\xb5\x2f\xfd" + bytes(20)])


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_compression_off_keeps_a_lists_chunks_as_they_are(store_url: str) -> None:
    from pitstop import open_store
    from pitstop.serde.framing import is_compressed

    sep = "&" if "?" in store_url else "?"
    with open_store(f"{store_url}{sep}compress_threshold=none") as store:
        msgs = _conversation(store, turns=20)
        assert store.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
        stored = store._tx(  # type: ignore[attr-defined]
            lambda tx: [bytes(d) for (d,) in tx.all("SELECT data FROM pitstop_blobs")]
        )
        assert not any(map(is_compressed, stored))
