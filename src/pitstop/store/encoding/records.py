"""How checkpoints become stored records, independent of any database.

A checkpoint is stored as one small record plus one content-addressed value per state field:

* each field value is serialised on its own, framed (format byte, optional zstd) and keyed by
  ``digest(format, raw)`` — equal values are stored once, whichever run or checkpoint they
  belong to;
* the record holds the field map (field name -> value hash and stored size), the metadata as
  JSON, and a checksum over everything in it, so a torn or edited record is detected on load.

Every backend writes and reads through this module: what is verified, and how, lives here once.
Turning values into those framed, hashed (maybe chunked) bytes and back is
:class:`pitstop.store.encoding.valuecodec.ValueCodec`, kept apart so that reading rows imports
no codec.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeAlias

import orjson
import ormsgpack

from ...errors import CorruptCheckpointError, SerializationError
from ...model import Checkpoint, CheckpointSummary

if TYPE_CHECKING:
    from .blobs import Deferred

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def field_path(field: str, relative: str | None = None) -> str:
    """``state.messages[3].tool`` style path for error messages."""
    head = f"state.{field}" if _IDENTIFIER.match(field) else f"state[{field!r}]"
    return head + (relative or "")


INLINE_MAX = 40
"""Values whose framed bytes are at most this long are kept inside the checkpoint record
instead of in a separate content-addressed row: a reference (32-byte hash plus size) would be
as big as the value, and every extra row costs index pages on each write."""


class FieldRef(NamedTuple):
    """Where one field's value is: a stored value by hash, or the value itself inline.

    A named tuple, not a dataclass: one is made per field per checkpoint, on the hot path.
    """

    hash: bytes
    """Content hash of a separately stored value (empty for an inline value)."""
    size: int
    """Stored (framed, possibly compressed) size in bytes."""
    inline: bytes | None = None
    """The framed value itself, for small values kept in the record."""
    manifest: bytes | None = None
    """For a value stored as chunks: its manifest (:mod:`pitstop.serde.chunks`), kept in the
    record (so covered by its checksum); its chunks are rows of the value table."""

    def same_as(self, other: FieldRef | None) -> bool:
        if other is None:
            return False
        if self.manifest is not None:
            return self.manifest == other.manifest
        if self.inline is not None:
            return self.inline == other.inline
        return other.inline is None and other.manifest is None and self.hash == other.hash


FieldMap = dict[str, FieldRef]


_CHUNKED = 1  # the 4th item of a field-map entry: the value is chunked, entry[1] its manifest


def encode_field_map(fields: FieldMap) -> bytes:
    return ormsgpack.packb(
        [
            [name, ref.inline]
            if ref.inline is not None
            else [name, ref.manifest, ref.size, _CHUNKED]
            if ref.manifest is not None
            else [name, ref.hash, ref.size]
            for name, ref in fields.items()
        ]
    )


def decode_field_map(data: bytes) -> FieldMap:
    fields: FieldMap = {}
    for entry in ormsgpack.unpackb(data):
        if len(entry) == 2:
            fields[entry[0]] = FieldRef(b"", len(entry[1]), bytes(entry[1]))
        elif len(entry) == 4:
            if entry[3] != _CHUNKED:
                raise ValueError(f"unknown field kind {entry[3]!r} (written by a newer pitstop?)")
            fields[entry[0]] = FieldRef(b"", entry[2], None, bytes(entry[1]))
        else:
            fields[entry[0]] = FieldRef(bytes(entry[1]), entry[2])
    return fields


def _manifest_roots(manifest: bytes) -> list[bytes]:
    from ...serde import chunks as chunking  # only a chunked value has a manifest

    try:
        return [entry.key for entry in chunking.decode_manifest(manifest).root]
    except ValueError:
        return []  # a load reports it, naming the field


def stored_hashes(fields: FieldMap) -> set[bytes]:
    """Hashes of the values a field map references in the value table (not inline ones):
    whole values, and the top chunks of chunked ones (those under a node are found by
    reading the node: :meth:`ValueCodec.chunks_below`)."""
    out: set[bytes] = set()
    for ref in fields.values():
        if ref.manifest is not None:
            out.update(_manifest_roots(ref.manifest))
        elif ref.inline is None:
            out.add(ref.hash)
    return out


def is_chunk_key(key: bytes) -> bool:
    """Whether a value-table key names a chunk (xxh3, 17 bytes) rather than a whole value."""
    return len(key) == CHUNK_KEY_SIZE


CHUNK_KEY_SIZE: Final = 17
""":data:`pitstop.serde.chunkkeys.KEY_SIZE`, here so that reading rows does not import the chunker
(tests/test_cli_imports.py checks they agree)."""


class NewBlob(NamedTuple):
    """A value to store: its content hash and framed bytes (a named tuple: made per save).

    A chunk of an array may be kept as its frame header in ``data`` and a view of the
    array's memory in ``body`` (a save that writes it at once: no copy of the chunk is
    made; a blob-store file is written from the two pieces)."""

    hash: bytes
    data: bytes
    body: memoryview | None = None

    @property
    def size(self) -> int:
        return len(self.data) if self.body is None else len(self.data) + len(self.body)

    @property
    def stored(self) -> bytes:
        """The framed bytes, whole (joined if the body is a view)."""
        return self.data if self.body is None else self.data + self.body

    @property
    def pieces(self) -> tuple[bytes | memoryview, ...]:
        """The framed bytes as written to a file, unjoined."""
        return (self.data,) if self.body is None else (self.data, self.body)


_CHUNK_COMPRESS_MIN = 128
"""Compressed chunks (a dict's) at least this large; zstd's frame costs ~13 bytes."""


class Alias(NamedTuple):
    """A chunk a new chunk extends: its row can become "the first ``size`` stored bytes of
    ``target``" instead of holding them twice (a growing list's open last chunk)."""

    key: bytes
    target: bytes
    size: int
    """Stored (framed) bytes of ``key``: a prefix of ``target``'s (neither is compressed)."""


CHUNK_HASHES = ("xxh3", "sha256")


def check_chunk_hash(chunk_hash: str) -> str:
    """``chunk_hash`` if it names a hash new chunks can be keyed by, else ValueError."""
    if chunk_hash not in CHUNK_HASHES:
        raise ValueError(f"chunk_hash must be one of {CHUNK_HASHES}, not {chunk_hash!r}")
    return chunk_hash
"""What keys (and so verifies) new chunks: xxh3-128 (the default: ~10 GB/s, detects any
accidental damage) or SHA-256 cut to 128 bits (~1 GB/s; no one can craft two chunks with
one key, for stores that hold content from untrusted sources)."""


RAW_KEEP_MAX = 2048
"""Serialised values up to this size are remembered with the checkpoint that holds them (for
the last checkpoints this process wrote), so the next save without a ``changed`` hint can
tell an unchanged field by comparing bytes, without hashing and framing it again."""


class Parent(NamedTuple):
    """What a save needs of its parent checkpoint (cached per checkpoint id: immutable)."""

    id: str
    run_id: str
    step: int
    fields: FieldMap


@dataclass(slots=True)
class CheckpointRecord:
    """A ``pitstop_checkpoints`` row: a checkpoint as stored, everything but the field values.

    Its fields are the table's columns in table order: :mod:`pitstop.store.engine.schema` builds the
    SQL column lists from them, and a row read with those columns is ``CheckpointRecord(*row)``.
    """

    id: str
    run_id: str
    parent_id: str | None
    step: int
    created_at: float
    schema_version: int
    metadata: str
    fields: bytes
    size: int
    added: int
    checksum: str = ""
    writes: bytes | None = None
    """Records attached to the checkpoint after it was written (an integration's pending
    writes), framed one by one, each with its own checksum (:mod:`pitstop.store.encoding.attached`);
    outside the record's checksum, which they would otherwise change: the checkpoint itself
    stays immutable."""

    def compute_checksum(self) -> str:
        fields: Any = self.fields
        if isinstance(fields, str):  # read back as TEXT: its bytes still tell if the rest held
            fields = fields.encode("utf-8", "surrogateescape")
        packed = ormsgpack.packb(
            [
                self.id,
                self.run_id,
                self.parent_id,
                self.step,
                self.created_at,
                self.schema_version,
                self.metadata,
                fields,
            ]
        )
        return hashlib.sha256(packed).hexdigest()[:32]

    def verify(self) -> None:
        if isinstance(self.fields, str):
            raise CorruptCheckpointError(
                f"field map {TEXT_IN_BLOB}", checkpoint_id=self.id, run_id=self.run_id
            )
        if self.checksum != self.compute_checksum():
            raise CorruptCheckpointError(
                "record checksum mismatch", checkpoint_id=self.id, run_id=self.run_id
            )

    def field_map(self) -> FieldMap:
        if isinstance(self.fields, str):
            raise CorruptCheckpointError(
                f"field map {TEXT_IN_BLOB}", checkpoint_id=self.id, run_id=self.run_id
            )
        try:
            return decode_field_map(self.fields)
        except Exception as exc:
            raise CorruptCheckpointError(
                f"unreadable field map ({exc})", checkpoint_id=self.id, run_id=self.run_id
            ) from exc

    @property
    def footprint(self) -> int:
        """Bytes this checkpoint added to its store: the record itself (field map with the
        small values inline, metadata) plus the values it stored that its parent did not
        reference. A run's ``bytes`` counts the same."""
        return self.added + len(self.metadata) + len(self.fields)

    def row(self) -> tuple[Any, ...]:
        """The record as stored, in the column order every backend inserts it."""
        return (
            self.id,
            self.run_id,
            self.parent_id,
            self.step,
            self.created_at,
            self.schema_version,
            self.metadata,
            self.fields,
            self.size,
            self.added,
            self.checksum,
            self.writes,
        )

    def _summary_row(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.run_id,
            self.parent_id,
            self.step,
            self.created_at,
            self.schema_version,
            self.checksum,
            self.size,
            self.metadata,
            self.footprint,
        )

    def summary(self) -> CheckpointSummary:
        return CheckpointSummary._from_row(*self._summary_row())

    def checkpoint(self, state: dict[str, Any]) -> Checkpoint:
        """This record as a :class:`Checkpoint` holding ``state`` (no keyword plumbing: it is
        built on every save)."""
        # (_summary_row's values, passed without building the tuple, and _from_row's two
        # steps without its frame and star-arguments: once per save.)
        ckpt = object.__new__(Checkpoint)
        ckpt._fill(
            self.id, self.run_id, self.parent_id, self.step, self.created_at,
            self.schema_version, self.checksum, self.size, self.metadata,
            self.added + len(self.metadata) + len(self.fields),
        )
        ckpt.state = state
        ckpt.skipped = ()
        return ckpt


# One configured encoder: json.dumps would rebuild it (and re-check its options) per call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# orjson encodes a step's metadata ~10x faster than the json module. It writes NaN and the
# infinities as null where json refuses them, and refuses what json would convert (non-str
# keys, huge ints): such metadata takes the json path, so what is accepted stays the same.
_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def encode_metadata(metadata: Mapping[str, Any] | None, run_id: str) -> str:
    """Compact JSON; a value that is not JSON is named in the error, nothing is written."""
    if not metadata:
        return "{}"
    try:
        fast = orjson.dumps(metadata, option=_ORJSON_OPTIONS)
    except TypeError:
        pass  # (a lone surrogate too: orjson refuses it)
    else:
        # find, not ``in``: ``bytes in bytes`` formats and clears a TypeError on every test
        # (it tries the needle as an int first), ~2.5k instructions each; this runs on every
        # workflow step.
        if fast.find(b"\\u0000") >= 0:
            _refuse_untextual(metadata, run_id, "metadata")
        if fast.find(b"null") < 0:  # else maybe a NaN: let json judge
            return fast.decode()
    try:
        text = _JSON.encode(metadata)
    except (TypeError, ValueError) as exc:
        for key, value in metadata.items():
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise SerializationError(
                    f"metadata must be JSON ({exc})",
                    run_id=run_id,
                    path=f"metadata.{key}",
                    type_name=type(value).__name__,
                ) from None
        raise SerializationError(f"metadata must be JSON ({exc})", run_id=run_id) from None
    if "\\u0000" in text or (not text.isascii() and not _is_utf8(text)):
        _refuse_untextual(metadata, run_id, "metadata")
    return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(kind: str, value: str) -> None:
    """Refuse text no backend keeps alike (one check, before any SQL): a NUL, which
    PostgreSQL refuses in TEXT and in ``jsonb`` (where metadata filters read it) while
    SQLite stores it, and a lone surrogate, which no UTF-8 holds."""
    if "\x00" in value:
        raise ValueError(f"{kind} {value!r} holds a NUL character, which a store cannot keep")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{kind} {value!r} holds a lone surrogate, which is not text a "
                             "store can keep") from None


def _refuse_untextual(value: Any, run_id: str, path: str) -> None:
    """Refuse a NUL or a lone surrogate in a key or string of ``value``, naming where: one
    check for every backend (PostgreSQL's ``jsonb``, which metadata filters read, refuses
    NUL; SQLite kept it; no UTF-8 holds a lone surrogate)."""
    if isinstance(value, str):
        try:
            check_text("the text", value)
        except ValueError as exc:
            raise SerializationError(str(exc), run_id=run_id, path=path,
                                     type_name="str") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if isinstance(key, str) and key.isprintable() \
                else f"{path}[{key!r}]"
            if isinstance(key, str):
                _refuse_untextual(key, run_id, f"{where} (the key)")
            _refuse_untextual(item, run_id, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _refuse_untextual(item, run_id, f"{path}[{index}]")


class TextInBlobColumn(bytes):
    """The bytes of a value SQLite read back with the storage class TEXT from a BLOB column:
    what one flipped bit in a record header does (a row's serial type 2n+12 becomes 2n+13).
    Kept as the bytes they were, so a load can name the field, and refused there as
    corruption (``fallback=True`` passes the checkpoint, ``verify`` lists it)."""


TEXT_IN_BLOB: Final = "stored as TEXT, not a BLOB (a damaged SQLite record header)"


def blob_column(data: Any) -> bytes:
    """A BLOB column's value as bytes; one read back as text is a :class:`TextInBlobColumn`."""
    if isinstance(data, str):
        return TextInBlobColumn(data.encode("utf-8", "surrogateescape"))
    return bytes(data)


Stored: TypeAlias = "bytes | Deferred"
"""A stored value as a load has it: its bytes, or (in a blob store) where to read them."""


__all__ = [
    "RAW_KEEP_MAX",
    "Alias",
    "CheckpointRecord",
    "FieldMap",
    "FieldRef",
    "NewBlob",
    "Parent",
    "Stored",
    "decode_field_map",
    "encode_field_map",
    "encode_metadata",
    "field_path",
    "stored_hashes",
]

