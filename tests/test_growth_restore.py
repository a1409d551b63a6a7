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
from pitstop.store.records import decode_field_map


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
                nodes[bytes(h)] = bytes(data)[1:]
                pending += [e.key for e in chunking.unpack_entries(bytes(data)[1:]) if e.is_node]
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
def test_a_damaged_leaf_is_named_by_the_process_that_knows_the_layout(
    open_store: Callable[..., Store],
) -> None:
    store = open_store()
    _conversation(store)
    head = store.latest("conv")
    assert head is not None
    leaves, _ = _layout_keys(store, head.id)
    _damage(store, leaves[len(leaves) // 2])
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as info:
        store.latest("conv")
    assert (info.value.run_id, info.value.field) == ("conv", "messages")
    assert info.value.checkpoint_id == head.id


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
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
