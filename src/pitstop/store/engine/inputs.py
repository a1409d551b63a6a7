"""Inputs: what the outside world sends a waiting run (an approval, a callback payload).

An input is stored durably in ``pitstop_inputs`` the moment it is sent, its payload framed
and content-hashed like a field value; the run's next checkpoint marks it consumed
(``consumed_inputs``). Sending the last input a run waits for makes it runnable at once
(``wake_at`` = now) and wakes a worker where the backend can (``_notify``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...errors import InputError, RunNotFoundError
from ...ids import new_id
from ...model import RunStatus, utc
from ..contract.base import Input
from .backend import SqlBackend, Tx
from .schema import check_id


class Inputs(SqlBackend):
    """Sending and reading inputs (a part of ``SqlStore``)."""

    def send(self, run_id: str, name: str, payload: Any) -> Input:
        check_id("input name", name)
        if name.startswith("child:"):
            raise InputError("inputs named child:... are delivered by the child runs "
                             "themselves when they finish", run_id=run_id, name=name)
        blob = self._value_codec.encode_value(payload, run_id=run_id, path=f"input.{name}")
        input_id = new_id()
        now = time.time()

        def write(tx: Tx) -> None:
            row = tx.one(
                "SELECT status, waiting_for FROM pitstop_runs WHERE run_id = ?"
                + self.dialect.lock_row,
                (run_id,),
            )
            if row is None:
                raise RunNotFoundError(run_id)
            status_value, waiting_json = row
            status = RunStatus(status_value)
            waiting = json.loads(waiting_json) if waiting_json else []
            if status.finished:
                raise InputError(f"the run has finished ({status.value})", run_id=run_id,
                                 name=name)
            if status != RunStatus.WAITING or name not in waiting:
                expected = ", ".join(map(repr, waiting)) or "nothing"
                raise InputError(
                    f"the run is {status.value} and waits for {expected}", run_id=run_id,
                    name=name,
                )
            _check_schema(tx, run_id, name, payload)
            pending = set(
                tx.column(
                    "SELECT name FROM pitstop_inputs WHERE run_id = ? AND consumed_by IS NULL",
                    (run_id,),
                )
            )
            if name in pending:
                raise InputError(
                    "an input of that name was already delivered and is not consumed yet",
                    run_id=run_id,
                    name=name,
                )
            tx.run(
                "INSERT INTO pitstop_inputs (id, run_id, name, payload, hash, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (input_id, run_id, name, blob.data, blob.hash, now),
            )
            if pending.union([name]).issuperset(waiting):
                tx.run(
                    "UPDATE pitstop_runs SET wake_at = ?, updated_at = ? WHERE run_id = ?",
                    (now, now, run_id),
                )
                self._notify(tx, run_id)

        self._tx(write, write=True)
        return Input(input_id, run_id, name, payload, utc(now))  # type: ignore[arg-type]

    def inputs(self, run_id: str, *, pending: bool = True) -> dict[str, Input]:
        sql = (
            "SELECT id, name, payload, hash, created_at, consumed_by FROM pitstop_inputs "
            "WHERE run_id = ?"
        )
        if pending:
            sql += " AND consumed_by IS NULL"
        rows = self._query(sql + " ORDER BY id", (run_id,))
        out: dict[str, Input] = {}
        for input_id, name, payload, h, created, consumed in rows:
            value = self._value_codec.decode_value(
                bytes(payload), bytes(h), run_id=run_id, field=f"input:{name}"
            )
            out[name] = Input(input_id, run_id, name, value, utc(created), consumed)  # type: ignore[arg-type]
        return out


__all__ = ["Inputs"]


def _check_schema(tx: Tx, run_id: str, name: str, payload: Any) -> None:
    """Refuse a payload that does not fit the schema the waiting step recorded for it
    (``input_schema=``): the same check whoever sends (Python, ``pitstop send``, the
    inspector), with no need of the workflow's code."""
    metadata = tx.scalar("SELECT c.metadata FROM pitstop_runs r JOIN pitstop_checkpoints c "
                         "ON c.id = r.head_id WHERE r.run_id = ?", (run_id,))
    if metadata is None:
        return
    schemas = json.loads(metadata).get("input_schemas")
    schema = schemas.get(name) if isinstance(schemas, dict) else None
    if not isinstance(schema, dict):
        return
    from ...schemas import plain, problem

    found = problem(schema, plain(payload), name)
    if found is not None:
        field, what = found
        raise InputError(f"field {field!r} {what}; nothing was stored", run_id=run_id,
                         name=name, field=field)
