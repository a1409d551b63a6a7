"""Records attached to a checkpoint after it was written, kept in the checkpoint's own row.

An integration's pending writes (LangGraph's ``put_writes``) belong to one checkpoint and are
read with it. As effect records they cost every step a ``pitstop_effects`` row and two index
entries, three b-trees of pages in the commit; appended to the ``writes`` column of their
checkpoint's row (:data:`~pitstop.store.engine.schema.APPEND_ATTACHED`) they touch the page the next
checkpoint is inserted into anyway. They go with the row: pruning, deleting, exporting or
archiving the checkpoint takes them along.

``writes`` is a sequence of frames, each ``>II`` (payload length, CRC-32 of the payload) and
the payload, the msgpack array ``[key, result, hash, replace]`` (``result`` and ``hash`` as
an effect record's: the framed value and its content hash). The checkpoint's checksum does
not cover them (the record stays immutable); each frame's CRC and each value's hash do.
Appending never rewrites the frames before (one UPDATE, nothing read first), so a key may
appear more than once: its first frame wins, unless a later one has ``replace`` set (the
``record_effects`` rules: kept once, or ``replace=True`` overwrites).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import ormsgpack

from ...errors import CorruptCheckpointError

_HEADER = struct.Struct(">II")


def frame_records(rows: Iterable[tuple[str, bytes, bytes]], *, replace: bool) -> bytes:
    """Frames for ``(key, result, hash)`` rows, to append to a checkpoint's ``writes``."""
    out = bytearray()
    for key, result, hash_ in rows:
        payload = ormsgpack.packb([key, bytes(result), bytes(hash_), replace])
        out += _HEADER.pack(len(payload), zlib.crc32(payload))
        out += payload
    return bytes(out)


def frames_of(rows: Iterable[tuple[str, bytes, bytes, bool]]) -> bytes:
    """Frames for ``(key, result, hash, replace)`` rows, as :func:`read_frames` yields them
    (``pitstop rekey`` writes a row's frames again, each value sealed anew)."""
    out = bytearray()
    for key, result, hash_, replace in rows:
        out += frame_records([(key, result, hash_)], replace=replace)
    return bytes(out)


def map_frames(
    data: bytes, convert: Callable[[bytes, bytes], tuple[bytes, bytes]], *,
    run_id: str | None = None, checkpoint_id: str | None = None,
) -> bytes:
    """``data``'s frames again, each ``(result, hash)`` made ``convert(result, hash)``."""
    return frames_of(
        (key, *convert(result, hash_), replace)
        for key, result, hash_, replace in read_frames(
            data, run_id=run_id, checkpoint_id=checkpoint_id)
    )


def read_frames(
    data: bytes, *, run_id: str | None = None, checkpoint_id: str | None = None
) -> Iterator[tuple[str, bytes, bytes, bool]]:
    """The ``(key, result, hash, replace)`` of each frame, in order; a torn or edited frame
    is :class:`~pitstop.CorruptCheckpointError` naming the checkpoint."""
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        problem = None
        if offset + _HEADER.size > len(view):
            problem = "a truncated frame header"
        else:
            length, crc = _HEADER.unpack_from(view, offset)
            start = offset + _HEADER.size
            payload = view[start : start + length]
            if len(payload) != length:
                problem = "a truncated frame"
            elif zlib.crc32(payload) != crc:
                problem = "a frame checksum mismatch"
            else:
                try:
                    key, result, hash_, replace = ormsgpack.unpackb(payload)
                except (ValueError, TypeError) as exc:
                    problem = f"an unreadable frame ({exc})"
                else:
                    if (type(key) is not str or type(result) is not bytes
                            or type(hash_) is not bytes or type(replace) is not bool):
                        problem = "a frame of the wrong shape"
        if problem is not None:
            raise CorruptCheckpointError(
                f"attached records: {problem} at byte {offset}",
                checkpoint_id=checkpoint_id,
                run_id=run_id,
            )
        yield key, result, hash_, replace
        offset = start + length


def merged(
    rows: Iterable[Sequence[Any]], *, run_id: str | None = None,
    checkpoint_id: str | None = None,
) -> dict[str, tuple[bytes, bytes]]:
    """Key -> (result, hash) of what :data:`~pitstop.store.engine.schema.SELECT_ATTACHED` read: the
    effect records first, then each row's frames by the rules above."""
    out: dict[str, tuple[bytes, bytes]] = {}
    framed = []
    for key, result, hash_ in rows:
        if key is None:
            framed.append(bytes(result))
        else:
            out[str(key)] = (bytes(result), bytes(hash_))
    for data in framed:  # (UNION ALL promises no order)
        for name, value, h, replace in read_frames(
            data, run_id=run_id, checkpoint_id=checkpoint_id
        ):
            if replace or name not in out:
                out[name] = (value, h)
    return out


__all__ = ["frame_records", "frames_of", "map_frames", "merged", "read_frames"]
