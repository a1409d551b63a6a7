"""A run as raw stored records: what :meth:`Store.export_run` reads and ``import_run`` writes.

Moving a run between stores (SQLite to PostgreSQL and back) must not re-serialise anything:
the checkpoint records keep their ids, parents and checksums, and the field values keep their
stored bytes and content hashes, so the copy is bit-for-bit the original and still verifies.
This module holds those raw pieces and checks them; it knows no database and no file format
(``pitstop.archive`` puts a :class:`RunExport` in a file).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pitstop.errors import CorruptCheckpointError
from pitstop.serde import digest, unframe

from .records import CheckpointRecord, stored_hashes


@dataclass(slots=True)
class RunRecord:
    """A run's row as stored, without its lease (a lease belongs to a process, not a run)."""

    run_id: str
    workflow: str | None
    status: str
    created_at: float
    updated_at: float
    metadata: str
    """The run's metadata as stored (JSON text)."""
    head_id: str | None
    step: int | None
    waiting_for: str | None
    """JSON list of input names, as stored, or None."""
    wake_at: float | None
    checkpoints: int
    bytes: int
    priority: int


@dataclass(frozen=True, slots=True)
class InputRecord:
    """A delivered input as stored: its payload framed and content-hashed like a field value."""

    id: str
    run_id: str
    name: str
    payload: bytes
    hash: bytes
    created_at: float
    consumed_by: str | None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """A recorded effect result (or integration write) as stored."""

    run_id: str
    key: str
    checkpoint_id: str | None
    result: bytes
    hash: bytes
    created_at: float


@dataclass(slots=True)
class RunExport:
    """Everything a store holds about one run, raw: enough to recreate it in another store."""

    run: RunRecord
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    """Oldest first (by id, so every parent in the run comes before its children)."""
    blobs: dict[bytes, bytes] = field(default_factory=dict)
    """Every separately stored value the checkpoints reference: content hash -> stored
    (framed) bytes. Values small enough to live inside a record are not listed."""
    inputs: list[InputRecord] = field(default_factory=list)
    effects: list[EffectRecord] = field(default_factory=list)

    def verify(self) -> None:
        """Check every checksum and reference; raise :class:`~pitstop.CorruptCheckpointError`.

        Importers call this before writing anything, so a damaged or hand-edited export is
        refused as a whole instead of leaving a half-imported run behind.
        """
        run_id = self.run.run_id
        ids = set()
        for record in self.checkpoints:
            if record.run_id != run_id:
                raise CorruptCheckpointError(
                    f"belongs to run {record.run_id!r}, not to the exported run",
                    checkpoint_id=record.id,
                    run_id=run_id,
                )
            record.verify()
            for name, ref in record.field_map().items():
                if ref.inline is None and ref.hash not in self.blobs:
                    raise CorruptCheckpointError(
                        f"value {ref.hash.hex()[:16]} is missing from the export",
                        checkpoint_id=record.id,
                        run_id=run_id,
                        field=name,
                    )
            ids.add(record.id)
        if self.run.head_id is not None and self.run.head_id not in ids:
            raise CorruptCheckpointError(
                f"the run's head {self.run.head_id} is not among its checkpoints", run_id=run_id
            )
        for h, data in self.blobs.items():
            check_value(data, h, run_id=run_id, what=f"value {h.hex()[:16]}")
        for item in self.inputs:
            check_value(item.payload, item.hash, run_id=run_id, what=f"input {item.id}")
        for effect in self.effects:
            check_value(effect.result, effect.hash, run_id=run_id, what=f"effect {effect.key!r}")

    @property
    def referenced(self) -> list[bytes]:
        """The distinct hashes of the separately stored values the checkpoints reference
        (small values live inside the records themselves and travel with them)."""
        seen: dict[bytes, None] = {}
        for record in self.checkpoints:
            seen.update(dict.fromkeys(stored_hashes(record.field_map())))
        return list(seen)


def check_value(data: bytes, expected: bytes, *, run_id: str, what: str) -> None:
    """Raise unless ``data`` is a readable frame whose content hash is ``expected``."""
    try:
        fmt, raw = unframe(bytes(data))
    except ValueError as exc:
        raise CorruptCheckpointError(f"{what}: {exc}", run_id=run_id) from None
    if digest(fmt, raw) != bytes(expected):
        raise CorruptCheckpointError(
            f"{what}: checksum mismatch (truncated or altered)", run_id=run_id
        )


__all__ = ["EffectRecord", "InputRecord", "RunExport", "RunRecord", "check_value"]
