"""The ``pitstop`` command line: inspect, steer and maintain runs in any store.

Operators run it in loops, over ssh and from scripts, so it must answer fast: importing this
package imports nothing; :func:`main` loads click and the store layer, rich is loaded only
when printing to a terminal, and the workflow runtime only by ``resume`` and ``fork``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console-script entry point: run the command line and exit with its status."""
    from .app import run

    raise SystemExit(run(argv))


__all__ = ["main"]
