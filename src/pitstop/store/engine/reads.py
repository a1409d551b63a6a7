"""Reading checkpoints, history and runs: the part of :class:`~pitstop.store.engine.sql.SqlStore`
that never writes.

A load is one transaction (one snapshot) that reads the record and the values it references,
a level of a chunked value's tree per query; decoding and checksum checks happen after it,
outside the transaction. A corrupt head with ``fallback=True`` walks back along the run's own
branch (:meth:`Reads._fallback`). Listing (``history``, ``summaries``, ``runs``) reads summary
columns only and never decodes state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from ...errors import CheckpointNotFoundError, CorruptCheckpointError, RunNotFoundError
from ...model import Checkpoint, CheckpointSummary, Run, RunStatus
from ..contract.base import Problem, RunList
from ..encoding.records import CheckpointRecord, Parent, Stored, stored_hashes
from . import filters
from .backend import Tx, placeholders
from .schema import (
    CHECKPOINTS,
    RUN_COLUMN_COUNT,
    RUN_ID,
    SELECT_CHECKPOINT,
    SELECT_RUN,
    SELECT_RUN_AND_HEAD,
    SELECT_SUMMARY,
    RunRow,
)
from .values import StoredValues

log = logging.getLogger("pitstop.store")


def _checksum_holds(record: CheckpointRecord) -> bool:
    return record.checksum == record.compute_checksum()


def _self_contained(record: CheckpointRecord) -> bool:
    """Whether every value of the checkpoint is inline in its record."""
    try:
        return not stored_hashes(record.field_map())
    except CorruptCheckpointError:
        return False  # read the usual way, which reports it


_SELECT_HEAD = (
    f"SELECT r.head_id, {CHECKPOINTS.column_list('c.')} FROM pitstop_runs r "
    "LEFT JOIN pitstop_checkpoints c ON c.id = r.head_id WHERE r.run_id = ?"
)
"""The run's head id and its checkpoint (all None when the head is missing)."""


def _head_of(row: Sequence[Any]) -> CheckpointRecord | None:
    """The head checkpoint in a row of SELECT_RUN_AND_HEAD (after the run's columns), or
    None: the run has no head, or its head is gone."""
    head = CheckpointRecord(*row[RUN_COLUMN_COUNT:])
    return head if head.id is not None else None


class Reads(StoredValues):
    """Loading checkpoints, history and runs (a part of ``SqlStore``)."""

    # -- checkpoints ---------------------------------------------------------------------------

    def _load(
        self, tx: Tx, where: str, params: Sequence[Any]
    ) -> tuple[CheckpointRecord | None, dict[bytes, Stored]]:
        row = tx.one(f"{SELECT_CHECKPOINT} {where}", params)
        if row is None:
            return None, {}
        record = CheckpointRecord(*row)
        return record, self._load_values(tx, record)

    def _load_values(
        self, tx: Tx, record: CheckpointRecord, *, partial: bool = False
    ) -> dict[bytes, Stored]:
        """The stored values ``record`` references. ``partial``: for a decode with
        ``partial=True`` (:meth:`_decode_head`), which needs no node row of a chunked value
        whose layout this process knows: those are not read (see ``ValueCodec.load_keys``)."""
        try:
            fields = record.field_map()
        except CorruptCheckpointError:
            return {}  # decoding the record reports it (and a fallback passes it)
        codec = self._value_codec
        first = codec.load_keys(fields) if partial else list(stored_hashes(fields))
        values = self._read_values_deferred(tx, first)
        # A chunked value's tree, a level per query (a value of thousands of chunks is two).
        unpacked: dict[bytes, list[Any]] = {}
        while missing := codec.missing_below(fields, values, nodes=not partial,
                                             unpacked=unpacked):
            found = self._read_values_deferred(tx, missing)
            if not found:
                break  # missing chunks: the decode names the field
            values.update(found)
        return values

    def get(self, checkpoint_id: str, *, strict: bool = True) -> Checkpoint:
        record, values = self._tx(lambda tx: self._load(tx, "WHERE id = ?", (checkpoint_id,)))
        if record is None:
            raise CheckpointNotFoundError(checkpoint_id)
        return self._value_codec.decode_checkpoint(record, values, strict=strict)

    def get_many(
        self, checkpoint_ids: Iterable[str], *, strict: bool = True
    ) -> dict[str, Checkpoint]:
        wanted = list(dict.fromkeys(checkpoint_ids))
        for checkpoint_id in wanted:
            filters.text("checkpoint_id", checkpoint_id)

        def read(tx: Tx) -> tuple[list[CheckpointRecord], dict[bytes, Stored]]:
            records = [CheckpointRecord(*row) for row in tx.in_chunks(
                SELECT_CHECKPOINT + " WHERE id IN ({in})", wanted)]
            maps = []
            for record in records:
                try:
                    maps.append(record.field_map())
                except CorruptCheckpointError:
                    continue  # decoding the record reports it
            hashes = list(dict.fromkeys(h for fields in maps for h in stored_hashes(fields)))
            values = self._read_values_deferred(tx, hashes) if hashes else {}
            # Chunked values' trees, a level per query for all the records at once.
            unpacked: dict[bytes, list[Any]] = {}
            while missing := list(dict.fromkeys(
                    h for fields in maps
                    for h in self._value_codec.missing_below(fields, values, unpacked=unpacked))):
                found = self._read_values_deferred(tx, missing)
                if not found:
                    break  # missing chunks: the decode names the field
                values.update(found)
            return records, values

        if not wanted:
            return {}
        records, values = self._tx(read)
        decoded = {r.id: self._value_codec.decode_checkpoint(r, values, strict=strict)
                   for r in records}
        return {i: decoded[i] for i in wanted if i in decoded}

    def latest(
        self, run_id: str, *, fallback: bool = False, strict: bool = True
    ) -> Checkpoint | None:
        def read(tx: Tx) -> tuple[str | None, CheckpointRecord | None, dict[bytes, Stored]]:
            row = tx.one(_SELECT_HEAD, (run_id,))
            if row is None:
                return None, None, {}
            head_id, *record = row  # the run's head_id, then the checkpoint's columns
            if head_id is None:
                return None, None, {}
            head = CheckpointRecord(*record)
            if head.id is None:
                return head_id, None, {}
            return head_id, head, self._load_values(tx, head, partial=True)

        head_id, record, values = self._tx(read)
        return self._head(run_id, head_id, record, values, fallback, strict)

    def latest_with_run(
        self, run_id: str, *, fallback: bool = False, strict: bool = True
    ) -> tuple[Run, Checkpoint | None]:
        def read(tx: Tx) -> tuple[Any, CheckpointRecord | None, dict[bytes, Stored]]:
            row = tx.one(SELECT_RUN_AND_HEAD, (run_id,))
            head = _head_of(row) if row is not None else None
            return row, head, (
                self._load_values(tx, head, partial=True) if head is not None else {}
            )

        # Small states live entirely in the record: then one statement reads everything;
        # otherwise the values are read too, from one snapshot.
        row = self._autocommit_read(SELECT_RUN_AND_HEAD, (run_id,))
        head = _head_of(row) if row is not None else None
        values: dict[bytes, Stored] = {}
        if head is not None and not _self_contained(head):
            row, head, values = self._tx(read)
        if row is None:
            raise RunNotFoundError(run_id)
        run = RunRow(*row[:RUN_COLUMN_COUNT]).to_run()
        return run, self._head(run_id, run.head_id, head, values, fallback, strict)

    def _head(
        self,
        run_id: str,
        head_id: str | None,
        record: CheckpointRecord | None,
        values: Mapping[bytes, Stored],
        fallback: bool,
        strict: bool,
    ) -> Checkpoint | None:
        """The run's head checkpoint, decoded and verified: the head the run row names must
        exist and belong to the run (the row has no checksum), or it is corrupt too."""
        if head_id is None:
            return None
        try:
            if record is None:
                raise CorruptCheckpointError(
                    f"the run's head {head_id} is missing", run_id=run_id, checkpoint_id=head_id
                )
            if record.run_id != run_id:
                raise CorruptCheckpointError(
                    f"the run's head {head_id} is a checkpoint of run {record.run_id!r}",
                    run_id=run_id, checkpoint_id=head_id,
                )
            found = self._decode_head(record, values, strict)
        except CorruptCheckpointError as exc:
            if not fallback:
                raise
            own = record if record is not None and record.run_id == run_id else None
            return self._fallback(run_id, head_id, own, exc, strict)
        # A run is usually loaded to be continued: its next save will want this field map.
        self._fields.put(record.id, Parent(record.id, run_id, record.step, record.field_map()))
        return found

    def _decode_head(
        self, record: CheckpointRecord, values: Mapping[bytes, Stored], strict: bool
    ) -> Checkpoint:
        """``values`` are this read's own, read with ``partial=True``: the decode may free
        them as it goes (see ``ValueCodec._load_list``), reading them again (all of them)
        only if it then fails or needs a row not read."""
        from ..encoding.valuecodec import RowsReleased  # imported already: a decode needs the codec

        try:
            return self._value_codec.decode_checkpoint(
                record, values, strict=strict, consume=True, partial=True
            )
        except RowsReleased:
            values = self._tx(lambda tx: self._load_values(tx, record))
            return self._value_codec.decode_checkpoint(record, values, strict=strict)

    def _fallback(
        self,
        run_id: str,
        bad_id: str,
        bad: CheckpointRecord | None,
        error: CorruptCheckpointError,
        strict: bool,
    ) -> Checkpoint:
        """The newest valid checkpoint of the run's own branch older than its corrupt head.

        Along the head's ancestry first, while the links can be trusted: a record whose
        checksum holds (its values are what is damaged) names its parent truthfully, and on
        a branched run (``resume --from``) the stored order alone would land on the newest
        checkpoint of the branch the run left. Once a record's own checksum fails (or the
        head is not one of the run's), its links cannot be trusted either: the walk goes on
        by stored order (ids grow with time) below the last checkpoint it reached.
        """
        skipped = [f"{bad_id}: {error.detail}"]
        below: str | None = bad.id if bad is not None else None
        link = bad.parent_id if bad is not None and _checksum_holds(bad) else None
        while link is not None:
            record, values = self._tx(partial(
                self._load, where="WHERE id = ? AND run_id = ?", params=(link, run_id)
            ))
            if record is None:  # pruned, or another run's (a fork's source): stored order
                break
            try:
                found = self._value_codec.decode_checkpoint(record, values, strict=strict)
            except CorruptCheckpointError as exc:
                skipped.append(f"{record.id}: {exc.detail}")
                below = record.id
                link = record.parent_id if _checksum_holds(record) else None
                continue
            return self._fell_back(run_id, found, skipped)
        while True:
            params: tuple[str, ...] = (run_id,) if below is None else (run_id, below)
            where = "WHERE run_id = ? " + ("" if below is None else "AND id < ? ")
            where += "ORDER BY id DESC LIMIT 1"
            record, values = self._tx(partial(self._load, where=where, params=params))
            if record is None:
                break
            try:
                found = self._value_codec.decode_checkpoint(record, values, strict=strict)
            except CorruptCheckpointError as exc:
                skipped.append(f"{record.id}: {exc.detail}")
                below = record.id
                continue
            return self._fell_back(run_id, found, skipped)
        raise CorruptCheckpointError(
            "no valid checkpoint in the run (" + "; ".join(skipped) + ")",
            run_id=run_id,
            checkpoint_id=bad_id,
        )

    @staticmethod
    def _fell_back(run_id: str, found: Checkpoint, skipped: list[str]) -> Checkpoint:
        found.skipped = tuple(skipped)
        log.warning(
            "run %r: head is corrupt, fell back to checkpoint %s (skipped %s)",
            run_id,
            found.id,
            "; ".join(skipped),
        )
        return found

    def summary(self, checkpoint_id: str) -> CheckpointSummary:
        row = self._tx(lambda tx: tx.one(SELECT_SUMMARY + " WHERE id = ?", (checkpoint_id,)))
        if row is None:
            raise CheckpointNotFoundError(checkpoint_id)
        return CheckpointSummary._from_row(*row)

    def summaries(self, checkpoint_ids: Iterable[str]) -> dict[str, CheckpointSummary]:
        wanted = list(dict.fromkeys(checkpoint_ids))
        for checkpoint_id in wanted:
            filters.text("checkpoint_id", checkpoint_id)

        def read(tx: Tx) -> list[Any]:
            rows: list[Any] = []
            # Batches keep the statement under every driver's parameter limit (SQLite's
            # is 32,766 since 3.32, older builds 999).
            for at in range(0, len(wanted), 500):
                batch = wanted[at:at + 500]
                where = f" WHERE id IN ({placeholders(len(batch))})"
                rows.extend(tx.all(SELECT_SUMMARY + where, batch))
            return rows

        if not wanted:
            return {}
        from_row = CheckpointSummary._from_row
        found = {entry.id: entry for entry in (from_row(*row) for row in self._tx(read))}
        return {i: found[i] for i in wanted if i in found}

    def history(
        self, run_id: str, *, limit: int | None = 100, before: str | None = None
    ) -> list[CheckpointSummary]:
        sql = SELECT_SUMMARY + " WHERE run_id = ?"
        params: list[Any] = [run_id]
        if before is not None:
            sql += " AND id < ?"
            params.append(before)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)

        def read(tx: Tx) -> tuple[list[Any], bool]:
            rows = tx.all(sql, params)
            exists = bool(rows) or (
                tx.one("SELECT 1 FROM pitstop_runs WHERE run_id = ?", (run_id,)) is not None
            )
            return rows, exists

        rows, exists = self._tx(read)
        if not exists:
            raise RunNotFoundError(run_id)
        from_row = CheckpointSummary._from_row
        return [from_row(*row) for row in rows]

    # -- runs ----------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run:
        row = self._tx(lambda tx: tx.one(SELECT_RUN + " WHERE run_id = ?", (run_id,)))
        if row is None:
            raise RunNotFoundError(run_id)
        return RunRow(*row).to_run()

    def runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        id_prefix: str | None = None,
        before: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
        parent_run: str | None = None,
    ) -> RunList:
        filters.text("before", before)
        filters.count("limit", limit, optional=True)
        filters.count("offset", offset)
        where, params = self._run_filters(status, workflow, since, until, metadata, id_prefix,
                                          parent_run)
        if before is not None:
            # Keyset paging: the rows after ``before`` in (created_at DESC, run_id DESC)
            # order, found through the index however deep the page is (OFFSET walks them).
            where.append(
                "(created_at < (SELECT created_at FROM pitstop_runs WHERE run_id = ?) OR "
                "(created_at = (SELECT created_at FROM pitstop_runs WHERE run_id = ?) "
                "AND run_id < ?))"
            )
            params.extend([before, before, before])
        sql = SELECT_RUN
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, run_id DESC"
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            params.extend([limit, offset])
        elif offset:
            raise ValueError("offset needs a limit")
        found = RunList()
        for row in self._query(sql, params):
            try:
                found.append(RunRow(*row).to_run())
            except CorruptCheckpointError as exc:  # one damaged row must not hide the others
                run_id = str(row[RUN_ID])
                found.damaged.append(Problem("run", run_id, exc.detail, run_id=run_id))
        return found

    def count_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        id_prefix: str | None = None,
        parent_run: str | None = None,
    ) -> dict[str, int]:
        where, params = self._run_filters(status, workflow, since, until, metadata, id_prefix,
                                          parent_run)
        if len(where) == (1 if filters.statuses(status) else 0):
            # Only statuses: one count per status, each a range of the (status, created_at)
            # index, rather than GROUP BY status, which hashes every row (PostgreSQL) or
            # walks the whole index (SQLite). 100,000 runs: 65 -> 40 ms on PostgreSQL,
            # 7.8 -> 5.3 ms on SQLite. With other filters the table is read anyway, and
            # one pass grouping it beats a row lookup per index entry.
            wanted = params or [s.value for s in RunStatus]
            sql = ("SELECT s.column1, (SELECT COUNT(*) FROM pitstop_runs WHERE status = "
                   f"s.column1) FROM (VALUES {', '.join(['(?)'] * len(wanted))}) s")
            rows = self._query(sql, wanted)
        else:
            sql = "SELECT status, COUNT(*) FROM pitstop_runs"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " GROUP BY status"
            rows = self._query(sql, params)
        return {run_status: int(count) for run_status, count in rows if count}

    def _run_filters(
        self,
        status: RunStatus | str | Iterable[RunStatus | str] | None,
        workflow: str | None,
        since: datetime | float | None,
        until: datetime | float | None,
        metadata: Mapping[str, Any] | None,
        id_prefix: str | None,
        parent_run: str | None = None,
    ) -> tuple[list[str], list[Any]]:
        """The WHERE clauses (and their params) that :meth:`runs` and :meth:`count_runs`
        share."""
        where: list[str] = []
        params: list[Any] = []
        statuses = filters.statuses(status)
        filters.text("workflow", workflow)
        filters.text("parent_run", parent_run)
        filters.text("id_prefix", id_prefix)
        filters.metadata(metadata)
        if statuses:
            where.append(f"status IN ({placeholders(len(statuses))})")
            params.extend(statuses)
        if workflow is not None:
            where.append("workflow = ?")
            params.append(workflow)
        if parent_run is not None:
            where.append("parent_run = ?")
            params.append(parent_run)
        if since is not None:
            where.append("created_at >= ?")
            params.append(filters.timestamp("since", since))
        if until is not None:
            where.append("created_at < ?")
            params.append(filters.timestamp("until", until))
        if id_prefix:
            # substr, not LIKE: no escaping of % and _, the same text on both dialects.
            where.append("substr(run_id, 1, ?) = ?")
            params.extend([len(id_prefix), id_prefix])
        for key, value in (metadata or {}).items():
            clause, values = self.dialect.json_equals("metadata", key, value)
            where.append(clause)
            params.extend(values)
        return where, params


__all__ = ["Reads"]
