"""Child runs: the link from a run to the run whose step started it, and the parent's wake-up.

A child names its parent in ``pitstop_runs.parent_run`` (indexed), so a parent's children
are one index range, however many runs the store holds. A parent waiting for children waits
for inputs named ``child:<child run id>``; the transaction that finishes a child (its
completing or failing checkpoint, or its cancellation) delivers that input to the parent, and
the delivery that completes what the parent waits for makes it runnable (``wake_at`` = now)
and wakes a worker (``_notify``): the parent is woken once, by its last child, and nothing
polls the children. A child may finish before its parent's waiting checkpoint is written;
that checkpoint then finds every input already there and makes the run runnable itself.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...ids import new_id
from ...model import Run, RunStatus
from .backend import SqlBackend, Tx
from .schema import RUNS, SELECT_RUN, RunRow

CHILD_INPUT = "child:"
"""The prefix of the input a finished child delivers to its parent (then its run id)."""

_FINISHED = tuple(s.value for s in RunStatus if s.finished)

_SUMMARY = (
    # The first children (whole rows, a NULL count), then one row per status (NULL columns
    # but the status, and the count): one statement, one round trip.
    f"SELECT {RUNS.column_list()}, NULL FROM ({SELECT_RUN} WHERE parent_run = ? "
    "ORDER BY created_at, run_id LIMIT ?) first_children UNION ALL SELECT "
    + ", ".join("status" if c == "status" else "NULL" for c in RUNS.columns)
    + ", COUNT(*) FROM pitstop_runs WHERE parent_run = ? GROUP BY status"
)


def child_input(child_id: str) -> str:
    """The name of the input ``child_id`` delivers to its parent when it finishes."""
    return CHILD_INPUT + child_id


class Children(SqlBackend):
    """Listing a run's children, delivering their outcome (a part of ``SqlStore``)."""

    def children(self, run_id: str, *, limit: int | None = None) -> list[Run]:
        """The runs ``run_id``'s steps started (``ctx.run_child``), oldest first."""
        sql = SELECT_RUN + " WHERE parent_run = ? ORDER BY created_at, run_id"
        params: list[Any] = [run_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [RunRow(*row).to_run() for row in self._query(sql, params)]

    def children_summary(self, run_id: str, *, first: int = 20) -> tuple[dict[str, int],
                                                                         list[Run]]:
        rows = self._query(_SUMMARY, (run_id, first, run_id))
        width = len(RUNS.columns)
        counts = {str(row[RUNS.columns.index("status")]): int(row[width])
                  for row in rows if row[width] is not None}
        children = [RunRow(*row[:width]).to_run() for row in rows if row[width] is None]
        return counts, children

    def _lock_parent(self, tx: Tx, parent_id: str) -> None:
        """Lock a parent's row before its child's (PostgreSQL; SQLite writes one at a time).

        Rows are always locked parents first: a cancel locks the parent, then its children
        (and theirs); a transaction finishing a child locks the parent before the child's own
        row. Taken the other way round, a child completing while its parent is cancelled
        would wait on each other until PostgreSQL's deadlock detector aborts one.
        """
        if self.dialect.lock_row:
            tx.one("SELECT 1 FROM pitstop_runs WHERE run_id = ?" + self.dialect.lock_row,
                   (parent_id,))

    def _deliver_to_parent(
        self,
        tx: Tx,
        child_id: str,
        parent_id: str,
        status: RunStatus,
        checkpoint_id: str | None,
        error: Any,
    ) -> None:
        """In the transaction finishing ``child_id``: give its outcome to the parent, and
        wake the parent if that was the last input it waits for."""
        row = tx.one(
            "SELECT status, waiting_for FROM pitstop_runs WHERE run_id = ?"
            + self.dialect.lock_row,
            (parent_id,),
        )
        if row is None:
            return  # the parent is gone
        status_value, waiting_for = row
        if RunStatus(status_value).finished:
            return  # the parent is done (a cancelled parent cancels its children)
        name = child_input(child_id)
        pending = set(
            tx.column(
                "SELECT name FROM pitstop_inputs WHERE run_id = ? AND consumed_by IS NULL",
                (parent_id,),
            )
        )
        if name not in pending:
            payload = {"run_id": child_id, "status": status.value,
                       "checkpoint_id": checkpoint_id, "error": error}
            blob = self._value_codec.encode_value(payload, run_id=parent_id, path=f"input.{name}")
            tx.run(
                "INSERT INTO pitstop_inputs (id, run_id, name, payload, hash, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (new_id(), parent_id, name, blob.data, blob.hash, time.time()),
            )
            pending.add(name)
        if status_value == RunStatus.WAITING.value:
            self._wake_if_delivered(tx, parent_id, waiting_for, pending)

    def _wake_if_delivered(
        self, tx: Tx, run_id: str, waiting_json: str | None, pending: set[str] | None = None
    ) -> None:
        """Make a waiting run runnable now if every input it waits for is delivered."""
        waiting = json.loads(waiting_json) if waiting_json else []
        if not waiting:
            return
        if pending is None:
            pending = set(
                tx.column(
                    "SELECT name FROM pitstop_inputs WHERE run_id = ? AND consumed_by IS NULL",
                    (run_id,),
                )
            )
        if pending.issuperset(waiting):
            now = time.time()
            tx.run(
                "UPDATE pitstop_runs SET wake_at = ?, updated_at = ? WHERE run_id = ?",
                (now, now, run_id),
            )
            self._notify(tx, run_id)

    def _cancel_children(self, tx: Tx, run_id: str, now: float) -> None:
        """Cancel the unfinished runs below ``run_id`` (children, theirs, ...), breaking any
        lease on them so their owners' next writes are refused."""
        finished = ", ".join("?" * len(_FINISHED))
        parents = [run_id]
        while parents:
            below: list[str] = []
            for parent in parents:
                below += tx.column(
                    "SELECT run_id FROM pitstop_runs WHERE parent_run = ? "
                    f"AND status NOT IN ({finished})" + self.dialect.lock_row,
                    (parent, *_FINISHED),
                )
            if below:
                tx.run_chunks(
                    "UPDATE pitstop_runs SET status = ?, updated_at = ?, lease_owner = NULL, "
                    "lease_expires = NULL, fence = fence + 1, wake_at = NULL "
                    "WHERE run_id IN ({in})",
                    below,
                    RunStatus.CANCELLED.value,
                    now,
                )
            parents = below


__all__ = ["CHILD_INPUT", "Children", "child_input"]
