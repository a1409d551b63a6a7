"""What a sealed store's value codec does besides encoding: seal what it keeps in the database.

A store opened with ``encryption=`` seals its blob store (:mod:`.sealed`) and, through
:class:`Sealing` (a part of :class:`~pitstop.store.encoding.valuecodec.ValueCodec`), the
values it keeps in the database:

* a state's small values kept inline in the checkpoint record, each sealed on its own
  (:meth:`Sealing.seal_inline`; a fresh nonce each time, so an unchanged value saved again
  is new bytes and equal values in two records are not seen to be equal);
* the rows of the value table a save inserts (whole values under the blob threshold, under
  a keyed address (:meth:`.Encryption.address`) as records are, the chunks and chunk-tree
  nodes of lists, dicts and small buffers, under keyed chunk keys
  (:meth:`.Encryption.chunk_keys`)): :meth:`Sealing.seal_rows`,
  each bound to its content key, deterministically (:meth:`.Encryption.seal_row`), and
  opened where rows are read (:meth:`Sealing.open_row`), so everything above the read sees
  the frames it always did;
* records (inputs, effects' results, attached writes): :meth:`Sealing.encode_sealed`, under a
  keyed content address.

A sealed store makes no prefix aliases of chunks (a prefix of a sealed row is not a sealed
prefix) and closes a grown list's open chunk instead, as a store that keeps every row does.

The field map itself stays plaintext: field names, sizes, content keys (keyed) and chunk
manifests' roots (keyed chunk keys, item counts, an array's dtype and shape), so listing
history reads no key and decodes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ...errors import CorruptCheckpointError
from .records import NewBlob

if TYPE_CHECKING:
    from ...serde import Serializer
    from ...serde.chunkkeys import ChunkKeys
    from .sealed import Encryption

INLINE_AAD: Final = b"pitstop inline value"
"""The authenticated data of an inline value (it has no content key). Which field holds it
is covered by the record's checksum."""

SEALED_HEAD: Final = 0xFF
"""The first byte of a sealed value (:data:`.sealed.MAGIC`'s); no plain frame's header."""


class Sealing:
    """The sealing part of a value codec (see the module). Unsealed until :meth:`seal`."""

    serializer: Serializer
    compress_threshold: int | None
    seal_chunks: bool
    chunk_keying: ChunkKeys
    _dumps: Callable[..., bytes]

    sealer: Encryption | None = None
    """A sealed store's key ring (``encryption=``, set by :meth:`seal`)."""
    _table_below: int = 0
    """Rows sealed by the codec: those under the blob threshold, which would stay in the
    table (the others go to the blob store, which seals them itself). One within 48 bytes
    under it is then over it: it goes to the blob store sealed twice, and opens as any."""

    def seal(self, encryption: Encryption, table_below: int) -> None:
        """Seal what this codec encodes from now on with ``encryption`` (a sealed store's
        ring): inline values, value-table rows of fewer than ``table_below`` sealed bytes,
        records. :meth:`encode_value` is replaced rather than made to ask on every call: a
        plain store's records cost what they did."""
        self.sealer = encryption
        self._table_below = table_below
        self.seal_chunks = True  # no prefix aliases: see the module
        self.chunk_keying = encryption.chunk_keys(self.chunk_keying.format_id)
        self.encode_value = self.encode_sealed

    # -- the state ----------------------------------------------------------------------------

    def seal_inline(self, framed: bytes) -> bytes:
        """An inline value's frame, sealed (see :data:`INLINE_AAD`)."""
        assert self.sealer is not None
        return self.sealer.seal_small(INLINE_AAD, framed)

    def seal_rows(self, new: dict[bytes, NewBlob]) -> dict[bytes, NewBlob]:
        """The new values of a save as sealed rows, but those bound for the blob store."""
        assert self.sealer is not None
        seal, below = self.sealer.seal_row, self._table_below
        return {
            key: NewBlob(key, seal(key, blob.stored)) if blob.size < below else blob
            for key, blob in new.items()
        }

    def open_row(self, key: bytes, data: bytes) -> bytes:
        """A value-table row as its frame: opened if sealed. One that fails to open (altered,
        or under a key the ring lacks) is handed on as it is, for the decode that needs it to
        name the run, checkpoint and field (:meth:`opened_frame`)."""
        if self.sealer is None or not data or data[0] != SEALED_HEAD:
            return data
        from ...errors import EncryptionKeyError
        from .sealed import Opened, opens_checked

        try:
            plain = self.sealer.open(key, data)
        except EncryptionKeyError:
            return data
        if plain is None:
            return data
        return Opened(plain) if opens_checked(key) else plain  # see Opened

    def opened_frame(self, key: bytes, data: bytes,
                     corrupt: Callable[[str], CorruptCheckpointError]) -> bytes:
        """The frame of a sealed value (``key``: its content key, or :data:`INLINE_AAD`),
        opened: AES-GCM authenticates it and binds it to ``key``, so no digest is computed
        again. An unknown key id raises :class:`~pitstop.EncryptionKeyError`; an altered
        value, or one moved from another's place, is damage."""
        from ...serde import unframe
        from .sealed import key_id_of

        plain = None if self.sealer is None else self.sealer.open(key, data)
        if plain is None:
            if self.sealer is None:
                unframe(data)  # raises EncryptionKeyError: opened without its keys
            raise corrupt(
                f"sealed value fails authentication under key {key_id_of(data)!r} (altered, "
                "or moved from another value's place)"
            )
        return plain

    def addressed(self, key: bytes, framed: bytes) -> bytes:
        """The keyed address (:meth:`.Encryption.address`) a sealed store keeps a whole value
        of the state under, given its key ``key`` elsewhere (an archive's SHA-256) and its
        plain frame ``framed`` (checked against ``key`` already: an import's); ``key`` for
        a chunk (an import keys chunks in :mod:`~pitstop.store.encoding.readdress`)."""
        from ...serde import unframe
        from .records import is_chunk_key

        if self.sealer is None or is_chunk_key(key) or framed[:1] == b"\xff":
            return key
        fmt, raw = unframe(bytes(framed))
        return self.sealer.address(fmt, raw)

    # -- records ------------------------------------------------------------------------------

    def encode_sealed(self, value: Any, *, run_id: str, path: str) -> NewBlob:
        """``encode_value`` of a sealed store: sealed, under a keyed content address."""
        from ...serde import frame

        assert self.sealer is not None
        raw = self._dumps(value, run_id, path)
        fmt = self.serializer.format_id
        key = self.sealer.address(fmt, raw)
        framed = frame(raw, fmt, compress_threshold=self.compress_threshold)
        return NewBlob(key, self.sealer.seal_small(key, framed))

    def plain_record(self, data: bytes, key: bytes) -> tuple[bytes, bytes]:
        """``(value, content key)`` of a record (an input, an effect's result, an attached
        write) as an export carries it: opened if sealed, under its SHA-256, so an archive
        imports into any store (:meth:`sealed_record` seals it again there)."""
        from ...serde import digest, unframe

        if self.sealer is None or data[:1] != b"\xff":
            return data, key
        plain = self.sealer.open(key, data)
        if plain is None:
            from .sealed import key_id_of

            raise CorruptCheckpointError(
                f"sealed record {key.hex()[:16]} fails authentication under key "
                f"{key_id_of(data)!r} (altered, or moved from another value's place)"
            )
        fmt, raw = unframe(plain)
        return plain, digest(fmt, raw)

    def sealed_record(self, data: bytes, key: bytes) -> tuple[bytes, bytes]:
        """``(value, content key)`` of a plain record (checked against its SHA-256 already:
        an import's) as a sealed store keeps it (as it is in any other)."""
        from ...serde import unframe

        if self.sealer is None or data[:1] == b"\xff":
            return data, key
        fmt, raw = unframe(data)
        address = self.sealer.address(fmt, raw)
        return self.sealer.seal_small(address, data), address

    def plain_inline(self, framed: bytes) -> bytes:
        """An inline value as an export carries it: opened if sealed."""
        if self.sealer is None or framed[:1] != b"\xff":
            return framed
        return self.opened_frame(INLINE_AAD, framed, CorruptCheckpointError)

    def sealed_inline(self, framed: bytes) -> bytes:
        """An inline value as a sealed store keeps it (an import's): sealed if plain."""
        if self.sealer is None or framed[:1] == b"\xff":
            return framed
        return self.seal_inline(framed)


def map_inline(fields: bytes, convert: Callable[[bytes], bytes] | None,
               keys: Mapping[bytes, bytes] | None = None) -> bytes | None:
    """The field map ``fields`` (encoded) with each inline value made ``convert(value)``
    and each content key ``k`` in ``keys`` made ``keys[k]`` (re-addressed: a whole value's,
    see :func:`plain_key`; a chunk's in a manifest's root, see
    :mod:`~pitstop.store.encoding.readdress`), or None if none changed."""
    from .records import FieldRef, decode_field_map, encode_field_map

    decoded = decode_field_map(fields)
    changed = False
    for name, ref in decoded.items():
        if ref.inline is not None:
            if convert is None:
                continue
            inline = convert(ref.inline)
            if inline != ref.inline:
                decoded[name] = FieldRef(b"", len(inline), inline)
                changed = True
        elif ref.manifest is None and keys and ref.hash in keys:
            decoded[name] = FieldRef(keys[ref.hash], ref.size)
            changed = True
        elif ref.manifest is not None and keys:
            from ...serde.chunks import rekeyed_manifest

            manifest = rekeyed_manifest(ref.manifest, keys)
            if manifest is not None:
                decoded[name] = ref._replace(manifest=manifest)
                changed = True
    return encode_field_map(decoded) if changed else None


def plain_key(key: bytes, framed: bytes) -> bytes | None:
    """The SHA-256 content key (:func:`pitstop.serde.digest`) of a whole value of the
    state a sealed store keeps under the keyed address ``key`` (``framed``: its plain
    frame), or None if ``key`` is that already (a value stored before the store was
    sealed), a chunk's (see :mod:`~pitstop.store.encoding.readdress`) or the value cannot
    be read (the importer's verify names it). An export
    carries a value under this key, so that any store can check it; an import into a
    sealed store addresses it again (:meth:`.Encryption.address`)."""
    from ...errors import PitstopError
    from ...serde import digest, unframe
    from .records import is_chunk_key

    if is_chunk_key(key):
        return None
    try:
        fmt, raw = unframe(bytes(framed))
    except (ValueError, PitstopError):
        return None
    plain = digest(fmt, raw)
    return None if plain == key else plain


__all__ = ["INLINE_AAD", "Sealing", "map_inline", "plain_key"]
