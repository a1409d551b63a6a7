"""What a stream job's handler sees (:class:`Record`) and what it emits (:class:`Output`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

Position = str | int
"""Where a partition stands in its source: a Redis entry id (``"1700000000000-0"``), a
JetStream sequence or an iterable's index. Stored in the partition's checkpoint."""


class Record(NamedTuple):
    """One record of a partition, as a handler receives it. (A named tuple: built for every
    record, it costs a third of a frozen dataclass.)"""

    partition: int
    position: Position
    """Its place in the partition: a restart after a checkpoint holding it resumes after it."""
    key: Any
    """The record's key (Redis: the ``key`` field, when there is one; iterables: the key)."""
    value: Any
    """The record itself (Redis: the entry's field map, decoded to ``str``)."""


@dataclass(slots=True, frozen=True)
class Output:
    """An emitted output: ``seq`` numbers a partition's outputs from 0, so the pair
    (partition run, ``seq``) — the :attr:`id` — names it for an idempotent sink."""

    job: str
    partition: int
    seq: int
    key: Any
    value: Any

    @property
    def id(self) -> str:
        return f"{self.job}/{self.partition}/{self.seq}"


__all__ = ["Output", "Position", "Record"]
