"""One save, as one typed, frozen record: what the runtime hands the store to write.

A checkpoint's save used to travel as some twenty keyword arguments, written out again at
every layer, with the run's control fields (``waiting_for``, ``wake_at``, ``error``) riding
in the checkpoint's metadata for the store to pick back out. A :class:`SaveRequest` names
each part once:

- the checkpoint itself: run, state (and which fields ``changed``), parent, step, id,
  metadata, schema version;
- :class:`RunControl`: what the same transaction changes on the run's row (status,
  workflow, the wait columns, the outcome a child delivers to its parent);
- :class:`SaveOptions`: how it is written (the head it expects, the lease that fences it,
  durability, inputs it consumes, records committed with it).

:meth:`Store.save_request <pitstop.Store.save_request>` and
:meth:`Store.prepare_request <pitstop.Store.prepare_request>` take it; the keyword methods
``Store.save``/``Store.prepare`` build one with :meth:`SaveRequest.of`, which is also the one
place metadata keys become run control (their documented behaviour).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, NamedTuple, TypeVar

from ...model import RunStatus

if TYPE_CHECKING:
    from .base import Lease


class Unset(enum.Enum):
    """The type of :data:`UNSET` (for annotations: ``str | Unset | None``)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET
"""Marks an argument that was not given (where ``None`` is a meaningful value)."""

Durability = Literal["full", "normal"]
"""``full``: each commit is fsynced and survives power loss. ``normal``: each commit survives a
crash of the process; the last commits may be lost if the machine loses power."""


class RunControl(NamedTuple):
    """What a save changes on its run's row, in the same transaction as the checkpoint.

    ``None`` everywhere leaves the row's status and wait columns (and their indexes) alone:
    an ordinary step sends no control. Setting ``status`` also sets the wait columns, to
    ``waiting_for``/``wake_at`` (so a run that stops waiting waits for nothing).
    """

    status: RunStatus | None = None
    workflow: str | None = None
    """The run's workflow (set on its first save; None leaves it)."""
    waiting_for: Sequence[str] | None = None
    """The names of the inputs the run waits for (None: leave them, unless ``status``)."""
    wake_at: float | None = None
    """Unix seconds at which a waiting run becomes runnable."""
    error: Any = None
    """The failure a child run delivers to its parent (with ``deliver_to``)."""
    deliver_to: str | None = None
    """The parent run of this run: a save that completes or fails it delivers the outcome
    there in the same transaction."""

    @property
    def sets_waiting(self) -> bool:
        """Whether the save writes the run's ``waiting_for``/``wake_at`` columns."""
        return self.status is not None or self.waiting_for is not None or self.wake_at is not None


class SaveOptions(NamedTuple):
    """How a save is written (see :meth:`Store.save <pitstop.Store.save>` for each)."""

    expected_head: str | Unset | None = UNSET
    lease: Lease | None = None
    release: bool = False
    durability: Durability | None = None
    consumed_inputs: Sequence[str] = ()
    effects: Mapping[str, Mapping[str, Any]] | None = None
    attach: Mapping[str, Mapping[str, Any]] | None = None


NO_CONTROL: Final = RunControl()
"""An ordinary step's control: nothing on the run's row but its head and counters."""

DEFAULT_OPTIONS: Final = SaveOptions()


class SaveRequest(NamedTuple):
    """One checkpoint to save: its state and identity, its run control, its options.

    Immutable (a named tuple: built on every checkpoint, it costs one allocation, and the
    store unpacks it in one step).

    ``changed`` names the fields that differ from the parent (a promise by the caller; None
    compares every field by content). ``parent_id`` None follows the run's head; ``step``
    None is the parent's + 1; ``checkpoint_id`` None makes a fresh id.
    """

    run_id: str
    state: Mapping[str, Any]
    changed: Iterable[str] | None = None
    parent_id: str | None = None
    step: int | None = None
    checkpoint_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    schema_version: int = 0
    control: RunControl = NO_CONTROL
    options: SaveOptions = DEFAULT_OPTIONS

    @classmethod
    def of(
        cls,
        run_id: str,
        state: Mapping[str, Any],
        *,
        parent_id: str | None = None,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        changed: Iterable[str] | None = None,
        schema_version: int = 0,
        workflow: str | None = None,
        status: RunStatus | None = None,
        expected_head: str | Unset | None = UNSET,
        lease: Lease | None = None,
        release: bool = False,
        consumed_inputs: Iterable[str] = (),
        durability: Durability | None = None,
        checkpoint_id: str | None = None,
        deliver_to: str | None = None,
        effects: Mapping[str, Mapping[str, Any]] | None = None,
        attach: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> SaveRequest:
        """The request the keyword form ``Store.save(run_id, state, ...)`` describes.

        As that form documents, metadata keys ``waiting_for`` and ``wake_at`` become the
        run's wait columns, and ``error`` the failure a child delivers: this is the one
        place they are read out of metadata (:func:`keyword_request`).
        """
        return keyword_request(
            cls, run_id, state, parent_id, step, metadata, changed, schema_version, workflow,
            status, expected_head, lease, release, consumed_inputs, durability, checkpoint_id,
            deliver_to, effects, attach,
        )


def keyword_request(
    cls: type[SaveRequest],
    run_id: str,
    state: Mapping[str, Any],
    parent_id: str | None,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    changed: Iterable[str] | None,
    schema_version: int,
    workflow: str | None,
    status: RunStatus | None,
    expected_head: str | Unset | None,
    lease: Lease | None,
    release: bool,
    consumed_inputs: Iterable[str],
    durability: Durability | None,
    checkpoint_id: str | None,
    deliver_to: str | None,
    effects: Mapping[str, Mapping[str, Any]] | None,
    attach: Mapping[str, Mapping[str, Any]] | None,
) -> SaveRequest:
    """:meth:`SaveRequest.of` with every argument in order, for ``Store.save`` and
    ``Store.prepare`` to call positionally: passed as keywords, that many arguments make
    CPython build a dict for the call and unpack it again (~9k instructions on every
    keyword save; a positional call of the same arguments, ~1k)."""
    control = NO_CONTROL
    if status is not None or workflow is not None or deliver_to is not None or (
        metadata and ("waiting_for" in metadata or "wake_at" in metadata
                      or "error" in metadata)
    ):
        waiting_for = wake_at = None
        if metadata and ("waiting_for" in metadata or "wake_at" in metadata):
            waiting_for = tuple(metadata.get("waiting_for") or ())
            wake_at = _seconds(metadata.get("wake_at"))
        control = RunControl(
            status=status,
            workflow=workflow,
            waiting_for=waiting_for,
            wake_at=wake_at,
            error=metadata.get("error") if metadata else None,
            deliver_to=deliver_to,
        )
    options = DEFAULT_OPTIONS
    if (expected_head is not UNSET or lease is not None or release or consumed_inputs
            or durability is not None or effects or attach):
        options = SaveOptions(
            expected_head=expected_head,
            lease=lease,
            release=release,
            durability=durability,
            consumed_inputs=tuple(consumed_inputs),
            effects=effects,
            attach=attach,
        )
    # tuple.__new__ with the fields in order: what the named tuple's generated __new__
    # does, without its Python frame (this is every keyword save).
    return tuple.__new__(cls, (run_id, state, changed, parent_id, step, checkpoint_id,
                               metadata, schema_version, control, options))


def _seconds(value: datetime | float | None) -> float | None:
    if value is None or isinstance(value, float | int):
        return value
    return value.timestamp()


PlanT = TypeVar("PlanT")


@dataclass(slots=True)
class PreparedSave(Generic[PlanT]):
    """A checkpoint serialised and checked, not yet written: :meth:`Store.commit` writes it.

    Splitting the two lets a caller take a consistent snapshot now (serialising on its own
    thread) and pay for the write later, e.g. on a background writer thread. Its id is final.
    ``plan`` is the backend's write plan (a SQL store's
    :class:`~pitstop.store.engine.write.WritePlan`): everything the write needs.
    """

    checkpoint_id: str
    run_id: str
    parent_id: str | None
    step: int
    state: Mapping[str, Any]
    plan: PlanT


__all__ = [
    "DEFAULT_OPTIONS",
    "NO_CONTROL",
    "UNSET",
    "Durability",
    "PreparedSave",
    "RunControl",
    "SaveOptions",
    "SaveRequest",
    "Unset",
]
