"""The store shared by every SQL backend: checkpoints and runs, and the parts it is built from.

:class:`SqlStore` is the one implementation of the :class:`~pitstop.Store` contract over SQL;
SQLite, the in-memory store and PostgreSQL are subclasses that only provide connections and a
few decisions (:mod:`pitstop.store.engine.backend` lists those hooks), and mix in
``export_run`` / ``import_run`` from the layer above (:mod:`pitstop.store.transfer.runs`). It
is assembled from parts, each a module of this folder named for what it holds:

========================  ===================================================================
``sql.py`` (this module)  saving checkpoints (a request to a plan), creating and updating runs
``write.py``              :func:`~pitstop.store.engine.write.write_checkpoint`: a save's rows
``steps.py``              a step's small checkpoint on the head, planned without the codec
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

A save is a :class:`~pitstop.store.contract.save.SaveRequest`; :meth:`SqlStore.save_request`
shows it whole: :meth:`SqlStore._prepare` (serialise the state against the parent's field
map, build the record and the :class:`~pitstop.store.engine.write.WritePlan`, no I/O when the
parent is cached) then :meth:`SqlStore._write_prepared`: one transaction running
:func:`~pitstop.store.engine.write.write_checkpoint`, whose first statement is a conditional
UPDATE that moves the run's head only if the head, the lease and the fencing token are as
expected, followed by the inserts of new values, their references and the checkpoint record.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from ...delta import ABSENT, Append, Applied, Merge, MergePatch
from ...errors import (
    CheckpointNotFoundError,
    ConflictError,
    RunExistsError,
    RunNotFoundError,
)
from ...ids import new_id
from ...model import Checkpoint, Run, RunStatus
from ..contract.base import Lease, RetentionPolicy
from ..contract.save import PreparedSave, SaveRequest
from ..encoding.records import (
    CheckpointRecord,
    Parent,
    check_text,
    encode_field_map,
    encode_metadata,
    stored_hashes,
)
from .backend import Tx
from .cache import ResultCache
from .children import CHILD_INPUT, Children
from .inputs import Inputs
from .ownership import Leases
from .reads import Reads
from .schedules import Schedules
from .schema import (
    INSERT_CHECKPOINT,
    SELECT_CHECKPOINT,
    SELECT_RUN,
    RunRow,
    check_id,
)
from .steps import StepSaves
from .write import SELECT_GUARD, Guard, HeadMoved, NewRun, WritePlan, check_lease, write_checkpoint

log = logging.getLogger("pitstop.store")


class _LazyStateCheckpoint(Checkpoint):
    """A saved checkpoint whose ``state`` is read from the store on first access (see
    ``SqlStore._read_state_later``)."""

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


_DELTAS = frozenset({Append, Merge})
_WRAPPERS = _DELTAS | {Applied, MergePatch}
"""The types a state's value may have that are not the value itself: few saves hold one."""

_STORED_SIZE = itemgetter(1)
"""``FieldRef.size`` as a C call: summed over a field map on every save."""


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

    def save_request(self, request: SaveRequest) -> Checkpoint:
        """A checkpoint saved, top to bottom: serialise the changed fields against the
        parent and build the write plan (:meth:`_prepare`), then write its rows in one
        transaction (:meth:`_write_prepared`, which runs
        :func:`~pitstop.store.engine.write.write_checkpoint`)."""
        return self._save(request)

    def _save_and_prune(self, request: SaveRequest, policy: RetentionPolicy) -> Checkpoint:
        """A save and its run's retention prune in one transaction, where the backend allows
        it (:attr:`prunes_in_save`) and the policy only prunes checkpoints: one commit and
        one sync instead of two. The values the prune frees leave the blob directory after
        the commit (as any prune's): a file is never gone while a committed row names it.
        Not for a save less durable than the store (a prune of its own would be synced
        before its files go, this commit may not be)."""
        if not self.prunes_in_save or policy.finished_age is not None \
                or not policy.prunes_checkpoints \
                or request.options.durability not in (None, "full", self.durability):
            return super()._save_and_prune(request, policy)
        return self._save(request, policy)

    def _save(self, request: SaveRequest, retention: RetentionPolicy | None = None) -> Checkpoint:
        while True:
            plan, state = self._prepare(request, views=True)
            if retention is not None:
                plan.retention = retention
            try:
                checkpoint = self._write_prepared(plan, state)
                if plan.patched:
                    checkpoint = self._read_state_later(checkpoint)
                if plan.pruned:
                    self._give_space_back()
                return checkpoint
            except HeadMoved:
                # Another writer moved the head: the `changed` hint no longer describes the
                # difference from the real parent, so compare every field by content instead.
                self._heads.drop(request.run_id)
                request = request._replace(changed=None)

    def save_step(self, request: SaveRequest) -> bool:
        """:meth:`save_request` of a step whose plan :meth:`_prepare_step` can make without
        the value codec (small byte strings continuing the head: the LangGraph saver's loop);
        False, nothing written, for any other save. Written as every save is."""
        plan = self._prepare_step(request)
        if plan is None:
            return False
        self._write_plan(plan)
        return True

    def prepare_request(self, request: SaveRequest) -> PreparedSave[WritePlan]:
        plan, state = self._prepare(request, views=False)
        record = plan.record
        return PreparedSave(record.id, record.run_id, record.parent_id, record.step, state, plan)

    def commit(self, prepared: PreparedSave[WritePlan]) -> Checkpoint:
        try:
            checkpoint = self._write_prepared(prepared.plan, prepared.state)
        except HeadMoved as moved:
            raise ConflictError(
                "another checkpoint was written first",
                run_id=prepared.run_id,
                expected=prepared.parent_id,
                actual=moved.actual,
            ) from None
        if prepared.plan.patched:
            checkpoint = self._read_state_later(checkpoint)
        return checkpoint

    def _read_state_later(self, saved: Checkpoint) -> Checkpoint:
        """What ``save``/``commit`` return when a field was written as a Merge patch
        (``WritePlan.patched``), whose whole value no memory here holds: ``saved`` as a
        checkpoint whose ``state`` is read from the store when first asked for (a caller that
        only wants the id, as the stream jobs and ``Checkpointer`` do, never pays the read)."""
        lazy = _LazyStateCheckpoint._from_row(
            saved.id, saved.run_id, saved.parent_id, saved.step, saved._created,
            saved.schema_version, saved.checksum, saved.size, saved._metadata_json,
            saved.added,
        )
        lazy.skipped = ()
        lazy._read = lambda: self.get(saved.id).state
        return lazy

    def _prepare(
        self, request: SaveRequest, views: bool
    ) -> tuple[WritePlan, Mapping[str, Any]]:
        """Serialise and check a save, write nothing: its :class:`WritePlan`, and the state
        the saved checkpoint holds (its values, deltas applied). ``prepare_request`` makes
        them a :class:`PreparedSave`; ``save`` writes them at once, without one.

        ``views``: the write follows at once (``save``), so array chunks may be written from
        the arrays' memory; a prepared save committed later must hold copies."""
        (run_id, state, changed, parent_id, step, checkpoint_id, metadata, schema_version,
         control, options) = request
        if type(run_id) is not str or not 0 < len(run_id) <= 512 or not run_id.isascii() \
                or "\x00" in run_id:
            check_id("run_id", run_id)
        # Unpacked once: this runs on every checkpoint, and most saves leave most unset.
        status, workflow, waiting_for, wake_at, error, deliver_to = control
        expected_head, lease, release, durability, consumed, effects, attach = options
        if workflow is not None:
            check_text("workflow", workflow)
        follow_head = parent_id is None
        if follow_head:
            parent_id = self._heads.get(run_id)
            if parent_id is None and expected_head is not None:
                # (expected_head=None: the caller says the run has no checkpoint yet, as
                # when a run starts; the write checks that, so no read of the head first.)
                parent_id = self._head_id(run_id)
        # The cached parent without _parent's frame (its miss path reads the row).
        parent = None if parent_id is None else (
            self._fields.get(parent_id) or self._parent(parent_id))
        # One pass over the values' types tells an ordinary state (no delta, no value applied
        # already, no patch) from the rest; a mapping that is not a dict is looked at below,
        # once the codec has taken it.
        plain = type(state) is dict and _WRAPPERS.isdisjoint(map(type, state.values()))
        deltas: list[str] = []
        if not plain and type(state) is dict and not _DELTAS.isdisjoint(map(type, state.values())):
            deltas = [k for k, v in state.items() if type(v) in _DELTAS]
            state = self._resolve_deltas(state, deltas, parent_id)
        # (The property only until the codec is made: it is a call on every save.)
        fields, new, raws, aliases = (self._codec or self._value_codec).encode_state(
            run_id,
            state,
            parent.fields if parent else None,
            changed,
            self._raws.get(parent_id) if parent_id is not None and changed is None else None,
            views,  # (positional: a keyword costs the call its names on every save)
        )
        if checkpoint_id is None:
            checkpoint_id = new_id(after=parent_id)
        else:
            check_id("checkpoint_id", checkpoint_id)
        size = sum(map(_STORED_SIZE, fields.values()))
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
        if status is not None or waiting_for is not None or wake_at is not None:
            waiting = waiting_for
            plan.sets_waiting = True
            plan.waiting_json = json.dumps(list(waiting)) if waiting else None
            plan.wake_at = wake_at
            if status is RunStatus.WAITING and waiting:
                plan.wake_check = any(n.startswith(CHILD_INPUT) for n in waiting)
        if deliver_to is not None and status in (RunStatus.COMPLETED, RunStatus.FAILED):
            plan.deliver_to = deliver_to
            plan.error = error
        if consumed:
            plan.consumed = list(consumed)
        if durability is not None:
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
        # (tuple.__new__: the named tuple made without its generated __new__'s Python frame.)
        self._fields.put(checkpoint_id,
                         tuple.__new__(Parent, (checkpoint_id, run_id, record.step, fields)))
        if raws:
            self._raws.put(checkpoint_id, raws)
        if not plain:
            if Applied in map(type, state.values()):
                state = {k: v.value if type(v) is Applied else v for k, v in state.items()}
            plan.patched = MergePatch in map(type, state.values())
        if deltas:
            known = {name: state[name] for name in deltas if type(state[name]) is not MergePatch}
            if known:
                self._delta_values.put(checkpoint_id, known)
        return plan, state

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

    def _write_prepared(self, plan: WritePlan, state: Mapping[str, Any]) -> Checkpoint:
        """Write a prepared save (its plan; ``state``, what the checkpoint returned holds):
        large values to the blob store first, then one write transaction running
        :func:`~pitstop.store.engine.write.write_checkpoint`. Raises
        :class:`~pitstop.store.engine.write.HeadMoved` if the run's head is no longer the
        parent it followed (``save`` then prepares again).

        Backend hook, optional: PostgreSQL overrides it to send the common step as one
        statement, and calls ``super()._write_prepared`` for the rest.
        """
        self._write_plan(plan)
        return plan.record.checkpoint(dict(state))

    def _write_plan(self, plan: WritePlan) -> None:
        """:meth:`_write_prepared` without the :class:`~pitstop.Checkpoint` it returns."""
        if plan.new:
            plan.packed = self._externalize(plan.new.values(), plan.durability)
        try:
            self._tx(
                lambda tx: write_checkpoint(self, tx, plan), write=True,
                durability=plan.durability,
            )
        except BaseException as exc:
            self._fields.drop(plan.record.id)
            self._raws.drop(plan.record.id)
            if isinstance(exc, Exception) and self._duplicate_checkpoint(exc):
                raise self._id_taken(plan) from None
            raise
        self._heads.put(plan.record.run_id, plan.record.id)

    @staticmethod
    def _id_taken(plan: WritePlan) -> ConflictError:
        return ConflictError(
            f"checkpoint id {plan.record.id!r} already exists",
            run_id=plan.record.run_id,
            expected=None,
            actual=plan.record.id,
        )

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
        prepared: PreparedSave[WritePlan],
        *,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
        owner: str | None = None,
        ttl: float = 30.0,
    ) -> tuple[Checkpoint, Lease | None]:
        plan = prepared.plan
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
        children: Sequence[tuple[PreparedSave[WritePlan], Mapping[str, Any]]],
        *,
        lease: Lease | None = None,
    ) -> None:
        # Each child's row, with its metadata and parent, and its first checkpoint (made
        # queued by it) in one transaction per batch: no worker ever sees a child it cannot
        # start, a crash leaves each batch whole or absent, and a thousand children cost a
        # few round trips per hundred instead of two transactions each.
        for i in range(0, len(children), 100):
            batch = children[i : i + 100]
            plans: list[WritePlan] = [prepared.plan for prepared, _ in batch]
            for plan in plans:
                if plan.new:
                    plan.packed = self._externalize(plan.new.values(), plan.durability)

            def write(tx: Tx,
                      batch: Sequence[tuple[PreparedSave[WritePlan], Mapping[str, Any]]] = batch,
                      plans: list[WritePlan] = plans) -> None:
                # The parent's row first, locked (parents before children, as everywhere):
                # a cancel committed meanwhile has moved its fence, and this is refused.
                row = tx.one(SELECT_GUARD + self.dialect.lock_row, (parent_run,))
                if lease is not None:
                    check_lease(parent_run, Guard(*row) if row else None, lease,
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
            row = tx.one(SELECT_GUARD + self.dialect.lock_row, (run_id,))
            if row is None:
                raise RunNotFoundError(run_id)
            current = Guard(*row)
            now = time.time()
            cancelling = status == RunStatus.CANCELLED
            if not cancelling:
                check_lease(run_id, current, lease, now)
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


__all__ = ["SqlStore"]
