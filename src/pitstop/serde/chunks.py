"""Large values as content-addressed chunks: the chunker, the manifest and the assembly.

A field whose value serialises to at least :data:`CHUNKED_MIN` bytes and is a list, a dict with
str keys, ``bytes``/``bytearray`` or a numpy array is stored as *chunks* plus a small
*manifest* instead of one value, so that a new version of the value writes only the chunks
that changed. Nothing here touches a store: this module turns values into chunks and back.

* **Chunks are item-aligned.** A list chunk is the msgpack encodings of consecutive items
  concatenated; a dict chunk the encodings of consecutive ``key, value`` pairs; a buffer chunk
  a slice of the bytes. So the whole value is the container header followed by the chunks,
  joined: a restore decodes it in one ``loads`` call, never one per chunk.
* **Boundaries are content-defined** (for lists and dicts): a chunk ends after an item whose
  fast hash falls below a threshold proportional to the item's size (so chunks average
  :attr:`Params.target` bytes whatever the items' sizes), or at :attr:`Params.max`. Whether
  an item ends a chunk depends on that item alone, so an insertion, a deletion or an edit
  anywhere changes the chunk around it and no other (a minimum chunk size would make the cuts
  depend on their neighbours and let one edit shift the chunks after it).
  Buffers are cut at fixed offsets (an array's regions keep their positions).
* **Keys are content hashes** (:func:`chunk_key`: a kind byte and xxh3-128, ~30x the speed
  of SHA-256; in a sealed store, a keyed hash of that: :mod:`pitstop.serde.chunkkeys`). A
  save that has only the whole new value serialises it once, item by item, and finds the
  unchanged chunks by their keys: nothing unchanged is compressed or hashed with anything
  slower. A save that knows the change (:class:`~pitstop.Append`,
  :class:`~pitstop.Merge`) re-chunks only around it (:func:`split_delta`), O(change).
* **The manifest is a small tree.** Leaves are grouped into *nodes* (chunks holding entry
  lists) at content-defined points too, so a value of thousands of chunks has a root of a few
  entries; the trailing entries that are not yet part of a full group stay in the root. A
  growing list therefore rewrites its last chunk (until it is cut), and nothing else.

A list's last chunk is *open* (it ended with the value, not at a boundary): appending items
extends it. :attr:`Split.extended` lists the parent's open chunks that a new chunk extends, so
a store can keep the old one as "the first N bytes of the new one" instead of twice.
"""

from __future__ import annotations

import bisect
import operator
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

import ormsgpack
import xxhash

from .chunkkeys import (
    KEY_SHA256,
    KEY_SIZE,
    KEY_XXH3,
    PLAIN_MSGPACK,
    SHA256_KEYS,
    ChunkKeys,
    check_chunk,
    chunk_key,
)

MANIFEST_VERSION: Final = 1
MANIFEST_PATCHED: Final = 2
"""The version of a dict's manifest with *patches* (:func:`patch_dict`): leaves after the
base's that set keys again. An older pitstop refuses it rather than cut it wrongly."""
CHUNKED_MIN: Final = 16 * 1024
"""Values serialising to fewer bytes are stored whole, as before. Low enough that a growing
list is chunked early: until then each save rewrites it whole (sum over the saves: ~4x this)."""

# Entry flags.
CUT: Final = 1
"""The chunk ended at a content-defined boundary (or at the maximum size): it is final."""
NODE: Final = 2
"""The entry is a node: its chunk is an encoded list of entries, not data."""


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
"""A dict's chunks where every row written is kept (PostgreSQL: see :func:`sealed`): each
chunk there is a row, a reference row and three index entries (~340 bytes besides its
bytes), so fewer, larger chunks cost less on disk in all than rewriting less per save saves
(the issue's 10,000-key dict after 200 saves: 3.10 -> 2.61 MiB, saves 15 -> 11 ms)."""
BUFFER_CHUNK: Final = 1 << 20
"""Buffers (bytes, arrays) are cut every MiB: a region changed in a large array rewrites the
chunks it touches, and a 64 MiB array is 64 chunks."""

NODE_MASK: Final = 3
"""Entries are grouped into nodes of 4 on average: the entries after the last full group
are in every checkpoint record's root, and a changed leaf rewrites a node at each level."""
NODE_MAX: Final = 64
ROOT_NODES: Final = 8
"""A level with more sealed nodes than this is grouped again into a level above it."""

KINDS: Final = ("list", "dict", "bytes", "bytearray", "ndarray", "parts")
"""``parts``: a value holding arrays or tensors, chunked by :mod:`pitstop.serde.partchunks`."""


Keying = ChunkKeys | int
"""How the chunker keys new chunks: a :class:`~pitstop.serde.chunkkeys.ChunkKeys`, or a
serializer's format id alone (plain keys)."""


def keying(keys: Keying) -> ChunkKeys:
    """``keys`` as a :class:`~pitstop.serde.chunkkeys.ChunkKeys`."""
    return keys if isinstance(keys, ChunkKeys) else ChunkKeys(keys)


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
    check for raw buffers starts after them (:func:`_split_guided`)."""
    index: dict[bytes, tuple[Entry, list[Entry]]] = field(default_factory=dict)
    """The nodes by their last entry's key (:data:`NodeIndex`), for the next version's tree."""
    levels: list[tuple[list[Entry], list[Entry], list[int]]] = field(default_factory=list)
    """The tree's levels (:data:`Levels`), for the next version's tree."""

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
        if kind != "dict" or _patch_meta(meta, root) is None:
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


# -- patches: a Merge on a dict whose chunks are not known here --------------------------------
#
# A dict is decoded from its chunks joined, in one msgpack map: a key that comes twice takes
# the later value and keeps its first place, which is what Merge does (``dict.update``). So
# a Merge on a chunked dict can be written as chunks of the changed entries alone, after the
# value's own: the *patch*. Its manifest is the parent's root with the patch's leaves added
# (version MANIFEST_PATCHED, ``meta = ["patch", base, levels]``: the root's first ``base``
# entries are the dict's chunks before any patch, the rest are patch entries, at those
# levels: a leaf is level 0; PATCH_GROUP entries of one level become a node one level up,
# so the root stays short and the tree shallow however many patches follow). Nothing of the
# parent's value is read; the patch costs O(change). A save that has the whole value (a
# handle that read it) writes it whole again, without the duplicates (see
# ValueCodec._encode_chunked); a patch is refused once patches hold as many entries as the
# dict had before them (:func:`may_patch`), so the duplicates stay at most as many as the
# keys and the read that rewrites them is paid once per that many changes.

PATCH_GROUP: Final = 16
PATCH_MIN_ITEMS: Final = 4096
"""A dict of fewer keys takes patches up to this many entries before one is refused."""


def _patch_meta(meta: Any, root: Sequence[Any]) -> tuple[int, list[int]] | None:
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


def may_patch(manifest: Manifest, adding: int) -> bool:
    """Whether a dict's manifest may take a patch of ``adding`` entries (else the value is
    read and written whole, which drops the duplicates)."""
    if manifest.kind != "dict":
        return False
    found = _patch_meta(manifest.meta, manifest.root)
    if found is None:
        return manifest.meta is None
    base, _ = found
    patched = sum(e.items for e in manifest.root[base:])
    return patched + adding <= max(manifest.items - patched, PATCH_MIN_ITEMS)


def patch_dict(
    manifest: Manifest, entries: Mapping[str, Any], dumps: Dumps, keys: Keying,
    params: Params = DICT_PARAMS,
) -> tuple[bytes, int, dict[bytes, bytes]]:
    """The manifest of ``manifest``'s dict with ``entries`` set (see above), its size and
    the new chunks (leaves and nodes) by key. ``TypeError`` for a key msgpack cannot hold as
    a plain map key (the caller then applies the Merge to the value itself)."""
    encodings = []
    for name, value in entries.items():
        encoded = _encode_dict_item(dumps, name, value)
        if encoded is None:
            raise TypeError("the dict has a key msgpack cannot hold as a plain map key")
        encodings.append(encoded)
    found = _patch_meta(manifest.meta, manifest.root)
    base, levels = found if found is not None else (len(manifest.root), [])
    root = list(manifest.root)
    raws: dict[bytes, bytes] = {}
    make = keying(keys)
    for first, stop, _ in _cuts(encodings, params, make.cut_seed):
        raw = b"".join(encodings[first:stop])
        key = make(raw)
        raws[key] = raw
        root.append(Entry(key, stop - first, len(raw), CUT))
        levels.append(0)
        # PATCH_GROUP entries of one level at the end: one node a level up.
        while len(levels) >= PATCH_GROUP and len(set(levels[-PATCH_GROUP:])) == 1:
            group = root[-PATCH_GROUP:]
            packed = pack_entries(group)
            node = make(packed)
            raws[node] = packed
            level = levels[-1] + 1
            del root[-PATCH_GROUP:], levels[-PATCH_GROUP:]
            root.append(Entry(node, sum(e.items for e in group), sum(e.size for e in group),
                              CUT | NODE))
            levels.append(level)
    items = manifest.items + len(encodings)
    data = ormsgpack.packb([MANIFEST_PATCHED, "dict", items, ["patch", base, levels],
                            [list(e) for e in root]])
    return data, sum(e.size for e in root), raws


def is_patched(layout: Layout) -> bool:
    """Whether ``layout`` is a patched dict's (its items are not its keys' positions)."""
    return layout.kind == "dict" and layout.meta is not None


def expand(root: Sequence[Entry], nodes: Mapping[bytes, bytes | list[Entry]]) -> list[Entry]:
    """The leaves under ``root``, given the node chunks (raw bytes, or decoded entries)."""
    leaves: list[Entry] = []

    def walk(entries: Iterable[Entry]) -> None:
        for entry in entries:
            if entry.flags & NODE:
                found = nodes[entry.key]
                walk(unpack_entries(found) if isinstance(found, bytes | bytearray) else found)
            else:
                leaves.append(entry)

    walk(root)
    return leaves


# -- the tree ---------------------------------------------------------------------------------


_KEY: Final = operator.itemgetter(0)  # an Entry's key
_LAST: Final = operator.itemgetter(-1)

NodeIndex = dict[bytes, tuple[Entry, list[Entry]]]
"""A tree's nodes by the key of their last entry: what the next version's tree reuses
without packing or hashing a node again (its entries are compared first)."""


class _Builder:
    def __init__(self, keys: ChunkKeys, parent: Layout | None) -> None:
        self.keys = keys
        self.reuse: NodeIndex = parent.index if parent is not None else {}
        self.reuse_nodes = parent.nodes if parent is not None else {}
        self.nodes: dict[bytes, list[Entry]] = {}
        self.index: NodeIndex = {}
        self.packed: dict[bytes, bytes] = {}

    def node(self, entries: list[Entry]) -> Entry:
        last = entries[-1].key
        found = self.reuse.get(last)
        if found is not None and found[1] == entries:
            entry, entries = found
        else:
            packed = pack_entries(entries)
            key = self.keys(packed)
            self.packed[key] = packed
            items = size = 0
            for e in entries:
                items += e.items
                size += e.size
            entry = Entry(key, items, size, CUT | NODE)
        self.nodes[entry.key] = entries
        self.index[last] = (entry, entries)
        return entry

    def group(
        self, entries: list[Entry], before: tuple[list[Entry], list[Entry], list[int]] | None
    ) -> tuple[list[Entry], list[Entry], list[int]]:
        """Sealed nodes made of ``entries``, the trailing entries in no full group, and where
        each node ends. ``before`` is the same for the parent's tree at this level (its
        entries, nodes and ends): the nodes over a prefix the two share are the parent's,
        found with a few list comparisons instead of a pass over every entry."""
        sealed: list[Entry] = []
        ends: list[int] = []
        start = 0
        if before is not None and before[2]:
            old, old_sealed, old_ends = before
            lo, hi = 0, len(old_ends)  # how many of the parent's nodes are this level's too
            if entries[: old_ends[-1]] == old[: old_ends[-1]]:
                lo = hi
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if entries[: old_ends[mid - 1]] == old[: old_ends[mid - 1]]:
                    lo = mid
                else:
                    hi = mid - 1
            if lo:
                sealed = old_sealed[:lo]
                ends = old_ends[:lo]
                start = ends[-1]
                # The parent's nodes, registered in C loops (no Python loop over them: an
                # append re-uses all but the last few, whatever the value's length).
                keys = list(map(_KEY, sealed))
                children = list(map(self.reuse_nodes.__getitem__, keys))
                self.nodes.update(zip(keys, children, strict=True))
                lasts = map(_KEY, map(_LAST, children))
                self.index.update(zip(lasts, zip(sealed, children, strict=True), strict=True))
        current: list[Entry] = []
        for position in range(start, len(entries)):
            entry = entries[position]
            current.append(entry)
            # Cut only after a final entry: a node never holds a list's open last chunk,
            # which the next append replaces.
            if entry.flags & CUT and (
                len(current) >= NODE_MAX or (len(current) >= 2 and not entry.key[-1] & NODE_MASK)
            ):
                sealed.append(self.node(current))
                ends.append(position + 1)
                current = []
        return sealed, current, ends


Levels = list[tuple[list[Entry], list[Entry], list[int]]]
"""A tree's levels, bottom up: each level's entries, the nodes grouping them, where each ends."""


class Tree(NamedTuple):
    """What :func:`build_tree` makes. ``packed``: the nodes not taken from the parent's tree,
    encoded, the only ones that can be new (checked against the parent's nodes, not all of
    the tree's, and written as they are, not encoded again)."""

    root: list[Entry]
    nodes: dict[bytes, list[Entry]]
    node_index: NodeIndex
    levels: Levels
    packed: dict[bytes, bytes]


def build_tree(leaves: list[Entry], keys: Keying, parent: Layout | None = None) -> Tree:
    """The root entries over ``leaves``, the nodes they reference, their index and levels
    (what ``parent``'s tree shares with this one is taken from it, not packed and hashed
    again).

    Everything before the last leaves that are in no full group yet is one node: the root
    (in every checkpoint record) is then that node and those few leaves, not also the
    entries left over at each level above. That node holds the level above's leftovers after
    a node holding what precedes them, and so on up: an append rewrites the lowest of these
    nodes only when a group of leaves fills, and a record stays far below the size at which
    the database moves it to an overflow page.
    """
    builder = _Builder(keying(keys), parent)
    old_levels = parent.levels if parent is not None else []
    levels: Levels = []
    tails: list[list[Entry]] = []
    level = leaves
    while len(level) > ROOT_NODES:
        depth = len(levels)
        sealed, trailing, ends = builder.group(
            level, old_levels[depth] if depth < len(old_levels) else None
        )
        if not sealed:
            break
        levels.append((level, sealed, ends))
        tails.append(trailing)
        level = sealed
    if not tails:
        return Tree(list(level), builder.nodes, builder.index, levels, builder.packed)
    head = list(level)
    for trailing in reversed(tails[1:]):
        head = [builder.node(head), *trailing] if len(head) > 1 else head + trailing
    if len(head) > 1:
        head = [builder.node(head)]
    return Tree([*head, *tails[0]], builder.nodes, builder.index, levels, builder.packed)


# -- item encodings ---------------------------------------------------------------------------


def kind_of(value: Any) -> str | None:
    """Which chunked kind ``value`` would be stored as (None: stored whole)."""
    cls = type(value)
    if cls is list:
        return "list"
    if cls is dict:
        return "dict"
    if cls is bytes:
        return "bytes"
    if cls is bytearray:
        return "bytearray"
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.ndarray and not value.dtype.hasobject:
        return "ndarray"
    return None


Dumps = Callable[[Any], bytes]

_STR_HEADS: Final = frozenset(range(0xA0, 0xC0)) | {0xD9, 0xDA, 0xDB}


def _encode_dict_item(dumps: Dumps, key: Any, value: Any) -> bytes | None:
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


def _cuts(
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


class Exact(Protocol):
    """A serialiser's ``dumps`` in two steps (:class:`~pitstop.serde.codec.MsgpackSerializer`):
    the plain encoding, then its check for what it cannot hold exactly, from an offset."""

    def dumps_unchecked(self, value: Any) -> bytes | None: ...
    def checked(self, value: Any, packed: bytes, start: int) -> tuple[bytes, bool]: ...


class Split(NamedTuple):
    """A value cut into chunks, relative to its parent's layout."""

    layout: Layout
    new: dict[bytes, bytes | memoryview]
    """Chunks (and nodes) the parent did not reference: key -> raw bytes (a buffer's chunks:
    views of its memory, to frame before it changes)."""
    extended: list[tuple[bytes, bytes, int]]
    """``(old key, new key, old size)``: the parent's open chunk ``old key`` is the first
    ``old size`` bytes of the new chunk ``new key``."""


def _finish(
    kind: str,
    meta: Any,
    items: int,
    leaves: list[Entry],
    raws: Mapping[bytes, bytes | memoryview],
    keys: ChunkKeys,
    parent: Layout | None,
    shared: int = 0,
    known: set[bytes] | None = None,
) -> Split:
    """The layout over ``leaves`` and what of it is new. ``shared``: the first leaves are
    the parent's first ones (their item offsets are the parent's, not added up again).
    ``known``: the parent's leaf keys that may be among ``raws`` (None: any of them); a
    chunk of ``raws`` not in it is written as new even if the parent has it elsewhere, which
    costs a write that changes nothing (the store keeps the row it has) but no pass over
    the parent's leaves."""
    root, nodes, index, levels, packed = build_tree(leaves, keys, parent)
    layout = Layout(kind, meta, items, root, leaves, nodes, keys, index=index, levels=levels)
    if parent is not None and shared and parent.kind == kind:
        old_starts = parent.leaf_starts()
        starts = old_starts[:shared]
        acc = old_starts[shared - 1] + leaves[shared - 1].items
        for leaf in leaves[shared:]:
            starts.append(acc)
            acc += leaf.items
        layout.starts = starts
    if known is None:
        known = {e.key for e in parent.leaves} if parent is not None else set()
    new = {k: raw for k, raw in raws.items() if k not in known}
    # Only a node packed anew can be new: a pass over those few, not over every node.
    old_nodes = parent.nodes if parent is not None else {}
    for key, encoded in packed.items():
        if key not in old_nodes:
            new[key] = encoded
    extended: list[tuple[bytes, bytes, int]] = []
    if parent is not None and parent.kind == kind and parent.leaves:
        last = parent.leaves[-1]
        if not last.flags & CUT:
            start = parent.leaf_starts()[-1]
            starts = layout.leaf_starts()
            i = bisect.bisect_left(starts, start)
            if i < len(leaves) and starts[i] == start:
                leaf = leaves[i]
                raw = raws.get(leaf.key)
                if (
                    raw is not None
                    and leaf.key in new
                    and leaf.size > last.size
                    and keys(memoryview(raw)[: last.size]) == last.key
                ):
                    extended.append((last.key, leaf.key, last.size))
    return Split(layout, new, extended)


SEAL_MIN: Final = 2 * 1024
"""An open last chunk at least this large is sealed by :func:`sealed` rather than extended."""


def sealed(parent: Layout, min_size: int = SEAL_MIN) -> Layout:
    """``parent`` with its open last chunk made final, if that chunk holds ``min_size`` bytes.

    For a store that keeps every row it writes as written (PostgreSQL: an update leaves the
    old row version behind until a vacuum): a grown list then keeps the parent's last chunk
    as it is and writes the new items as a chunk of their own, instead of a longer copy of
    the open chunk (whose superseded versions would add up to many times the list). A save
    then inserts rows and never rewrites one; chunks are cut where saves ended as well as
    where the content says.
    """
    leaves = parent.leaves
    if not leaves or leaves[-1].flags & CUT or leaves[-1].size < min_size:
        return parent
    last = leaves[-1]
    return Layout(
        parent.kind,
        parent.meta,
        parent.items,
        parent.root,
        [*leaves[:-1], last._replace(flags=last.flags | CUT)],
        parent.nodes,
        parent.keying,
        starts=parent.starts,  # the same leaves: their offsets are not added up again
        prefix=parent.prefix,
        index=parent.index,
        levels=parent.levels,
    )


def _buffer_of(kind: str, value: Any) -> tuple[memoryview, Any]:
    if kind == "ndarray":
        from numpy.lib import format as npy_format

        array = value if value.flags.c_contiguous else value.copy(order="C")
        meta = [npy_format.dtype_to_descr(array.dtype), list(array.shape)]
        return memoryview(array.reshape(-1).view("u1")), meta
    return memoryview(value), None


def split(
    value: Any,
    dumps: Dumps,
    keys: Keying,
    parent: Layout | None = None,
    *,
    dict_params: Params = DICT_PARAMS,
    exact: Exact | None = None,
) -> Split | None:
    """``value`` as chunks, or None if it is not a chunked kind (or a dict msgpack cannot
    hold as a plain map). Every item is serialised once; chunks the parent has are found by
    their keys. ``dict_params``: where a dict is cut (a list always at :data:`LIST_PARAMS`).
    ``exact``: ``dumps`` in two steps, if the serialiser has them (see :func:`_split_guided`)."""
    kind = kind_of(value)
    if kind is None:
        return None
    make = keying(keys)
    raws: dict[bytes, Any] = {}
    leaves: list[Entry] = []
    if kind in ("list", "dict"):
        if parent is not None and parent.kind == kind and parent.leaves:
            return _split_guided(kind, value, dumps, make, parent, dict_params, exact)
        encodings = _encode_items(kind, value, dumps, 0, len(value))
        if encodings is None:
            return None
        params = LIST_PARAMS if kind == "list" else dict_params
        for first, stop, cut in _cuts(encodings, params, make.cut_seed):
            raw = b"".join(encodings[first:stop])
            key = make(raw)
            raws[key] = raw
            leaves.append(Entry(key, stop - first, len(raw), CUT if cut else 0))
        return _finish(kind, None, len(encodings), leaves, raws, make, parent)
    buffer, meta = _buffer_of(kind, value)
    known = parent.keys() if parent is not None else set()
    total = len(buffer)
    pieces = [buffer[offset : offset + BUFFER_CHUNK] for offset in range(0, total, BUFFER_CHUNK)]
    for piece, key in zip(pieces, make.many(pieces), strict=True):
        if key not in known and key not in raws:
            raws[key] = piece  # a view: the store frames (copies) only the new ones
        leaves.append(Entry(key, len(piece), len(piece), CUT))
    return _finish(kind, meta, total, leaves, raws, make, parent)


def _encode_items(
    kind: str, value: Any, dumps: Dumps, first: int, stop: int, items: list[Any] | None = None
) -> list[bytes] | None:
    """The encodings of items ``first`` to ``stop`` (None: a dict msgpack cannot hold)."""
    if kind == "list":
        return [dumps(item) for item in value[first:stop]]
    pairs = items if items is not None else list(value.items())
    out = []
    for k, v in pairs[first:stop]:
        encoded = _encode_dict_item(dumps, k, v)
        if encoded is None:
            return None
        out.append(encoded)
    return out


def _header_size(n: int) -> int:
    return 1 if n < 16 else 3 if n < 1 << 16 else 5


def _split_guided(
    kind: str, value: Any, dumps: Dumps, keys: ChunkKeys, parent: Layout, dict_params: Params,
    exact: Exact | None = None,
) -> Split | None:
    """``value`` cut where its parent was, where it can be. The value is serialised once,
    whole; each of the parent's chunks is then compared, by its key, with the bytes at its
    old place (then, after the first that differs, at its place counted from the end, which
    an insertion or deletion shifts). Only what lies between the matching prefix and suffix
    is serialised item by item and cut afresh, so a whole-value save of a grown list costs
    about one serialisation of it and a fast hash of it.

    Equal bytes from the start are the same items (msgpack items delimit themselves). For
    the suffix the bytes are checked to begin where the re-serialised middle ends; if not,
    nothing after the prefix is reused.

    With ``exact``, the check of the whole encoding for raw buffers (a scan of it for three
    byte values) skips the kept prefix when the parent's prefix held none of those bytes:
    equal bytes hold the same bin headers, so none.
    """
    n = len(value)
    items = list(value.items()) if kind == "dict" else None
    old = parent.leaves
    starts = parent.leaf_starts()
    packed = exact.dumps_unchecked(value) if exact is not None else None
    whole = dumps(value) if packed is None else packed
    header = _header_size(n)
    body = memoryview(whole)[header:]
    total = len(body)
    digest = xxhash.xxh3_128_digest
    format_id = keys.format_id
    # A parent's chunk is compared with the bytes at its place by one xxh3 pass over them:
    # its key is then the key of that digest (keyed, in a sealed store: see ChunkKeys).
    key_of = keys.of_xxh3
    leaves: list[Entry] = []
    raws: dict[bytes, bytes] = {}

    i = 0
    offset = 0
    count = len(old)
    span = parent.prefix
    # One pass of the hash over the value's bytes, not two: the state after the parent's
    # prefix is carried on to the end of this version's (its next save checks that one).
    prefix_hash: Any = None
    hashed = 0  # bytes prefix_hash has seen
    if (
        span is not None
        and span[0] <= count
        and starts[span[0] - 1] + old[span[0] - 1].items <= n
        and span[1] <= total
    ):
        prefix_hash = xxhash.xxh3_128(body[: span[1]], seed=format_id)
        if prefix_hash.digest() == span[2]:
            i, offset = span[0], span[1]  # the parent's final chunks, checked in one hash
            hashed = offset
        else:
            prefix_hash = None
    plain = False  # whether the body holds no bin header byte (see Layout.prefix)
    if exact is not None and packed is not None:
        clean_to = header + (hashed if span is not None and span[3] else 0)
        whole, plain = exact.checked(value, packed, clean_to)
        if whole is not packed:  # a raw buffer (rare): its exact bytes are not those hashed
            return _split_guided(kind, value, dumps, keys, parent, dict_params)
    while i < count:
        entry = old[i]
        if not entry.flags & CUT or starts[i] + entry.items > n or offset + entry.size > total:
            break
        if key_of(digest(body[offset : offset + entry.size], seed=format_id)) != entry.key:
            break
        offset += entry.size
        i += 1
    leaves.extend(old[:i])
    first = starts[i] if i < count else parent.items
    suffix: list[Entry] = []
    back = total  # byte offset where the kept suffix begins
    kept_items = 0
    j = count - 1
    while j > i:
        entry = old[j]
        if (
            n - kept_items - entry.items < first
            or back - entry.size < offset
            or key_of(digest(body[back - entry.size : back], seed=format_id)) != entry.key
        ):
            break
        suffix.append(entry)
        back -= entry.size
        kept_items += entry.items
        j -= 1
    suffix.reverse()
    stop = n - kept_items
    encodings = _encode_items(kind, value, dumps, first, stop, items)
    if encodings is None:
        return None
    if suffix and offset + sum(map(len, encodings)) != back:
        # The suffix's bytes do not start at an item: serialise the rest item by item too.
        suffix, stop = [], n
        encodings = _encode_items(kind, value, dumps, first, stop, items)
        if encodings is None:
            return None
    params = LIST_PARAMS if kind == "list" else dict_params
    ranges = _cuts(encodings, params, keys.cut_seed)
    for k, (a, b, cut) in enumerate(ranges):
        raw = b"".join(encodings[a:b])
        key = keys(raw)
        raws[key] = raw
        final = cut or (k == len(ranges) - 1 and bool(suffix))  # cut before a kept suffix
        leaves.append(Entry(key, b - a, len(raw), CUT if final else 0))
    leaves.extend(suffix)
    # Only the parent's chunks between the kept prefix and suffix can be among the new ones
    # (one equal to a chunk elsewhere is written again, to no effect): no set of every key.
    replaced = {e.key for e in old[i : count - len(suffix)]}
    result = _finish(kind, None, n, leaves, raws, keys, parent, shared=i, known=replaced)
    # What the next whole-value save checks in one hash: the bytes of the final chunks
    # before the last one (the last may become a kept suffix, shifted).
    kept = len(leaves) - 1
    while kept > 0 and not leaves[kept - 1].flags & CUT:
        kept -= 1
    if kept > 0:
        if kept >= i:  # the kept prefix's bytes are known: add only what follows it
            end = offset + sum(e.size for e in leaves[i:kept])
        else:
            end = sum(e.size for e in leaves[:kept])
        if prefix_hash is not None and end >= hashed:
            prefix_hash.update(body[hashed:end])
            key = prefix_hash.digest()
        else:
            key = digest(body[:end], seed=format_id)
        result.layout.prefix = (kept, end, key, plain)
    return result


# -- deltas -----------------------------------------------------------------------------------


def split_delta(
    parent: Layout,
    value: Any,
    dirty: Iterable[int],
    dumps: Dumps,
    *,
    dict_params: Params = DICT_PARAMS,
) -> Split:
    """``value`` as chunks when only the items at positions ``dirty`` (and any beyond the
    parent's length) may differ from the parent's, which ``parent`` describes.

    Only the chunks around a dirty position are serialised again: from the start of the
    parent's chunk holding it until a new boundary falls on one of the parent's (from where
    the chunks are the parent's again). O(change), not O(size).
    """
    kind = parent.kind
    if kind not in ("list", "dict") or kind_of(value) != kind:
        raise TypeError(f"a delta applies to a chunked list or dict, not to {parent.kind}")
    params = LIST_PARAMS if kind == "list" else dict_params
    n = len(value)
    old_leaves = parent.leaves
    starts = parent.leaf_starts()
    count = len(old_leaves)

    def ending_at(position: int) -> int | None:
        """The parent's leaf that ends at ``position`` (None: none does)."""
        if position == parent.items:
            return count - 1 if count else None
        j = bisect.bisect_left(starts, position)
        return j - 1 if 0 < j < count and starts[j] == position else None

    if n < parent.items:
        raise ValueError("a delta cannot remove items")
    points = sorted({d for d in dirty if d < parent.items})
    if n > parent.items:
        points.append(parent.items)
    items: list[Any] | None = None

    def encode(first: int, stop: int) -> list[bytes]:
        nonlocal items
        if kind == "list":
            return [dumps(item) for item in value[first:stop]]
        if items is None:
            items = list(value.items())
        out = []
        for k, v in items[first:stop]:
            encoded = _encode_dict_item(dumps, k, v)
            if encoded is None:
                raise TypeError("the dict has a key msgpack cannot hold as a plain map key")
            out.append(encoded)
        return out

    keys = parent.keying
    leaves: list[Entry] = []
    raws: dict[bytes, bytes] = {}
    shared: int | None = None  # how many leading leaves are the parent's
    replaced: set[bytes] = set()  # keys of the parent's leaves that were re-chunked

    def emit(chunk: list[bytes], flags: int) -> None:
        nonlocal shared
        if shared is None:
            shared = len(leaves)
        raw = b"".join(chunk)
        key = keys(raw)
        raws[key] = raw
        leaves.append(Entry(key, len(chunk), len(raw), flags))

    digest = xxhash.xxh3_64_intdigest
    seed = keys.cut_seed
    hi = params.max
    scale = (1 << 64) // params.target
    leaf = 0  # the next parent leaf not yet passed
    p = 0  # the next dirty point not yet passed
    while p < len(points):
        point = points[p]
        # The parent's final leaves entirely before the dirty point are the new value's too
        # (the parent's open last chunk never is: it is re-chunked with what follows it).
        # Only a last leaf is ever open: those but the last of them are taken at once, found
        # by bisection (leaf i ends where leaf i + 1 starts), the last is checked below.
        upto = count if point >= parent.items else bisect.bisect_right(starts, point) - 1
        if upto - 1 > leaf:
            leaves.extend(old_leaves[leaf : upto - 1])
            leaf = upto - 1
        while (
            leaf < len(old_leaves)
            and starts[leaf] + old_leaves[leaf].items <= point
            and old_leaves[leaf].flags & CUT
        ):
            leaves.append(old_leaves[leaf])
            leaf += 1
        position = starts[leaf] if leaf < len(old_leaves) else parent.items
        rechunked_from = leaf
        chunk: list[bytes] = []
        size = 0
        resumed = False
        # Re-chunk from there until a cut lands where one of the parent's did, past every
        # dirty point met on the way: from there on the parent's chunks are this value's.
        while position < n and not resumed:
            for encoded in encode(position, min(n, position + 64)):
                chunk.append(encoded)
                size += len(encoded)
                position += 1
                if size >= hi or digest(encoded, seed) < len(encoded) * scale:
                    emit(chunk, CUT)
                    chunk, size = [], 0
                    while p < len(points) and points[p] < position:
                        p += 1
                    j = ending_at(position)
                    if j is not None and old_leaves[j].flags & CUT:
                        leaf = j + 1
                        resumed = True
                        break
        if not resumed:
            if chunk:
                emit(chunk, 0)
            leaf = len(old_leaves)
        replaced.update(e.key for e in old_leaves[rechunked_from:leaf])
        if not resumed:
            break
    # After the last dirty point the parent's leaves carry on unchanged.
    leaves.extend(old_leaves[leaf:])
    return _finish(
        kind, parent.meta, n, leaves, raws, keys, parent,
        shared=len(leaves) if shared is None else shared, known=replaced,
    )


# -- assembly ---------------------------------------------------------------------------------


def assemble(
    kind: str,
    meta: Any,
    items: int,
    leaves: Sequence[Entry],
    raws: Mapping[bytes, bytes | memoryview],
) -> Any:
    """The value from its leaves' raw chunks: encoded bytes for ``loads`` (lists and dicts,
    returned as ``bytes``), or the value itself for buffers (returned as is)."""
    parts = [raws[leaf.key] for leaf in leaves]
    if kind in ("list", "dict"):
        return b"".join([container_header(kind, items), *parts])
    if kind == "bytes":
        return b"".join(parts)
    if kind == "bytearray":
        return bytearray().join(parts)
    import numpy

    descr, shape = meta
    from numpy.lib import format as npy_format

    dtype = npy_format.descr_to_dtype(descr)
    buffer = bytearray().join(parts)
    if not shape or 0 in shape:
        return numpy.zeros(tuple(shape), dtype=dtype)
    return numpy.frombuffer(buffer, dtype=dtype).reshape(tuple(shape))


# A list decoded a group of leaves at a time: each group is copied into a buffer the cache
# still holds when the decode reads it (a join of the whole value into a new buffer of
# megabytes, read once more by the decode, cost ~0.6 ms of a 2,000-message restore).
LIST_GROUP_BYTES: Final = 64 * 1024


def list_groups(
    leaves: Sequence[Entry],
    raws: Mapping[bytes, bytes | memoryview],
    release: Callable[[bytes], None] | None = None,
) -> Iterator[bytes]:
    """A list's leaves as encoded lists of about ``LIST_GROUP_BYTES`` each (an array header
    and the items of consecutive leaves): their items, decoded one group after another, are
    the list's, without the bytes of the whole list joined in one buffer. ``release`` is
    called with each key after its last leaf is in a group (the caller drops its rows)."""
    part: list[bytes | memoryview] = []
    count = size = 0
    last = dict(zip(map(_KEY, leaves), range(len(leaves)), strict=True))  # a key may repeat
    for position, leaf in enumerate(leaves):
        raw = raws[leaf.key]
        if release is not None and last[leaf.key] == position:
            release(leaf.key)
        part.append(raw)
        count += leaf.items
        size += len(raw)
        if size >= LIST_GROUP_BYTES:
            yield b"".join([container_header("list", count), *part])
            part, count, size = [], 0, 0
    if part or not leaves:
        yield b"".join([container_header("list", count), *part])


__all__ = [
    "CHUNKED_MIN",
    "CUT",
    "KEY_SHA256",
    "KEY_SIZE",
    "KEY_XXH3",
    "MANIFEST_PATCHED",
    "NODE",
    "PATCH_GROUP",
    "PATCH_MIN_ITEMS",
    "SHA256_KEYS",
    "ChunkKeys",
    "Entry",
    "Keying",
    "Layout",
    "Manifest",
    "Split",
    "Tree",
    "assemble",
    "build_tree",
    "check_chunk",
    "chunk_key",
    "container_header",
    "decode_manifest",
    "encode_manifest",
    "expand",
    "is_patched",
    "keying",
    "kind_of",
    "list_groups",
    "may_patch",
    "pack_entries",
    "patch_dict",
    "rekeyed_manifest",
    "sealed",
    "split",
    "split_delta",
    "unpack_entries",
]
