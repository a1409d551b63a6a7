"""A chunked value's leaves from their rows, checked against their keys in tight loops: what a
restore of a conversation does with hundreds or thousands of chunks, instead of a call per
chunk. Keys made from xxh3 are checked by one xxh3 pass over each row: plain ones, and in a
sealed store those keyed under its current key (a keyed hash of the 17-byte plain key on top:
:meth:`~pitstop.serde.chunkkeys.ChunkKeys.matches_xxh3`); a sealed row opened under a keyed
key (:class:`~pitstop.store.encoding.sealed.Opened`) was authenticated by AES-GCM bound to its
key, and is not hashed at all. Anything these do not take (a row in the blob store, a key of
another hash, a frame of another format, a failed check) gives None, and the per-chunk path
of :class:`~pitstop.store.encoding.valuecodec.ValueCodec` reads, checks and names it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final, cast

import xxhash

from ...serde import chunks as chunking
from ...serde.chunkkeys import KEY_KEYED, KEY_XXH3, PLAIN_MSGPACK
from ...serde.framing import COMPRESSED, FORMAT_MASK, decompress_many
from .records import Stored
from .sealed import Opened

if TYPE_CHECKING:
    from ...serde.codec import MsgpackSerializer

_FIRST: Final = operator.itemgetter(0)
_XXH3_KINDS: Final = frozenset({KEY_XXH3, KEY_KEYED})
_ROWS: Final = frozenset({bytes, Opened})


def plain_chunks(
    leaves: Sequence[chunking.Entry], blobs: Mapping[bytes, Stored], formats: set[int],
    keying: chunking.ChunkKeys = PLAIN_MSGPACK,
) -> dict[bytes, bytes | memoryview] | None:
    """The leaves' bytes (views after the header, or decompressed), checked against their
    keys, when all are table rows of one format with keys made from xxh3 (see the module).
    None for anything else (or a row that does not decompress)."""
    keys = list(map(_FIRST, leaves))
    found = list(map(blobs.get, keys))
    if not set(map(type, found)) <= _ROWS or not set(map(_FIRST, keys)) <= _XXH3_KINDS:
        return None
    rows = cast(list[bytes], found)
    try:
        heads = set(map(_FIRST, rows))
    except IndexError:  # an empty row
        return None
    fmts = {head & ~COMPRESSED for head in heads}
    if len(fmts) != 1:
        return None
    (fmt,) = fmts
    if fmt & ~FORMAT_MASK:  # not a header this version writes
        return None
    views: list[bytes | memoryview] = [memoryview(data)[1:] for data in rows]
    if heads != {fmt}:  # compressed rows among them (a list's chunks on PostgreSQL)
        packed = [i for i, data in enumerate(rows) if data[0] & COMPRESSED]
        try:
            unpacked = decompress_many([views[i] for i in packed])
        except ValueError:
            return None
        for i, view in zip(packed, unpacked, strict=True):
            views[i] = view
    digest = xxhash.xxh3_128_digest
    matches = keying.matches_xxh3
    if not all(type(row) is Opened or matches(key, digest(view, seed=fmt))
               for key, view, row in zip(keys, views, rows, strict=True)):
        return None
    formats.add(fmt)
    return dict(zip(keys, views, strict=True))


class _NotPlain(Exception):
    """A leaf row :func:`list_from_rows` does not take."""


def list_from_rows(
    readers: Mapping[int, MsgpackSerializer],
    leaves: Sequence[chunking.Entry],
    rows: Mapping[bytes, Stored],
    *,
    strict: bool,
    consume: bool = False,
    keying: chunking.ChunkKeys = PLAIN_MSGPACK,
) -> tuple[int, list[object]] | None:
    """A chunked list's format and items, straight from its leaves' rows when they are all
    uncompressed table rows of one format that ``readers`` decode (SQLite's), else None:
    also when a row fails its check or the decode fails.

    One pass: each row checked against its key (xxh3) and its bytes put in a group of
    about ``LIST_GROUP_BYTES`` behind an array header, each group decoded as soon as it is
    full, while its bytes are in the cache. Checking every chunk first, then joining and
    decoding them, read each byte once more from memory (~0.2 ms of a 2,000-message
    restore, as much again in Python calls per chunk). ``consume``: ``rows`` is the
    caller's own dict and each row is dropped from it once in a group (unless a chunk
    repeats), so that the decoded strings reuse memory still in the cache; a caller whose
    dict shrank and that gets None must read the rows again."""
    first = rows.get(leaves[0].key) if leaves else None
    if type(first) not in _ROWS or not first:
        return None
    fmt: int = cast(bytes, first)[0]
    reader = readers.get(fmt)  # (a compressed row's header is no format id)
    if reader is None:
        return None
    if consume and type(rows) is dict and len(set(map(_FIRST, leaves))) == len(leaves):
        groups = _groups(leaves, cast(dict[bytes, Stored], rows).pop, fmt, keying)
    else:
        groups = _groups(leaves, rows.__getitem__, fmt, keying)
    try:
        return fmt, reader._loads_lists(groups, strict=strict)
    except Exception:
        return None


def _groups(
    leaves: Sequence[chunking.Entry], take: Callable[[bytes], Stored], fmt: int,
    keying: chunking.ChunkKeys,
) -> Iterator[bytes]:
    """The leaves' rows, checked, as encoded lists (see :func:`list_from_rows`); raises
    at a row it does not take."""
    digest = xxhash.xxh3_128_digest
    matches = keying.matches_xxh3
    header = chunking.container_header
    limit = chunking.LIST_GROUP_BYTES
    part: list[bytes | memoryview] = []
    count = size = 0
    for leaf in leaves:
        key = leaf.key
        data = take(key)
        row = type(data)
        if row not in _ROWS or not data or data[0] != fmt:
            raise _NotPlain
        body = memoryview(cast(bytes, data))[1:]
        if row is not Opened and not matches(key, digest(body, seed=fmt)):
            raise _NotPlain
        part.append(body)
        count += leaf.items
        size += len(body)
        if size >= limit:
            group = b"".join([header("list", count), *part])
            part, count, size = [], 0, 0  # (the last references to the rows taken)
            yield group
    if part:
        yield b"".join([header("list", count), *part])


__all__ = ["list_from_rows", "plain_chunks"]
