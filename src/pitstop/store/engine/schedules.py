"""Schedules' rows (a part of ``SqlStore``): what ``wf.schedule`` writes and workers read.

The store keeps definitions and where each schedule stands; when ticks fall and which run
each starts is decided by :mod:`pitstop.runtime.schedules`.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import ScheduleError
from .backend import SqlBackend, Tx
from .schema import SCHEDULES, ScheduleRow

_SELECT = f"SELECT {SCHEDULES.column_list()} FROM pitstop_schedules"


class Schedules(SqlBackend):
    """Storing, listing, pausing and advancing schedules."""

    def schedule_put(
        self, name: str, workflow: str, cron: str, timezone: str, input: Any, *,
        catchup: str, overlap: str, next_tick: float,
    ) -> ScheduleRow:
        """Create the schedule, or replace the definition of the one of that name (it then
        starts again from ``next_tick``; its last run is kept). ``input`` is stored like a
        field value (no pickle unless the store's serializer is)."""
        blob = self._value_codec.encode_value(input, run_id=f"schedule {name}", path="input")
        row = ScheduleRow(name, workflow, cron, timezone, blob.data, blob.hash, catchup,
                          overlap, 0, time.time(), next_tick, None)
        self._tx(lambda tx: tx.run(
            SCHEDULES.insert() + " ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, "
            "cron = excluded.cron, timezone = excluded.timezone, input = excluded.input, "
            "input_hash = excluded.input_hash, catchup = excluded.catchup, "
            "overlap = excluded.overlap, paused = excluded.paused, "
            "next_tick = excluded.next_tick",
            (row.name, row.workflow, row.cron, row.timezone, row.input, row.input_hash,
             row.catchup, row.overlap, row.paused, row.created_at, row.next_tick, row.last_run),
        ), write=True)
        return row

    def schedule_input(self, row: ScheduleRow) -> Any:
        """The input a schedule's runs start with (verified against its hash)."""
        return self._value_codec.decode_value(row.input, row.input_hash, field="input",
                                              run_id=f"schedule {row.name}")

    def schedule_rows(
        self, *, workflows: list[str] | None = None, name: str | None = None
    ) -> list[ScheduleRow]:
        """Schedules by name (only those of ``workflows``, or the one ``name``)."""
        sql, params = _SELECT, []
        if name is not None:
            sql += " WHERE name = ?"
            params.append(name)
        elif workflows is not None:
            if not workflows:
                return []
            sql += " WHERE workflow IN (" + ", ".join("?" * len(workflows)) + ")"
            params.extend(workflows)
        rows = self._query(sql + " ORDER BY name", params)
        out = []
        for row in rows:
            values: list[Any] = [bytes(v) if isinstance(v, memoryview) else v for v in row]
            out.append(ScheduleRow(*values))
        return out

    def schedule_delete(self, name: str) -> None:
        """Remove a schedule (its runs stay); ScheduleError if there is none of that name."""
        if not self._tx(lambda tx: tx.run(
                "DELETE FROM pitstop_schedules WHERE name = ?", (name,)).rowcount, write=True):
            raise ScheduleError("no such schedule", schedule=name)

    def schedule_pause(self, name: str, paused: bool, next_tick: float | None = None) -> None:
        """Pause (no tick starts a run) or resume a schedule; resuming sets ``next_tick``."""
        def write(tx: Tx) -> Any:
            if next_tick is None:
                return tx.run("UPDATE pitstop_schedules SET paused = ? WHERE name = ?",
                              (int(paused), name)).rowcount
            return tx.run("UPDATE pitstop_schedules SET paused = ?, next_tick = ? WHERE name = ?",
                          (int(paused), next_tick, name)).rowcount

        if not self._tx(write, write=True):
            raise ScheduleError("no such schedule", schedule=name)

    def schedule_advance(
        self, name: str, expected: float, next_tick: float, last_run: str | None
    ) -> bool:
        """Move ``name``'s next tick from ``expected`` to ``next_tick`` (compare-and-set:
        False if another worker moved it first), recording the run of the last tick started
        (None: keep the one recorded)."""
        return bool(self._tx(lambda tx: tx.run(
            "UPDATE pitstop_schedules SET next_tick = ?, last_run = COALESCE(?, last_run) "
            "WHERE name = ? AND next_tick = ?",
            (next_tick, last_run, name, expected),
        ).rowcount, write=True))


__all__ = ["Schedules"]
