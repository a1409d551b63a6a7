"""A run's family in the CLI: the parent that started it, the children it started.

``show`` lists a run's children (the first :data:`SHOWN`, with counts by status for all:
one statement over the parent index however many there are, ``Store.children_summary``);
``history`` notes the checkpoints whose step started children.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pitstop.display.text import short

from .render import Cell, Column, Output, status_cell

if TYPE_CHECKING:
    from pitstop.model import CheckpointSummary, Run
    from pitstop.store import Store

SHOWN = 20
"""Children ``show`` lists by name (the counts cover them all)."""

CHILD_COLUMNS = [
    Column("child", style="bold"),
    Column("status"),
    Column("workflow", max_width=24),
    Column("step", right=True),
    Column("waiting for", max_width=40),
]


@dataclass(frozen=True)
class Family:
    run: Run
    counts: dict[str, int]
    children: list[Run]

    @classmethod
    def of(cls, store: Store, run: Run) -> Family:
        counts, children = store.children_summary(run.id, first=SHOWN)
        return cls(run, counts, children)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def fields(self) -> list[tuple[str, Cell]]:
        out: list[tuple[str, Cell]] = []
        parent = self.run.metadata.get("parent") or {}
        if self.run.parent_run is not None:
            where = f"@{short(parent['checkpoint_id'])}" if parent.get("checkpoint_id") else ""
            step = f" (step {parent['step']})" if parent.get("step") else ""
            out.append(("parent", f"{self.run.parent_run}{where}{step}"))
        if self.counts:
            by_status = ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items()))
            out.append(("children", f"{self.total}: {by_status}"))
        return out

    def table(self, out: Output) -> None:
        if not self.children:
            return
        rows = [
            [c.id, status_cell(c.status.value), c.workflow or "-",
             "-" if c.step is None else str(c.step), ", ".join(c.waiting_for)]
            for c in self.children
        ]
        out.line()
        out.table(CHILD_COLUMNS, rows)
        if self.total > len(self.children):
            out.note(f"{self.total - len(self.children)} more children: "
                     f"pitstop runs --parent {self.run.id}")
        out.line()

    def to_json(self) -> dict[str, Any]:
        parent = self.run.metadata.get("parent") or {}
        return {
            "parent": None if self.run.parent_run is None else {
                "run_id": self.run.parent_run, "checkpoint_id": parent.get("checkpoint_id"),
                "step": parent.get("step")},
            "children": {
                "counts": self.counts,
                "first": [{"id": c.id, "status": c.status.value, "workflow": c.workflow}
                          for c in self.children],
            },
        }


def children_note(entry: CheckpointSummary) -> str:
    """``history``'s note for a checkpoint whose step started children ("" if none)."""
    started = entry.metadata.get("children") or []
    if not started:
        return ""
    if len(started) == 1:
        return f"started child {started[0]}"
    return f"started {len(started)} children"
