"""A large dict's chunks are stored compressed (issue #12: a dict of thousands of keys is
thousands of small rows). Round trips through every edit, Merge extending the open chunk
(never a prefix alias of a compressed chunk), verify, and a chunk stored uncompressed (by an
earlier pitstop) meeting the same chunk compressed (not a collision)."""

from __future__ import annotations

import random
import string
from typing import Any

from pitstop import Merge, Store
from pitstop.serde import unframe
from pitstop.serde.framing import is_compressed
from pitstop.store.encoding.records import is_chunk_key


def _text(rng: random.Random, n: int = 100) -> str:
    return "".join(rng.choices(string.ascii_letters + "  .,", k=n))


def _docs(rng: random.Random, n: int = 3000) -> dict[str, str]:
    return {f"doc-{i:05d}": _text(rng) for i in range(n)}


def _chunk_rows(store: Store) -> list[tuple[bytes, bytes, Any]]:
    rows = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.all("SELECT hash, data, alias FROM pitstop_blobs")
    )
    return [(bytes(h), bytes(d), a) for h, d, a in rows if is_chunk_key(bytes(h))]


def test_dict_chunks_are_compressed_and_round_trip(store: Store) -> None:
    rng = random.Random(1)
    docs = _docs(rng)
    first = store.save("d", {"docs": docs})
    rows = _chunk_rows(store)
    assert rows and sum(is_compressed(d) for _, d, _ in rows) > len(rows) // 2
    raw = len(store.serializer.dumps(docs))
    assert store.stats().bytes < raw  # compressed, overheads included
    keys = list(docs)
    for step in range(30):
        key = keys[rng.randrange(len(keys))]
        if step % 3 == 0:
            docs[key] = _text(rng)  # a new value
        elif step % 3 == 1:
            del docs[key]  # a deletion
            keys.remove(key)
        else:
            docs[f"new-{step}"] = _text(rng)  # a new key, last
            keys.append(f"new-{step}")
        store.save("d", {"docs": docs})
    latest = store.latest("d")
    assert latest is not None and latest.state["docs"] == docs
    assert list(latest.state["docs"]) == list(docs)  # order kept
    assert store.get(first.id).state["docs"] != docs  # the first version is its own
    assert store.verify() == []


def test_in_place_edit_of_a_nested_value_is_stored(store: Store) -> None:
    rng = random.Random(2)
    docs: dict[str, Any] = {f"k{i}": {"text": _text(rng), "n": i} for i in range(2500)}
    before = store.save("d", {"docs": docs})
    docs["k10"]["text"] = "edited in place"  # the same dict object: identity proves nothing
    after = store.save("d", {"docs": docs})
    assert store.get(after.id).state["docs"]["k10"]["text"] == "edited in place"
    assert store.get(before.id).state["docs"]["k10"]["text"] != "edited in place"
    assert (store.history("d", limit=1)[0].added or 0) < 8192  # a chunk or two and the tree


def test_merge_extending_the_open_chunk_makes_no_prefix_of_a_compressed_one(
    store: Store,
) -> None:
    rng = random.Random(3)
    docs = _docs(rng, 2000)
    store.save("d", {"docs": docs})
    for i in range(40):  # new keys land in the open last chunk, which each Merge extends
        update = {f"z{i:03d}": _text(rng, 40)}
        docs.update(update)
        store.save("d", {"docs": Merge(update)})
    compressed = {h for h, d, _ in _chunk_rows(store) if d and is_compressed(d)}
    aliased_to = {bytes(a) for _, _, a in _chunk_rows(store) if a is not None}
    assert not aliased_to & compressed
    for summary in store.history("d", limit=None)[::7]:
        assert store.get(summary.id).state["docs"].items() <= docs.items()
    assert store.latest("d").state["docs"] == docs  # type: ignore[union-attr]
    assert store.verify() == []


def test_a_chunk_stored_uncompressed_is_the_same_chunk(store: Store) -> None:
    """A store written before dict chunks were compressed holds them uncompressed; the same
    chunk made now (compressed) is the same content, not a collision."""
    rng = random.Random(4)
    docs = _docs(rng)
    store.save("old", {"docs": docs})
    fmt = store.serializer.format_id

    rows = _chunk_rows(store)

    def decompress_all(tx: Any) -> None:
        for key, data, _ in rows:
            if data and is_compressed(data):
                plain = bytes((fmt,)) + unframe(data)[1]
                tx.run("UPDATE pitstop_blobs SET data = ?, size = ? WHERE hash = ?",
                       (plain, len(plain), key))

    store._tx(decompress_all, write=True)  # type: ignore[attr-defined]
    assert not any(is_compressed(d) for _, d, _ in _chunk_rows(store) if d)
    store.save("new", {"docs": docs})  # every chunk key is present already
    docs["doc-00001"] = "changed"
    store.save("new", {"docs": docs})
    assert store.latest("new").state["docs"] == docs  # type: ignore[union-attr]
    assert store.latest("old").state["docs"]["doc-00001"] != "changed"  # type: ignore[union-attr]
    assert store.verify() == []



def test_dicts_are_cut_larger_where_every_row_is_kept(store: Store) -> None:
    """On PostgreSQL (every row version kept: no rewrite in place) a dict's chunks average
    ~1 KiB, elsewhere ~512 B; a Merge re-chunks at the same sizes."""
    from pitstop.serde import chunks

    rng = random.Random(3)
    docs = _docs(rng, 4000)
    params = (
        chunks.DICT_PARAMS
        if store.rewrites_in_place  # type: ignore[attr-defined]
        else chunks.SEALED_DICT_PARAMS
    )

    def mean_chunk(checkpoint_id: str) -> float:
        ref = store._parent(checkpoint_id).fields["docs"]  # type: ignore[attr-defined]
        layout = store._value_codec.layout_of(ref)  # type: ignore[attr-defined]
        return float(layout.size / len(layout.leaves))

    first = store.save("d", {"docs": docs})
    assert params.target / 2 < mean_chunk(first.id) < params.target * 2
    for _ in range(20):
        key, value = f"doc-{rng.randrange(4000):05d}", _text(rng)
        docs[key] = value
        last = store.save("d", {"docs": Merge({key: value})})
    assert params.target / 2 < mean_chunk(last.id) < params.target * 2
    assert store.latest("d").state["docs"] == docs  # type: ignore[union-attr]
    assert store.verify() == []
