"""Walking the trees of chunked values: which rows a field map references, which a load
reads first and next. A part of :class:`~pitstop.store.encoding.valuecodec.ValueCodec` (split
from it: saving and decoding are the rest), over the layouts it keeps of the chunked values
this process wrote or read.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from ...errors import EncryptionKeyError
from ...serde import chunks as chunking
from ...serde import unframe
from .blobs import Deferred
from .layouts import KnownLayouts
from .records import FieldMap, FieldRef, Stored, _manifest_roots, stored_hashes

Reader = Callable[[list[bytes]], Mapping[bytes, bytes]]
"""Stored rows by key (those found), for walking a chunked value's nodes."""

_FIRST: Final = operator.itemgetter(0)


class ChunkTrees:
    """The chunk-tree walks of a value codec (see the module)."""

    _layouts: KnownLayouts

    def chunks_below(self, ref: FieldRef, read: Reader) -> set[bytes]:
        """Every chunk key a chunked field references, its nodes' children included: from
        the layout if this process knows it, else by reading the nodes (``read`` returns
        stored rows by key)."""
        assert ref.manifest is not None
        layout = self._layouts.get(ref.manifest)
        if layout is not None:
            return layout.keys()
        try:
            root = chunking.decode_manifest(ref.manifest).root
        except ValueError:
            return set()
        keys = {e.key for e in root}
        pending = [e.key for e in root if e.flags & chunking.NODE]
        while pending:
            found = read(pending)
            pending = []
            for data in found.values():
                try:
                    raw = unframe(bytes(data))[1]
                    entries = chunking.unpack_entries(raw)
                except ValueError:
                    continue  # verify and loads report a bad node
                for entry in entries:
                    if entry.key not in keys:
                        keys.add(entry.key)
                        if entry.flags & chunking.NODE:
                            pending.append(entry.key)
        return keys

    def referenced(self, fields: FieldMap, read: Reader) -> set[bytes]:
        """Every value-table key a field map references, chunks under nodes included."""
        out = stored_hashes(fields)
        for ref in fields.values():
            if ref.manifest is not None:
                out |= self.chunks_below(ref, read)
        return out

    def referenced_by_all(self, field_maps: Iterable[FieldMap], read: Reader) -> set[bytes]:
        """:meth:`referenced` of many field maps (a run's checkpoints): each node read once,
        however many of them share it, a level of all their trees per ``read``."""
        out: set[bytes] = set()
        walked: set[bytes] = set()  # nodes whose children are in `out` or pending
        pending: list[bytes] = []
        for fields in field_maps:
            out |= stored_hashes(fields)  # (a manifest's root entries among them)
            for ref in fields.values():
                if ref.manifest is None:
                    continue
                layout = self._layouts.get(ref.manifest)
                if layout is not None:
                    out |= layout.keys()
                    walked.update(layout.nodes)
                    continue
                try:
                    root = chunking.decode_manifest(ref.manifest).root
                except ValueError:
                    continue
                for entry in root:
                    out.add(entry.key)
                    if entry.flags & chunking.NODE and entry.key not in walked:
                        walked.add(entry.key)
                        pending.append(entry.key)
        while pending:
            found = read(pending)
            pending = []
            for data in found.values():
                try:
                    entries = chunking.unpack_entries(unframe(bytes(data))[1])
                except ValueError:
                    continue  # verify and loads report a bad node
                for entry in entries:
                    out.add(entry.key)
                    if entry.flags & chunking.NODE and entry.key not in walked:
                        walked.add(entry.key)
                        pending.append(entry.key)
        return out

    def load_keys(self, fields: FieldMap) -> list[bytes]:
        """The value-table keys a load of ``fields`` reads first, when what it reads will be
        decoded with ``partial=True`` (see :meth:`decode_checkpoint`): whole values, the
        leaves of each chunked value whose layout this process knows (its decode takes the
        nodes from that layout, so their rows are not read: one query, not two, and a
        conversation's 60-odd node rows fewer), and the root entries of the others."""
        out: dict[bytes, None] = {}
        for ref in fields.values():
            if ref.manifest is None:
                if ref.inline is None:
                    out[ref.hash] = None
                continue
            layout = self._layouts.get(ref.manifest)
            if layout is not None:
                out.update(dict.fromkeys(map(_FIRST, layout.leaves)))
            else:
                out.update(dict.fromkeys(_manifest_roots(ref.manifest)))
        return list(out)

    def missing_below(
        self,
        fields: FieldMap,
        blobs: Mapping[bytes, Stored],
        *,
        nodes: bool = True,
        unpacked: dict[bytes, list[chunking.Entry]] | None = None,
    ) -> list[bytes]:
        """Keys under the nodes already in ``blobs`` that ``blobs`` does not hold yet: what a
        load reads next (a level of the tree per query). ``nodes=False``: of a value whose
        layout this process knows, only the leaves (see :meth:`load_keys`). ``unpacked``:
        the nodes' entries, kept between the calls of one load, which walks the tree from
        its root at each level: a node is then unpacked once, not again at every level below
        it (a resume of a 2,000-turn conversation: ~2,000 unpacks of its ~500 nodes)."""
        out: list[bytes] = []
        for ref in fields.values():
            if ref.manifest is None:
                continue
            layout = self._layouts.get(ref.manifest)
            if layout is not None:  # known here: every key at once, no node decoded
                keys = layout.keys() if nodes else map(_FIRST, layout.leaves)
                out.extend(key for key in keys if key not in blobs)
                continue
            try:
                root = chunking.decode_manifest(ref.manifest).root
            except ValueError:
                continue
            pending = [e for e in root if e.flags & chunking.NODE]
            while pending:
                node = pending.pop()
                entries = unpacked.get(node.key) if unpacked is not None else None
                if entries is None:
                    data = _bytes_of(blobs.get(node.key))
                    if data is None:
                        continue
                    try:
                        entries = chunking.unpack_entries(unframe(bytes(data))[1])
                    except (ValueError, EncryptionKeyError):
                        continue  # the decode names it, with the run and checkpoint
                    if unpacked is not None:
                        unpacked[node.key] = entries
                for entry in entries:
                    if entry.key not in blobs:
                        out.append(entry.key)
                    elif entry.flags & chunking.NODE:
                        pending.append(entry)
        return out


def _bytes_of(data: Stored | None) -> bytes | None:
    """A stored value's bytes, read now if it was left in the blob store."""
    return data.read() if isinstance(data, Deferred) else data


__all__ = ["ChunkTrees", "Reader"]
