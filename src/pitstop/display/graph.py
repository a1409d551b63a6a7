"""A run's checkpoint tree as lanes, newest checkpoint first (like git log): the one walk
behind ``pitstop history``'s graph and the inspector's tree.

A run's checkpoints form a tree: resuming from an earlier checkpoint gives it a second child,
and the abandoned continuation stays as a side branch. Ids grow from parent to child, so
walking newest first always meets every child before its parent; that lets one pass lay out
the graph from the newest N checkpoints alone (one page of history). Each lane waits for the
parent of the checkpoint it last placed; where several lanes wait for the same checkpoint,
their branches join there (a branch point). The result is geometry only: ``cli`` draws it in
characters, ``ui`` in SVG.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model import CheckpointSummary


def fork_origin(entry: CheckpointSummary) -> Mapping[str, Any] | None:
    """``{"run_id", "checkpoint_id"}`` a forked run's checkpoint came from, if it says."""
    origin = entry.metadata.get("forked_from")
    return origin if isinstance(origin, Mapping) else None


def ends_here(entry: CheckpointSummary) -> bool:
    """The entry's parent is in another run (a fork's first checkpoint): its lane stops."""
    origin = fork_origin(entry)
    return origin is not None and origin.get("checkpoint_id") == entry.parent_id


@dataclass(slots=True)
class Row:
    """Where one checkpoint sits among the lanes, and which lanes cross its row."""

    col: int
    """Its own lane."""
    through: list[int] = field(default_factory=list)
    """Lanes that pass this row by (other branches, waiting for older checkpoints)."""
    joins: list[int] = field(default_factory=list)
    """Lanes from above that end in this checkpoint, besides its own."""
    from_top: bool = False
    """A newer checkpoint (drawn above) continues from this one in its own lane."""
    to_bottom: bool = False
    """Its parent is an older checkpoint of this run (drawn below)."""
    width: int = 1
    """Lanes open at this row (its own included)."""

    @property
    def branch_point(self) -> bool:
        """Several later checkpoints (drawn above) continue from this one."""
        return bool(self.joins)


def layout(
    entries: Sequence[CheckpointSummary],
    *,
    ends_here: Callable[[CheckpointSummary], bool] = ends_here,
) -> list[Row]:
    """One :class:`Row` per entry (newest first, as ``store.history`` returns them).

    ``ends_here(entry)`` says the entry's parent is not in this run (a fork's first
    checkpoint), so its lane stops there.
    """
    waiting: list[str | None] = []  # per lane: the parent id it continues to
    rows: list[Row] = []
    for entry in entries:
        # A lane waiting for an id newer than this entry can never be met (that parent was
        # pruned): free it rather than widen the tree forever.
        waiting = [want if want is None or want <= entry.id else None for want in waiting]
        hits = [lane for lane, want in enumerate(waiting) if want == entry.id]
        if hits:
            col = hits[0]
        elif None in waiting:
            col = waiting.index(None)
        else:
            col = len(waiting)
            waiting.append(None)
        row = Row(
            col,
            through=[lane for lane, want in enumerate(waiting)
                     if want is not None and lane not in hits],
            joins=hits[1:],
            from_top=bool(hits),
        )
        for lane in hits[1:]:
            waiting[lane] = None
        continues = entry.parent_id is not None and not ends_here(entry)
        waiting[col] = entry.parent_id if continues else None
        row.to_bottom = continues
        row.width = max(len(waiting), col + 1)
        while waiting and waiting[-1] is None:
            waiting.pop()
        rows.append(row)
    return rows


__all__ = ["Row", "ends_here", "fork_origin", "layout"]
