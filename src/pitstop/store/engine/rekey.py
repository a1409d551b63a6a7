"""Sealing a store's blob values again under one key: ``pitstop rekey --to k2``.

After a new key is made current (``Encryption(keys={"k2": ..., "k1": ...}, current="k2")``),
new values are sealed under it and old ones still open under ``k1``. :func:`rekey` seals
every value still under another key (or plaintext, written before the store was sealed)
again under ``k2``, after which ``k1`` can be dropped from the ring; and so is what a sealed
store keeps in the database: records (inputs, effects' results, attached writes), the rows
of the value table (a state's small values and chunks), and the values kept inline in
checkpoint records (their record's checksum computed again over the new bytes).

It runs beside normal work: a batch of values at a time, each read, sealed into a new pack,
and its row pointed at the new copy in a short transaction of its own. A pack (or a file
named by a key) is deleted only after the transaction that moved its last row away has
committed, and saves never add to an existing pack, so no checkpoint ever points at a
deleted copy. Killed half way, it leaves values under both keys, all readable, and packs no
row is in, which ``prune`` removes; run it again to finish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import StoreError, UnsupportedStoreError
from ...serde import digest, unframe
from ..encoding.attached import frames_of, read_frames
from ..encoding.blobs import Slot
from ..encoding.sealed import Encryption, SealedBlobStore, is_sealed, key_id_of
from .values import slot_of

_BATCH = 64
"""Values per batch (at most ~64 MiB of chunks in memory at once)."""


def rekey(store: Any, to: str, *, progress: Callable[[int, int], None] | None = None) -> int:
    """Seal every blob value of ``store`` under the key ``to`` (one of its ring); how many
    values were sealed again. ``progress(done, total)`` after each batch."""
    blobs = getattr(store, "blobs", None)
    if not isinstance(blobs, SealedBlobStore):
        raise UnsupportedStoreError(
            f"{store.url}: rekey needs a store opened with its keys (encryption=...)"
        )
    if to not in blobs.encryption.keys:
        raise UnsupportedStoreError(
            f"{store.url}: key {to!r} is not in the store's Encryption "
            f"({', '.join(sorted(blobs.encryption.keys))})"
        )
    target = SealedBlobStore(blobs.inner, blobs.encryption.with_current(to))
    location = blobs.url
    total = int(store._tx(lambda tx: tx.one(
        "SELECT COUNT(*) FROM pitstop_blobs WHERE location = ? AND alias IS NULL", (location,)
    )[0]))
    done = resealed = 0
    after = b""
    while True:
        rows = store._tx(lambda tx, after=after: tx.all(
            "SELECT hash, pack, pack_offset, size FROM pitstop_blobs WHERE location = ? "
            "AND alias IS NULL AND hash > ? ORDER BY hash LIMIT ?", (location, after, _BATCH)
        ))
        if not rows:
            break
        after = bytes(rows[-1][0])
        todo: list[tuple[bytes, Slot | None, bytes]] = []
        for raw_hash, pack, offset, size in rows:
            key = bytes(raw_hash)
            slot = slot_of(pack, offset, size)
            if blobs.sealed_with(key, slot) == to:
                continue
            value = blobs.get(key, slot)
            if value is None:
                raise StoreError(
                    f"{store.url}: rekey: value {key.hex()[:16]} cannot be read "
                    f"({blobs.why_missing(key, slot)}); `pitstop verify` lists what is "
                    "damaged"
                )
            todo.append((key, slot, value))
        if todo:
            slots = target.put_many([(key, (value,)) for key, _, value in todo])
            store._tx(lambda tx, todo=todo, slots=slots: _repoint(tx, blobs, todo, slots),
                      write=True)
            resealed += len(todo)
        done += len(rows)
        if progress:
            progress(done, total)
    ring, under = blobs.encryption, blobs.encryption.with_current(to)
    return (resealed + _reseal_records(store, ring, under) + _reseal_rows(store, ring, under)
            + _reseal_inline(store, ring, under))


def _reseal_rows(store: Any, ring: Encryption, target: Encryption) -> int:
    """Seal again under ``target``'s current key the rows of the value table that hold
    their value (a state's small values, chunks and chunk-tree nodes; see
    :mod:`pitstop.store.encoding.sealing`), and seal those written before the store was
    sealed; how many rows. Each is updated only if its bytes are still those read."""
    resealed = 0
    after = b""
    while True:
        rows = store._tx(lambda tx, after=after: tx.all(
            "SELECT hash, data FROM pitstop_blobs WHERE location IS NULL AND alias IS NULL "
            "AND hash > ? ORDER BY hash LIMIT ?", (after, _BATCH),
        ))
        if not rows:
            break
        after = bytes(rows[-1][0])
        updates: list[tuple[Any, ...]] = []
        for raw_hash, data in rows:
            key, old = bytes(raw_hash), bytes(data)
            if is_sealed(old):
                if key_id_of(old) == target.current:
                    continue
                plain = ring.open(key, old)
                if plain is None:
                    raise StoreError(
                        f"{store.url}: rekey: value {key.hex()[:16]} fails authentication "
                        f"under key {key_id_of(old)!r} (altered); `pitstop verify` lists what "
                        "is damaged"
                    )
            elif old:
                plain = old
            else:
                continue
            new = target.seal_row(key, plain)
            updates.append((new, len(new), key, old))
        if updates:
            store._tx(lambda tx, updates=updates: tx.many(
                "UPDATE pitstop_blobs SET data = ?, size = ? WHERE hash = ? AND data = ? "
                "AND location IS NULL AND alias IS NULL", updates), write=True)
            resealed += len(updates)
    return resealed


def _reseal_inline(store: Any, ring: Encryption, target: Encryption) -> int:
    """Seal again under ``target``'s current key the small values kept inline in checkpoint
    records (and seal plain ones), the record's checksum computed again over its new field
    map; how many values. A record that fails its checksum is left as it is (``verify``
    names it). Each is updated only if its field map is still the one read."""
    from ..encoding.records import CheckpointRecord, FieldRef, decode_field_map, encode_field_map
    from ..encoding.sealing import INLINE_AAD
    from .schema import CHECKPOINTS

    resealed = 0
    after = ""
    while True:
        rows = store._tx(lambda tx, after=after: tx.all(
            f"SELECT {CHECKPOINTS.column_list()} FROM pitstop_checkpoints WHERE id > ? "
            "ORDER BY id LIMIT ?", (after, _BATCH),
        ))
        if not rows:
            break
        after = str(rows[-1][0])
        updates: list[tuple[Any, ...]] = []
        for row in rows:
            record = CheckpointRecord(*row)
            if isinstance(record.fields, str):
                continue
            old_fields = bytes(record.fields)
            record.fields = old_fields
            try:
                record.verify()
                fields = decode_field_map(old_fields)
            except Exception:
                continue  # damaged: verify names it
            changed = 0
            for name, ref in fields.items():
                if ref.inline is None:
                    continue
                if is_sealed(ref.inline):
                    if key_id_of(ref.inline) == target.current:
                        continue
                    plain = ring.open(INLINE_AAD, ref.inline)
                    if plain is None:
                        raise StoreError(
                            f"{store.url}: rekey: run {record.run_id!r}: checkpoint "
                            f"{record.id}: field {name!r}: its sealed value fails "
                            "authentication (altered); `pitstop verify` lists what is damaged"
                        )
                else:
                    plain = ref.inline
                sealed = target.seal_small(INLINE_AAD, plain)
                fields[name] = FieldRef(b"", len(sealed), sealed)
                changed += 1
            if changed:
                record.fields = encode_field_map(fields)
                updates.append((record.fields, record.compute_checksum(), record.id,
                                old_fields))
                resealed += changed
        if updates:
            store._tx(lambda tx, updates=updates: tx.many(
                "UPDATE pitstop_checkpoints SET fields = ?, checksum = ? "
                "WHERE id = ? AND fields = ?", updates), write=True)
    return resealed


def _reseal_records(store: Any, ring: Encryption, target: Encryption) -> int:
    """Seal again under ``target``'s current key the records a sealed store keeps in the
    database (inputs, effects' results, writes attached to checkpoints), and seal those
    written before the store was sealed, under a keyed address in place of their SHA-256;
    how many records (values of attached writes) were sealed again.

    Each row is updated only if it is still what was read (its bytes compared): a
    concurrent ``record_effects(replace=True)`` or an appended write wins, and a run of
    rekey after it seals what that wrote if need be."""
    resealed = 0
    after: tuple[str, ...] = ("",)
    while True:  # inputs, by id
        rows = store._tx(lambda tx, after=after: tx.all(
            "SELECT id, payload, hash FROM pitstop_inputs WHERE id > ? ORDER BY id LIMIT ?",
            (after[0], _BATCH),
        ))
        if not rows:
            break
        after = (str(rows[-1][0]),)
        updates: list[tuple[Any, ...]] = []
        for input_id, payload, old_hash in rows:
            new = _resealed(ring, target, bytes(payload), bytes(old_hash),
                            f"input {input_id}")
            if new is not None:
                updates.append((new[0], new[1], input_id, payload, old_hash))
        if updates:
            store._tx(lambda tx, updates=updates: tx.many(
                "UPDATE pitstop_inputs SET payload = ?, hash = ? "
                "WHERE id = ? AND payload = ? AND hash = ?", updates), write=True)
            resealed += len(updates)
    run_after, key_after = "", ""
    while True:  # effects, by run and key
        rows = store._tx(lambda tx, r=run_after, k=key_after: tx.all(
            "SELECT run_id, key, result, hash FROM pitstop_effects WHERE run_id > ? "
            "OR (run_id = ? AND key > ?) ORDER BY run_id, key LIMIT ?",
            (r, r, k, _BATCH),
        ))
        if not rows:
            break
        run_after, key_after = str(rows[-1][0]), str(rows[-1][1])
        updates = []
        for run_id, key, result, old_hash in rows:
            new = _resealed(ring, target, bytes(result), bytes(old_hash),
                            f"run {run_id!r}: effect {key!r}")
            if new is not None:
                updates.append((new[0], new[1], run_id, key, result, old_hash))
        if updates:
            store._tx(lambda tx, updates=updates: tx.many(
                "UPDATE pitstop_effects SET result = ?, hash = ? "
                "WHERE run_id = ? AND key = ? AND result = ? AND hash = ?", updates),
                write=True)
            resealed += len(updates)
    after = ("",)
    while True:  # writes attached to checkpoints, by checkpoint id
        rows = store._tx(lambda tx, after=after: tx.all(
            "SELECT id, run_id, writes FROM pitstop_checkpoints WHERE writes IS NOT NULL "
            "AND id > ? ORDER BY id LIMIT ?", (after[0], _BATCH),
        ))
        if not rows:
            break
        after = (str(rows[-1][0]),)
        updates = []
        for checkpoint_id, run_id, writes in rows:
            frames = []
            changed = 0
            for name, result, old_hash, replace in read_frames(
                bytes(writes), run_id=run_id, checkpoint_id=checkpoint_id
            ):
                new = _resealed(ring, target, result, old_hash,
                                f"run {run_id!r}: checkpoint {checkpoint_id}: write {name!r}")
                if new is not None:
                    changed += 1
                frames.append((name, *(new or (result, old_hash)), replace))
            if changed:
                updates.append((frames_of(frames), run_id, checkpoint_id, writes))
                resealed += changed
        if updates:
            store._tx(lambda tx, updates=updates: tx.many(
                "UPDATE pitstop_checkpoints SET writes = ? "
                "WHERE run_id = ? AND id = ? AND writes = ?", updates), write=True)
    return resealed


def _resealed(ring: Encryption, target: Encryption, data: bytes, key: bytes, where: str
              ) -> tuple[bytes, bytes] | None:
    """``(sealed value, content key)`` of a record's value sealed under ``target``'s
    current key (None: it is already). A sealed one keeps its key (the seal binds it); a
    plain one (written before the store was sealed) gets a keyed one."""
    if is_sealed(data):
        if key_id_of(data) == target.current:
            return None
        plain = ring.open(key, data)
        if plain is None:
            raise StoreError(
                f"rekey: {where}: its sealed value fails authentication (altered); "
                "`pitstop verify` lists what is damaged"
            )
        return target.seal_small(key, plain), key
    try:
        fmt, raw = unframe(data)
    except ValueError as exc:
        raise StoreError(f"rekey: {where}: its value cannot be read ({exc})") from None
    if digest(fmt, raw) != key:  # (sealing damage would hide it for good)
        raise StoreError(f"rekey: {where}: its value fails its checksum (altered)")
    address = target.address(fmt, raw)
    return target.seal_small(address, data), address


def _repoint(tx: Any, blobs: SealedBlobStore, todo: list[tuple[bytes, Slot | None, bytes]],
             slots: dict[bytes, Slot]) -> None:
    """Point each row at its new copy (if it still is where it was read: a concurrent save
    may have moved it to a copy of its own, which is as good), then delete the old copies
    no row is in, once this commits."""
    moved_from: set[str] = set()
    files: list[bytes] = []
    for key, old, _ in todo:
        new = slots[key]
        where = "pack IS NULL" if old is None else "pack = ? AND pack_offset = ?"
        params: tuple[Any, ...] = () if old is None else (old.pack, old.offset)
        count = tx.run(
            "UPDATE pitstop_blobs SET pack = ?, pack_offset = ?, size = ? "
            f"WHERE hash = ? AND location = ? AND {where}",
            (new.pack, new.offset, new.size, key, blobs.url, *params),
        ).rowcount
        if count and old is None:
            files.append(key)
        elif count and old is not None:
            moved_from.add(old.pack)
    if moved_from:
        still = {str(pack) for (pack,) in tx.in_chunks(
            "SELECT DISTINCT pack FROM pitstop_blobs WHERE pack IN ({in})", sorted(moved_from))}
        empty = sorted(moved_from - still)
    else:
        empty = []
    if files or empty:
        def delete() -> None:
            blobs.delete(files)
            blobs.delete_packs(empty)

        tx.on_commit(delete)


__all__ = ["rekey"]
