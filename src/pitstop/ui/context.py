"""What every request of one inspector app shares: the store, the guard, the actions."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from ..store import Store
from .actions import ActionError, Actions
from .live import Ticker
from .security import Guard, Identity

IDENTITY = "pitstop_identity"
"""Where the auth middleware leaves the caller's :class:`Identity` in the ASGI scope."""


@dataclass(slots=True)
class UI:
    store: Store
    guard: Guard
    actions: Actions
    read_only: bool
    ticker: Ticker
    max_body: int = 1 << 20
    """Bytes a request body may have (413 above): an input's payload, a fork's edits."""

    def writable(self) -> None:
        if self.read_only:
            raise ActionError(403, "this inspector is read-only (started with --read-only)")


def ui_of(request: Request) -> UI:
    found: UI = request.app.state.pitstop_ui
    return found


def client_of(request: Request) -> str:
    """The client's address, what failed logins are counted by."""
    return request.client.host if request.client is not None else "unknown"


def who(request: Request) -> Identity:
    identity: Identity = request.scope[IDENTITY]
    return identity


__all__ = ["IDENTITY", "UI", "client_of", "ui_of", "who"]
