"""A LangGraph checkpointer on any pitstop store: ``PitstopSaver(store)``.

::

    from pitstop import open_store
    from pitstop.integrations.langgraph import PitstopSaver

    graph = builder.compile(checkpointer=PitstopSaver(open_store("sqlite:///runs.db")))

One class serves sync and async graphs (``invoke`` and ``ainvoke``) on SQLite, memory and
PostgreSQL stores. How LangGraph's model maps onto pitstop's:

* **Threads are runs.** Each (``thread_id``, ``checkpoint_ns``) is one pitstop run, with
  workflow ``"langgraph"`` and run metadata ``{"thread_id", "checkpoint_ns"}``: its id is the
  thread id for the root namespace and ``"<thread_id>::<checkpoint_ns>"`` for a subgraph's.
  ``pitstop runs``, ``history``, ``prune`` and ``verify`` therefore work on LangGraph threads.
* **Checkpoint ids.** A LangGraph checkpoint ``X`` of a run is pitstop checkpoint
  ``"X~<12 hex digits naming the run>"``. Pitstop ids are unique in a store while one LangGraph
  id can live in several threads (``copy_thread`` keeps ids), hence the suffix; ids of one run
  share it, so they sort as LangGraph's do. The checkpoint's parent is the config's
  ``checkpoint_id``, as in every LangGraph saver.
* **Each channel is one state field**, stored as ``serde.dumps_typed(value)`` -- the
  ``(type, bytes)`` pair LangGraph's own serializer makes, packed as one msgpack byte string
  (:mod:`pitstop.integrations.langgraph_values`, the one place that knows the stored form) --
  so any value LangGraph can checkpoint works (messages included) and nothing is unpickled.
  pitstop content-addresses each field. A channel whose version did not move since the
  parent (and is not in ``new_versions``) is neither serialised nor stored again: its field
  points at the parent's value, whatever its type. That is why a 1 MiB list that never
  changes costs its bytes once, not once per step as in ``SqliteSaver`` (which rewrites the
  whole checkpoint) or ``PostgresSaver`` (which inlines strings and numbers in every
  checkpoint row).
* **Everything else is JSON metadata** of the pitstop checkpoint: ``source``, ``step_name`` (the
  nodes that ran in the step, for the CLI) and ``langgraph`` = ``{"metadata": <LangGraph
  metadata>, "checkpoint": <the checkpoint without id and channel values: v, ts,
  channel_versions, versions_seen, updated_channels...>}``. Like ``PostgresSaver`` and
  ``SqliteSaver``, metadata goes through JSON (a tuple comes back as a list); a part that is
  not JSON at all is stored with LangGraph's serializer instead, base64-encoded.
* **Pending writes** are records attached to their checkpoint (``Store.attach``: kept in the
  checkpoint's row, so pruning, copying or exporting it takes them along; a store written
  before schema 8 keeps older ones as effect records, read the same way): a task's regular
  writes are one record keyed ``"<checkpoint id>/<task id>"``, the msgpack array of their
  ``[task_id, channel, type, bytes, task_path, idx]`` arrays; each special write is one keyed
  ``"<checkpoint id>/<task id>/<idx>"``. Regular writes are kept once and wait for the
  transaction of a checkpoint of their run: their own checkpoint's insert if its ``put``
  comes after them (``durability="async"``), else the next one's, which appends them to
  their checkpoint's row (at most ``writes_delay`` once their checkpoint is written;
  :mod:`~pitstop.integrations.langgraph_writes`); special writes (errors,
  interrupts, resumes...) overwrite and commit before ``put_writes`` returns, as in
  LangGraph's savers; ``get_tuple`` returns them in ``(task_path, task_id, idx)`` order.
* **Run status.** An interrupt marks the run ``waiting``; the next checkpoint written on it
  marks it ``running`` again. A loop step continuing the head this saver wrote leaves the
  status alone (naming it in every save would rewrite the status indexes at every step):
  it is written with a thread's first checkpoint, one whose parent was read rather than
  written here (every invocation's first), one after an interrupt recorded here, and
  branches. So a status someone else sets meanwhile (``cancelled``; ``waiting`` by an
  interrupt another process recorded) stays until the thread is next loaded.
* **Channel versions** are integers (``get_next_version``): pitstop deduplicates values by
  content, so versions need no random part to keep branches' values apart. A thread whose
  versions are strings (written by another saver and moved here, or migrated) goes on with
  strings of the reference savers' shape, so LangGraph never compares ``int`` with ``str``.

**No silent forks.** Two workers continuing one thread from the same checkpoint would each
write a child of it -- two diverging histories, one of them invisible (LangGraph issue 8796).
Here a checkpoint that *continues* a thread is written only if its parent is still the run's
head (pitstop's compare-and-set ``expected_head``; ``None``: the run must still be empty);
the loser gets :class:`ThreadConflictError` and nothing is written. Configs carry nothing for
this (they are exactly what LangGraph's savers return): the saver remembers what it read
and wrote (:mod:`pitstop.integrations.langgraph_forks` has the rules); docs/langgraph.md lists
which races they catch and which they cannot.

Differences from ``SqliteSaver``/``PostgresSaver``: latest means the run's head, the last
checkpoint written, which is the newest one unless ids were made out of order by hand;
``prune(strategy="keep_latest")`` keeps the latest checkpoint of every namespace (and refuses
threads that use a ``DeltaChannel``, like ``PostgresSaver``); ``delete_for_runs`` scans the
metadata of every LangGraph checkpoint in the store (nothing indexes LangGraph run ids).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import heapq
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final, NamedTuple, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import INTERRUPT

from ..cache import BoundedCache
from ..delta import Append, Applied
from ..errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    RunNotFoundError,
    SerializationError,
)
from ..model import Checkpoint as StoredCheckpoint
from ..model import CheckpointSummary, Run, RunStatus
from ..store import RunControl, SaveOptions, SaveRequest, Store, open_store
from ..store.contract.base import UNSET, Unset
from ..store.contract.save import NO_CONTROL
from ..store.engine.sql import SqlStore
from . import langgraph_threads
from .langgraph_forks import ForkGuard
from .langgraph_ids import (
    NS_SEP,
    WORKFLOW,
    config_for,
    id_suffix,
    langgraph_id,
    run_id_for,
    stored_id,
    where,
)
from .langgraph_meta import (
    checkpoint_metadata,
    json_contains,
    langgraph_metadata,
    pack_not_json,
    unpack_part,
)
from .langgraph_values import (
    due_nodes,
    pack_typed,
    pack_write,
    pack_writes,
    unpack_typed,
    unpack_writes,
)
from .langgraph_writes import DELAY, HeldWrites

T = TypeVar("T")

_CHANNEL: Final = itemgetter(0)
"""A pending write's channel (its first item), as a C call: ``put_writes`` maps it over the
writes of every task."""

_NOT_FRAME: Final = frozenset({"id", "channel_values"})
"""Checkpoint keys not kept in the frame (metadata): the id is the pitstop id's, the values
are the state fields."""


class ThreadConflictError(ConflictError):
    """Another writer moved the thread on since this one read it: writing would fork it.

    Raised by ``put`` for a checkpoint that continues the thread from a checkpoint that is no
    longer its latest. Nothing was written; load the thread again (``get_state``) and retry.
    """


class _Known(NamedTuple):
    """What ``put`` needs of a parent to skip unchanged channels: its fields and versions.

    A NamedTuple: one is built on every ``put``, and a frozen dataclass costs several times
    as much to construct."""

    fields: frozenset[str]
    versions: dict[str, Any]
    seen: dict[str, Any]
    running: bool
    """Whether this saver wrote the checkpoint and its run was then running, as far as this
    saver knows (False for one read from the store, or one an interrupt was recorded on
    while it was written: then the run's status is not known here)."""


def _same(a: object, b: object) -> bool:
    return a is b


_ITEMS_MIN: Final = 16
"""A list channel of at least this many items is stored item by item (a list of packed
``dumps_typed`` pairs): the store then chunks it, and a step that appends writes only the new
items (see :class:`_Items`)."""


class _Items(NamedTuple):
    """A list channel as this saver last wrote it on a run: the list LangGraph handed over and
    the packed encoding of each item. The next checkpoint's list usually holds the same item
    objects and more (``add_messages``, ``operator.add`` build a new list around them): only
    the new ones are serialised, and the store is told they were appended."""

    checkpoint: str
    value: builtins.list[Any]
    encoded: builtins.list[bytes]


class PitstopSaver(BaseCheckpointSaver[Any]):
    """LangGraph's ``BaseCheckpointSaver`` (sync and async) on a pitstop :class:`~pitstop.Store`.

    ``store`` is a store or a store URL (then the saver opens it and :meth:`close` closes it).
    ``serde`` is LangGraph's serializer for channel values and writes (default: LangGraph's
    ``JsonPlusSerializer``). ``writes_delay``: a step's pending writes are committed in the
    transaction of a checkpoint of their run (their own, or the next), or on their own once
    they waited that many seconds on a written checkpoint (default 0.02;
    :mod:`pitstop.integrations.langgraph_writes`); ``None`` commits each ``put_writes``
    before it returns. See the module documentation for how threads are stored.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        serde: SerializerProtocol | None = None,
        writes_delay: float | None = DELAY,
    ) -> None:
        super().__init__(serde=serde)
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self._known: BoundedCache[_Known] = BoundedCache(2048)
        # run id -> the checkpoint this saver last wrote on it: a hint of the run's head for
        # get_tuple (which reads the head anyway: another writer may have moved it).
        self._wrote: BoundedCache[str] = BoundedCache(2048)
        # Checkpoints this process recorded an interrupt on. LangGraph saves a checkpoint and
        # the writes made on it concurrently, so its put may land after the interrupt: it
        # must not mark the run running again.
        self._interrupted: BoundedCache[bool] = BoundedCache(2048)
        # Checkpoint -> when get_tuple read it (as an invocation starts): the timeline's start
        # of the step continuing it (``langgraph.started``; others start at their parent's ts).
        self._read_at: BoundedCache[float] = BoundedCache(2048)
        self._forks = ForkGuard()  # see "No silent forks" in the module docs
        # (run id, channel) -> the list channel as last written there (_Items).
        self._items: BoundedCache[_Items] = BoundedCache(1024)
        # The store's path for a step's small checkpoint (pitstop.store.engine.steps), if any.
        steps = self.store if isinstance(self.store, SqlStore) and self.store.step_saves else None
        self._save_step = steps.save_step if steps is not None else None
        # Pending writes held for the next checkpoint's transaction (None: not grouped).
        self._held = HeldWrites(self.store, writes_delay) if writes_delay is not None else None

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Commit held pending writes; close the store if this saver opened it from a URL."""
        if self._held is not None:
            self._held.flush()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> PitstopSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (or the thread's latest) with its pending writes."""
        self._flush()
        thread_id, ns, run_id = where(config)
        wanted = get_checkpoint_id(config)
        if not wanted:
            found = self.store.latest(run_id)
            self._forks.latest_read(run_id, empty=found is None)
            if found is None:
                return None
            return self._tuple(found, thread_id, ns, True, self._writes(found))
        target = stored_id(wanted, run_id)
        stored: StoredCheckpoint | None = None
        head: str | Unset | None = UNSET
        if self._wrote.get(run_id) == target:
            # The checkpoint this saver last wrote on the run (say a config that put or
            # update_state returned), most likely still its head: one read of the run with
            # its head instead of the checkpoint, then the run. The read says whether it is.
            try:
                run, found = self.store.latest_with_run(run_id)
            except (RunNotFoundError, CorruptCheckpointError):
                pass
            else:
                head = run.head_id
                if found is not None and found.id == target:
                    stored = found
        if stored is None:
            try:
                stored = self.store.get(target)
            except CheckpointNotFoundError:
                return None
            if stored.run_id != run_id:
                return None
            if isinstance(head, Unset):
                head = self._head(run_id)
        return self._tuple(stored, thread_id, ns, stored.id == head, self._writes(stored))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of a thread (one namespace if the config names one, else
        all), or of every LangGraph thread with ``config=None``.

        ``filter`` matches LangGraph metadata by JSON containment (as ``PostgresSaver``),
        ``before`` keeps ids below its ``checkpoint_id``, and a ``checkpoint_id`` in ``config``
        keeps only that one. Metadata is filtered before any state is read.
        """
        if limit is not None and limit <= 0:
            return
        self._flush()
        wanted = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        runs = self._runs(config)
        streams = [
            langgraph_threads.summaries(self.store, run_id, before_id) for run_id, _, _ in runs
        ]
        merged: Iterable[CheckpointSummary] = (
            streams[0]
            if len(streams) == 1
            else heapq.merge(*streams, key=lambda s: langgraph_id(s.id), reverse=True)
        )
        where = {run_id: (thread_id, ns) for run_id, thread_id, ns in runs}
        heads: dict[str, str | None] = {}
        count = 0
        for summary in merged:
            if wanted and langgraph_id(summary.id) != wanted:
                continue
            if filter and not json_contains(langgraph_metadata(summary, self.serde), filter):
                continue
            try:
                stored = self.store.get(summary.id)
            except CheckpointNotFoundError:  # pruned meanwhile
                continue
            if summary.run_id not in heads:
                heads[summary.run_id] = self._head(summary.run_id)
            thread_id, ns = where[summary.run_id]
            yield self._tuple(
                stored, thread_id, ns, heads[summary.run_id] == stored.id, self._writes(stored)
            )
            count += 1
            if limit is not None and count >= limit:
                return

    def _head(self, run_id: str) -> str | None:
        try:
            return self.store.get_run(run_id).head_id
        except RunNotFoundError:
            return None

    def _runs(self, config: RunnableConfig | None) -> builtins.list[tuple[str, str, str]]:
        """(run id, thread id, namespace) of the runs a ``list`` config covers."""
        if config is None:
            found: builtins.list[Run] = self.store.runs(workflow=WORKFLOW, limit=None)
        else:
            conf = config["configurable"]
            thread_id = str(conf["thread_id"])
            ns = conf.get("checkpoint_ns")
            if ns is not None:
                return [(run_id_for(thread_id, ns), thread_id, ns)]
            found = langgraph_threads.thread_runs(self.store, thread_id)
        return [
            (
                run.id,
                str(run.metadata.get("thread_id", run.id)),
                str(run.metadata.get("checkpoint_ns", "")),
            )
            for run in found
        ]

    def _writes(self, stored: CheckpointSummary) -> builtins.list[tuple[str, str, Any]]:
        records = self.store.attachments(stored.run_id, stored.id)
        rows = sorted(
            (row for r in records.values() for row in unpack_writes(r)),
            key=lambda r: (r[4], r[0], r[5]),
        )
        return [
            (task_id, channel, self.serde.loads_typed((type_, data)))
            for task_id, channel, type_, data, _, _ in rows
        ]

    def _tuple(
        self,
        stored: StoredCheckpoint,
        thread_id: str,
        ns: str,
        was_head: bool,
        writes: builtins.list[tuple[str, str, Any]],
    ) -> CheckpointTuple:
        lg = stored.metadata.get("langgraph", {})
        frame = unpack_part(lg.get("checkpoint", {}), self.serde)
        checkpoint_id = langgraph_id(stored.id)
        values = self._decode_values(stored.state)
        checkpoint = cast(Checkpoint, {**frame, "id": checkpoint_id, "channel_values": values})
        self._remember(stored.id, stored.state, frame, running=False)
        self._read_at.put(stored.id, time.time())
        if "parent" in lg:
            parent = lg["parent"]
        else:
            parent = langgraph_id(stored.parent_id) if stored.parent_id else None
        self._forks.seen(stored.id, was_head)
        return CheckpointTuple(
            config=config_for(thread_id, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=unpack_part(lg.get("metadata", {}), self.serde),
            parent_config=config_for(thread_id, ns, parent) if parent else None,
            pending_writes=writes,
        )

    # -- channel values: their stored form (see langgraph_values) ----------------------------

    def _encode_values(
        self,
        values: Mapping[str, Any],
        changed: Iterable[str] | None,
        run_id: str | None = None,
        parent_id: str | None = None,
    ) -> dict[str, Any]:
        """The state fields of a checkpoint's channel values: each named in ``changed`` (all
        if None) serialised (:meth:`_encode`); the others None, which the store reads as
        "the parent's value" (``put`` passes ``changed`` to it)."""
        if changed is None:
            return {name: self._encode(run_id, name, v, parent_id) for name, v in values.items()}
        state: dict[str, Any] = dict.fromkeys(values)
        dumps = self.serde.dumps_typed
        for name in changed:
            value = values[name]
            # Inlined for what is not a list (every channel of most steps): _encode's first
            # case, without two calls per channel.
            state[name] = (
                pack_typed(dumps(value))
                if type(value) is not list
                else self._encode(run_id, name, value, parent_id)
            )
        return state

    def _decode_values(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Channel values from a checkpoint's state fields (a long list: item by item)."""
        loads = self.serde.loads_typed
        return {
            name: loads(unpack_typed(value))
            if type(value) is not list
            else [loads(unpack_typed(item)) for item in value]
            for name, value in state.items()
        }

    def _remember(
        self, stored: str, fields: Iterable[str], frame: Mapping[str, Any], *, running: bool
    ) -> None:
        versions = frame.get("channel_versions") or {}
        seen = frame.get("versions_seen") or {}
        # Copies: a caller may change the checkpoint it handed over. The versions decide
        # which channels the next put stores; versions_seen only names the nodes that ran
        # (the CLI's step_name), so its per-node dicts (LangGraph never changes them in a
        # checkpoint it has handed to put) are not copied one by one on every put.
        # (tuple.__new__: the named tuple without its Python __new__, on every put.)
        known = tuple.__new__(_Known, (frozenset(fields), dict(versions), dict(seen), running))
        self._known.put(stored, known)

    # -- writing -----------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write a checkpoint as a child of the config's ``checkpoint_id``.

        Only channels that changed since the parent are serialised; raises
        :class:`ThreadConflictError` rather than fork a thread another writer moved on.
        """
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns") or ""
        run_id = f"{thread_id}{NS_SEP}{ns}" if ns else thread_id  # run_id_for, inlined
        checkpoint_id = checkpoint["id"]
        parent = conf.get("checkpoint_id") or None
        lg_meta = checkpoint_metadata(config, metadata)  # as LangGraph's savers store it
        values = checkpoint["channel_values"]
        versions = checkpoint["channel_versions"]
        # The checkpoint but its id and values (_NOT_FRAME): a copy and two pops cost a
        # fraction of a comprehension over its keys.
        frame: dict[str, Any] = dict(checkpoint)
        del frame["id"], frame["channel_values"]
        source = lg_meta.get("source")
        step = lg_meta.get("step")
        step = step if type(step) is int else None
        suffix = id_suffix(run_id)  # (stored_id, without two Python calls)
        parent_id = f"{parent}{suffix}" if parent else None
        known = self._known.get(parent_id)
        lg: dict[str, Any] = {"metadata": lg_meta, "checkpoint": frame}
        # The nodes this checkpoint would run next ([] once the graph has finished): the
        # saver writes no status when a graph ends, so listings read "idle" from this
        # without opening a state. Left out when it cannot be told (pending Sends).
        due = due_nodes(values, versions, checkpoint.get("versions_seen"))
        if due is not None:
            lg["next"] = due
        if parent is None:
            # The store chains a parentless checkpoint onto the run's head: say it has none.
            lg["parent"] = None
        meta: dict[str, Any] = {
            "source": source,
            "step_name": (
                _ran(checkpoint.get("versions_seen") or {}, known)
                if source != "input"
                else None
            ),
            "langgraph": lg,
        }
        if known is None:
            changed: builtins.list[str] | None = None
            state = self._encode_values(values, None, run_id, parent_id)
        else:
            # Unchanged: same version as the parent's, not in new_versions, a field there.
            # Its field keeps pointing at the parent's value; it is not even serialised.
            old = known.versions
            fields = known.fields
            changed = []
            for name in values:  # (not a comprehension: its own frame, every put)
                if (
                    name in new_versions
                    or name not in fields
                    or name not in versions
                    or versions[name] != old.get(name)
                ):
                    changed.append(name)
            state = self._encode_values(values, changed, run_id, parent_id)
        if parent is None:
            langgraph_threads.create_thread_run(self.store, run_id, thread_id, ns)
        expected = self._forks.expected_head(run_id, parent_id, source)
        # The run's status is written only when it may not say "running" already. Not when
        # this continues the head from a checkpoint this saver wrote as running, with no
        # interrupt recorded on it: naming the status in every save would rewrite the runs
        # table's status indexes at every step (see the module docs).
        status = (
            None
            if known is not None
            and known.running
            and expected == parent_id
            and not self._interrupted.get(parent_id)
            else RunStatus.RUNNING
        )
        if status is not None and parent_id and (began := self._read_at.get(parent_id)):
            lg["started"] = began  # (not on a loop's ordinary put: status is None there)
        stored = f"{checkpoint_id}{suffix}"
        # Pending writes held for this put (see langgraph_writes): on this very checkpoint
        # (made before its put, durability="async") and on written ones (its parent's),
        # committed in its transaction, or on their own if it does not commit.
        held = None
        if self._held is not None:
            if source not in ("loop", "input"):
                # update_state (or a fork): no next checkpoint need follow; writes on this
                # one are committed at once.
                self._held.wrote_branch(stored)
            held = self._held.begin_put(run_id, stored)
        carried = in_store = False
        try:
            written = carried = self._save(
                run_id=run_id, stored=stored, state=state, parent_id=parent_id, step=step,
                meta=meta, changed=changed, expected=expected, status=status, attach=held,
            )
            in_store = True
        except CheckpointNotFoundError:
            if parent_id is None:
                raise
            # The parent was deleted (delete_for_runs, prune): keep LangGraph's link in
            # metadata and store the checkpoint whole, on the run's head.
            lg["parent"] = parent
            langgraph_threads.create_thread_run(self.store, run_id, thread_id, ns)
            state = self._encode_values(values, None)
            written = self._save(
                run_id=run_id, stored=stored, state=state, parent_id=None, step=step,
                meta=meta, changed=None, expected=UNSET, status=RunStatus.RUNNING,
            )
            in_store = True
        finally:
            if self._held is not None:
                try:
                    if held and not carried:
                        self._held.commit(run_id, held)
                finally:
                    self._held.end_put(run_id, stored, written=in_store)
        if written:
            self._wrote.put(run_id, stored)
            self._forks.seen(stored, True)
            if Applied in (kinds := set(map(type, state.values()))) or list in kinds:
                self._remember_items(run_id, stored, values, state)
        interrupted = self._interrupted.get(stored)
        if interrupted:
            # An interrupt was recorded on this checkpoint while it was being written: the
            # save may have committed "running" after the interrupt said "waiting".
            self._mark_waiting(run_id)
        self._remember(stored, values, frame, running=written and not interrupted)
        return config_for(thread_id, ns, checkpoint_id)

    def _remember_items(
        self, run_id: str, stored: str, values: Mapping[str, Any], state: Mapping[str, Any]
    ) -> None:
        """Keep the list channels just written item by item, for the next put to extend."""
        for name, value in state.items():
            if type(value) is Applied or type(value) is list:
                encoded = value.value if type(value) is Applied else value
                # A copy: the list LangGraph holds may be appended to in place.
                item = _Items(stored, list(values[name]), cast(builtins.list[bytes], encoded))
                self._items.put(f"{run_id}\0{name}", item)

    def _encode(self, run_id: str | None, name: str, value: Any, parent_id: str | None) -> Any:
        """A channel value as stored: one packed ``dumps_typed`` pair, or for a long list one
        per item. A list that extends the one this saver wrote on the parent, item objects
        unchanged, is handed to the store as that list plus an :class:`~pitstop.Append` of
        the new items' encodings: nothing old is serialised again.

        LangGraph channel values are replaced by reducers, not edited in place (a node
        returns its update); an item edited in place behind LangGraph's back would be seen
        only by a save of the whole list (a new thread or process)."""
        if type(value) is not list or len(value) < _ITEMS_MIN or run_id is None:
            return pack_typed(self.serde.dumps_typed(value))
        dumps = self.serde.dumps_typed
        last = self._items.get(f"{run_id}\0{name}")
        if last is not None and last.checkpoint == parent_id:
            old = last.value
            n = len(old)
            if len(value) >= n and all(map(_same, old, value)):
                tail = [pack_typed(dumps(item)) for item in value[n:]]
                return Applied(last.encoded + tail, Append(tail))
        return [pack_typed(dumps(item)) for item in value]

    def _save(
        self,
        *,
        run_id: str,
        stored: str,
        state: Mapping[str, Any],
        parent_id: str | None,
        step: int | None,
        meta: dict[str, Any],
        changed: builtins.list[str] | None,
        expected: str | Unset | None,
        status: RunStatus | None,
        attach: Mapping[str, Mapping[str, bytes]] | None = None,
    ) -> bool:
        """Write the checkpoint (and ``attach``, held pending writes by checkpoint, in the
        same transaction); False if this very checkpoint was already there (nothing
        written)."""
        # Like the status: a checkpoint continuing this saver's own head is on a run whose
        # workflow is already set (unnamed, the UPDATE is smaller). An interrupt recorded on
        # it meanwhile has marked the run waiting.
        if status is None or self._interrupted.get(stored):
            control = NO_CONTROL if status is None else RunControl(workflow=WORKFLOW)
        else:
            control = RunControl(status, WORKFLOW)
        # The request and its options by tuple.__new__ with the fields in order: what the
        # named tuples' generated __new__ does, without its Python frame (on every put).
        # SaveOptions: expected_head, lease, release, durability, consumed_inputs, effects,
        # attach.
        options = tuple.__new__(SaveOptions, (expected, None, False, None, (), None, attach))
        for attempt in (1, 2):
            try:
                request = tuple.__new__(SaveRequest, (
                    run_id, state, changed, parent_id, step, stored, meta, 0, control, options
                ))
                step_path = self._save_step  # a loop step, without the store's general path
                if step_path is not None and step_path(request):
                    return True
                self.store.save_request(request)
                return True
            except SerializationError as exc:
                if attempt == 2 or not (exc.path or "").startswith("metadata"):
                    raise
                # LangGraph metadata (or checkpoint frame) that is not JSON: keep that part
                # in LangGraph's own serialised form instead.
                pack_not_json(meta["langgraph"], self.serde)
            except ConflictError as exc:
                if exc.actual == stored:
                    return False  # this very checkpoint is already there: a repeated put
                if isinstance(expected, Unset) or exc.expected != expected:
                    raise
                raise ThreadConflictError(
                    "another writer moved this LangGraph thread on since its parent "
                    f"{langgraph_id(expected) if expected else None!r} was read; writing "
                    f"{langgraph_id(stored)!r} would fork it",
                    run_id=run_id,
                    expected=expected,
                    actual=exc.actual,
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes on the config's checkpoint, in one transaction.

        Special writes (``WRITES_IDX_MAP``) replace a previous write of the same task and
        index; regular writes are kept once (a repeated call changes nothing).
        """
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns") or ""
        run_id = f"{thread_id}{NS_SEP}{ns}" if ns else thread_id  # run_id_for, inlined
        checkpoint_id = conf["checkpoint_id"]
        dumps = self.serde.dumps_typed
        records: dict[str, bytes] = {}
        # (Not any() over a generator, nor a list comprehension: a frame per call, on every
        # step.)
        if WRITES_IDX_MAP.keys().isdisjoint(map(_CHANNEL, writes)):
            # Regular writes only (a task's result): one record, kept once.
            if not writes:
                return
            interrupted = replace = False
            regular = True
            packed = []
            for idx, (channel, value) in enumerate(writes):  # (not a comprehension: a frame)
                packed.append((task_id, channel, *dumps(value), task_path, idx))
            records[f"{checkpoint_id}/{task_id}"] = pack_writes(packed)
        else:
            interrupted = False
            replace = True
            regular = False
            for idx, (channel, value) in enumerate(writes):
                special = WRITES_IDX_MAP.get(channel)
                index = idx if special is None else special
                replace = replace and special is not None
                interrupted = interrupted or channel == INTERRUPT
                records[f"{checkpoint_id}/{task_id}/{index}"] = pack_write(
                    task_id, channel, dumps(value), task_path, index
                )
        stored = f"{checkpoint_id}{id_suffix(run_id)}"  # stored_id, without a Python call
        if interrupted:
            self._interrupted.put(stored, True)  # before the put of `stored` may look
        if self._held is not None:
            if regular and self._held.hold(
                run_id, stored, records, written=self._known.get(stored) is not None
            ):
                return  # committed with a checkpoint (see langgraph_writes)
            # An interrupt, an error...: no checkpoint may follow. The writes held on the
            # run's written checkpoints are committed now, before these (those on one not
            # written yet still wait for its put, which follows).
            earlier = self._held.take_written(run_id)
            if earlier:
                self._held.commit(run_id, earlier)
        self.store.attach(run_id, stored, records, replace=replace)
        if interrupted:
            self._mark_waiting(run_id)

    def _mark_waiting(self, run_id: str) -> None:
        """Show the run as waiting (for a human) in pitstop's tools until it continues."""
        with contextlib.suppress(RunNotFoundError):
            self.store.update_run(run_id, status=RunStatus.WAITING)

    def get_next_version(self, current: int | str | None, channel: None) -> Any:
        """Integer versions 1, 2, 3... (values are deduplicated by content, not version).

        A thread whose versions are strings -- written by ``SqliteSaver``/``PostgresSaver``
        or ``InMemorySaver`` and then stored here, or migrated from an older checkpoint
        format -- goes on with strings of their ``"<32-digit n>.<16 chars>"`` shape:
        LangGraph compares a channel's versions with each other, so one thread must not mix
        ``int`` and ``str``. Without their random part: values here are not keyed by version.
        """
        if current is None:
            return 1
        if isinstance(current, str):
            return f"{int(current.split('.', 1)[0]) + 1:032}.{0:016}"
        return int(current) + 1

    # -- maintenance -------------------------------------------------------------------------

    def _flush(self) -> None:
        """Commit the pending writes held on checkpoints in the store (before any read)."""
        if self._held is not None:
            self._held.flush(everything=False)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every namespace of the thread: checkpoints, writes and unshared values."""
        self._flush()
        langgraph_threads.delete_thread(self.store, str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that these LangGraph runs wrote."""
        doomed_runs = {str(r) for r in run_ids}
        if not doomed_runs:
            return
        self._flush()
        langgraph_threads.delete_for_runs(self.store, self.serde, doomed_runs)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace of a thread, with the same checkpoint ids, parents, metadata
        and pending writes. Values are shared with the source, not stored twice."""
        self._flush()
        langgraph_threads.copy_thread(self.store, str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's latest checkpoint (with its writes and
        values); ``delete``: delete the threads. See the module documentation."""
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        threads = [str(t) for t in thread_ids]
        self._flush()
        if strategy == "delete":
            for thread_id in threads:
                self.delete_thread(thread_id)
            return
        langgraph_threads.keep_latest(self.store, self.serde, threads)

    # -- async: the same methods in a worker thread ------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = self.list(config, filter=filter, before=before, limit=limit)
        while (item := await asyncio.to_thread(next, items, None)) is not None:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def _ran(seen: Mapping[str, Any], parent: _Known | None) -> str | None:
    """The nodes that ran in the step that made a checkpoint: those whose versions_seen moved
    since the parent (None if the parent is not known here)."""
    if parent is None:
        return None
    before = parent.seen
    ran = []
    for node, versions in seen.items():  # (not a comprehension: its own frame, every put)
        if node != INTERRUPT and before.get(node) != versions:
            ran.append(node)
    if not ran:
        return None
    ran.sort()
    return ",".join(ran) or None


__all__ = [
    "WORKFLOW",
    "PitstopSaver",
    "ThreadConflictError",
    "langgraph_id",
    "run_id_for",
    "stored_id",
]
