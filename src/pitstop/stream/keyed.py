"""A partition's keyed state, checkpointed by the keys that changed.

:class:`KeyedState` is a ``dict`` that notes which keys were set or deleted since the last
checkpoint. A checkpoint stores only those (field ``changes``, and ``deleted``), with the id
of the *base* checkpoint that holds a whole copy (field ``full``): nothing unchanged is read or
serialised. Loading folds the changes of the checkpoints after the base over its copy. A new
base is written when the keys written since the last one reach the state's size (or 256
checkpoints), so a checkpoint costs O(keys changed), amortised, and a load at most about
twice the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..store import Store

_BASE_EVERY = 256
"""At most this many change checkpoints after a base: bounds the reads of a load."""
_BASE_MIN_KEYS = 4096
"""A small state gets a new base only after this many key writes (its copy is cheap to
write, but each one is a checkpoint much bigger than a delta)."""
_BASE_RATIO = 4
"""A new base once the keys written since the last reach this many times the state's size:
the copies then cost at most a quarter of the key writes, and a load folds at most five
times the state."""


class KeyedState(dict[Any, Any]):
    """A partition's state: a ``dict`` by key. Assign to change a key (``state[k] = v``);
    a value changed in place (``state[k].append(x)``) must be assigned again (or the key
    passed to :meth:`touch`) to reach the next checkpoint."""

    __slots__ = ("_changed", "_deleted")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._changed: set[Any] = set()
        self._deleted: set[Any] = set()

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._changed.add(key)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._changed.discard(key)
        self._deleted.add(key)

    def touch(self, key: Any) -> None:
        """Mark ``key`` changed (its value was changed in place)."""
        if key in self:
            self._changed.add(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            value = dict.__getitem__(self, key)
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[Any, Any]:
        key, value = dict.popitem(self)
        self._changed.discard(key)
        self._deleted.add(key)
        return key, value

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> KeyedState:  # type: ignore[misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self._deleted.update(self)
        self._changed.clear()
        dict.clear(self)

    def take_changes(self) -> tuple[dict[Any, Any], list[Any]]:
        """The keys set since the last call with their values, and the keys deleted (not
        set again since); forgets them."""
        # (self[key]: dict's own lookup, no subclass overrides it; a fifth faster than
        # calling dict.__getitem__ per key.)
        changes = {key: self[key] for key in self._changed}
        deleted = [key for key in self._deleted if key not in self]
        self._changed = set()
        self._deleted = set()
        return changes, deleted

    def forget_changes(self) -> None:
        self._changed = set()
        self._deleted = set()

    @property
    def dirty(self) -> int:
        return len(self._changed) + len(self._deleted)


class ExpiringState(KeyedState):
    """Keyed state whose keys expire ``ttl`` seconds after they were last set
    (:class:`~pitstop.stream.Job`'s ``ttl``): each key remembers the time bucket of its
    last write; :meth:`expire` deletes those of buckets that are too old."""

    __slots__ = ("_bucket_of", "bucket")

    def __init__(self, *args: Any, bucket: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bucket = bucket
        """The current time bucket (set by the job at each checkpoint)."""
        self._bucket_of: dict[Any, int] = dict.fromkeys(self, bucket)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._changed.add(key)
        self._bucket_of[key] = self.bucket

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._bucket_of.pop(key, None)

    def popitem(self) -> tuple[Any, Any]:
        key, value = super().popitem()
        self._bucket_of.pop(key, None)
        return key, value

    def clear(self) -> None:
        super().clear()
        self._bucket_of.clear()

    def expire(self, before: int) -> int:
        """Delete the keys last set in a bucket before ``before``; how many."""
        old = [key for key, bucket in self._bucket_of.items() if bucket < before]
        for key in old:
            if key in self:
                del self[key]
            else:
                self._bucket_of.pop(key, None)
        return len(old)

    def buckets(self) -> dict[Any, int]:
        return dict(self._bucket_of)


def needs_base(written_since_base: int, checkpoints_since_base: int, size: int) -> bool:
    """Whether the next checkpoint should hold a whole copy (a new base)."""
    return (
        checkpoints_since_base >= _BASE_EVERY
        or written_since_base >= max(size * _BASE_RATIO, _BASE_MIN_KEYS)
    )


def chain_ids(store: Store, run_id: str, head_id: str, base_id: str) -> list[str]:
    """The checkpoints from ``base_id`` to ``head_id`` along parent links, oldest first."""
    parents: dict[str, str | None] = {}
    before: str | None = None
    while base_id not in parents:
        page = store.history(run_id, limit=_BASE_EVERY + 8, before=before)
        if not page:
            raise LookupError(f"run {run_id!r}: base checkpoint {base_id} not in its history")
        for summary in page:
            parents[summary.id] = summary.parent_id
        before = page[-1].id
    chain: list[str] = []
    current: str | None = head_id
    while current is not None:
        chain.append(current)
        if current == base_id:
            break
        current = parents.get(current)
    else:
        raise LookupError(f"run {run_id!r}: checkpoint {head_id} does not descend from "
                          f"its base {base_id}")
    chain.reverse()
    return chain


def fold(
    base: Mapping[Any, Any], deltas: Iterable[Mapping[str, Any]], *,
    buckets: Mapping[Any, int] | None = None, now_bucket: int = 0,
) -> KeyedState:
    """The state: ``base`` with each checkpoint's changes and deletions applied in order.
    With ``buckets`` (the base's keys' time buckets: a job with a ``ttl``), an
    :class:`ExpiringState` whose keys keep the bucket of the checkpoint that last set them."""
    if buckets is None:
        state = KeyedState(base)
        for delta in deltas:
            for key in delta.get("deleted") or ():
                dict.pop(state, key, None)
            changes = delta.get("changes")
            if changes:
                dict.update(state, changes)
        return state
    # (Keys the base has no bucket for, as when a ttl is new, count from now.)
    expiring = ExpiringState(base, bucket=now_bucket)
    bucket_of = expiring._bucket_of
    bucket_of.update(buckets)
    for delta in deltas:
        for key in delta.get("deleted") or ():
            dict.pop(expiring, key, None)
            bucket_of.pop(key, None)
        changes = delta.get("changes")
        if changes:
            dict.update(expiring, changes)
            bucket_of.update(dict.fromkeys(changes, delta.get("bucket", 0)))
    return expiring


__all__ = ["ExpiringState", "KeyedState", "chain_ids", "fold", "needs_base"]
