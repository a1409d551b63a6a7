"""What PitstopSaver remembers to tell a checkpoint that continues a thread from a branch.

Two workers continuing one LangGraph thread from the same checkpoint would each write a child
of it: two diverging histories, one of them invisible (LangGraph issue 8796). PitstopSaver
writes a checkpoint that *continues* a thread only if its parent is still the run's head
(the store's compare-and-set ``expected_head``; ``None``: the run must still be empty), and
one that deliberately branches (time travel, ``update_state`` on an earlier checkpoint, a
fork) without that check. Configs carry nothing for this -- they are exactly what LangGraph's
savers return -- so :class:`ForkGuard` remembers, for each of the last :data:`READS_KEPT`
checkpoints the saver read (``get_tuple``, ``list``) or wrote, whether it was its run's head
at that moment, and per run the reads of its latest checkpoint that found none.
:meth:`ForkGuard.expected_head` has the rules; docs/langgraph.md lists which races they catch
and which they cannot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

from ..cache import BoundedCache
from ..store.contract.base import UNSET, Unset

READS_KEPT: Final = 16384
"""Checkpoints whose read (or write) is remembered to tell continuations from branches: each
entry is a short id and a bool, so this costs ~2 MiB at most."""


class ForkGuard:
    """The head a checkpoint's run must have for it to be written (see the module docs)."""

    def __init__(self) -> None:
        # Stored id -> True if the checkpoint was the run's head when the saver last read or
        # wrote it (a child continues the thread: compare-and-set), False if it was read as
        # an earlier one (a child is a deliberate branch). The last read or write wins.
        self._continues: BoundedCache[bool] = BoundedCache(READS_KEPT)
        # seen(stored_id, was_head): the saver read (or wrote) ``stored_id``; ``was_head``:
        # it was its run's head. The cache's own put, bound: it runs on every put and read.
        self.seen: Callable[[str, bool], None] = self._continues.put
        # run id -> reads of the run's latest checkpoint that found none, not yet followed
        # by a parentless put (each such put is the thread's first and takes one). A read
        # that finds a head clears it. A lock: two readers of an empty thread both count.
        self._empty_reads: dict[str, int] = {}
        self._empty_lock = threading.Lock()

    def latest_read(self, run_id: str, *, empty: bool) -> None:
        """Count a read of the run's latest checkpoint that found none (or forget the count)."""
        with self._empty_lock:
            if empty:
                self._empty_reads[run_id] = self._empty_reads.get(run_id, 0) + 1
                if len(self._empty_reads) > READS_KEPT:
                    del self._empty_reads[next(iter(self._empty_reads))]
            else:
                self._empty_reads.pop(run_id, None)

    def _take_empty_read(self, run_id: str) -> bool:
        """Whether a read found the run empty that no parentless put has answered yet."""
        with self._empty_lock:
            count = self._empty_reads.pop(run_id, 0)
            if count > 1:
                self._empty_reads[run_id] = count - 1
            return count > 0

    def expected_head(self, run_id: str, parent_id: str | None, source: Any) -> str | Unset | None:
        """The head the run must have for this checkpoint to be written (UNSET: any).

        A checkpoint that continues the thread needs its parent to still be the head (None:
        the thread to still be empty); one that deliberately branches does not.
        """
        if source == "fork":
            # Time travel without new input, update_state(..., as_node="__copy__"): a branch
            # by definition (and __copy__'s parent is not what its writer read).
            return UNSET
        if parent_id is None:
            # The thread's first checkpoint after a read that found it empty; otherwise a
            # new root in a namespace that has checkpoints (LangGraph replaying a subgraph
            # from before its first run) or a put made by hand.
            return None if self._take_empty_read(run_id) else UNSET
        continues = self._continues.get(parent_id)
        if continues is None:
            # Neither read nor written here lately: a loop step continues the thread; an
            # input or update on a config made by hand is an explicit branch.
            return parent_id if source == "loop" else UNSET
        return parent_id if continues else UNSET


__all__ = ["READS_KEPT", "ForkGuard"]
