"""The checkpoint tree of a run page: one row per checkpoint, newest first, with lanes.

The same walk as ``pitstop history`` (ids grow from parent to child, so newest first meets
every child before its parent, and one page of history can be drawn on its own), but the
result is geometry for an SVG strip beside each row rather than characters: which lanes pass
through a row, which ones join into its checkpoint (a branch point: several later
checkpoints continue from it), and whether its own lane goes on down to its parent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..model import CheckpointSummary, RunStatus

LANE = 16
"""Pixels between lanes."""
ROW = 34
"""Pixels of one row (the SVG strip's height; the table row matches it in CSS)."""
STATUSES = frozenset(s.value for s in RunStatus)
LANES_SHOWN = 12
"""Lanes drawn before the rest are folded into the last one (a run with hundreds of
abandoned branches stays readable)."""


@dataclass(slots=True)
class Row:
    col: int
    through: list[int] = field(default_factory=list)
    """Lanes that pass this row by (other branches, waiting for older checkpoints)."""
    joins: list[int] = field(default_factory=list)
    """Lanes from above that end in this checkpoint, besides its own."""
    from_top: bool = False
    """A newer checkpoint (drawn above) continues from this one in its own lane."""
    to_bottom: bool = False
    """Its parent is an older checkpoint of this run (drawn below)."""
    width: int = 1

    @property
    def branch_point(self) -> bool:
        return bool(self.joins)

    def x(self, lane: int) -> int:
        return LANE // 2 + min(lane, LANES_SHOWN - 1) * LANE

    @property
    def pixels(self) -> int:
        return min(self.width, LANES_SHOWN) * LANE

    @property
    def lane_class(self) -> str:
        return f"lane-{self.col % 8}"

    def svg(self, width: int, *, status: str | None, milestone: bool, head: bool,
            origin: bool) -> str:
        """The row's strip as SVG markup. Built here rather than in the template (a page
        draws 200 of them): it holds only numbers and class names chosen here, never data
        from the store (``status`` is kept only if it is a known status)."""
        mid, x = ROW // 2, self.x
        col = x(self.col)
        own = self.lane_class
        parts = [f'<svg width="{width}" height="{ROW}" viewBox="0 0 {width} {ROW}" '
                 'aria-hidden="true">']
        parts.extend(f'<line class="edge lane-{lane % 8}" x1="{x(lane)}" y1="0" '
                     f'x2="{x(lane)}" y2="{ROW}"/>' for lane in self.through)
        if self.from_top:
            parts.append(f'<line class="edge {own}" x1="{col}" y1="0" x2="{col}" y2="{mid}"/>')
        parts.extend(f'<path class="edge lane-{lane % 8}" d="M{x(lane)} 0 C{x(lane)} '
                     f'{ROW // 3} {col} {ROW // 4} {col} {mid}"/>' for lane in self.joins)
        if self.to_bottom:
            parts.append(f'<line class="edge {own}" x1="{col}" y1="{mid}" x2="{col}" '
                         f'y2="{ROW}"/>')
        state = f"st-{status}" if status in STATUSES else "st-none"
        if milestone:
            parts.append(f'<rect class="dot {own} {state}" x="{col - 5}" y="{mid - 5}" '
                         f'width="10" height="10" transform="rotate(45 {col} {mid})"/>')
        else:
            extra = " origin" if origin else ""
            parts.append(f'<circle class="dot {own} {state}{extra}" cx="{col}" cy="{mid}" '
                         'r="5"/>')
        if head:
            parts.append(f'<circle class="head-ring" cx="{col}" cy="{mid}" r="9"/>')
        parts.append("</svg>")
        return "".join(parts)


def layout(
    entries: Sequence[CheckpointSummary],
    *,
    ends_here: Callable[[CheckpointSummary], bool],
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


__all__ = ["LANE", "ROW", "Row", "layout"]
