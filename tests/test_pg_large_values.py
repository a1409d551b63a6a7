"""Large values on PostgreSQL: 1 to 200 MiB saved, recorded and sent in bounded time.

Transactions are pipelined (libpq pipeline mode). psycopg's ``Pipeline.sync()`` sends what
fits in the socket and then waits for the server's answer; a large value still in libpq's
output buffer at that moment never reaches the server, which waits for it (``ClientRead``)
while the client waits for a reply: a save that hangs forever. It shows once the link or the
server is slower than the client (a busy machine, a real network); here a slow link (the
fault proxy, throttled) and a busy CPU make it happen. Every value must arrive whole, and
nothing may wait on a server forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pitstop
from conftest import BACKENDS, drop_pg_schema, pg_schema_url
from faults import FaultProxy
from pitstop import RunStatus

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif("postgres" not in BACKENDS, reason="no PostgreSQL backend"),
]

MiB = 1 << 20


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"big_{uuid.uuid4().hex[:12]}"
    yield name
    drop_pg_schema(name)


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """Another process spinning on a CPU for as long as the test runs."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _value(kind: str, size: int) -> Any:
    # Random, so compression cannot shrink it. A str is stored as one value (one statement);
    # bytes of this size are cut into chunks.
    if kind == "text":
        return os.urandom(size // 2).hex()
    return os.urandom(size)


def _save_text(store: pitstop.Store, size: int) -> None:
    value = _value("text", size)
    store.save("r", {"a": 1})
    store.save("r", {"a": 1, "big": value})
    assert store.latest("r").state["big"] == value  # type: ignore[union-attr]


def _save_bytes(store: pitstop.Store, size: int) -> None:
    value = _value("bytes", size)
    store.save("r", {"big": value})  # a run's first save: the shared path
    assert store.latest("r").state["big"] == value  # type: ignore[union-attr]


def _record_effect(store: pitstop.Store, size: int) -> None:
    value = _value("bytes", size)
    store.save("r", {"a": 1})
    assert store.record_effect("r", "download", value) == value
    assert store.get_effect("r", "download") == (True, value)


def _send(store: pitstop.Store, size: int) -> None:
    value = _value("bytes", size)
    store.save("r", {"a": 1}, status=RunStatus.WAITING, metadata={"waiting_for": ["upload"]})
    store.send("r", "upload", value)
    assert store.inputs("r")["upload"].payload == value


OPERATIONS: dict[str, Callable[[pitstop.Store, int], None]] = {
    "save-text": _save_text,
    "save-bytes": _save_bytes,
    "record_effect": _record_effect,
    "send": _send,
}


def _bounded(fn: Callable[[], None], limit: float = 300.0) -> None:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it never returns."""
    errors: list[BaseException] = []

    def call() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still waiting on the server after {limit:.0f}s"
    if errors:
        raise errors[0]


# Every operation at 1 and 20 MiB; the single-statement paths (a str is one value, an effect's
# result and an input are never cut into chunks) up to 200 MiB. The largest cases are few:
# a 200 MiB value takes seconds to encode, hash, send and read back.
DIRECT = [(mib, op) for mib in (1, 20) for op in OPERATIONS] + [
    (64, "save-text"),
    (64, "record_effect"),
    (200, "record_effect"),
]
BUSY = [(1, "record_effect"), (20, "send"), (64, "save-text"), (200, "save-bytes")]


@pytest.mark.parametrize(("mib", "op"), DIRECT)
@pytest.mark.slow
def test_a_large_value_is_stored_whole(schema: str, op: str, mib: int) -> None:
    with pitstop.open_store(pg_schema_url(schema)) as store:
        _bounded(lambda: OPERATIONS[op](store, mib * MiB))


@pytest.mark.parametrize(("mib", "op"), BUSY)
@pytest.mark.slow
def test_a_large_value_is_stored_whole_with_the_cpu_busy(
    schema: str, op: str, mib: int, busy_cpu: None
) -> None:
    with pitstop.open_store(pg_schema_url(schema)) as store:
        _bounded(lambda: OPERATIONS[op](store, mib * MiB))


@pytest.mark.parametrize("op", OPERATIONS)
@pytest.mark.slow
def test_a_large_value_crosses_a_slow_link(schema: str, op: str) -> None:
    """20 MiB over a link of 16 MiB/s: most of the value is still in the client's buffers
    when the transaction syncs (this hung before, for effects and inputs)."""
    proxy = FaultProxy()
    try:
        with pitstop.open_store(proxy.url(pg_schema_url(schema))) as store:
            proxy.throttle(16 * MiB)
            _bounded(lambda: OPERATIONS[op](store, 20 * MiB))
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_workflow_with_large_values_completes(schema: str) -> None:
    """A step's state, an effect's result and an input, each 20 MiB, in one run."""
    blob = _value("bytes", 20 * MiB)
    text = _value("text", 20 * MiB)
    wf = pitstop.Workflow("big")

    @wf.step
    def fetch(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"text": text, "blob": ctx.effect("download", lambda: blob)}

    @wf.step(wait_for="upload")
    def combine(state: dict[str, Any], upload: bytes) -> dict[str, Any]:
        return {"sizes": [len(state["text"]), len(state["blob"]), len(upload)]}

    def run() -> None:
        with pitstop.open_store(pg_schema_url(schema)) as store:
            first = wf.start(store, {}, run_id="big-1")
            assert first.status is RunStatus.WAITING, first.error
            store.send("big-1", "upload", blob)
            done = wf.resume(store, "big-1")
            assert done.status is RunStatus.COMPLETED, done.error
            assert done.state["sizes"] == [len(text), len(blob), len(blob)]
            assert done.state["text"] == text and store.verify() == []

    _bounded(run)
