"""A step's save in few Python steps: small byte-string fields continuing the run's head.

An integration that serialises its values itself (the LangGraph saver) saves, at every step of
a graph, a checkpoint whose changed fields are a few short byte strings, as a child of the
run's head, with the previous step's records attached. The shared path
(:meth:`SqlStore.prepare <pitstop.store.engine.sql.SqlStore.prepare>`, then one transaction) decides
everything it could be asked on every such save: deltas, chunking, buffers, new values and
their references, leases, waiting runs, consumed inputs, children, retries on a moved head.
For a tiny state that generality was most of the save: about 2,000 Python opcodes of it,
against some 50 for the statements themselves.

:meth:`StepSaves.save_step` writes that one case directly and refuses every other (it returns
False having written nothing, and the caller takes the shared path, whose rules then apply
unchanged). Its case: the parent is the run's head as the caller expects it
(``expected_head``) and its fields are cached here (this process wrote or read it); every
field is either named in ``changed`` and a byte string short enough to be kept inline in the
record, or not named and unchanged from the parent; no lease, no per-save durability, nothing
but ``status`` ``RUNNING`` or none. What it writes is what the shared path writes for the same
save, byte for byte in every column but the timestamp: the same record and checksum, the same
conditional UPDATE of the run (head, lease and counters checked and moved in one statement),
the same attached records. A head that moved, a lease someone holds, a run that does not
exist, an id already taken: the UPDATE matches nothing or the INSERT fails, the transaction
rolls back, and the shared path runs the save again and says why (or writes it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

from ...model import RunStatus
from ..contract.base import Unset
from ..encoding.records import (
    INLINE_MAX,
    CheckpointRecord,
    FieldMap,
    FieldRef,
    Parent,
    check_text,
    encode_field_map,
    encode_metadata,
)
from .effects import Effects
from .schema import INSERT_CHECKPOINT, INSERT_UNATTACHED_CHECKPOINT, check_id

_STEP_BYTES_MAX: Final = INLINE_MAX
"""A field longer than this cannot serialise to an inline value (its encoding only adds)."""

_SETS_WAITING: Final = frozenset({"waiting_for", "wake_at"})
"""Metadata keys that make a save set the run's waiting fields (the shared path's case)."""


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
    """The conditional UPDATE that moves a run's head on a save (see ``sql.head_update``,
    which fills in its parameters): it assigns only what the save changes."""
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


class _NotWritten(Exception):
    """Raised inside the transaction to roll it back: the shared path takes the save."""


class StepSaves(Effects):
    """:meth:`save_step` (a part of ``SqlStore``; see the module documentation)."""

    step_saves: bool = False
    """Whether :meth:`save_step` writes at all (a backend turns it on). PostgreSQL already
    writes a step in one statement and one round trip; this path's several statements
    would cost it round trips."""

    def save_step(
        self,
        run_id: str,
        state: Mapping[str, Any],
        *,
        parent_id: str,
        changed: Iterable[str],
        expected_head: str | Unset | None,
        checkpoint_id: str,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        workflow: str | None = None,
        status: RunStatus | None = None,
        attach: Mapping[str, Mapping[str, bytes]] | None = None,
    ) -> bool:
        """Save as ``Store.save`` would with these options, if this is the case the module
        documentation describes; False (nothing written) if not."""
        if (
            not self.step_saves
            or expected_head != parent_id
            or (status is not None and status is not RunStatus.RUNNING)
            or (metadata and not _SETS_WAITING.isdisjoint(metadata))
            or type(state) is not dict
        ):
            return False
        parent: Parent | None = self._fields.get(parent_id)
        if parent is None or parent.run_id != run_id:
            return False
        codec = self._value_codec
        head = bytes((codec.serializer.format_id,))  # an inline frame's header (framing)
        before = parent.fields
        fields: FieldMap = {}
        names = changed if type(changed) is set else set(changed)
        size = 0
        for name, value in state.items():
            if name in names:
                if type(value) is not bytes or len(value) > _STEP_BYTES_MAX:
                    return False
                previous = before.get(name)
                if previous is not None and previous.manifest is not None:
                    return False
                raw = codec._dumps(value, run_id, "", name)
                if len(raw) >= INLINE_MAX:
                    return False
                if codec.sealer is None:
                    ref = FieldRef(b"", len(raw) + 1, head + raw)
                else:  # a sealed store's (see pitstop.store.encoding.sealing)
                    inline = codec.seal_inline(head + raw)
                    ref = FieldRef(b"", len(inline), inline)
            else:
                ref = before.get(name)  # type: ignore[assignment]
                if ref is None:
                    return False
            fields[name] = ref
            size += ref.size
        check_id("checkpoint_id", checkpoint_id)
        if workflow is not None:
            check_text("workflow", workflow)
        now = time.time()
        meta = encode_metadata(metadata, run_id) if metadata else "{}"
        packed_fields = encode_field_map(fields)
        record = CheckpointRecord(
            checkpoint_id, run_id, parent_id,
            step if step is not None else parent.step + 1,
            now, 0, meta, packed_fields, size, 0,
        )
        record.checksum = record.compute_checksum()
        others = []
        if attach:
            for target, results in attach.items():
                if results:
                    attachment = self._attachment(run_id, target, results, now, False)
                    if target == checkpoint_id:
                        record.writes = attachment.frames  # outside the checksum
                    else:
                        others.append(attachment)
        sets_status = status is not None
        params: list[Any] = [checkpoint_id, record.step, now, len(meta) + len(packed_fields)]
        if sets_status:
            params.append(status.value)  # type: ignore[union-attr]
        if workflow is not None:
            params.append(workflow)
        if sets_status:
            params += (None, None)  # waiting_for, wake_at: a running run waits for nothing
        params += (run_id, parent_id, now)
        move = head_update_sql(self.dialect.null_safe_eq, sets_status, workflow is not None,
                               sets_status, False, True, False)

        def write(tx: Any) -> None:
            if not tx.run(move, params).rowcount:
                raise _NotWritten
            if record.writes is None:
                tx.run(INSERT_UNATTACHED_CHECKPOINT, record.row()[:-1])
            else:
                tx.run(INSERT_CHECKPOINT, record.row())
            for attachment in others:
                self._write_attachment(tx, run_id, attachment)

        # Known before the write, as the shared path has it: a writer on another thread may
        # chain the next checkpoint on this one (its write then waits for this commit).
        self._fields.put(checkpoint_id, Parent(checkpoint_id, run_id, record.step, fields))
        try:
            self._tx(write, write=True)
        except BaseException as exc:
            self._fields.drop(checkpoint_id)
            if isinstance(exc, _NotWritten) or (
                isinstance(exc, Exception) and self._duplicate_checkpoint(exc)
            ):
                return False  # the shared path says why (with the checkpoint's id)
            raise
        self._heads.put(run_id, checkpoint_id)
        return True


__all__ = ["StepSaves", "head_update_sql"]
