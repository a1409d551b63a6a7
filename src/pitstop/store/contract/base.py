"""The store contract: the one interface every backend implements and every test runs against.

A store keeps runs and their immutable checkpoints. Each checkpoint's state is a mapping of
top-level fields; each field value is serialised on its own and stored once under its content
hash, so a value that did not change since the parent checkpoint is never written again.

Backends (SQLite, in-memory, PostgreSQL) subclass :class:`Store`. Nothing in this module knows
about any backend.
"""

from __future__ import annotations

import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from ...errors import CheckpointNotFoundError
from ...model import Checkpoint, CheckpointSummary, Run, RunStatus
from .save import UNSET, Durability, PreparedSave, SaveRequest, Unset, keyword_request

if TYPE_CHECKING:
    from ...serde import Serializer
    from ..engine.cache import CacheEntry, CacheHit
    from ..engine.schema import ScheduleRow
    from ..transfer.runs import RunExport
    from .aio import AsyncStore


Progress = Callable[[int, int | None], None]
"""Called as ``progress(done, total)`` by long maintenance operations (total may be unknown)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Exclusive ownership of a run until ``expires_at`` (unix seconds).

    ``token`` is the fencing token: it grows every time the run changes hands, and every write
    made under a lease carries it, so a write from an owner whose lease was taken is rejected.
    """

    run_id: str
    owner: str
    token: int
    expires_at: float
    workflow: str | None = None
    """The run's workflow, when the store knows it (a claim does): what a worker executes."""


@dataclass(frozen=True, slots=True)
class Input:
    """An external input delivered to a run (an approval, a callback payload, a human edit)."""

    id: str
    run_id: str
    name: str
    payload: Any
    created_at: datetime
    consumed_by: str | None = None


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which checkpoints and runs a :meth:`Store.prune` may delete.

    Whatever the policy, a run's head (the checkpoint it would resume from) is never deleted,
    and a blob is deleted only when no remaining checkpoint references it.
    """

    keep_last: int | None = None
    """Keep the newest N checkpoints of each run (None: keep all)."""
    keep_milestones: bool = True
    """Keep checkpoints tagged as milestones (any tag in ``metadata["tags"]``: a workflow's
    ``milestone=True`` steps, ``Checkpointer.save(..., tags=["best"])``)."""
    keep_every: int | None = None
    """Also keep every checkpoint whose step is a multiple of N (with ``keep_last``: the
    newest few plus a sparse trail of older ones, as Orbax's ``keep_period``)."""
    finished_older_than: timedelta | float | None = None
    """Delete whole runs that finished (see ``finished_statuses``) longer ago than this."""
    finished_statuses: frozenset[RunStatus] = frozenset(
        {RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED}
    )

    def __post_init__(self) -> None:
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError("keep_last must be at least 1 (the run's head is always kept)")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError("keep_every must be at least 1")

    @property
    def prunes_checkpoints(self) -> bool:
        """Whether the policy deletes checkpoints of runs it keeps (not only whole runs)."""
        return self.keep_last is not None or self.keep_every is not None

    @property
    def finished_age(self) -> float | None:
        """``finished_older_than`` in seconds (None: finished runs are kept)."""
        age = self.finished_older_than
        return age.total_seconds() if isinstance(age, timedelta) else age


@dataclass(slots=True)
class PruneReport:
    """What a prune or delete removed (or, with ``dry_run``, would remove)."""

    dry_run: bool = False
    checkpoints: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    blobs: int = 0
    bytes_reclaimed: int = 0
    """Bytes of checkpoint records and values (what ``stats().bytes`` counts)."""
    effects: int = 0
    """Effect records removed with their checkpoints or runs."""
    effect_bytes: int = 0
    inputs: int = 0
    """Delivered inputs removed with their runs."""
    input_bytes: int = 0
    cache_entries: int = 0
    """Expired cached results deleted (with ``run_id``: those the run computed)."""

    def merge(self, other: PruneReport) -> None:
        """Add ``other``'s deletions to this report."""
        self.checkpoints.extend(other.checkpoints)
        self.runs.extend(other.runs)
        self.blobs += other.blobs
        self.bytes_reclaimed += other.bytes_reclaimed
        self.effects += other.effects
        self.effect_bytes += other.effect_bytes
        self.inputs += other.inputs
        self.input_bytes += other.input_bytes
        self.cache_entries += other.cache_entries


@dataclass(frozen=True, slots=True)
class StoreStats:
    runs: int
    checkpoints: int
    blobs: int
    bytes: int
    """Bytes of checkpoint records and field values held (after compression)."""
    runs_by_status: Mapping[str, int]
    file_bytes: int | None = None
    """Size of the store on disk where that is one number (SQLite), else None."""
    estimated: frozenset[str] = frozenset()
    """Which of the numbers are estimates (only ever with ``stats(exact=False)``): field names
    (``runs``, ``checkpoints``, ``blobs``, ``bytes``, ``effects``, ``inputs``, ``value_refs``,
    ``attached``) and ``runs_by_status.STATUS``."""
    cache_entries: int = 0
    """Results held in the cache across runs (``CachePolicy``, ``ctx.cached``)."""
    effects: int = 0
    """Effect records (``ctx.effect``, map items, loop positions, pending writes kept aside)."""
    effect_bytes: int = 0
    """Bytes of their recorded results (not in ``bytes``)."""
    inputs: int = 0
    """Delivered inputs, consumed or not."""
    input_bytes: int = 0
    """Bytes of their payloads (not in ``bytes``)."""
    value_refs: int = 0
    """Rows saying a run references a value another run stored (deduplication's cost)."""
    attached_bytes: int = 0
    """Bytes of records attached to checkpoints (an integration's pending writes; not in
    ``bytes``)."""

    @property
    def all_bytes(self) -> int:
        """Everything the store's records hold: ``bytes`` and effects, inputs, attachments."""
        return self.bytes + self.effect_bytes + self.input_bytes + self.attached_bytes


@dataclass(frozen=True, slots=True)
class Problem:
    """One bad record found by :meth:`Store.verify`."""

    kind: Literal["checkpoint", "blob", "input", "effect", "run", "cache", "store"]
    """What is bad: a record of that kind (``cache``: a cached result, ``id`` its key), or
    ``store``: the database itself (SQLite's integrity check; ``id`` is then the file)."""
    id: str
    message: str
    run_id: str | None = None

    def __str__(self) -> str:
        run = f" (run {self.run_id})" if self.run_id else ""
        return f"{self.kind} {self.id}{run}: {self.message}"


class Problems(list[Problem]):
    """What :meth:`Store.verify` returns: the problems found, and :attr:`notes` on what it
    could not check (PostgreSQL's index check without the ``amcheck`` extension)."""

    def __init__(self, problems: Iterable[Problem] = (), notes: Iterable[str] = ()) -> None:
        super().__init__(problems)
        self.notes: list[str] = list(notes)


class RunList(list[Run]):
    """What :meth:`Store.runs` returns: the runs, and the rows it could not read.

    A damaged run row (a status no pitstop writes, metadata that is not JSON) must not hide
    every other run: it is left out of the list and described in :attr:`damaged`, the way
    :meth:`Store.verify` reports it.
    """

    damaged: list[Problem]

    def __init__(self, runs: Iterable[Run] = (), damaged: Iterable[Problem] = ()) -> None:
        super().__init__(runs)
        self.damaged = list(damaged)


class Store(ABC):
    """Runs and immutable checkpoints, stored outside the process.

    Every method is safe to call from several threads. Several processes (and, for shared
    backends, several machines) may use one store at once: writes to one run are serialised
    by the store, and :meth:`acquire` gives one owner exclusive use of a run.
    """

    url: str
    serializer: Serializer

    # -- checkpoints -------------------------------------------------------------------------

    size_warning: int | None = None
    """Bytes of state at which a workflow's checkpoint is flagged (logged, counted in metrics,
    marked on the run) when its workflow sets no ``size_warning`` of its own. Set it on the
    store object: ``store.size_warning = 50 * 2**20``."""

    def save(
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
        effects: Mapping[str, Mapping[str, Any]] | None = None,
        attach: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Checkpoint:
        """Write a new immutable checkpoint of ``state`` for ``run_id``, atomically.

        ``parent_id`` defaults to the run's head, so successive saves form a chain; naming an
        earlier checkpoint starts a branch (of this run, or of another run: a fork).
        ``step`` defaults to the parent's step + 1 (0 for a first checkpoint).

        ``changed`` names the fields that differ from the parent, when the caller knows: the
        others are not serialised again but reuse the parent's stored values (a promise by the
        caller). Without it every field is serialised and compared by content hash; either
        way a value equal to the parent's is never stored twice.

        ``expected_head`` makes the write conditional: it fails with
        :class:`~pitstop.ConflictError` unless the run's head is that checkpoint (``None``: the
        run has none yet). ``lease`` fences the write: it fails with
        :class:`~pitstop.LeaseLostError` if the lease was taken over meanwhile. A write without
        a lease to a run whose live lease another owner holds fails with
        :class:`~pitstop.RunBusyError`. ``release`` (with ``lease``) gives the lease up in the
        same write: a run's last checkpoint before its owner stops (completed, waiting,
        failed) then needs no separate :meth:`release`, and the run is never seen waiting
        yet still owned.

        ``status`` and ``workflow`` update the run (created on first save). Metadata keys
        ``waiting_for`` (names) and ``wake_at`` (unix seconds) are mirrored onto the run.
        ``consumed_inputs`` marks delivered inputs as used by this checkpoint.

        ``checkpoint_id`` lets the caller choose the new checkpoint's id (for integrations
        whose framework makes its own ids); it must be unique in the store and should sort
        after its parent's, as generated ids do.

        ``durability`` overrides the store's default for this write (``full``: synced to
        stable storage before returning; ``normal``: survives a crash of this process).

        ``effects`` records keyed results of the run in the same transaction, as
        :meth:`record_effects` would (existing keys are kept): ``{checkpoint id: {key:
        result}}``, each group attached to that checkpoint (an earlier one of the run, or
        this one, named by ``checkpoint_id``). The checkpoint and the records commit together
        or not at all: an integration that would otherwise commit its pending writes on their
        own saves a transaction per step this way.

        ``attach`` does the same for :meth:`attach`'s records, kept in their checkpoint's row
        (``{checkpoint id: {key: result}}``, existing keys kept): records attached to this
        very checkpoint go into the row it inserts.

        Raises :class:`~pitstop.SerializationError` naming the run and field path before
        anything is written: the previous head stays the run's latest checkpoint.
        """
        # SaveRequest.of, positionally (see keyword_request: this is every keyword save).
        return self.save_request(keyword_request(
            SaveRequest, run_id, state, parent_id, step, metadata, changed, schema_version,
            workflow, status, expected_head, lease, release, consumed_inputs, durability,
            checkpoint_id, None, effects, attach,
        ))

    @abstractmethod
    def save_request(self, request: SaveRequest) -> Checkpoint:
        """:meth:`save` of a :class:`~pitstop.store.SaveRequest`: the form the runtime and
        the integrations use (one typed record instead of keywords; its run control is
        explicit, never read out of metadata)."""

    def _save_and_prune(self, request: SaveRequest, policy: RetentionPolicy) -> Checkpoint:
        """:meth:`save_request`, then :meth:`prune` of the request's run by ``policy``: what
        a loop with retention does after every save. A store that can do both in the save's
        own transaction (one commit, one sync) overrides this; here they are two."""
        checkpoint = self.save_request(request)
        self.prune(policy, run_id=request.run_id)
        return checkpoint

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
    ) -> PreparedSave[Any]:
        """The first half of :meth:`save`: serialise and check, write nothing.

        ``deliver_to`` names the parent of a child run: a save that completes or fails the
        run delivers its outcome to that parent in the same transaction.

        Serialisation errors are raised here. The prepared checkpoint's id is final, so the
        next checkpoint may name it as its parent before it is committed.
        """
        return self.prepare_request(keyword_request(
            SaveRequest, run_id, state, parent_id, step, metadata, changed, schema_version,
            workflow, status, expected_head, lease, release, consumed_inputs, durability,
            checkpoint_id, deliver_to, effects, attach,
        ))

    @abstractmethod
    def prepare_request(self, request: SaveRequest) -> PreparedSave[Any]:
        """:meth:`prepare` of a :class:`~pitstop.store.SaveRequest` (see :meth:`save_request`)."""


    @abstractmethod
    def commit(self, prepared: PreparedSave[Any]) -> Checkpoint:
        """The second half of :meth:`save`: write a prepared checkpoint, atomically.

        Prepared checkpoints of one run must be committed in the order they were prepared.
        If the run's head moved since :meth:`prepare` (and no explicit parent was given),
        raises :class:`~pitstop.ConflictError`.
        """

    @abstractmethod
    def get(self, checkpoint_id: str, *, strict: bool = True) -> Checkpoint:
        """The checkpoint with this id, its state rebuilt and verified against its checksums.

        ``strict=False`` returns :class:`~pitstop.serde.UnknownObject` placeholders for values
        of classes not registered in this process instead of raising (inspection tools).
        """

    def get_many(
        self, checkpoint_ids: Iterable[str], *, strict: bool = True
    ) -> dict[str, Checkpoint]:
        """Several checkpoints by id, each as :meth:`get` returns it; ids with no checkpoint
        are left out. SQL backends read them together (the records in one query, their
        separately stored values in one more): a parent woken by a thousand children loads
        their final states in a few round trips, not a thousand."""
        found: dict[str, Checkpoint] = {}
        for checkpoint_id in dict.fromkeys(checkpoint_ids):
            try:
                found[checkpoint_id] = self.get(checkpoint_id, strict=strict)
            except CheckpointNotFoundError:
                continue
        return found

    @abstractmethod
    def latest(
        self, run_id: str, *, fallback: bool = False, strict: bool = True
    ) -> Checkpoint | None:
        """The run's head checkpoint (the one it continues from), or None if it has none.

        A corrupt head (a damaged record, or a head that is missing or another run's)
        raises :class:`~pitstop.CorruptCheckpointError`; with ``fallback=True`` the newest
        valid checkpoint older than the head is returned instead, and its ``skipped``
        attribute lists the checkpoints passed over and why. It is looked for along the
        head's ancestry (its own branch, on a run resumed from an earlier checkpoint) while
        the records' checksums vouch for their parent links, then by stored order (a record
        whose checksum fails has links that cannot be trusted).
        """

    def latest_with_run(
        self, run_id: str, *, fallback: bool = False, strict: bool = True
    ) -> tuple[Run, Checkpoint | None]:
        """The run and its head checkpoint, read together (what resuming a run needs).

        Raises :class:`~pitstop.RunNotFoundError` if there is no such run. Backends read both
        in one transaction, so a worker picking up a run pays one round trip, not two.
        """
        return self.get_run(run_id), self.latest(run_id, fallback=fallback, strict=strict)

    @abstractmethod
    def summary(self, checkpoint_id: str) -> CheckpointSummary:
        """A checkpoint's record without opening its state."""

    def summaries(self, checkpoint_ids: Iterable[str]) -> dict[str, CheckpointSummary]:
        """Several checkpoints' records without opening their states, by id; ids with no
        checkpoint are left out. SQL backends read them in one query (a page listing 50
        runs with their heads pays one round trip, not 50)."""
        found: dict[str, CheckpointSummary] = {}
        for checkpoint_id in dict.fromkeys(checkpoint_ids):
            try:
                found[checkpoint_id] = self.summary(checkpoint_id)
            except CheckpointNotFoundError:
                continue
        return found

    @abstractmethod
    def history(
        self, run_id: str, *, limit: int | None = 100, before: str | None = None
    ) -> list[CheckpointSummary]:
        """The run's checkpoints newest first, without deserialising any state.

        Paginate with ``before=<id of the last entry of the previous page>``.
        """

    def fork(
        self,
        checkpoint_id: str,
        *,
        new_run_id: str | None = None,
        update: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        workflow: str | Unset | None = UNSET,
        status: RunStatus = RunStatus.RUNNING,
    ) -> Checkpoint:
        """A new run whose first checkpoint is a copy of ``checkpoint_id``, optionally edited.

        Unchanged fields are shared with the source, not copied. The source is untouched.
        """
        from ...ids import new_id

        source = self.get(checkpoint_id)
        origin = self.get_run(source.run_id)
        run_id = new_run_id or new_id()
        state = dict(source.state)
        state.update(update or {})
        meta = {
            k: v
            for k, v in source.metadata.items()
            if k not in ("source", "tags", "waiting_for", "wake_at", "error", "status")
        }
        meta.update(
            {"source": "fork", "forked_from": {"run_id": source.run_id, "checkpoint_id": source.id}}
        )
        meta.update(metadata or {})
        # The new run's row and its first checkpoint in one transaction (start_run): a
        # crash leaves the whole fork or nothing, never a run without a state to resume.
        prepared = self.prepare(
            run_id,
            state,
            parent_id=source.id,
            step=source.step,
            metadata=meta,
            changed=list(update or ()),
            schema_version=source.schema_version,
            workflow=origin.workflow if workflow is UNSET else workflow,
            status=status,
            expected_head=None,
        )
        ckpt, _ = self.start_run(
            prepared, metadata={**origin.metadata, "forked_from": source.run_id}
        )
        return ckpt

    # -- runs --------------------------------------------------------------------------------

    @abstractmethod
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
        """Register a run before its first checkpoint (e.g. a queued run); ``parent_run``
        makes it a child of that run (see :meth:`children`)."""

    @abstractmethod
    def start_run(
        self,
        prepared: PreparedSave[Any],
        *,
        metadata: Mapping[str, Any] | None = None,
        priority: int = 0,
        owner: str | None = None,
        ttl: float = 30.0,
    ) -> tuple[Checkpoint, Lease | None]:
        """Create a run together with its first checkpoint, in one transaction.

        ``prepared`` is a save prepared with ``expected_head=None`` (and the run's
        ``workflow`` and ``status``); ``metadata`` and ``priority`` are the run's. With
        ``owner`` the run is born leased to it for ``ttl`` seconds. Returns the checkpoint
        and the lease (None without ``owner``). A crash or a lost connection leaves the
        whole run or nothing: never a run without the input it would resume from. Raises
        :class:`~pitstop.RunExistsError` (writing nothing) if a run of that id exists.
        """

    @abstractmethod
    def start_children(
        self,
        parent_run: str,
        children: Sequence[tuple[PreparedSave[Any], Mapping[str, Any]]],
        *,
        lease: Lease | None = None,
    ) -> None:
        """Create child runs of ``parent_run`` with their first checkpoints, queued: each a
        save prepared with ``status=QUEUED, expected_head=None`` and the run's metadata.
        Raises :class:`~pitstop.RunExistsError` (creating none of its batch of 100) if a
        run of such an id exists, and :class:`~pitstop.LeaseLostError` if ``lease`` (the
        parent's) no longer holds it: a cancelled parent starts no children."""

    def children_summary(self, run_id: str, *, first: int = 20) -> tuple[dict[str, int],
                                                                         list[Run]]:
        """``run_id``'s children counted by status, and the ``first`` oldest of them: what a
        view of a family shows, at a cost that does not grow with the family (SQL backends:
        one statement over the parent index)."""
        counts = self.count_runs(parent_run=run_id)
        return counts, self.children(run_id, limit=first) if counts else []

    @abstractmethod
    def children(self, run_id: str, *, limit: int | None = None) -> list[Run]:
        """The child runs ``run_id``'s steps started (``ctx.run_child``), oldest first."""

    @abstractmethod
    def get_run(self, run_id: str) -> Run:
        """The run, or :class:`~pitstop.RunNotFoundError`."""

    @abstractmethod
    def runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        id_prefix: str | None = None,
        before: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
        parent_run: str | None = None,
    ) -> RunList:
        """Runs newest first, filtered by status, workflow, creation time, metadata values,
        the start of their id and the run that started them (``parent_run``).

        A run whose row is damaged is left out and named in the result's
        :attr:`~RunList.damaged` (``pitstop runs`` reports it; :meth:`verify` too).

        Paginate with ``before=<id of the last run of the previous page>`` (keyset paging:
        as fast on the thousandth page as on the first, and no run is skipped or repeated
        when new runs arrive meanwhile), or with ``offset``.
        """

    @abstractmethod
    def count_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        metadata: Mapping[str, Any] | None = None,
        id_prefix: str | None = None,
        parent_run: str | None = None,
    ) -> dict[str, int]:
        """How many runs match these filters (the same as :meth:`runs`), by status value;
        statuses with no run are left out."""

    @abstractmethod
    def update_run(
        self,
        run_id: str,
        *,
        status: RunStatus | None = None,
        metadata: Mapping[str, Any] | None = None,
        lease: Lease | None = None,
    ) -> Run:
        """Change a run's status and/or merge keys into its metadata (fenced by ``lease``)."""

    @abstractmethod
    def delete_run(self, run_id: str) -> PruneReport:
        """Delete a run with its checkpoints, inputs and effect records, and unshared values."""

    # -- retention and maintenance ---------------------------------------------------------

    @abstractmethod
    def prune(
        self,
        policy: RetentionPolicy,
        *,
        run_id: str | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> PruneReport:
        """Apply a retention policy to one run or to all runs. See :class:`RetentionPolicy`."""

    def delete_checkpoints(
        self, run_id: str, checkpoint_ids: Iterable[str], *, dry_run: bool = False
    ) -> PruneReport:
        """Delete these checkpoints of ``run_id``, their effect records and the values only
        they used; ids that are not the run's are ignored.

        For frameworks that delete individual checkpoints (LangGraph's ``delete_for_runs``
        removes the checkpoints one invocation wrote). Unlike :meth:`prune` this may delete
        the head: the run then continues from its newest remaining checkpoint (it has no head
        if none remain). Children of a deleted checkpoint keep its id as their parent, as
        after a prune.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot delete single checkpoints")

    @abstractmethod
    def stats(self, *, exact: bool = True) -> StoreStats:
        """Counts and bytes held.

        Exact counts read every row. ``exact=False`` bounds the work whatever the store's
        size: a count that stays small is still exact, a larger one may be estimated from a
        random sample of the table's pages (on databases that can sample: PostgreSQL), and
        :attr:`StoreStats.estimated` says which numbers are estimates.
        """

    @abstractmethod
    def verify(self, *, progress: Progress | None = None) -> Problems:
        """Check every record's checksum and every reference, every run row (its fields, and
        that its head is one of its own checkpoints) and the database's own check of its
        indexes (SQLite's ``PRAGMA integrity_check``; on PostgreSQL ``amcheck``'s
        ``bt_index_check``, installed if this role may: where it cannot run, the returned
        list's ``notes`` say so); return what is wrong."""

    @abstractmethod
    def migrate(self) -> int:
        """Bring the store's own tables to this version of pitstop; return the schema version."""

    # -- ownership ---------------------------------------------------------------------------

    @abstractmethod
    def acquire(
        self, run_id: str, owner: str, *, ttl: float = 30.0, takeover: str | None = None
    ) -> Lease:
        """Take exclusive ownership of a run for ``ttl`` seconds.

        Raises :class:`~pitstop.RunBusyError` while another owner's lease is live. An expired
        lease is taken over, and the fencing token grows so the old owner's writes fail.
        ``takeover`` names a live owner known to be dead (its process is gone): its lease is
        taken at once, and only if that owner still holds it.
        """

    @abstractmethod
    def renew(self, lease: Lease, *, ttl: float = 30.0) -> Lease:
        """Extend a lease; :class:`~pitstop.LeaseLostError` if it was taken over."""

    @abstractmethod
    def release(self, lease: Lease) -> None:
        """Give a run up (a no-op if the lease was already taken over)."""

    @abstractmethod
    def claim(
        self,
        owner: str,
        *,
        workflows: Iterable[str] | None = None,
        limit: int = 1,
        ttl: float = 30.0,
        waiting_only: bool = False,
    ) -> list[Lease]:
        """Lease up to ``limit`` runnable runs for a worker.

        Runnable: queued; waiting with all awaited inputs delivered or a due timer; running
        with an expired lease (its owner died). Higher priority first, then oldest.
        Concurrent claimers never receive the same run. ``waiting_only`` claims only waiting
        runs that became due (what the inspector resumes: it is not a worker for queued runs).
        """

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a run may have become runnable (queued, sent an input, released) or
        ``timeout`` seconds passed; True if a signal ended the wait. Stores that can signal
        (PostgreSQL: LISTEN/NOTIFY) wake workers at once; the others just sleep (and answer
        False), and workers poll."""
        import time

        time.sleep(timeout)
        return False

    # -- inputs and effect records -------------------------------------------------------------

    @abstractmethod
    def send(self, run_id: str, name: str, payload: Any) -> Input:
        """Deliver an input to a run that is waiting for ``name``; stored durably.

        Raises :class:`~pitstop.InputError` (and stores nothing) if the run has finished, is
        not waiting for that name, or already has an undelivered input of that name.
        """

    @abstractmethod
    def inputs(self, run_id: str, *, pending: bool = True) -> dict[str, Input]:
        """The run's delivered inputs by name (only those not yet consumed, by default)."""

    @abstractmethod
    def get_effect(self, run_id: str, key: str) -> tuple[bool, Any]:
        """``(True, result)`` if an effect with this key was recorded for the run."""

    @abstractmethod
    def record_effect(
        self, run_id: str, key: str, result: Any, *, checkpoint_id: str | None = None
    ) -> Any:
        """Record an effect's result once; returns the recorded result (the first one wins).

        ``checkpoint_id`` is the checkpoint the effect's step started from: pruning that
        checkpoint drops the record.
        """

    def record_effect_first(
        self, run_id: str, key: str, result: Any, *, checkpoint_id: str | None = None
    ) -> tuple[bool, Any]:
        """:meth:`record_effect`, and whether this call recorded it (False: another
        execution of the step had recorded its result first, so the effect ran twice)."""
        recorded = self.record_effect(run_id, key, result, checkpoint_id=checkpoint_id)
        return recorded is result, recorded

    @abstractmethod
    def record_effects(
        self,
        run_id: str,
        results: Mapping[str, Any],
        *,
        checkpoint_id: str | None = None,
        replace: bool = False,
    ) -> None:
        """Record several keyed results in one transaction (existing keys are kept, or
        overwritten with ``replace=True``). Integrations keep pending writes this way."""

    @abstractmethod
    def effects(self, run_id: str, *, checkpoint_id: str | None = None) -> dict[str, Any]:
        """The run's recorded results by key (only those attached to ``checkpoint_id``)."""

    @abstractmethod
    def attach(
        self,
        run_id: str,
        checkpoint_id: str,
        records: Mapping[str, Any],
        *,
        replace: bool = False,
    ) -> None:
        """Attach keyed results to a checkpoint of the run, in one transaction (existing keys
        are kept, or overwritten with ``replace=True``): an integration's pending writes.

        They are kept in the checkpoint's row, outside its checksum (the checkpoint does not
        change), each with a checksum of its own that :meth:`verify` checks, and they go
        wherever the checkpoint goes (prune, delete, export, archive). Records attached to a
        checkpoint not written yet are kept as effect records naming it, and found the same
        way. Not visible to :meth:`get_effect` or :meth:`effects`.
        """

    @abstractmethod
    def attachments(self, run_id: str, checkpoint_id: str) -> dict[str, Any]:
        """What :meth:`attach` (or ``save(attach=...)``) attached to the checkpoint, and the
        effect records naming it (as stores before schema 8 kept pending writes), by key."""

    # -- results cached across runs (see pitstop.store.cache) ----------------------------

    def _no_cache(self) -> NoReturn:
        from ...errors import UnsupportedStoreError

        raise UnsupportedStoreError(
            f"{type(self).__name__} keeps no result cache and no schedules")

    def cache_get(self, key: str) -> CacheHit | None:
        """The live cached result of ``key`` (None: none, being computed, or expired)."""
        self._no_cache()

    def cache_claim(self, key: str, name: str, owner: str, *, lease: float) -> str:
        """Claim computing ``key``: ``"claimed"``, or ``"busy"`` (another owner computes it,
        or a result appeared)."""
        self._no_cache()

    def cache_renew(self, key: str, owner: str, *, lease: float) -> bool:
        """Extend ``owner``'s claim of ``key``; False once it no longer holds it."""
        self._no_cache()

    def cache_abandon(self, key: str, owner: str) -> None:
        """Drop ``owner``'s claim of ``key`` (its computation failed): nothing is cached."""
        self._no_cache()

    def cache_put(
        self,
        key: str,
        name: str,
        values: Mapping[str, Any],
        *,
        owner: str | None = None,
        ttl: float | None = None,
        run_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> CacheEntry:
        """Store ``values`` as the cached result of ``key`` (a live one stored first stands)."""
        self._no_cache()

    def cache_entries(
        self, *, name: str | None = None, limit: int | None = None
    ) -> list[CacheEntry]:
        """Cached results (and claims being computed), newest first, values unread."""
        self._no_cache()

    def cache_clear(
        self,
        *,
        name: str | None = None,
        older_than: float | None = None,
        expired_only: bool = False,
        key: str | None = None,
    ) -> int:
        """Delete cached results (filtered) and the values only they held; how many."""
        self._no_cache()

    # -- schedules (see pitstop.store.schedules, pitstop.runtime.schedules) --------------

    def schedule_put(
        self, name: str, workflow: str, cron: str, timezone: str, input: Any, *,
        catchup: str, overlap: str, next_tick: float,
    ) -> ScheduleRow:
        """Create or redefine the schedule ``name`` (use ``Workflow.schedule``)."""
        self._no_cache()

    def schedule_rows(
        self, *, workflows: list[str] | None = None, name: str | None = None
    ) -> list[ScheduleRow]:
        """Stored schedules by name (only those of ``workflows``, or the one ``name``)."""
        self._no_cache()

    def schedule_input(self, row: ScheduleRow) -> Any:
        """The input a schedule's runs start with."""
        self._no_cache()

    def schedule_delete(self, name: str) -> None:
        """Remove a schedule (its runs stay)."""
        self._no_cache()

    def schedule_pause(self, name: str, paused: bool, next_tick: float | None = None) -> None:
        """Pause or resume a schedule."""
        self._no_cache()

    def schedule_advance(
        self, name: str, expected: float, next_tick: float, last_run: str | None
    ) -> bool:
        """Move a schedule's next tick by compare-and-set."""
        self._no_cache()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def aio(self) -> AsyncStore:
        """The same store with an ``async`` API of the same shape."""
        from .aio import AsyncStore

        return AsyncStore(self)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and files. The store is unusable afterwards."""

    def _call_before_close(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` (a bound method) run when :meth:`close` begins, while the store
        still works: a LangGraph saver over this store commits the pending writes it holds
        there, so closing the store without closing the saver loses none. Held weakly: the
        store does not keep its callers alive."""
        callbacks: list[weakref.WeakMethod[Callable[[], None]]] | None
        callbacks = self.__dict__.get("_before_close")
        if callbacks is None:
            callbacks = self.__dict__["_before_close"] = []
        callbacks.append(weakref.WeakMethod(callback))

    def _run_before_close(self) -> None:
        """Run the callbacks :meth:`_call_before_close` registered (each once; a failure is
        logged, never stops the close)."""
        for ref in self.__dict__.pop("_before_close", ()):
            callback = ref()
            if callback is None:
                continue
            try:
                callback()
            except Exception:
                logging.getLogger("pitstop.store").exception(
                    "%s: could not finish %r before closing", self.url, callback
                )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- moving runs between stores ------------------------------------------------------------

    def export_run(self, run_id: str, *, stream: bool = False) -> RunExport:
        """The run with everything it owns, as raw stored records, read in one snapshot.

        Checkpoint records, values, inputs and effect records come out exactly as stored
        (nothing is deserialised), so :meth:`import_run` on another store recreates the run
        bit for bit: same ids, same checksums. Raises :class:`~pitstop.RunNotFoundError`.
        The run is held in memory; with ``stream=True`` it is not: its checkpoint, input and
        effect records are read a page at a time into temporary files (in the same snapshot)
        and read back each time they are iterated, and ``blobs`` reads each value from this
        store (which must stay open) when it is used, checked against its hash, so a run
        larger than memory exports in the memory of a page of records and its largest value
        (values never change once stored; one pruned meanwhile raises
        :class:`~pitstop.CorruptCheckpointError` saying so). ``pitstop export`` streams.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot export runs")

    def import_run(self, data: RunExport, *, progress: Progress | None = None) -> Run:
        """Write an exported run into this store, verbatim and in one transaction.

        Every checkpoint checksum and value hash is verified before anything is written
        (:class:`~pitstop.CorruptCheckpointError`). Fails with
        :class:`~pitstop.RunExistsError` if the run exists here, and with
        :class:`~pitstop.ConflictError` if one of its checkpoint or input ids does (they are
        unique in a store; to copy a run into a store that has it, give the export fresh ids
        first, as ``pitstop import --run-id`` does). Values already present are shared.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot import runs")


__all__ = [
    "UNSET",
    "Durability",
    "Input",
    "Lease",
    "PreparedSave",
    "Problem",
    "Progress",
    "PruneReport",
    "RetentionPolicy",
    "RunList",
    "Store",
    "StoreStats",
    "Unset",
]
