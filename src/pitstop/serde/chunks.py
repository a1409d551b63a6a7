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
* **Keys are content hashes** (:func:`~pitstop.serde.chunkkeys.chunk_key`: a kind byte and
  xxh3-128, ~30x the speed of SHA-256; in a sealed store, a keyed hash of that). A
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

The parts live in their own modules, re-exported here: the manifest's entries and layout
(:mod:`~pitstop.serde.chunkmanifest`), where items are cut and how they are encoded
(:mod:`~pitstop.serde.chunkcuts`), the tree of nodes (:mod:`~pitstop.serde.chunktree`),
patches of a dict (:mod:`~pitstop.serde.chunkpatches`) and the chunks' keys
(:mod:`~pitstop.serde.chunkkeys`). This module cuts a value against its parent's layout
(:func:`split`, :func:`split_delta`) and joins the chunks back (:func:`assemble`).
"""

from __future__ import annotations

import bisect
import operator
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol

import xxhash

from .chunkcuts import (
    BUFFER_CHUNK,
    DICT_PARAMS,
    LIST_PARAMS,
    SEALED_DICT_PARAMS,
    Dumps,
    Params,
    container_header,
    cut_ranges,
    encode_dict_item,
    encode_items,
    header_size,
)
from .chunkkeys import (
    KEY_SHA256,
    KEY_SIZE,
    KEY_XXH3,
    SHA256_KEYS,
    ChunkKeys,
    Keying,
    check_chunk,
    chunk_key,
    keying,
)
from .chunkmanifest import (
    CUT,
    KINDS,
    MANIFEST_PATCHED,
    MANIFEST_VERSION,
    NODE,
    Entry,
    Layout,
    Manifest,
    decode_manifest,
    encode_manifest,
    is_patched,
    pack_entries,
    rekeyed_manifest,
    unpack_entries,
)
from .chunkpatches import PATCH_GROUP, PATCH_MIN_ITEMS, may_patch, patch_dict
from .chunktree import Tree, build_tree, expand

CHUNKED_MIN: Final = 16 * 1024
"""Values serialising to fewer bytes are stored whole, as before. Low enough that a growing
list is chunked early: until then each save rewrites it whole (sum over the saves: ~4x this)."""


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
        encodings = encode_items(kind, value, dumps, 0, len(value))
        if encodings is None:
            return None
        params = LIST_PARAMS if kind == "list" else dict_params
        for first, stop, cut in cut_ranges(encodings, params, make.cut_seed):
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
    header = header_size(n)
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
    encodings = encode_items(kind, value, dumps, first, stop, items)
    if encodings is None:
        return None
    if suffix and offset + sum(map(len, encodings)) != back:
        # The suffix's bytes do not start at an item: serialise the rest item by item too.
        suffix, stop = [], n
        encodings = encode_items(kind, value, dumps, first, stop, items)
        if encodings is None:
            return None
    params = LIST_PARAMS if kind == "list" else dict_params
    ranges = cut_ranges(encodings, params, keys.cut_seed)
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
            encoded = encode_dict_item(dumps, k, v)
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

_KEY: Final = operator.itemgetter(0)  # an Entry's key


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
    "BUFFER_CHUNK",
    "CHUNKED_MIN",
    "CUT",
    "DICT_PARAMS",
    "KEY_SHA256",
    "KEY_SIZE",
    "KEY_XXH3",
    "KINDS",
    "LIST_PARAMS",
    "MANIFEST_PATCHED",
    "MANIFEST_VERSION",
    "NODE",
    "PATCH_GROUP",
    "PATCH_MIN_ITEMS",
    "SEALED_DICT_PARAMS",
    "SHA256_KEYS",
    "ChunkKeys",
    "Dumps",
    "Entry",
    "Exact",
    "Keying",
    "Layout",
    "Manifest",
    "Params",
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
