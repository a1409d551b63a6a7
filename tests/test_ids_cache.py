"""Checkpoint ids (UUIDv7) and the bounded caches on the save path."""

from __future__ import annotations

import itertools
import re
import time
import uuid

from pitstop.cache import BoundedCache
from pitstop.ids import id_time, new_id

UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")


def test_ids_are_uuid7_text_and_strictly_increasing() -> None:
    ids = [new_id() for _ in range(20_000)]  # many share a millisecond: the sequence orders them
    for text in ids[:50] + ids[-50:]:
        assert UUID_TEXT.match(text), text
        parsed = uuid.UUID(text)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert len(set(ids)) == len(ids)


def test_id_time_is_the_creation_time() -> None:
    before = time.time()
    made = new_id()
    after = time.time()
    assert before - 0.002 <= id_time(made) <= after + 0.002


def test_child_id_is_greater_than_a_parent_from_a_clock_ahead() -> None:
    # A parent written on a machine whose clock is an hour ahead of ours.
    ahead_ms = int(time.time() * 1000) + 3_600_000
    parent = str(uuid.UUID(int=(ahead_ms << 80) | (0x7 << 76) | (0xFFF << 64) | (0b10 << 62) | 5))
    child = new_id(after=parent)
    assert UUID_TEXT.match(child)
    assert child > parent
    assert new_id() > child  # and the process keeps counting from there
    assert new_id(after="not-a-uuid") > child  # an unparsable parent is ignored, not fatal


def test_bounded_cache_keeps_the_newest_entries() -> None:
    cache: BoundedCache[int] = BoundedCache(3)
    for i in range(10):
        cache.put(str(i), i)
    assert [cache.get(str(i)) for i in range(10)] == [None] * 7 + [7, 8, 9]
    cache.put("8", 80)  # replacing a key keeps its place and the bound
    cache.drop("9")
    cache.drop("missing")
    assert (cache.get("7"), cache.get("8"), cache.get("9"), cache.get(None)) == (7, 80, None, None)


def test_a_full_bounded_cache_drops_its_oldest_eighth_at_a_time() -> None:
    cache: BoundedCache[int] = BoundedCache(16)
    sizes = []
    for i in range(100):
        cache.put(str(i), i)
        sizes.append(len(cache._data))
    assert max(sizes) == 16  # never more than its size
    # Full at 16, the 17th put drops the two oldest: from then on it holds 15 or 16, always
    # the newest.
    assert min(sizes[16:]) == 15
    held = [i for i in range(100) if cache.get(str(i)) is not None]
    assert held == list(range(100 - len(held), 100)) and 15 <= len(held) <= 16


def test_ids_leave_the_global_random_stream_alone() -> None:
    """A seeded program's random numbers do not change because it checkpoints, and seeding
    the global generator does not make two processes draw the same id bits."""
    import random

    random.seed(5)
    expected = random.random()
    random.seed(5)
    new_id()
    assert random.random() == expected
    random.seed(5)
    first = new_id()
    random.seed(5)
    assert new_id()[-12:] != first[-12:]
