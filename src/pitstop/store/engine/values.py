"""Content-addressed values: the ``pitstop_blobs`` table, its references, the blob store.

Every field value bigger than a few bytes is stored once under its content hash, whichever
run or checkpoint it belongs to. A value's row names the run that stored it (its *owner*,
``run_id``: schema version 10), which references it with no other row: its checkpoints'
field maps say which values they use, and garbage collection reads them. Every other run
using the value (a fork, a run that saved the same bytes, an import, a row from before
version 10 that has no owner) has a row in ``pitstop_blob_refs``. A value is deleted only
when no run references it either way. Values of at least ``blob_threshold``
bytes go to a :class:`~pitstop.store.encoding.blobs.BlobStore` (files) when one is configured: their
row then has a ``location`` and no data. Saves, loads, retention and import all store,
read and release values through the methods here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from ...errors import StoreError
from ..contract.base import Durability
from ..encoding.blobs import Deferred, Slot
from ..encoding.records import Alias, FieldMap, NewBlob, Stored, blob_column, is_chunk_key
from .backend import CHUNK, SqlBackend, Tx, placeholders

# Values bigger than this are looked up before being sent, so an existing one is not shipped
# to the database again just to be discarded by ON CONFLICT.
_PROBE_BEFORE_SEND = 64 * 1024


def _body(stored: bytes) -> bytes | None:
    """A stored value's raw bytes (None: not a frame pitstop reads)."""
    from ...serde import unframe  # (not at import: see pitstop.store.encoding.valuecodec)

    try:
        return unframe(stored)[1]
    except ValueError:
        return None


_INSERT_ROWS = (
    "INSERT INTO pitstop_blobs (hash, data, size, created_at, run_id) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (hash) DO NOTHING"
)
"""Value rows kept in the table, owned by the run saving them, or by none (existing ones are
kept: same hash, same bytes, and their owner)."""
_INSERT_UNOWNED_ROWS = (
    "INSERT INTO pitstop_blobs (hash, data, size, created_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (hash) DO NOTHING"
)
"""Value rows of no run (an import, a batch of child runs, a schema before owners)."""
_SELECT_PLAIN = (
    "WITH k(h) AS (VALUES {keys}) SELECT b.hash, CASE WHEN b.location IS NULL AND b.alias "
    "IS NULL THEN b.data END FROM k CROSS JOIN pitstop_blobs b ON b.hash = k.h"
)
"""The rows of some keys (those present), ``data`` None unless a plain row: in the table,
not an alias (see :meth:`StoredValues._read_values_deferred`)."""


class StoredValues(SqlBackend):
    """Writing, reading and deleting content-addressed values (a part of ``SqlStore``)."""

    def _external(self, blob: NewBlob) -> bool:
        """Whether ``blob`` goes to the blob store rather than the table."""
        return self.blobs is not None and blob.size >= self.blob_threshold

    def _externalize(
        self, blobs: Iterable[NewBlob], durability: Durability | None = None
    ) -> dict[bytes, Slot]:
        """Write large values to the blob store before any row references them: synced with
        durability ``full``; with ``normal`` (the store's default, or this save's) complete
        and renamed into place but left to the OS to write back, as the commit that follows
        is (see :mod:`pitstop.store.encoding.blobs`). Returns where the packed ones went, for
        :meth:`_insert_values` to record."""
        if self.blobs is None:
            return {}
        level = durability or self.durability
        return self.blobs.put_many(
            [(b.hash, b.pieces) for b in blobs if self._external(b)], sync=level == "full"
        )

    def _insert_values(
        self, tx: Tx, new: Mapping[bytes, NewBlob], now: float,
        packed: Mapping[bytes, Slot] | None = None, owner: str | None = None,
    ) -> None:
        """Insert the rows of new values, owned by the run ``owner`` (None: by no run, every
        run using them has a reference row); existing ones are kept: same hash, same bytes.

        A value just packed (``packed``: :meth:`_externalize`'s answer) that has a row in the
        blob store already is pointed at its new copy: the bytes just written are known
        whole, where the old copy may be one that power loss left short (what the row of a
        file named by its key gets by that file being rewritten in place)."""
        if not new:
            return
        blobs = list(new.values())
        packed = packed or {}
        big = [b.hash for b in blobs if b.size > _PROBE_BEFORE_SEND]
        if big:
            present = {
                bytes(h)
                for (h,) in tx.in_chunks(
                    "SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", big
                )
            }
            moved = [(h, packed[h]) for h in present if h in packed]
            if moved and self.blobs is not None:
                tx.many(
                    "UPDATE pitstop_blobs SET location = ?, pack = ?, pack_offset = ?, "
                    "size = ? WHERE hash = ? AND location IS NOT NULL",
                    [(self.blobs.url, slot.pack, slot.offset, slot.size, h) for h, slot in moved],
                )
            blobs = [b for b in blobs if b.hash not in present]
        if self.blobs is None or not any(self._external(b) for b in blobs):
            if owner is None:
                tx.many(_INSERT_UNOWNED_ROWS, [(b.hash, b.stored, b.size, now) for b in blobs])
            else:
                tx.many(_INSERT_ROWS, [(b.hash, b.stored, b.size, now, owner) for b in blobs])
            return
        location = self.blobs.url
        rows: list[tuple[object, ...]] = []
        for b in blobs:
            if not self._external(b):
                rows.append((b.hash, b.stored, b.size, now, None, None, None, owner))
            elif (slot := packed.get(b.hash)) is not None:
                rows.append((b.hash, b"", b.size, now, location, slot.pack, slot.offset, owner))
            else:
                rows.append((b.hash, b"", b.size, now, location, None, None, owner))
        columns = "hash, data, size, created_at, location, pack, pack_offset"
        if owner is None:
            rows = [row[:-1] for row in rows]
        else:
            columns += ", run_id"
        tx.many(
            f"INSERT INTO pitstop_blobs ({columns}) VALUES ({placeholders(len(rows[0]))}) "
            "ON CONFLICT (hash) DO UPDATE SET "
            "location = excluded.location, pack = excluded.pack, "
            "pack_offset = excluded.pack_offset, size = excluded.size "
            "WHERE pitstop_blobs.location IS NOT NULL AND excluded.pack IS NOT NULL",
            rows,
        )

    def _inserts_counted(
        self, new: Mapping[bytes, NewBlob], packed: Mapping[bytes, Slot] | None
    ) -> bool:
        """Whether ``new`` may be inserted by :meth:`_insert_counted`: on a backend whose
        inserts report how many rows they added (SQLite), values bound for the table only,
        none large enough to be probed for first."""
        return self.rewrites_in_place and not packed and all(
            b.size <= _PROBE_BEFORE_SEND and not self._external(b) for b in new.values()
        )

    def _insert_counted(
        self, tx: Tx, new: Mapping[bytes, NewBlob], now: float, owner: str | None
    ) -> int:
        """Insert the rows of ``new``, owned by the run ``owner`` (existing ones are kept),
        and say how many were added:
        fewer than ``len(new)`` means a key was stored already, which the caller then checks
        for a collision (:meth:`_check_chunk_collisions`, in the same transaction)."""
        if not new:
            return 0
        # The driver's own cursor, for its count (SQLite's sums executemany's rows). Not
        # Tx.many: reading rowcount there would make PostgreSQL's pipeline wait.
        if owner is None:
            cursor = tx.cur.executemany(
                tx.dialect.for_driver(_INSERT_UNOWNED_ROWS),
                [(b.hash, b.stored, b.size, now) for b in new.values()],
            )
        else:
            cursor = tx.cur.executemany(
                tx.dialect.for_driver(_INSERT_ROWS),
                [(b.hash, b.stored, b.size, now, owner) for b in new.values()],
            )
        return int(cursor.rowcount)

    def _reference_unowned(self, tx: Tx, run_id: str, keys: Sequence[bytes]) -> None:
        """Reference rows of the run ``run_id`` for those of ``keys`` whose row it does not
        own. Run after the save's inserts, in its transaction: a row another transaction
        inserted first (its insert made this one's wait) has that one's owner. One
        conditional INSERT per key, nothing read back (on PostgreSQL a fetch right after the
        pipelined inserts could be handed an INSERT's result)."""
        tx.many(
            "INSERT INTO pitstop_blob_refs (run_id, hash) SELECT ?, ? WHERE NOT EXISTS "
            "(SELECT 1 FROM pitstop_blobs WHERE hash = ? AND run_id = ?) "
            "ON CONFLICT (run_id, hash) DO NOTHING",
            [(run_id, h, h, run_id) for h in keys],
        )

    def _check_chunk_collisions(
        self, tx: Tx, run_id: str, new: Mapping[bytes, NewBlob], fields: FieldMap
    ) -> set[bytes]:
        """Refuse new chunks whose key a stored chunk with other bytes already has.

        Chunk keys are xxh3-128, fast but not made to resist a crafted collision: a value
        built to hash like another run's chunk must not be stored as that chunk (a load
        would then return the other bytes). A new chunk's key is rarely present, so this is
        one indexed look-up of the new keys; the bytes are compared only for those found.
        """
        keys = [k for k in new if is_chunk_key(k)]
        if not keys:
            return set()
        present = [
            bytes(h)
            for (h,) in tx.in_chunks("SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", keys)
        ]
        if not present:
            return set()
        stored = self._read_values(tx, present)
        for key in present:
            data = stored.get(key)
            sent = new[key].stored
            if opened := self._row_opener():  # (read rows are opened: so is this one)
                sent = opened(key, sent)
            # (The same bytes may be stored compressed, or by another zstd, or not.)
            if data is not None and data != sent and _body(data) != _body(sent):
                field = next(
                    (name for name, ref in fields.items() if ref.manifest is not None
                     and key in self._value_codec.chunk_keys_of(ref)),
                    None,
                )
                where = f", field {field!r}" if field else ""
                raise StoreError(
                    f"{self.url}: run {run_id!r}{where}: a new chunk has the key "
                    f"{key.hex()[2:18]} of a stored chunk with other bytes (an xxh3-128 "
                    "collision, most likely a value built to cause one); nothing was written"
                )
        return set(present)

    def _row_opener(self) -> Callable[[bytes, bytes], bytes] | None:
        """What opens a sealed row of the table (a store opened with ``encryption=``; see
        :mod:`pitstop.store.encoding.sealing`), or None."""
        if getattr(self.blobs, "encryption", None) is None:
            return None
        return self._value_codec.open_row

    def _read_values_deferred(self, tx: Tx, hashes: Sequence[bytes]) -> dict[bytes, Stored]:
        """:meth:`_read_values`, with values in the blob store left unread (:class:`Deferred`,
        the files read after the transaction): a load reads an array's chunks straight into
        its buffer. A missing file is found (and named) then."""
        if self.dialect.array_in:
            return self._read_rows(tx, hashes, defer=True)
        # A load's rows are nearly all plain rows (bytes in the table): those are read by a
        # statement of two columns over a list of the keys, and only the others (an alias, a
        # file) by the general one. SQLite keeps a row's columns in order and ``data`` of a
        # chunk is KiBs of overflow pages: reading the five columns after it cost a
        # 2,000-message restore ~0.2 ms, and sorting an ``IN`` list of 256 keys ~0.1 ms more.
        out: dict[bytes, Stored] = {}
        other: list[bytes] = []
        opened = self._row_opener()
        for i in range(0, len(hashes), CHUNK):
            part = hashes[i : i + CHUNK]
            for h, data in tx.all(_SELECT_PLAIN.format(keys=", ".join(["(?)"] * len(part))), part):
                if data is None:
                    other.append(bytes(h))
                elif opened is None:
                    out[bytes(h)] = blob_column(data)
                else:
                    out[bytes(h)] = opened(bytes(h), blob_column(data))
        if other:
            out.update(self._read_rows(tx, other, defer=True))
        return out

    def _read_values(self, tx: Tx, hashes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Stored values by hash, from the table or the blob store (absent ones left out);
        an alias row is read as the prefix of its target it stands for."""
        return self._read_rows(tx, hashes, defer=False)  # type: ignore[return-value]

    def _read_rows(self, tx: Tx, hashes: Sequence[bytes], *, defer: bool) -> dict[bytes, Stored]:
        out, chain = self._read_rows_once(tx, hashes, defer=defer)
        if not chain:
            return out
        # A target read in this snapshot holds its prefix; one that became an alias since (a
        # concurrent save, another snapshot) is followed again. Followed level by level, each
        # key read once: alias rows made to point at themselves or at each other (damage)
        # then end as keys left out, which a load reports as a missing chunk of its field,
        # not as a RecursionError.
        originals = list(chain)
        values: dict[bytes, Stored] = dict(out)
        asked = set(hashes)
        wanted = {target for target, _ in chain.values()} - asked
        while wanted:
            asked |= wanted
            found, more = self._read_rows_once(tx, list(wanted), defer=False)
            values.update(found)
            chain.update(more)
            wanted = {target for target, _ in more.values()} - asked
        for key in originals:
            prefix = self._follow_alias(key, chain, values)
            if prefix is not None:
                out[key] = prefix
        return out

    @staticmethod
    def _follow_alias(
        key: bytes, chain: Mapping[bytes, tuple[bytes, int]], values: dict[bytes, Stored]
    ) -> bytes | None:
        """The bytes the alias row ``key`` stands for, through aliases of aliases (each one
        resolved is kept in ``values``); None if the chain ends at a missing row, a value
        too short, or loops."""
        path: list[bytes] = []
        on_path: set[bytes] = set()
        at = key
        while at not in values and at in chain and at not in on_path:
            path.append(at)
            on_path.add(at)
            at = chain[at][0]
        found = values.get(at)
        if isinstance(found, Deferred):
            found = found.read()
        for alias in reversed(path):
            size = chain[alias][1]
            if found is None or len(found) < size:
                return None
            found = found[:size]
            values[alias] = found
        return found

    def _read_rows_once(
        self, tx: Tx, hashes: Sequence[bytes], *, defer: bool
    ) -> tuple[dict[bytes, Stored], dict[bytes, tuple[bytes, int]]]:
        """The rows of ``hashes`` that hold their value (in the table, a file or a pack),
        and the alias rows among them: key -> (target, size)."""
        out: dict[bytes, Stored] = {}
        aliases: dict[bytes, tuple[bytes, int]] = {}
        deferred: list[tuple[bytes, Slot | None]] = []
        opened = self._row_opener()
        for h, data, location, alias, size, pack, pack_offset in tx.in_chunks(
            "SELECT hash, data, location, alias, size, pack, pack_offset FROM pitstop_blobs "
            "WHERE hash IN ({in})",
            hashes,
        ):
            key = bytes(h)
            if alias is not None:
                aliases[key] = (bytes(alias), int(size))
            elif location is None:
                out[key] = blob_column(data) if opened is None else opened(key, blob_column(data))
            elif defer and self.blobs is not None and location == self.blobs.url:
                deferred.append((key, slot_of(pack, pack_offset, size)))
                out[key] = Deferred(self.blobs, key, deferred[-1][1])
            else:
                value = self._fetch_external(key, location, slot_of(pack, pack_offset, size))
                if value is not None:
                    out[key] = value
        if deferred and self.blobs is not None:
            # Object storage: every GET in flight at once, and a pack's values asked for at
            # two levels of a tree read by one request.
            self.blobs.prefetch(deferred)
        return out, aliases

    def _prefix_rows(self, tx: Tx, keys: Sequence[bytes]) -> dict[bytes, tuple[bytes, int]]:
        """Those of ``keys`` stored as a prefix of another value: key -> (target, size)."""
        return {
            bytes(h): (bytes(target), int(size))
            for h, target, size in tx.in_chunks(
                "SELECT hash, alias, size FROM pitstop_blobs WHERE alias IS NOT NULL "
                "AND hash IN ({in})",
                [k for k in keys if is_chunk_key(k)],
            )
        }

    def _read_values_alone(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """:meth:`_read_values` in a transaction of its own."""
        return self._tx(lambda tx: self._read_values(tx, keys))

    def _extend_in_place(
        self,
        tx: Tx,
        run_id: str,
        aliases: Sequence[Alias],
        new: Mapping[bytes, NewBlob],
        present: set[bytes],
        now: float,
    ) -> set[bytes]:
        """Store each chunk that extends a superseded one in that one's row, and the
        superseded chunk as a new alias row: the keys of the chunks stored so.

        What :meth:`_make_aliases` does, the other way round. SQLite appends rows in rowid
        order, so a superseded chunk's row shrunk to an alias in place leaves the part of
        its bytes its leaf page held (up to 4 KiB) free where no later row goes: a growing
        conversation's leaf pages ended 40% empty. The row rewritten with the longer chunk
        fills that place again, and the small alias rows are packed at the end.
        Only for a chunk in no row yet, kept in the table, extending a plain table row that
        the run ``run_id`` owns (the new chunk and the alias row are then its own too; a row
        owned otherwise keeps its owner and becomes an alias where it is).
        """
        moved: set[bytes] = set()
        for alias in aliases:
            blob = new.get(alias.target)
            if (
                blob is None
                or alias.target in present
                or alias.target in moved
                or self._external(blob)
                or not is_chunk_key(alias.key)
            ):
                continue
            # Not if the new chunk's key is stored already (``present`` may not say: see
            # write.write_checkpoint): its INSERT then finds it, and the collision check
            # compares the two.
            done = tx.run(
                "UPDATE pitstop_blobs SET hash = ?, data = ?, size = ?, created_at = ? "
                "WHERE hash = ? AND alias IS NULL AND location IS NULL AND size = ? "
                "AND run_id = ? AND NOT EXISTS (SELECT 1 FROM pitstop_blobs WHERE hash = ?)",
                (alias.target, blob.stored, blob.size, now, alias.key, alias.size, run_id,
                 alias.target),
            ).rowcount
            if not done:
                continue
            tx.run(
                "INSERT INTO pitstop_blobs (hash, data, size, created_at, alias, run_id) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (alias.key, b"", alias.size, now, alias.target, run_id),
            )
            # Aliases of the superseded chunk follow it to the new one (no chains).
            tx.run(
                "UPDATE pitstop_blobs SET alias = ? WHERE alias = ?", (alias.target, alias.key)
            )
            moved.add(alias.target)
        return moved

    def _make_aliases(self, tx: Tx, aliases: Sequence[Alias]) -> None:
        """Keep each superseded chunk as a prefix of the chunk that extends it: its bytes are
        stored once. Aliases of it follow it to the new chunk (no chains). Only a chunk in
        the table (not a blob-store file) becomes an alias."""
        tx.many(
            "UPDATE pitstop_blobs SET alias = ? WHERE alias = ?",
            [(a.target, a.key) for a in aliases],
        )
        tx.many(
            "UPDATE pitstop_blobs SET data = ?, alias = ? WHERE hash = ? AND alias IS NULL "
            "AND location IS NULL AND size = ?",
            [(b"", a.target, a.key, a.size) for a in aliases],
        )

    def _ref_alias_targets(self, tx: Tx, run_id: str, keys: Sequence[bytes]) -> None:
        """A run that references an alias references its target too (what GC follows)."""
        chunk_keys = [k for k in keys if is_chunk_key(k)]
        if chunk_keys:
            tx.many(
                "INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                "ON CONFLICT (run_id, hash) DO NOTHING",
                [(run_id, target) for target in self._alias_targets(tx, chunk_keys)],
            )

    def _alias_targets(self, tx: Tx, keys: Sequence[bytes]) -> list[bytes]:
        """The chunks that those of ``keys`` that are aliases stand in."""
        chunk_keys = [k for k in keys if is_chunk_key(k)]
        return [
            bytes(target)
            for (target,) in tx.in_chunks(
                "SELECT alias FROM pitstop_blobs WHERE alias IS NOT NULL AND hash IN ({in})",
                chunk_keys,
            )
        ]

    def _fetch_external(
        self, key: bytes, location: str, slot: Slot | None = None
    ) -> bytes | None:
        """A value kept in the blob store (None: the file is missing)."""
        if self.blobs is None:
            raise StoreError(
                f"{self.url}: value {key.hex()[:16]} is kept in the blob store {location}; "
                "open this store with blobs=... to read it"
            )
        value = self.blobs.get(key, slot)
        if value is None and location != self.blobs.url:
            raise StoreError(
                f"{self.url}: value {key.hex()[:16]} is kept in the blob store {location}, "
                f"not in {self.blobs.url}; open this store with blobs=... naming it"
            )
        return value

    def _unshared_values(
        self, tx: Tx, run_id: str, hashes: Sequence[bytes]
    ) -> tuple[list[bytes], int]:
        """Which of ``hashes`` no other run references (by a reference row or as the owner),
        and their stored size."""
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
        shared.update(
            bytes(h)
            for (h,) in tx.in_chunks(
                "SELECT hash FROM pitstop_blobs WHERE run_id <> ? AND hash IN ({in})",
                hashes,
                run_id,
            )
        )
        freed = [h for h in hashes if h not in shared]
        size = sum(
            int(value_size)
            for (value_size,) in tx.in_chunks(
                "SELECT size FROM pitstop_blobs WHERE hash IN ({in})", freed
            )
        )
        return freed, size

    def _delete_values(
        self, tx: Tx, run_id: str, hashes: Sequence[bytes], *, packs_later: bool = False
    ) -> None:
        """Delete the values of ``hashes`` that nothing references any more, now that the run
        ``run_id`` does not (the caller holds :meth:`_lock_gc`), their blob-store files once
        the transaction has committed. ``hashes`` is every value the run let go, not only
        those :meth:`_unshared_values` found unshared: that ran before the lock, and two runs
        sharing a value and deleted at once each saw the other still holding it.
        ``packs_later``: the packs emptied are unlinked by a background thread after the
        commit (:meth:`_unlink_packs_later`), off the caller's time."""
        unreferenced = (
            "(pitstop_blobs.run_id IS NULL OR pitstop_blobs.run_id = ?) AND "
            "hash IN ({in}) AND NOT EXISTS "
            "(SELECT 1 FROM pitstop_blob_refs r WHERE r.hash = pitstop_blobs.hash) "
            "AND NOT EXISTS (SELECT 1 FROM pitstop_blobs a WHERE a.alias = pitstop_blobs.hash)"
        )
        files: list[bytes] = []
        packs: set[str] = set()
        if self.blobs is not None:
            for h, pack in tx.in_chunks(
                "SELECT hash, pack FROM pitstop_blobs WHERE location IS NOT NULL AND "
                + unreferenced,
                hashes,
                run_id,
            ):
                if pack is None:
                    files.append(bytes(h))
                else:
                    packs.add(str(pack))
        # Re-checked under the GC lock: a concurrent writer may have started sharing one.
        tx.run_chunks("DELETE FROM pitstop_blobs WHERE " + unreferenced, hashes, run_id)
        if packs:
            # A pack goes with the last row in it; saves never add to a pack, they write
            # their own, so no later save can put a row in one found empty here.
            packs -= {
                str(pack)
                for (pack,) in tx.in_chunks(
                    "SELECT DISTINCT pack FROM pitstop_blobs WHERE pack IN ({in})", sorted(packs)
                )
            }
        if self.blobs is not None and (files or packs):
            blobs = self.blobs
            empty = sorted(packs)

            def delete() -> None:  # only once no row points at them
                blobs.delete(files)
                if packs_later:
                    self._unlink_packs_later(empty)
                else:
                    blobs.delete_packs(empty)

            tx.on_commit(delete)

    def _unlink_packs_later(self, names: Sequence[str]) -> None:
        """Unlink these packs (no committed row is in them) on a background thread: a save
        that pruned need not wait for the file system to free a superseded pack's blocks.
        Only packs: their names are drawn at random and never written twice, so a later
        save cannot be writing the file being unlinked (a value's own file, named by its
        key, may be written again by the next save: those go at once). A pack left behind
        (the process ends first) is only space: a later ``prune`` sweeps it (``verify`` names it).
        The store's ``close`` waits for the unlinks queued."""
        if not names or self.blobs is None:
            return
        blobs = self.blobs
        pid = os.getpid()
        unlinker = self.__dict__.get("_pack_unlinker")
        if unlinker is None or unlinker[0] != pid:  # (a forked child has no such thread)
            # Imported here: listing runs must not import concurrent.futures (test_cli_imports
            # keeps the CLI's start-up small), and only a pruning save gets this far.
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitstop-unlink")
            unlinker = self.__dict__["_pack_unlinker"] = (pid, pool)
            self._call_before_close(self._stop_unlinking)
        unlinker[1].submit(blobs.delete_packs, list(names))

    def _stop_unlinking(self) -> None:
        """At close: wait for the unlinks queued (the files are gone once it returns)."""
        unlinker = self.__dict__.pop("_pack_unlinker", None)
        if unlinker is not None:
            unlinker[1].shutdown(wait=True)

    def _disown(self, tx: Tx, run_id: str, hashes: Sequence[bytes]) -> None:
        """The run ``run_id`` no longer references these values: of those it owns and that
        are still there (another run references them), it is no longer the owner. Their
        reference rows then decide, as for a row from before owners."""
        tx.run_chunks(
            "UPDATE pitstop_blobs SET run_id = NULL WHERE run_id = ? AND hash IN ({in})",
            hashes,
            run_id,
        )


def slot_of(pack: str | None, offset: int | None, size: int) -> Slot | None:
    """Where a row's packed value is (None: not packed, a file named by its hash)."""
    return None if pack is None else Slot(str(pack), int(offset or 0), int(size))


__all__ = ["StoredValues", "slot_of"]
