"""Whole LangGraph threads in a pitstop store: their runs and checkpoint records listed, and
what PitstopSaver's ``delete_thread``, ``delete_for_runs``, ``copy_thread`` and ``prune`` do
to them.

A thread is one run per namespace (:mod:`~pitstop.integrations.langgraph_ids`), found by its
run metadata; everything here goes through the :class:`~pitstop.Store` API, so it works on
every backend, and reads checkpoint records (metadata, never a state) except to copy them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Set
from typing import Final

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..errors import RunNotFoundError
from ..model import CheckpointSummary, Run
from ..store import RetentionPolicy, RunControl, SaveOptions, SaveRequest, Store
from .langgraph_ids import WORKFLOW, langgraph_id, run_id_for, stored_id
from .langgraph_meta import langgraph_metadata

PAGE: Final = 64
"""Checkpoint records read per page of a run's history."""


def create_thread_run(store: Store, run_id: str, thread_id: str, ns: str) -> None:
    """The run holding a thread's namespace, if it is not there yet."""
    store.create_run(
        run_id,
        workflow=WORKFLOW,
        metadata={"thread_id": thread_id, "checkpoint_ns": ns},
        exist_ok=True,
    )


def thread_runs(store: Store, thread_id: str) -> list[Run]:
    """The runs of every namespace of a thread."""
    return store.runs(workflow=WORKFLOW, metadata={"thread_id": thread_id}, limit=None)


def summaries(store: Store, run_id: str, before: str | None) -> Iterator[CheckpointSummary]:
    """A run's checkpoint records newest first, page by page, without their state."""
    cursor = stored_id(before, run_id) if before else None
    while True:
        try:
            page = store.history(run_id, limit=PAGE, before=cursor)
        except RunNotFoundError:
            return
        yield from page
        if len(page) < PAGE:
            return
        cursor = page[-1].id


def delete_thread(store: Store, thread_id: str) -> None:
    """Delete every namespace of the thread: checkpoints, writes and unshared values."""
    for run in thread_runs(store, thread_id):
        with contextlib.suppress(RunNotFoundError):
            store.delete_run(run.id)


def delete_for_runs(store: Store, serde: SerializerProtocol, doomed_runs: Set[str]) -> None:
    """Delete the checkpoints (and their writes) that these LangGraph runs wrote: the
    metadata of every LangGraph checkpoint in the store is read (nothing indexes them)."""
    for run in store.runs(workflow=WORKFLOW, limit=None):
        doomed = [
            s.id
            for s in summaries(store, run.id, None)
            if isinstance(meta := langgraph_metadata(s, serde), Mapping)
            and meta.get("run_id") in doomed_runs
        ]
        if doomed:
            store.delete_checkpoints(run.id, doomed)


def copy_thread(store: Store, source: str, target: str) -> None:
    """Copy every namespace of a thread, with the same checkpoint ids, parents, metadata
    and pending writes. Values are shared with the source, not stored twice."""
    for run in thread_runs(store, source):
        ns = str(run.metadata.get("checkpoint_ns", ""))
        target_run = run_id_for(target, ns)
        create_thread_run(store, target_run, target, ns)
        copies: dict[str, str] = {}
        for summary in reversed(list(summaries(store, run.id, None))):
            stored = store.get(summary.id)
            meta = dict(stored.metadata)
            lg = dict(meta.get("langgraph", {}))
            parent = copies.get(stored.parent_id or "")
            if parent is None and "parent" not in lg:
                lg["parent"] = langgraph_id(stored.parent_id) if stored.parent_id else None
            meta["langgraph"] = lg
            meta["copied_from"] = stored.id
            copy = stored_id(langgraph_id(stored.id), target_run)
            writes = store.attachments(run.id, stored.id)
            store.save_request(SaveRequest(
                target_run, stored.state, parent_id=parent, step=stored.step,
                checkpoint_id=copy, metadata=meta, control=RunControl(workflow=WORKFLOW),
                # (writes attached to the copy go into the row it inserts)
                options=SaveOptions(attach={copy: writes} if writes else None),
            ))
            copies[stored.id] = copy


def keep_latest(store: Store, serde: SerializerProtocol, threads: list[str]) -> None:
    """Prune each namespace of the threads to its latest checkpoint (with its writes and
    values); ``NotImplementedError`` for threads that use a ``DeltaChannel``, before any is
    pruned."""
    runs = {thread_id: thread_runs(store, thread_id) for thread_id in threads}
    delta = sorted(
        thread_id
        for thread_id, found in runs.items()
        if any(_uses_delta_channel(store, serde, run.id) for run in found)
    )
    if delta:
        raise NotImplementedError(
            f"keep_latest can't prune threads that use a DeltaChannel: {', '.join(delta)}"
        )
    policy = RetentionPolicy(keep_last=1, keep_milestones=False)
    for found in runs.values():
        for run in found:
            store.prune(policy, run_id=run.id)


def _uses_delta_channel(store: Store, serde: SerializerProtocol, run_id: str) -> bool:
    """Whether a checkpoint of the run counts delta-channel writes: its latest value is
    rebuilt from older checkpoints, which keep_latest would delete."""
    return any(
        isinstance(meta := langgraph_metadata(s, serde), Mapping)
        and "counters_since_delta_snapshot" in meta
        for s in summaries(store, run_id, None)
    )


__all__ = [
    "PAGE",
    "copy_thread",
    "create_thread_run",
    "delete_for_runs",
    "delete_thread",
    "keep_latest",
    "summaries",
    "thread_runs",
]
