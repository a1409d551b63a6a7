"""Keeps this process's run leases alive while their runs execute.

One daemon thread per process renews every tracked lease at a third of its time to live, so
a step that runs for an hour keeps its run, and a process that dies stops renewing: after the
TTL another worker may take the run over (its writes then fence this one's off).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from ..errors import LeaseLostError, PitstopError, RunBusyError
from ..owners import owner_id, owner_is_dead
from ..store import Lease, Store

log = logging.getLogger("pitstop.runtime")


# Owners of this process that gave up mid-call (a start whose commit may or may not have
# happened): a lease one of them may hold is taken over at once, as a dead process's is.
_abandoned: set[str] = set()
_ABANDONED_MAX = 1000


def abandon(owner: str) -> None:
    """Declare that ``owner`` (of this process) will never use a lease it may hold."""
    if len(_abandoned) >= _ABANDONED_MAX:
        _abandoned.pop()
    _abandoned.add(owner)


def acquire(store: Store, run_id: str, owner: str, ttl: float) -> Lease:
    """``store.acquire``, taking over at once from an owner whose process is known dead (or
    that this process abandoned)."""
    try:
        return store.acquire(run_id, owner, ttl=ttl)
    except RunBusyError as busy:
        if busy.owner in _abandoned:
            return store.acquire(run_id, owner, ttl=ttl, takeover=busy.owner)
        if not owner_is_dead(busy.owner):
            raise
        log.warning("run %r: owner %s is dead; taking the run over", run_id, busy.owner)
        return store.acquire(run_id, owner, ttl=ttl, takeover=busy.owner)


@dataclass(eq=False)
class Held:
    store: Store
    lease: Lease
    ttl: float
    lost: bool = False
    renewed_at: float = field(default_factory=time.monotonic)
    valid_until: float = 0.0
    """This process's own (monotonic) bound on the lease: the start of the last renewal that
    succeeded plus the TTL. The server counts the TTL from when it served that renewal, later
    than its start, so no other owner can have taken the run before this moment. Before the
    first renewal: two thirds of the TTL from tracking (the acquisition's round trip is not
    known here)."""

    def __post_init__(self) -> None:
        if not self.valid_until:
            self.valid_until = self.renewed_at + self.ttl * 2 / 3

    def expired(self) -> bool:
        """Whether this process can no longer be sure it holds the run: the lease was lost,
        or no renewal succeeded within its TTL (a network partition, a stalled store)."""
        return self.lost or time.monotonic() >= self.valid_until


class LeaseKeeper:
    def __init__(self) -> None:
        self._held: set[Held] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._pid = 0

    def track(self, store: Store, lease: Lease, ttl: float) -> Held:
        held = Held(store, lease, ttl)
        with self._lock:
            self._held.add(held)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._loop, name="pitstop-leases", daemon=True
                )
                self._thread.start()
            self._wake.notify()
        return held

    def untrack(self, held: Held) -> None:
        with self._lock:
            self._held.discard(held)

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._held:
                    self._wake.wait(timeout=5.0)
                    if not self._held:
                        continue
                now = time.monotonic()
                due = [h for h in self._held if now - h.renewed_at >= h.ttl / 3]
                wait = min((h.ttl / 3 - (now - h.renewed_at) for h in self._held), default=5.0)
            for held in due:
                started = time.monotonic()
                try:
                    held.lease = held.store.renew(held.lease, ttl=held.ttl)
                    held.renewed_at = time.monotonic()
                    held.valid_until = started + held.ttl
                except LeaseLostError:
                    held.lost = True
                    self.untrack(held)
                    log.warning("run %r: lease lost to another owner", held.lease.run_id)
                except (PitstopError, OSError) as exc:  # store briefly unreachable: try again
                    log.warning("run %r: lease renewal failed: %s", held.lease.run_id, exc)
                    held.renewed_at = time.monotonic() - held.ttl / 3 + 1.0
            if due:
                continue
            with self._lock:
                self._wake.wait(timeout=max(0.05, wait))


keeper = LeaseKeeper()

__all__ = ["Held", "LeaseKeeper", "abandon", "acquire", "keeper", "owner_id", "owner_is_dead"]
