"""The checkpoint tree of a run page drawn as SVG: one strip beside each row, newest first.

The lanes come from :func:`pitstop.display.graph.layout`, the same walk as ``pitstop
history``'s graph; this module only turns a row's geometry into pixels: which lanes pass
through a row, which ones join into its checkpoint (a branch point), and whether its own
lane goes on down to its parent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..display import graph
from ..model import CheckpointSummary, RunStatus

LANE = 16
"""Pixels between lanes."""
ROW = 34
"""Pixels of one row (the SVG strip's height; the table row matches it in CSS)."""
STATUSES = frozenset(s.value for s in RunStatus)
LANES_SHOWN = 12
"""Lanes drawn before the rest are folded into the last one (a run with hundreds of
abandoned branches stays readable)."""


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One row of the tree as the run page draws it."""

    lanes: graph.Row

    @property
    def branch_point(self) -> bool:
        return self.lanes.branch_point

    @staticmethod
    def x(lane: int) -> int:
        return LANE // 2 + min(lane, LANES_SHOWN - 1) * LANE

    @property
    def pixels(self) -> int:
        return min(self.lanes.width, LANES_SHOWN) * LANE

    @property
    def lane_class(self) -> str:
        return f"lane-{self.lanes.col % 8}"

    def svg(self, width: int, *, status: str | None, milestone: bool, head: bool,
            origin: bool) -> str:
        """The row's strip as SVG markup. Built here rather than in the template (a page
        draws 200 of them): it holds only numbers and class names chosen here, never data
        from the store (``status`` is kept only if it is a known status)."""
        mid, x, row = ROW // 2, self.x, self.lanes
        col = x(row.col)
        own = self.lane_class
        parts = [f'<svg width="{width}" height="{ROW}" viewBox="0 0 {width} {ROW}" '
                 'aria-hidden="true">']
        parts.extend(f'<line class="edge lane-{lane % 8}" x1="{x(lane)}" y1="0" '
                     f'x2="{x(lane)}" y2="{ROW}"/>' for lane in row.through)
        if row.from_top:
            parts.append(f'<line class="edge {own}" x1="{col}" y1="0" x2="{col}" y2="{mid}"/>')
        parts.extend(f'<path class="edge lane-{lane % 8}" d="M{x(lane)} 0 C{x(lane)} '
                     f'{ROW // 3} {col} {ROW // 4} {col} {mid}"/>' for lane in row.joins)
        if row.to_bottom:
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
    ends_here: Callable[[CheckpointSummary], bool] = graph.ends_here,
) -> list[TreeRow]:
    """One :class:`TreeRow` per entry (newest first, as ``store.history`` returns them)."""
    return [TreeRow(row) for row in graph.layout(entries, ends_here=ends_here)]


__all__ = ["LANE", "ROW", "TreeRow", "layout"]
