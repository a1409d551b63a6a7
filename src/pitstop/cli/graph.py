"""The branch graph drawn beside ``pitstop history``, newest checkpoint first (like git log).

A run's checkpoints form a tree: resuming from an earlier checkpoint gives it a second child,
and the abandoned continuation stays as a side branch. Ids grow from parent to child, so
walking newest first always meets every child before its parent; that lets one pass draw the
graph from the newest N checkpoints alone, which is what ``--limit`` fetches. Each lane waits
for the parent of the checkpoint it last drew; where several lanes wait for the same
checkpoint, their branches join there (a branch point).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pitstop.model import CheckpointSummary


def fork_origin(entry: CheckpointSummary) -> Mapping[str, Any] | None:
    """``{"run_id", "checkpoint_id"}`` a forked run's checkpoint came from, if it says."""
    origin = entry.metadata.get("forked_from")
    return origin if isinstance(origin, Mapping) else None


def ends_here(entry: CheckpointSummary) -> bool:
    """The entry's parent is in another run (a fork's first checkpoint): its lane stops."""
    origin = fork_origin(entry)
    return origin is not None and origin.get("checkpoint_id") == entry.parent_id


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


def layout(
    entries: Sequence[CheckpointSummary],
    *,
    head_id: str | None,
    ends_here: Callable[[CheckpointSummary], bool],
    glyphs: Glyphs = UNICODE,
) -> list[GraphRow]:
    """One graph prefix per entry (entries newest first, as ``store.history`` returns them).

    ``ends_here(entry)`` says the entry's parent is not in this run (the first checkpoint, or
    the checkpoint a fork started from), so its lane stops there.
    """
    lanes: list[str | None] = []
    rows: list[tuple[list[str], list[str], bool]] = []
    for entry in entries:
        # A lane waiting for an id newer than this entry can never be met: that parent was
        # pruned (ids only grow along a branch). Free it rather than widen the graph forever.
        lanes = [want if want is None or want <= entry.id else None for want in lanes]
        hits = [i for i, want in enumerate(lanes) if want == entry.id]
        if hits:
            col = hits[0]
        elif None in lanes:
            col = lanes.index(None)
        else:
            col = len(lanes)
            lanes.append(None)
        last = max(hits) if hits else col
        cells: list[str] = []
        gaps: list[str] = []
        for i, want in enumerate(lanes):
            inside = col < i <= last
            if i == col:
                cells.append(glyphs.head if entry.id == head_id else glyphs.node)
            elif i in hits:
                cells.append(glyphs.join_end if i == last else glyphs.join_mid)
            elif want is None:
                cells.append(glyphs.dash if inside else " ")
            else:
                cells.append(glyphs.cross if inside else glyphs.lane)
            gaps.append(glyphs.dash if col <= i < last else " ")
        rows.append((cells, gaps, len(hits) > 1))
        for i in hits[1:]:
            lanes[i] = None
        lanes[col] = None if entry.parent_id is None or ends_here(entry) else entry.parent_id
        while lanes and lanes[-1] is None:
            lanes.pop()
    width = max((len(cells) for cells, _, _ in rows), default=0) * 2
    return [
        GraphRow("".join(c + g for c, g in zip(cells, gaps, strict=True)).ljust(width), point)
        for cells, gaps, point in rows
    ]


__all__ = ["ASCII", "UNICODE", "GraphRow", "ends_here", "fork_origin", "layout"]
