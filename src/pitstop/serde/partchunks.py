"""Values holding arrays and tensors, chunked from the arrays' own memory (the ``parts`` kind).

A field whose value is or holds numpy arrays or torch tensors of at least
:data:`~pitstop.serde.buffers.BUFFER_MIN` bytes (a tensor, a ``state_dict()``, an optimizer's
state, a dict of weights and Python values) is stored as:

* its *skeleton*: the msgpack encoding of the value with each such array replaced by a small
  reference (``ExtCode.BUFFER``: index, dtype, shape, layout), and
* each array's raw bytes, never passed through msgpack,

all cut at fixed offsets (:data:`~pitstop.serde.chunkcuts.BUFFER_CHUNK`, counted from the start
of the skeleton and of each buffer) into chunks keyed by
:class:`~pitstop.serde.chunkkeys.ChunkKeys`, the same content addresses as every chunked value. The
manifest's ``meta`` is ``[skeleton length, [buffer length, ...]]``; its leaves are the
skeleton's chunks, then each buffer's in order.

A save hashes each chunk where it lies in the array (xxh3-128, at memory speed) and copies only
the chunks its parent did not have: an unchanged tensor costs one hash pass and nothing else.
A load builds each array on one buffer the chunks are read into.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from . import buffers, parallel
from .chunks import (
    BUFFER_CHUNK,
    CUT,
    Entry,
    Keying,
    Layout,
    Split,
    build_tree,
    keying,
    pack_entries,
)

KIND: Final = "parts"

_SCAN_BUDGET: Final = 20_000
"""Containers and items looked at before giving up on finding an array in a value: a long
list of plain records (a conversation) is not walked whole on every save to find none."""


def may_hold_buffers() -> bool:
    """Whether any value could hold an array or a tensor (numpy or torch imported)."""
    modules = sys.modules
    return "numpy" in modules or "torch" in modules


_PLAIN: Final = frozenset({str, int, float, bool, bytes, type(None)})
"""Types that never hold an array: skipped without looking further."""

_CONTAINERS: Final = frozenset({dict, list, tuple, collections.OrderedDict})


def holds_buffers(value: Any, min_size: int = buffers.BUFFER_MIN) -> bool:
    """Whether ``value`` is, or holds in dicts, lists and tuples, an array or tensor of at
    least ``min_size`` bytes (what :func:`split_parts` takes out of band)."""
    numpy = sys.modules.get("numpy")
    ndarray = numpy.ndarray if numpy is not None else None
    plain = _PLAIN
    containers = _CONTAINERS
    budget = _SCAN_BUDGET
    stack = [value]
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls in plain:
            continue
        if cls in containers:
            budget -= len(item) + 1
            if budget < 0:
                return False
            # Only what could hold an array goes on the stack (most items are strings).
            stack.extend(
                v
                for v in (item.values() if isinstance(item, dict) else item)
                if type(v) not in plain
            )
        elif cls is ndarray:
            if item.nbytes >= min_size and not item.dtype.hasobject:
                return True
        elif cls.__module__.startswith("torch"):
            from .tensors import is_tensor_class

            if is_tensor_class(cls) and item.nbytes >= min_size:
                return True
    return False


def split_parts(
    skeleton: bytes, views: Sequence[memoryview], keys: Keying, parent: Layout | None
) -> Split:
    """A ``dumps_parts`` result as chunks; those the parent references are not in ``new``.

    The new chunks are views of the arrays' memory: frame or copy them before the arrays
    change.
    """
    known = parent.keys() if parent is not None else set()
    raws: dict[bytes, Any] = {}
    leaves: list[Entry] = []
    pieces: list[memoryview] = []
    for view in (memoryview(skeleton), *views):
        segment = view.cast("B") if view.format != "B" else view
        pieces.extend(segment[o : o + BUFFER_CHUNK] for o in range(0, len(segment), BUFFER_CHUNK))
    # One hash pass over every array (several threads for large ones).
    make = keying(keys)
    for piece, key in zip(pieces, make.many(pieces), strict=True):
        if key not in known and key not in raws:
            raws[key] = piece  # a view of the array: the store frames (copies) it once
        leaves.append(Entry(key, len(piece), len(piece), CUT))
    lengths = [len(skeleton), [v.nbytes for v in views]]
    total = len(skeleton) + sum(v.nbytes for v in views)
    same_kind = parent if parent is not None and parent.kind == KIND else None
    root, nodes, index, levels, _ = build_tree(leaves, make, same_kind)
    layout = Layout(KIND, lengths, total, root, leaves, nodes, make, index=index, levels=levels)
    new: dict[bytes, Any] = {k: raw for k, raw in raws.items() if k not in known}
    for key, entries in nodes.items():
        if key not in known:
            new[key] = pack_entries(entries)
    return Split(layout, new, [])


def segments(meta: Any, total: int) -> tuple[int, list[int]]:
    """``(skeleton length, buffer lengths)`` from a manifest's meta, checked."""
    if (
        type(meta) is not list
        or len(meta) != 2
        or type(meta[0]) is not int
        or type(meta[1]) is not list
        or any(type(n) is not int or n < 0 for n in meta[1])
        or meta[0] < 0
    ):
        raise ValueError(f"bad parts layout {meta!r}")
    skeleton, lengths = meta
    if skeleton + sum(lengths) != total:
        raise ValueError("parts layout does not add up")
    return skeleton, lengths


Fill = Callable[[Entry, memoryview], None]
"""Writes the raw bytes of the chunk ``entry`` names into the view (exactly its size)."""

Plan = Callable[[Sequence[tuple[Entry, memoryview]]], None]
"""Told every chunk's place before the first is filled: a store reading over a network
starts its reads then, each writing straight into its places (the same views ``Fill`` is
then called with)."""


def assemble_parts(
    meta: Any, total: int, leaves: Sequence[Entry], fill: Fill, plan: Plan | None = None
) -> tuple[bytes, list[Any]]:
    """The skeleton and one new writable buffer per array (a ``bytearray`` or a writable
    ``memoryview``), each filled chunk by chunk by ``fill`` (which reads, or copies, a
    chunk straight into its place: no joining)."""
    skeleton_size, lengths = segments(meta, total)
    targets = [bytearray(skeleton_size), *(uninitialised(n) for n in lengths)]
    fill_buffers(targets, leaves, fill, plan)
    return bytes(targets[0]), targets[1:]


def fill_buffers(
    targets: Sequence[Any], leaves: Sequence[Entry], fill: Fill, plan: Plan | None = None
) -> None:
    """Fill ``targets`` (writable buffers, one after the other) with the chunks ``leaves``
    name, in their order: each chunk's place found first, then the chunks read (several
    threads for a large value: each chunk has a place of its own). ``plan`` is told every
    place before the first chunk is read."""
    jobs: list[tuple[Entry, memoryview]] = []
    index, offset = 0, 0
    views = [memoryview(t) for t in targets]
    for leaf in leaves:
        while index < len(views) and offset == views[index].nbytes:
            index, offset = index + 1, 0
        if index == len(views) or offset + leaf.size > views[index].nbytes:
            raise ValueError("a chunk crosses the end of its buffer")
        if leaf.size != leaf.items:
            raise ValueError("a buffer chunk's size and length differ")
        jobs.append((leaf, views[index][offset : offset + leaf.size]))
        offset += leaf.size
    while index < len(views) and offset == views[index].nbytes:
        index, offset = index + 1, 0
    if index != len(views):
        raise ValueError("the chunks do not fill the buffers")
    if plan is not None:
        plan(jobs)
    parallel.each(lambda job: fill(*job), jobs, sum(v.nbytes for v in views))


def uninitialised(size: int) -> Any:
    """A writable buffer of ``size`` bytes, not zeroed first (``bytearray(n)`` writes every
    byte once before the chunks do: a third of a 256 MiB load, measured).

    A large one starts on a 2 MiB boundary: numpy asks the kernel for huge pages from 4 MiB,
    but only whole aligned 2 MiB ranges of a mapping get them, and the rest of a buffer at
    an arbitrary address faults in 4 KiB at a time (an 8-tensor state_dict of 256 MiB took
    3,700 page faults to a lone array's 640, and 1.6x its time). The spare bytes before and
    after the buffer are never touched, so they take no memory."""
    try:
        import numpy
    except ImportError:
        return bytearray(size)
    if size < _HUGE_MIN:
        return memoryview(numpy.empty(size, dtype=numpy.uint8).data)
    spare = numpy.empty(size + _HUGE_PAGE, dtype=numpy.uint8)
    start = -spare.ctypes.data % _HUGE_PAGE
    return memoryview(spare[start : start + size].data)


_HUGE_PAGE: Final = 2 << 20
_HUGE_MIN: Final = 4 << 20
"""Buffers from this size are aligned to a huge page (numpy's own threshold for asking)."""


def copy_fill(raws: Mapping[bytes, bytes | memoryview]) -> Fill:
    """A :data:`Fill` from chunks already in memory."""

    def fill(entry: Entry, target: memoryview) -> None:
        raw = raws[entry.key]
        if len(raw) != len(target):
            raise ValueError("a chunk has the wrong size")
        target[:] = raw

    return fill


__all__ = [
    "KIND",
    "Fill",
    "assemble_parts",
    "copy_fill",
    "fill_buffers",
    "holds_buffers",
    "may_hold_buffers",
    "segments",
    "split_parts",
    "uninitialised",
]
