"""Metrics through OpenTelemetry (#29): after a real run on SQLite and PostgreSQL, every metric
docs/observability.md lists reaches the SDK's InMemoryMetricReader under its name, with its
documented labels as attributes; with Prometheus on too, both count the same steps."""

from __future__ import annotations

import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the test extra installs opentelemetry-sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import pitstop
from conftest import ROOT, run_python
from pitstop import CachePolicy, Retry, stream
from pitstop.observe import metrics
from pitstop.owners import _host_name
from pitstop.runtime.worker import run_until_idle

DOCS = ROOT / "docs" / "observability.md"


def documented() -> dict[str, set[str]]:
    """The metrics table of docs/observability.md: OpenTelemetry name -> label names."""
    found = {}
    for name, kind, labels in re.findall(r"^\| `(pitstop_\w+)` \| (\w+) \|([^|]*)\|",
                                         DOCS.read_text(), re.MULTILINE):
        # Prometheus adds "_total" to a counter's name; the instrument's name is without it.
        instrument = name.removesuffix("_total") if kind == "counter" else name
        words = re.sub(r"\([^)]*\)", "", labels)
        found[instrument] = {w.strip() for w in words.split(",") if w.strip()}
    return found


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    """OpenTelemetry metrics on, to a provider of this test's own (not the global one)."""
    saved = dict(vars(metrics._current))
    stores = list(metrics._current.stores)
    found = InMemoryMetricReader()
    metrics.enable_otel(MeterProvider(metric_readers=[found]))
    yield found
    metrics.disable_otel()
    for key in ("metrics", "prometheus", "otel", "otel_forced", "provider"):
        setattr(metrics._current, key, saved.get(key, getattr(metrics._Current, key)))
    metrics._current.stores[:] = stores


def collected(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Metric name -> (attributes, data point) of one collection."""
    data = reader.get_metrics_data()
    points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "pitstop"
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(
                    (dict(point.attributes or {}), point) for point in metric.data.data_points)
    return points


def _workload(store: pitstop.Store) -> None:
    """A run of every kind the metrics count: steps that pass and fail, a cache hit and miss
    of a step and of a call, effects run and replayed, a size warning, a takeover of a dead
    owner's run, a stream job, a queued and a waiting run."""
    wf = pitstop.Workflow("otel-metrics", size_warning=1)
    failed: list[bool] = []

    @wf.step(cache=CachePolicy(inputs=["n"]))
    def fetch(state: dict[str, Any]) -> dict[str, Any]:
        return {"page": state["n"] * 2}

    @wf.step(retry=Retry(attempts=2, backoff=0))
    def pay(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        charged = ctx.effect("charge", lambda: 42)
        twice = ctx.cached("double", lambda n: n * 2, state["n"])
        if not failed:
            failed.append(True)
            raise RuntimeError("after the effect")  # the retry replays the charge
        return {"charged": charged, "twice": twice}

    wf.start(store, {"n": 1})
    wf.start(store, {"n": 1})

    # A run whose owner's process is gone: the worker takes it over at once.
    dead = subprocess.Popen(["true"])
    dead.wait()
    wf.enqueue(store, {"n": 2}, run_id="orphan")
    store.acquire("orphan", f"{_host_name()}:{dead.pid}:dead00", ttl=120)
    assert run_until_idle(store, wf).by_status == {"completed": 1}

    waits = pitstop.Workflow("otel-waits")

    @waits.step(wait_for="approval")
    def approve(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"ok": ctx.input("approval")}

    waits.start(store, {})
    waits.enqueue(store, {}, run_id="queued-one")

    job = stream.Job("otel-stream", source=stream.Iterable([("k", 1)] * 60, partitions=1),
                     every=20, seconds=60)

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        state[record.key] = state.get(record.key, 0) + record.value

    job.run(store, idle_exit=0.1)


def test_every_documented_metric_reaches_the_meter_with_its_labels(
        shared_url: str, reader: InMemoryMetricReader) -> None:
    with pitstop.open_store(shared_url) as store:
        metrics.watch(store)
        _workload(store)
        points = collected(reader)
    names = documented()
    assert len(names) >= 16
    missing = sorted(set(names) - set(points))
    assert missing == []
    for name, labels in names.items():
        for attributes, _point in points[name]:
            assert set(attributes) == labels, name
            assert "orphan" not in attributes.values()  # no run id in a label, ever

    def value(name: str, **attributes: str) -> Any:
        [point] = [p for a, p in points[name] if a == attributes]
        return point.value if hasattr(point, "value") else point.count

    assert value("pitstop_steps", workflow="otel-metrics", outcome="error") == 1
    assert value("pitstop_steps", workflow="otel-metrics", outcome="ok") >= 4
    assert value("pitstop_cache_hits", kind="step") == 1
    assert value("pitstop_cache_misses", kind="call") >= 1
    assert value("pitstop_effects", workflow="otel-metrics", outcome="replayed") >= 1
    assert value("pitstop_lease_takeovers", workflow="otel-metrics") == 1
    assert value("pitstop_size_warnings", workflow="otel-metrics", kind="checkpoint") >= 1
    assert value("pitstop_stream_lag", stream="otel-stream", partition="0") == 0
    assert value("pitstop_runs", workflow="otel-waits", status="waiting") == 1
    assert value("pitstop_queue_depth") == 1
    assert value("pitstop_oldest_waiting_seconds") >= 0
    [(_, saved)] = points["pitstop_checkpoint_seconds"][:1]
    assert saved.count >= 1 and list(saved.explicit_bounds)[:2] == [0.0001, 0.00025]
    assert value("pitstop_scrape_errors") == 0


def test_prometheus_and_opentelemetry_count_the_same_steps(
        tmp_path: Path, reader: InMemoryMetricReader) -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")
    both = metrics.enable()
    wf = pitstop.Workflow("otel-both")

    @wf.step
    def one(state: dict[str, Any]) -> dict[str, Any]:
        return {"a": 1}

    with pitstop.open_store(f"sqlite:///{tmp_path / 'both.db'}") as store:
        for _ in range(3):
            wf.start(store, {})
    prometheus = both.registry.get_sample_value("pitstop_steps_total",
                                                {"workflow": "otel-both", "outcome": "ok"})
    [(_, point)] = [(a, p) for a, p in collected(reader)["pitstop_steps"]
                    if a == {"workflow": "otel-both", "outcome": "ok"}]
    assert prometheus == point.value == 3


@pytest.mark.slow
def test_an_application_meter_provider_turns_metrics_on_by_itself(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import pitstop
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        wf = pitstop.Workflow("auto")

        @wf.step
        def one(state):
            return {{"a": 1}}

        store = pitstop.open_store("sqlite:///{tmp_path / 'auto.db'}")
        wf.start(store, {{}})  # the API's default provider: nothing recorded
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        wf.start(store, {{}})
        data = reader.get_metrics_data()
        print(sorted(p.value for r in data.resource_metrics for s in r.scope_metrics
                     for m in s.metrics if m.name == "pitstop_steps"
                     for p in m.data.data_points))
    """)
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1]"
