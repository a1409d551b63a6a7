"""A stream job: a handler over the records of a partitioned source, exactly once.

Each partition is a pitstop run (``"<job>/<partition>"``). Its checkpoint holds, in one
atomic write, the source position, the keyed state's changes and the outbox (outputs emitted
since the last delivery). After the commit the sink delivers the outbox idempotently (see
:mod:`pitstop.stream.sinks`). A crash anywhere resumes from the last checkpoint: the source
seeks to its position, the state is what that position produced, and the outbox is
delivered again, which the sink's delivery mark turns into nothing new.

Processes running the same job share its partitions through the store's leases: one owner
per partition, its writes fenced by the lease's token; a dead owner's partitions are taken
over at once on its own host and when its lease expires elsewhere.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import (
    BrokerUnavailableError,
    LeaseLostError,
    PartitionCountError,
    RunBusyError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StreamError,
)
from ..model import RunStatus
from ..observe import metrics, tracing
from ..store import RetentionPolicy, RunControl, SaveOptions, SaveRequest, Store
from .jetstream import JetStream
from .keyed import ExpiringState, KeyedState, chain_ids, fold, needs_base
from .records import Output, Position, Record
from .sinks import Sink
from .sources import _SKIPPED, RedisStream, Source, _safe_url

log = logging.getLogger("pitstop.stream")

Handler = Callable[[KeyedState, Record, Callable[[Any, Any], None]], None]
IdleHook = Callable[[KeyedState, int, Callable[[Any, Any], None], float], bool]
"""``hook(state, partition, emit, now)``: a partition had no record in a read (windows'
idleness); ``now`` is ``time.monotonic()``. True when it changed the state or emitted."""
Start = Literal["beginning", "end"]
OnTrimmed = Literal["fail", "skip"]

_MIGRATED = 1 << 30
"""Checkpoints-since-base of a partition whose state was just migrated (see _open)."""

_FIELDS = ("position", "changes", "deleted", "outbox", "next_output", "base", "records",
           "offset", "bucket")


@dataclass(slots=True)
class _Partition:
    """A partition this process owns: its state in memory and what was last committed."""

    index: int
    run_id: str
    held: Any  # runtime.leases.Held
    state: KeyedState
    position: Position | None
    outbox: list[Output]
    next_output: int
    base: str | None
    head: str | None
    records: int
    offset: int
    """Records of the partition up to and including ``position`` (for trim checks)."""
    since_base_keys: int = 0
    since_base_checkpoints: int = 0
    pending: int = 0
    last_checkpoint: float = field(default_factory=time.monotonic)
    committed: dict[str, Any] = field(default_factory=dict)
    delivery_retry_at: float = 0.0
    swept: int = -1
    """The time bucket whose expired keys were last deleted (a job with a ttl)."""
    retry_at: float = 0.0
    """Rolled back after a handler error: not read before this (monotonic) time."""


@dataclass(slots=True)
class RunReport:
    """What one :meth:`Job.run` did."""

    records: int = 0
    checkpoints: int = 0
    outputs: int = 0
    failed: dict[int, str] = field(default_factory=dict)
    """Partitions stopped by a handler error (or a source error), with the error."""


def _owner_dead(owner: str) -> bool:
    from ..owners import owner_is_dead

    return owner_is_dead(owner)


class Job:
    """A stream job named ``name``: ``source`` read partition by partition, each record
    handed to the :meth:`handler` with its partition's keyed state and an ``emit``.

    A partition is checkpointed every ``every`` records or ``seconds`` seconds, whichever
    comes first (and when the job stops). ``start`` says where a partition with no
    checkpoint begins (``"beginning"``, or ``"end"``: only records added from now).
    ``on_trimmed`` says what happens when records after a partition's stored position were
    trimmed from the stream: ``"fail"`` (the default) stops the partition with
    :class:`~pitstop.errors.TrimmedError`; ``"skip"`` logs how far it jumps and goes on from
    the oldest record still there.

    ``ttl`` (seconds) deletes a key that was not set for that long (processing time; checked
    at checkpoints, so within an eighth of the ttl after it is due, or when a partition
    opens); the deletions are in the checkpoint like any other.

    ``version`` is the keyed state's schema version, stored with every checkpoint; state of
    an older version is brought up to date on load by the :meth:`migration` functions (and
    written whole at once), state of a newer one refuses its partition.

    A handler that raises is retried: the partition is rolled back to its last checkpoint
    (state, position and outbox as committed, so nothing is half-applied) and reads the
    records after it again, after ``retry_backoff`` seconds, doubling up to 30 s. When the
    same record raises ``retries + 1`` times in a row, the partition stops at its last
    checkpoint, failed, with the error; the other partitions go on. ``retries=0`` stops it
    at the first error.

    A partition's checkpoints before its latest base (the last whole copy of its state)
    are no longer needed to restore it and are deleted when a new base is written, so a
    job's store stays the size of its state; ``keep_history=True`` keeps them all.
    """

    def __init__(
        self,
        name: str,
        *,
        source: Source,
        sink: Sink | None = None,
        every: int = 1000,
        seconds: float = 5.0,
        start: Start = "beginning",
        on_trimmed: OnTrimmed = "fail",
        lease_ttl: float = 15.0,
        batch: int = 1000,
        keep_history: bool = False,
        version: int = 0,
        ttl: float | None = None,
        retries: int = 3,
        retry_backoff: float = 0.5,
    ) -> None:
        if not name or "/" in name:
            raise ValueError(f"job name {name!r}: non-empty, without '/'")
        if every < 1 or seconds <= 0:
            raise ValueError("every must be at least 1 and seconds above 0")
        if start not in ("beginning", "end"):
            raise ValueError('start must be "beginning" or "end"')
        if on_trimmed not in ("fail", "skip"):
            raise ValueError('on_trimmed must be "fail" or "skip"')
        self.name = name
        self.source = source
        self.sink = sink
        self.every = every
        self.seconds = seconds
        self.start = start
        self.on_trimmed = on_trimmed
        self.lease_ttl = lease_ttl
        self.batch = batch
        self.keep_history = keep_history
        self.version = version
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be above 0 seconds (or None: keys never expire)")
        self.ttl = ttl
        if retries < 0 or retry_backoff < 0:
            raise ValueError("retries and retry_backoff must be at least 0")
        self.retries = retries
        self.retry_backoff = retry_backoff
        self._attempts: dict[int, tuple[Position | None, int]] = {}
        """Partition: (where its handler last raised, failures there in a row)."""
        self._claim_waits: dict[int, tuple[float, float]] = {}
        """Partition: (monotonic time before which it is not claimed again, the backoff) after
        a claim the store did not answer (a lock held by an owner cut off mid-transaction)."""
        # Expiry is checked per time bucket, an eighth of the ttl: a key goes between ttl
        # and ttl + 1/8 after it was last set.
        self._bucket_seconds = ttl / 8 if ttl is not None else 0.0
        self._migrations: dict[int, Callable[[dict[Any, Any]], dict[Any, Any]]] = {}
        self._handler: Handler | None = None
        self._idle_hooks: list[IdleHook] = []
        self._stop = threading.Event()
        self._started = 0.0
        source_job = getattr(source, "_job", None)
        if source_job is not None:
            source._job = name  # type: ignore[attr-defined]  # names the job in its errors

    # -- declaring ----------------------------------------------------------------------------

    def handler(self, fn: Handler) -> Handler:
        """Decorate ``fn(state, record, emit)``: called for each record, in order within a
        partition. ``emit(key, value)`` sends an output to the sink, exactly once."""
        self._handler = fn
        return fn

    def _on_idle(self, hook: IdleHook) -> None:
        """Call ``hook`` for each owned partition that had no record in a read."""
        self._idle_hooks.append(hook)

    def migration(
        self, *, from_version: int
    ) -> Callable[[Callable[[dict[Any, Any]], dict[Any, Any]]],
                  Callable[[dict[Any, Any]], dict[Any, Any]]]:
        """Decorate ``fn(state) -> state`` turning a partition's keyed state of
        ``from_version`` into ``from_version + 1``."""

        def register(
            fn: Callable[[dict[Any, Any]], dict[Any, Any]]
        ) -> Callable[[dict[Any, Any]], dict[Any, Any]]:
            self._migrations[from_version] = fn
            return fn

        return register

    def _migrate(self, state: KeyedState, version: int, run_id: str,
                 checkpoint_id: str) -> KeyedState:
        if version > self.version:
            raise SchemaVersionError(
                f"the partition's state has schema version {version}, newer than stream job "
                f"{self.name!r} version {self.version}; deploy the newer code to run it",
                run_id=run_id, checkpoint_id=checkpoint_id,
            )
        migrated: dict[Any, Any] = state
        while version < self.version:
            fn = self._migrations.get(version)
            if fn is None:
                raise SchemaVersionError(
                    f"no migration from state version {version} to {version + 1} in stream "
                    f"job {self.name!r} (code is version {self.version}); add "
                    f"@job.migration(from_version={version})",
                    run_id=run_id, checkpoint_id=checkpoint_id,
                )
            migrated = dict(fn(dict(migrated)))
            version += 1
        if self.ttl is not None:
            expiring = ExpiringState(migrated, bucket=self._bucket_now())
            if isinstance(state, ExpiringState):  # keys keep their times
                expiring._bucket_of.update(
                    (k, b) for k, b in state.buckets().items() if k in expiring)
            return expiring
        return migrated if isinstance(migrated, KeyedState) else KeyedState(migrated)

    def _bucket_now(self) -> int:
        return int(time.time() // self._bucket_seconds) if self.ttl is not None else 0

    def _expire(self, part: _Partition) -> None:
        """Set the state's time bucket; once a bucket, delete the keys past the ttl."""
        state = part.state
        if self.ttl is None or not isinstance(state, ExpiringState):
            return
        now = self._bucket_now()
        state.bucket = now
        if now != part.swept:
            part.swept = now
            expired = state.expire(now - math.ceil(self.ttl / self._bucket_seconds))
            if expired:
                log.info("stream job %r: partition %d: %d keys expired", self.name,
                         part.index, expired)

    def run_id(self, partition: int) -> str:
        return f"{self.name}/{partition}"

    def stop(self) -> None:
        """Make :meth:`run` (in any thread) checkpoint its partitions and return."""
        self._stop.set()

    # -- reading committed state ---------------------------------------------------------------

    def state(self, store: Store) -> dict[Any, Any]:
        """The committed keyed state of every partition, merged (keys are partitioned, so
        this is a union)."""
        out: dict[Any, Any] = {}
        for partition in range(self.source.partitions):
            out.update(self.partition_state(store, partition))
        # Windows and watermarks (keys starting with "\x00") are the job's own.
        for key in [k for k in out if isinstance(k, str) and k.startswith("\x00")]:
            del out[key]
        return out

    def partition_state(self, store: Store, partition: int) -> KeyedState:
        """One partition's committed keyed state."""
        loaded = self._load(store, partition)
        return loaded[0] if loaded is not None else KeyedState()

    def _load(
        self, store: Store, partition: int
    ) -> tuple[KeyedState, dict[str, Any], str, int, int] | None:
        """(state, head fields, head id, checkpoints since base, keys since base), or None
        for a partition with no checkpoint."""
        run_id = self.run_id(partition)
        try:
            head = store.latest(run_id)
        except RunNotFoundError:
            return None
        if head is None:
            return None
        fields = head.state
        ttl: dict[str, Any] = {}
        if "full" in fields:
            base, deltas, checkpoints = fields, [], 0
        else:
            base_id = fields["base"]
            chain = chain_ids(store, run_id, head.id, base_id)
            loaded = store.get_many(chain)
            base = loaded[base_id].state
            deltas = [loaded[cid].state for cid in chain[1:]]
            checkpoints = len(deltas)
        if self.ttl is not None:
            ttl = {"buckets": base.get("buckets") or {}, "now_bucket": self._bucket_now()}
        keys = sum(len(d.get("changes") or ()) + len(d.get("deleted") or ()) for d in deltas)
        state = fold(base["full"], deltas, **ttl)
        if head.schema_version != self.version:
            state = self._migrate(state, head.schema_version, run_id, head.id)
            checkpoints = _MIGRATED
        return state, fields, head.id, checkpoints, keys

    # -- running -------------------------------------------------------------------------------

    def run(
        self, store: Store, *, idle_exit: float | None = None, owner: str | None = None
    ) -> RunReport:
        """Process the partitions this process can own until :meth:`stop`, SIGTERM/SIGINT
        (in the main thread) or, with ``idle_exit``, until no partition it owns had a record
        for that many seconds and all its outputs are delivered. Always ends at a checkpoint
        of every partition it owns, and gives them up."""
        if self._handler is None:
            raise StreamError("no handler: decorate one with @job.handler", job=self.name)
        from ..runtime.leases import owner_id

        self._stop.clear()
        me = owner or owner_id()
        self._check_partition_count(store)
        for index in range(self.source.partitions):
            metadata: dict[str, Any] = {"partitions": self.source.partitions,
                                        "source": self.source.describe()}
            if isinstance(self.source, RedisStream):  # what `pitstop stream status` asks
                metadata["redis"] = {"url": _safe_url(self.source.url),
                                     "stream": self.source.stream_name(index)}
            elif isinstance(self.source, JetStream):
                metadata["jetstream"] = {"url": _safe_url(self.source.url),
                                         "stream": self.source.stream_name,
                                         "subject": self.source.subject(index)}
            store.create_run(self.run_id(index), workflow=self.workflow, exist_ok=True,
                             metadata=metadata)
        self._started = time.time()
        self._attempts = {}
        self._claim_waits = {}
        report = RunReport()
        owned: dict[int, _Partition] = {}
        refused: set[int] = set()
        with self._signals():
            try:
                self._loop(store, me, owned, refused, report, idle_exit)
            finally:
                try:
                    for part in list(owned.values()):
                        self._close_partition(store, part, report, owned)
                finally:
                    self.source.close()
                    if self.sink is not None:
                        self.sink.close()
        return report

    async def run_async(
        self, store: Store, *, idle_exit: float | None = None, owner: str | None = None
    ) -> RunReport:
        """:meth:`run` for asyncio: the job runs on a worker thread (handlers are plain
        functions, the loop stays free). Cancelling the awaiting task stops the job at a
        checkpoint of every partition it owns before the cancellation goes on."""
        import asyncio

        task = asyncio.ensure_future(
            asyncio.to_thread(self.run, store, idle_exit=idle_exit, owner=owner)
        )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self.stop()
            await task
            raise

    @contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            log.info("stream job %r: signal %d, stopping at a checkpoint", self.name, signum)
            self._stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM,
                                                                   signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _check_partition_count(self, store: Store) -> None:
        count = self.source.partitions
        runs = store.runs(id_prefix=f"{self.name}/", workflow=self.workflow, limit=None)
        stored: set[int] = {
            run.metadata["partitions"] for run in runs
            if isinstance(run.metadata.get("partitions"), int)
        }
        indexes = [int(run.id.rsplit("/", 1)[1]) for run in runs
                   if run.id.rsplit("/", 1)[1].isdigit()]
        if stored - {count} or (indexes and max(indexes) >= count):
            raise PartitionCountError(
                f"the source has {count} partitions but the store holds the job's state for "
                f"{sorted(stored) or [max(indexes) + 1]}: keys would land in other partitions "
                "than their state. Run the job under a new name (or delete its runs) to "
                "start over with the new count",
                job=self.name,
            )

    @property
    def workflow(self) -> str:
        return f"stream:{self.name}"

    def _loop(
        self, store: Store, me: str, owned: dict[int, _Partition], refused: set[int],
        report: RunReport, idle_exit: float | None,
    ) -> None:
        claim_at = 0.0
        last_activity = time.monotonic()
        backoff = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= claim_at:
                self._claim(store, me, owned, refused, report)
                claim_at = now + (0.2 if len(owned) + len(refused) < self.source.partitions
                                  else 2.0)
            for part in [p for p in owned.values() if p.held.lost]:
                log.warning("stream job %r: partition %d was taken over by another owner",
                            self.name, part.index)
                self._drop(part, owned)
            if not owned:
                if idle_exit is not None and now - last_activity >= idle_exit:
                    return
                self._stop.wait(0.1)
                continue
            positions = {p.index: p.position for p in owned.values() if p.retry_at <= now}
            try:
                batches = self.source.read(positions, self.batch, 0.05) if positions else {}
                if not positions:  # every partition waits to retry
                    self._stop.wait(0.05)
                backoff = 0.0
            except BrokerUnavailableError as exc:
                backoff = min(30.0, max(0.5, backoff * 2))
                log.error("%s; retrying in %.1f s", exc, backoff)
                self._stop.wait(backoff)
                continue
            except StreamError as exc:  # undecodable, trimmed: that partition stops
                if exc.partition is not None and exc.partition in owned:
                    self._fail(store, owned[exc.partition], exc, report, owned, refused)
                    continue
                raise
            got = False
            for index, records in batches.items():
                reader = owned.get(index)
                if reader is None or not records:
                    continue
                got = True
                self._handle(store, reader, records, report, owned, refused)
            now = time.monotonic()
            if self._idle_hooks:
                for part in [p for p in owned.values() if not batches.get(p.index)]:
                    self._idle(store, part, now, report, owned, refused)
            for part in list(owned.values()):
                if part.pending and (part.pending >= self.every
                                     or now - part.last_checkpoint >= self.seconds):
                    self._checkpoint(store, part, report, owned)
                elif part.outbox and now >= part.delivery_retry_at:
                    self._deliver(part, report)
            if got or any(p.retry_at > now for p in owned.values()):
                last_activity = now
            elif idle_exit is not None and now - last_activity >= idle_exit:
                for part in list(owned.values()):
                    if part.pending:
                        self._checkpoint(store, part, report, owned)
                if all(not p.outbox for p in owned.values()):
                    return

    def _claim(
        self, store: Store, me: str, owned: dict[int, _Partition], refused: set[int],
        report: RunReport,
    ) -> None:
        from ..runtime.leases import acquire, keeper

        for index in range(self.source.partitions):
            if index in owned or index in refused:
                continue
            if self._claim_waits.get(index, (0.0, 0.0))[0] > time.monotonic():
                continue
            run_id = self.run_id(index)
            try:
                run = store.get_run(run_id)
                if run.status is RunStatus.FAILED \
                        and run.updated_at.timestamp() >= self._started:
                    # Failed while this run() goes on (here or in another process): retried
                    # by the next run(), not in a loop by every process.
                    refused.add(index)
                    continue
                if run.owner is not None and run.owner != me \
                        and run.lease_expires_at is not None \
                        and run.lease_expires_at.timestamp() > time.time() \
                        and not _owner_dead(run.owner):
                    continue  # owned: no write needed to learn it
                lease = acquire(store, run_id, me, self.lease_ttl)
            except RunBusyError as exc:
                if exc.owner is None:  # a row lock held past the store's bounded wait
                    self._claim_later(index, exc)
                continue
            except StoreError as exc:
                if type(exc) is not StoreError:
                    raise  # (schema, encryption key: no retry cures it)
                self._claim_later(index, exc)
                continue
            held = keeper.track(store, lease, self.lease_ttl)
            try:
                part = self._open(store, index, held)
            except (StreamError, SchemaVersionError) as exc:
                keeper.untrack(held)
                store.release(held.lease)
                refused.add(index)
                report.failed[index] = str(exc)
                log.error("%s", exc)
                continue
            except StoreError as exc:
                keeper.untrack(held)
                if type(exc) is not StoreError:
                    store.release(held.lease)
                    raise
                with suppress(Exception):  # else the lease simply expires
                    store.release(held.lease)
                self._claim_later(index, exc)
                continue
            except BaseException:
                keeper.untrack(held)
                store.release(held.lease)
                raise
            self._claim_waits.pop(index, None)
            owned[index] = part
            log.info("stream job %r: partition %d owned by %s from position %s", self.name,
                     index, me, part.position)

    def _claim_later(self, index: int, exc: StoreError | RunBusyError) -> None:
        """A claim the store did not answer is no error of the job: the partition is not
        available now. Typically another owner, cut off from the network in the middle of a
        transaction, still holds its run's row lock until the server notices; the claim
        waited for it until the store's bounded lock wait (a ``RunBusyError`` naming no
        owner) or ``statement_timeout``. Tried again after a backoff (0.5 s, doubling up to
        30 s); the partitions this process owns go on meanwhile."""
        backoff = min(30.0, max(0.5, self._claim_waits.get(index, (0.0, 0.0))[1] * 2))
        self._claim_waits[index] = (time.monotonic() + backoff, backoff)
        log.warning("stream job %r: partition %d not claimed: its run is locked or the store "
                    "did not answer (%s); trying again in %.1f s", self.name, index, exc, backoff)

    def _open(self, store: Store, index: int, held: Any) -> _Partition:
        loaded = self._load(store, index)
        if loaded is None:
            position, offset = self.source.first_position(index, self.start)
            fresh = ExpiringState(bucket=self._bucket_now()) if self.ttl is not None \
                else KeyedState()
            part = _Partition(index, self.run_id(index), held, fresh, position, [], 0,
                              None, None, 0, offset)
            part.pending = 0
            # The first checkpoint is the base (an empty copy), so that every later
            # one can be a delta.
            self._write(store, part, full=True)
            return part
        state, fields, head_id, checkpoints, keys = loaded
        position = fields["position"]
        offset = fields.get("offset", 0)
        self.source.check_position(index, position, offset, self.on_trimmed)
        outbox = [Output(self.name, index, seq, key, value)
                  for seq, key, value in fields.get("outbox") or ()]
        part = _Partition(
            index, self.run_id(index), held, state, position, outbox,
            fields["next_output"], fields.get("base") or head_id, head_id,
            fields.get("records", 0), offset, keys, checkpoints,
        )
        part.committed = {name: fields.get(name) for name in _FIELDS}
        self._expire(part)  # keys that expired while no job ran (written at the next one)
        if checkpoints >= _MIGRATED:
            # State migrated to this version: written whole now, so that no checkpoint of
            # this version ever names a base of another.
            self._write(store, part, full=True)
        self._deliver(part, None)
        return part

    def _handle(
        self, store: Store, part: _Partition, records: list[Record], report: RunReport,
        owned: dict[int, _Partition], refused: set[int],
    ) -> None:
        handler = self._handler
        assert handler is not None
        state = part.state
        outbox = part.outbox
        job = self.name
        index = part.index
        seq = part.next_output

        def emit(key: Any, value: Any) -> None:
            nonlocal seq
            outbox.append(Output(job, index, seq, key, value))
            seq += 1

        every = self.every
        skipped = _SKIPPED
        first = 0
        record: Record | None = None
        try:
            while first < len(records):
                chunk = records[first : first + every - part.pending]
                # The tight loop: only the handler call per record; counters once a chunk.
                for record in chunk:
                    if record.value is not skipped:
                        handler(state, record, emit)
                first += len(chunk)
                part.position = chunk[-1].position
                part.offset += len(chunk)
                part.pending += len(chunk)
                part.records += len(chunk)
                report.records += len(chunk)
                part.next_output = seq
                if part.pending >= every:
                    self._checkpoint(store, part, report, owned)
                    if part.index not in owned:
                        return
        except Exception as exc:
            self._retry_or_fail(store, part, exc, report, owned, refused, record=record)

    def _idle(
        self, store: Store, part: _Partition, now: float, report: RunReport,
        owned: dict[int, _Partition], refused: set[int],
    ) -> None:
        """Run the idle hooks on a partition that had no record; checkpoint what they
        changed (windows fired by the clock) at once."""
        outbox = part.outbox
        seq = part.next_output

        def emit(key: Any, value: Any) -> None:
            nonlocal seq
            outbox.append(Output(self.name, part.index, seq, key, value))
            seq += 1

        changed = False
        try:
            for hook in self._idle_hooks:
                changed = hook(part.state, part.index, emit, now) or changed
        except Exception as exc:
            self._retry_or_fail(store, part, exc, report, owned, refused)
            return
        part.next_output = seq
        if changed:
            self._checkpoint(store, part, report, owned)

    def _checkpoint(
        self, store: Store, part: _Partition, report: RunReport,
        owned: dict[int, _Partition],
    ) -> None:
        self._expire(part)
        full = needs_base(part.since_base_keys + part.state.dirty,
                          part.since_base_checkpoints, len(part.state))
        try:
            with tracing.span("pitstop.stream.checkpoint", {
                    "pitstop.stream.job": self.name, "pitstop.stream.partition": part.index,
                    "pitstop.run.id": part.run_id, "pitstop.stream.full": full}) as span:
                self._write(store, part, full=full)
                if span is not None:
                    span.set_attribute("pitstop.stream.records", part.records)
                    span.set_attribute("pitstop.stream.position", str(part.position))
                    span.set_attribute("pitstop.checkpoint.id", str(part.head))
        except LeaseLostError:
            log.warning("stream job %r: partition %d lost its lease; another owner goes on "
                        "from its last checkpoint", self.name, part.index)
            self._drop(part, owned)
            return
        report.checkpoints += 1
        counting = metrics.current()
        if counting is not None:  # (the lag: one broker call per checkpoint, only when on)
            counting.stream_checkpoint(self.name, part.index, self._lag(part))
        self._deliver(part, report)

    def _lag(self, part: _Partition) -> int | None:
        """Records after the partition's checkpoint; for Redis one XINFO (the stream's
        ``entries-added`` less the partition's offset), not a read of the records."""
        if not isinstance(self.source, RedisStream):
            return self.source.lag(part.index, part.position)
        try:
            info = self.source._info(part.index)
        except BrokerUnavailableError:
            return None
        if info is None:
            return None
        return max(0, int(info.get("entries-added", 0)) - part.offset)

    def _write(self, store: Store, part: _Partition, *, full: bool,
               status: RunStatus = RunStatus.RUNNING, error: dict[str, Any] | None = None,
               release: bool = False) -> None:
        """Commit the partition's position, state changes and outbox in one checkpoint."""
        outbox = [[o.seq, o.key, o.value] for o in part.outbox]
        fields: dict[str, Any] = {
            "position": part.position,
            "outbox": outbox,
            "next_output": part.next_output,
            "records": part.records,
            "offset": part.offset,
        }
        if error is not None:  # the last committed state again, with the error
            fields.update({k: v for k, v in part.committed.items()
                           if k != "base" and not (k == "bucket" and v is None)})
            fields["changes"], fields["deleted"] = {}, []
            fields["base"] = part.base
            keys = 0
        elif full:
            part.state.forget_changes()
            fields["full"] = dict(part.state)
            if isinstance(part.state, ExpiringState):
                fields["buckets"] = part.state.buckets()
            keys = 0
        else:
            changes, deleted = part.state.take_changes()
            fields["changes"], fields["deleted"], fields["base"] = changes, deleted, part.base
            if isinstance(part.state, ExpiringState):
                fields["bucket"] = part.state.bucket
            keys = len(changes) + len(deleted)
        metadata: dict[str, Any] = {"stream": {"position": str(fields["position"]),
                                               "records": fields["records"],
                                               "offset": fields["offset"],
                                               "outbox": len(fields["outbox"])}}
        if error is not None:
            metadata["error"] = error
        checkpoint = self._save(store, part, fields, status=status, metadata=metadata,
                                release=release)
        part.head = checkpoint.id
        if error is None:
            part.committed = {name: fields.get(name) for name in _FIELDS}
        if full and error is None:
            previous_base = part.base
            part.base = checkpoint.id
            part.since_base_keys = part.since_base_checkpoints = 0
            if previous_base is not None and not self.keep_history:
                # Everything before the new base is folded into it. A store that does not
                # answer now leaves them to the next base's prune (the checkpoint is safe).
                try:
                    store.prune(RetentionPolicy(keep_last=1, keep_milestones=False),
                                run_id=part.run_id)
                except StoreError as exc:
                    if type(exc) is not StoreError:
                        raise
                    log.warning("stream job %r: partition %d: checkpoints before its new "
                                "base not deleted yet (%s)", self.name, part.index, exc)
        else:
            part.since_base_keys += keys
            part.since_base_checkpoints += 1
        part.pending = 0
        part.last_checkpoint = time.monotonic()

    def _save(self, store: Store, part: _Partition, fields: dict[str, Any], *,
              status: RunStatus, metadata: dict[str, Any], release: bool) -> Any:
        """``store.save``, retried with backoff while the store does not answer. Safe even
        when a lost connection hid a commit: the retry then writes the same changes again
        on top (setting keys to the values they have, the same position and outbox)."""
        backoff = 0.0
        while True:
            try:
                return store.save_request(SaveRequest(
                    part.run_id, fields, list(fields), metadata=metadata,
                    schema_version=self.version,
                    control=RunControl(status=status, workflow=self.workflow),
                    options=SaveOptions(lease=part.held.lease, release=release),
                ))
            except StoreError as exc:
                if type(exc) is not StoreError or self._stop.is_set():
                    raise  # (schema, unknown scheme: not a passing outage)
                backoff = min(30.0, max(0.5, backoff * 2))
                log.error("stream job %r: partition %d: checkpoint not written (%s); "
                          "retrying in %.1f s", self.name, part.index, exc, backoff)
                self._stop.wait(backoff)

    def _deliver(self, part: _Partition, report: RunReport | None) -> None:
        """Deliver the committed outbox; on failure keep it (it is in the checkpoint) and
        retry later."""
        if not part.outbox:
            return
        if self.sink is None:
            part.outbox.clear()
            return
        committed = part.committed.get("next_output") or 0
        ready = [o for o in part.outbox if o.seq < committed]
        if not ready:
            return
        try:
            self.sink.deliver(self.name, part.index, ready)
        except BrokerUnavailableError as exc:
            log.error("%s; outputs kept in the checkpoint, retrying", exc)
            part.delivery_retry_at = time.monotonic() + 1.0
            return
        del part.outbox[: len(ready)]
        if report is not None:
            report.outputs += len(ready)

    def _retry_or_fail(
        self, store: Store, part: _Partition, exc: Exception, report: RunReport,
        owned: dict[int, _Partition], refused: set[int], *, record: Record | None = None,
    ) -> None:
        """Roll the partition back to its last checkpoint and read on from there after a
        backoff; or, once the same record failed ``retries + 1`` times, stop it there."""
        at = record.position if record is not None else part.position
        last_at, failures = self._attempts.get(part.index, (None, 0))
        failures = failures + 1 if last_at == at else 1
        if failures > self.retries:
            self._attempts.pop(part.index, None)
            self._fail(store, part, exc, report, owned, refused, record=record,
                       attempts=failures)
            return
        self._attempts[part.index] = (at, failures)
        delay = min(30.0, self.retry_backoff * 2 ** (failures - 1))
        log.warning("stream job %r: partition %d: handler raised at position %s (%s: %s); "
                    "attempt %d of %d, retrying from its last checkpoint in %.1f s",
                    self.name, part.index, at, type(exc).__name__, exc, failures,
                    self.retries + 1, delay)
        try:
            fresh = self._open(store, part.index, part.held)
        except (StreamError, SchemaVersionError) as reopening:
            self._fail(store, part, reopening, report, owned, refused)
            return
        fresh.retry_at = time.monotonic() + delay
        owned[part.index] = fresh

    def _fail(
        self, store: Store, part: _Partition, exc: BaseException, report: RunReport,
        owned: dict[int, _Partition], refused: set[int], *, record: Record | None = None,
        attempts: int = 1,
    ) -> None:
        """Stop the partition at its last checkpoint, with the error on its run."""
        where = f" at position {record.position}" if record is not None else ""
        if attempts > 1:
            where += f" (after {attempts} attempts)"
        message = f"{exc}"
        log.error("stream job %r: partition %d failed%s: %s: %s", self.name, part.index,
                  where, type(exc).__name__, message)
        error = {
            "type": type(exc).__name__ if type(exc).__module__ == "builtins"
            else f"{type(exc).__module__}.{type(exc).__name__}",
            "message": message + where,
            "step": "handler",
            "attempt": attempts,
            "traceback": "".join(traceback.format_exception(exc)),
            "at": time.time(),
        }
        report.failed[part.index] = f"{error['type']}: {error['message']}"
        refused.add(part.index)
        with suppress(LeaseLostError):  # taken over: the new owner goes on
            self._write(store, part, full=False, status=RunStatus.FAILED, error=error,
                        release=True)
        self._drop(part, owned, release=False)

    def _close_partition(
        self, store: Store, part: _Partition, report: RunReport,
        owned: dict[int, _Partition],
    ) -> None:
        """Checkpoint (if anything is new), deliver, give the partition up."""
        try:
            if part.pending or part.state.dirty or (part.committed.get("outbox")
                                                    and not part.outbox):
                self._checkpoint(store, part, report, owned)
            else:
                self._deliver(part, report)
        finally:
            if part.index in owned:
                self._drop(part, owned)

    def _drop(self, part: _Partition, owned: dict[int, _Partition], *,
              release: bool = True) -> None:
        from ..runtime.leases import keeper

        owned.pop(part.index, None)
        keeper.untrack(part.held)
        if release and not part.held.lost:
            try:
                part.held.store.release(part.held.lease)
            except Exception as exc:  # the lease then simply expires
                log.warning("stream job %r: releasing partition %d: %s", self.name,
                            part.index, exc)


__all__ = ["Handler", "Job", "RunReport"]
