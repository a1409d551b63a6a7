"""A step's save in few Python steps: small byte-string fields continuing the run's head.

An integration that serialises its values itself (the LangGraph saver) saves, at every step of
a graph, a checkpoint whose changed fields are a few short byte strings, as a child of the
run's head, with the previous step's records attached. The shared path
(:meth:`SqlStore.prepare <pitstop.store.engine.sql.SqlStore.prepare>`, then one transaction) decides
everything it could be asked on every such save: deltas, chunking, buffers, new values and
their references, leases, waiting runs, consumed inputs, children, retries on a moved head.
For a tiny state that generality was most of the save: about 2,000 Python opcodes of it,
against some 50 for the statements themselves.

:meth:`StepSaves._prepare_step` builds the write plan of that one case directly, and
refuses every other (it returns None, and the caller takes the shared
:meth:`~pitstop.store.engine.sql.SqlStore._prepare`, whose rules then apply unchanged). Its
case: the parent is the run's head as the caller expects it (``expected_head``) and its
fields are cached here (this process wrote or read it); every field is either named in
``changed`` and a byte string short enough to be kept inline in the record, or not named and
unchanged from the parent; a caller-chosen id; no lease, no per-save durability, no wait,
nothing but ``status`` ``RUNNING`` or none. The plan is the one the shared path makes for the
same save, byte for byte in every column but the timestamp (``tests/test_store_steps.py``),
and it is written as every other save is (:func:`~pitstop.store.engine.write.write_checkpoint`;
PostgreSQL's one statement, which hands that function what it does not write): a moved head, a
lease someone holds, an id already taken are refused with the same errors.
"""

from __future__ import annotations

import time
from typing import Final

from ...model import RunStatus
from ..contract.save import SaveRequest
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
from .schema import check_id
from .write import WritePlan

_STEP_BYTES_MAX: Final = INLINE_MAX
"""A field longer than this cannot serialise to an inline value (its encoding only adds)."""


class StepSaves(Effects):
    """:meth:`_prepare_step` (a part of ``SqlStore``; see the module documentation)."""

    step_saves: bool = False
    """Whether :meth:`_prepare_step` plans anything (a backend turns it on). SQLite writes
    the plan with :func:`~pitstop.store.engine.write.write_checkpoint`; PostgreSQL sends it
    as its one-statement step (``PostgresStore.save_step``), whose client CPU was mostly
    the shared path's planning."""

    def _prepare_step(self, request: SaveRequest) -> WritePlan | None:
        """The plan the shared :meth:`_prepare` would make for this save, if this is the
        case the module documentation describes; None if not."""
        (run_id, state, changed, parent_id, step, checkpoint_id, metadata, schema_version,
         control, options) = request
        status, workflow, waiting_for, wake_at, _, deliver_to = control
        expected_head, lease, _, durability, consumed, effects, attach = options
        if (
            not self.step_saves
            or parent_id is None
            or changed is None
            or checkpoint_id is None
            or expected_head != parent_id
            or lease is not None or durability is not None or consumed or effects
            or (status is not None and status is not RunStatus.RUNNING)
            or waiting_for is not None or wake_at is not None or deliver_to is not None
            or schema_version != 0
            or type(state) is not dict
        ):
            return None
        parent: Parent | None = self._fields.get(parent_id)
        if parent is None or parent.run_id != run_id:
            return None
        codec = self._codec or self._value_codec  # (the property only until it is made)
        dumps = codec.serializer.dumps  # (its errors located as codec._dumps does)
        head = bytes((codec.serializer.format_id,))  # an inline frame's header (framing)
        before = parent.fields
        fields: FieldMap = {}
        names = changed if type(changed) is set else set(changed)
        size = 0
        for name, value in state.items():
            if name in names:
                if type(value) is not bytes or len(value) > _STEP_BYTES_MAX:
                    return None
                previous = before.get(name)
                if previous is not None and previous.manifest is not None:
                    return None
                try:
                    raw = dumps(value)
                except Exception as exc:
                    codec._dumps_failed(exc, run_id, name)
                if len(raw) >= INLINE_MAX:
                    return None
                if codec.sealer is None:
                    inline = head + raw
                    # The parent's value again (a LangGraph branch channel's None, at most
                    # steps): its ref, equal to the one that is then not made. (Made by
                    # tuple.__new__, fields in order: the named tuple without its Python
                    # __new__, as the Parent below.)
                    ref = (
                        previous
                        if previous is not None and previous.inline == inline
                        else tuple.__new__(FieldRef, (b"", len(inline), inline, None))
                    )
                else:  # a sealed store's (see pitstop.store.encoding.sealing)
                    inline = codec.seal_inline(head + raw)
                    ref = FieldRef(b"", len(inline), inline)
            else:
                ref = before.get(name)  # type: ignore[assignment]
                if ref is None:
                    return None
            fields[name] = ref
            size += ref.size
        check_id("checkpoint_id", checkpoint_id)
        if workflow is not None:
            check_text("workflow", workflow)
        now = time.time()
        record = CheckpointRecord(
            checkpoint_id, run_id, parent_id, step if step is not None else parent.step + 1,
            now, 0, encode_metadata(metadata, run_id) if metadata else "{}",
            encode_field_map(fields), size, 0,
        )
        record.checksum = record.compute_checksum()
        plan = WritePlan(record, fields, {}, [], False, parent_id, None, False, workflow,
                         status)
        plan.sets_waiting = status is not None  # a running run waits for nothing
        if attach:
            others = []
            for target, results in attach.items():
                if results:
                    attachment = self._attachment(run_id, target, results, now, False)
                    if target == checkpoint_id:
                        record.writes = attachment.frames  # outside the checksum
                    else:
                        others.append(attachment)
            plan.attach = others
        # Known before the write, as the shared path has it: a writer on another thread may
        # chain the next checkpoint on this one (its write then waits for this commit).
        self._fields.put(
            checkpoint_id, tuple.__new__(Parent, (checkpoint_id, run_id, record.step, fields))
        )
        return plan


__all__ = ["StepSaves"]
