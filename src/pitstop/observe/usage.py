"""Byte accounting: what each run, each field and each step holds, read by SQL aggregates.

Nothing here reads a value: a run's bytes come from column lengths and the ``size`` columns
of its checkpoint and value rows, summed by the database (one query per table, however many
checkpoints there are); fields from the checkpoints' field maps (names, hashes and sizes,
never a value). The words it uses:

* **records**: the checkpoint rows themselves (field maps, metadata, attached writes);
* **new**: values the run stored first, owned by it (``pitstop_blobs.run_id``), which go
  when it goes;
* **shared**: values the run references that another run (or a store before schema 10)
  stored: deduplicated, counted where they were stored;
* **effects** and **inputs**: recorded effect results and delivered inputs.

A run's *total* is records + new + effects + inputs: what deleting it could give back, but
for the shared values, which stay while another run references them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ormsgpack

from ..store.encoding.records import decode_field_map

log = logging.getLogger("pitstop.runtime")

_RECORD_BYTES = "LENGTH(fields) + LENGTH(metadata) + COALESCE(LENGTH(writes), 0)"
_VALUE_BYTES = "CASE WHEN b.alias IS NULL THEN b.size ELSE 0 END"  # an alias holds no bytes


@dataclass(slots=True)
class RunUsage:
    """What one run holds (see the module documentation for the words)."""

    run_id: str
    workflow: str | None = None
    status: str | None = None
    checkpoints: int = 0
    records: int = 0
    new: int = 0
    shared: int = 0
    effects: int = 0
    inputs: int = 0
    head_size: int = 0
    """The state's size at the run's head (its fields' stored bytes)."""

    @property
    def total(self) -> int:
        return self.records + self.new + self.effects + self.inputs

    @property
    def per_checkpoint(self) -> float:
        """Average growth a checkpoint: records and new values over checkpoints."""
        return (self.records + self.new) / self.checkpoints if self.checkpoints else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "status": self.status,
                "checkpoints": self.checkpoints, "records": self.records, "new": self.new,
                "shared": self.shared, "effects": self.effects, "inputs": self.inputs,
                "head_size": self.head_size, "total": self.total,
                "per_checkpoint": round(self.per_checkpoint, 1)}


@dataclass(slots=True)
class GroupUsage:
    """Bytes by a field or a step name, over checkpoints."""

    name: str
    checkpoints: int = 0
    """Checkpoints that hold the field (or that the step wrote)."""
    versions: int = 0
    """Distinct values the field took (a step: checkpoints)."""
    written: int = 0
    """Bytes of those distinct values (a chunked value counted whole, so an upper bound of
    what its chunks hold); a step: its checkpoints' records and new values."""
    referenced: int = 0
    """The field's size summed over every checkpoint holding it: what the store would hold
    without sharing unchanged values between checkpoints."""
    head: int = 0
    """The field's size at the run's head (0 where it has none)."""
    largest: int = 0
    """Largest single value (a step: largest checkpoint growth)."""
    chunked: bool = False
    seconds: float = 0.0
    """A step: the time its checkpoints record it ran."""
    _seen: set[Any] = field(default_factory=set, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "checkpoints": self.checkpoints, "versions": self.versions,
                "written": self.written, "referenced": self.referenced, "head": self.head,
                "largest": self.largest, "chunked": self.chunked,
                "seconds": round(self.seconds, 6)}


def _sum_by_run(tx: Any, sql: str, params: tuple[Any, ...]) -> dict[str, tuple[int, ...]]:
    return {str(row[0]): tuple(int(v or 0) for v in row[1:]) for row in tx.all(sql, params)}


def runs_usage(store: Any, run_ids: Iterable[str] | None = None, *,
               limit: int | None = None) -> list[RunUsage]:
    """Each run's bytes (all runs, or those named), largest total first; ``limit`` keeps the
    largest. Seven aggregate queries, whatever the store's size: a scan of the checkpoint
    rows, of the value rows and of the effect rows, grouped by run (the per-run sums cannot
    come from indexes), and small ones; the head states' sizes are read for the runs kept
    only (by their primary keys: on PostgreSQL a join over every run scanned the checkpoints
    a third time)."""
    ids = list(run_ids) if run_ids is not None else None
    where = "" if ids is None else f" WHERE {{col}} IN ({', '.join('?' * len(ids))})"
    params = tuple(ids or ())

    def read(tx: Any) -> list[RunUsage]:
        def clause(column: str) -> str:
            return where.format(col=column)

        runs = tx.all(f"SELECT run_id, workflow, status FROM pitstop_runs{clause('run_id')}",
                      params)
        checkpoints = _sum_by_run(
            tx, f"SELECT run_id, COUNT(*), SUM({_RECORD_BYTES}) FROM pitstop_checkpoints"
                f"{clause('run_id')} GROUP BY run_id", params)
        new = _sum_by_run(
            tx, f"SELECT b.run_id, SUM({_VALUE_BYTES}) FROM pitstop_blobs b"
                f"{clause('b.run_id') if ids is not None else ' WHERE b.run_id IS NOT NULL'}"
                " GROUP BY b.run_id", params)
        shared = _sum_by_run(
            tx, f"SELECT r.run_id, SUM({_VALUE_BYTES}) FROM pitstop_blob_refs r "
                f"JOIN pitstop_blobs b ON b.hash = r.hash{clause('r.run_id')} GROUP BY r.run_id",
            params)
        effects = _sum_by_run(
            tx, f"SELECT run_id, SUM(LENGTH(result)) FROM pitstop_effects{clause('run_id')} "
                "GROUP BY run_id", params)
        inputs = _sum_by_run(
            tx, f"SELECT run_id, SUM(LENGTH(payload)) FROM pitstop_inputs{clause('run_id')} "
                "GROUP BY run_id", params)
        found = []
        for run_id, workflow, status in runs:
            count, records = checkpoints.get(run_id, (0, 0))
            found.append(RunUsage(
                run_id, workflow, status, count, records, new.get(run_id, (0,))[0],
                shared.get(run_id, (0,))[0], effects.get(run_id, (0,))[0],
                inputs.get(run_id, (0,))[0]))
        found.sort(key=lambda usage: (-usage.total, usage.run_id))
        kept = found[:limit] if limit else found
        _head_sizes(tx, kept, every=ids is None and not limit)
        return kept

    return store._tx(read)  # type: ignore[no-any-return]


_HEADS = ("SELECT r.run_id, c.size FROM pitstop_runs r JOIN pitstop_checkpoints c "
          "ON c.run_id = r.run_id AND c.id = r.head_id")


def _head_sizes(tx: Any, usages: list[RunUsage], *, every: bool) -> None:
    """Fill in ``head_size``: of every run in one join (``every``), else of these runs by
    their keys, in chunks of the dialect's bound."""
    by_id = {usage.run_id: usage for usage in usages}
    if every:
        rows = tx.all(_HEADS)
    else:
        rows = tx.in_chunks(_HEADS + " WHERE r.run_id IN ({in})", list(by_id)) if by_id \
            else []
    for run_id, size in rows:
        usage = by_id.get(str(run_id))
        if usage is not None:
            usage.head_size = int(size or 0)


def fields_usage(store: Any, run_id: str | None = None) -> list[GroupUsage]:
    """Bytes by field name over a run's checkpoints (or the whole store's), largest
    ``written`` first: reads field maps (names, hashes, sizes), never values."""
    head_sql = ("SELECT c.fields FROM pitstop_runs r JOIN pitstop_checkpoints c "
                "ON c.run_id = r.run_id AND c.id = r.head_id")
    params: tuple[str, ...] = ()
    if run_id is None:
        every, heads = "SELECT fields FROM pitstop_checkpoints", head_sql
    else:
        every = "SELECT fields FROM pitstop_checkpoints WHERE run_id = ?"
        heads, params = head_sql + " WHERE r.run_id = ?", (run_id,)
    rows, head_rows = store._tx(lambda tx: (tx.column(every, params), tx.column(heads, params)))
    groups: dict[str, GroupUsage] = {}

    def group_of(name: str) -> GroupUsage:
        group = groups.get(name)
        if group is None:
            group = groups[name] = GroupUsage(name)
        return group

    unpack = ormsgpack.unpackb
    for data in rows:
        # The field map's entries as stored (see records.encode_field_map): [name, inline],
        # [name, hash, size] or [name, manifest, size, 1]; read raw, no FieldRef made (a
        # store-wide listing reads every checkpoint's map).
        for entry in unpack(data):
            name, key = entry[0], entry[1]
            size = len(key) if len(entry) == 2 else entry[2]
            group = groups.get(name) or group_of(name)
            group.checkpoints += 1
            group.referenced += size
            group.largest = max(group.largest, size)
            seen = group._seen
            if key not in seen:
                seen.add(key)
                group.versions += 1
                group.written += size
                if len(entry) == 4:
                    group.chunked = True
    for data in head_rows:
        for name, ref in decode_field_map(bytes(data)).items():
            group_of(name).head += ref.size
    found = sorted(groups.values(), key=lambda g: (-g.written, g.name))
    for group in found:
        group._seen = set()
    return found


def field_sizes(store: Any, run_id: str, checkpoint_id: str) -> dict[str, int]:
    """Each field's stored size in one checkpoint (from its field map; no value read)."""
    data = store._tx(lambda tx: tx.scalar(
        "SELECT fields FROM pitstop_checkpoints WHERE run_id = ? AND id = ?",
        (run_id, checkpoint_id)))
    if data is None:
        return {}
    return {name: ref.size for name, ref in decode_field_map(bytes(data)).items()}


def flag_size(store: Any, saved: Any, limit: int, *, workflow: str | None,
              lease: Any) -> None:
    """Checkpoint ``saved`` reached ``limit`` bytes of state (``size_warning``): log it with
    its largest fields, count it in metrics, mark its run (``metadata["size_warning"]``, what
    the inspector shows). Reads one field map and updates the run: paid only when it fires."""
    import time

    from ..errors import PitstopError
    from ..logfmt import kv
    from . import metrics

    run_id = saved.run_id
    fields = field_sizes(store, run_id, saved.id)
    largest = dict(sorted(fields.items(), key=lambda item: -item[1])[:5])
    over = [name for name, size in fields.items() if size >= limit]
    log.warning(kv(event="size_warning", run=run_id, workflow=workflow or "-",
                   checkpoint=saved.id, bytes=saved.size, limit=limit,
                   fields=",".join(f"{n}={s}" for n, s in largest.items())),
                extra={"run_id": run_id, "checkpoint_id": saved.id})
    counting = metrics.current()
    if counting is not None:
        counting.size_warnings.labels(workflow or "", "checkpoint").inc()
        if over:
            counting.size_warnings.labels(workflow or "", "field").inc(len(over))
    try:
        store.update_run(run_id, lease=lease, metadata={"size_warning": {
            "checkpoint": saved.id, "bytes": saved.size, "limit": limit, "fields": largest,
            "over": over, "at": time.time()}})
    except PitstopError as exc:  # the mark is advice: the run goes on without it
        log.debug("run %r: size warning not marked: %s", run_id, exc)


def steps_usage(store: Any, run_id: str) -> list[GroupUsage]:
    """Bytes by step name over a run's checkpoints: what the checkpoints each step ended
    with added (records and new values) and the time they record, largest first."""
    import json

    rows = store._tx(lambda tx: tx.all(
        f"SELECT metadata, added, {_RECORD_BYTES} FROM pitstop_checkpoints WHERE run_id = ?",
        (run_id,)))
    groups: dict[str, GroupUsage] = {}
    for metadata, added, record in rows:
        meta = json.loads(metadata) if metadata else {}
        name = str(meta.get("step_name") or f"({meta.get('source') or 'none'})")
        group = groups.get(name)
        if group is None:
            group = groups[name] = GroupUsage(name)
        growth = int(added or 0) + int(record or 0)
        group.checkpoints += 1
        group.versions += 1
        group.written += growth
        group.largest = max(group.largest, growth)
        duration = meta.get("duration")
        if isinstance(duration, int | float):
            group.seconds += duration
    return sorted(groups.values(), key=lambda g: (-g.written, g.name))


def growth(store: Any, run_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Each checkpoint's growth (its record plus the values it stored first), newest first:
    ``id``, ``step``, ``created_at``, ``size`` (the state's), ``added``, ``record``."""
    sql = (f"SELECT id, step, created_at, size, added, {_RECORD_BYTES} FROM pitstop_checkpoints "
           "WHERE run_id = ? ORDER BY created_at DESC, id DESC")
    params: tuple[Any, ...] = (run_id,)
    if limit:
        sql += " LIMIT ?"
        params += (limit,)
    rows = store._tx(lambda tx: tx.all(sql, params))
    return [{"id": row[0], "step": int(row[1]), "created_at": float(row[2]),
             "size": int(row[3]), "added": int(row[4]), "record": int(row[5])} for row in rows]


__all__ = ["GroupUsage", "RunUsage", "fields_usage", "growth", "runs_usage", "steps_usage"]
