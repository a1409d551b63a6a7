"""What a chunked value's manifest says: its entries, its layout, its bytes.

A manifest is ``[version, kind, items, meta, root entries]``; each :class:`Entry` names a
chunk (or a node of entries, see :mod:`pitstop.serde.chunktree`) by its key, with the items
and bytes it covers. :class:`Layout` is the whole structure as the process that made or read
it knows it. How values are cut into chunks is :mod:`pitstop.serde.chunks`; this module only
encodes and decodes what that produces, and checks what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import ormsgpack

from .chunkkeys import KEY_SIZE, PLAIN_MSGPACK, ChunkKeys

MANIFEST_VERSION: Final = 1
MANIFEST_PATCHED: Final = 2
"""The version of a dict's manifest with *patches*
(:func:`~pitstop.serde.chunkpatches.patch_dict`): leaves after the base's that set keys again.
An older pitstop refuses it rather than cut it wrongly."""

# Entry flags.
CUT: Final = 1
"""The chunk ended at a content-defined boundary (or at the maximum size): it is final."""
NODE: Final = 2
"""The entry is a node: its chunk is an encoded list of entries, not data."""

KINDS: Final = ("list", "dict", "bytes", "bytearray", "ndarray", "parts")
"""``parts``: a value holding arrays or tensors, chunked by :mod:`pitstop.serde.partchunks`."""


class Entry(NamedTuple):
    """One chunk (or node) of a manifest."""

    key: bytes
    items: int
    """Items covered: list items, dict entries or buffer bytes."""
    size: int
    """Raw (serialised, uncompressed) bytes covered."""
    flags: int

    @property
    def is_node(self) -> bool:
        return bool(self.flags & NODE)


def pack_entries(entries: Sequence[Entry]) -> bytes:
    """A node chunk's bytes: its entries (:func:`unpack_entries` reads them)."""
    return ormsgpack.packb([list(e) for e in entries])


def unpack_entries(data: bytes) -> list[Entry]:
    """A node chunk's entries; ``ValueError`` if the bytes are not a list of entries."""
    out = []
    try:
        for key, items, size, flags in ormsgpack.unpackb(data):
            if type(key) is not bytes or len(key) != KEY_SIZE or not (
                    type(items) is int and type(size) is int and type(flags) is int):
                raise ValueError("malformed manifest entry")
            out.append(Entry(key, items, size, flags))
    except (TypeError, ormsgpack.MsgpackDecodeError):
        raise ValueError("malformed manifest entry") from None
    return out


@dataclass(slots=True)
class Layout:
    """A chunked value's structure: what a manifest describes, with what was computed for it.

    ``leaves`` (the data chunks in order) and ``nodes`` (node key -> entries) are known to the
    process that made or read it, so the next save of the field compares against them without
    reading anything.
    """

    kind: str
    meta: Any
    """Per kind: None, or ``[dtype descr, shape]`` for an array."""
    items: int
    root: list[Entry]
    leaves: list[Entry]
    nodes: dict[bytes, list[Entry]] = field(default_factory=dict)
    keying: ChunkKeys = PLAIN_MSGPACK
    """How the next version's new chunks are keyed (the store's keys, this value's format)."""
    starts: list[int] = field(default_factory=list)
    """Item offset of each leaf (computed on demand)."""
    prefix: tuple[int, int, bytes, bool] | None = None
    """``(leaves, bytes, xxh3-128, plain)`` of the first final leaves' bytes, if known: a
    whole-value save compares them with the new value's bytes in one hash, not one per leaf.
    ``plain``: they hold no byte that begins a msgpack bin (0xc4-0xc6), so the next save's
    check for raw buffers starts after them (``_split_guided`` in
    :mod:`pitstop.serde.chunks`)."""
    index: dict[bytes, tuple[Entry, list[Entry]]] = field(default_factory=dict)
    """The nodes by their last entry's key (:data:`~pitstop.serde.chunktree.NodeIndex`), for
    the next version's tree."""
    levels: list[tuple[list[Entry], list[Entry], list[int]]] = field(default_factory=list)
    """The tree's levels (:data:`~pitstop.serde.chunktree.Levels`), for the next version's tree."""

    def leaf_starts(self) -> list[int]:
        if len(self.starts) != len(self.leaves):
            acc, starts = 0, []
            for leaf in self.leaves:
                starts.append(acc)
                acc += leaf.items
            self.starts = starts
        return self.starts

    @property
    def size(self) -> int:
        """Raw bytes of the whole value's chunks."""
        return sum(e.size for e in self.root)

    def keys(self) -> set[bytes]:
        """Every chunk this value references: leaves and nodes."""
        return {e.key for e in self.leaves} | set(self.nodes)

    def manifest(self) -> bytes:
        return encode_manifest(self)


def encode_manifest(layout: Layout) -> bytes:
    return ormsgpack.packb(
        [
            MANIFEST_VERSION,
            layout.kind,
            layout.items,
            layout.meta,
            [list(e) for e in layout.root],
        ]
    )


def rekeyed_manifest(data: bytes, keys: Mapping[bytes, bytes]) -> bytes | None:
    """The manifest ``data`` with each root entry's key ``k`` in ``keys`` made ``keys[k]``
    (the rest as it is, whatever its version), or None if none is (or it is unreadable)."""
    try:
        parts = ormsgpack.unpackb(data)
        root = parts[4]
        changed = False
        for entry in root:
            new = keys.get(bytes(entry[0]))
            if new is not None:
                entry[0] = new
                changed = True
    except Exception:  # the read that needs it names the damage
        return None
    return ormsgpack.packb(parts) if changed else None


class Manifest(NamedTuple):
    kind: str
    items: int
    meta: Any
    root: list[Entry]


def decode_manifest(data: bytes) -> Manifest:
    """The manifest's parts; ``ValueError`` if it is not one this version reads."""
    try:
        version, kind, items, meta, root = ormsgpack.unpackb(data)
    except Exception as exc:
        raise ValueError(f"unreadable manifest ({exc})") from None
    if version == MANIFEST_PATCHED:
        if kind != "dict" or patch_meta(meta, root) is None:
            raise ValueError("malformed patched manifest")
    elif version != MANIFEST_VERSION:
        raise ValueError(f"manifest version {version} (written by a newer pitstop?)")
    if kind not in KINDS:
        raise ValueError(f"unknown chunked value kind {kind!r}")
    if type(items) is not int or items < 0 or type(root) is not list:
        raise ValueError("malformed manifest (its item count or root is not one)")
    try:
        entries = [Entry(bytes(k), n, s, f) for k, n, s, f in root]
    except (TypeError, ValueError):  # an entry that is not [key, items, size, flags]
        raise ValueError("malformed manifest (a root entry is not one)") from None
    if not all(type(e.items) is int and type(e.size) is int and type(e.flags) is int
               for e in entries):
        raise ValueError("malformed manifest (a root entry is not one)")
    return Manifest(kind, items, meta, entries)



def patch_meta(meta: Any, root: Sequence[Any]) -> tuple[int, list[int]] | None:
    """``(base, levels)`` of a patched manifest's meta, or None if it is not one."""
    if (
        type(meta) is not list
        or len(meta) != 3
        or meta[0] != "patch"
        or type(meta[1]) is not int
        or type(meta[2]) is not list
        or not 0 <= meta[1] <= len(root)
        or len(meta[2]) != len(root) - meta[1]
        or not all(type(level) is int and 0 <= level < 16 for level in meta[2])
    ):
        return None
    return meta[1], list(meta[2])


def is_patched(layout: Layout) -> bool:
    """Whether ``layout`` is a patched dict's (its items are not its keys' positions)."""
    return layout.kind == "dict" and layout.meta is not None


__all__ = [
    "CUT",
    "KINDS",
    "MANIFEST_PATCHED",
    "MANIFEST_VERSION",
    "NODE",
    "Entry",
    "Layout",
    "Manifest",
    "decode_manifest",
    "encode_manifest",
    "is_patched",
    "pack_entries",
    "patch_meta",
    "rekeyed_manifest",
    "unpack_entries",
]
