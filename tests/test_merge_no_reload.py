"""``store.save`` with ``pitstop.Merge``/``Append`` values applies them to the parent's value
without loading the parent checkpoint when this store wrote that parent with deltas on those
fields (#27): a consumer saving deltas in a loop reads nothing back."""

from __future__ import annotations

from typing import Any

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
