"""The layouts of the chunked values a process wrote or read, by manifest.

A :class:`~pitstop.serde.chunkmanifest.Layout` holds what the next save of a chunked field
compares against (its leaves, nodes and where its bytes are known to be unchanged), so a save
of a grown list or an edited dict re-chunks only around the change, and a restore of a value
this process made walks no node. :class:`KnownLayouts` keeps them for the value codec, and
drops what no save will use.
"""

from __future__ import annotations

from collections import OrderedDict

from ...serde import chunks as chunking
from .records import FieldRef, _manifest_roots


class KnownLayouts(OrderedDict[bytes, chunking.Layout]):
    """Layouts by manifest, oldest first, at most :attr:`KEPT`; with each kept layout's
    parent (the version it was made from), so that a field's older versions are dropped."""

    KEPT = 256

    def __init__(self) -> None:
        super().__init__()
        self._lineage: dict[bytes, bytes] = {}  # a kept layout's manifest -> its parent's

    def remember(
        self, manifest: bytes, layout: chunking.Layout, parent: bytes | None = None
    ) -> None:
        """Keep ``layout`` for the next save of its field. ``parent``: the manifest of the
        version it was made from; that one is kept too (a save from it again, a retry, finds
        it), the version before it is dropped. A growing list's versions are each a new set
        of lists over all its leaves: 256 of one conversation's kept were most of what
        Python's garbage collector walked on every full collection, for no save to use."""
        self[manifest] = layout
        if parent is not None and parent != manifest:  # (an unchanged value is its parent)
            lineage = self._lineage
            lineage[manifest] = parent
            older = lineage.pop(parent, None)
            if older is not None and older != manifest:  # (not a value changed back)
                self.pop(older, None)
        if len(self) > self.KEPT:
            try:
                evicted, _ = self.popitem(last=False)
            except KeyError:  # a racing eviction took it
                return
            self._lineage.pop(evicted, None)

    def of(self, ref: FieldRef | None) -> chunking.Layout | None:
        """The layout of a stored field, if it is chunked and its layout is kept."""
        if ref is None or ref.manifest is None:
            return None
        return self.get(ref.manifest)

    def chunk_keys(self, ref: FieldRef) -> set[bytes]:
        """The chunk keys of a chunked field whose layout is kept (else its root's)."""
        layout = self.of(ref)
        if layout is not None:
            return layout.keys()
        return set(_manifest_roots(ref.manifest)) if ref.manifest is not None else set()

    def kind(self, ref: FieldRef) -> str | None:
        """The chunked kind a stored field has (None: stored whole)."""
        if ref.manifest is None:
            return None
        layout = self.get(ref.manifest)
        if layout is not None:
            return layout.kind
        try:
            return chunking.decode_manifest(ref.manifest).kind
        except ValueError:
            return None  # the read that uses it names the damage


__all__ = ["KnownLayouts"]
