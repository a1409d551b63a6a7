"""Retention and maintenance: deleting runs and checkpoints, pruning, stats, verify.

Nothing here is on the save path. Deletions run in write transactions that lock the run's
row first; values are released through :mod:`pitstop.store.engine.values`, under the backend's
garbage-collection lock (``_lock_gc``), so a concurrent save never loses a value it is about
to reference. ``verify`` reads the store in pages, each in a transaction of its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, Literal, NamedTuple

from ...errors import CorruptCheckpointError, RunNotFoundError
from ...model import RunStatus
from ..contract.base import Problem, Problems, Progress, PruneReport, RetentionPolicy, StoreStats
from ..encoding.attached import read_frames
from ..encoding.records import (
    TEXT_IN_BLOB,
    CheckpointRecord,
    FieldRef,
    TextInBlobColumn,
    blob_column,
    decode_field_map,
    is_chunk_key,
)
from .backend import CHUNK, Tx, placeholders
from .rowcheck import run_problem
from .schema import RUN_ID, SELECT_CHECKPOINT, SELECT_RUN, RunRow
from .values import StoredValues, slot_of

STATS_EXACT_UP_TO = 10_000
"""``stats(exact=False)`` counts runs of a status, checkpoints and values exactly up to this
many (a bounded index or table range); past it, it may estimate them."""
STATS_SAMPLED_PAGES = 300
"""Pages an estimate reads (8 KiB each on PostgreSQL): at 1M runs about 20,000 rows, a few
percent of error for a status of 10,000 runs or more (smaller ones are counted exactly)."""


def _estimated_rows(size: tuple[float, int, int], sampled: int, percent: float) -> int:
    """A table's rows: the density its last VACUUM or ANALYZE measured times its pages now
    (what PostgreSQL's planner assumes), or, never measured, the sample scaled up (noisier:
    the number of pages a sample reads varies, by about 6% at 300)."""
    reltuples, relpages, pages = size
    if reltuples >= 0 and relpages > 0:
        return round(reltuples / relpages * pages)
    return round(sampled * 100 / percent)


_RECORD_BYTES = "LENGTH(fields) + LENGTH(metadata)"
_VALUE_BYTES = "CASE WHEN alias IS NULL THEN size ELSE 0 END"  # an alias holds no bytes



class _Held(NamedTuple):
    """What retention reads of each checkpoint of a run: enough to decide and to count."""

    id: str
    metadata: str
    fields: bytes
    step: int


_SELECT_HELD = (
    f"SELECT {', '.join(_Held._fields)} FROM pitstop_checkpoints WHERE run_id = ? "
    "ORDER BY id DESC"
)


class _Referrer(NamedTuple):
    """The first checkpoint field found referencing a value (named when the value is bad)."""

    checkpoint_id: str
    run_id: str
    field: str


class Maintenance(StoredValues):
    """Deleting, pruning, counting and verifying (a part of ``SqlStore``)."""

    # -- deleting ------------------------------------------------------------------------------

    def delete_run(self, run_id: str) -> PruneReport:
        report = self._tx(lambda tx: self._delete_run(tx, run_id, dry_run=False), write=True)
        if not report.runs:
            raise RunNotFoundError(run_id)
        return report

    def _delete_run(self, tx: Tx, run_id: str, *, dry_run: bool) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        found = tx.one(
            "SELECT run_id FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row, (run_id,)
        )
        if found is None:
            return report
        rows = [_Held(*row) for row in tx.all(_SELECT_HELD, (run_id,))]
        ids = [r.id for r in rows]
        record_bytes = sum(len(r.metadata) + len(r.fields) for r in rows)
        stale = sorted(self._run_values(tx, run_id, rows))
        freed, freed_bytes = self._unshared_values(tx, run_id, stale)
        report.runs.append(run_id)
        report.checkpoints.extend(ids)
        report.blobs = len(freed)
        report.bytes_reclaimed = int(record_bytes) + freed_bytes
        report.effects, report.effect_bytes = (int(n) for n in tx.one(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(result)), 0) FROM pitstop_effects "
            "WHERE run_id = ?", (run_id,)))
        report.inputs, report.input_bytes = (int(n) for n in tx.one(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM pitstop_inputs "
            "WHERE run_id = ?", (run_id,)))
        if dry_run:
            return report
        self._lock_gc(tx)
        for table in ("pitstop_checkpoints", "pitstop_blob_refs", "pitstop_inputs",
                      "pitstop_effects", "pitstop_runs"):
            tx.run(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        # Every value the run let go, not only ``freed``: that was decided before the lock,
        # and a run deleted at the same time may have been what made one look shared.
        self._delete_values(tx, run_id, stale)
        self._disown(tx, run_id, stale)
        self._forget_checkpoints(ids)
        self._heads.drop(run_id)
        return report

    def _run_values(self, tx: Tx, run_id: str, rows: Sequence[_Held]) -> set[bytes]:
        """Every value the checkpoints ``rows`` of a run may hold it to: those it has
        reference rows for, and those their field maps reach (the values it owns among them),
        with the chunks the aliases among them stand in."""
        reached = self._reached(tx, rows)
        reached.update(
            bytes(h)
            for h in tx.column("SELECT hash FROM pitstop_blob_refs WHERE run_id = ?", (run_id,))
        )
        return reached

    def _reached(self, tx: Tx, rows: Sequence[_Held]) -> set[bytes]:
        """The values the field maps of ``rows`` reference, chunks under nodes included, and
        the chunks the aliases among them stand in (what garbage collection follows)."""
        reached = self._value_codec.referenced_by_all(
            (decode_field_map(bytes(r.fields)) for r in rows), partial(self._read_values, tx)
        )
        reached.update(self._alias_targets(tx, list(reached)))
        return reached

    def delete_checkpoints(
        self, run_id: str, checkpoint_ids: Iterable[str], *, dry_run: bool = False
    ) -> PruneReport:
        doomed_ids = set(checkpoint_ids)

        def write(tx: Tx) -> PruneReport:
            report = PruneReport(dry_run=dry_run)
            head_id = tx.one(
                "SELECT head_id FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row,
                (run_id,),
            )
            if head_id is None or not doomed_ids:
                return report
            (head_id,) = head_id
            rows = [_Held(*row) for row in tx.all(_SELECT_HELD, (run_id,))]
            survivors = [r for r in rows if r.id not in doomed_ids]
            self._drop_checkpoints(tx, run_id, rows, {r.id for r in survivors}, report)
            if not dry_run and report.checkpoints and head_id in doomed_ids:
                # The head went: the run continues from its newest remaining checkpoint.
                head = survivors[0] if survivors else None
                tx.run(
                    "UPDATE pitstop_runs SET head_id = ?, step = ? WHERE run_id = ?",
                    (head.id if head else None, head.step if head else None, run_id),
                )
                self._heads.drop(run_id)
            return report

        return self._tx(write, write=True)

    def _drop_checkpoints(
        self, tx: Tx, run_id: str, rows: Sequence[_Held], keep: set[str], report: PruneReport,
        *, packs_later: bool = False,
    ) -> PruneReport:
        """Delete the checkpoints of ``rows`` (the whole run, newest first) not in ``keep``,
        with their effect records and the values nothing else uses. The caller holds the
        run's row lock; the run's head is the caller's business. ``packs_later``: see
        :meth:`_delete_values`."""
        dry_run = report.dry_run
        doomed = [r for r in rows if r.id not in keep]
        if not doomed:
            return report
        remaining = self._reached(tx, [r for r in rows if r.id in keep])
        stale = sorted(self._run_values(tx, run_id, doomed) - remaining)
        freed, freed_bytes = self._unshared_values(tx, run_id, stale)
        ids = [r.id for r in doomed]
        record_bytes = sum(len(r.metadata) + len(r.fields) for r in doomed)
        report.checkpoints.extend(ids)
        report.blobs = len(freed)
        report.bytes_reclaimed = record_bytes + freed_bytes
        for count, size in tx.in_chunks(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(result)), 0) FROM pitstop_effects "
                "WHERE run_id = ? AND checkpoint_id IN ({in})", ids, run_id):
            report.effects += int(count)
            report.effect_bytes += int(size)
        if dry_run:
            return report
        self._lock_gc(tx)
        tx.run_chunks("DELETE FROM pitstop_checkpoints WHERE id IN ({in})", ids)
        tx.run_chunks("DELETE FROM pitstop_effects WHERE run_id = ? AND checkpoint_id IN ({in})",
                      ids, run_id)
        tx.run_chunks("DELETE FROM pitstop_blob_refs WHERE run_id = ? AND hash IN ({in})",
                      stale, run_id)
        # re-checked under the lock, as above
        self._delete_values(tx, run_id, stale, packs_later=packs_later)
        self._disown(tx, run_id, stale)
        tx.run(
            "UPDATE pitstop_runs SET checkpoints = checkpoints - ?, "
            "bytes = CASE WHEN bytes > ? THEN bytes - ? ELSE 0 END WHERE run_id = ?",
            (len(ids), report.bytes_reclaimed, report.bytes_reclaimed, run_id),
        )
        self._forget_checkpoints(ids)
        return report

    def _forget_checkpoints(self, ids: Iterable[str]) -> None:
        for checkpoint_id in ids:
            self._fields.drop(checkpoint_id)

    # -- retention -----------------------------------------------------------------------------

    def prune(
        self,
        policy: RetentionPolicy,
        *,
        run_id: str | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        doomed_runs: list[str] = []
        if policy.finished_age is not None:
            cutoff = time.time() - policy.finished_age
            statuses = [RunStatus(s).value for s in policy.finished_statuses]
            sql = (
                f"SELECT run_id FROM pitstop_runs WHERE status IN ({placeholders(len(statuses))})"
                " AND updated_at < ?"
            )
            params: list[Any] = [*statuses, cutoff]
            if run_id is not None:
                sql += " AND run_id = ?"
                params.append(run_id)
            doomed_runs = self._tx(lambda tx: tx.column(sql, params))
        candidates: list[str] = []
        if policy.prunes_checkpoints:
            if run_id is not None:
                candidates = [run_id]
            else:
                candidates = self._tx(
                    lambda tx: tx.column(
                        "SELECT run_id FROM pitstop_runs WHERE checkpoints > ? ORDER BY run_id",
                        (policy.keep_last or 1,),
                    )
                )
            candidates = [c for c in candidates if c not in set(doomed_runs)]
        total = len(doomed_runs) + len(candidates)
        done = 0
        for rid in doomed_runs:
            report.merge(
                self._tx(partial(self._delete_run, run_id=rid, dry_run=dry_run), write=True)
            )
            done += 1
            if progress:
                progress(done, total)
        for rid in candidates:
            report.merge(
                self._tx(
                    partial(self._prune_run, run_id=rid, policy=policy, dry_run=dry_run),
                    write=True,
                )
            )
            done += 1
            if progress:
                progress(done, total)
        if not dry_run:
            self._sweep_blob_store()
            if report.checkpoints or report.runs:
                self._give_space_back()
        return report

    def _give_space_back(self) -> None:
        """After deleting: return freed space to the file system where the database can do
        that in passing (SQLite's incremental auto-vacuum); a no-op elsewhere."""

    def _prune_run(
        self, tx: Tx, run_id: str, policy: RetentionPolicy, *, dry_run: bool,
        packs_later: bool = False,
    ) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        found = tx.one(
            "SELECT head_id FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row, (run_id,)
        )
        if found is None:
            return report
        (head_id,) = found
        rows = [_Held(*row) for row in tx.all(_SELECT_HELD, (run_id,))]
        keep = {r.id for r in rows[: policy.keep_last]} if policy.keep_last is not None else set()
        if policy.keep_every is not None:
            keep.update(r.id for r in rows if r.step % policy.keep_every == 0)
        if head_id is not None:
            keep.add(head_id)
        if policy.keep_milestones:
            keep.update(
                r.id for r in rows if r.id not in keep and json.loads(r.metadata).get("tags")
            )
        return self._drop_checkpoints(tx, run_id, rows, keep, report, packs_later=packs_later)

    def _sweep_blob_store(self) -> int:
        """Delete blob-store files no row references: what a crash between writing a large
        value and committing its checkpoint leaves behind. Only files older than an hour, so
        a save that wrote its value and is about to commit is never robbed of it."""
        if self.blobs is None:
            return 0
        self.blobs.remove_abandoned(older_than=self.blobs.orphan_age)  # files of killed writes
        orphans = self._orphan_files()
        packs = self._orphan_packs()
        self.blobs.delete(orphans)
        self.blobs.delete_packs(packs)
        return len(orphans) + len(packs)

    def _orphan_files(self) -> list[bytes]:
        """Blob-store files named by a key that no row reads (older than an hour): a crash
        before the commit, or a row since pointed at a pack."""
        assert self.blobs is not None
        candidates = list(self.blobs.keys(older_than=self.blobs.orphan_age))
        if not candidates:
            return []
        known = {
            bytes(h)
            for (h,) in self._tx(
                lambda tx: tx.in_chunks(
                    "SELECT hash FROM pitstop_blobs WHERE pack IS NULL AND hash IN ({in})",
                    candidates,
                )
            )
        }
        return [key for key in candidates if key not in known]

    def _orphan_packs(self) -> list[str]:
        """Packs no row is in (older than an hour): a save killed before its commit, or one
        whose rows all moved to newer copies."""
        assert self.blobs is not None
        candidates = list(self.blobs.packs(older_than=self.blobs.orphan_age))
        if not candidates:
            return []
        known = {
            str(pack)
            for (pack,) in self._tx(
                lambda tx: tx.in_chunks(
                    "SELECT DISTINCT pack FROM pitstop_blobs WHERE pack IN ({in})", candidates
                )
            )
        }
        return [name for name in candidates if name not in known]

    # -- counting and checking -----------------------------------------------------------------

    def stats(self, *, exact: bool = True) -> StoreStats:
        # Asked outside the transaction below: a backend may need a connection of its own to
        # answer, and a pool of one connection must not wait for itself.
        file_bytes = self._file_bytes()
        bounded = not exact and bool(self.dialect.table_sample)
        return self._tx(partial(self._read_stats, bounded=bounded, file_bytes=file_bytes))

    def _read_stats(self, tx: Tx, *, bounded: bool, file_bytes: int | None) -> StoreStats:
        estimated: set[str] = set()
        if bounded:
            if self.dialect.index_ranges:
                tx.run(self.dialect.index_ranges)
            by_status = self._bounded_status_counts(tx, estimated)
            checkpoints, record_bytes = self._bounded_totals(
                tx, "pitstop_checkpoints", _RECORD_BYTES, "checkpoints", estimated)
            blobs, blob_bytes = self._bounded_totals(
                tx, "pitstop_blobs", _VALUE_BYTES, "blobs", estimated)
            effects = self._bounded_totals(
                tx, "pitstop_effects", "LENGTH(result)", "effects", estimated)
            inputs = self._bounded_totals(
                tx, "pitstop_inputs", "LENGTH(payload)", "inputs", estimated)
            refs = self._bounded_totals(tx, "pitstop_blob_refs", "0", "value_refs", estimated)
            attached = self._bounded_totals(
                tx, "pitstop_checkpoints", "COALESCE(LENGTH(writes), 0)", "attached", estimated)
            if estimated & {"checkpoints", "blobs"}:
                estimated.add("bytes")
            if any(name.startswith("runs_by_status.") for name in estimated):
                estimated.add("runs")
        else:
            by_status = {
                status: int(count)
                for status, count in tx.all(
                    "SELECT status, COUNT(*) FROM pitstop_runs GROUP BY status"
                )
            }
            checkpoints, record_bytes = tx.one(
                f"SELECT COUNT(*), COALESCE(SUM({_RECORD_BYTES}), 0) FROM pitstop_checkpoints"
            )
            blobs, blob_bytes = tx.one(
                f"SELECT COUNT(*), COALESCE(SUM({_VALUE_BYTES}), 0) FROM pitstop_blobs"
            )
            effects = tx.one("SELECT COUNT(*), COALESCE(SUM(LENGTH(result)), 0) "
                             "FROM pitstop_effects")
            inputs = tx.one("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) "
                            "FROM pitstop_inputs")
            refs = tx.one("SELECT COUNT(*), 0 FROM pitstop_blob_refs")
            attached = tx.one("SELECT COUNT(writes), COALESCE(SUM(LENGTH(writes)), 0) "
                              "FROM pitstop_checkpoints")
        return StoreStats(
            runs=sum(by_status.values()),
            checkpoints=int(checkpoints),
            blobs=int(blobs),
            bytes=int(record_bytes) + int(blob_bytes),
            runs_by_status=by_status,
            file_bytes=file_bytes,
            estimated=frozenset(estimated),
            effects=int(effects[0]),
            effect_bytes=int(effects[1]),
            inputs=int(inputs[0]),
            input_bytes=int(inputs[1]),
            value_refs=int(refs[0]),
            attached_bytes=int(attached[1]),
        )

    def _bounded_status_counts(self, tx: Tx, estimated: set[str]) -> dict[str, int]:
        """Runs per status, each counted exactly up to STATS_EXACT_UP_TO through the (status,
        created_at) index (a bounded range however many there are); the statuses past that
        get their share of a sample of the table's pages times its estimated rows."""
        # One statement per status, not one over a VALUES list: the planner then sees each
        # status (a common one is found by a scan that stops early, a rare or absent one
        # through the index), where a status from VALUES is planned for an average one and
        # an absent status's range became a scan of the whole table (0.8 s at 1M runs).
        counts: dict[str, int] = {}
        for state in RunStatus:
            n = int(tx.scalar("SELECT COUNT(*) FROM (SELECT 1 FROM pitstop_runs WHERE status = ? "
                              "LIMIT ?) t", (state.value, STATS_EXACT_UP_TO + 1)))
            if n:
                counts[state.value] = n
        over = [status for status, n in counts.items() if n > STATS_EXACT_UP_TO]
        if not over:
            return counts
        sample = self._sample(tx, "pitstop_runs")
        if sample is None:  # a small table: its sample would be all of it
            found = dict(tx.all("SELECT status, COUNT(*) FROM pitstop_runs WHERE status IN "
                                f"({placeholders(len(over))}) GROUP BY status", over))
            return {**counts, **{s: int(found.get(s, 0)) for s in over}}
        clause, percent, size = sample
        seen = {str(s): int(n) for s, n in tx.all(
            f"SELECT status, COUNT(*) FROM pitstop_runs{clause} GROUP BY status", (percent,))}
        total = _estimated_rows(size, sum(seen.values()), percent)
        for status in over:
            # Known to be past the bound, whatever the sample happened to catch.
            share = seen.get(status, 0) / max(sum(seen.values()), 1)
            counts[status] = max(STATS_EXACT_UP_TO + 1, round(total * share))
            estimated.add(f"runs_by_status.{status}")
        return counts

    def _bounded_totals(
        self, tx: Tx, table: str, size: str, name: str, estimated: set[str]
    ) -> tuple[int, int]:
        """A table's rows and the sum of ``size`` over them: exact if it has at most
        STATS_EXACT_UP_TO rows (or is small enough to read whole), else estimated."""
        exact = f"SELECT COUNT(*), COALESCE(SUM({size}), 0) FROM {table}"
        seen = int(tx.scalar(f"SELECT COUNT(*) FROM (SELECT 1 FROM {table} LIMIT ?) t",
                             (STATS_EXACT_UP_TO + 1,)))
        sample = self._sample(tx, table) if seen > STATS_EXACT_UP_TO else None
        if sample is None:
            rows, total = tx.one(exact)
            return int(rows), int(total)
        clause, percent, table_size = sample
        sampled, sampled_total = tx.one(exact + clause, (percent,))
        rows = max(STATS_EXACT_UP_TO + 1, _estimated_rows(table_size, int(sampled), percent))
        estimated.add(name)
        return rows, round(rows * int(sampled_total) / max(int(sampled), 1))

    def _sample(self, tx: Tx, table: str) -> tuple[str, float, tuple[float, int, int]] | None:
        """How to sample about STATS_SAMPLED_PAGES of ``table``'s pages: the clause, its
        percent and the table's size (see Dialect.table_size); None if that is all of it."""
        reltuples, relpages, pages = tx.one(self.dialect.table_size, (table,))
        percent = 100.0 * STATS_SAMPLED_PAGES / max(int(pages), 1)
        if percent >= 100:
            return None
        return self.dialect.table_sample, percent, (float(reltuples), int(relpages), int(pages))

    def verify(self, *, progress: Progress | None = None) -> Problems:
        # The engine's own check first: a damaged index hides rows from the reads below.
        problems = Problems()
        problems.extend(
            Problem("store", self.url, line) for line in self._integrity_problems(problems.notes)
        )
        try:
            self._verify_records(problems, progress)
        except CorruptCheckpointError as exc:
            # A file too damaged to read on (a table's pages or schema): that is the finding,
            # with whatever was found before it; raising would hide both.
            problems.append(Problem("store", self.url, f"verify could not read on: {exc.detail}"))
        return problems

    def _verify_records(self, problems: list[Problem], progress: Progress | None) -> None:
        total = self._tx(
            lambda tx: int(tx.scalar("SELECT COUNT(*) FROM pitstop_checkpoints"))
            + int(tx.scalar("SELECT COUNT(*) FROM pitstop_blobs"))
        )
        done = 0
        referenced: dict[bytes, _Referrer] = {}
        manifests: dict[bytes, _Referrer] = {}
        after = ""
        while True:
            records = [
                CheckpointRecord(*row)
                for row in self._query(
                    SELECT_CHECKPOINT + " WHERE id > ? ORDER BY id LIMIT ?", (after, CHUNK)
                )
            ]
            if not records:
                break
            for record in records:
                try:
                    record.verify()
                    if record.writes is not None:
                        self._verify_attached(record)
                    for name, ref in record.field_map().items():
                        if ref.manifest is not None:
                            manifests.setdefault(
                                ref.manifest, _Referrer(record.id, record.run_id, name)
                            )
                        elif ref.inline is None:
                            referenced.setdefault(
                                ref.hash, _Referrer(record.id, record.run_id, name)
                            )
                        else:  # the record's checksum covers its bytes, not that they decode
                            self._value_codec.decode_value(
                                ref.inline, None, strict=False, checkpoint_id=record.id,
                                run_id=record.run_id, field=name,
                            )
                except Exception as exc:
                    problems.append(
                        Problem("checkpoint", str(record.id), str(exc), run_id=record.run_id)
                    )
            after = records[-1].id
            done += len(records)
            if progress:
                progress(done, total)
        for manifest, referrer in manifests.items():  # every chunk: its nodes read to find them
            ref = FieldRef(b"", 0, None, manifest)
            for key in self._value_codec.chunks_below(ref, self._read_values_alone):
                referenced.setdefault(key, referrer)
        seen: set[bytes] = set()
        after_hash = b""
        while True:
            rows = self._query(
                "SELECT hash, data, location, alias, pack, pack_offset, size FROM pitstop_blobs "
                "WHERE hash > ? ORDER BY hash LIMIT ?",
                (after_hash, 64),
            )
            if not rows:
                break
            for raw_hash, data, location, alias, pack, pack_offset, size in rows:
                slot = slot_of(pack, pack_offset, size)
                h = after_hash = bytes(raw_hash)
                seen.add(h)
                try:
                    if alias is not None:
                        value = self._read_values_alone([h]).get(h)
                        if value is None:
                            raise CorruptCheckpointError(
                                f"alias of chunk {bytes(alias).hex()[2:18]}, which is missing "
                                "(or its chain of aliases loops)"
                            )
                    elif location is None:
                        value = blob_column(data)
                    else:
                        value = self._fetch_external(h, location, slot)
                    if value is None:
                        raise CorruptCheckpointError(
                            self.blobs.why_missing(h, slot) if self.blobs else "value missing"
                        )
                    if type(value) is TextInBlobColumn:
                        raise CorruptCheckpointError(f"value {TEXT_IN_BLOB}")
                    self._value_codec.check_stored(h, value)
                except Exception as exc:
                    owner = referenced.get(h)
                    where = (
                        f" (field {owner.field!r} of checkpoint {owner.checkpoint_id})"
                        if owner else ""
                    )
                    problems.append(
                        Problem("blob", h.hex()[:16], f"{exc}{where}",
                                run_id=owner.run_id if owner else None)
                    )
            done += len(rows)
            if progress:
                progress(done, total)
        for h, owner in referenced.items():
            if h not in seen:
                problems.append(
                    Problem(
                        "checkpoint",
                        owner.checkpoint_id,
                        f"field {owner.field!r} refers to "
                        + (f"chunk {h.hex()[2:18]}" if is_chunk_key(h) else f"value {h.hex()[:16]}")
                        + " which is missing",
                        run_id=owner.run_id,
                    )
                )
        kinds: tuple[tuple[Literal["input", "effect"], str], ...] = (
            ("input", "SELECT run_id, id, payload, hash FROM pitstop_inputs"),
            ("effect", "SELECT run_id, key, result, hash FROM pitstop_effects"),
        )
        for kind, query in kinds:
            for rid, ident, data, h in self._query(query):
                try:
                    self._value_codec.decode_value(bytes(data), bytes(h), strict=False)
                except Exception as exc:
                    problems.append(Problem(kind, str(ident), str(exc), run_id=rid))
        problems.extend(self._run_problems())
        if self.blobs is not None:
            orphans = [("file", key.hex()) for key in self._orphan_files()]
            orphans += [("pack", name) for name in self._orphan_packs()]
            problems.extend(
                Problem("blob", name[:16], f"{what} in {self.blobs.url} that no record "
                        "references (left by a crash; `pitstop prune` removes it)")
                for what, name in orphans
            )

    def _verify_attached(self, record: CheckpointRecord) -> None:
        """Each record attached to the checkpoint: its frame's checksum, its value's hash."""
        assert record.writes is not None
        for key, result, hash_, _ in read_frames(
            bytes(record.writes), run_id=record.run_id, checkpoint_id=record.id
        ):
            self._value_codec.decode_value(
                result, hash_, strict=False, checkpoint_id=record.id, run_id=record.run_id,
                field=f"attached:{key}",
            )

    def _run_problems(self) -> list[Problem]:
        """Damaged run rows (no checksum covers them: they change on every step), and heads
        that point nowhere or at another run's checkpoint."""
        problems: list[Problem] = []
        after = ""
        while True:
            rows = self._query(SELECT_RUN + " WHERE run_id > ? ORDER BY run_id LIMIT ?",
                               (after, CHUNK))
            if not rows:
                break
            for row in rows:
                # Every field by type and range (SQLite keeps whatever was written), not
                # only what would stop the row from loading.
                problem = run_problem(RunRow(*row))
                if problem is None:
                    try:
                        RunRow(*row).to_run()
                    except CorruptCheckpointError as exc:
                        problem = exc.detail
                else:
                    problem = f"damaged run row: {problem}"
                if problem is not None:
                    run_id = str(row[RUN_ID])
                    problems.append(Problem("run", run_id, problem, run_id=run_id))
            after = rows[-1][RUN_ID]
        for run_id, head, owner in self._query(
            "SELECT r.run_id, r.head_id, c.run_id FROM pitstop_runs r "
            "LEFT JOIN pitstop_checkpoints c ON c.id = r.head_id "
            "WHERE r.head_id IS NOT NULL AND (c.id IS NULL OR c.run_id <> r.run_id)"
        ):
            message = (
                f"head checkpoint {head} is missing" if owner is None
                else f"head checkpoint {head} belongs to run {owner!r}, not to this run"
            )
            problems.append(Problem("run", run_id, message, run_id=run_id))
        return problems


__all__ = ["Maintenance"]
