"""The ``pitstop`` command line's entry point: every command, and every failure turned into one
line on stderr and an exit status.

The commands live in one module per area, imported when their command is run (see
:class:`pitstop.cli.group._Commands`); :func:`all_commands` imports them all.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from collections.abc import Sequence

import click

from pitstop.errors import CorruptCheckpointError, PitstopError

from .common import EXIT_INTERNAL, EXIT_PROBLEMS, EXIT_USAGE, CliError
from .group import all_commands, cli
from .render import error_line


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status. Every failure is one line on stderr."""
    _escape_what_cannot_be_written()
    try:
        return int(cli.main(args=argv, prog_name="pitstop", standalone_mode=False) or 0)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        return EXIT_USAGE
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "pitstop"
        error_line(f"{exc.format_message()} (see `{where} --help`)")
        return EXIT_USAGE
    except click.Abort:
        error_line("aborted")
        return 130
    except click.ClickException as exc:
        error_line(exc.format_message())
        return exc.exit_code
    except CliError as exc:
        error_line(str(exc))
        return exc.code
    except CorruptCheckpointError as exc:
        hint = "" if "pitstop verify" in str(exc) else " (run `pitstop verify` for the whole store)"
        error_line(f"{exc}{hint}")
        return EXIT_PROBLEMS
    except (PitstopError, ValueError, OSError) as exc:
        # pitstop's own errors name what and why; ValueError is how the runtime rejects
        # arguments (a checkpoint of another run, a run of another workflow); OSError is a
        # file that cannot be read or written.
        if os.environ.get("PITSTOP_DEBUG"):
            traceback.print_exc()
        error_line(_message(exc))
        return EXIT_USAGE
    except Exception as exc:
        if os.environ.get("PITSTOP_DEBUG"):
            raise
        error_line(f"internal error: {type(exc).__name__}: {exc} "
                   "(PITSTOP_DEBUG=1 shows the traceback; please report it)")
        return EXIT_INTERNAL


def _escape_what_cannot_be_written() -> None:
    """Write a character the output's encoding has no bytes for as a backslash escape: a
    state may hold a lone surrogate (``"a\\ud800b"``), which no UTF-8 output can, and
    ``pitstop show`` then failed instead of showing it (the escape ``\\ud800`` is also what
    JSON reads back as that very string)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        name = exc.filename if exc.filename is not None else ""
        return f"{name}: {exc.strerror}" if name else exc.strerror
    return str(exc)


__all__ = ["all_commands", "cli", "run"]
