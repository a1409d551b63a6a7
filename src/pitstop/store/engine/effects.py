"""Effect records: results of side effects, recorded once per run and key.

``ctx.effect`` (and integrations' pending writes) keep a result under a key so a step that
runs again after a crash gets the recorded result instead of repeating the effect. A record
names the checkpoint its step started from: pruning that checkpoint drops the record.
Results are framed and content-hashed like field values and verified on read.

Records *attached* to a checkpoint (:meth:`Effects.attach`, ``Store.save(attach=...)``) are
kept in the checkpoint's row instead (:mod:`pitstop.store.encoding.attached`), or, when the
checkpoint is not written yet, as effect records naming it; :meth:`Effects.attachments` reads both.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple

from ...errors import SerializationError
from ..encoding.attached import frame_records, merged
from .backend import CHUNK, Dialect, SqlBackend, Tx
from .schema import APPEND_ATTACHED, EFFECTS, SELECT_ATTACHED

_SELECT_RESULT = "SELECT result, hash FROM pitstop_effects WHERE run_id = ? AND key = ?"
_RECORD_ONCE = EFFECTS.insert() + " ON CONFLICT (run_id, key) DO NOTHING"
_ONE_STATEMENT_ROWS = CHUNK // len(EFFECTS.columns)
"""Effect rows one INSERT takes (its parameters stay within a chunk)."""


@lru_cache(maxsize=64)
def _insert_effects_text(count: int, replace: bool) -> str:
    conflict = (
        "DO UPDATE SET checkpoint_id = excluded.checkpoint_id, result = excluded.result, "
        "hash = excluded.hash, created_at = excluded.created_at"
        if replace
        else "DO NOTHING"
    )
    row = "(" + ", ".join("?" * len(EFFECTS.columns)) + ")"
    return (
        f"INSERT INTO pitstop_effects ({EFFECTS.column_list()}) VALUES "
        + ", ".join([row] * count)
        + f" ON CONFLICT (run_id, key) {conflict}"
    )


def _insert_effects_sql(
    rows: Sequence[tuple[Any, ...]], replace: bool
) -> tuple[str, list[Any]]:
    """One multi-row INSERT of effect rows (the SQL text cached by row count)."""
    return _insert_effects_text(len(rows), replace), [p for row in rows for p in row]


_APPEND_ATTACHED_SQL: dict[str, str] = {}


def append_attached_sql(dialect: Dialect) -> str:
    """:data:`~pitstop.store.engine.schema.APPEND_ATTACHED` with the dialect's column type.

    Cached by the dialect's name, not by the dialect (as ``lru_cache`` would): a dialect is
    a frozen dataclass whose generated ``__hash__`` hashes every field, and this runs on
    every step that carries a LangGraph step's pending writes."""
    sql = _APPEND_ATTACHED_SQL.get(dialect.name)
    if sql is None:
        sql = _APPEND_ATTACHED_SQL[dialect.name] = dialect.ddl(APPEND_ATTACHED)
    return sql


class EffectRow(NamedTuple):
    """A ``pitstop_effects`` row to insert, in :data:`EFFECTS` column order (a tuple, so it
    is the INSERT's parameters as it stands; its fields name the columns for the readers)."""

    run_id: str
    key: str
    checkpoint_id: str | None
    result: bytes
    hash: bytes
    created_at: float


assert EffectRow._fields == EFFECTS.columns

_KEY_RESULT_HASH = attrgetter("key", "result", "hash")
"""An effect row's ``(key, result, hash)``, as :func:`frame_records` takes it (a C call
instead of a generator's frame: a LangGraph step attaches its writes so)."""


class Attachment(NamedTuple):
    """Records to attach to one checkpoint in a write (see :meth:`Effects.attach`)."""

    checkpoint_id: str
    frames: bytes
    """The records framed for the checkpoint's row."""
    rows: Sequence[EffectRow]
    """The same records as ``pitstop_effects`` rows: written if the row is not there."""
    replace: bool


class Effects(SqlBackend):
    """Recording and reading effect results (a part of ``SqlStore``)."""

    def get_effect(self, run_id: str, key: str) -> tuple[bool, Any]:
        row = self._tx(lambda tx: tx.one(_SELECT_RESULT, (run_id, key)))
        if row is None:
            return False, None
        return True, self._decode_result(run_id, key, row)

    def record_effect(
        self, run_id: str, key: str, result: Any, *, checkpoint_id: str | None = None
    ) -> Any:
        return self.record_effect_first(run_id, key, result, checkpoint_id=checkpoint_id)[1]

    def record_effect_first(
        self, run_id: str, key: str, result: Any, *, checkpoint_id: str | None = None
    ) -> tuple[bool, Any]:
        blob = self._value_codec.encode_value(result, run_id=run_id, path=f"effect[{key!r}]")

        def write(tx: Tx) -> Any:
            inserted = tx.run(
                _RECORD_ONCE,
                (run_id, key, checkpoint_id, blob.data, blob.hash, time.time()),
            ).rowcount
            if inserted:
                return None
            return tx.one(_SELECT_RESULT, (run_id, key))

        existing = self._tx(write, write=True)
        if existing is None:
            return True, result
        return False, self._decode_result(run_id, key, existing)

    def _decode_result(self, run_id: str, key: str, row: tuple[Any, Any]) -> Any:
        data, h = row
        return self._value_codec.decode_value(
            bytes(data), bytes(h), run_id=run_id, field=f"effect:{key}"
        )

    def record_effects(
        self,
        run_id: str,
        results: Mapping[str, Any],
        *,
        checkpoint_id: str | None = None,
        replace: bool = False,
    ) -> None:
        rows = self._effect_rows(run_id, results, checkpoint_id, time.time())
        if rows:
            self._write_effect_rows(rows, replace=replace)

    def _write_effect_rows(self, rows: Sequence[EffectRow], *, replace: bool) -> None:
        """Backend hook, optional: insert effect rows (of one run, one checkpoint, one time)
        atomically. Default: one multi-row INSERT autocommitted, a transaction of several
        when there are more rows than one statement's parameters take. PostgreSQL sends one
        statement of constant text whatever the row count (``ctx.map`` writes its batches of
        finished items here)."""
        if len(rows) <= _ONE_STATEMENT_ROWS:
            # One statement, atomic by itself: no BEGIN/COMMIT round trips.
            sql, params = _insert_effects_sql(rows, replace)
            self._autocommit_write(sql, params)
            return
        self._tx(lambda tx: self._insert_effects(tx, rows, replace=replace), write=True)

    def _effect_rows(
        self, run_id: str, results: Mapping[str, Any], checkpoint_id: str | None, now: float
    ) -> list[EffectRow]:
        """``pitstop_effects`` rows for ``results``, their values encoded like fields."""
        # (The property only until the codec is made: a LangGraph step attaches records.)
        encode = (self._codec or self._value_codec).encode_value
        rows = []
        for key, value in results.items():
            try:
                blob = encode(value, run_id=run_id, path="")
            except SerializationError as exc:
                # The key's place is named only now: its repr on every record (a LangGraph
                # step's pending writes) cost more than encoding a small one.
                raise exc.located(path=f"effect[{key!r}]{exc.path or ''}") from exc.__cause__
            # (tuple.__new__, fields in order: the named tuple without its Python __new__.)
            rows.append(tuple.__new__(EffectRow,
                                      (run_id, key, checkpoint_id, blob.data, blob.hash, now)))
        return rows

    @staticmethod
    def _insert_effects(tx: Tx, rows: Sequence[tuple[Any, ...]], *, replace: bool) -> None:
        """Insert effect rows in an open transaction (a statement per chunk of rows)."""
        for i in range(0, len(rows), _ONE_STATEMENT_ROWS):
            tx.run(*_insert_effects_sql(rows[i : i + _ONE_STATEMENT_ROWS], replace))

    # -- records attached to a checkpoint -----------------------------------------------------

    def attach(
        self,
        run_id: str,
        checkpoint_id: str,
        records: Mapping[str, Any],
        *,
        replace: bool = False,
    ) -> None:
        if not records:
            return
        attachment = self._attachment(run_id, checkpoint_id, records, time.time(), replace)
        self._tx(lambda tx: self._write_attachment(tx, run_id, attachment), write=True)

    def _attachment(
        self, run_id: str, checkpoint_id: str, records: Mapping[str, Any], now: float,
        replace: bool,
    ) -> Attachment:
        rows = self._effect_rows(run_id, records, checkpoint_id, now)
        frames = frame_records(map(_KEY_RESULT_HASH, rows), replace=replace)
        # (tuple.__new__, fields in order: the named tuple without its Python __new__.)
        return tuple.__new__(Attachment, (checkpoint_id, frames, rows, replace))

    def _write_attachment(self, tx: Tx, run_id: str, attachment: Attachment) -> None:
        """Append to the checkpoint's row in an open transaction; effect records naming the
        checkpoint if it is not written (yet: LangGraph may deliver a step's writes first)."""
        frames = attachment.frames
        appended = tx.run(
            append_attached_sql(self.dialect),
            (frames, frames, run_id, attachment.checkpoint_id),
        ).rowcount
        if not appended:
            self._insert_effects(tx, attachment.rows, replace=attachment.replace)

    def attachments(self, run_id: str, checkpoint_id: str) -> dict[str, Any]:
        rows = self._query(SELECT_ATTACHED, (run_id, checkpoint_id, run_id, checkpoint_id))
        if not rows:
            return {}
        found = merged(rows, run_id=run_id, checkpoint_id=checkpoint_id)
        return {key: self._decode_result(run_id, key, found[key]) for key in sorted(found)}

    def effects(self, run_id: str, *, checkpoint_id: str | None = None) -> dict[str, Any]:
        sql = "SELECT key, result, hash FROM pitstop_effects WHERE run_id = ?"
        params: list[Any] = [run_id]
        if checkpoint_id is not None:
            sql += " AND checkpoint_id = ?"
            params.append(checkpoint_id)
        # Sorted here, not with ORDER BY key: that makes SQLite walk all of the run's records
        # in key order (its primary key) instead of using the checkpoint index, which costs
        # O(effects of the run) per call; and Python's order is the same on every backend.
        rows = {key: (data, h) for key, data, h in self._query(sql, params)}
        return {key: self._decode_result(run_id, key, rows[key]) for key in sorted(rows, key=str)}


__all__ = ["Effects"]
