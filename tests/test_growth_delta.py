"""The delta path (``split_delta``: pitstop.Append / pitstop.Merge) costs O(change): it takes
the parent's item offsets and node registrations instead of passing over every leaf, and
compares new chunks only with the parent's chunks it re-cut. These tests hold it to the
same result as a full computation: exact offsets, every chunk the layout references either
the parent's or written now, the whole-value path's cuts, and values that round-trip."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pitstop import Append, Merge
from pitstop.delta import dirty_positions
from pitstop.serde import MsgpackSerializer
from pitstop.serde.chunks import Layout, Split, assemble, sealed, split, split_delta

SER = MsgpackSerializer()


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(string.ascii_letters + "  ", k=n))


def _check(parent: Layout, result: Split, value: Any, store: dict[bytes, Any]) -> None:
    """What a store relies on: nothing referenced is missing, offsets are exact."""
    layout = result.layout
    assert layout.keys() <= parent.keys() | set(result.new)
    store.update(result.new)
    acc, starts = 0, []
    for leaf in layout.leaves:
        starts.append(acc)
        acc += leaf.items
    assert layout.leaf_starts() == starts
    assert acc == layout.items == len(value)
    raw = assemble(layout.kind, None, layout.items, layout.leaves, store)
    assert SER.loads(raw) == value
    # The whole-value path cuts the same value at the same places.
    whole = split(value, SER.dumps, 0)
    assert whole is not None
    assert [e.key for e in whole.layout.leaves] == [e.key for e in layout.leaves]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=0, max_value=2**32),
    st.lists(
        st.tuples(st.sampled_from(["append", "many", "edit", "repeat"]), st.integers(0, 10**6)),
        min_size=1,
        max_size=25,
    ),
)
def test_list_deltas_match_a_full_computation(seed: int, steps: list[tuple[str, int]]) -> None:
    rng = random.Random(seed)
    value: list[Any] = [{"i": i, "text": _text(rng, 700)} for i in range(60)]
    first = split(value, SER.dumps, 0)
    assert first is not None
    store: dict[bytes, Any] = dict(first.new)
    layout = first.layout
    for kind, n in steps:
        edited: list[int] = []
        value = list(value)
        if kind == "append":
            added = [{"i": len(value), "text": _text(rng, 1 + n % 3000)}]
        elif kind == "many":
            added = [_text(rng, 400) for _ in range(1 + n % 40)]
        elif kind == "repeat":  # items whose chunks the parent already holds elsewhere
            start = n % max(1, len(value) - 20)
            added = value[start : start + 20]
        else:  # an earlier item edited in place, then one appended
            at = n % len(value)
            value[at] = dict(value[at], text="edited") if isinstance(value[at], dict) else "e"
            edited.append(at)
            added = ["after the edit"]
        value.extend(added)
        dirty = [*dirty_positions(value, Append(added), layout.items), *edited]
        result = split_delta(layout, value, dirty, SER.dumps)
        _check(layout, result, value, store)
        layout = result.layout


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=0, max_value=2**32),
    st.lists(st.tuples(st.integers(0, 3000), st.booleans()), min_size=1, max_size=20),
)
@pytest.mark.slow
def test_dict_merges_match_a_full_computation(
    seed: int, steps: list[tuple[int, bool]]
) -> None:
    rng = random.Random(seed)
    value = {f"k{i}": _text(rng, 90) for i in range(2000)}
    first = split(value, SER.dumps, 0)
    assert first is not None
    store: dict[bytes, Any] = dict(first.new)
    layout = first.layout
    for n, fresh in steps:
        update = {f"new{n}" if fresh else f"k{n % 2000}": _text(rng, 90)}
        value = {**value, **update}
        dirty = dirty_positions(value, Merge(update), layout.items)
        result = split_delta(layout, value, dirty, SER.dumps)
        _check(layout, result, value, store)
        layout = result.layout


def test_a_long_append_run_keeps_offsets_and_chunks_exact() -> None:
    rng = random.Random(7)
    value: list[Any] = [_text(rng, 2048) for _ in range(40)]
    first = split(value, SER.dumps, 0)
    assert first is not None
    store: dict[bytes, Any] = dict(first.new)
    layout = first.layout
    for _ in range(400):
        added = [_text(rng, 2048)]
        value = [*value, *added]
        result = split_delta(layout, value, [], SER.dumps)
        assert layout.keys() | set(result.new) >= result.layout.keys()
        store.update(result.new)
        layout = result.layout
    _check(layout, split_delta(layout, value, [], SER.dumps), value, store)


def test_a_sealed_parent_keeps_its_offsets() -> None:
    """PostgreSQL seals the parent's open chunk before each save: the offsets it had are
    kept (not added up again over every leaf), and the next save cuts as a full pass would."""
    rng = random.Random(8)
    value: list[Any] = [_text(rng, 2048) for _ in range(300)]
    first = split(value, SER.dumps, 0)
    assert first is not None
    layout = first.layout
    starts = list(layout.leaf_starts())
    parent = sealed(layout)
    assert parent.starts is layout.starts and parent.leaf_starts() == starts
    value = [*value, _text(rng, 2048)]
    result = split(value, SER.dumps, 0, parent)
    assert result is not None
    assert result.layout.keys() <= parent.keys() | set(result.new)
    acc, expected = 0, []
    for leaf in result.layout.leaves:
        expected.append(acc)
        acc += leaf.items
    assert result.layout.leaf_starts() == expected and acc == len(value)


def test_a_growing_field_keeps_its_last_two_layouts_and_saves_from_older_ones(
    tmp_path: Any,
) -> None:
    """The process keeps the layout of a field's newest version and of its parent, not one
    per save; a save from an older checkpoint (a branch) reads what it needs instead."""
    import pitstop

    rng = random.Random(8)
    with pitstop.open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        msgs = [{"t": _text(rng, 2000)} for _ in range(20)]
        ids = [store.save("r", {"m": msgs}).id]
        for _ in range(30):
            msg = {"t": _text(rng, 2000)}
            msgs.append(msg)
            ids.append(store.save("r", {"m": Append([msg])}).id)
        codec = store._value_codec  # type: ignore[attr-defined]
        assert len(codec._layouts) == 2  # the newest version and its parent
        old = store.get(ids[5])
        branch = [*old.state["m"], {"t": "branch"}]
        store.save("r", {"m": Append([{"t": "branch"}])}, parent_id=ids[5])
        assert store.latest("r").state["m"] == branch  # type: ignore[union-attr]
        assert store.get(ids[-1]).state["m"] == msgs
        assert store.verify() == []


def test_an_unchanged_or_reverted_value_keeps_its_layout(tmp_path: Any) -> None:
    """A save of the same value again (its manifest is its parent's) or of an earlier
    version (A, B, A) keeps the layout it just made: the next save reuses its chunks."""
    import pitstop

    rng = random.Random(9)
    with pitstop.open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        a = [{"t": _text(rng, 300)} for _ in range(100)]
        b = [*a, {"t": "b"}]
        codec = store._value_codec  # type: ignore[attr-defined]
        for value in (a, a, b, a, a):
            saved = store.save("r", {"m": value})
            manifest = store._parent(saved.id).fields["m"].manifest  # type: ignore[attr-defined]
            assert manifest is not None and manifest in codec._layouts
        assert store.latest("r").state["m"] == a  # type: ignore[union-attr]
