"""Ownership of runs: leases with fencing tokens, and workers claiming runnable runs.

A lease is two columns of the run's row (``lease_owner``, ``lease_expires``) and its fencing
token a third (``fence``), which grows each time the run changes hands. Every write made
under a lease (a save, ``update_run``) checks owner and token in its own statement, so a
write from an owner whose lease was taken over fails with
:class:`~pitstop.LeaseLostError` instead of forking the run's history.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from ...errors import LeaseLostError, RunBusyError, RunNotFoundError
from ..contract.base import Lease
from .backend import SqlBackend, Tx, placeholders


class _Claimed(NamedTuple):
    """A run a claim leased, as its UPDATE returns it."""

    run_id: str
    fence: int
    workflow: str | None
    priority: int
    due: float
    """When it became runnable: its wake time, else its creation (the claim order)."""


class Leases(SqlBackend):
    """Leases and claims (a part of ``SqlStore``)."""

    def acquire(
        self, run_id: str, owner: str, *, ttl: float = 30.0, takeover: str | None = None
    ) -> Lease:
        def write(tx: Tx) -> Lease:
            if self.dialect.bounded_lock_wait:
                tx.run(self.dialect.bounded_lock_wait)
            try:
                row = tx.one(
                    "SELECT lease_owner, lease_expires, fence FROM pitstop_runs WHERE run_id = ?"
                    + self.dialect.lock_row,
                    (run_id,),
                )
            except Exception as exc:
                if self._lock_wait_expired(exc):
                    # Whoever holds the row lock may be alive (a long save) or cut off
                    # mid-transaction; either way the run is not ours to take now.
                    raise RunBusyError(run_id, owner=None, expires_at=None) from None
                raise
            if row is None:
                raise RunNotFoundError(run_id)
            now = time.time()
            holder, expires, fence = row
            live = holder is not None and expires is not None and expires > now
            if live and holder == takeover:
                live = False
            if live and holder != owner:
                raise RunBusyError(run_id, owner=holder, expires_at=expires)
            token = fence if live else fence + 1
            tx.run(
                "UPDATE pitstop_runs SET lease_owner = ?, lease_expires = ?, fence = ? "
                "WHERE run_id = ?",
                (owner, now + ttl, token, run_id),
            )
            return Lease(run_id, owner, token, now + ttl)

        return self._tx(write, write=True)

    def renew(self, lease: Lease, *, ttl: float = 30.0) -> Lease:
        expires = time.time() + ttl

        def write(tx: Tx) -> None:
            updated = tx.run(
                "UPDATE pitstop_runs SET lease_expires = ? "
                "WHERE run_id = ? AND lease_owner = ? AND fence = ?",
                (expires, lease.run_id, lease.owner, lease.token),
            ).rowcount
            if not updated:
                raise LeaseLostError(
                    lease.run_id,
                    owner=lease.owner,
                    token=lease.token,
                    current_token=tx.scalar(
                        "SELECT fence FROM pitstop_runs WHERE run_id = ?", (lease.run_id,)
                    ),
                )

        self._tx(write, write=True)
        return Lease(lease.run_id, lease.owner, lease.token, expires, lease.workflow)

    def release(self, lease: Lease) -> None:
        def write(tx: Tx) -> None:
            released = tx.run(
                "UPDATE pitstop_runs SET lease_owner = NULL, lease_expires = NULL "
                "WHERE run_id = ? AND lease_owner = ? AND fence = ?",
                (lease.run_id, lease.owner, lease.token),
            ).rowcount
            if released and tx.one(
                "SELECT 1 FROM pitstop_runs WHERE run_id = ? AND status IN ('queued', 'running')",
                (lease.run_id,),
            ):
                self._notify(tx, lease.run_id)  # given back unfinished: someone may take it

        self._tx(write, write=True)

    def claim(
        self,
        owner: str,
        *,
        workflows: Iterable[str] | None = None,
        limit: int = 1,
        ttl: float = 30.0,
        waiting_only: bool = False,
    ) -> list[Lease]:
        names = None if workflows is None else list(workflows)
        if names == []:
            return []

        now = time.time()
        sql, params = self._claim_statement(owner, names, limit, now, ttl, waiting_only)
        claimed = [_Claimed(*row) for row in self._claim_write(sql, params)]
        claimed.sort(key=lambda run: (-run.priority, run.due))
        return [Lease(run.run_id, owner, run.fence, now + ttl, run.workflow) for run in claimed]


    def _claim_statement(
        self, owner: str, names: list[str] | None, limit: int, now: float, ttl: float,
        waiting_only: bool = False,
    ) -> tuple[str, list[Any]]:
        """The one statement that picks and leases up to ``limit`` runs (see :meth:`claim`)."""
        # Two index-ordered scans (pitstop_runs_runnable, pitstop_runs_waking), so a claim
        # stays cheap however many runs are queued or waiting, merged by priority; the rows
        # picked are leased in the same statement (one round trip on PostgreSQL, where each
        # scan skips rows other workers are claiming at this moment).
        arms: list[str] = []
        params: list[Any] = []
        for where, order, first in (
            ("status IN ('queued', 'running')", "priority DESC, created_at", []),
            ("status = 'waiting' AND wake_at <= ?", "wake_at", [now]),
        )[1 if waiting_only else 0:]:
            arm = (
                "SELECT run_id, priority AS p, COALESCE(wake_at, created_at) AS t "
                f"FROM pitstop_runs WHERE {where} AND COALESCE(lease_expires, 0) < ?"
            )
            params += [*first, now]
            if names is None:
                arm += " AND workflow IS NOT NULL"
            else:
                arm += f" AND workflow IN ({placeholders(len(names))})"
                params += names
            arms.append(f"SELECT * FROM ({arm} ORDER BY {order} LIMIT ?"
                        f"{self.dialect.skip_locked}) arm{len(arms)}")
            params.append(limit)
        # A claimed queued run is running from here on: listings must not show a run a
        # worker holds as still waiting for one (its first checkpoint may be a while off).
        sql = (
            "UPDATE pitstop_runs SET lease_owner = ?, lease_expires = ?, fence = fence + 1, "
            "status = CASE WHEN status = 'queued' THEN 'running' ELSE status END "
            "WHERE run_id IN (SELECT run_id FROM (" + " UNION ALL ".join(arms) + ") picked "
            "ORDER BY p DESC, t LIMIT ?) "
            "RETURNING run_id, fence, workflow, priority, COALESCE(wake_at, created_at)"
        )
        return sql, [owner, now + ttl, *params, limit]


__all__ = ["Leases"]
