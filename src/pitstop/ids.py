"""Time-sortable ids (UUIDv7, RFC 9562) for checkpoints, inputs and leases.

Checkpoint ids sort by creation time as plain strings, so "newest first" is an index scan on
the id. Two properties matter beyond the RFC:

* ids from one process are strictly increasing, even within one millisecond (a 12-bit
  sequence in ``rand_a``, carried into the timestamp when it overflows);
* a child is always greater than its parent (``after=``), even when the child is written on a
  machine whose clock is behind the parent's. History order then never contradicts ancestry.
"""

from __future__ import annotations

import os
import random
import threading
import time

_lock = threading.Lock()
_last = 0  # last (unix_ms << 12 | seq) handed out by this process
_last_id = ""  # and the id made from it

_MAX_SEQ = 0xFFF
# A generator of our own, seeded from the OS: the global one belongs to the program. Drawing
# from it would shift a seeded program's random stream whenever it checkpoints (a resumed
# training run would not match an uninterrupted one), and a program that seeds it would make
# every process draw the same "random" bits. Reseeded in a forked child, as random's is.
_random = random.Random()
_getrandbits = _random.getrandbits
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_random.seed)


def _parse(uuid_str: str) -> int:
    return int(uuid_str.replace("-", ""), 16)


def new_id(after: str | None = None) -> str:
    """A new UUIDv7 string, greater than every id this process made before, and than ``after``."""
    global _last, _last_id  # noqa: PLW0603 - the process-wide sequence is the point
    now = time.time_ns() // 1_000_000 << 12
    floor = 0
    if after is not None and after != _last_id:  # our own last id needs no parsing
        try:
            value = _parse(after)
        except ValueError:
            value = 0
        if value >> 76 & 0xF == 0x7:
            # Continue from the parent's timestamp and sequence if our clock is behind it.
            floor = ((value >> 80) << 12) | ((value >> 64) & _MAX_SEQ)
    # acquire/release, not ``with``: the statement looks up and calls the lock's __enter__
    # and __exit__ (~2k instructions, callgrind; the pair of calls ~0.9k), on every save.
    _lock.acquire()
    try:
        ms_seq = max(_last + 1, now, floor + 1)
        _last = ms_seq
        # 48-bit ms, version 7, 12-bit sequence, variant 0b10 and 62 random bits, formatted in one
        # pass: ms high/low, version + sequence, variant + random high, random low.
        ms = ms_seq >> 12
        rand = _getrandbits(62)
        _last_id = "%08x-%04x-7%03x-%04x-%012x" % (  # noqa: UP031 - faster than f-string specs
            ms >> 16,
            ms & 0xFFFF,
            ms_seq & _MAX_SEQ,
            0x8000 | rand >> 48,
            rand & 0xFFFFFFFFFFFF,
        )
        return _last_id
    finally:
        _lock.release()


def id_time(uuid_str: str) -> float:
    """The creation time (unix seconds) encoded in a UUIDv7 string."""
    return (_parse(uuid_str) >> 80) / 1000.0


__all__ = ["id_time", "new_id"]
