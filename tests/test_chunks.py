"""The chunker (pitstop.serde.chunks): chunked values round-trip exactly, edits anywhere share
the untouched chunks with the parent, and the delta path cuts exactly where a whole-value save
would."""

from __future__ import annotations

import random
import string
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pitstop import Append, Merge
from pitstop.delta import dirty_positions
from pitstop.serde import MsgpackSerializer
from pitstop.serde.chunks import (
    BUFFER_CHUNK,
    CUT,
    LIST_PARAMS,
    Layout,
    Split,
    assemble,
    check_chunk,
    decode_manifest,
    expand,
    list_groups,
    sealed,
    split,
    split_delta,
)

SER = MsgpackSerializer()


def text(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(string.ascii_letters + "  ", k=n))


def message(rng: random.Random, size: int = 2048) -> dict[str, Any]:
    return {"role": rng.choice(["user", "assistant"]), "content": text(rng, size)}


def restore(layout: Layout, chunks: dict[bytes, bytes]) -> Any:
    """What a load does: the manifest, the nodes, the leaves, one loads()."""
    manifest = decode_manifest(layout.manifest())
    leaves = expand(manifest.root, chunks)
    assert leaves == layout.leaves
    for leaf in leaves:
        assert check_chunk(leaf.key, 0, chunks[leaf.key])
    out = assemble(manifest.kind, manifest.meta, manifest.items, leaves, chunks)
    if manifest.kind in ("list", "dict"):
        return SER.loads(out)
    return out


def save(value: Any, parent: Layout | None, chunks: dict[bytes, bytes]) -> Layout:
    result = split(value, SER.dumps, SER.format_id, parent)
    assert result is not None
    check_new(result, parent)
    chunks.update(result.new)
    return result.layout


def check_new(result: Split, parent: Layout | None) -> None:
    """Every node of the new tree the parent lacks is written, and no node the parent has;
    a new leaf is the parent's only where a chunk cut afresh equals one elsewhere in it
    (written again, to no effect)."""
    old_nodes = parent.nodes.keys() if parent is not None else set()
    assert result.layout.nodes.keys() - old_nodes <= result.new.keys()
    assert not result.new.keys() & old_nodes
    if parent is not None:
        fresh = {e.key for e in result.layout.leaves}.difference(e.key for e in parent.leaves)
        assert fresh <= result.new.keys()


def test_list_round_trip_and_shape() -> None:
    rng = random.Random(1)
    msgs = [message(rng) for _ in range(300)]
    chunks: dict[bytes, bytes] = {}
    layout = save(msgs, None, chunks)
    assert restore(layout, chunks) == msgs
    assert 10 <= len(layout.leaves) <= 120  # ~16 KiB chunks of ~2 KiB items
    assert layout.leaves[-1].flags & CUT == 0 or layout.items == sum(e.items for e in layout.leaves)
    assert len(layout.root) <= 16


def test_list_groups_decode_to_the_list_a_group_at_a_time() -> None:
    import datetime

    rng = random.Random(4)
    # Items through the extension hook too (tuples, datetimes, bytes): one decoder for all.
    msgs: list[Any] = [
        {"content": text(rng, 2048), "at": datetime.datetime(2026, 1, 1, i % 24), "t": (i, b"x")}
        for i in range(300)
    ]
    chunks: dict[bytes, bytes] = {}
    layout = save(msgs, None, chunks)
    groups = list(list_groups(layout.leaves, chunks))
    assert 4 <= len(groups) < len(layout.leaves)  # ~64 KiB each, not one per leaf
    assert SER._loads_lists(groups) == msgs
    assert SER._loads_lists(list_groups([], chunks)) == []
    with pytest.raises(Exception, match="not a list"):
        SER._loads_lists([SER.dumps({"a": 1})])
    with pytest.raises(Exception, match="msgpack"):  # bytes after the end: refused
        SER._loads_lists([groups[0] + b"\x01"])


def test_append_rewrites_only_the_open_chunk() -> None:
    rng = random.Random(2)
    msgs = [message(rng) for _ in range(200)]
    chunks: dict[bytes, bytes] = {}
    layout = save(msgs, None, chunks)
    for _ in range(50):
        msgs = [*msgs, message(rng)]
        result = split(msgs, SER.dumps, 0, layout)
        assert result is not None
        data = [k for k in result.new if k in {leaf.key for leaf in result.layout.leaves}]
        assert len(data) <= 2  # the open chunk (and the one after a cut)
        assert sum(len(result.new[k]) for k in data) <= LIST_PARAMS.max + 4096
        for old, new, size in result.extended:
            assert result.new[new][:size] == chunks[old]
        chunks.update(result.new)
        layout = result.layout
    assert restore(layout, chunks) == msgs


def test_sealed_growth_writes_each_item_once_and_keeps_records_small() -> None:
    """What a PostgreSQL store does: the parent's open chunk is sealed, so each append is a
    chunk of its own and nothing is rewritten; the root (in every record) stays a few
    entries however many leaves there are, and an append writes O(1) index nodes."""
    rng = random.Random(4)
    msgs = [message(rng) for _ in range(20)]
    chunks: dict[bytes, bytes] = {}
    layout = save(msgs, None, chunks)
    roots = []
    for i in range(600):
        msgs = [*msgs, message(rng)]
        parent = sealed(layout)
        if i % 2:
            delta = Append(msgs[-1:])
            dirty = dirty_positions(msgs, delta, parent.items)
            result = split_delta(parent, msgs, dirty, SER.dumps)
        else:
            whole = split(msgs, SER.dumps, 0, parent)
            assert whole is not None
            result = whole
        assert not result.extended
        data = [k for k in result.new if k not in result.layout.nodes]
        assert len(data) == 1 and len(result.new[data[0]]) < 3000  # the new message alone
        assert len(result.new) - len(data) <= 8  # a few index nodes at most
        chunks.update(result.new)
        layout = result.layout
        roots.append(len(layout.root))
    assert len(layout.leaves) > 550
    assert max(roots) <= 40 and sum(roots) / len(roots) < 10
    assert restore(layout, chunks) == msgs


def test_whole_value_save_checks_for_raw_buffers_only_after_an_unchanged_plain_prefix() -> None:
    """With the serialiser's two-step dumps the chunker scans for bin headers only after
    the prefix it found unchanged, and only when the parent's prefix held none: the layouts
    are those of plain ``dumps``, and a bytearray anywhere keeps its type."""
    rng = random.Random(7)
    msgs: list[Any] = [message(rng) for _ in range(60)]
    chunks: dict[bytes, bytes] = {}
    layout = plain = save(msgs, None, chunks)
    for _ in range(30):
        msgs = [*msgs, message(rng)]
        result = split(msgs, SER.dumps, SER.format_id, sealed(layout), exact=SER)
        reference = split(msgs, SER.dumps, SER.format_id, sealed(plain))
        assert result is not None and reference is not None
        check_new(result, sealed(layout))
        assert result.layout.leaves == reference.layout.leaves
        assert result.new.keys() == reference.new.keys()
        chunks.update(result.new)
        layout, plain = result.layout, reference.layout
        assert layout.prefix is not None and layout.prefix[3]  # random text: no 0xc4-0xc6
        assert plain.prefix is not None and not plain.prefix[3]  # (not checked in two steps)
    assert restore(layout, chunks) == msgs

    # A bytearray appended, or in place of an equal bytes value in the kept prefix: each
    # is found, and loads back a bytearray.
    msgs = [*msgs, {"blob": bytearray(b"appended")}]
    for edit in range(2):
        result = split(msgs, SER.dumps, SER.format_id, sealed(layout), exact=SER)
        assert result is not None
        chunks.update(result.new)
        layout = result.layout
        back = restore(layout, chunks)
        assert back == msgs and type(back[-1]["blob"]) is bytearray
        assert layout.prefix is not None and not layout.prefix[3]
        if edit == 0:
            msgs = list(msgs)
            msgs[3] = {"blob": b"same bytes"}
            result = split(msgs, SER.dumps, SER.format_id, sealed(layout), exact=SER)
            assert result is not None
            chunks.update(result.new)
            layout = result.layout
            msgs = list(msgs)
            msgs[3] = {"blob": bytearray(b"same bytes")}  # equal bytes once packed
    assert type(restore(layout, chunks)[3]["blob"]) is bytearray


def test_two_step_dumps_is_dumps() -> None:
    """``dumps_unchecked`` then ``checked`` give what ``dumps`` gives, and say whether the
    bytes after ``start`` hold a bin header byte."""
    for value in ([1, "text"], {"a": b"\xc4"}, [bytearray(b"x")], [{"b": [bytearray(b"y")]}]):
        packed = SER.dumps_unchecked(value)
        assert packed is not None
        encoded, clean = SER.checked(value, packed, 0)
        assert encoded == SER.dumps(value)
        assert clean == (value == [1, "text"])
        assert type(SER.loads(encoded)) is type(value)
    assert SER.checked([b"x"], SER.dumps([b"x"]), 3) == (SER.dumps([b"x"]), True)
    assert SER.dumps_unchecked((1, 2)) is None  # not a list or dict: dumps alone
    assert SER.dumps_unchecked([{1, 2}]) is None  # not plain data


def test_delta_path_cuts_like_the_whole_value_path() -> None:
    rng = random.Random(3)
    msgs = [message(rng, rng.randint(100, 4000)) for _ in range(150)]
    chunks: dict[bytes, bytes] = {}
    layout = save(msgs, None, chunks)
    for _ in range(30):
        delta = Append([message(rng, rng.randint(10, 3000)) for _ in range(rng.randint(1, 3))])
        new_value = delta.apply(msgs)
        dirty = dirty_positions(new_value, delta, layout.items)
        incremental = split_delta(layout, new_value, dirty, SER.dumps)
        whole = split(new_value, SER.dumps, 0, layout)
        assert whole is not None
        assert incremental.layout.leaves == whole.layout.leaves
        assert incremental.layout.root == whole.layout.root
        chunks.update(incremental.new)
        layout, msgs = incremental.layout, new_value
    assert restore(layout, chunks) == msgs


def test_dict_merge_delta_matches_whole_and_is_small() -> None:
    rng = random.Random(4)
    docs = {f"key-{i:05d}": text(rng, 100) for i in range(10_000)}
    chunks: dict[bytes, bytes] = {}
    layout = save(docs, None, chunks)
    for _ in range(20):
        key = f"key-{rng.randrange(10_000):05d}"
        delta = Merge({key: text(rng, 100), f"new-{rng.random()}": 1})
        new_value = delta.apply(docs)
        dirty = dirty_positions(new_value, delta, layout.items)
        incremental = split_delta(layout, new_value, dirty, SER.dumps)
        whole = split(new_value, SER.dumps, 0, layout)
        assert whole is not None
        assert incremental.layout.leaves == whole.layout.leaves
        # one changed key: its chunk, the last (open) chunk, and a node or two
        assert sum(len(v) for v in incremental.new.values()) < 24 * 1024
        chunks.update(incremental.new)
        layout, docs = incremental.layout, new_value
    assert restore(layout, chunks) == docs


def test_buffers_fixed_chunks_share_untouched_regions() -> None:
    array = np.arange(4 * BUFFER_CHUNK // 4, dtype=np.float32)
    chunks: dict[bytes, bytes] = {}
    layout = save(array, None, chunks)
    assert len(layout.leaves) == 4
    edited = array.copy()
    edited[10:20] = -1
    result = split(edited, SER.dumps, 0, layout)
    assert result is not None
    assert len([k for k in result.new if k in {e.key for e in result.layout.leaves}]) == 1
    chunks.update(result.new)
    back = restore(result.layout, chunks)
    assert back.dtype == edited.dtype and np.array_equal(back, edited)
    for value in (b"x" * 3_000_000, bytearray(b"ab" * 600_000)):
        lay = save(value, None, chunks)
        out = restore(lay, chunks)
        assert out == value and type(out) is type(value)


def test_not_chunked() -> None:
    assert split("text", SER.dumps, 0) is None
    assert split({1: "int key"}, SER.dumps, 0) is None
    assert split({"\ud800": 1}, SER.dumps, 0) is None  # a key msgpack cannot hold as str


# -- property: any edit sequence round-trips and shares chunks -------------------------------

item = st.one_of(
    st.text(max_size=3000),
    st.integers(),
    st.tuples(st.integers(), st.text(max_size=20)),
    st.binary(max_size=2000),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
edit = st.tuples(
    st.sampled_from(["append", "insert", "delete", "edit", "nested"]),
    st.integers(min_value=0),
    item,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32), st.lists(edit, min_size=1, max_size=12))
@pytest.mark.slow
def test_list_edit_sequences_round_trip_and_share(seed: int, edits: list[Any]) -> None:
    rng = random.Random(seed)
    value: list[Any] = [{"n": i, "body": [text(rng, 600)]} for i in range(120)]
    chunks: dict[bytes, bytes] = {}
    layout = save(value, None, chunks)
    for kind, where, new in edits:
        value = [dict(v, body=list(v["body"])) if isinstance(v, dict) and "body" in v else v
                 for v in value]  # a deep enough copy: the parent's value stays as it was
        i = where % (len(value) + 1)
        if kind == "append":
            value.append(new)
        elif kind == "insert":
            value.insert(i, new)
        elif kind == "delete" and value:
            del value[min(i, len(value) - 1)]
        elif kind == "edit" and value:
            value[min(i, len(value) - 1)] = new
        elif kind == "nested" and value:
            target = value[min(i, len(value) - 1)]
            if isinstance(target, dict) and "body" in target:
                target["body"].append("in place")  # identity unchanged, content changed
        parent = layout
        layout = save(value, parent, chunks)
        assert restore(layout, chunks) == value
        if len(parent.leaves) >= 4 and len(layout.leaves) >= 4:
            shared = {e.key for e in layout.leaves} & {e.key for e in parent.leaves}
            assert shared, "a local edit must leave some chunks shared"


@settings(max_examples=30, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32),
    st.lists(st.tuples(st.integers(min_value=0, max_value=4000), st.text(max_size=400)),
             min_size=1, max_size=15),
)
@pytest.mark.slow
def test_dict_edit_sequences_round_trip(seed: int, edits: list[tuple[int, str]]) -> None:
    rng = random.Random(seed)
    value = {f"k{i}": text(rng, 80) for i in range(2000)}
    chunks: dict[bytes, bytes] = {}
    layout = save(value, None, chunks)
    for n, new in edits:
        value = dict(value)
        key = f"k{n}"
        if n % 5 == 0 and key in value:
            del value[key]
        else:
            value[key] = new
        parent = layout
        layout = save(value, parent, chunks)
        assert restore(layout, chunks) == value
        shared = {e.key for e in layout.leaves} & {e.key for e in parent.leaves}
        assert len(shared) >= len(parent.leaves) - 4


@settings(max_examples=25, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32),
    st.lists(st.tuples(st.integers(min_value=0, max_value=3 * BUFFER_CHUNK), st.binary(
        min_size=1, max_size=5000)), min_size=1, max_size=6),
)
@pytest.mark.slow
def test_array_region_edits_round_trip(seed: int, edits: list[tuple[int, bytes]]) -> None:
    array = np.random.default_rng(seed).integers(0, 255, 3 * BUFFER_CHUNK + 77, dtype=np.uint8)
    chunks: dict[bytes, bytes] = {}
    layout = save(array, None, chunks)
    for offset, data in edits:
        array = array.copy()
        region = np.frombuffer(data, dtype=np.uint8)[: len(array) - offset]
        array[offset : offset + len(region)] = region
        parent = layout
        layout = save(array, parent, chunks)
        assert np.array_equal(restore(layout, chunks), array)
        shared = {e.key for e in layout.leaves} & {e.key for e in parent.leaves}
        assert len(shared) >= len(parent.leaves) - 2


def test_manifest_rejects_what_it_does_not_know() -> None:
    import ormsgpack

    with pytest.raises(ValueError, match="version"):
        decode_manifest(ormsgpack.packb([99, "list", 0, None, []]))
    with pytest.raises(ValueError, match="kind"):
        decode_manifest(ormsgpack.packb([1, "set", 0, None, []]))
    with pytest.raises(ValueError, match="unreadable"):
        decode_manifest(b"\xc1")
