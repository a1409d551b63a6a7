"""The runtime's own counters (#29): cache hits and misses, effects run, replayed and
repeated, stream checkpoints and lag; read from a real prometheus-client registry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")

import pitstop
from pitstop import CachePolicy, Store, stream
from pitstop.observe import metrics


@pytest.fixture
def counted() -> Iterator[metrics.Metrics]:
    """Metrics on for this test alone (a registry of its own)."""
    before = metrics._current.metrics
    metrics._current.metrics = metrics.Metrics()
    yield metrics._current.metrics
    metrics._current.metrics = before


def _sample(counted: metrics.Metrics, name: str, **labels: str) -> float:
    return counted.registry.get_sample_value(name, labels) or 0.0


def test_cache_hits_and_misses_of_steps_and_calls(store: Store,
                                                  counted: metrics.Metrics) -> None:
    wf = pitstop.Workflow("fed-cache")

    @wf.step(cache=CachePolicy(inputs=["n"]))
    def fetch(state: dict[str, Any]) -> dict[str, Any]:
        return {"page": state["n"] * 2}

    @wf.step
    def lookup(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"twice": ctx.cached("double", lambda n: n * 2, state["n"])}

    for n in (1, 1, 2):
        wf.start(store, {"n": n})
    assert _sample(counted, "pitstop_cache_hits_total", kind="step") == 1
    assert _sample(counted, "pitstop_cache_misses_total", kind="step") == 2
    assert _sample(counted, "pitstop_cache_hits_total", kind="call") == 1
    assert _sample(counted, "pitstop_cache_misses_total", kind="call") == 2


def test_effects_run_replayed_and_repeated(store: Store, counted: metrics.Metrics) -> None:
    wf = pitstop.Workflow("fed-effects")
    failed: list[bool] = []

    @wf.step(retry=pitstop.Retry(attempts=2, backoff=0))
    def pay(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        charged = ctx.effect("charge", lambda: 42)
        if not failed:
            failed.append(True)
            raise RuntimeError("after the effect")  # the retry replays the recorded charge
        return {"charged": charged}

    @wf.step
    def notify(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        key, run_id = ctx.idempotency_key("mail"), ctx.run_id

        def send() -> int:
            # Another execution of this step recorded the effect while this one ran it:
            # the effect ran twice (the window ctx.effect documents).
            store.record_effect(run_id, key, 1)
            return 2

        return {"sent": ctx.effect("mail", send)}

    result = wf.start(store, {})
    assert result.state["charged"] == 42 and result.state["sent"] == 1
    assert _sample(counted, "pitstop_effects_total", workflow="fed-effects",
                   outcome="run") == 1
    assert _sample(counted, "pitstop_effects_total", workflow="fed-effects",
                   outcome="replayed") == 1
    assert _sample(counted, "pitstop_effects_total", workflow="fed-effects",
                   outcome="repeated") == 1


def test_stream_checkpoints_and_lag(store: Store, counted: metrics.Metrics) -> None:
    items = [(f"k{i % 7}", 1) for i in range(250)]
    job = stream.Job("fed-stream", source=stream.Iterable(items, partitions=2), every=50,
                     seconds=60)

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        state[record.key] = state.get(record.key, 0) + record.value

    report = job.run(store, idle_exit=0.1)
    assert _sample(counted, "pitstop_stream_checkpoints_total",
                   stream="fed-stream") == report.checkpoints > 0
    for partition in ("0", "1"):
        assert counted.registry.get_sample_value(
            "pitstop_stream_lag", {"stream": "fed-stream", "partition": partition}) == 0


def test_no_count_is_lost_across_threads_and_threads_that_end() -> None:
    """Steps count in per-thread lists without a lock: threads switching every microsecond,
    and threads that end (their lists are folded into the totals), lose no increment."""
    import sys
    import threading

    counted = metrics.Metrics()
    per_thread, rounds = 3_000, 4
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(rounds):  # each round's threads end before the next round's register
            workflow = counted.for_workflow("threads")

            def count(workflow: metrics.WorkflowMetrics = workflow) -> None:
                for _ in range(per_thread):
                    workflow.ok.inc()
                    workflow.saved_checkpoint("running", 0.0003, 900)
                    counted.cache_lookup("call", True)

            threads = [threading.Thread(target=count) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(switch)
    expected = per_thread * 4 * rounds
    assert _sample(counted, "pitstop_steps_total", workflow="threads", outcome="ok") == expected
    assert _sample(counted, "pitstop_checkpoints_total", workflow="threads",
                   status="running") == expected
    assert _sample(counted, "pitstop_checkpoint_seconds_count", workflow="threads") == expected
    assert _sample(counted, "pitstop_checkpoint_bytes_bucket", workflow="threads",
                   le="1024.0") == expected
    assert _sample(counted, "pitstop_checkpoint_bytes_sum", workflow="threads") == 900 * expected
    assert _sample(counted, "pitstop_cache_hits_total", kind="call") == expected
    # The lists of the threads that ended were folded: only the last round's remain.
    assert len(counted.counts.tally.threads) <= 4 + 1


def _scrape(counted: metrics.Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one collection (one read of the counts)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in counted.registry.collect() for sample in family.samples}


def test_saves_folded_while_scraped_are_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps and saves append to lists that a fold (by the thread whose append fills one, or
    by a scrape) moves into the counts: threads switching every microsecond, folds every few
    saves, a scrape in a loop beside them. Each scrape sees whole folds (as many checkpoints
    as durations and bytes observed) and never less than the one before; at the end every
    step, save, bucket and sum is exact."""
    import sys
    import threading
    from bisect import bisect_left

    monkeypatch.setattr(metrics, "_FOLD_AT", 7)
    counted = metrics.Metrics()
    workflow = counted.for_workflow("racing")
    per_thread, writers = 8_000, 4
    # Bounds themselves included: a value equal to a bound is in that bound's bucket.
    seconds = [0.0001, 0.00007, 0.0003, 0.001, 0.0042, 0.03, 0.5, 2.5, 11.0, 0.00025, 1.0]
    sizes: list[int | None] = [64, 900, 1024, 1025, None, 5, 70_000, 4 ** 14, 4 ** 15, 300]
    statuses = ["running", "running", "running", "completed", "failed"]

    def observe(offset: int) -> None:
        scraping.wait()
        for i in range(offset, offset + per_thread):
            workflow.ok.inc()
            workflow.saved_checkpoint(statuses[i % len(statuses)], seconds[i % len(seconds)],
                                      sizes[i % len(sizes)])

    def scrape_until_done() -> None:
        try:
            scrape_while_writing()
        except BaseException as exc:
            failed.append(exc)
            scraping.set()

    def scrape_while_writing() -> None:
        before: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        while any(thread.is_alive() for thread in threads):
            now = _scrape(counted)
            saved = sum(value for (name, _), value in now.items()
                        if name == "pitstop_checkpoints_total")
            assert now[("pitstop_checkpoint_seconds_count", (("workflow", "racing"),))] == saved
            assert all(value >= before.get(key, 0) for key, value in now.items()
                       if not key[0].endswith("_created")), "a count went down"
            before = now
            scrapes.append(saved)
            scraping.set()  # the writers start once a scrape has run: scrapes overlap them

    scrapes: list[float] = []
    scraping = threading.Event()
    failed: list[BaseException] = []
    threads = [threading.Thread(target=observe, args=(n * per_thread,)) for n in range(writers)]
    scraper = threading.Thread(target=scrape_until_done)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        scraper.start()
        for thread in threads:
            thread.join()
        scraper.join()
    finally:
        sys.setswitchinterval(switch)
    if failed:
        raise failed[0]
    assert any(0 < saved < per_thread * writers for saved in scrapes)  # scraped mid-way

    everything = range(per_thread * writers)
    final = _scrape(counted)

    def sample(name: str, **labels: str) -> float:
        return final.get((name, tuple(sorted({"workflow": "racing", **labels}.items()))), 0.0)

    assert sample("pitstop_steps_total", outcome="ok") == per_thread * writers
    for status in set(statuses):
        assert sample("pitstop_checkpoints_total", status=status) == sum(
            statuses[i % len(statuses)] == status for i in everything)
    for name, values, bounds in (
            ("pitstop_checkpoint_seconds", [seconds[i % len(seconds)] for i in everything],
             metrics._SECONDS_BUCKETS),
            ("pitstop_checkpoint_bytes", [size for i in everything
                                          if (size := sizes[i % len(sizes)]) is not None],
             metrics._BYTES_BUCKETS)):
        placed = [bisect_left(bounds, value) for value in values]
        for index, bound in enumerate([*bounds, float("inf")]):
            le = "+Inf" if index == len(bounds) else repr(bound)
            assert sample(f"{name}_bucket", le=le) == sum(at <= index for at in placed), le
        assert sample(f"{name}_count") == len(values)
        assert sample(f"{name}_sum") == pytest.approx(sum(values), rel=1e-12)
    assert not workflow.pending.steps and not workflow.pending.added  # all folded
