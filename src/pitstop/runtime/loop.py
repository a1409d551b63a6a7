"""Checkpoints for code that is a ``for`` loop rather than a workflow: training, batch jobs.

::

    with pitstop.Checkpointer(store, "train-42", policy=pitstop.CheckpointPolicy.auto(),
                              async_save=True) as ckpt:
        state = ckpt.restore(default=None)
        start = state["step"] if state else 0
        for step in range(start, 10_000):
            ...
            ckpt.save(lambda: {"model": model.state_dict(), "step": step + 1})

A loop's run is an ordinary run of the store: ``history``, ``fork``, ``prune``, ``verify`` and
the CLI work on it as on any workflow's. The checkpointer holds the run's lease while it is
open (a second process gets :class:`~pitstop.RunBusyError`; one that died on this machine is
taken over at once, one elsewhere when its lease expires).
"""

from __future__ import annotations

import collections
import copy
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from ..errors import LeaseLostError
from ..model import Checkpoint
from ..store import RetentionPolicy, SaveOptions, SaveRequest, Store, open_store
from ..store.contract.base import Durability
from .iteration import Position, Resumable
from .leases import acquire, keeper, owner_id
from .policies import CheckpointPolicy

T = TypeVar("T")
State = Mapping[str, Any]

_IMMUTABLE = frozenset({int, float, complex, str, bytes, bool, type(None)})


def host_copy(value: Any) -> Any:
    """A copy of ``value`` that later in-place updates of the original cannot reach: tensors
    cloned into host memory, arrays copied, containers rebuilt, immutable values shared."""
    cls = type(value)
    if cls in _IMMUTABLE:
        return value
    if cls is dict or cls is collections.OrderedDict:
        return cls((k, host_copy(v)) for k, v in value.items())
    if cls is list:
        return [host_copy(v) for v in value]
    if cls is tuple:
        return tuple(host_copy(v) for v in value)
    module = cls.__module__
    if module == "numpy" and cls.__name__ == "ndarray":
        return value.copy()
    if module.startswith("torch"):
        from ..serde.tensors import is_tensor_class

        if is_tensor_class(cls):
            torch = sys.modules["torch"]
            clone = value.detach().to("cpu", copy=True)
            if cls is torch.nn.Parameter:
                return torch.nn.Parameter(clone, requires_grad=value.requires_grad)
            return clone.requires_grad_(value.requires_grad) if value.requires_grad else clone
    return copy.deepcopy(value)


LOOP_RETENTION: Final = RetentionPolicy(keep_last=3, keep_milestones=True)
"""What a :class:`Checkpointer` keeps unless told otherwise: the newest 3 checkpoints of its
run and every tagged one."""


class Checkpointer:
    """Saves a loop's state as checkpoints of run ``run_id``, when ``policy`` says so.

    ``store`` is a :class:`~pitstop.Store` or a URL (then opened here and closed by
    :meth:`close`). ``policy`` decides which :meth:`save` calls take a checkpoint (default:
    every call); :meth:`CheckpointPolicy.auto` picks the interval from measured costs.

    With ``async_save=True``, :meth:`save` blocks only while it copies the state into host
    memory (a consistent snapshot: later in-place updates do not reach it); serialising and
    writing happen on a background thread, one checkpoint at a time. A save that comes due
    while the previous one is still being written is not taken (it returns False and stays
    due: the first call after the write finishes takes it), so the loop never waits on the
    disk; ``force=True`` waits for the previous write instead. A process killed during a
    background write leaves the previous checkpoint as the run's latest, never a torn one.
    Errors of a background write are raised by the next :meth:`save`, :meth:`wait` or
    :meth:`close`.

    ``retention`` prunes the run's old checkpoints after each save. By default
    (``pitstop.runtime.loop.LOOP_RETENTION``) a loop keeps its newest 3 checkpoints and
    every tagged one (``save(..., tags=["best"])``), as Orbax's ``max_to_keep`` or
    Lightning's ``save_top_k`` do: 20 checkpoints of a model are 20 copies of its weights.
    ``RetentionPolicy(keep_last=5, keep_every=1000)`` also keeps every 1000th step;
    ``retention=None`` keeps everything.
    Space freed by a prune goes back to the file system on a SQLite store.
    ``durability`` overrides the store's (``"full"``: each checkpoint fsynced before it
    counts as written).
    ``size_warning`` (bytes; default: the store's): the first checkpoint whose state reaches
    it is logged with its largest fields, counted in metrics and marked on the run.
    """

    def __init__(
        self,
        store: Store | str,
        run_id: str,
        *,
        policy: CheckpointPolicy | None = None,
        async_save: bool = False,
        durability: Durability | None = None,
        retention: RetentionPolicy | None = LOOP_RETENTION,
        workflow: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        lease_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        size_warning: int | None = None,
    ) -> None:
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.run_id = run_id
        self.policy = policy or CheckpointPolicy()
        self.schedule = self.policy.schedule(clock)
        self.async_save = async_save
        self.durability = durability
        self.retention = retention
        self.size_warning = size_warning or self.store.size_warning
        self._size_warned = False
        self._workflow = workflow
        self._clock = clock
        try:
            run = self.store.create_run(run_id, workflow=workflow, metadata=metadata,
                                        exist_ok=True)
            self._lease = acquire(self.store, run_id, owner_id(), lease_ttl)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self._held = keeper.track(self.store, self._lease, lease_ttl)
        self.checkpoint_id: str | None = run.head_id
        """The run's latest checkpoint written by (or before) this checkpointer."""
        self._head_meta: dict[str, Any] | None = (
            dict(self.store.summary(run.head_id).metadata) if run.head_id else None
        )
        self._iteration = int((self._head_meta or {}).get("iteration", 0))
        """save() calls so far, across resumes (kept in each checkpoint's metadata)."""
        self._state: Any = None  # the last state restored or saved (iterate's default)
        self._positions: dict[str, Position] = {}  # active iterations, saved with each ckpt
        self._resume: dict[str, Position] | None = None
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._since = time.time()  # the timeline: when the work of the next save began

    # -- restore ---------------------------------------------------------------------------------

    def restore(self, default: Any = None) -> Any:
        """The state of the run's latest checkpoint (a dict of the saved fields), or
        ``default`` if the run has none. Waits for a save in flight first."""
        self.wait()
        ckpt = self.store.latest(self.run_id)
        if ckpt is None:
            self._state = default
            return default
        self.checkpoint_id = ckpt.id
        self._head_meta = dict(ckpt.metadata)
        self._iteration = int(ckpt.metadata.get("iteration", 0))
        self._state = dict(ckpt.state)
        return self._state

    @property
    def latest(self) -> Checkpoint | None:
        """The run's latest checkpoint, loaded (after any save in flight is written)."""
        self.wait()
        return self.store.latest(self.run_id)

    # -- save ------------------------------------------------------------------------------------

    def save(
        self, state: State | Callable[[], State], *, force: bool = False,
        tags: Iterable[str] = (),
    ) -> bool:
        """Checkpoint ``state`` (or what the callable returns) if the policy says it is due,
        or if ``force``. Returns whether a checkpoint was taken (with ``async_save``: started).

        Pass a callable (``lambda: {"model": model.state_dict(), ...}``) so the state is only
        built when a checkpoint is taken. Each call counts as one iteration for the policy.
        ``tags`` (``["best"]``) name the checkpoint: it is taken whatever the policy says, and
        retention keeps it (``keep_milestones``, on by default).
        """
        tags = list(tags)
        force = force or bool(tags)
        self._check()
        self._iteration += 1
        if not force and not self.schedule.due():
            return False
        if self._busy():
            if not force:
                return False  # stays due: the first call after the write completes takes it
            self.wait()
        self._take(state, force=force, tags=tags)
        return True

    def _take(
        self, state: State | Callable[[], State], *, force: bool, tags: list[str] | None = None,
    ) -> None:
        started = self._clock()
        value = state() if callable(state) else state
        if not isinstance(value, Mapping):
            raise TypeError(
                f"run {self.run_id!r}: a checkpoint's state must be a mapping of field names to "
                f"values, not {type(value).__name__}"
            )
        self._state = state
        now = time.time()
        metadata: dict[str, Any] = {"source": "loop", "iteration": self._iteration,
                                    "started_at": self._since, "duration": now - self._since}
        self._since = now
        if tags:
            metadata["tags"] = tags
        if self._positions:
            metadata["iterate"] = {name: dict(p) for name, p in self._positions.items()}
        if self.async_save:
            snapshot = {name: host_copy(v) for name, v in value.items()}
            self._worker = threading.Thread(
                target=self._write_in_background, args=(snapshot, metadata),
                name=f"pitstop-save-{self.run_id}", daemon=True,
            )
            self._worker.start()
        else:
            self._write(value, metadata)
        self.schedule.taken(None if force else self._clock() - started)

    def _write(self, state: State, metadata: dict[str, Any]) -> None:
        request = SaveRequest(
            self.run_id,
            state,
            parent_id=self.checkpoint_id,
            metadata=metadata,
            options=SaveOptions(expected_head=self.checkpoint_id, lease=self._lease,
                                durability=self.durability),
        )
        if self.retention is None:
            ckpt = self.store.save_request(request)
        else:
            # The prune in the save's own transaction where the store can (one commit, one
            # sync a save); otherwise right after it.
            ckpt = self.store._save_and_prune(request, self.retention)
        self.checkpoint_id = ckpt.id
        if self.size_warning is not None and not self._size_warned \
                and ckpt.size >= self.size_warning:
            from ..observe.usage import flag_size

            self._size_warned = True
            flag_size(self.store, ckpt, self.size_warning, workflow=self._workflow,
                      lease=self._lease)

    def _write_in_background(self, state: State, metadata: dict[str, Any]) -> None:
        try:
            self._write(state, metadata)
        except BaseException as exc:
            self._error = exc

    def _busy(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError(f"run {self.run_id!r}: the checkpointer is closed")
        if self._held.lost:
            lease = self._held.lease
            raise LeaseLostError(
                self.run_id, owner=lease.owner, token=lease.token, current_token=None
            )
        error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self) -> None:
        """Block until a save in flight is written (durable as ``durability`` promises);
        raise its error if it failed."""
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    # -- iterate ---------------------------------------------------------------------------------

    def iterate(
        self,
        iterable: Iterable[T],
        *,
        every: int | None = None,
        seconds: float | None = None,
        state: State | Callable[[], State] | None = None,
        name: str = "items",
        total: int | None = None,
    ) -> Resumable[T]:
        """Yield the items of ``iterable``, checkpointing the position with ``state`` every
        ``every`` items or ``seconds`` seconds (neither: whenever the policy says so); after
        a resume, continue after the last checkpointed position.

        ``state`` (a mapping, read when a checkpoint is taken, or a callable) defaults to
        the state last restored or saved by this checkpointer. A checkpoint is taken between
        items, so it holds the state after the last finished item. Iterations are told apart
        by ``name``; an iteration that runs to its end drops its position (the next one with
        that name starts at the beginning, e.g. the next epoch). ``total`` (default: the
        iterable's ``len()`` if it has one) is what progress displays count towards.
        """
        if self._resume is None:  # positions of the checkpoint resumed from, each used once
            self._resume = dict((self._head_meta or {}).get("iterate", {}))
        start = self._resume.pop(name, None)

        def record(position: Position) -> None:
            self._check()
            self._positions[name] = position
            current = state if state is not None else self._state
            self.wait()  # every N items means every N items: wait for the previous write
            self._take({} if current is None else current, force=False)

        def done(position: Position) -> None:
            self._positions.pop(name, None)

        def due() -> bool:
            return self.schedule.due() and not self._busy()

        iteration: Resumable[T] = Resumable(
            iterable, start=start, every=every, seconds=seconds, due=due, record=record,
            done=done, clock=self._clock, total=total,
        )
        self._positions[name] = start or iteration.snapshot()
        return iteration

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for a save in flight, give the run's lease up, close a store opened here."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            keeper.untrack(self._held)
            try:
                if not self._held.lost:
                    self.store.release(self._held.lease)
            finally:
                if self._owns_store:
                    self.store.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpointer({self.store!r}, {self.run_id!r})"


__all__ = ["Checkpointer", "host_copy"]
