"""Chunk trees moved between keyings: an export of a sealed store, an import into one.

A sealed store keys its chunks with a secret of its key ring (:mod:`pitstop.serde.chunkkeys`).
An archive must not carry those keys: the store it is imported into has other keys (or none)
and could neither check a chunk against its key nor find the chunks it holds already. So an
export gives every chunk its plain key (:func:`to_plain`), and an import into a sealed store
gives every chunk a key of its own ring (:func:`to_keyed`), as whole values travel under
their SHA-256 and are addressed again on import
(:func:`~pitstop.store.encoding.sealing.plain_key`).

A leaf keeps its bytes; only its key changes. A node holds its children's keys, so it is
written again with theirs changed, under the key of its new bytes; and so, up to the root,
whose entries are in the checkpoint's field map
(:func:`~pitstop.serde.chunkmanifest.rekeyed_manifest`).
A node under a key of the kind it is moved to needs nothing: its children were keyed so
when it was made (a node's key is a hash of them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from .records import FieldMap

if TYPE_CHECKING:
    from ...serde.chunkkeys import ChunkKeys
    from ...serde.chunks import Entry

Read = Callable[[list[bytes]], Mapping[bytes, bytes]]
"""Stored (framed, opened) chunks by key: those found."""

_CHUNK_COMPRESS_MIN = 128
""":data:`pitstop.store.encoding.valuecodec._CHUNK_COMPRESS_MIN`: a node written again is
compressed if it was."""


class Moved(NamedTuple):
    """What :func:`to_plain` and :func:`to_keyed` make: the new key of each chunk that has
    one (``keys``: old key -> new key), and the new bytes of each node written again
    (``nodes``: old key -> framed bytes)."""

    keys: dict[bytes, bytes]
    nodes: dict[bytes, bytes]


def to_plain(field_maps: Iterable[FieldMap], read: Read) -> Moved:
    """The chunks the field maps reference, under their plain keys (an export of a sealed
    store). Every chunk under a keyed key is read (its plain key is a hash of its bytes),
    a batch at a time."""
    from ...serde.chunkkeys import is_keyed, plain_key_of

    def leaf_keys(keys: list[bytes]) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        for start in range(0, len(keys), _LEAF_BATCH):
            batch = keys[start : start + _LEAF_BATCH]
            for key, data in read(batch).items():
                parsed = _unframed(data)
                if parsed is not None:
                    out[key] = plain_key_of(key, *parsed)
        return out

    return _move(field_maps, read, is_keyed, leaf_keys, plain_key_of)


def to_keyed(field_maps: Iterable[FieldMap], read: Read, keys: ChunkKeys) -> Moved:
    """The chunks the field maps reference, under keys of ``keys`` (an import into a
    sealed store). A leaf's keyed key is made from its plain key alone: only nodes are
    read."""
    from ...serde.chunkkeys import chunk_key, is_keyed

    def plain(key: bytes) -> bool:
        return not is_keyed(key)

    def node_key(key: bytes, format_id: int, packed: bytes) -> bytes:
        sha = 0x100 if key[0] == 0x02 else 0  # (the node's hash, as it was)
        return keys.keyed_from(chunk_key(format_id | sha, packed))

    return _move(field_maps, read, plain,
                 lambda leaves: {key: keys.keyed_from(key) for key in leaves}, node_key)


_LEAF_BATCH = 64
_DEPTH = 64
"""Leaves read at once by :func:`to_plain` (at most ~64 MiB of chunks in memory)."""


def _unframed(data: bytes) -> tuple[int, bytes] | None:
    from ...serde import unframe

    try:
        return unframe(bytes(data))
    except ValueError:
        return None  # the importer's verify names it


def _move(
    field_maps: Iterable[FieldMap],
    read: Read,
    moves: Callable[[bytes], bool],
    leaf_keys: Callable[[list[bytes]], dict[bytes, bytes]],
    node_key: Callable[[bytes, int, bytes], bytes],
) -> Moved:
    """The walk :func:`to_plain` and :func:`to_keyed` share: ``moves(key)`` says whether a
    chunk gets a new key; ``leaf_keys`` gives the new keys of leaves; ``node_key(old key,
    format, new bytes)`` a node's."""
    from ...serde import chunks as chunking
    from ...serde import frame
    from ...serde.framing import is_compressed

    roots: list[Entry] = []
    for fields in field_maps:
        for ref in fields.values():
            if ref.manifest is not None:
                try:
                    roots.extend(chunking.decode_manifest(ref.manifest).root)
                except ValueError:
                    continue  # the importer's verify (or a load) names it
    # The nodes that move, read a level at a time: their entries, format and compression.
    nodes: dict[bytes, tuple[list[Entry], int, bool]] = {}
    leaves: dict[bytes, None] = {}
    level = roots
    while level:
        wanted: dict[bytes, None] = {}
        for entry in level:
            if not moves(entry.key):
                continue
            if entry.flags & chunking.NODE:
                if entry.key not in nodes:
                    wanted[entry.key] = None
            else:
                leaves[entry.key] = None
        level = []
        found = read(list(wanted)) if wanted else {}
        for key, data in found.items():
            parsed = _unframed(data)
            if parsed is None:
                continue
            try:
                entries = chunking.unpack_entries(parsed[1])
            except ValueError:
                continue
            nodes[key] = (entries, parsed[0], is_compressed(bytes(data)))
            level.extend(entries)
    moved = leaf_keys(list(leaves))
    rewritten: dict[bytes, bytes] = {}
    busy: set[bytes] = set()  # (a crafted node that holds itself: left as it is)

    def place(key: bytes, depth: int = 0) -> bytes:
        """The node ``key``'s new key, its children placed first. (A tree deeper than any
        a store makes was crafted: left as it is, for the load that reads it to name.)"""
        done = moved.get(key)
        if done is not None or key not in nodes or key in busy or depth > _DEPTH:
            return done or key
        busy.add(key)
        entries, fmt, compressed = nodes[key]
        children = [e._replace(key=place(e.key, depth + 1)) if e.flags & chunking.NODE
                    else e._replace(key=moved.get(e.key, e.key)) for e in entries]
        packed = chunking.pack_entries(children)
        new = node_key(key, fmt, packed)
        moved[key] = new
        rewritten[key] = frame(packed, fmt, checksum=False,
                               compress_threshold=_CHUNK_COMPRESS_MIN if compressed else None)
        busy.discard(key)
        return new

    for key in nodes:
        place(key)
    return Moved(moved, rewritten)


__all__ = ["Moved", "Read", "to_keyed", "to_plain"]
