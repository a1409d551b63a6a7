"""Where a checkpoint is written: :func:`write_checkpoint`, the one function that writes a
checkpoint's rows, on every SQL backend.

A save is two halves. :meth:`SqlStore.prepare_request
<pitstop.store.engine.sql.SqlStore.prepare_request>` turns a
:class:`~pitstop.store.contract.save.SaveRequest` into a :class:`WritePlan` (the encoded
record, the new values, the references, the run control resolved), without I/O when the parent
is cached. Then, in one write transaction, :func:`write_checkpoint` writes the plan's rows:

1. the conditional UPDATE of the run's row (:func:`head_update`): moves the head only if
   head, lease and fencing token are as expected, and sets status and wait columns when the
   save changes them; if it matches nothing, :func:`_first_write_or_refusal` inserts a new
   run's row or says why not (a moved head, a lost lease, a busy run);
2. the new values and their references (``values.py``: owned rows, reference rows, chunk
   aliases), under the garbage collector's shared lock;
3. the checkpoint row; effect records and attachments committed with it; inputs consumed;
4. a child's outcome delivered to its parent, a parent woken, a queued run announced.

What backends supply is what differs between databases, not another writer: the dialect
(placeholders, null-safe equality, row locks, upserts), whether an insert counts its rows
(``_inserts_counted``), in-place growth of chunks (``rewrites_in_place``), the locks
(``_lock_values``, ``_lock_parent``), and how a transaction is run and retried
(``SqlBackend._tx``). PostgreSQL sends the common step (a plan
``PostgresStore._one_statement`` accepts) as one statement of data-modifying CTEs built from
the same plan and :func:`head_update` (one round trip instead of three); anything else, and
every refusal, comes back here. ``tests/test_store_contract.py`` and ``test_store_steps.py``
check that both write the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import (
    CheckpointNotFoundError,
    ConflictError,
    LeaseLostError,
    RunBusyError,
    RunExistsError,
)
from ...model import RunStatus
from ..contract.base import UNSET, Durability, Lease, RetentionPolicy, Unset
from ..encoding.blobs import Slot
from ..encoding.records import Alias, CheckpointRecord, FieldMap, NewBlob
from .effects import Attachment, EffectRow
from .schema import INSERT_CHECKPOINT, INSERT_UNATTACHED_CHECKPOINT

if TYPE_CHECKING:
    from .backend import Tx
    from .sql import SqlStore


class HeadMoved(Exception):
    """The run's head is not the parent a save followed: prepare again from the new head."""

    def __init__(self, actual: str | None) -> None:
        self.actual = actual


@dataclass(init=False)
class WritePlan:
    """Everything a prepared save needs at write time: the ``plan`` of a
    :class:`~pitstop.store.contract.save.PreparedSave` from a SQL store. The request's run
    control is resolved here (the wait columns as the row stores them).

    Built on every checkpoint, so what most saves leave unset has a default and is assigned
    only when given: the defaults are class attributes (no ``slots``), and ``__init__``
    takes only the ten fields every save sets (a generated one would assign all 26)."""

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
    """Whether the save sets the run's waiting_for/wake_at (see ``RunControl.sets_waiting``)."""
    aliases: Sequence[Alias] = ()
    """Chunks of the parent that new chunks extend: made aliases of them by the write."""
    deliver_to: str | None = None
    """The parent run this save's run is a child of, when the save finishes the run: the
    write delivers the outcome to the parent (see :mod:`pitstop.store.engine.children`)."""
    error: Any = None
    """The failure a child delivers to ``deliver_to`` (``RunControl.error``)."""
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
    retention: RetentionPolicy | None = None
    """A retention policy to prune the run by in the same transaction, after the checkpoint
    is in (``SqlStore._save_and_prune``; only where ``prunes_in_save``)."""
    pruned: int = 0
    """How many checkpoints that prune deleted (set by the write)."""
    patched: bool = False
    """Whether a field of the state is a Merge patch (its whole value is not in memory: the
    checkpoint a save returns reads its state back when asked,
    ``SqlStore._read_state_later``)."""

    def __init__(
        self,
        record: CheckpointRecord,
        fields: FieldMap,
        new: dict[bytes, NewBlob],
        refs: list[bytes],
        follow_head: bool,
        expected_head: str | Unset | None,
        lease: Lease | None,
        release: bool,
        workflow: str | None,
        status: RunStatus | None,
    ) -> None:
        self.record = record
        self.fields = fields
        self.new = new
        self.refs = refs
        self.follow_head = follow_head
        self.expected_head = expected_head
        self.lease = lease
        self.release = release
        self.workflow = workflow
        self.status = status


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


class Guard(NamedTuple):
    """What a write checks of a run before changing it (read under the run's row lock)."""

    head_id: str | None
    fence: int
    lease_owner: str | None
    lease_expires: float | None
    metadata: str


SELECT_GUARD = f"SELECT {', '.join(Guard._fields)} FROM pitstop_runs WHERE run_id = ?"


def write_checkpoint(store: SqlStore, tx: Tx, plan: WritePlan) -> None:
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
        store._lock_parent(tx, plan.deliver_to)
    if plan.new_run is not None or (
        plan.follow_head and plan.expected_head not in (UNSET, expected)
    ):
        # A new run's row is inserted, not updated (a row of that id refuses it); and
        # following the head *and* expecting another one cannot both hold: the slow
        # path says which failed (ConflictError, or a moved head and a new attempt).
        moved = 0
    else:
        sql, params = head_update(plan, store.dialect.null_safe_eq)
        moved = tx.run(sql, params).rowcount
    if not moved:
        _first_write_or_refusal(store, tx, plan, record.footprint)
    if plan.refs:
        store._lock_values(tx)
        _check_reused(store, tx, plan)
        # Where inserts report what they inserted (SQLite), the collision check runs only
        # if a new value's key was there already: one statement less for every save.
        counted = store._inserts_counted(plan.new, plan.packed)
        present = (
            set() if counted
            else store._check_chunk_collisions(tx, run_id, plan.new, plan.fields)
        )
        new, aliases = plan.new, plan.aliases
        if aliases and store.rewrites_in_place:
            grown = store._extend_in_place(tx, run_id, aliases, new, present, now)
            if grown:
                new = {k: b for k, b in new.items() if k not in grown}
                aliases = [a for a in aliases if a.target not in grown]
        # The run owns the rows it inserts and needs a reference row only for the others
        # (a key stored already, a fork's shared values): asked of the table unless every
        # new value was grown in place (rows it owns) or the count says it was inserted.
        owned_all_new = not new
        if not counted:
            store._insert_values(tx, new, now, plan.packed, owner=run_id)
        elif store._insert_counted(tx, new, now, run_id) < len(new):
            store._check_chunk_collisions(tx, run_id, new, plan.fields)
        else:
            owned_all_new = True
        if not (owned_all_new and all(h in plan.new for h in plan.refs)):
            store._reference_unowned(tx, run_id, plan.refs)
        if not plan.follow_head or any(h not in plan.new for h in plan.refs):
            store._ref_alias_targets(tx, run_id, [h for h in plan.refs if h not in plan.new])
        if aliases:
            store._make_aliases(tx, aliases)
    if record.writes is None:
        tx.run(INSERT_UNATTACHED_CHECKPOINT, record.row()[:-1])
    else:
        tx.run(INSERT_CHECKPOINT, record.row())
    if plan.effects:
        store._insert_effects(tx, plan.effects, replace=False)
    for attachment in plan.attach:
        store._write_attachment(tx, run_id, attachment)
    if plan.consumed:
        tx.run_chunks(
            "UPDATE pitstop_inputs SET consumed_by = ? WHERE run_id = ? "
            "AND consumed_by IS NULL AND id IN ({in})",
            plan.consumed,
            record.id,
            run_id,
        )
    if plan.deliver_to is not None and plan.status is not None:
        store._deliver_to_parent(tx, run_id, plan.deliver_to, plan.status, record.id,
                                plan.error)
    if plan.wake_check:
        store._wake_if_delivered(tx, run_id, plan.waiting_json)
    if plan.status is RunStatus.QUEUED:
        store._notify(tx, run_id)  # an enqueued run's first checkpoint: workers may take it
    if plan.retention is not None:
        # Last, so the new checkpoint is the run's head and among its newest; the files of
        # the values freed go once this transaction has committed, the packs on a
        # background thread (``_delete_values``): not on this save's time.
        report = store._prune_run(tx, run_id, plan.retention, dry_run=False, packs_later=True)
        plan.pruned = len(report.checkpoints)

def _first_write_or_refusal(store: SqlStore, tx: Tx, plan: WritePlan, grown: int) -> None:
    """The conditional UPDATE matched nothing: a new run (create it), or a refusal."""
    record = plan.record
    run_id = record.run_id
    row = tx.one(SELECT_GUARD + store.dialect.lock_row, (run_id,))
    current = Guard(*row) if row is not None else None
    new_run = plan.new_run
    if new_run is not None and current is not None:
        raise RunExistsError(run_id)
    actual = current.head_id if current is not None else None
    # The caller's expectation first: when it fails, re-reading the head (what
    # HeadMoved leads to) cannot make it hold.
    if plan.expected_head is not UNSET and actual != plan.expected_head:
        raise ConflictError(
            "another checkpoint was written first",
            run_id=run_id,
            expected=plan.expected_head,
            actual=actual,
        )
    if plan.follow_head and actual != record.parent_id:
        raise HeadMoved(actual)
    check_lease(run_id, current, plan.lease, record.created_at)
    if current is not None:  # pragma: no cover - the UPDATE would have matched
        raise HeadMoved(actual)
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

def _check_reused(store: SqlStore, tx: Tx, plan: WritePlan) -> None:
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
        store._fields.drop(parent)
        raise CheckpointNotFoundError(parent)

def check_lease(run_id: str, current: Guard | None, lease: Lease | None, now: float) -> None:
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


@lru_cache(maxsize=256)
def head_update_sql(
    null_safe_eq: str,
    sets_status: bool,
    sets_workflow: bool,
    sets_waiting: bool,
    releases: bool,
    checks_head: bool,
    leased: bool,
) -> str:
    """The text of :func:`head_update`'s statement (cached: a handful of shapes exist)."""
    sets = ["head_id = ?", "step = ?", "updated_at = ?", "checkpoints = checkpoints + 1",
            "bytes = bytes + ?"]
    if sets_status:
        sets.append("status = ?")
    if sets_workflow:
        sets.append("workflow = ?")
    if sets_waiting:
        sets += ["waiting_for = ?", "wake_at = ?"]
    if releases:
        sets.append("lease_owner = NULL, lease_expires = NULL")
    where = ["run_id = ?"]
    if checks_head:
        where.append(f"head_id {null_safe_eq} ?")
    if leased:
        where.append("lease_owner = ? AND fence = ?")
    else:
        where.append("(lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= ?)")
    return f"UPDATE pitstop_runs SET {', '.join(sets)} WHERE " + " AND ".join(where)


__all__ = ["Guard", "HeadMoved", "NewRun", "WritePlan", "check_lease", "head_update",
           "head_update_sql", "write_checkpoint"]
