"""Every exception pitstop raises on purpose.

Each error carries the coordinates of what went wrong (run, checkpoint, step, field) as
attributes *and* in its message, because the message is usually read in a log at 3 a.m. and
the attributes by code that wants to react.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class PitstopError(Exception):
    """Base class: ``except pitstop.PitstopError`` catches everything pitstop raises on purpose."""


class StoreError(PitstopError):
    """The store cannot be opened or used (unknown URL, unreachable server, schema too new)."""


class UnsupportedStoreError(StoreError, ValueError):
    """A store URL whose scheme pitstop does not know."""


class StoreSchemaError(StoreError):
    """The store's tables are at another schema version than this pitstop's: newer (upgrade
    pitstop), or older and not migrated automatically (``pitstop migrate``)."""

    def __init__(
        self, message: str, *, found: int | None = None, needed: int | None = None
    ) -> None:
        self.found = found
        """The store's schema version, when known."""
        self.needed = needed
        """The version this pitstop uses."""
        super().__init__(message)


class SerializationError(PitstopError, TypeError):
    """A value cannot be serialised (at save time) or rebuilt (at load time).

    Raised before anything is written: the run's previous checkpoint stays its latest.
    """

    action = "serialise"

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        path: str | None = None,
        type_name: str | None = None,
        action: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.path = path
        self.type_name = type_name
        self.reason = message
        if action is not None:
            self.action = action
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.run_id is not None:
            where.append(f"run {self.run_id!r}")
        if self.path is not None:
            where.append(f"at {self.path}" if self.path else "at the top level")
        if self.type_name is not None:
            where.append(f"(type {self.type_name})")
        prefix = f"cannot {self.action} " + " ".join(where) + ": " if where else ""
        return prefix + self.reason

    def located(
        self, *, run_id: str | None = None, path: str | None = None, action: str | None = None
    ) -> SerializationError:
        """A copy that also names the run and/or a full field path (filled in by the caller)."""
        return type(self)(
            self.reason,
            run_id=run_id if run_id is not None else self.run_id,
            path=path if path is not None else self.path,
            type_name=self.type_name,
            action=action or self.action,
        )


class UnregisteredTypeError(SerializationError):
    """A stored value names a class that is not on the allowlist, so it is not rebuilt."""

    action = "load"


class MalformedValueError(SerializationError):
    """The bytes are not a value pitstop's serializer writes: truncated, with bytes after the
    end of the value, or not msgpack at all. Unlike an unregistered class (a value this
    process cannot rebuild), that means the record was altered or crafted, and a store
    reports it as :class:`CorruptCheckpointError` (so ``fallback=True`` and ``verify`` treat
    it as the corruption it is)."""

    action = "load"


class EncryptionKeyError(StoreError):
    """A value is sealed (encrypted at rest) with a key this store was not given: the store
    was opened without its keys, or with a ring that lacks this one. Not corruption: the
    value is intact, and opens with the right key."""

    def __init__(self, message: str, *, key_id: str | None = None) -> None:
        super().__init__(message)
        self.key_id = key_id


class CorruptCheckpointError(PitstopError):
    """A stored record failed its checksum, is truncated, or cannot be decoded."""

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str | None = None,
        run_id: str | None = None,
        field: str | None = None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.run_id = run_id
        self.field = field
        self.detail = message
        """What is wrong, without the run/checkpoint/field prefix."""
        parts = []
        if run_id is not None:
            parts.append(f"run {run_id!r}")
        if checkpoint_id is not None:
            parts.append(f"checkpoint {checkpoint_id}")
        if field is not None:
            parts.append(f"field {field!r}")
        super().__init__(f"corrupt {' '.join(parts) or 'record'}: {message}")


class NotFoundError(PitstopError, LookupError):
    """Base for a run or checkpoint that does not exist."""


class RunNotFoundError(NotFoundError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in this store")


class RunNotStartedError(RunNotFoundError):
    """The run exists but has no checkpoint: it was registered without its input
    (``store.create_run``; ``Workflow.start``/``enqueue`` write the two in one transaction),
    so the store has nothing to restart it from."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        NotFoundError.__init__(
            self,
            f"run {run_id!r} has no checkpoint to continue from (it was registered, but its "
            f"input was never written, so the store cannot restart it); start it again with "
            f"its input and run_id={run_id!r}",
        )


class CheckpointNotFoundError(NotFoundError):
    def __init__(self, checkpoint_id: str, *, run_id: str | None = None,
                 detail: str | None = None) -> None:
        self.checkpoint_id = checkpoint_id
        self.run_id = run_id
        where = f" in run {run_id!r}" if run_id else ""
        more = f" ({detail})" if detail else ""
        super().__init__(f"no checkpoint {checkpoint_id!r}{where}{more}")


class AmbiguousReferenceError(NotFoundError):
    """A short form (a run id's start, ``RUN@ID``, a checkpoint id's start or end) that names
    more than one run or checkpoint, or a checkpoint of another run than the one given.
    ``candidates`` holds (up to a few of) the ids it could mean."""

    def __init__(self, message: str, *, reference: str, run_id: str | None = None,
                 candidates: tuple[str, ...] = ()) -> None:
        self.reference = reference
        self.run_id = run_id
        self.candidates = candidates
        super().__init__(message)


class RunExistsError(PitstopError, ValueError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} already exists; pick another id or resume it")


class ConflictError(PitstopError):
    """A write lost a race: the run's head moved since the writer read it.

    This is what stops two writers from silently forking one run's history.
    """

    def __init__(self, message: str, *, run_id: str, expected: str | None, actual: str | None):
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"run {run_id!r}: {message} (expected head {expected!r}, found {actual!r})"
        )


class RunBusyError(PitstopError):
    """Another live owner holds the run's lease."""

    def __init__(self, run_id: str, *, owner: str | None, expires_at: float | None) -> None:
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at
        if owner is None:
            # Only a row lock told: its holder is unknown until its transaction ends.
            super().__init__(
                f"run {run_id!r} is locked by another transaction (an owner saving, or one "
                "cut off from the network mid-transaction until the server notices); try "
                "again later"
            )
            return
        super().__init__(
            f"run {run_id!r} is owned by {owner!r} ({_lease_from_now(expires_at)}); it is "
            "taken over when that lease expires, or at once on the owner's host if its "
            "process is gone"
        )


def _lease_from_now(expires_at: float | None) -> str:
    """``lease expires in 12s``: a time from now, never an epoch number."""
    if expires_at is None:
        return "no lease expiry known"
    import time

    left = expires_at - time.time()
    if left <= 0:
        return "its lease has just expired"
    amount = f"{left:.0f}s" if left < 120 else (f"{left / 60:.0f}m" if left < 7200
                                                 else f"{left / 3600:.0f}h")
    return f"lease expires in {amount}"


class LeaseLostError(PitstopError):
    """A write from an owner whose lease was taken over (a stale fencing token) was rejected."""

    def __init__(self, run_id: str, *, owner: str, token: int, current_token: int | None) -> None:
        self.run_id = run_id
        self.owner = owner
        self.token = token
        self.current_token = current_token
        super().__init__(
            f"run {run_id!r}: write by {owner!r} with fencing token {token} rejected; "
            f"the lease was taken over (current token {current_token})"
        )


class InputError(PitstopError, ValueError):
    """An input was sent to a run that does not wait for it (or has finished)."""

    def __init__(self, message: str, *, run_id: str, name: str,
                 field: str | None = None) -> None:
        self.run_id = run_id
        self.name = name
        self.field = field
        """The field of the payload at fault, as a path (``approval.reason``), if one is."""
        super().__init__(f"run {run_id!r}, input {name!r}: {message}")


class FieldEditError(PitstopError, ValueError):
    """An edit of a state field that cannot be applied (``pitstop fork --set``,
    :func:`pitstop.edits.apply_field_edits`): an unknown field, or a value that does not
    convert to the type the field holds. Raised before anything is written."""

    def __init__(self, message: str, *, field: str) -> None:
        self.field = field
        """The field path at fault, as given (``plan`` or ``plan.steps[0]``)."""
        self.reason = message
        super().__init__(f"field {field!r}: {message}")


class StepFailedError(PitstopError):
    """A run failed: its step raised (after its retries). Raised by ``raise_for_status``."""

    def __init__(self, run_id: str, step: str | None, error: Mapping[str, Any]) -> None:
        self.run_id = run_id
        self.step = step
        self.error = dict(error)
        super().__init__(
            f"run {run_id!r} failed in step {step!r}: {error.get('type')}: {error.get('message')}"
        )


class ArchiveError(PitstopError):
    """A file is not a pitstop archive, is damaged, or is of a version this pitstop cannot read."""


class SchemaVersionError(PitstopError):
    """A checkpoint's state schema version is newer than the code, or no migration reaches it."""

    def __init__(self, message: str, *, run_id: str | None, checkpoint_id: str | None) -> None:
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        super().__init__(f"run {run_id!r}, checkpoint {checkpoint_id}: {message}")


class MapItemError(PitstopError):
    """An item of ``ctx.map`` raised: names the run, the step and the item
    (``map[name][index]``); the item's own exception is ``error`` (and ``__cause__``).

    The items that completed are recorded, so the step's retry runs only the others.
    """

    def __init__(
        self, run_id: str, step: str, name: str, index: int, error: BaseException
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.name = name
        self.index = index
        self.error = error
        super().__init__(
            f"run {run_id!r}, step {step!r}: map[{name}][{index}] raised "
            f"{type(error).__name__}: {error}"
        )
        self.__cause__ = error


class ChildRunError(PitstopError, ValueError):
    """``ctx.run_child``/``run_children`` was given something it cannot start (a workflow the
    worker does not run, a ``run_id`` another run has, input that is not a state): names the
    run and the step; no child was started."""

    def __init__(self, message: str, *, run_id: str, step: str) -> None:
        self.run_id = run_id
        self.step = step
        super().__init__(f"run {run_id!r}, step {step!r}: {message}")


class ChildFailedError(PitstopError):
    """A child run the step waited for failed or was cancelled: names the run, the step and
    the child; ``error`` is the child's error (its type, message, traceback, step).

    Raised by ``ctx.run_child``/``run_children`` once every child of the call finished;
    ``results`` holds all their :class:`~pitstop.ChildResult` s. Unhandled, it fails the
    parent's step (its retries apply); caught, the step decides.
    """

    def __init__(
        self,
        run_id: str,
        step: str,
        child_run: str,
        status: str,
        error: Mapping[str, Any] | None,
        results: list[Any],
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.child_run = child_run
        self.status = status
        self.error = dict(error or {})
        self.results = results
        why = (
            f"{self.error.get('type')}: {self.error.get('message')}"
            if self.error else status
        )
        super().__init__(
            f"run {run_id!r}, step {step!r}: child run {child_run!r} {status}"
            + (f" in step {self.error['step']!r}" if self.error.get("step") else "")
            + f" ({why})"
        )


class StreamError(PitstopError):
    """A stream job cannot go on with a partition: names the job and the partition (its run
    is ``"<job>/<partition>"``)."""

    def __init__(self, message: str, *, job: str, partition: int | None = None) -> None:
        self.job = job
        self.partition = partition
        where = f"stream job {job!r}" + (
            f", partition {partition} (run {job}/{partition})" if partition is not None else ""
        )
        super().__init__(f"{where}: {message}")


class TrimmedError(StreamError):
    """Records after a partition's stored position were trimmed from the stream before the
    job read them: resuming would silently skip them (see the job's ``on_trimmed``)."""


class PartitionCountError(StreamError):
    """A job's source has another partition count than the job's stored partitions."""


class BrokerUnavailableError(StreamError):
    """The stream broker (Redis, NATS) or a sink does not answer."""


class UndecodableRecordError(StreamError):
    """A record a source cannot decode, with the job's ``undecodable="fail"`` policy."""


class CacheKeyError(PitstopError, TypeError):
    """A value a cache key depends on (a ``CachePolicy`` input, a ``ctx.cached`` argument)
    has no canonical serialisation: raised at the first call, naming the run, the step and
    the field, rather than letting the cache silently miss."""

    def __init__(
        self, message: str, *, run_id: str | None, step: str, field: str | None = None
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.field = field
        where = f"run {run_id!r}, step {step!r}" if run_id else f"step {step!r}"
        super().__init__(f"{where}: {message}")


class RerunError(PitstopError, ValueError):
    """``rerun`` refused (nothing was written): the run is still running, or never reached
    the step to rerun from."""

    def __init__(self, message: str, *, run_id: str, step: str | None = None) -> None:
        self.run_id = run_id
        self.step = step
        super().__init__(f"run {run_id!r}: {message}")


class ScheduleError(PitstopError, ValueError):
    """A schedule refused: a cron expression that does not parse, an unknown timezone, a
    bad ``catchup``/``overlap``; or a schedule name that is not there."""

    def __init__(self, message: str, *, schedule: str) -> None:
        self.schedule = schedule
        super().__init__(f"schedule {schedule!r}: {message}")


__all__ = [
    "AmbiguousReferenceError",
    "ArchiveError",
    "BrokerUnavailableError",
    "CacheKeyError",
    "CheckpointNotFoundError",
    "ChildFailedError",
    "ChildRunError",
    "ConflictError",
    "CorruptCheckpointError",
    "EncryptionKeyError",
    "FieldEditError",
    "InputError",
    "LeaseLostError",
    "MapItemError",
    "NotFoundError",
    "PartitionCountError",
    "PitstopError",
    "RerunError",
    "RunBusyError",
    "RunExistsError",
    "RunNotFoundError",
    "RunNotStartedError",
    "ScheduleError",
    "SchemaVersionError",
    "SerializationError",
    "StepFailedError",
    "StoreError",
    "StoreSchemaError",
    "StreamError",
    "TrimmedError",
    "UndecodableRecordError",
    "UnregisteredTypeError",
    "UnsupportedStoreError",
]
