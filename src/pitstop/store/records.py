"""How checkpoints become stored records, independent of any database.

A checkpoint is stored as one small record plus one content-addressed value per state field:

* each field value is serialised on its own, framed (format byte, optional zstd) and keyed by
  ``digest(format, raw)`` — equal values are stored once, whichever run or checkpoint they
  belong to;
* the record holds the field map (field name -> value hash and stored size), the metadata as
  JSON, and a checksum over everything in it, so a torn or edited record is detected on load.

Every backend writes and reads through this module: what is verified, and how, lives here once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import ormsgpack

from ..errors import CorruptCheckpointError, SerializationError
from ..model import Checkpoint, CheckpointSummary
from ..serde import MsgpackSerializer, Serializer, digest, frame, unframe

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

    def same_as(self, other: FieldRef | None) -> bool:
        if other is None:
            return False
        if self.inline is not None:
            return self.inline == other.inline
        return other.inline is None and self.hash == other.hash


FieldMap = dict[str, FieldRef]


def encode_field_map(fields: FieldMap) -> bytes:
    return ormsgpack.packb(
        [
            [name, ref.inline] if ref.inline is not None else [name, ref.hash, ref.size]
            for name, ref in fields.items()
        ]
    )


def decode_field_map(data: bytes) -> FieldMap:
    fields: FieldMap = {}
    for entry in ormsgpack.unpackb(data):
        if len(entry) == 2:
            fields[entry[0]] = FieldRef(b"", len(entry[1]), bytes(entry[1]))
        else:
            fields[entry[0]] = FieldRef(bytes(entry[1]), entry[2])
    return fields


def stored_hashes(fields: FieldMap) -> set[bytes]:
    """Hashes of the values a field map references in the value table (not inline ones)."""
    return {ref.hash for ref in fields.values() if ref.inline is None}


class NewBlob(NamedTuple):
    """A value to store: its content hash and framed bytes (a named tuple: made per save)."""

    hash: bytes
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


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

    Its fields are the table's columns in table order: :mod:`pitstop.store.schema` builds the
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

    def compute_checksum(self) -> str:
        packed = ormsgpack.packb(
            [
                self.id,
                self.run_id,
                self.parent_id,
                self.step,
                self.created_at,
                self.schema_version,
                self.metadata,
                self.fields,
            ]
        )
        return hashlib.sha256(packed).hexdigest()[:32]

    def verify(self) -> None:
        if self.checksum != self.compute_checksum():
            raise CorruptCheckpointError(
                "record checksum mismatch", checkpoint_id=self.id, run_id=self.run_id
            )

    def field_map(self) -> FieldMap:
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
        ckpt = Checkpoint._from_row(*self._summary_row())
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
        pass
    else:
        if b"null" not in fast:  # else maybe a NaN: let json judge
            return fast.decode()
    try:
        return _JSON.encode(metadata)
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


class ValueCodec:
    """Turns values into stored values and back, verified; a state into a field map.

    A stored value is serialised by the store's :class:`~pitstop.serde.Serializer`, framed
    (format byte, optional zstd) and content-hashed.

    Writes use one serializer; reads accept the safe msgpack format always and other formats
    (pickle) only if that serializer was chosen, so opening a store never runs code unless
    the user opted in.
    """

    def __init__(self, serializer: Serializer | None, compress_threshold: int | None) -> None:
        self.serializer: Serializer = serializer or MsgpackSerializer()
        self.compress_threshold = compress_threshold
        safe = MsgpackSerializer(getattr(self.serializer, "registry", None))
        self._readers: dict[int, Serializer] = {safe.format_id: safe}
        self._readers[self.serializer.format_id] = self.serializer

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

    def encode_value(self, value: Any, *, run_id: str, path: str) -> NewBlob:
        """A value as a separately stored, content-addressed blob (inputs, effects)."""
        raw = self._dumps(value, run_id, path)
        fmt = self.serializer.format_id
        return NewBlob(
            digest(fmt, raw), frame(raw, fmt, compress_threshold=self.compress_threshold)
        )

    def encode_state(
        self,
        run_id: str,
        state: Mapping[str, Any],
        parent: FieldMap | None,
        changed: Iterable[str] | None,
        parent_raw: Mapping[str, bytes] | None = None,
    ) -> tuple[FieldMap, dict[bytes, NewBlob], dict[str, bytes]]:
        """The new field map, the values not already referenced by the parent, and the
        serialised bytes of the small fields (see :data:`RAW_KEEP_MAX`).

        ``parent_raw`` is what this returned for the parent, if known: a field serialising to
        the same bytes is the parent's value, known without hashing it again.
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
        reuse = set() if changed is None else set(parent).difference(changed)
        fields: FieldMap = {}
        new: dict[bytes, NewBlob] = {}
        raws: dict[str, bytes] = {}
        fmt = self.serializer.format_id
        inline_head = frame(b"", fmt, compress_threshold=None)  # the format byte, checked once
        for name, value in state.items():
            if name in reuse:
                fields[name] = parent[name]
                continue
            if type(name) is not str:
                raise SerializationError(
                    "state field names must be str", run_id=run_id, path=f"state[{name!r}]"
                )
            raw = self._dumps(value, run_id, "", name)
            if keep and len(raw) <= RAW_KEEP_MAX:
                known = parent_raw.get(name)
                if known is not None and known == raw and name in parent:
                    fields[name] = parent[name]
                    raws[name] = known
                    continue
                raws[name] = raw
            if len(raw) < INLINE_MAX:
                ref = FieldRef(b"", len(raw) + 1, inline_head + raw)  # = frame(raw, fmt)
            else:
                blob = NewBlob(
                    digest(fmt, raw), frame(raw, fmt, compress_threshold=self.compress_threshold)
                )
                ref = FieldRef(blob.hash, blob.size)
            previous = parent.get(name)
            if previous is not None and ref.same_as(previous):
                fields[name] = previous
            else:
                fields[name] = ref
                if ref.inline is None:
                    new[blob.hash] = blob
        return fields, new, raws

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
        try:
            fmt, raw = unframe(bytes(data))
        except ValueError as exc:
            raise corrupt(str(exc)) from None
        # Inline values (no hash) are covered by their record's checksum instead.
        if expected_hash is not None and digest(fmt, raw) != expected_hash:
            raise corrupt("value checksum mismatch (truncated or altered)")
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
        except SerializationError as exc:
            raise exc.located(
                run_id=run_id,
                path=(field_path(field) if field else "") + (exc.path or ""),
                action="load",
            ) from None
        except Exception as exc:
            raise corrupt(f"undecodable value ({type(exc).__name__}: {exc})") from exc

    def decode_checkpoint(
        self, record: CheckpointRecord, blobs: Mapping[bytes, bytes], *, strict: bool = True
    ) -> Checkpoint:
        record.verify()
        state = {
            name: self.decode_value(
                ref.inline if ref.inline is not None else blobs.get(ref.hash),
                None if ref.inline is not None else ref.hash,
                strict=strict,
                checkpoint_id=record.id,
                run_id=record.run_id,
                field=name,
            )
            for name, ref in record.field_map().items()
        }
        return record.checkpoint(state)


__all__ = [
    "RAW_KEEP_MAX",
    "CheckpointRecord",
    "FieldMap",
    "FieldRef",
    "NewBlob",
    "Parent",
    "ValueCodec",
    "decode_field_map",
    "encode_field_map",
    "encode_metadata",
    "field_path",
    "stored_hashes",
]
