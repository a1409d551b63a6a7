"""The tree of a chunked value's manifest: leaves grouped into nodes, nodes into nodes.

Leaves are grouped into *nodes* (chunks holding entry lists, :func:`~pitstop.serde.chunkmanifest.
pack_entries`) at content-defined points, so a value of thousands of chunks has a root of a
few entries; the trailing entries that are not yet part of a full group stay in the root. A
new version's tree takes from its parent's every node over what the two share, found by
comparing entries, without packing or hashing it again (:func:`build_tree`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple

from .chunkkeys import ChunkKeys, Keying, keying
from .chunkmanifest import CUT, NODE, Entry, Layout, pack_entries, unpack_entries

NODE_MASK: Final = 3
"""Entries are grouped into nodes of 4 on average: the entries after the last full group
are in every checkpoint record's root, and a changed leaf rewrites a node at each level."""
NODE_MAX: Final = 64
ROOT_NODES: Final = 8
"""A level with more sealed nodes than this is grouped again into a level above it."""

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


__all__ = [
    "NODE_MASK",
    "NODE_MAX",
    "ROOT_NODES",
    "Levels",
    "NodeIndex",
    "Tree",
    "build_tree",
    "expand",
]
