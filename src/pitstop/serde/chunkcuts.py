"""Where chunked values are cut: lists and dicts item by item at content-defined points,
buffers at fixed offsets; and the msgpack encodings of the items that are cut.

A list chunk is the msgpack encodings of consecutive items concatenated, a dict chunk the
encodings of consecutive ``key, value`` pairs, so the whole value is the container header
(:func:`container_header`) followed by its chunks. A chunk ends after an item whose fast
hash falls below a threshold proportional to the item's size (:func:`cut_ranges`), or at
:attr:`Params.max`: whether an item ends a chunk depends on that item alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import xxhash


class Params(NamedTuple):
    """Where chunks of one kind of value are cut."""

    target: int
    """Mean chunk size: an item of ``n`` bytes ends its chunk with probability
    ``n / target``, decided by the item's own hash."""
    max: int
    """A chunk is cut after the item that takes it to this size, whatever the hashes say."""


# A conversation wants few, large chunks (a restore reads each one), but not too large: on
# SQLite each append rewrites the open chunk, and the rows it leaves behind as aliases sit in
# leaf pages sized for the big rows they were (16 KiB: 1.41x the final size on disk, 32 KiB:
# 1.56x, 64 KiB: 1.9x for a 2,000-turn conversation). A dict with one key changed per save
# wants small ones (each save rewrites the chunk holding the key).
LIST_PARAMS: Final = Params(target=16 * 1024, max=64 * 1024)
DICT_PARAMS: Final = Params(target=512, max=2 * 1024)
SEALED_DICT_PARAMS: Final = Params(target=1024, max=4 * 1024)
"""A dict's chunks where every row written is kept (PostgreSQL: see
:func:`~pitstop.serde.chunks.sealed`): each chunk there is a row, a reference row and three
index entries (~340 bytes besides its bytes), so fewer, larger chunks cost less on disk in
all than rewriting less per save saves (the issue's 10,000-key dict after 200 saves: 3.10 ->
2.61 MiB, saves 15 -> 11 ms)."""
BUFFER_CHUNK: Final = 1 << 20
"""Buffers (bytes, arrays) are cut every MiB: a region changed in a large array rewrites the
chunks it touches, and a 64 MiB array is 64 chunks."""

Dumps = Callable[[Any], bytes]

_STR_HEADS: Final = frozenset(range(0xA0, 0xC0)) | {0xD9, 0xDA, 0xDB}


def encode_dict_item(dumps: Dumps, key: Any, value: Any) -> bytes | None:
    if type(key) is not str:
        return None
    encoded = dumps(key)
    if encoded[0] not in _STR_HEADS:  # a str msgpack cannot hold as is (lone surrogates)
        return None
    return encoded + dumps(value)


def container_header(kind: str, n: int) -> bytes:
    if kind == "list":
        small, mid, big = 0x90, 0xDC, 0xDD
    else:
        small, mid, big = 0x80, 0xDE, 0xDF
    if n < 16:
        return bytes((small | n,))
    if n < 1 << 16:
        return bytes((mid,)) + n.to_bytes(2, "big")
    return bytes((big,)) + n.to_bytes(4, "big")


def cut_ranges(
    encodings: Sequence[bytes], params: Params, seed: int = 0
) -> list[tuple[int, int, bool]]:
    """``(first, last + 1, cut)`` item ranges of ``encodings``, content-defined (by a hash
    seeded with ``seed``: :attr:`~pitstop.serde.chunkkeys.ChunkKeys.cut_seed`)."""
    hi = params.max
    scale = (1 << 64) // params.target
    digest = xxhash.xxh3_64_intdigest
    ranges: list[tuple[int, int, bool]] = []
    first, size = 0, 0
    for i, encoded in enumerate(encodings):
        n = len(encoded)
        size += n
        if size >= hi or digest(encoded, seed) < n * scale:
            ranges.append((first, i + 1, True))
            first, size = i + 1, 0
    if first < len(encodings):
        ranges.append((first, len(encodings), False))
    return ranges



def encode_items(
    kind: str, value: Any, dumps: Dumps, first: int, stop: int, items: list[Any] | None = None
) -> list[bytes] | None:
    """The encodings of items ``first`` to ``stop`` (None: a dict msgpack cannot hold)."""
    if kind == "list":
        return [dumps(item) for item in value[first:stop]]
    pairs = items if items is not None else list(value.items())
    out = []
    for k, v in pairs[first:stop]:
        encoded = encode_dict_item(dumps, k, v)
        if encoded is None:
            return None
        out.append(encoded)
    return out


def header_size(n: int) -> int:
    return 1 if n < 16 else 3 if n < 1 << 16 else 5



__all__ = [
    "BUFFER_CHUNK",
    "DICT_PARAMS",
    "LIST_PARAMS",
    "SEALED_DICT_PARAMS",
    "Dumps",
    "Params",
    "container_header",
    "cut_ranges",
    "encode_dict_item",
    "encode_items",
    "header_size",
]
