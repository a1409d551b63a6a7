"""Results cached across runs: the ``pitstop_cache`` table (a part of ``SqlStore``).

A cached result is a mapping of names to values (a step's updated fields, or a
``ctx.cached`` call's result under ``value``), stored like a checkpoint's state: a field map
in the cache row, its values content-addressed in ``pitstop_blobs`` (deduplicated with the
checkpoints' values, chunked, verified on read, never pickled unless the store's serializer
is pickle). The values are referenced by the pseudo-run :func:`reference_of` (a row of
``pitstop_blob_refs`` each), so pruning and deleting runs never take them away, and
clearing an entry releases them exactly like deleting a run does.

**Single flight.** A key being computed has a row without ``fields``: the claim, held by an
owner until ``claim_expires`` (the computing process renews it). Others see the claim and
wait; a claim whose lease lapsed (its owner died) is taken over by the next claimant with a
conditional UPDATE, so exactly one process wins it. A failed computation deletes its claim:
nothing is cached and the next claimant computes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from ...errors import CorruptCheckpointError, SerializationError
from ..contract.base import Problem, Problems, Progress, PruneReport, RetentionPolicy, StoreStats
from ..encoding.records import FieldMap, decode_field_map, encode_field_map, stored_hashes
from .backend import Tx
from .maintenance import Maintenance
from .schema import CACHE, CacheRow

REFERENCE_PREFIX = "pitstop-cache:"

log = logging.getLogger("pitstop.store")

_SELECT = f"SELECT {CACHE.column_list()} FROM pitstop_cache"
_LIVE = "fields IS NOT NULL AND (expires_at IS NULL OR expires_at > ?)"
# One string, made once: the backend's statement cache finds the prepared lookup by it.
_GET = f"{_SELECT} WHERE key = ? AND {_LIVE}"
_EXPIRED = "expires_at IS NOT NULL AND expires_at <= ?"


def reference_of(key: str) -> str:
    """The name a cache entry's values are referenced by in ``pitstop_blob_refs``."""
    return REFERENCE_PREFIX + key


def _checksum(fields: bytes) -> str:
    return hashlib.sha256(fields).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached result, as listed by :meth:`Store.cache_entries` (values not read)."""

    key: str
    name: str
    """The step (or ``ctx.cached`` name) it was computed for."""
    run_id: str | None
    """The run that computed it."""
    checkpoint_id: str | None
    size: int
    """Bytes of its field map (its values are shared, content-addressed)."""
    created_at: float
    expires_at: float | None
    computing: bool
    """True while a worker holds the claim and computes it (no result yet)."""

    @classmethod
    def of(cls, row: CacheRow) -> CacheEntry:
        return cls(
            key=row.key, name=row.name, run_id=row.run_id, checkpoint_id=row.checkpoint_id,
            size=int(row.size), created_at=float(row.created_at),
            expires_at=None if row.expires_at is None else float(row.expires_at),
            computing=row.fields is None,
        )


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A cached result found: its values, and the entry they came from."""

    values: dict[str, Any]
    entry: CacheEntry


ClaimOutcome = Literal["claimed", "busy"]


class _LostRace(Exception):
    """A concurrent transaction stored the key first (the write is rolled back)."""


class ResultCache(Maintenance):
    """Looking up, claiming, storing and clearing cached results."""

    # -- reading -----------------------------------------------------------------------------

    def cache_get(self, key: str) -> CacheHit | None:
        """The live cached result of ``key`` (None: none, still computing, or expired)."""
        # The usual entry holds its values inline: one autocommitted statement on the
        # primary key. Values stored apart are read with the row in one transaction.
        now = time.time()
        first = self._autocommit_read(_GET, (key, now))
        if first is None:
            return None
        row = CacheRow(*first)
        try:
            fields = self._cache_field_map(row)
            values: dict[bytes, Any] = {}
            if stored_hashes(fields):
                found = self._tx(lambda tx: self._read_entry(tx, key, now))
                if found is None:
                    return None
                row, fields, values = found
            return CacheHit(self._decode_cached(row, fields, values), CacheEntry.of(row))
        except (CorruptCheckpointError, SerializationError) as exc:
            # A damaged entry is a miss, never a crash of the step: it is expired (so the
            # next claim takes it over and the result is computed and stored again), and
            # `pitstop verify` reports it until then.
            log.warning("cache entry %r is damaged, treated as a miss: %s", key, exc)
            self._tx(lambda tx: tx.run(
                "UPDATE pitstop_cache SET expires_at = ? WHERE key = ? AND checksum IS ?",
                (now, key, row.checksum),
            ), write=True)
            return None

    def _read_entry(
        self, tx: Tx, key: str, now: float
    ) -> tuple[CacheRow, FieldMap, dict[bytes, Any]] | None:
        # One statement on the primary key for the usual entry (values small enough to be
        # inline in its field map); the value table only for the values stored apart.
        found = tx.one(_GET, (key, now))
        if found is None:
            return None
        row = CacheRow(*found)
        fields = self._cache_field_map(row)
        # A missing value stops the reading; the decode names it.
        return row, fields, self._entry_values(tx, fields=fields)

    def _cache_field_map(self, row: CacheRow) -> FieldMap:
        data = bytes(row.fields or b"")
        if row.checksum != _checksum(data):
            raise CorruptCheckpointError(
                f"cache entry {row.key!r}: checksum mismatch (truncated or altered)",
                run_id=row.run_id,
            )
        return decode_field_map(data)

    def _decode_cached(
        self, row: CacheRow, fields: FieldMap, values: Mapping[bytes, Any]
    ) -> dict[str, Any]:
        codec = self._value_codec
        run_id = row.run_id
        where = f"cache[{row.key!r}]."  # (once per entry, not once per value)
        out: dict[str, Any] = {}
        for name, ref in fields.items():
            if ref.manifest is not None:
                out[name] = codec.decode_chunked(
                    ref.manifest, values, run_id=run_id, field=where + name
                )
                continue
            inline = ref.inline
            if inline is not None:  # the usual value: in the field map, its checksum checked
                out[name] = codec.decode_value(inline, None, run_id=run_id, field=where + name)
                continue
            data = values.get(ref.hash)
            out[name] = codec.decode_value(
                data if data is None or isinstance(data, bytes) else bytes(data), ref.hash,
                run_id=run_id,
                field=where + name,
            )
        return out

    def verify(self, *, progress: Progress | None = None) -> Problems:
        problems = super().verify(progress=progress)
        problems.extend(self._verify_cache())
        return problems

    def _verify_cache(self) -> list[Problem]:
        """Every cached result read and decoded as a hit would (claims have nothing to
        check): a bad checksum, an undecodable or missing value is a ``cache`` problem
        naming the entry and the run that computed it."""
        found: list[Problem] = []
        after = ""
        while True:
            rows = [CacheRow(*row) for row in self._query(
                f"{_SELECT} WHERE key > ? AND fields IS NOT NULL ORDER BY key LIMIT ?",
                (after, 256),
            )]
            if not rows:
                return found
            for row in rows:
                try:
                    fields = self._cache_field_map(row)
                    values = self._tx(partial(self._entry_values, fields=fields))
                    self._decode_cached(row, fields, values)
                except Exception as exc:
                    found.append(Problem("cache", row.key, str(exc), run_id=row.run_id))
            after = rows[-1].key

    def _entry_values(self, tx: Tx, *, fields: FieldMap) -> dict[bytes, Any]:
        hashes = stored_hashes(fields)
        if not hashes:
            return {}
        codec = self._value_codec
        values = self._read_values_deferred(tx, list(hashes))
        while missing := codec.missing_below(fields, values):
            more = self._read_values_deferred(tx, missing)
            if not more:
                break
            values.update(more)
        return values

    def cache_entries(
        self, *, name: str | None = None, limit: int | None = None
    ) -> list[CacheEntry]:
        """Cache rows, newest first (only ``name``'s), without reading their values."""
        sql = _SELECT
        params: list[Any] = []
        if name is not None:
            sql += " WHERE name = ?"
            params.append(name)
        sql += " ORDER BY created_at DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [CacheEntry.of(CacheRow(*row)) for row in self._query(sql, params)]

    # -- claiming ----------------------------------------------------------------------------

    def cache_claim(self, key: str, name: str, owner: str, *, lease: float) -> ClaimOutcome:
        """Claim the computation of ``key`` for ``owner`` for ``lease`` seconds: ``claimed``
        (compute it, then :meth:`cache_put` or :meth:`cache_abandon`), or ``busy``: another
        owner computes it, or a live result appeared (look it up again)."""

        def write(tx: Tx) -> ClaimOutcome:
            now = time.time()
            inserted = tx.run(
                "INSERT INTO pitstop_cache (key, name, created_at, claim_owner, claim_expires) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, name, now, owner, now + lease),
            ).rowcount
            if inserted:
                return "claimed"
            # A row is there: take it over if it is an expired result, or a claim that is
            # ours or whose owner stopped renewing it. The WHERE decides under the row lock.
            stale = tx.all(
                "SELECT fields IS NOT NULL AS has_result FROM pitstop_cache WHERE key = ? AND ("
                "(fields IS NOT NULL AND expires_at IS NOT NULL AND expires_at <= ?) OR "
                "(fields IS NULL AND (claim_owner = ? OR claim_expires <= ?)))"
                + self.dialect.lock_row,
                (key, now, owner, now),
            )
            if not stale:
                return "busy"
            ((has_result,),) = stale  # the key is the primary key: one row
            if has_result:
                self._release_entry_values(tx, key)
            taken = tx.run(
                "UPDATE pitstop_cache SET name = ?, run_id = NULL, checkpoint_id = NULL, "
                "fields = NULL, checksum = NULL, size = 0, created_at = ?, expires_at = NULL, "
                "claim_owner = ?, claim_expires = ? WHERE key = ? AND ("
                "(fields IS NOT NULL AND expires_at IS NOT NULL AND expires_at <= ?) OR "
                "(fields IS NULL AND (claim_owner = ? OR claim_expires <= ?)))",
                (name, now, owner, now + lease, key, now, owner, now),
            ).rowcount
            return "claimed" if taken else "busy"

        return self._tx(write, write=True)

    def cache_renew(self, key: str, owner: str, *, lease: float) -> bool:
        """Extend ``owner``'s claim of ``key``; False if it no longer holds it."""
        return bool(self._tx(lambda tx: tx.run(
            "UPDATE pitstop_cache SET claim_expires = ? "
            "WHERE key = ? AND claim_owner = ? AND fields IS NULL",
            (time.time() + lease, key, owner),
        ).rowcount, write=True))

    def cache_abandon(self, key: str, owner: str) -> None:
        """Give up ``owner``'s claim of ``key`` (its computation failed): nothing is cached."""
        self._tx(lambda tx: tx.run(
            "DELETE FROM pitstop_cache WHERE key = ? AND claim_owner = ? AND fields IS NULL",
            (key, owner),
        ), write=True)

    # -- storing -----------------------------------------------------------------------------

    def cache_put(
        self,
        key: str,
        name: str,
        values: Mapping[str, Any],
        *,
        owner: str | None = None,
        ttl: float | None = None,
        run_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> CacheEntry:
        """Store ``values`` as the result of ``key`` (replacing the claim of ``owner``, or an
        expired or absent entry; a live result someone else stored first is kept)."""
        reference = reference_of(key)
        try:
            fields, new, _, aliases = self._value_codec.encode_state(reference, values, None, None)
        except SerializationError as exc:
            raise exc.located(run_id=run_id, path=f"cache[{name!r}]" + (exc.path or "")) from None
        if aliases:  # a fresh encoding (no parent) extends no chunk; never reached
            raise AssertionError("a cache entry's values made chunk aliases")
        data = encode_field_map(fields)
        packed = self._externalize(new.values()) if new else {}

        def write(tx: Tx) -> CacheRow:
            now = time.time()
            row = CacheRow(
                key, name, run_id, checkpoint_id, data, _checksum(data), len(data), now,
                None if ttl is None else now + ttl, None, None,
            )
            current = tx.one(
                "SELECT fields IS NOT NULL AND (expires_at IS NULL OR expires_at > ?), "
                "fields IS NOT NULL FROM pitstop_cache WHERE key = ?" + self.dialect.lock_row,
                (now, key),
            )
            if current is not None and current[0]:
                return row  # a live result someone stored first stands; ours is dropped
            if current is not None and current[1]:
                self._release_entry_values(tx, key)  # an expired result is replaced
            self._lock_values(tx)
            self._insert_values(tx, new, now, packed)
            if current is None:
                inserted = tx.run(
                    CACHE.insert() + " ON CONFLICT (key) DO NOTHING",
                    (row.key, row.name, row.run_id, row.checkpoint_id, row.fields, row.checksum,
                     row.size, row.created_at, row.expires_at, None, None),
                ).rowcount
                if not inserted:  # (PostgreSQL: a concurrent put of the key won; theirs stands)
                    raise _LostRace
            else:
                # Whoever holds the claim now (ours, or one taken over after our lease
                # lapsed): the result is stored, and a later put keeps it.
                tx.run(
                    "UPDATE pitstop_cache SET name = ?, run_id = ?, checkpoint_id = ?, "
                    "fields = ?, checksum = ?, size = ?, created_at = ?, expires_at = ?, "
                    "claim_owner = NULL, claim_expires = NULL WHERE key = ?",
                    (name, run_id, checkpoint_id, data, row.checksum, row.size, now,
                     row.expires_at, key),
                )
            reached = self._value_codec.referenced(fields, partial(self._read_values, tx))
            tx.many(
                "INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                "ON CONFLICT (run_id, hash) DO NOTHING",
                [(reference, h) for h in sorted(reached)],
            )
            return row

        try:
            return CacheEntry.of(self._tx(write, write=True))
        except _LostRace:
            found = self.cache_get(key)
            if found is None:
                raise
            return found.entry

    # -- clearing ----------------------------------------------------------------------------

    def _release_entry_values(self, tx: Tx, key: str) -> int:
        """Drop the references of ``key``'s values, deleting those nothing else holds; the
        bytes freed."""
        reference = reference_of(key)
        held = [
            bytes(h)
            for h in tx.column("SELECT hash FROM pitstop_blob_refs WHERE run_id = ?",
                               (reference,))
        ]
        if not held:
            return 0
        _, size = self._unshared_values(tx, reference, held)
        self._lock_gc(tx)
        tx.run("DELETE FROM pitstop_blob_refs WHERE run_id = ?", (reference,))
        # All it held, re-checked under the lock: what ``_unshared_values`` found was decided
        # before it, and a run deleted meanwhile may have been what made a value look shared.
        self._delete_values(tx, reference, held)
        return size

    def cache_clear(
        self,
        *,
        name: str | None = None,
        older_than: float | None = None,
        expired_only: bool = False,
        key: str | None = None,
    ) -> int:
        """Delete cached results (all, or ``name``'s, those created more than ``older_than``
        seconds ago, only expired ones, one ``key``) with the values only they held; the
        number of entries deleted. Claims being computed are left alone."""
        now = time.time()
        where = ["fields IS NOT NULL"]
        params: list[Any] = []
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if key is not None:
            where.append("key = ?")
            params.append(key)
        if older_than is not None:
            where.append("created_at < ?")
            params.append(now - older_than)
        if expired_only:
            where.append(_EXPIRED)
            params.append(now)
        return self._clear_where(where, params)

    def _clear_where(self, where: list[str], params: list[Any]) -> int:
        """Delete the cached results the conditions select; how many."""
        keys = self._tx(lambda tx: tx.column(
            "SELECT key FROM pitstop_cache WHERE " + " AND ".join(where), params))
        deleted = 0
        for found in keys:
            # One transaction per entry: a large cache never holds the GC lock for long.
            def drop(tx: Tx, found: str = found) -> int:
                gone = tx.run(
                    "DELETE FROM pitstop_cache WHERE key = ? AND fields IS NOT NULL", (found,)
                ).rowcount
                if gone:
                    self._release_entry_values(tx, found)
                return int(gone)

            deleted += self._tx(drop, write=True)
        if deleted:
            self._sweep_blob_store()
        return deleted

    # -- maintenance counts the cache --------------------------------------------------------

    def prune(
        self,
        policy: RetentionPolicy,
        *,
        run_id: str | None = None,
        dry_run: bool = False,
        progress: Any = None,
    ) -> PruneReport:
        """Retention, and expired cache entries go too: all of them, or with ``run_id`` those
        that run computed (a live entry stays: other runs are served from it, whoever
        computed it)."""
        report = super().prune(policy, run_id=run_id, dry_run=dry_run, progress=progress)
        where = ["fields IS NOT NULL", _EXPIRED]
        params: list[Any] = [time.time()]
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if dry_run:
            report.cache_entries = int(self._tx(lambda tx: tx.scalar(
                "SELECT COUNT(*) FROM pitstop_cache WHERE " + " AND ".join(where), params)))
        else:
            report.cache_entries = self._clear_where(where, params)
        return report

    def stats(self, *, exact: bool = True) -> StoreStats:
        counted = super().stats(exact=exact)
        entries = self._tx(lambda tx: tx.scalar(
            "SELECT COUNT(*) FROM pitstop_cache WHERE fields IS NOT NULL"))
        return replace(counted, cache_entries=int(entries))


__all__ = ["REFERENCE_PREFIX", "CacheEntry", "CacheHit", "ResultCache", "reference_of"]
