"""Output for people and for scripts, decided once per command.

On a terminal: rich tables, colours, syntax-highlighted JSON and progress bars. Piped or
redirected: plain aligned text that greps and diffs well (and no escape codes). ``--json``:
exactly one JSON document on stdout, whatever stdout is. rich is imported only in the first
case, because importing it costs more than answering ``pitstop runs`` on a large store.

Commands never print directly; they describe what to show (a table, key/value fields, a
value) and :class:`Output` renders it for the medium, so every command looks and behaves the
same way and no command carries its own terminal logic.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from pitstop.model import RunStatus

if TYPE_CHECKING:
    from rich.console import Console

    from pitstop.store.contract.base import Progress

STATUS_STYLE = {
    RunStatus.QUEUED.value: "blue",
    RunStatus.RUNNING.value: "cyan",
    RunStatus.WAITING.value: "yellow",
    RunStatus.COMPLETED.value: "green",
    RunStatus.FAILED.value: "bold red",
    RunStatus.CANCELLED.value: "dim",
}

Cell = str | tuple[str, str]
"""Text, or ``(text, rich style)``: the style is used on a terminal and ignored elsewhere."""


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    right: bool = False
    style: str = ""
    max_width: int | None = None


def styled(text: str, style: str) -> Cell:
    return (text, style) if style else text


def status_cell(status: str | None) -> Cell:
    return styled(status or "-", STATUS_STYLE.get(status or "", ""))


def _text(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell[0]


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


class Output:
    """Where and how a command prints: rich on a terminal, plain text when piped, or JSON."""

    def __init__(self, *, as_json: bool = False) -> None:
        self.as_json = as_json
        self.rich = not as_json and _is_tty(sys.stdout)
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False, soft_wrap=False)
        return self._console

    # -- documents ---------------------------------------------------------------------------

    def json(self, value: Any) -> None:
        """One JSON document on stdout (``--json``); datetimes become ISO-8601 strings."""
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=_json_default))
        sys.stdout.write("\n")

    def value(self, value: Any) -> None:
        """A JSON-able value for reading: highlighted on a terminal, indented JSON otherwise."""
        text = json.dumps(value, indent=2, ensure_ascii=False, default=_json_default)
        if self.rich:
            from rich.syntax import Syntax

            self.console.print(Syntax(text, "json", theme="ansi_dark", word_wrap=True,
                                      background_color="default"))
        else:
            sys.stdout.write(text + "\n")

    # -- text --------------------------------------------------------------------------------

    def line(self, text: str = "", style: str = "") -> None:
        if self.rich:
            from rich.text import Text

            self.console.print(Text(text, style=style))
        else:
            sys.stdout.write(text + "\n")

    def fields(self, pairs: Sequence[tuple[str, Cell]]) -> None:
        """``key: value`` lines, keys aligned (a header above a state or a result)."""
        pairs = [(k, v) for k, v in pairs if _text(v) not in ("", None)]
        width = max((len(k) for k, _ in pairs), default=0) + 1
        if self.rich:
            from rich.table import Table

            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold")
            grid.add_column()
            for key, value in pairs:
                grid.add_row(key, _rich_text(value))
            self.console.print(grid)
        else:
            for key, value in pairs:
                sys.stdout.write(f"{key + ':':<{width}} {_text(value)}\n")

    def table(
        self,
        columns: Sequence[Column],
        rows: Sequence[Sequence[Cell]],
        *,
        title: str | None = None,
        empty: str = "nothing to show",
    ) -> None:
        """Aligned columns under a header: coloured on a terminal, plain otherwise.

        Laid out here rather than with ``rich.table``: rich measures and renders every cell
        on its own, which takes about a second for a few hundred rows, and listing runs must
        stay instant. On a terminal the lines are cropped to its width instead of wrapped.
        """
        if not rows:
            self.note(empty)
            return
        texts = [[_clip(_text(c), col.max_width) for c, col in zip(row, columns, strict=True)]
                 for row in rows]
        headers = [c.header.upper() for c in columns]
        widths = [max(len(h), *(len(r[i]) for r in texts)) for i, h in enumerate(headers)]

        def pad(text: str, i: int) -> str:
            return f"{text:>{widths[i]}}" if columns[i].right else f"{text:<{widths[i]}}"

        if not self.rich:
            if title:
                sys.stdout.write(title + "\n")
            for line in [headers, *texts]:
                sys.stdout.write("  ".join(pad(t, i) for i, t in enumerate(line)).rstrip() + "\n")
            return
        from rich.text import Text

        out = Text(no_wrap=True, overflow="ellipsis")
        if title:
            out.append(title + "\n", "italic")
        out.append("  ".join(pad(h, i) for i, h in enumerate(headers)).rstrip() + "\n", "bold")
        for cells, row in zip(texts, rows, strict=True):
            for i, (text, cell) in enumerate(zip(cells, row, strict=True)):
                style = cell[1] if isinstance(cell, tuple) else columns[i].style
                if i:
                    out.append("  ")
                out.append(pad(text, i), style or None)
            out.append("\n")
        out.rstrip()
        self.console.print(out, crop=True, soft_wrap=False, overflow="ellipsis", no_wrap=True)

    def note(self, text: str) -> None:
        """Secondary information (hints, "showing 50 of ..."): dim on a terminal, plain text
        on stdout otherwise so that logs keep it; never part of ``--json`` output."""
        if self.as_json:
            return
        self.line(text, "dim")

    # -- progress ----------------------------------------------------------------------------

    @contextmanager
    def progress(self, label: str, *, in_bytes: bool = False) -> Iterator[Progress | None]:
        """A progress callback drawing a bar on stderr, or None when stderr is not a terminal
        (then nothing is drawn and nothing is imported). ``in_bytes``: the counts are bytes,
        shown as sizes (``3.2/12.0 MiB``), not as raw numbers."""
        if not _is_tty(sys.stderr):
            yield None
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        counts: list[ProgressColumn] = (
            [DownloadColumn(binary_units=True)] if in_bytes
            else [MofNCompleteColumn()]
        )
        with Progress(
            TextColumn("{task.description}"), BarColumn(), *counts,
            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
        ) as bar:
            task = bar.add_task(label, total=None)

            def update(done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total)

            yield update


def error_line(message: str) -> None:
    """The one line a failing command prints: ``error: what and why``, red on a terminal."""
    text = " ".join(str(message).split())  # one line, whatever the exception said
    if _is_tty(sys.stderr):
        sys.stderr.write(f"\x1b[1;31merror:\x1b[0m {text}\n")
    else:
        sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()


def _rich_text(cell: Cell) -> Any:
    from rich.text import Text

    return Text(cell) if isinstance(cell, str) else Text(cell[0], style=cell[1])


def _clip(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


# -- formatting helpers shared by the commands ---------------------------------------------------


def local_time(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone().strftime("%Y-%m-%d %H:%M:%S")


__all__ = [
    "Cell",
    "Column",
    "Output",
    "error_line",
    "local_time",
    "status_cell",
    "styled",
]
