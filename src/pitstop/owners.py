"""Who owns a run, and whether that owner still lives: for workers, ``resume`` and displays.

An owner is named ``host:pid:token`` (:func:`owner_id`). On its own host a dead owner is
certain (its pid is gone), so its runs are taken over at once instead of after its lease
expires; elsewhere only the lease tells. Kept free of the runtime so that ``pitstop runs``
and the web inspector can say "owner gone" without importing it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from .model import Run, RunStatus


def owner_id() -> str:
    """A name for this owner that an operator can trace back to a host and process."""
    import secrets  # (only a worker names itself: not at import, see _host_name)

    return f"{_host_name()}:{os.getpid()}:{secrets.token_hex(3)}"


def _host_name() -> str:
    """This host's name, as ``socket.gethostname()`` gives it. On POSIX that is the uname
    node name, read here without importing socket and secrets (with hmac): ~5 ms of every
    ``pitstop runs``, which checks each running run's owner (#18 item 13)."""
    if sys.platform != "win32":
        return os.uname().nodename
    import socket

    return socket.gethostname()


def owner_alive(owner: str | None) -> bool | None:
    """True: a process on this host that runs. False: it ran on this host and is gone (or a
    zombie). None: another host's, or not a ``host:pid:...`` name; only its lease can tell.

    Only ever says False for a pid that does not exist; if that were ever wrong, fencing
    still rejects the old owner's writes.
    """
    if not owner:
        return None
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != _host_name() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def owner_is_dead(owner: str | None) -> bool:
    """True only if ``owner`` was a process on this host that no longer runs."""
    return owner_alive(owner) is False


LeaseState = Literal["none", "held", "released", "expired", "owner_gone"]


@dataclass(frozen=True, slots=True)
class Ownership:
    """A run's lease as an operator reads it (``pitstop runs``, the inspector)."""

    state: LeaseState
    """``none``: nobody holds it, nor needs to; ``held``: a live (or not provably dead)
    owner does; ``released``: a running run handed back (a worker stopping), for any worker
    to take; ``expired``: its owner stopped renewing (any worker may take it);
    ``owner_gone``: the lease is live but its owner's process is gone from this host (a
    worker or ``resume`` on this host takes it over at once)."""
    owner: str | None
    expires_at: datetime | None

    @property
    def owner_gone(self) -> bool:
        """An owner held the run and is gone: its lease expired or its process died."""
        return self.state in ("expired", "owner_gone")


def ownership(run: Run, now: datetime | None = None) -> Ownership:
    """Who holds ``run``'s lease and whether they are still there."""
    if run.owner is None or run.lease_expires_at is None:
        state: LeaseState = "released" if run.status is RunStatus.RUNNING else "none"
        return Ownership(state, run.owner, run.lease_expires_at)
    if run.lease_expires_at <= (now or datetime.now(UTC)):
        return Ownership("expired", run.owner, run.lease_expires_at)
    if owner_is_dead(run.owner):
        return Ownership("owner_gone", run.owner, run.lease_expires_at)
    return Ownership("held", run.owner, run.lease_expires_at)


__all__ = ["LeaseState", "Ownership", "owner_alive", "owner_id", "owner_is_dead", "ownership"]
