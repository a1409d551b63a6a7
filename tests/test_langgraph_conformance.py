"""LangGraph's own checkpointer conformance suite against PitstopSaver, on every backend.

``langgraph-checkpoint-conformance`` runs the base capabilities (put, put_writes, get_tuple,
list, delete_thread) and every extended one the saver implements (delete_for_runs,
copy_thread, prune). PitstopSaver implements all of them, so all must be detected and pass.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

import pitstop
from pitstop.integrations.langgraph import PitstopSaver


@pytest.mark.slow
async def test_conformance_full(store_url: str) -> None:
    @checkpointer_test(name=f"PitstopSaver[{store_url.split(':', 1)[0]}]")
    async def factory() -> AsyncIterator[PitstopSaver]:
        # One store per capability suite, as the runner asks; same database throughout.
        saver = PitstopSaver(pitstop.open_store(store_url))
        try:
            yield saver
        finally:
            saver.store.close()

    report = await validate(factory)
    failures = {
        name: result.failures for name, result in report.results.items() if result.failures
    }
    assert not failures, failures
    assert {name for name, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert report.passed_all() and report.conformance_level() == "FULL"
