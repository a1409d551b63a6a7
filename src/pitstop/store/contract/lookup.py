"""Naming runs and checkpoints the short ways people type them, for the CLI and the API alike.

A UUIDv7 begins with its timestamp, so an id's first characters are what people copy from a
log (``pitstop diff 01a2336d-86 ...``); the *end* of an id is random, so listings show its
last characters (``pitstop history`` prints ``e81952ae``) and ``RUN@e81952ae`` names that
checkpoint. A run id is a name people choose, so any unique start of it names the run.

Short ids are unique within their run whatever made the id: a LangGraph checkpoint is stored
as ``X~<tag naming the thread>`` (the tag is the same for all of a thread's checkpoints), so
its short form is the end of ``X``, LangGraph's own id. :func:`short_ids` lengthens the form
of any two ids of a listing whose ends still collide.

One range scan of the unique index on checkpoint ids answers a prefix. Functions over a store
(not store methods): :func:`resolve_checkpoint` is what ``Workflow.fork`` and the CLI call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import AmbiguousReferenceError, CheckpointNotFoundError, RunNotFoundError
from ...model import Run
from .base import Store

SHORT = 8
"""Characters of a checkpoint id shown in listings: the end of the id, which is random (the
start of a UUIDv7 is its timestamp, shared by checkpoints written in the same millisecond)."""

MIN_PREFIX = 4
"""The shortest checkpoint id start or end accepted (shorter ones match too much to mean
anything; a run id's start may be shorter: run ids are names)."""

_TAG_SEP = "~"
"""Separates an id made elsewhere (LangGraph's) from the tag that makes it unique in a store."""

LISTED = 5
"""Candidates named in an ambiguity error."""


def _core(checkpoint_id: str) -> str:
    """The part of an id that differs between a run's checkpoints (a LangGraph id without
    the thread tag every checkpoint of the thread shares)."""
    return checkpoint_id.rpartition(_TAG_SEP)[0] if _TAG_SEP in checkpoint_id else checkpoint_id


def short_id(checkpoint_id: str | None) -> str:
    """The short form of a checkpoint id shown in listings (``"-"`` for None)."""
    return "-" if checkpoint_id is None else _core(checkpoint_id)[-SHORT:]


def short_ids(checkpoint_ids: Iterable[str]) -> dict[str, str]:
    """The short form of each id, lengthened where two of them would share one."""
    ids = list(dict.fromkeys(checkpoint_ids))
    width = SHORT
    while True:
        forms = {cid: _core(cid)[-width:] for cid in ids}
        if len(set(forms.values())) == len(forms) or width >= max(map(len, ids), default=0):
            return forms
        width += 4


def _candidates(ids: list[str]) -> str:
    shown = ", ".join(ids[:LISTED])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > LISTED else "")


def find_run(store: Store, text: str) -> Run:
    """The run ``text`` names: its id, or a unique start of it (``01a2326a-2e98``, ``t``).
    :class:`~pitstop.RunNotFoundError` if none does, :class:`~pitstop.AmbiguousReferenceError`
    listing some if several do."""
    try:
        return store.get_run(text)
    except RunNotFoundError:
        if not text:
            raise
    found = store.runs(id_prefix=text, limit=LISTED + 1)
    if not found:
        raise RunNotFoundError(text)
    if len(found) > 1:
        total = sum(store.count_runs(id_prefix=text).values()) if len(found) > LISTED \
            else len(found)
        ids = [r.id for r in found[:LISTED]]
        raise AmbiguousReferenceError(
            f"run id {text!r} is ambiguous: {total} runs start with it "
            f"({', '.join(ids)}{', ...' if total > len(ids) else ''}); give more characters",
            reference=text, candidates=tuple(ids))
    return found[0]


def find_in_run(store: Store, run_id: str, ref: str) -> str:
    """The id of the checkpoint of ``run_id`` that ``ref`` names: its full id, or a unique
    short form (the end of the id as ``pitstop history`` prints it, or its beginning)."""
    try:
        summary = store.summary(ref)
    except CheckpointNotFoundError:
        summary = None
    if summary is not None:
        if summary.run_id != run_id:
            raise AmbiguousReferenceError(
                f"checkpoint {ref} belongs to run {summary.run_id!r}, not {run_id!r}",
                reference=ref, run_id=run_id, candidates=(summary.id,))
        return summary.id
    if len(ref) < MIN_PREFIX:
        raise CheckpointNotFoundError(ref, run_id=run_id, detail=(
            f"too short: give at least {MIN_PREFIX} characters"))
    ids = [s.id for s in store.history(run_id, limit=None)]
    matches = [cid for cid in ids if _core(cid).endswith(ref) or cid.startswith(ref)]
    if not matches:
        raise CheckpointNotFoundError(ref, run_id=run_id,
                                      detail=f"see `pitstop history {run_id}`")
    if len(matches) > 1:
        raise AmbiguousReferenceError(
            f"checkpoint reference {ref!r} is ambiguous in run {run_id!r} ({len(matches)} "
            f"matches: {_candidates(matches)}); give more characters or the full id",
            reference=ref, run_id=run_id, candidates=tuple(matches[:LISTED]))
    return matches[0]


def run_reference(store: Store, text: str) -> tuple[Run, str | None]:
    """A run named by its id or a unique start of one, or ``RUN@ID`` (a checkpoint of that
    run by any short form). Returns the run and the checkpoint's full id (None without ``@``)."""
    run_text, at, ref = text.rpartition("@") if "@" in text else (text, "", "")
    run = find_run(store, run_text)
    return run, find_in_run(store, run.id, ref) if at else None


def resolve_checkpoint(store: Store, ref: str) -> str:
    """The checkpoint id ``ref`` names: a checkpoint id, a run id or a unique start of one
    (the run's latest checkpoint), ``RUN@ID`` with ID as ``pitstop history RUN`` shows it,
    or a unique start of a checkpoint id. A start that fits a run is taken as the run.

    Raises :class:`~pitstop.CheckpointNotFoundError` (or :class:`~pitstop.RunNotFoundError`
    for ``RUN@ID`` with no such run) when nothing fits, and
    :class:`~pitstop.AmbiguousReferenceError` when several do.
    """
    try:
        return store.summary(ref).id
    except CheckpointNotFoundError:
        pass
    try:
        run, checkpoint_id = run_reference(store, ref)
    except RunNotFoundError:
        if "@" in ref:
            raise
        found = _checkpoint_prefix(store, ref)
        if found is None:
            raise CheckpointNotFoundError(ref) from None
        return found
    if checkpoint_id is not None:
        return checkpoint_id
    if run.head_id is None:
        raise CheckpointNotFoundError(ref, run_id=run.id, detail="the run has no checkpoints yet")
    return run.head_id


def _checkpoint_prefix(store: Store, ref: str) -> str | None:
    """The one checkpoint whose id starts with ``ref``; an error listing them if several."""
    if len(ref) < MIN_PREFIX:
        return None
    found = checkpoints_with_prefix(store, ref, limit=LISTED + 1)
    if len(found) > 1:
        shown = ", ".join(f"{run}@{short_id(cid)}" for cid, run in found[:LISTED])
        raise AmbiguousReferenceError(
            f"checkpoint id {ref!r} is ambiguous: it starts "
            f"{'more than ' if len(found) > LISTED else ''}"
            f"{min(len(found), LISTED)} checkpoints ({shown}); give more characters",
            reference=ref, candidates=tuple(cid for cid, _ in found[:LISTED]))
    return found[0][0] if found else None


def checkpoints_with_prefix(store: Store, prefix: str, *, limit: int = 6) -> list[tuple[str, str]]:
    """``(checkpoint id, run id)`` of up to ``limit`` checkpoints whose id starts with
    ``prefix``, in id order (empty for a store that cannot search ids)."""
    run_in_transaction: Any = getattr(store, "_tx", None)  # every SQL store has one
    if not prefix or run_in_transaction is None:
        return []
    # Ids are ASCII: [prefix, prefix with its last character incremented) is the prefix range.
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    rows = run_in_transaction(lambda tx: tx.all(
        "SELECT id, run_id FROM pitstop_checkpoints WHERE id >= ? AND id < ? ORDER BY id "
        "LIMIT ?", (prefix, upper, limit)))
    return [(str(checkpoint_id), str(run_id)) for checkpoint_id, run_id in rows]


__all__ = [
    "MIN_PREFIX",
    "SHORT",
    "checkpoints_with_prefix",
    "find_in_run",
    "find_run",
    "resolve_checkpoint",
    "run_reference",
    "short_id",
    "short_ids",
]
