"""``store.save`` with ``pitstop.Merge``/``Append`` values applies them to the parent's value
without loading the parent checkpoint when this store wrote that parent with deltas on those
fields (#27): a consumer saving deltas in a loop reads nothing back."""

from __future__ import annotations

from typing import Any

import pytest

import pitstop
from pitstop.store import Store


def _counting_gets(store: Store) -> list[str]:
    """Record the checkpoints ``store.get`` reads (the call still goes through)."""
    seen: list[str] = []
    real = store.get

    def get(checkpoint_id: str, **options: Any) -> Any:
        seen.append(checkpoint_id)
        return real(checkpoint_id, **options)

    store.get = get  # type: ignore[method-assign]
    return seen


def test_consecutive_merges_do_not_reload_the_parent(store: Store) -> None:
    store.save("m", {"counts": {f"k{i}": 0 for i in range(3000)}, "log": [1]})
    reads = _counting_gets(store)
    store.save("m", {"counts": pitstop.Merge({"k1": 1}), "log": pitstop.Append([2])})
    assert len(reads) == 1  # its parent was saved whole: read once
    for step in range(2, 6):
        store.save("m", {"counts": pitstop.Merge({f"k{step}": step, "new": step}),
                         "log": pitstop.Append([step + 1])})
    assert len(reads) == 1
    state = store.latest("m").state  # type: ignore[union-attr]
    assert state["counts"]["k1"] == 1 and state["counts"]["k5"] == 5
    assert state["counts"]["new"] == 5 and len(state["counts"]) == 3001
    assert state["log"] == [1, 2, 3, 4, 5, 6]


def test_a_merge_on_another_handles_parent_reads_it(store: Store) -> None:
    store.save("m", {"counts": pitstop.Merge({"a": 1})})
    other_parent = store.save("m", {"counts": {"a": 1, "b": 2}})
    reads = _counting_gets(store)
    store.save("m", {"counts": pitstop.Merge({"c": 3})})
    assert reads == [other_parent.id]
    assert store.latest("m").state["counts"] == {"a": 1, "b": 2, "c": 3}  # type: ignore[union-attr]


def _counting_value_reads(store: Store) -> list[int]:
    """Record how many values each read of stored values alone asks for."""
    seen: list[int] = []
    real = store._read_values_alone  # type: ignore[attr-defined]

    def read(keys: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(keys))
        return real(keys, *args, **kwargs)

    store._read_values_alone = read  # type: ignore[attr-defined]
    return seen


def _value_rows(store: Store) -> int:
    count: int = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.scalar("SELECT count(*) FROM pitstop_blobs"))
    return count


@pytest.mark.slow
def test_a_merge_on_a_parent_no_handle_here_read_costs_the_change(shared_url: str) -> None:
    """A process resuming a run (here: a new handle per save, on SQLite and PostgreSQL)
    saves Merge deltas on a chunked dict it never read: the parent is not read and each
    save writes the changed entries alone (a patch after the dict's chunks), so its cost in
    bytes and rows is the same for a dict of 2,000 keys and one of 40,000."""
    costs = {}
    for size in (2_000, 40_000):
        run = f"m{size}"
        expected = {f"k{i:06d}": i for i in range(size)}
        store = pitstop.open_store(shared_url)
        store.save(run, {"counts": dict(expected)})
        store.close()
        added, rows, reads = [], [], []
        for step in range(20):
            update = {f"k{step * 97:06d}": -step, f"new{step:02d}": step}
            expected.update(update)
            store = pitstop.open_store(shared_url)
            gets = _counting_gets(store)
            nodes_read = _counting_value_reads(store)
            before = _value_rows(store)
            saved = store.save(run, {"counts": pitstop.Merge(update)})
            assert nodes_read == []  # (the head's values are the run's: no walk of its tree)
            added.append(saved.added or 0)
            rows.append(_value_rows(store) - before)
            reads += gets
            if step == 19:  # save's answer reads the state when asked for it
                assert saved.state["counts"] == expected
            store.close()
        assert reads == []
        costs[size] = (max(added), max(rows))
        store = pitstop.open_store(shared_url)
        got = store.latest(run).state["counts"]  # type: ignore[union-attr]
        assert got == expected and list(got) == list(expected)  # values, and key order
        assert store.verify() == []
        store.close()
    small, large = costs[2_000], costs[40_000]
    assert large[1] <= small[1] <= 3  # a chunk of the change (and a node now and then)
    assert large[0] <= small[0] + 256 and large[0] < 2048  # the whole dict: ~500 KiB


def test_merge_patches_are_rewritten_whole_once_they_outgrow_the_dict(shared_url: str) -> None:
    """Patches may hold as many entries as the dict had before them; then a save reads the
    value and writes it whole, without the keys set twice (the next patches start afresh)."""
    from pitstop.serde import chunks

    def manifest(store: Store) -> Any:
        head = store.history("m", limit=1)[0]
        record = store._parent(head.id)  # type: ignore[attr-defined]
        return chunks.decode_manifest(record.fields["counts"].manifest)

    expected = {f"k{i:05d}": i for i in range(5000)}
    store = pitstop.open_store(shared_url)
    store.save("m", {"counts": dict(expected)})
    store.close()
    patched = []
    for step in range(4):
        update = {f"n{step}-{j}": j for j in range(2000)}
        expected.update(update)
        store = pitstop.open_store(shared_url)
        store.save("m", {"counts": pitstop.Merge(update)})
        patched.append(manifest(store).meta is not None)
        store.close()
    # 2,000 and 4,000 patched entries on a dict of 5,000; the third rewrites it whole (9,000
    # keys), the fourth patches that.
    assert patched == [True, True, False, True]
    store = pitstop.open_store(shared_url)
    got = store.latest("m").state["counts"]  # type: ignore[union-attr]
    assert got == expected and list(got) == list(expected)
    assert store.verify() == []
    store.close()


def test_a_resumed_checkpointer_saves_a_merge_without_reading_the_state(
    tmp_path: Any,
) -> None:
    """Checkpointer.save in a new process (a new store handle) that did not restore: a
    Merge on the big dict reads nothing back; with the default retention pruning the older
    checkpoints, the patched dict still restores whole and verify finds nothing."""
    url = f"sqlite:///{tmp_path / 'loop.db'}"
    expected = {f"u{i:05d}": 0 for i in range(20_000)}
    with pitstop.Checkpointer(url, "c") as ckpt:
        ckpt.save({"seen": dict(expected), "step": 0}, force=True)
    for step in range(1, 6):
        with pitstop.Checkpointer(url, "c") as ckpt:
            reads = _counting_gets(ckpt.store)
            ckpt.save({"seen": pitstop.Merge({f"u{step:05d}": step, f"n{step}": step}),
                       "step": step}, force=True)
            assert reads == []
        expected.update({f"u{step:05d}": step, f"n{step}": step})
    with pitstop.Checkpointer(url, "c") as ckpt:
        state = ckpt.restore()
        assert state["step"] == 5 and state["seen"] == expected
        assert list(state["seen"]) == list(expected)
        assert ckpt.store.verify() == []
