"""This process's id, cached: stores check it on every transaction to notice a fork.

``os.getpid()`` is a system call on current glibc, and a checkpoint-per-step loop asks for
it on every save; the cached value is refreshed in a forked child before anything runs there.
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid  # noqa: PLW0603 - the cache is the point
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """``os.getpid()`` without the system call."""
    return _pid


__all__ = ["current_pid"]
