"""The passes over large buffers split across threads (pitstop.serde.parallel): results in
order, the caller working a share itself, errors raised once every share has stopped, no
deadlock when a share starts a pass of its own, and a forked child that still finishes."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest

from pitstop.serde import parallel

LARGE = parallel.PARALLEL_MIN  # bytes that make a pass use the threads

needs_threads = pytest.mark.skipif(parallel.THREADS < 2, reason="one core: passes stay serial")


@needs_threads
def test_a_large_pass_keeps_the_order_and_the_caller_takes_a_share() -> None:
    seen: list[int] = []

    def work(item: int) -> int:
        seen.append(threading.get_ident())
        time.sleep(0.001)  # long enough for every share to be under way at once
        return item * 2

    items = list(range(64))
    assert parallel.each(work, items, LARGE) == [i * 2 for i in items]
    assert threading.get_ident() in seen
    assert len(set(seen)) == min(parallel.THREADS, len(items))
    assert parallel.each(work, items, LARGE - 1) == [i * 2 for i in items]  # small: serial


@needs_threads
def test_an_error_is_raised_once_every_share_has_stopped() -> None:
    done: list[int] = []

    def work(item: int) -> int:
        if item in (1, 40):
            raise ValueError(f"item {item}")
        time.sleep(0.001)
        done.append(item)
        return item

    items = list(range(64))
    with pytest.raises(ValueError, match=r"item 1$"):  # the first in the items' order
        parallel.each(work, items, LARGE)
    # Every share ran to its end or its error before the raise: nothing still runs over
    # the caller's buffers, and the share that failed at 40 had done the items before it.
    finished = set(done)
    time.sleep(0.05)
    assert set(done) == finished
    step = -(-len(items) // min(parallel.THREADS, len(items)))
    start = 40 // step * step
    assert set(range(start, 40)) <= finished


@needs_threads
def test_a_pass_started_inside_a_share_runs_there_and_does_not_deadlock() -> None:
    def inner(item: int) -> int:
        return item + 1

    def outer(item: int) -> int:
        return sum(parallel.each(inner, list(range(8)), LARGE))

    result: list[list[int]] = []
    runner = threading.Thread(
        target=lambda: result.append(parallel.each(outer, list(range(16)), LARGE)), daemon=True
    )
    runner.start()
    runner.join(30)
    assert not runner.is_alive(), "a nested pass waited on a pool busy with its own caller"
    assert result == [[36] * 16]


@needs_threads
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_makes_its_own_pool() -> None:
    parallel.each(lambda i: i, list(range(8)), LARGE)  # the parent's pool exists
    with warnings.catch_warnings():  # 3.12+ warns of fork in a threaded process: the point
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its copy of the pool has no threads
        try:
            ok = parallel.each(lambda i: i + 1, list(range(8)), LARGE) == list(range(1, 9))
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's pass never finished")
