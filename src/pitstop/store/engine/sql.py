"""The store shared by every SQL backend: checkpoints and runs, and the parts it is built from.

:class:`SqlStore` is the one implementation of the :class:`~pitstop.Store` contract over SQL;
SQLite, the in-memory store and PostgreSQL are subclasses that only provide connections and a
few decisions (:mod:`pitstop.store.engine.backend` lists those hooks), and mix in
``export_run`` / ``import_run`` from the layer above (:mod:`pitstop.store.transfer.runs`). It
is assembled from parts, each a module of this folder named for what it holds:

========================  ===================================================================
``sql.py`` (this module)  saving checkpoints, creating and updating runs: the hot path
``steps.py``              a step's small checkpoint on the head, without the shared path
``reads.py``              loading checkpoints (and ``fallback``), history, listing runs
``backend.py``            the backend hooks, :class:`~pitstop.store.engine.backend.Dialect`,
                          :class:`~pitstop.store.engine.backend.Tx`, transactions with retries
``schema.py``             tables, migrations, row classes, the SQL built from them
``values.py``             content-addressed values, their references, the blob store
``maintenance.py``        deleting runs and checkpoints, ``prune``, ``stats``, ``verify``
``ownership.py``          leases and ``claim``
``inputs.py``             ``send`` and ``inputs``
``effects.py``            effect records
``children.py``           child runs: listing them, delivering their outcome
``rowcheck.py``           the type and range checks of each table's fields
``spool.py``              streaming a table's rows to a temporary file
========================  ===================================================================

A save is :meth:`SqlStore.prepare` (serialise the state against the parent's field map,
build the record, no I/O when the parent is cached) then :meth:`SqlStore.commit`: one
transaction whose first statement is a conditional UPDATE that moves the run's head only if
the head, the lease and the fencing token are as expected (:func:`head_update`), followed by
the inserts of new values, their references and the checkpoint record.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from ...delta import ABSENT, Append, Applied, Merge, MergePatch
from ...errors import (
    CheckpointNotFoundError,
    ConflictError,
    LeaseLostError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
)
from ...ids import new_id
from ...model import Checkpoint, Run, RunStatus
from ..contract.base import UNSET, Durability, Lease, PreparedSave, Unset
from ..encoding.blobs import Slot
from ..encoding.records import (
    Alias,
    CheckpointRecord,
    FieldMap,
    NewBlob,
    Parent,
    check_text,
    encode_field_map,
    encode_metadata,
    stored_hashes,
)
from .backend import Tx
from .cache import ResultCache
from .children import CHILD_INPUT, Children
from .effects import Attachment, EffectRow
from .inputs import Inputs
from .ownership import Leases
from .reads import Reads
from .schedules import Schedules
from .schema import (
    INSERT_CHECKPOINT,
    INSERT_UNATTACHED_CHECKPOINT,
    SELECT_CHECKPOINT,
    SELECT_RUN,
    RunRow,
    check_id,
)
from .steps import StepSaves, head_update_sql

log = logging.getLogger("pitstop.store")


class _LazyStateCheckpoint(Checkpoint):
    """A saved checkpoint whose ``state`` is read from the store on first access (see
    ``SqlStore._answer``)."""

    __slots__ = ("_read", "_state")
    _read: Callable[[], dict[str, Any]]

    @property
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] | None = getattr(self, "_state", None)
        if state is None:
            state = self._state = self._read()
        return state

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self._state = value


class _HeadMoved(Exception):
    """The run's head is not the parent a save followed: prepare again from the new head."""

    def __init__(self, actual: str | None) -> None:
        self.actual = actual


_DELTAS = frozenset({Append, Merge})


@dataclass(slots=True)
class WritePlan:
    """Everything a prepared save needs at write time (the backend payload of PreparedSave).

    Built on every checkpoint, so what most saves leave unset has a default and is assigned
    only when given."""

    record: CheckpointRecord
    fields: FieldMap
    new: dict[bytes, NewBlob]
    refs: list[bytes]
    follow_head: bool
    expected_head: str | Unset | None
    lease: Lease | None
    release: bool
    workflow: str | None
    status: RunStatus | None
    waiting_json: str | None = None
    wake_at: float | None = None
    consumed: Sequence[str] = ()
    durability: Durability | None = None
    sets_waiting: bool = False
    """Whether the save sets the run's waiting_for/wake_at (it sets a status, or its
    metadata names them)."""
    aliases: Sequence[Alias] = ()
    """Chunks of the parent that new chunks extend: made aliases of them by the write."""
    deliver_to: str | None = None
    """The parent run this save's run is a child of, when the save finishes the run: the
    write delivers the outcome to the parent (see :mod:`pitstop.store.engine.children`)."""
    error: Any = None
    """The error in the save's metadata (what a failed child delivers)."""
    wake_check: bool = False
    """A waiting save for children: the write makes the run runnable if all delivered."""
    packed: Mapping[bytes, Slot] | None = None
    """Where the blob store packed the new values (written before the transaction)."""
    effects: Sequence[EffectRow] = ()
    """Effect records written in the same transaction (``pitstop_effects`` rows)."""
    attach: Sequence[Attachment] = ()
    """Records appended to earlier checkpoints' rows in the same transaction (those for the
    saved checkpoint are in its record's ``writes``)."""
    new_run: NewRun | None = None
    """A run's first save that creates its row (:meth:`Store.start_run`), never updating
    a row that exists."""


class NewRun(NamedTuple):
    """The run row a :meth:`Store.start_run` inserts with the run's first checkpoint."""

    metadata: str
    priority: int
    owner: str | None
    expires: float | None


def head_update(plan: WritePlan, null_safe_eq: str) -> tuple[str, list[Any]]:
    """The conditional UPDATE that moves a run's head on a save, and its parameters.

    It assigns only what the save changes. SQLite rewrites every index on a column named in
    SET, even to the same value, so naming ``status`` or ``wake_at`` on every step would add
    an index page to every commit. ``null_safe_eq`` is the dialect's null-safe equality.
    """
    record = plan.record
    status, workflow, lease = plan.status, plan.workflow, plan.lease
    params: list[Any] = [
        record.id,
        record.step,
        record.created_at,
        record.added + len(record.metadata) + len(record.fields),
    ]
    if status is not None:
        params.append(status.value)
    if workflow is not None:
        params.append(workflow)
    if plan.sets_waiting:
        params += (plan.waiting_json, plan.wake_at)
    params.append(record.run_id)
    expected = record.parent_id if plan.follow_head else plan.expected_head
    checks_head = expected is not UNSET
    if checks_head:
        params.append(expected)
    if lease is not None:
        params += (lease.owner, lease.token)
    else:
        params.append(record.created_at)
    sql = head_update_sql(
        null_safe_eq, status is not None, workflow is not None, plan.sets_waiting,
        plan.release, checks_head, lease is not None,
    )
    return sql, params


class _Guard(NamedTuple):
    """What a write checks of a run before changing it (read under the run's row lock)."""

    head_id: str | None
    fence: int
    lease_owner: str | None
    lease_expires: float | None
    metadata: str


_SELECT_GUARD = f"SELECT {', '.join(_Guard._fields)} FROM pitstop_runs WHERE run_id = ?"


def _ts(value: datetime | float | None) -> float | None:
    if value is None or isinstance(value, float | int):
        return value
    return value.timestamp()


def _stored_metadata(run_id: str, text: str | None) -> dict[str, Any]:
    """A run's stored metadata, to merge an update into. Damaged text (not a JSON object)
    is kept whole under ``unreadable_metadata``: marking such a run failed must work (a
    worker giving up on it), and must not throw away what is left of it."""
    try:
        merged = json.loads(text) if text else {}
    except ValueError:
        merged = None
    if isinstance(merged, dict):
        return merged
    log.warning("run %r: its metadata is not a JSON object; kept as unreadable_metadata", run_id)
    return {"unreadable_metadata": text}


class SqlStore(Reads, ResultCache, Schedules, Leases, Inputs, StepSaves, Children):
    """A :class:`Store` over a SQL database; backends supply connections and a dialect (and
    mix in :class:`~pitstop.store.transfer.runs.RunTransfer`)."""

    # -- checkpoints ---------------------------------------------------------------------------

    def _parent(self, checkpoint_id: str) -> Parent:
        cached = self._fields.get(checkpoint_id)
        if cached is not None:
            return cached
        row = self._tx(lambda tx: tx.one(SELECT_CHECKPOINT + " WHERE id = ?", (checkpoint_id,)))
        if row is None:
            raise CheckpointNotFoundError(checkpoint_id)
        record = CheckpointRecord(*row)
        record.verify()
        parent = Parent(record.id, record.run_id, record.step, record.field_map())
        self._fields.put(checkpoint_id, parent)
        return parent

    def _head_id(self, run_id: str) -> str | None:
        head_id: str | None = self._tx(
            lambda tx: tx.scalar("SELECT head_id FROM pitstop_runs WHERE run_id = ?", (run_id,))
        )
        return head_id

    def prepare(
        self,
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
        _views: bool = False,
    ) -> PreparedSave:
        # _views (save() only): the write follows at once, so array chunks may be written
        # from the arrays' memory; a prepared save committed later must hold copies.
        if type(run_id) is not str or not 0 < len(run_id) <= 512 or not run_id.isascii() \
                or "\x00" in run_id:
            check_id("run_id", run_id)
        if workflow is not None:
            check_text("workflow", workflow)
        follow_head = parent_id is None
        if follow_head:
            parent_id = self._heads.get(run_id)
            if parent_id is None and expected_head is not None:
                # (expected_head=None: the caller says the run has no checkpoint yet, as
                # when a run starts; the write checks that, so no read of the head first.)
                parent_id = self._head_id(run_id)
        parent = self._parent(parent_id) if parent_id is not None else None
        deltas: list[str] = []
        if type(state) is dict and not _DELTAS.isdisjoint(map(type, state.values())):
            deltas = [k for k, v in state.items() if type(v) in _DELTAS]
            state = self._resolve_deltas(state, deltas, parent_id)
        fields, new, raws, aliases = self._value_codec.encode_state(
            run_id,
            state,
            parent.fields if parent else None,
            changed,
            self._raws.get(parent_id) if parent_id is not None and changed is None else None,
            views=_views,
        )
        if checkpoint_id is None:
            checkpoint_id = new_id(after=parent_id)
        else:
            check_id("checkpoint_id", checkpoint_id)
        size = 0
        for ref in fields.values():
            size += ref.size
        added = 0
        if new:
            for blob in new.values():
                added += blob.size
            for alias in aliases:  # an extended chunk: only its growth is new
                added -= alias.size
            added = max(added, 0)
        # Positional: this runs on every checkpoint (see CheckpointRecord for the order).
        record = CheckpointRecord(
            checkpoint_id,
            run_id,
            parent_id,
            step if step is not None else (parent.step + 1 if parent else 0),
            time.time(),
            schema_version,
            encode_metadata(metadata, run_id) if metadata else "{}",
            encode_field_map(fields),
            size,
            added,
        )
        record.checksum = record.compute_checksum()
        if (
            parent is not None
            and parent.run_id == run_id
            and (follow_head or expected_head == parent_id
                 or self._heads.get(run_id) == parent_id)
        ):
            # Continuing from the run's head (one this process wrote, or one the write
            # will check: a save that follows the head, read just now by a handle that had
            # not seen it, writes only if it is still the head): the run already references
            # the parent's values (a head is never pruned), so only new ones need a
            # reference. Any other parent (a branch point, a stale cache) may have lost its
            # values to a prune: reference them all, and the write checks that they still
            # exist.
            refs = list(set(new).difference(stored_hashes(parent.fields))) if new else []
        else:
            refs = list(self._value_codec.referenced(fields, self._read_values_alone))
        plan = WritePlan(record, fields, new, refs, follow_head, expected_head, lease,
                         release and lease is not None, workflow, status)
        if aliases:
            plan.aliases = aliases
        if metadata or status is not None:
            waiting = metadata.get("waiting_for") if metadata else None
            plan.waiting_json = json.dumps(list(waiting)) if waiting else None
            plan.wake_at = _ts(metadata.get("wake_at")) if metadata else None
            plan.sets_waiting = status is not None or bool(
                metadata and ("waiting_for" in metadata or "wake_at" in metadata)
            )
            if status is RunStatus.WAITING and waiting:
                plan.wake_check = any(n.startswith(CHILD_INPUT) for n in waiting)
        if deliver_to is not None and status in (RunStatus.COMPLETED, RunStatus.FAILED):
            plan.deliver_to = deliver_to
            plan.error = metadata.get("error") if metadata else None
        if consumed_inputs:
            plan.consumed = list(consumed_inputs)
        plan.durability = durability
        if effects:
            plan.effects = [
                row
                for attached, results in effects.items()
                for row in self._effect_rows(run_id, results, attached, record.created_at)
            ]
        if attach:
            others = []
            for target, results in attach.items():
                if results:
                    attachment = self._attachment(run_id, target, results, record.created_at,
                                                  False)
                    if target == checkpoint_id:
                        record.writes = attachment.frames  # outside the checksum: set after it
                    else:
                        others.append(attachment)
            plan.attach = others
        # Known before the write, so a background writer can chain the next checkpoint on it.
        self._fields.put(checkpoint_id, Parent(checkpoint_id, run_id, record.step, fields))
        if raws:
            self._raws.put(checkpoint_id, raws)
        if Applied in map(type, state.values()):
            state = {k: v.value if type(v) is Applied else v for k, v in state.items()}
        if deltas:
            known = {name: state[name] for name in deltas if type(state[name]) is not MergePatch}
            if known:
                self._delta_values.put(checkpoint_id, known)
        return PreparedSave(record.id, run_id, parent_id, record.step, state, plan)

    def _resolve_deltas(
        self, state: dict[str, Any], names: list[str], parent_id: str | None
    ) -> dict[str, Any]:
        """``store.save`` given ``pitstop.Append``/``Merge`` values: each applied to the
        parent checkpoint's value of its field; the write then stores only the change.

        When this process wrote the parent with deltas on these fields (a loop saving
        ``Merge`` after ``Merge``), their values are remembered and nothing is read. A
        ``Merge`` on a chunked dict this process does not hold (a parent written by another
        handle: a new process resuming, another host taking over) is written as a patch of
        the changed entries (:class:`MergePatch`): O(change), nothing read either. Only
        otherwise is the parent read (the runtime, which holds the values, hands over the
        applied value with its delta instead)."""
        known = self._delta_values.get(parent_id)
        out = dict(state)
        if parent_id is None:
            base: Mapping[str, Any] = {}
        elif known is not None and known.keys() >= set(names):
            base = known
        else:
            fields = self._parent(parent_id).fields
            codec = self._value_codec
            patches = {}
            for name in names:
                delta = state[name]
                manifest = codec.may_patch(fields.get(name), delta) \
                    if type(delta) is Merge else None
                if manifest is not None:
                    patches[name] = MergePatch(delta, manifest)
                elif name in fields:  # (a field the parent lacks is ABSENT: nothing to read)
                    # The parent is read anyway: every delta is applied to its values, which
                    # are then remembered for the saves that follow (see above).
                    patches = {}
                    break
            out.update(patches)
            names = [name for name in names if name not in patches]
            base = self.get(parent_id).state if any(n in fields for n in names) else {}
        for name in names:
            delta = state[name]
            out[name] = Applied(delta.apply(base.get(name, ABSENT), field=name), delta)
        return out

    def commit(self, prepared: PreparedSave) -> Checkpoint:
        try:
            return self._answer(self._write_prepared(prepared))
        except _HeadMoved as moved:
            raise ConflictError(
                "another checkpoint was written first",
                run_id=prepared.run_id,
                expected=prepared.parent_id,
                actual=moved.actual,
            ) from None

    def save(
        self,
        run_id: str,
        state: Mapping[str, Any],
        *,
        parent_id: str | None = None,
        changed: Iterable[str] | None = None,
        **options: Any,
    ) -> Checkpoint:
        while True:
            prepared = self.prepare(
                run_id, state, parent_id=parent_id, changed=changed, _views=True, **options
            )
            try:
                return self._answer(self._write_prepared(prepared))
            except _HeadMoved:
                # Another writer moved the head: the `changed` hint no longer describes the
                # difference from the real parent, so compare every field by content instead.
                self._heads.drop(run_id)
                changed = None

    def _answer(self, saved: Checkpoint) -> Checkpoint:
        """What ``save``/``commit`` return: ``saved``, unless a field was written as a
        Merge patch, whose whole value no memory here holds: then a checkpoint whose
        ``state`` is read from the store when first asked for (a caller that only wants the
        id, as the stream jobs and ``Checkpointer`` do, never pays the read)."""
        if MergePatch not in map(type, saved.state.values()):
            return saved
        lazy = _LazyStateCheckpoint._from_row(
            saved.id, saved.run_id, saved.parent_id, saved.step, saved._created,
            saved.schema_version, saved.checksum, saved.size, saved._metadata_json,
            saved.added,
        )
        lazy.skipped = ()
        lazy._read = lambda: self.get(saved.id).state
        return lazy

    def _write_prepared(self, prepared: PreparedSave) -> Checkpoint:
        """Backend hook, optional: write a prepared save; raise :class:`_HeadMoved` if the run's
        head is no longer the parent it followed (``save`` then prepares again).

        This is the shared path: large values to the blob store first, then one write
        transaction (:meth:`_write_checkpoint`). A backend may override it for the cases it
        writes faster, and call ``super()._write_prepared`` for the rest (PostgreSQL does).
        """
        plan: WritePlan = prepared.payload
        if plan.new:
            plan.packed = self._externalize(plan.new.values(), plan.durability)
        try:
            self._tx(
                lambda tx: self._write_checkpoint(tx, plan), write=True, durability=plan.durability
            )
        except BaseException as exc:
            self._fields.drop(plan.record.id)
            self._raws.drop(plan.record.id)
            if isinstance(exc, Exception) and self._duplicate_checkpoint(exc):
                raise self._id_taken(plan) from None
            raise
        self._heads.put(prepared.run_id, plan.record.id)
        return plan.record.checkpoint(dict(prepared.state))

    @staticmethod
    def _id_taken(plan: WritePlan) -> ConflictError:
        return ConflictError(
            f"checkpoint id {plan.record.id!r} already exists",
            run_id=plan.record.run_id,
            expected=None,
            actual=plan.record.id,
        )

    def _write_checkpoint(self, tx: Tx, plan: WritePlan) -> None:
        """The write half of :meth:`save`: move the run's head, then insert the checkpoint.

        The common case is one conditional UPDATE that checks the head and the lease and
        moves the head in a single statement (and locks the run's row on PostgreSQL). Only
        when it matches no row does :meth:`_first_write_or_refusal` find out why.
        """
        record = plan.record
        run_id = record.run_id
        now = record.created_at
        expected = record.parent_id if plan.follow_head else plan.expected_head
        if plan.deliver_to is not None:
            self._lock_parent(tx, plan.deliver_to)
        if plan.new_run is not None or (
            plan.follow_head and plan.expected_head not in (UNSET, expected)
        ):
            # A new run's row is inserted, not updated (a row of that id refuses it); and
            # following the head *and* expecting another one cannot both hold: the slow
            # path says which failed (ConflictError, or a moved head and a new attempt).
            moved = 0
        else:
            moved = tx.run(*head_update(plan, self.dialect.null_safe_eq)).rowcount
        if not moved:
            self._first_write_or_refusal(tx, plan, record.footprint)
        if plan.refs:
            self._lock_values(tx)
            self._check_reused(tx, plan)
            # Where inserts report what they inserted (SQLite), the collision check runs only
            # if a new value's key was there already: one statement less for every save.
            counted = self._inserts_counted(plan.new, plan.packed)
            present = (
                set() if counted
                else self._check_chunk_collisions(tx, run_id, plan.new, plan.fields)
            )
            new, aliases = plan.new, plan.aliases
            if aliases and self.rewrites_in_place:
                grown = self._extend_in_place(tx, run_id, aliases, new, present, now)
                if grown:
                    new = {k: b for k, b in new.items() if k not in grown}
                    aliases = [a for a in aliases if a.target not in grown]
            # The run owns the rows it inserts and needs a reference row only for the others
            # (a key stored already, a fork's shared values): asked of the table unless every
            # new value was grown in place (rows it owns) or the count says it was inserted.
            owned_all_new = not new
            if not counted:
                self._insert_values(tx, new, now, plan.packed, owner=self._owner(run_id))
            elif self._insert_counted(tx, new, now, self._owner(run_id)) < len(new):
                self._check_chunk_collisions(tx, run_id, new, plan.fields)
            else:
                owned_all_new = True
            if not (owned_all_new and self._owners and all(h in plan.new for h in plan.refs)):
                self._reference_unowned(tx, run_id, plan.refs)
            if not plan.follow_head or any(h not in plan.new for h in plan.refs):
                self._ref_alias_targets(tx, run_id, [h for h in plan.refs if h not in plan.new])
            if aliases:
                self._make_aliases(tx, aliases)
        if record.writes is None:
            tx.run(INSERT_UNATTACHED_CHECKPOINT, record.row()[:-1])
        else:
            tx.run(INSERT_CHECKPOINT, record.row())
        if plan.effects:
            self._insert_effects(tx, plan.effects, replace=False)
        for attachment in plan.attach:
            self._write_attachment(tx, run_id, attachment)
        if plan.consumed:
            tx.run_chunks(
                "UPDATE pitstop_inputs SET consumed_by = ? WHERE run_id = ? "
                "AND consumed_by IS NULL AND id IN ({in})",
                plan.consumed,
                record.id,
                run_id,
            )
        if plan.deliver_to is not None and plan.status is not None:
            self._deliver_to_parent(tx, run_id, plan.deliver_to, plan.status, record.id,
                                    plan.error)
        if plan.wake_check:
            self._wake_if_delivered(tx, run_id, plan.waiting_json)
        if plan.status is RunStatus.QUEUED:
            self._notify(tx, run_id)  # an enqueued run's first checkpoint: workers may take it

    def _first_write_or_refusal(self, tx: Tx, plan: WritePlan, grown: int) -> None:
        """The conditional UPDATE matched nothing: a new run (create it), or a refusal."""
        record = plan.record
        run_id = record.run_id
        row = tx.one(_SELECT_GUARD + self.dialect.lock_row, (run_id,))
        current = _Guard(*row) if row is not None else None
        new_run = plan.new_run
        if new_run is not None and current is not None:
            raise RunExistsError(run_id)
        actual = current.head_id if current is not None else None
        # The caller's expectation first: when it fails, re-reading the head (what
        # _HeadMoved leads to) cannot make it hold.
        if plan.expected_head is not UNSET and actual != plan.expected_head:
            raise ConflictError(
                "another checkpoint was written first",
                run_id=run_id,
                expected=plan.expected_head,
                actual=actual,
            )
        if plan.follow_head and actual != record.parent_id:
            raise _HeadMoved(actual)
        self._check_lease(run_id, current, plan.lease, record.created_at)
        if current is not None:  # pragma: no cover - the UPDATE would have matched
            raise _HeadMoved(actual)
        if new_run is None:
            new_run = NewRun("{}", 0, None, None)
        tx.run(
            "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, "
            "updated_at, metadata, head_id, step, waiting_for, wake_at, checkpoints, "
            "bytes, priority, lease_owner, lease_expires, fence) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)",
            (
                run_id,
                plan.workflow,
                (plan.status or RunStatus.RUNNING).value,
                record.created_at,
                record.created_at,
                new_run.metadata,
                record.id,
                record.step,
                plan.waiting_json,
                plan.wake_at,
                grown,
                new_run.priority,
                new_run.owner,
                new_run.expires,
                1 if new_run.owner is not None else 0,  # the token a first acquire gives
            ),
        )

    def _check_reused(self, tx: Tx, plan: WritePlan) -> None:
        """Fail if a value referenced but not sent (a fork shares its source's) is gone.

        It existed when the source was read, but a prune or delete may have removed it
        since; checked under :meth:`_lock_values`, so it cannot be removed after this.
        New values need no check: they are (re)inserted. Saves whose parent is in the same
        run reference only new values, so the check costs them nothing.
        """
        reused = [h for h in plan.refs if h not in plan.new]
        if not reused:
            return
        found = tx.in_chunks("SELECT hash FROM pitstop_blobs WHERE hash IN ({in})", reused)
        if len(found) < len(reused):
            parent = plan.record.parent_id or "?"
            self._fields.drop(parent)
            raise CheckpointNotFoundError(parent)

    @staticmethod
    def _check_lease(run_id: str, current: _Guard | None, lease: Lease | None, now: float) -> None:
        """Refuse a write to a run (None: no such run yet) that ``lease`` does not allow."""
        if current is None:
            if lease is not None:
                raise LeaseLostError(
                    run_id, owner=lease.owner, token=lease.token, current_token=None
                )
            return
        owner, expires = current.lease_owner, current.lease_expires
        if lease is None:
            if owner is not None and expires is not None and expires > now:
                raise RunBusyError(run_id, owner=owner, expires_at=expires)
        elif current.fence != lease.token or owner != lease.owner:
            raise LeaseLostError(
                run_id, owner=lease.owner, token=lease.token, current_token=current.fence
            )

    # -- runs ----------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        *,
        workflow: str | None = None,
        status: RunStatus = RunStatus.RUNNING,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
        exist_ok: bool = False,
        parent_run: str | None = None,
    ) -> Run:
        check_id("run_id", run_id)
        if workflow is not None:
            check_text("workflow", workflow)
        meta_json = encode_metadata(metadata, run_id)
        now = time.time()

        def write(tx: Tx) -> Any:
            created = tx.run(
                "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at, "
                "metadata, priority, parent_run) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO NOTHING",
                (run_id, workflow, RunStatus(status).value, now, now, meta_json, priority,
                 parent_run),
            ).rowcount
            if not created and not exist_ok:
                raise RunExistsError(run_id)
            if created and RunStatus(status) is RunStatus.QUEUED:
                self._notify(tx, run_id)
            return tx.one(SELECT_RUN + " WHERE run_id = ?", (run_id,))

        return RunRow(*self._tx(write, write=True)).to_run()

    def start_run(
        self,
        prepared: PreparedSave,
        *,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
        owner: str | None = None,
        ttl: float = 30.0,
    ) -> tuple[Checkpoint, Lease | None]:
        plan: WritePlan = prepared.payload
        if plan.expected_head is not None or plan.lease is not None:
            raise ValueError("start_run takes a save prepared with expected_head=None, no lease")
        expires = time.time() + ttl if owner is not None else None
        plan.new_run = NewRun(
            encode_metadata(metadata, prepared.run_id) if metadata else "{}",
            priority, owner, expires,
        )
        ckpt = self.commit(prepared)
        if owner is None:
            return ckpt, None
        assert expires is not None
        return ckpt, Lease(prepared.run_id, owner, 1, expires, plan.workflow)

    def start_children(
        self,
        parent_run: str,
        children: Sequence[tuple[PreparedSave, Mapping[str, Any]]],
        *,
        lease: Lease | None = None,
    ) -> None:
        # Each child's row, with its metadata and parent, and its first checkpoint (made
        # queued by it) in one transaction per batch: no worker ever sees a child it cannot
        # start, a crash leaves each batch whole or absent, and a thousand children cost a
        # few round trips per hundred instead of two transactions each.
        for i in range(0, len(children), 100):
            batch = children[i : i + 100]
            plans: list[WritePlan] = [prepared.payload for prepared, _ in batch]
            for plan in plans:
                if plan.new:
                    plan.packed = self._externalize(plan.new.values(), plan.durability)

            def write(tx: Tx, batch: Sequence[tuple[PreparedSave, Mapping[str, Any]]] = batch,
                      plans: list[WritePlan] = plans) -> None:
                # The parent's row first, locked (parents before children, as everywhere):
                # a cancel committed meanwhile has moved its fence, and this is refused.
                row = tx.one(_SELECT_GUARD + self.dialect.lock_row, (parent_run,))
                if lease is not None:
                    self._check_lease(parent_run, _Guard(*row) if row else None, lease,
                                      time.time())
                ids = [prepared.run_id for prepared, _ in batch]
                taken = tx.in_chunks("SELECT run_id FROM pitstop_runs WHERE run_id IN ({in})",
                                     ids)
                if taken:
                    (first_taken,) = taken[0]
                    raise RunExistsError(first_taken)
                # New runs, each born with its first checkpoint as head: nothing to check,
                # so every statement is a batch (no round trip per child).
                tx.many(
                    "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, "
                    "updated_at, metadata, head_id, step, checkpoints, bytes, parent_run) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                    [(p.record.run_id, p.workflow, RunStatus.QUEUED.value, p.record.created_at,
                      p.record.created_at, encode_metadata(meta, p.record.run_id), p.record.id,
                      p.record.step, p.record.footprint, parent_run)
                     for p, (_, meta) in zip(plans, batch, strict=True)],
                )
                new = {h: blob for p in plans for h, blob in p.new.items()}
                packed = {h: slot for p in plans for h, slot in (p.packed or {}).items()}
                refs = [(p.record.run_id, h) for p in plans for h in p.refs]
                if refs:
                    self._lock_values(tx)
                    self._insert_values(tx, new, plans[0].record.created_at, packed)
                    tx.many("INSERT INTO pitstop_blob_refs (run_id, hash) VALUES (?, ?) "
                            "ON CONFLICT (run_id, hash) DO NOTHING", refs)
                tx.many(INSERT_CHECKPOINT, [p.record.row() for p in plans])
                self._notify(tx, parent_run)  # queued runs: wake the workers

            try:
                self._tx(write, write=True)
            except BaseException:
                for plan in plans:
                    self._fields.drop(plan.record.id)
                    self._raws.drop(plan.record.id)
                raise
            for prepared, _ in batch:
                self._heads.put(prepared.run_id, prepared.checkpoint_id)

    def update_run(
        self,
        run_id: str,
        *,
        status: RunStatus | None = None,
        metadata: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> Run:
        def write(tx: Tx) -> Any:
            parent = None
            if status is RunStatus.CANCELLED or status is RunStatus.FAILED:
                # A child cancelled or given up on (a worker's on_error): its parent hears,
                # and its row is locked first (parents before children, as everywhere).
                parent = tx.scalar("SELECT parent_run FROM pitstop_runs WHERE run_id = ?",
                                   (run_id,))
                if parent is not None:
                    self._lock_parent(tx, parent)
            row = tx.one(_SELECT_GUARD + self.dialect.lock_row, (run_id,))
            if row is None:
                raise RunNotFoundError(run_id)
            current = _Guard(*row)
            now = time.time()
            cancelling = status == RunStatus.CANCELLED
            if not cancelling:
                self._check_lease(run_id, current, lease, now)
            merged = _stored_metadata(run_id, current.metadata)
            merged.update(metadata or {})
            if cancelling:
                # Cancelling breaks any lease: the owner's next write is fenced off.
                tx.run(
                    "UPDATE pitstop_runs SET status = ?, metadata = ?, updated_at = ?, "
                    "lease_owner = NULL, lease_expires = NULL, fence = fence + 1, "
                    "wake_at = NULL WHERE run_id = ?",
                    (RunStatus.CANCELLED.value, encode_metadata(merged, run_id), now, run_id),
                )
                self._cancel_children(tx, run_id, now)
            else:
                tx.run(
                    "UPDATE pitstop_runs SET status = COALESCE(?, status), metadata = ?, "
                    "updated_at = ? WHERE run_id = ?",
                    (
                        status.value if status else None,
                        encode_metadata(merged, run_id),
                        now,
                        run_id,
                    ),
                )
            if parent is not None and status is not None:
                self._deliver_to_parent(tx, run_id, parent, status, current.head_id,
                                        merged.get("error"))
            return tx.one(SELECT_RUN + " WHERE run_id = ?", (run_id,))

        return RunRow(*self._tx(write, write=True)).to_run()


__all__ = ["SqlStore", "WritePlan", "head_update"]
