"""Patches: a Merge on a chunked dict whose chunks are not known here, written as the changed
entries' chunks after the dict's own.

A dict is decoded from its chunks joined, in one msgpack map: a key that comes twice takes
the later value and keeps its first place, which is what Merge does (``dict.update``). So
a Merge on a chunked dict can be written as chunks of the changed entries alone, after the
value's own: the *patch*. Its manifest is the parent's root with the patch's leaves added
(version MANIFEST_PATCHED, ``meta = ["patch", base, levels]``: the root's first ``base``
entries are the dict's chunks before any patch, the rest are patch entries, at those
levels: a leaf is level 0; PATCH_GROUP entries of one level become a node one level up,
so the root stays short and the tree shallow however many patches follow). Nothing of the
parent's value is read; the patch costs O(change). A save that has the whole value (a
handle that read it) writes it whole again, without the duplicates (see
ValueCodec._encode_chunked); a patch is refused once patches hold as many entries as the
dict had before them (:func:`may_patch`), so the duplicates stay at most as many as the
keys and the read that rewrites them is paid once per that many changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import ormsgpack

from .chunkcuts import DICT_PARAMS, Dumps, Params, cut_ranges, encode_dict_item
from .chunkkeys import Keying, keying
from .chunkmanifest import CUT, MANIFEST_PATCHED, NODE, Entry, Manifest, pack_entries, patch_meta

PATCH_GROUP: Final = 16
PATCH_MIN_ITEMS: Final = 4096
"""A dict of fewer keys takes patches up to this many entries before one is refused."""


def may_patch(manifest: Manifest, adding: int) -> bool:
    """Whether a dict's manifest may take a patch of ``adding`` entries (else the value is
    read and written whole, which drops the duplicates)."""
    if manifest.kind != "dict":
        return False
    found = patch_meta(manifest.meta, manifest.root)
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
        encoded = encode_dict_item(dumps, name, value)
        if encoded is None:
            raise TypeError("the dict has a key msgpack cannot hold as a plain map key")
        encodings.append(encoded)
    found = patch_meta(manifest.meta, manifest.root)
    base, levels = found if found is not None else (len(manifest.root), [])
    root = list(manifest.root)
    raws: dict[bytes, bytes] = {}
    make = keying(keys)
    for first, stop, _ in cut_ranges(encodings, params, make.cut_seed):
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



__all__ = ["PATCH_GROUP", "PATCH_MIN_ITEMS", "may_patch", "patch_dict"]
