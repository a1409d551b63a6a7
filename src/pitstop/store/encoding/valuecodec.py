"""ValueCodec: values to stored (framed, hashed, maybe chunked) bytes and back, verified.

Split from :mod:`pitstop.store.encoding.records` so that what only reads rows and field maps (the
``pitstop runs``/``stats`` commands) does not import the chunker, zstd, xxhash and the thread
pools; a store imports this module when it first encodes or decodes a value.

What it works with is beside it: the layouts of the chunked values it wrote or read
(:class:`~pitstop.store.encoding.layouts.KnownLayouts`), the leaves of a chunked value read
back into the value by kind (:mod:`~pitstop.store.encoding.chunkreads`), the walks of chunk
trees (:class:`~pitstop.store.encoding.chunktrees.ChunkTrees`) and what a sealed store seals
(:class:`~pitstop.store.encoding.sealing.Sealing`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

from ...delta import Append, Applied, Merge, MergePatch, dirty_positions
from ...errors import (
    CorruptCheckpointError,
    EncryptionKeyError,
    MalformedValueError,
    SerializationError,
)
from ...model import Checkpoint
from ...serde import Serializer, digest, frame, partchunks, unframe
from ...serde import chunks as chunking
from ...serde.framing import (
    is_compressed,
    unframe_view,
)
from .chunkreads import (
    Corrupt,
    RawOf,
    RowsReleased,
    list_from_leaf_rows,
    load_list,
    read_array,
    read_parts,
)
from .chunktrees import ChunkTrees, Reader, _bytes_of
from .layouts import KnownLayouts
from .leafrows import plain_chunks
from .records import (
    _CHUNK_COMPRESS_MIN,
    INLINE_MAX,
    RAW_KEEP_MAX,
    TEXT_IN_BLOB,
    Alias,
    CheckpointRecord,
    FieldMap,
    FieldRef,
    NewBlob,
    Stored,
    TextInBlobColumn,
    check_chunk_hash,
    field_path,
    is_chunk_key,
)
from .sealed import Opened
from .sealing import INLINE_AAD, Sealing

if TYPE_CHECKING:
    from ...serde.codec import MsgpackSerializer


_ROWS: Final = frozenset({bytes, Opened})
"""The types of a row's bytes read as they are (no copy to make them bytes)."""

_INLINE_HEADS: dict[int, bytes] = {}
"""Format id -> the frame header of an inline value in that format (a save's every field)."""

_WHOLE: Final = frozenset({str, int, float, bool, type(None)})
"""Types :meth:`ValueCodec.encode_state` stores whole without asking further: no chunked
kind (:func:`pitstop.serde.chunks.kind_of` is None), no array inside, not a delta."""

_NO_NAMES: Final[frozenset[str]] = frozenset()
"""No field reuses its parent's value unseen (a save without ``changed``): made once."""

_KINDS: Final[dict[type, str]] = {list: "list", dict: "dict"}
"""The usual chunked kinds of a state field, by exact type (the rest: ``kind_of``)."""


class ValueCodec(ChunkTrees, Sealing):
    """Turns values into stored values and back, verified; a state into a field map.

    A stored value is serialised by the store's :class:`~pitstop.serde.Serializer`, framed
    (format byte, optional zstd) and content-hashed.

    Writes use one serializer; reads accept the safe msgpack format always and other formats
    (pickle) only if that serializer was chosen, so opening a store never runs code unless
    the user opted in.
    """

    def __init__(
        self,
        serializer: Serializer | None,
        compress_threshold: int | None,
        chunk_hash: str = "xxh3",
    ) -> None:
        # Here rather than at the top: a store that only reads run rows never builds a
        # ValueCodec, so it never imports the codec (see SqlBackend._value_codec).
        from ...serde.codec import MsgpackSerializer

        self.serializer: Serializer = serializer or MsgpackSerializer()
        self.compress_threshold = compress_threshold
        self.chunk_hash = check_chunk_hash(chunk_hash)
        # How new chunks are keyed (the format id, and which hash): keyed when sealed
        # (Sealing.seal), and how chunks read back are checked.
        self.chunk_keying = chunking.ChunkKeys(
            self.serializer.format_id | (chunking.SHA256_KEYS if chunk_hash == "sha256" else 0)
        )
        self.seal_chunks = False
        """Seal a grown field's open last chunk instead of extending it (and never make a
        superseded chunk an alias): see :func:`pitstop.serde.chunks.sealed`; and cut dicts
        into larger chunks (:data:`~pitstop.serde.chunkcuts.SEALED_DICT_PARAMS`). For a store
        that keeps every row it writes."""
        # pitstop's own msgpack (not a subclass, whose dumps may differ) encodes a chunked
        # value and checks it in two steps: the chunker then skips the check over the
        # prefix it finds unchanged (see pitstop.serde.chunks._split_guided).
        self._exact: chunking.Exact | None = (
            self.serializer if type(self.serializer) is MsgpackSerializer else None
        )
        safe = MsgpackSerializer(getattr(self.serializer, "registry", None))
        self._readers: dict[int, Serializer] = {safe.format_id: safe}
        self._readers[self.serializer.format_id] = self.serializer
        # Readers of pitstop's own msgpack (not a subclass's): a chunked list is decoded from
        # its leaves a group at a time (see _load_list).
        self._list_readers: dict[int, MsgpackSerializer] = {
            fmt: reader for fmt, reader in self._readers.items()
            if type(reader) is MsgpackSerializer
        }
        # Layouts of chunked values this process wrote or read, by manifest: the next save
        # of the field compares against it (and a delta re-chunks from it) with no read.
        self._layouts = KnownLayouts()
        # Arrays and tensors are written from their own memory when the serialiser can hand
        # them over out of band (msgpack can; pickle keeps them in its own bytes).
        self._dumps_parts = getattr(self.serializer, "dumps_parts", None)
        self._loads_parts = getattr(self.serializer, "loads_parts", None)

    # -- chunked values ----------------------------------------------------------------------

    def chunk_keys_of(self, ref: FieldRef) -> set[bytes]:
        """The chunk keys of a chunked field this process knows the layout of (else its
        root's)."""
        return self._layouts.chunk_keys(ref)

    def layout_of(self, ref: FieldRef | None) -> chunking.Layout | None:
        return self._layouts.of(ref)

    def _holds_buffers(
        self, value: Any, applied: Applied | None, previous: FieldRef | None
    ) -> bool:
        """Whether ``value`` is to be stored as parts (it holds arrays or tensors).

        A delta on a field its parent did not store as parts has only its new items looked
        at: the rest is the parent's value, looked at when the parent was saved. Without
        this a long conversation was walked whole on every ``Append`` once numpy or torch
        was imported (O(state) per step instead of O(change))."""
        if (
            applied is not None
            and previous is not None
            and self._layouts.kind(previous) != partchunks.KIND
        ):
            delta = applied.delta
            if isinstance(delta, Append):
                return partchunks.holds_buffers(delta.items)
            return partchunks.holds_buffers(list(delta.entries.values()))
        return partchunks.holds_buffers(value)

    @staticmethod
    def _worth_chunking(value: Any, kind: str, previous: FieldRef | None) -> bool:
        """Whether to cut ``value`` into chunks, judged without serialising it: a field that
        was chunked stays so; a large buffer is; a list or dict is when its previous version
        was large, or (a new field) when it has many items."""
        if previous is not None and previous.manifest is not None:
            return True
        if kind in ("bytes", "bytearray"):
            return len(value) >= chunking.CHUNKED_MIN
        if kind == "ndarray":
            return int(value.nbytes) >= chunking.CHUNKED_MIN
        if previous is not None:
            return previous.size >= chunking.CHUNKED_MIN // 2
        return len(value) >= 64

    def _encode_chunked(
        self,
        run_id: str,
        name: str,
        value: Any,
        previous: FieldRef | None,
        applied: Applied | None,
        views: bool = False,
    ) -> tuple[FieldRef, dict[bytes, NewBlob], list[Alias]] | bytes:
        """The field as chunks (with the parent's open chunks the new ones extend), or (too
        small after all) its whole serialised bytes."""
        keys = self.chunk_keying
        parent = self.layout_of(previous)
        if parent is not None and chunking.is_patched(parent):
            # Positions in a patched dict's chunks are not its keys' (a key may come twice):
            # cut the whole value anew, without the duplicates (unchanged chunks keep their
            # keys, and rows).
            parent = None
        if parent is not None and self.seal_chunks:
            parent = chunking.sealed(parent)
        result: chunking.Split | None = None
        try:
            kind = chunking.kind_of(value)
            cuts = chunking.SEALED_DICT_PARAMS if self.seal_chunks else chunking.DICT_PARAMS
            if applied is not None and parent is not None and parent.kind == kind:
                dirty = dirty_positions(value, applied.delta, parent.items)
                result = chunking.split_delta(
                    parent, value, dirty, self.serializer.dumps, dict_params=cuts
                )
            else:
                result = chunking.split(
                    value, self.serializer.dumps, keys, parent, dict_params=cuts,
                    exact=self._exact,
                )
        except Exception:
            result = None
        if result is None:  # not chunkable after all, or an item did not serialise: the
            return self._dumps(value, run_id, "", name)  # whole value names the culprit
        layout = result.layout
        small = layout.size < chunking.CHUNKED_MIN
        if parent is None and small and layout.kind in ("list", "dict"):
            # Smaller than it looked: one ordinary value (the chunks joined are its bytes).
            return bytes(
                chunking.assemble(layout.kind, None, layout.items, layout.leaves, result.new)
            )
        manifest = layout.manifest()
        self._layouts.remember(
            manifest, layout, previous.manifest if parent is not None and previous else None
        )
        compress = layout.kind == "dict" or (
            layout.kind == "list" and self.seal_chunks and self.compress_threshold is not None
        )
        new = self._chunk_blobs(result.new, views, compress=compress)
        aliases = (
            []
            if self.seal_chunks  # a superseded open chunk (< SEAL_MIN) is kept as it is
            else [
                Alias(old, new_key, size + 1)
                for old, new_key, size in result.extended
                # A prefix of a compressed chunk's stored bytes is not a prefix of its bytes.
                if not is_compressed(new[new_key].data)
            ]
        )
        return FieldRef(b"", layout.size, None, manifest), new, aliases

    def may_patch(self, ref: FieldRef | None, delta: Merge) -> chunking.Manifest | None:
        """The manifest of ``ref`` if ``delta`` is to be written as a patch on it: a chunked
        dict whose layout this process does not know (one it knows is cut anew around the
        change, :func:`~pitstop.serde.chunks.split_delta`), str keys, room for the patch, a
        store that does not seal its values. Else None."""
        if ref is None or ref.manifest is None or self.sealer is not None or not delta.entries:
            return None
        layout = self.layout_of(ref)
        if layout is not None and not chunking.is_patched(layout):
            return None
        if not all(type(key) is str for key in delta.entries):
            return None
        if partchunks.may_hold_buffers() and partchunks.holds_buffers(
                list(delta.entries.values())):
            return None  # arrays go out of band: the dict becomes parts (_encode_parts)
        try:
            manifest = chunking.decode_manifest(ref.manifest)
        except ValueError:
            return None  # the read that needs it names the damage
        return manifest if chunking.may_patch(manifest, len(delta.entries)) else None

    def _encode_patch(
        self, run_id: str, name: str, patch: MergePatch
    ) -> tuple[FieldRef, dict[bytes, NewBlob]]:
        """A Merge on a chunked dict as a patch: the changed entries' chunks and a manifest
        over the parent's and them. O(change): nothing of the parent's value is read."""
        cuts = chunking.SEALED_DICT_PARAMS if self.seal_chunks else chunking.DICT_PARAMS
        try:
            manifest, size, raws = chunking.patch_dict(
                patch.manifest, patch.delta.entries, self.serializer.dumps,
                self.chunk_keying, cuts,
            )
        except SerializationError as exc:
            raise exc.located(run_id=run_id, path=field_path(name) + (exc.path or "")) from None
        except Exception as exc:
            raise SerializationError(
                f"{type(exc).__name__}: {exc}", run_id=run_id, path=field_path(name)
            ) from exc
        return FieldRef(b"", size, None, manifest), self._chunk_blobs(raws, False, compress=True)

    def _encode_parts(
        self, run_id: str, name: str, value: Any, previous: FieldRef | None, views: bool
    ) -> tuple[FieldRef, dict[bytes, NewBlob]]:
        """A value holding arrays or tensors as chunks of its skeleton and of the arrays'
        own memory (:mod:`pitstop.serde.partchunks`): only chunks the parent lacks are
        framed, and chunks are never compressed (float data does not shrink enough to pay)."""
        assert self._dumps_parts is not None
        try:
            skeleton, arrays = self._dumps_parts(value)
        except SerializationError as exc:
            raise exc.located(run_id=run_id, path=field_path(name) + (exc.path or "")) from None
        except Exception as exc:
            raise SerializationError(
                f"{type(exc).__name__}: {exc}", run_id=run_id, path=field_path(name)
            ) from exc
        result = partchunks.split_parts(
            skeleton, arrays, self.chunk_keying, self.layout_of(previous)
        )
        layout = result.layout
        manifest = layout.manifest()
        self._layouts.remember(manifest, layout)
        return FieldRef(b"", layout.size, None, manifest), self._chunk_blobs(result.new, views)

    def _chunk_blobs(
        self, raws: Mapping[bytes, bytes | memoryview], views: bool, compress: bool = False
    ) -> dict[bytes, NewBlob]:
        """New chunks as blobs, not compressed (a chunk's stored bytes are its raw bytes
        after the header, so a prefix alias and a read into place work) unless ``compress``.
        With ``views``, a chunk that is a view of an array stays one (see :class:`NewBlob`).

        A dict's chunks are compressed: they are small (~512 B), so a dict of thousands of
        keys is thousands of rows, and zstd takes ~15% off random text even at that size
        (the issue's 10,000-key dict: 2.46 MiB on disk after 200 saves, 2.2 compressed). A
        list's are where every row is kept (``seal_chunks``, PostgreSQL): there each save's
        new items are a row of their own, never rewritten, and random text compressed by
        ~1/5 packs four 2 KiB messages to a page instead of three (a 2,000-turn
        conversation: 1.82x -> 1.49x its size on disk, for ~10 ms more to decompress its
        ~2,000 chunks on restore; ``compress_threshold=None`` keeps them as they are).
        Elsewhere a list's are not: a restore joins them without decompressing, and the open
        last chunk is kept as a prefix alias."""
        fmt = self.serializer.format_id
        threshold = _CHUNK_COMPRESS_MIN if compress else None
        # No zstd checksum: a chunk is checked against its key (a hash of its raw bytes) on
        # every read.
        if not views:
            return {
                k: NewBlob(k, frame(raw, fmt, compress_threshold=threshold, checksum=False))
                for k, raw in raws.items()
            }
        header = frame(b"", fmt, compress_threshold=None)
        return {
            k: NewBlob(k, header, raw) if type(raw) is memoryview else
            NewBlob(k, frame(raw, fmt, compress_threshold=threshold, checksum=False))
            for k, raw in raws.items()
        }

    def decode_chunked(
        self,
        manifest: bytes,
        blobs: Mapping[bytes, Stored],
        *,
        strict: bool = True,
        checkpoint_id: str | None = None,
        run_id: str | None = None,
        field: str | None = None,
        consume: bool = False,
        partial: bool = False,
    ) -> Any:
        def corrupt(message: str) -> CorruptCheckpointError:
            return CorruptCheckpointError(
                message, checkpoint_id=checkpoint_id, run_id=run_id, field=field
            )

        try:
            kind, items, meta, root = chunking.decode_manifest(manifest)
        except ValueError as exc:
            raise corrupt(str(exc)) from None
        formats: set[int] = set()
        check = self.chunk_keying.check

        def raw_of(key: bytes) -> bytes | memoryview:
            data = _bytes_of(blobs.get(key))
            if type(data) is TextInBlobColumn:
                raise corrupt(f"chunk {key.hex()[2:18]} {TEXT_IN_BLOB}")
            if data is None:
                if partial:  # perhaps a node not read (its layout was known then): read all
                    raise RowsReleased
                raise corrupt(f"chunk {key.hex()[2:18]} is missing from the store")
            # A sealed chunk opened (Opened) was authenticated bound to its key by AES-GCM:
            # under a keyed key, no hash of it is computed again (see Opened).
            authenticated = type(data) is Opened
            if data[:1] == b"\xff":  # a sealed row the read could not open: say why
                data = self.opened_frame(key, bytes(data), lambda message: corrupt(
                    f"chunk {key.hex()[2:18]}: {message}"))
                authenticated = True
            try:
                fmt, raw = unframe_view(data if type(data) in _ROWS else bytes(data))
            except ValueError as exc:
                raise corrupt(f"chunk {key.hex()[2:18]}: {exc}") from None
            if not (authenticated or check(key, fmt, raw)):
                raise corrupt(f"chunk {key.hex()[2:18]}: checksum mismatch (truncated or altered)")
            formats.add(fmt)
            return raw

        nodes: dict[bytes, list[chunking.Entry]] = {}
        leaves: list[chunking.Entry] = []
        known = self._layouts.get(manifest)

        def walk(entries: Iterable[chunking.Entry], depth: int = 0) -> None:
            # A tree groups ~4 entries per node: 40 levels is beyond any value; a deeper one
            # was crafted (a chain of nodes, each of one entry) and would recurse past
            # Python's limit.
            if depth > _TREE_DEPTH:
                raise corrupt(f"chunk tree deeper than {_TREE_DEPTH} levels (crafted?)")
            for entry in entries:
                if entry.flags & chunking.NODE:
                    try:
                        children = chunking.unpack_entries(bytes(raw_of(entry.key)))
                    except ValueError as exc:
                        raise corrupt(f"unreadable chunk node ({exc})") from None
                    nodes[entry.key] = children
                    walk(children, depth + 1)
                else:
                    leaves.append(entry)

        if known is not None and known.kind == kind:
            # Written or read by this process: the manifest names its nodes by their content,
            # so their entries are the ones held here, and only the leaves need checking.
            leaves, nodes = known.leaves, known.nodes
        else:
            known = None
            walk(root)
        if kind == partchunks.KIND:
            return self._decode_parts(
                manifest, (meta, items, root, leaves, nodes), blobs, raw_of, formats,
                strict=strict, corrupt=corrupt, run_id=run_id, field=field,
                checkpoint_id=checkpoint_id,
            )
        if kind == "ndarray":
            return self._decode_array(
                manifest, (meta, items, root, leaves, nodes), blobs, raw_of, formats,
                corrupt=corrupt,
            )

        def remember(fmt: int) -> None:
            if known is None:  # (how the next save keys its chunks)
                self._layouts.remember(manifest, chunking.Layout(
                    kind, meta, items, root, leaves, nodes, self.chunk_keying.with_format(fmt)))

        if kind == "list" and (known is not None or sum(e.items for e in leaves) == items):
            fast = list_from_leaf_rows(self._list_readers, self.chunk_keying, items, leaves,
                                       blobs, strict=strict, consume=consume)
            if fast is not None:
                remember(fast[0])
                return fast[1]
        raws: Mapping[bytes, bytes | memoryview] | None = plain_chunks(
            leaves, blobs, formats, self.chunk_keying)
        if raws is None:  # not all xxh3-made chunks of one format: one by one, named
            raws = {leaf.key: raw_of(leaf.key) for leaf in leaves}
        if known is None and sum(leaf.items for leaf in leaves) != items:
            raise corrupt("chunk manifest does not add up (altered?)")
        fmt = formats.pop() if len(formats) == 1 else self.serializer.format_id
        remember(fmt)
        if kind == "list":
            owned = consume and type(blobs) is dict and type(raws) is dict
            value = load_list(
                self._list_readers, fmt, items, leaves, raws, strict=strict,
                rows=cast(dict[bytes, Stored], blobs) if owned else None,
            )
            if value is not None:
                return value
        try:
            assembled = chunking.assemble(kind, meta, items, leaves, raws)
        except Exception as exc:
            raise corrupt(f"chunks do not make a {kind} ({type(exc).__name__}: {exc})") from None
        if kind not in ("list", "dict"):
            return assembled
        # The reassembled bytes are one ordinary serialised value: decoded in one call.
        return self._load_raw(
            fmt, assembled, strict=strict, checkpoint_id=checkpoint_id, run_id=run_id, field=field
        )

    def _decode_parts(
        self,
        manifest: bytes,
        tree: tuple[Any, int, list[chunking.Entry], list[chunking.Entry], dict[bytes, Any]],
        blobs: Mapping[bytes, Stored],
        raw_of: RawOf,
        formats: set[int],
        *,
        strict: bool,
        corrupt: Corrupt,
        checkpoint_id: str | None,
        run_id: str | None,
        field: str | None,
    ) -> Any:
        """A ``parts`` value: its arrays read into place (:func:`.chunkreads.read_parts`),
        then built by the serializer that wrote them."""
        meta, items, root, leaves, nodes = tree
        skeleton, buffers = read_parts(
            meta, items, leaves, blobs, raw_of, formats, self.chunk_keying, corrupt)
        fmt = formats.pop() if len(formats) == 1 else self.serializer.format_id
        self._layouts.remember(manifest, chunking.Layout(
            partchunks.KIND, meta, items, root, leaves, nodes, self.chunk_keying.with_format(fmt)))
        reader = self._readers.get(fmt)
        loads_parts = getattr(reader, "loads_parts", None)
        if loads_parts is None:
            raise corrupt(f"chunked arrays written with serializer format {fmt}, unreadable here")
        try:
            return loads_parts(skeleton, buffers, strict=strict)
        except MalformedValueError as exc:
            raise _malformed(exc, checkpoint_id, run_id, field) from None
        except SerializationError as exc:
            raise exc.located(
                run_id=run_id, path=(field_path(field) if field else "") + (exc.path or ""),
                action="load",
            ) from None
        except Exception as exc:
            raise CorruptCheckpointError(
                f"undecodable value ({type(exc).__name__}: {exc})",
                checkpoint_id=checkpoint_id, run_id=run_id, field=field,
            ) from exc

    def _decode_array(
        self,
        manifest: bytes,
        tree: tuple[Any, int, list[chunking.Entry], list[chunking.Entry], dict[bytes, Any]],
        blobs: Mapping[bytes, Stored],
        raw_of: RawOf,
        formats: set[int],
        *,
        corrupt: Corrupt,
    ) -> Any:
        """A numpy array stored whole (the ``ndarray`` kind), read into place
        (:func:`.chunkreads.read_array`)."""
        meta, items, root, leaves, nodes = tree
        array = read_array(meta, items, leaves, blobs, raw_of, formats, self.chunk_keying, corrupt)
        fmt = formats.pop() if len(formats) == 1 else self.serializer.format_id
        layout = chunking.Layout("ndarray", meta, items, root, leaves, nodes,
                                 self.chunk_keying.with_format(fmt))
        self._layouts.remember(manifest, layout)
        return array

    def check_stored(self, key: bytes, data: bytes) -> None:
        """Raise if a stored row is not what its key says (a whole value or a chunk)."""
        if not is_chunk_key(key):
            self.decode_value(data, key, strict=False)
            return
        authenticated = type(data) is Opened  # (see decode_chunked)
        if data[:1] == b"\xff":  # a sealed row, as the table holds it
            data = self.opened_frame(key, bytes(data), CorruptCheckpointError)
            authenticated = True
        fmt, raw = unframe(bytes(data))
        if not (authenticated or self.chunk_keying.check(key, fmt, raw)):
            raise CorruptCheckpointError("chunk checksum mismatch (truncated or altered)")

    def _dumps(self, value: Any, run_id: str, path: str, field: str | None = None) -> bytes:
        """Serialise; errors name ``path`` (or the state field ``field``, built only then)."""
        try:
            return self.serializer.dumps(value)
        except SerializationError as exc:
            where = field_path(field) if field is not None else path
            raise exc.located(run_id=run_id, path=where + (exc.path or "")) from None
        except Exception as exc:  # a user encode hook failed: still name where
            where = field_path(field) if field is not None else path
            raise SerializationError(
                f"{type(exc).__name__}: {exc}", run_id=run_id, path=where
            ) from exc

    def _dumps_failed(self, exc: Exception, run_id: str, field: str) -> NoReturn:
        """:meth:`_dumps`'s errors for a state field serialised without it (called in the
        ``except`` clause of a failed ``serializer.dumps``)."""
        if isinstance(exc, SerializationError):
            raise exc.located(run_id=run_id, path=field_path(field) + (exc.path or "")) \
                from None
        raise SerializationError(
            f"{type(exc).__name__}: {exc}", run_id=run_id, path=field_path(field)
        ) from exc

    def encode_value(self, value: Any, *, run_id: str, path: str) -> NewBlob:
        """A value as a separately stored, content-addressed blob (inputs, effects). (A
        sealed store's codec has :meth:`encode_sealed` in its place: see :meth:`seal`.)"""
        raw = self._dumps(value, run_id, path)
        fmt = self.serializer.format_id
        # (tuple.__new__, fields in order: the named tuple without its Python __new__, for
        # every record a LangGraph step attaches.)
        return tuple.__new__(NewBlob, (
            digest(fmt, raw), frame(raw, fmt, compress_threshold=self.compress_threshold), None
        ))

    def encode_state(
        self,
        run_id: str,
        state: Mapping[str, Any],
        parent: FieldMap | None,
        changed: Iterable[str] | None,
        parent_raw: Mapping[str, bytes] | None = None,
        views: bool = False,
    ) -> tuple[FieldMap, dict[bytes, NewBlob], dict[str, bytes], list[Alias]]:
        """The new field map, the values not already referenced by the parent, and the
        serialised bytes of the small fields (see :data:`RAW_KEEP_MAX`).

        ``parent_raw`` is what this returned for the parent, if known: a field serialising to
        the same bytes is the parent's value, known without hashing it again. ``views``: the
        blobs are written before the state can change (``store.save``), so array chunks may
        stay views of the arrays' memory (:class:`NewBlob`) instead of copies.
        """
        if type(state) is not dict and not isinstance(state, Mapping):
            raise TypeError(
                f"run {run_id!r}: state must be a mapping of field names to values, "
                f"not {type(state).__name__}"
            )
        parent = parent or {}
        # A caller naming what changed needs no byte comparison, so nothing is kept for it.
        keep = changed is None
        parent_raw = (parent_raw or {}) if keep else {}
        reuse = _NO_NAMES if changed is None else set(parent).difference(changed)
        fields: FieldMap = {}
        new: dict[bytes, NewBlob] = {}
        raws: dict[str, bytes] = {}
        aliases: list[Alias] = []
        fmt = self.serializer.format_id
        inline_head = _INLINE_HEADS.get(fmt)  # the format byte, checked once
        if inline_head is None:
            inline_head = _INLINE_HEADS[fmt] = frame(b"", fmt, compress_threshold=None)
        # Looked up once, not per field: this loop runs for every field of every save. (A
        # value holding an array was made after numpy was imported, so the import check
        # holds for the whole state.)
        dumps = self.serializer.dumps
        sealer = self.sealer
        parts = self._dumps_parts is not None and partchunks.may_hold_buffers()
        for name, value in state.items():
            if name in reuse:
                fields[name] = parent[name]
                continue
            if type(name) is not str:
                raise SerializationError(
                    "state field names must be str", run_id=run_id, path=f"state[{name!r}]"
                )
            previous = parent.get(name)
            cls = type(value)
            if cls in _WHOLE:
                # A scalar (a counter, a short text): never chunked, never holding an
                # array, no delta; stored whole, as the checks below would decide.
                try:
                    raw = dumps(value)
                except Exception as exc:
                    self._dumps_failed(exc, run_id, name)
            elif cls is MergePatch:
                fields[name], blobs = self._encode_patch(run_id, name, value)
                new.update(blobs)
                continue
            else:
                applied: Applied | None = value if cls is Applied else None
                full = value if applied is None else applied.value
                if (
                    type(full) is bytes
                    and len(full) < chunking.CHUNKED_MIN
                    and (previous is None or previous.manifest is None)
                ):
                    # A short byte string, the usual field of an integration that serialises
                    # its values itself (LangGraph's channels): stored whole, as the checks
                    # below would decide (no buffers in it, too short to chunk), without
                    # running them.
                    raw = self._dumps(full, run_id, "", name)
                else:
                    kind = _KINDS.get(type(full)) or chunking.kind_of(full)
                    if (
                        parts
                        and kind != "ndarray"
                        and self._holds_buffers(full, applied, previous)
                    ):
                        ref, blobs = self._encode_parts(run_id, name, full, previous, views)
                        if previous is not None and ref.same_as(previous):
                            fields[name] = previous
                        else:
                            fields[name] = ref
                            new.update(blobs)
                        continue
                    if kind is not None and self._worth_chunking(full, kind, previous):
                        chunked = self._encode_chunked(run_id, name, full, previous, applied,
                                                       views)
                        if not isinstance(chunked, bytes):
                            ref, blobs, extended = chunked
                            if previous is not None and ref.same_as(previous):
                                fields[name] = previous
                            else:
                                fields[name] = ref
                                new.update(blobs)
                                aliases.extend(extended)
                            continue
                        raw = chunked
                    else:
                        try:
                            raw = dumps(full)
                        except Exception as exc:
                            self._dumps_failed(exc, run_id, name)
            size = len(raw)
            if keep and size <= RAW_KEEP_MAX:
                known = parent_raw.get(name)
                if known is not None and known == raw and previous is not None:
                    fields[name] = previous  # (parent[name], looked up already)
                    raws[name] = known
                    continue
                raws[name] = raw
            # (The comparisons with ``previous`` are FieldRef.same_as's, written out.)
            if size < INLINE_MAX:
                if sealer is None:
                    inline = inline_head + raw  # = frame(raw, fmt)
                    if previous is not None and previous.inline == inline:
                        fields[name] = previous
                    else:
                        # = FieldRef(b"", size + 1, inline), without the named tuple's
                        # Python __new__ (a frame per changed field of every save)
                        fields[name] = tuple.__new__(FieldRef, (b"", size + 1, inline, None))
                else:
                    sealed = self.seal_inline(inline_head + raw)
                    ref = FieldRef(b"", len(sealed), sealed)
                    fields[name] = previous if previous is not None and ref.same_as(previous) \
                        else ref
            else:
                # A sealed store addresses a whole value by a keyed hash (see sealing.py).
                key = digest(fmt, raw) if sealer is None else sealer.address(fmt, raw)
                if (
                    previous is not None
                    and previous.hash == key
                    and previous.inline is None
                    and previous.manifest is None
                ):
                    fields[name] = previous
                else:
                    blob = NewBlob(key, frame(raw, fmt,
                                              compress_threshold=self.compress_threshold))
                    fields[name] = tuple.__new__(FieldRef, (key, blob.size, None, None))
                    new[key] = blob
        if self.sealer is not None and new:
            new = self.seal_rows(new)
        return fields, new, raws, aliases

    def decode_value(
        self,
        data: bytes | None,
        expected_hash: bytes | None,
        *,
        strict: bool = True,
        checkpoint_id: str | None = None,
        run_id: str | None = None,
        field: str | None = None,
    ) -> Any:
        def corrupt(message: str) -> CorruptCheckpointError:
            return CorruptCheckpointError(
                message, checkpoint_id=checkpoint_id, run_id=run_id, field=field
            )

        if data is None:
            missing = expected_hash.hex()[:16] if expected_hash else "?"
            raise corrupt(f"value {missing} is missing from the store")
        if type(data) is TextInBlobColumn:
            raise corrupt(f"value {TEXT_IN_BLOB}")
        if data[:1] == b"\xff":
            # Sealed (no plain frame's header): an inline value, or a row the read could not
            # open (altered, or under a key the ring lacks), named here.
            try:
                fmt, raw = unframe(self.opened_frame(
                    INLINE_AAD if expected_hash is None else expected_hash, data, corrupt))
            except ValueError as exc:
                raise corrupt(str(exc)) from None
        else:
            # (Opened without its keys, a sealed value raises EncryptionKeyError here.)
            try:
                fmt, raw = unframe(bytes(data))
            except ValueError as exc:
                raise corrupt(str(exc)) from None
            # Inline values (no hash) are covered by their record's checksum instead. A sealed
            # store's values (opened as they were read) are under keyed addresses; one
            # stored before the store was sealed under its SHA-256.
            if (
                expected_hash is not None
                and type(data) is not Opened  # authenticated as it was opened
                and digest(fmt, raw) != expected_hash
                and not (self.sealer is not None and len(expected_hash) == 32
                         and self.sealer.addresses(fmt, raw, expected_hash))
            ):
                raise corrupt("value checksum mismatch (truncated or altered)")
        return self._load_raw(
            fmt, raw, strict=strict, checkpoint_id=checkpoint_id, run_id=run_id, field=field
        )

    def _load_raw(
        self,
        fmt: int,
        raw: bytes,
        *,
        strict: bool,
        checkpoint_id: str | None,
        run_id: str | None,
        field: str | None,
    ) -> Any:
        reader = self._readers.get(fmt)
        if reader is None:
            raise SerializationError(
                f"value was written with serializer format {fmt} (pickle?) and this store "
                "was opened with the safe default; pass serializer=pitstop.PickleSerializer() "
                "to read it, knowing that loading pickle runs code",
                run_id=run_id,
                path=field_path(field) if field else None,
                action="load",
            )
        try:
            return reader.loads(raw, strict=strict)
        except MalformedValueError as exc:
            raise _malformed(exc, checkpoint_id, run_id, field) from None
        except SerializationError as exc:
            raise exc.located(
                run_id=run_id,
                path=(field_path(field) if field else "") + (exc.path or ""),
                action="load",
            ) from None
        except Exception as exc:
            raise CorruptCheckpointError(
                f"undecodable value ({type(exc).__name__}: {exc})",
                checkpoint_id=checkpoint_id,
                run_id=run_id,
                field=field,
            ) from exc

    def decode_checkpoint(
        self,
        record: CheckpointRecord,
        blobs: Mapping[bytes, Stored],
        *,
        strict: bool = True,
        consume: bool = False,
        partial: bool = False,
    ) -> Checkpoint:
        """The checkpoint from its record and stored values. ``consume``: ``blobs`` is the
        caller's own read, which a chunked list may empty as it decodes (only when the record
        has one chunked field: two may share chunks); :class:`RowsReleased` then asks the
        caller to read the values again and decode without it. ``partial``: ``blobs`` was
        read by :meth:`load_keys`, without the node rows of layouts known then; should the
        decode need one (the layout was forgotten since), :class:`RowsReleased` too."""
        record.verify()
        fields = record.field_map()
        consume = consume and sum(ref.manifest is not None for ref in fields.values()) == 1
        try:
            state = self._decode_fields(record, fields, blobs, strict=strict, consume=consume,
                                        partial=partial)
        except EncryptionKeyError as exc:
            raise EncryptionKeyError(
                f"run {record.run_id!r}: checkpoint {record.id}: {exc}", key_id=exc.key_id
            ) from None
        return record.checkpoint(state)

    def _decode_fields(
        self, record: CheckpointRecord, fields: FieldMap, blobs: Mapping[bytes, Stored], *,
        strict: bool, consume: bool, partial: bool,
    ) -> dict[str, Any]:
        return {
            name: self.decode_value(
                ref.inline if ref.inline is not None else _bytes_of(blobs.get(ref.hash)),
                None if ref.inline is not None else ref.hash,
                strict=strict,
                checkpoint_id=record.id,
                run_id=record.run_id,
                field=name,
            )
            if ref.manifest is None
            else self.decode_chunked(
                ref.manifest,
                blobs,
                strict=strict,
                checkpoint_id=record.id,
                run_id=record.run_id,
                field=name,
                consume=consume,
                partial=partial,
            )
            for name, ref in fields.items()
        }


_TREE_DEPTH: Final = 40
"""Levels of nodes a chunked value's tree may have when read (see decode_chunked)."""


def _malformed(
    exc: MalformedValueError, checkpoint_id: str | None, run_id: str | None, field: str | None
) -> CorruptCheckpointError:
    """Bytes the serializer never writes (truncated, trailing bytes, not msgpack) passed the
    checksum, so the record was altered and re-checksummed, or crafted: corruption, which
    ``fallback=True`` skips and ``verify`` reports, not a value this process cannot rebuild."""
    where = f" at {exc.path}" if exc.path else ""
    return CorruptCheckpointError(
        f"undecodable value{where} ({exc.reason})",
        checkpoint_id=checkpoint_id, run_id=run_id, field=field,
    )


__all__ = ["Reader", "RowsReleased", "ValueCodec"]
