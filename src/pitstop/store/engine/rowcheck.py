"""What a well-formed row holds: the checks of each table's fields, done once.

Checkpoint records carry a checksum; a run row does not (it changes on every step), and an
imported archive is whatever its writer put in it. So the fields that no checksum covers are
checked here, by type and range, before they reach the database or the caller:

* :func:`run_problem` on every run row read (``pitstop_runs`` can be damaged or hand-edited:
  one bad row is reported, the others still list) and on an imported run record;
* the record checks here on everything an import is about to write
  (:func:`~pitstop.store.transfer.runs.export_problem` walks an export with them), so a
  malformed archive is refused as a whole, with one line naming the record, before a row
  is written.

Each returns a sentence saying what is wrong (None: nothing), not an exception: the caller
knows whether that is a corrupt store (:class:`~pitstop.CorruptCheckpointError`) or a
refused import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...model import RunStatus
from ..encoding.records import CHUNK_KEY_SIZE

if TYPE_CHECKING:
    from ..encoding.records import CheckpointRecord
    from .schema import EffectRecord, InputRecord, RunRecord

INT32 = (-(2**31), 2**31 - 1)
"""INTEGER columns (step, priority, checkpoints): 32 bits on PostgreSQL."""
INT64 = (-(2**63), 2**63 - 1)
"""BIGINT columns (sizes, byte counts, the fence)."""
_STATUSES = frozenset(s.value for s in RunStatus)
_HASH_SIZES = (32, CHUNK_KEY_SIZE)


def _integer(name: str, value: Any, bounds: tuple[int, int], *, minimum: int | None = None,
             optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} is {_kind(value)}, not an integer"
    low, high = bounds if minimum is None else (minimum, bounds[1])
    if not low <= value <= high:
        return f"{name} {value} is out of range ({low}..{high})"
    return None


def _time(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} is {_kind(value)}, not a timestamp"
    if not math.isfinite(value) or abs(value) > 1e11:
        return f"{name} {value!r} is not a timestamp"
    return None


def _text(name: str, value: Any, *, optional: bool = False, limit: int = 512) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        return f"{name} is {_kind(value)}, not a non-empty string of at most {limit} characters"
    return None


def bytes_problem(name: str, value: Any) -> str | None:
    if not isinstance(value, bytes | bytearray | memoryview):
        return f"{name} is {_kind(value)}, not bytes"
    return None


def hash_problem(name: str, value: Any) -> str | None:
    if not isinstance(value, bytes | bytearray | memoryview) or len(value) not in _HASH_SIZES:
        return f"{name} is {_kind(value)}, not a content hash"
    return None


def _json(name: str, value: Any, expected: type[Any], *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        return f"{name} is {_kind(value)}, not JSON text"
    try:
        decoded = json.loads(value)
    except ValueError as exc:
        return f"{name} is not JSON ({exc})"
    if not isinstance(decoded, expected):
        return f"{name} is JSON {_kind(decoded)}, not a JSON {_JSON_NAMES[expected]}"
    if isinstance(decoded, list) and not all(isinstance(item, str) for item in decoded):
        return f"{name} is not a JSON list of input names"
    return None


_JSON_NAMES: dict[type[Any], str] = {dict: "object", list: "list"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _first(checks: Iterable[str | None]) -> str | None:
    return next((c for c in checks if c is not None), None)


def run_problem(run: RunRecord) -> str | None:
    """What is wrong with a run's own columns, or None."""
    status = run.status
    return _first((
        _text("run_id", run.run_id),
        _text("workflow", run.workflow, optional=True, limit=10_000),
        None if isinstance(status, str) and status in _STATUSES
        else f"status {status!r} is not a run status ({', '.join(sorted(_STATUSES))})",
        _time("created_at", run.created_at),
        _time("updated_at", run.updated_at),
        _json("metadata", run.metadata, dict),
        _text("head_id", run.head_id, optional=True),
        _integer("step", run.step, INT32, minimum=0, optional=True),
        _json("waiting_for", run.waiting_for, list, optional=True),
        _time("wake_at", run.wake_at, optional=True),
        _integer("checkpoints", run.checkpoints, INT32, minimum=0),
        _integer("bytes", run.bytes, INT64, minimum=0),
        _integer("priority", run.priority, INT32),
        _text("parent_run", run.parent_run, optional=True),
    ))


def checkpoint_problem(record: CheckpointRecord) -> str | None:
    """What is wrong with the types of a checkpoint record's columns (its checksum and field
    map are checked by the record itself), or None."""
    return _first((
        _text("id", record.id),
        _text("run_id", record.run_id),
        _text("parent_id", record.parent_id, optional=True),
        _integer("step", record.step, INT32, minimum=0),
        _time("created_at", record.created_at),
        _integer("schema_version", record.schema_version, INT32, minimum=0),
        _json("metadata", record.metadata, dict),
        bytes_problem("fields", record.fields),
        _integer("size", record.size, INT64, minimum=0),
        _integer("added", record.added, INT64, minimum=0),
        None if isinstance(record.checksum, str) else "checksum is not text",
        None if record.writes is None else bytes_problem("writes", record.writes),
    ))


def input_problem(item: InputRecord) -> str | None:
    return _first((
        _text("id", item.id),
        _text("name", item.name),
        bytes_problem("payload", item.payload),
        hash_problem("hash", item.hash),
        _time("created_at", item.created_at),
        _text("consumed_by", item.consumed_by, optional=True),
    ))


def effect_problem(effect: EffectRecord) -> str | None:
    return _first((
        _text("key", effect.key, limit=10_000),
        _text("checkpoint_id", effect.checkpoint_id, optional=True),
        bytes_problem("result", effect.result),
        hash_problem("hash", effect.hash),
        _time("created_at", effect.created_at),
    ))


__all__ = [
    "INT32",
    "INT64",
    "bytes_problem",
    "checkpoint_problem",
    "effect_problem",
    "hash_problem",
    "input_problem",
    "run_problem",
]
