"""The branch graph drawn beside ``pitstop history``, newest checkpoint first (like git log).

The lanes come from :func:`pitstop.display.graph.layout`, the walk the inspector's tree uses
too; this module only draws each row in characters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pitstop.display import graph
from pitstop.model import CheckpointSummary


@dataclass(frozen=True, slots=True)
class Glyphs:
    node: str
    head: str
    lane: str
    join_end: str
    join_mid: str
    cross: str
    dash: str


UNICODE = Glyphs("●", "◉", "│", "┘", "┴", "┼", "─")
ASCII = Glyphs("*", "@", "|", "'", "'", "+", "-")


@dataclass(frozen=True, slots=True)
class GraphRow:
    prefix: str
    branch_point: bool
    """Several later checkpoints (drawn above) continue from this one."""


def _draw(row: graph.Row, *, head: bool, glyphs: Glyphs) -> str:
    """A row's lanes as characters: two per lane, the lane's own and the gap after it."""
    col = row.col
    last = max([col, *row.joins])  # the joining branches reach over to here
    text = []
    for lane in range(row.width):
        inside = col < lane <= last
        if lane == col:
            cell = glyphs.head if head else glyphs.node
        elif lane in row.joins:
            cell = glyphs.join_end if lane == last else glyphs.join_mid
        elif lane in row.through:
            cell = glyphs.cross if inside else glyphs.lane
        else:
            cell = glyphs.dash if inside else " "
        text.append(cell + (glyphs.dash if col <= lane < last else " "))
    return "".join(text)


def layout(
    entries: Sequence[CheckpointSummary],
    *,
    head_id: str | None,
    ends_here: Callable[[CheckpointSummary], bool] = graph.ends_here,
    glyphs: Glyphs = UNICODE,
) -> list[GraphRow]:
    """One graph prefix per entry (entries newest first, as ``store.history`` returns them),
    all padded to the widest."""
    rows = graph.layout(entries, ends_here=ends_here)
    width = max((row.width for row in rows), default=0) * 2
    return [
        GraphRow(_draw(row, head=entry.id == head_id, glyphs=glyphs).ljust(width),
                 row.branch_point)
        for entry, row in zip(entries, rows, strict=True)
    ]


__all__ = ["ASCII", "UNICODE", "GraphRow", "layout"]
