"""The ``pitstop`` command group and what every subcommand shares.

:func:`command` registers a subcommand with the options all of them take (``--store``,
``--json``, the logging options), an example in its help, and a :class:`Session` as first
argument, so every command opens the store, prints and fails the same way. The commands
themselves live in one module per area (runs, checkpoints, control, maintenance, inspector);
:mod:`pitstop.cli.app` imports them in the order ``pitstop --help`` lists them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import click

from pitstop.display.text import parse_duration, parse_since
from pitstop.model import RunStatus

from .common import (
    EXIT_OK,
    Session,
    configure_logging,
    handling_broken_pipe,
)

STORE_HELP = "Store URL (default: $PITSTOP_STORE, else sqlite:///pitstop.db)."

HELP = """Inspect, steer and maintain pitstop runs.

Every command takes --store URL (or $PITSTOP_STORE; default sqlite:///pitstop.db):
sqlite:///relative.db, sqlite:////absolute.db or postgresql://user@host/db?schema=NAME.
Output is a table on a terminal, plain text when piped, and one JSON document with --json.

RUN is a run id or any unique start of one (01a2326a-2e98). RUN@ID names a checkpoint of
it: ID is the short id `pitstop history` prints, or any unique start or end of the id.

\b
Exit status:
  0  ok
  1  problems found: verify found damage, a command met a corrupt record,
     or a resumed run failed
  2  bad usage or input: unknown option, run or checkpoint, malformed JSON,
     a workflow that does not import, an unusable store (nothing is written)
  3  internal error (a bug: PITSTOP_DEBUG=1 shows the traceback)
"""

MODULES = {
    "runs": "runs",
    **dict.fromkeys(["show", "history", "diff"], "checkpoints"),
    **dict.fromkeys(["send", "start", "enqueue", "resume", "fork", "rerun", "worker", "cancel"],
                    "control"),
    "du": "usage",
    **dict.fromkeys(["stats", "verify", "migrate", "prune", "vacuum", "export", "import",
                     "rekey"],
                    "maintenance"),
    "cache": "cache",
    "schedule": "schedule",
    "ui": "inspector",
    "stream": "streams",
}
"""Each command's module, in the order an operator meets them (``pitstop --help``'s)."""
ORDER = list(MODULES)


class _Commands(click.Group):
    """Lists the commands in :data:`ORDER`, and imports a command's module only when that
    command is asked for: ``pitstop runs`` loads neither ``show``'s state machinery nor the
    runtime's, which start-up would otherwise pay for on every call."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*ORDER, *(name for name in self.commands if name not in MODULES)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in MODULES:
            importlib.import_module(f"{__package__}.{MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)


def _version() -> str:
    from pitstop import __version__

    return __version__


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def logging_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``-v``, ``-q`` and ``--log-level``: accepted before the command and after it."""
    fn = click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
                      help="Log messages of this level and above to stderr.")(fn)
    fn = click.option("-q", "--quiet", is_flag=True, help="Log errors only.")(fn)
    return click.option("-v", "--verbose", count=True,
                        help="Log more (-v: info, -vv: debug).")(fn)


@click.group(
    cls=_Commands,
    help=HELP,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="\b\nExample:\n  PITSTOP_STORE=sqlite:///runs.db pitstop runs --status waiting",
)
@click.option("--store", "store_url", metavar="URL", help=STORE_HELP)
@logging_options
@click.version_option(_version(), "--version", prog_name="pitstop")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, verbose: int, quiet: bool,
        log_level: str | None) -> None:
    ctx.obj = {"store": store_url, "verbose": verbose, "quiet": quiet, "log_level": log_level}


def all_commands() -> dict[str, click.Command]:
    """Every command by name, in :data:`ORDER` (their modules imported)."""
    for module in dict.fromkeys(MODULES.values()):
        importlib.import_module(f"{__package__}.{module}")
    return {name: cli.commands[name] for name in ORDER}


def subgroup(name: str, help: str, *, examples: Sequence[str]) -> click.Group:
    """A command group under ``pitstop`` (``pitstop cache ...``), its commands added with
    :func:`command` ``(group=...)``."""
    epilog = "\b\nExamples:\n" + "\n".join(f"  {e}" for e in examples)
    group = click.Group(name, help=help, epilog=epilog,
                        context_settings={"help_option_names": ["-h", "--help"]})
    cli.add_command(group)
    return group


def command(
    name: str, *, examples: Sequence[str], log_level: str = "WARNING",
    group: click.Group | None = None, **attrs: Any
) -> Callable[[Callable[..., int | None]], click.Command]:
    """Register a subcommand with what every command has: ``--store``, ``--json``, the
    logging options, an example in its help, a :class:`Session` (closed afterwards) as first
    argument. ``log_level`` is what the command logs without ``-v``/``-q``; ``group`` is the
    command group it belongs to (``pitstop cache ls``; default: ``pitstop`` itself)."""

    def decorate(fn: Callable[..., int | None]) -> click.Command:
        @functools.wraps(fn)
        def invoke(*, store_url: str | None, as_json: bool, verbose: int, quiet: bool,
                   log_level: str | None, **kwargs: Any) -> int:
            root = click.get_current_context().find_root().obj or {}
            configure_logging(
                log_level or root.get("log_level"), default=default_level,
                verbose=verbose + root.get("verbose", 0), quiet=quiet or root.get("quiet", False),
            )
            session = Session(store_url or root.get("store"), as_json=as_json)
            try:
                with handling_broken_pipe():
                    return fn(session, **kwargs) or EXIT_OK
            finally:
                session.close()

        default_level = log_level
        wrapped = logging_options(invoke)
        wrapped = click.option("--json", "as_json", is_flag=True,
                               help="Print one JSON document (for scripts).")(wrapped)
        wrapped = click.option("--store", "store_url", metavar="URL", help=STORE_HELP)(wrapped)
        epilog = "\b\nExample" + ("s" if len(examples) > 1 else "") + ":\n" + "\n".join(
            f"  {e}" for e in examples
        )
        return (group or cli).command(name, epilog=epilog, **attrs)(wrapped)

    return decorate


class _ParsedType(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2
    """A click type from a parse function raising ValueError with a readable message."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SINCE = _ParsedType("since", parse_since)
DURATION = _ParsedType("duration", parse_duration)
STATUSES = [s.value for s in RunStatus]


__all__ = ["DURATION", "SINCE", "STATUSES", "STORE_HELP", "all_commands", "cli", "command",
           "logging_options", "subgroup"]
