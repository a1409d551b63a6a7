"""Moving runs between stores: a run as raw stored records, and the SQL that reads and writes it.

Moving a run between stores (SQLite to PostgreSQL and back) must not re-serialise anything:
the checkpoint records keep their ids, parents and checksums, and the field values keep their
stored bytes and content hashes, so the copy is bit-for-bit the original and still verifies.
:class:`RunExport` holds those raw pieces (rows of :mod:`pitstop.store.engine.schema`) and checks
them; :class:`RunTransfer` is the part of ``SqlStore`` that reads one from a store
(``export_run``) and writes one into a store (``import_run``). ``pitstop.archive`` puts a
:class:`RunExport` in a file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConflictError, CorruptCheckpointError, RunExistsError, RunNotFoundError
from ...model import Run, RunStatus
from ..contract.base import Progress
from ..encoding.attached import map_frames, read_frames
from ..encoding.records import (
    CheckpointRecord,
    FieldMap,
    NewBlob,
    is_chunk_key,
    stored_hashes,
)
from ..encoding.sealing import plain_key
from ..engine.backend import CHUNK, Tx
from ..engine.rowcheck import (
    bytes_problem,
    checkpoint_problem,
    effect_problem,
    hash_problem,
    input_problem,
    run_problem,
)
from ..engine.schema import (
    CHECKPOINTS,
    EFFECTS,
    EXPORTED_RUN_COLUMNS,
    INPUTS,
    INSERT_CHECKPOINT,
    RUNS,
    SELECT_CHECKPOINT,
    EffectRecord,
    InputRecord,
    RunRecord,
    Table,
    check_id,
)
from ..engine.spool import RecordSpool, spool_rows
from ..engine.values import StoredValues


class CheckedValues(Mapping[bytes, bytes]):
    """A mapping of values that checks each one against its hash as it is added (an
    archive's spool): :meth:`RunExport.verify` need not read them back to check them again."""


@dataclass(slots=True)
class RunExport:
    """Everything a store holds about one run, raw: enough to recreate it in another store."""

    run: RunRecord
    checkpoints: Collection[CheckpointRecord] = field(default_factory=list)
    """Oldest first (by id, so every parent in the run comes before its children). A list,
    or (a streamed export) a :class:`~pitstop.store.engine.spool.RecordSpool` read back from a
    temporary file each time it is iterated; so are :attr:`inputs` and :attr:`effects`."""
    blobs: Mapping[bytes, bytes] = field(default_factory=dict)
    """Every separately stored value the checkpoints reference: content hash -> stored
    (framed) bytes. Values small enough to live inside a record are not listed. A dict, or
    (an archive read) a mapping that keeps the bytes in a temporary file."""
    inputs: Collection[InputRecord] = field(default_factory=list)
    effects: Collection[EffectRecord] = field(default_factory=list)
    prefixes: dict[bytes, tuple[bytes, int]] = field(default_factory=dict)
    """Values of :attr:`blobs` stored as the first ``size`` stored bytes of another value
    of :attr:`blobs` (a growing list's superseded last chunks): ``hash -> (target, size)``.
    An archive carries them without their bytes, and an import stores them so again."""

    def verify(self) -> None:
        """Check every checksum and reference; raise :class:`~pitstop.CorruptCheckpointError`.

        Importers call this before writing anything, so a damaged or hand-edited export is
        refused as a whole instead of leaving a half-imported run behind: first the type and
        range of every field and that no record appears twice
        (:func:`export_problem`), then checksums and references.
        """
        problem = export_problem(self)
        if problem:
            raise CorruptCheckpointError(problem, run_id=str(self.run.run_id))
        run_id = self.run.run_id
        head_found = False  # (not a set of every id: a streamed export holds no such set)
        for record in self.checkpoints:
            if record.run_id != run_id:
                raise CorruptCheckpointError(
                    f"belongs to run {record.run_id!r}, not to the exported run",
                    checkpoint_id=record.id,
                    run_id=run_id,
                )
            record.verify()
            if record.writes is not None:
                for key, result, hash_, _ in read_frames(
                    record.writes, run_id=run_id, checkpoint_id=record.id
                ):
                    check_value(result, hash_, run_id=run_id,
                                what=f"record {key!r} attached to checkpoint {record.id}")
            fields = record.field_map()
            for name, ref in fields.items():
                if ref.manifest is not None:
                    missing = missing_chunks(ref.manifest, self.blobs)
                    if missing:
                        raise CorruptCheckpointError(
                            f"chunk {missing.hex()[2:18]} is missing from the export",
                            checkpoint_id=record.id,
                            run_id=run_id,
                            field=name,
                        )
                elif ref.inline is None and ref.hash not in self.blobs:
                    raise CorruptCheckpointError(
                        f"value {ref.hash.hex()[:16]} is missing from the export",
                        checkpoint_id=record.id,
                        run_id=run_id,
                        field=name,
                    )
            head_found = head_found or record.id == self.run.head_id
        if self.run.head_id is not None and not head_found:
            raise CorruptCheckpointError(
                f"the run's head {self.run.head_id} is not among its checkpoints", run_id=run_id
            )
        if not isinstance(self.blobs, CheckedValues):
            for h, data in self.blobs.items():
                check_value(data, h, run_id=run_id, what=f"value {h.hex()[:16]}")
        for item in self.inputs:
            check_value(item.payload, item.hash, run_id=run_id, what=f"input {item.id}")
        for effect in self.effects:
            check_value(effect.result, effect.hash, run_id=run_id, what=f"effect {effect.key!r}")

    @property
    def referenced(self) -> list[bytes]:
        """The distinct hashes of the separately stored values the checkpoints reference
        (small values live inside the records themselves and travel with them). For a chunked
        value, its top chunks: those under its nodes are listed by :meth:`missing_below`."""
        seen: dict[bytes, None] = {}
        for record in self.checkpoints:
            seen.update(dict.fromkeys(stored_hashes(record.field_map())))
        return list(seen)


def export_problem(data: RunExport) -> str | None:
    """What makes ``data`` unfit to import, naming the record ("run record 'x': ..."), or
    None. Types and ranges, and that no record appears twice (but in records spooled from a
    store, unique by its keys: no set of every id is built for a streamed export); checksums
    and references are :meth:`RunExport.verify`'s."""
    run_id = getattr(data.run, "run_id", None)
    problem = run_problem(data.run)
    if problem:
        return f"run record {run_id!r}: {problem}"
    seen: set[Any] = set()
    unique = isinstance(data.checkpoints, RecordSpool)
    for record in data.checkpoints:
        problem = checkpoint_problem(record)
        if problem is None and record.id in seen:
            problem = "appears twice"
        if problem:
            return f"checkpoint record {getattr(record, 'id', None)!r}: {problem}"
        if not unique:
            seen.add(record.id)
    for h in data.blobs:
        problem = hash_problem("hash", h)
        if problem:
            return f"value record: {problem}"
    if not isinstance(data.blobs, CheckedValues):  # else bytes checked as they were added
        for h, value in data.blobs.items():
            problem = bytes_problem("data", value)
            if problem:
                return f"value record {bytes(h).hex()[:16]}: {problem}"
    seen.clear()
    unique = isinstance(data.inputs, RecordSpool)
    for item in data.inputs:
        problem = input_problem(item)
        if problem is None and item.id in seen:
            problem = "appears twice"
        if problem:
            return f"input record {getattr(item, 'id', None)!r}: {problem}"
        if not unique:
            seen.add(item.id)
    seen.clear()
    unique = isinstance(data.effects, RecordSpool)
    for effect in data.effects:
        problem = effect_problem(effect)
        if problem is None and effect.key in seen:
            problem = "appears twice"
        if problem:
            return f"effect record {getattr(effect, 'key', None)!r}: {problem}"
        if not unique:
            seen.add(effect.key)
    return None


def missing_chunks(manifest: bytes, blobs: Mapping[bytes, bytes]) -> bytes | None:
    """A chunk of a chunked value that ``blobs`` lacks (walking its nodes), or None."""
    # (not at import: see pitstop.store.encoding.valuecodec)
    from ...serde import chunks as chunking
    from ...serde import unframe

    try:
        pending = list(chunking.decode_manifest(manifest).root)
    except ValueError:
        return b"\x00" * chunking.KEY_SIZE
    while pending:
        entry = pending.pop()
        if entry.key not in blobs:
            return entry.key
        if entry.flags & chunking.NODE:  # (only a node's bytes are read: its children)
            data = blobs[entry.key]
            try:
                pending.extend(chunking.unpack_entries(unframe(bytes(data))[1]))
            except ValueError:
                return entry.key
    return None


def check_value(data: bytes, expected: bytes, *, run_id: str, what: str) -> None:
    """Raise unless ``data`` is a readable frame whose content hash is ``expected``."""
    from ...serde import chunks as chunking
    from ...serde import digest, unframe

    try:
        fmt, raw = unframe(bytes(data))
    except ValueError as exc:
        raise CorruptCheckpointError(f"{what}: {exc}", run_id=run_id) from None
    expected = bytes(expected)
    if len(expected) == chunking.KEY_SIZE:
        ok = chunking.check_chunk(expected, fmt, raw)
    else:
        ok = digest(fmt, raw) == expected
    if not ok:
        raise CorruptCheckpointError(
            f"{what}: checksum mismatch (truncated or altered)", run_id=run_id
        )


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last shorter)."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


_BATCH_BYTES = 16 << 20
"""An import inserts values in batches of at most this many bytes (or CHUNK values)."""

_SELECT_EXPORTED_RUN = (
    f"SELECT {', '.join(EXPORTED_RUN_COLUMNS)} FROM pitstop_runs WHERE run_id = ?"
)
_INSERT_IMPORTED_RUN = RUNS.insert(EXPORTED_RUN_COLUMNS)
_SELECT_INPUTS = f"SELECT {INPUTS.column_list()} FROM pitstop_inputs WHERE run_id = ? ORDER BY id"
_SELECT_EFFECTS = (
    f"SELECT {EFFECTS.column_list()} FROM pitstop_effects WHERE run_id = ? ORDER BY key"
)


_RECORD_VALUES = {INPUTS.name: ("payload", "hash"), EFFECTS.name: ("result", "hash")}
"""The value and content key columns of the tables of records (inputs, effects)."""
_WRITES = CHECKPOINTS.columns.index("writes")
_FIELDS = CHECKPOINTS.columns.index("fields")
_CHECKSUM = CHECKPOINTS.columns.index("checksum")

Convert = Callable[[bytes, bytes], tuple[bytes, bytes]]


def _converted(convert: Convert | None, table_name: str,
               inline: Callable[[bytes], bytes] | None = None,
               keys: Mapping[bytes, bytes] | None = None,
               ) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A row of ``table_name`` with each record value in it (an input's, an effect's, the
    writes attached to a checkpoint) made ``convert(value, key)``: opened for an export of
    a sealed store, sealed on import into one (see ``ValueCodec.plain_record``); and in a
    checkpoint's field map each inline value made ``inline(value)`` and each whole value's
    key ``k`` in ``keys`` made ``keys[k]`` (re-addressed: see
    :func:`~pitstop.store.encoding.sealing.plain_key`), its checksum computed again (only
    over a record that passed it: damage is carried as it is)."""
    if table_name == CHECKPOINTS.name:
        def checkpoint(row: Sequence[Any]) -> tuple[Any, ...]:
            out = list(row)
            if out[_WRITES] is not None and convert is not None:
                out[_WRITES] = map_frames(bytes(out[_WRITES]), convert, run_id=str(out[1]),
                                          checkpoint_id=str(out[0]))
            if ((inline is not None or keys)
                    and isinstance(out[_FIELDS], bytes | bytearray | memoryview)):
                record = CheckpointRecord(*out)
                record.fields = bytes(out[_FIELDS])
                if record.checksum == record.compute_checksum():
                    from ..encoding.sealing import map_inline

                    try:
                        fields = map_inline(record.fields, inline, keys)
                    except (ValueError, CorruptCheckpointError):
                        fields = None  # the importer's verify names it
                    if fields is not None:
                        record.fields = fields
                        out[_FIELDS] = fields
                        out[_CHECKSUM] = record.compute_checksum()
            return tuple(out)

        return checkpoint
    value, key = (_columns(table_name).index(c) for c in _RECORD_VALUES[table_name])
    assert convert is not None

    def record(row: Sequence[Any]) -> tuple[Any, ...]:
        out = list(row)
        out[value], out[key] = convert(bytes(out[value]), bytes(out[key]))
        return tuple(out)

    return record


def _field_maps(records: Iterable[CheckpointRecord]) -> Iterator[FieldMap]:
    """The field map of each record that has a readable one (the importer's verify names the
    others)."""
    for record in records:
        try:
            yield record.field_map()
        except CorruptCheckpointError:
            continue


def _columns(table_name: str) -> tuple[str, ...]:
    return INPUTS.columns if table_name == INPUTS.name else EFFECTS.columns


def _values(record: Any, columns: tuple[str, ...], **override: Any) -> tuple[Any, ...]:
    """A record's values in the order of ``columns`` (some replaced)."""
    return tuple(override[c] if c in override else getattr(record, c) for c in columns)


class LazyValues(CheckedValues):
    """An export's values, read from the store one at a time as they are used and checked
    against their hashes as they are read (:meth:`Store.export_run` with ``stream=True``).
    Its keys are the values present when the run was read."""

    def __init__(self, store: StoredValues, run_id: str, keys: list[bytes],
                 stored: Mapping[bytes, bytes] | None = None,
                 rewritten: Mapping[bytes, bytes] | None = None) -> None:
        self._store = store
        self._run_id = run_id
        self._keys = dict.fromkeys(keys)
        self._stored = stored or {}
        """The key a value has in the store, by the key it has in the export, where they
        differ (a sealed store's keyed addresses: see ``plain_key``)."""
        self._rewritten = rewritten or {}
        """Chunk-tree nodes written again with their children's plain keys, by their plain
        key (see :mod:`pitstop.store.encoding.readdress`): held, not read."""

    def __getitem__(self, key: bytes) -> bytes:
        if key not in self._keys:
            raise KeyError(key)
        node = self._rewritten.get(key)
        if node is not None:
            return node
        at = self._stored.get(key, key)
        found = self._store._read_values_alone([at]).get(at)
        what = f"value {key.hex()[:16]}"
        if found is None:
            raise CorruptCheckpointError(
                f"{what} was deleted while the run was exported (pruned meanwhile?); export "
                "it again", run_id=self._run_id)
        found = found if type(found) is bytes else bytes(found)  # (not Opened: msgpack)
        check_value(found, key, run_id=self._run_id, what=what)
        return found

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class RunTransfer(StoredValues):
    """``export_run`` and ``import_run``: each backend mixes it into its ``SqlStore``."""

    def export_run(self, run_id: str, *, stream: bool = False) -> RunExport:
        def read(tx: Tx) -> RunExport:
            row = tx.one(_SELECT_EXPORTED_RUN, (run_id,))
            if row is None:
                raise RunNotFoundError(run_id)
            data = RunExport(RunRecord(*row))
            if stream:
                return self._stream(tx, data)
            data.checkpoints = [
                CheckpointRecord(*r)
                for r in tx.all(SELECT_CHECKPOINT + " WHERE run_id = ? ORDER BY id", (run_id,))
            ]
            blobs = self._read_values(tx, data.referenced)
            for record in data.checkpoints:  # chunks under the nodes of chunked values
                fields = record.field_map()
                while missing := self._value_codec.missing_below(fields, blobs):
                    found = self._read_values(tx, missing)
                    if not found:
                        break  # the importer's verify names what is missing
                    blobs.update(found)
            data.prefixes = {
                key: (target, size)
                for key, (target, size) in self._prefix_rows(tx, list(blobs)).items()
                if target in blobs and len(blobs[key]) == size
            }
            keys: dict[bytes, bytes] = {}
            if self._value_codec.sealer is not None:  # values travel under their SHA-256
                for key, value in blobs.items():
                    plain = plain_key(key, value)
                    if plain is not None:
                        keys[key] = plain
                # and chunks under their plain keys (see pitstop.store.encoding.readdress)
                from ..encoding.readdress import to_plain

                held = blobs
                moved = to_plain(_field_maps(data.checkpoints),
                                 lambda wanted: {k: held[k] for k in wanted if k in held})
                keys.update(moved.keys)
                blobs = {keys.get(k, k): moved.nodes.get(k) or (v if type(v) is bytes
                                                                 else bytes(v))
                         for k, v in blobs.items()}
                data.prefixes = {keys.get(k, k): (keys.get(target, target), size)
                                 for k, (target, size) in data.prefixes.items()}
            data.blobs = blobs
            data.inputs = [InputRecord(*r) for r in tx.all(_SELECT_INPUTS, (run_id,))]
            data.effects = [EffectRecord(*r) for r in tx.all(_SELECT_EFFECTS, (run_id,))]
            if self._value_codec.sealer is not None:  # records travel plain, as values do
                opened = self._value_codec.plain_record
                to_row = _converted(opened, CHECKPOINTS.name,
                                    self._value_codec.plain_inline, keys)
                data.checkpoints = [CheckpointRecord(*to_row(c.row()))
                                    for c in data.checkpoints]
                to_row = _converted(opened, INPUTS.name)
                data.inputs = [InputRecord(*to_row(_values(i, INPUTS.columns)))
                               for i in data.inputs]
                to_row = _converted(opened, EFFECTS.name)
                data.effects = [EffectRecord(*to_row(_values(e, EFFECTS.columns)))
                                for e in data.effects]
            return data

        # One read transaction: a snapshot, so a concurrent prune cannot tear the export.
        return self._tx(read)

    def _stream(self, tx: Tx, data: RunExport) -> RunExport:
        """``data`` with its records spooled (:func:`~pitstop.store.engine.spool.spool_rows`: read
        a page at a time into temporary files, in the order and with the values the
        statements above return) and :class:`LazyValues`: the keys every checkpoint
        references (chunks under nodes found by reading the nodes alone, never the chunks)
        that are present. Memory holds a page of rows and the values' keys."""
        run_id = data.run.run_id
        opened = self._value_codec.plain_record if self._value_codec.sealer else None
        def plain(table: Table) -> Callable[[Sequence[Any]], Sequence[Any]] | None:
            return None if opened is None else _converted(
                opened, table.name, self._value_codec.plain_inline)

        data.checkpoints = spool_rows(tx, CHECKPOINTS, CheckpointRecord, run_id, order="id",
                                      convert=plain(CHECKPOINTS))
        keys: dict[bytes, None] = {}
        for record in data.checkpoints:
            try:
                fields = record.field_map()
            except CorruptCheckpointError:
                continue  # verify names the record
            keys.update(dict.fromkeys(self._value_codec.referenced(
                fields, lambda wanted: self._read_values(tx, wanted))))
        present = [bytes(h) for (h,) in tx.in_chunks(
            "SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", list(keys))]
        plain_keys: dict[bytes, bytes] = {}
        nodes: dict[bytes, bytes] = {}
        if opened is not None:  # values travel under their SHA-256: read each whole one
            for key in present:
                if not is_chunk_key(key):
                    value = self._read_values(tx, [key]).get(key)
                    unsealed = None if value is None else plain_key(key, value)
                    if unsealed is not None:
                        plain_keys[key] = unsealed
            # and chunks under their plain keys: each keyed one read (here, and again when
            # the archive is written), see pitstop.store.encoding.readdress
            from ..encoding.readdress import to_plain

            moved = to_plain(_field_maps(data.checkpoints),
                             lambda wanted: self._read_values(tx, wanted))
            plain_keys.update(moved.keys)
            nodes = {moved.keys[key]: node for key, node in moved.nodes.items()}
        if plain_keys:  # the spooled records again, their field maps re-addressed
            spooled = data.checkpoints
            again: RecordSpool[CheckpointRecord] = RecordSpool(CheckpointRecord)
            to_row = _converted(None, CHECKPOINTS.name, None, plain_keys)
            for record in spooled:
                again.add(to_row(record.row()))
            if isinstance(spooled, RecordSpool):
                spooled.close()
            data.checkpoints = again
        data.blobs = LazyValues(
            self, data.run.run_id, [plain_keys.get(k, k) for k in present],
            {unsealed: key for key, unsealed in plain_keys.items()}, nodes)
        data.prefixes = {
            plain_keys.get(key, key): (plain_keys.get(target, target), size)
            for key, (target, size) in self._prefix_rows(tx, present).items()
            if plain_keys.get(target, target) in data.blobs
        }
        data.inputs = spool_rows(tx, INPUTS, InputRecord, run_id, order="id",
                                 convert=plain(INPUTS))
        data.effects = spool_rows(tx, EFFECTS, EffectRecord, run_id, order="key",
                                  convert=plain(EFFECTS))
        return data

    def import_run(self, data: RunExport, *, progress: Progress | None = None) -> Run:
        data.verify()
        run = data.run
        check_id("run_id", run.run_id)
        status = RunStatus(run.status).value
        hashes = list(data.blobs)
        # A prefix is stored as one (no bytes) only if its target is stored whole; a sealed
        # store keeps every value whole (a prefix of a sealed value is not a sealed prefix).
        prefixes = {
            k: v for k, v in data.prefixes.items()
            if k in data.blobs and v[0] in data.blobs and v[0] not in data.prefixes
        } if self._value_codec.sealer is None else {}
        whole = [h for h in hashes if h not in prefixes]
        total = len(hashes) + len(data.checkpoints)

        addressed: dict[bytes, bytes] = {}
        """A sealed store's keyed address of each whole value and chunk, by its key in the
        export."""
        nodes: Mapping[bytes, bytes] = {}
        """Chunk-tree nodes written again with their children's keyed keys, by their key in
        the export (see :mod:`~pitstop.store.encoding.readdress`)."""
        if self._value_codec.sealer is not None:
            from ..encoding.readdress import to_keyed

            archived = data.blobs
            moved = to_keyed(_field_maps(data.checkpoints),
                             lambda wanted: {k: archived[k] for k in wanted if k in archived},
                             self._value_codec.chunk_keying)
            addressed.update(moved.keys)
            nodes = moved.nodes

        def write(tx: Tx) -> None:
            if tx.one("SELECT 1 FROM pitstop_runs WHERE run_id = ?", (run.run_id,)):
                raise RunExistsError(run.run_id)
            for kind, table, ids in (
                ("checkpoint", "pitstop_checkpoints", [c.id for c in data.checkpoints]),
                ("input", "pitstop_inputs", [i.id for i in data.inputs]),
            ):
                taken = tx.in_chunks(f"SELECT id, run_id FROM {table} WHERE id IN ({{in}})", ids)
                if taken:
                    taken_id, owner = taken[0]
                    raise ConflictError(
                        f"{kind} id {taken_id!r} already exists in this store (run "
                        f"{owner!r}); import the run under a new id to copy it",
                        run_id=run.run_id, expected=None, actual=taken_id,
                    )
            now = time.time()
            done = 0
            if hashes:
                self._lock_values(tx)
            part: dict[bytes, NewBlob] = {}
            held = 0
            for n, h in enumerate(whole, 1):
                # Batches bounded by count and by bytes: values read from an archive's
                # spool are in memory a batch at a time, not all at once.
                value = nodes.get(h) or data.blobs[h]
                stored = h
                if self._value_codec.sealer is not None:  # (its own keyed address)
                    stored = addressed.get(h) or self._value_codec.addressed(h, value)
                    if stored != h:
                        addressed[h] = stored
                part[stored] = blob = NewBlob(stored, value)
                held += blob.size
                if len(part) < CHUNK and held < _BATCH_BYTES and n < len(whole):
                    continue
                if self._value_codec.sealer is not None:  # (an archive's values are plain)
                    part = self._value_codec.seal_rows(part)
                packed = self._externalize(part.values())
                self._insert_values(tx, part, now, packed)
                done += len(part)
                part, held = {}, 0
                if progress:
                    progress(done, total)
            if prefixes:
                tx.many(
                    "INSERT INTO pitstop_blobs (hash, data, size, created_at, alias) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING",
                    [(h, b"", size, now, target) for h, (target, size) in prefixes.items()],
                )
                done += len(prefixes)
            tx.many(
                "INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                "ON CONFLICT (run_id, hash) DO NOTHING",
                list(dict.fromkeys((run.run_id, addressed.get(h, h)) for h in hashes)),
            )
            sealed = self._value_codec.sealed_record if self._value_codec.sealer else None
            keep: Callable[[Sequence[Any]], Sequence[Any]] = tuple
            for batch in _batches(data.checkpoints, CHUNK):
                seal = keep if sealed is None else _converted(
                    sealed, CHECKPOINTS.name, self._value_codec.sealed_inline, addressed)
                tx.many(INSERT_CHECKPOINT, [seal(c.row()) for c in batch])
                done += len(batch)
                if progress:
                    progress(done, total)
            tx.run(_INSERT_IMPORTED_RUN, _values(run, EXPORTED_RUN_COLUMNS, status=status))
            seal = keep if sealed is None else _converted(sealed, INPUTS.name)
            tx.many(
                INPUTS.insert(),
                [seal(_values(i, INPUTS.columns, run_id=run.run_id)) for i in data.inputs],
            )
            seal = keep if sealed is None else _converted(sealed, EFFECTS.name)
            tx.many(
                EFFECTS.insert(),
                [seal(_values(e, EFFECTS.columns, run_id=run.run_id)) for e in data.effects],
            )

        self._tx(write, write=True)
        return self.get_run(run.run_id)


__all__ = [
    "CheckedValues",
    "EffectRecord",
    "InputRecord",
    "RunExport",
    "RunRecord",
    "RunTransfer",
    "check_value",
    "export_problem",
]
