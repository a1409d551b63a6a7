"""Content-addressed values: the ``pitstop_blobs`` table, its references, the blob store.

Every field value bigger than a few bytes is stored once under its content hash, whichever
run or checkpoint it belongs to; ``pitstop_blob_refs`` records which runs reference which
values, and a value is deleted only when no run does. Values of at least ``blob_threshold``
bytes go to a :class:`~pitstop.store.blobs.BlobStore` (files) when one is configured: their
row then has a ``location`` and no data. Saves, loads, retention and import all store,
read and release values through the methods here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..errors import StoreError
from .backend import SqlBackend, Tx
from .records import NewBlob

# Values bigger than this are looked up before being sent, so an existing one is not shipped
# to the database again just to be discarded by ON CONFLICT.
_PROBE_BEFORE_SEND = 64 * 1024


class StoredValues(SqlBackend):
    """Writing, reading and deleting content-addressed values (a part of ``SqlStore``)."""

    def _external(self, blob: NewBlob) -> bool:
        """Whether ``blob`` goes to the blob store rather than the table."""
        return self.blobs is not None and blob.size >= self.blob_threshold

    def _externalize(self, blobs: Iterable[NewBlob]) -> None:
        """Write large values to the blob store, synced, before any row references them."""
        if self.blobs is not None:
            for blob in blobs:
                if self._external(blob):
                    self.blobs.put(blob.hash, blob.data)

    def _insert_values(self, tx: Tx, new: Mapping[bytes, NewBlob], now: float) -> None:
        """Insert the rows of new values (existing ones are kept: same hash, same bytes)."""
        if not new:
            return
        blobs = list(new.values())
        big = [b.hash for b in blobs if b.size > _PROBE_BEFORE_SEND]
        if big:
            present = {
                bytes(h)
                for (h,) in tx.in_chunks(
                    "SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", big
                )
            }
            blobs = [b for b in blobs if b.hash not in present]
        if self.blobs is None:
            tx.many(
                "INSERT INTO pitstop_blobs (hash, data, size, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (hash) DO NOTHING",
                [(b.hash, b.data, b.size, now) for b in blobs],
            )
            return
        location = self.blobs.url
        tx.many(
            "INSERT INTO pitstop_blobs (hash, data, size, created_at, location) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING",
            [
                (b.hash, b"", b.size, now, location)
                if self._external(b)
                else (b.hash, b.data, b.size, now, None)
                for b in blobs
            ],
        )

    def _read_values(self, tx: Tx, hashes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Stored values by hash, from the table or the blob store (absent ones left out)."""
        out: dict[bytes, bytes] = {}
        for h, data, location in tx.in_chunks(
            "SELECT hash, data, location FROM pitstop_blobs WHERE hash IN ({in})", hashes
        ):
            key = bytes(h)
            if location is None:
                out[key] = bytes(data)
            else:
                value = self._fetch_external(key, location)
                if value is not None:
                    out[key] = value
        return out

    def _fetch_external(self, key: bytes, location: str) -> bytes | None:
        """A value kept in the blob store (None: the file is missing)."""
        if self.blobs is None:
            raise StoreError(
                f"{self.url}: value {key.hex()[:16]} is kept in the blob store {location}; "
                "open this store with blobs=... to read it"
            )
        return self.blobs.get(key)

    def _unshared_values(
        self, tx: Tx, run_id: str, hashes: Sequence[bytes]
    ) -> tuple[list[bytes], int]:
        """Which of ``hashes`` no other run references, and their stored size."""
        if not hashes:
            return [], 0
        shared = {
            bytes(h)
            for (h,) in tx.in_chunks(
                "SELECT DISTINCT hash FROM pitstop_blob_refs WHERE run_id <> ? AND hash IN ({in})",
                hashes,
                run_id,
            )
        }
        freed = [h for h in hashes if h not in shared]
        size = sum(
            int(value_size)
            for (value_size,) in tx.in_chunks(
                "SELECT size FROM pitstop_blobs WHERE hash IN ({in})", freed
            )
        )
        return freed, size

    def _delete_values(self, tx: Tx, hashes: Sequence[bytes]) -> None:
        """Delete the values of ``hashes`` that nothing references any more (the caller holds
        :meth:`_lock_gc`), their blob-store files once the transaction has committed."""
        unreferenced = (
            "hash IN ({in}) AND NOT EXISTS "
            "(SELECT 1 FROM pitstop_blob_refs r WHERE r.hash = pitstop_blobs.hash)"
        )
        if self.blobs is not None:
            files = [
                bytes(h)
                for (h,) in tx.in_chunks(
                    f"SELECT hash FROM pitstop_blobs WHERE location IS NOT NULL AND {unreferenced}",
                    hashes,
                )
            ]
            if files:
                blobs = self.blobs
                tx.on_commit(lambda: blobs.delete(files))  # only once no row points at them
        # Re-checked under the GC lock: a concurrent writer may have started sharing one.
        tx.run_chunks("DELETE FROM pitstop_blobs WHERE " + unreferenced, hashes)


__all__ = ["StoredValues"]
