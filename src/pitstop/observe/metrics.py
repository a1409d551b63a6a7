"""Metrics, in Prometheus' format and through OpenTelemetry: what runs do (counted as they
do it) and where the store stands (read when scraped or collected).

Prometheus: turned on by :func:`enable` (``pitstop worker --metrics-port N`` and ``pitstop
ui`` do it); metrics live in their own registry (:func:`registry`), exposed by :func:`serve`
or :func:`exposition`. OpenTelemetry: on once the application sets a global meter provider
(as traces are), or after :func:`enable_otel`; the same instruments, names and labels (as
attributes) on a meter named ``pitstop``. Until one of them is on nothing here imports
either package, and each step and save checks one attribute. Labels are bounded: workflow
names, statuses, step sources; never a run id.

Counted by the runtime (in this process):

=====================================  ==========  ===============================
``pitstop_steps_total``                counter     workflow, outcome (ok, error)
``pitstop_checkpoints_total``          counter     workflow, status
``pitstop_checkpoint_seconds``         histogram   workflow (serialise + write)
``pitstop_checkpoint_bytes``           histogram   workflow (bytes a save added)
``pitstop_lease_takeovers_total``      counter     workflow
``pitstop_size_warnings_total``        counter     workflow, kind (checkpoint, field)
``pitstop_cache_hits_total``           counter     kind (step, call: ``ctx.cached``)
``pitstop_cache_misses_total``         counter     kind (computed here: no result cached)
``pitstop_effects_total``              counter     workflow, outcome (run, replayed, repeated)
``pitstop_stream_checkpoints_total``   counter     stream
``pitstop_stream_lag``                 gauge       stream, partition (records behind)
=====================================  ==========  ===============================

Read from the watched stores at each scrape or collection (one grouped query and two MIN
queries):

=====================================  ==========  ===============================
``pitstop_runs``                       gauge       workflow, status
``pitstop_queue_depth``                gauge       (queued runs)
``pitstop_oldest_queued_seconds``      gauge       age of the oldest queued run
``pitstop_oldest_waiting_seconds``     gauge       time the longest-waiting run waited
``pitstop_scrape_errors_total``        counter     (store reads that failed)
=====================================  ==========  ===============================

A scrape that cannot read the store reports the runtime's metrics and counts the error; it
never reaches a run.
"""

from __future__ import annotations

import bisect
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("pitstop.metrics")

# Seconds a save takes: from a tiny SQLite step (~50 µs) to a large state on a remote server.
_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BYTES_BUCKETS = tuple(float(4 ** n) for n in range(3, 15))  # 64 B .. 256 MiB


class _Histogram:
    """One workflow's histogram: bucket counts in a list under a lock, exposed by
    :class:`_HistogramCollector` (prometheus-client's own costs ~0.9 µs an observation, a
    quarter of the 2% a small step can spare)."""

    __slots__ = ("bounds", "counts", "lock", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        self.total = 0.0
        self.lock = threading.Lock()

    def observe(self, value: float) -> None:
        slot = bisect.bisect_left(self.bounds, value)
        with self.lock:
            self.counts[slot] += 1
            self.total += value


class _HistogramCollector:
    """Exposes per-workflow :class:`_Histogram` s as one Prometheus histogram family."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name, self.documentation, self.bounds = name, documentation, bounds
        self.children: dict[str, _Histogram] = {}
        self.lock = threading.Lock()

    def labels(self, workflow: str) -> _Histogram:
        with self.lock:
            child = self.children.get(workflow)
            if child is None:
                child = self.children[workflow] = _Histogram(self.bounds)
            return child

    def describe(self) -> list[Any]:
        return list(self.collect())

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.documentation, labels=["workflow"])
        for workflow, child in list(self.children.items()):
            with child.lock:
                counts, total = list(child.counts), child.total
            cumulative, buckets = 0, []
            for bound, count in zip([*map(repr, self.bounds), "+Inf"], counts, strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            family.add_metric([workflow], buckets, total)
        yield family


# The runtime's instruments, the same in every sink: (attribute, name, kind, description,
# labels, OpenTelemetry unit). Prometheus adds ``_total`` to a counter's name when it
# exposes it; OpenTelemetry instruments carry the name as is.
_SPECS: tuple[tuple[str, str, str, str, tuple[str, ...], str], ...] = (
    ("steps", "pitstop_steps", "counter", "Steps executed", ("workflow", "outcome"), "{step}"),
    ("checkpoints", "pitstop_checkpoints", "counter", "Checkpoints written",
     ("workflow", "status"), "{checkpoint}"),
    ("checkpoint_seconds", "pitstop_checkpoint_seconds", "histogram",
     "Time a checkpoint took (serialise and write)", ("workflow",), "s"),
    ("checkpoint_bytes", "pitstop_checkpoint_bytes", "histogram",
     "Bytes a checkpoint added to the store", ("workflow",), "By"),
    ("takeovers", "pitstop_lease_takeovers", "counter",
     "Runs taken over from an owner that died", ("workflow",), "{run}"),
    ("size_warnings", "pitstop_size_warnings", "counter",
     "Checkpoints or fields past their size_warning", ("workflow", "kind"), "{warning}"),
    ("cache_hits", "pitstop_cache_hits", "counter",
     "Steps (kind=step) and ctx.cached calls (kind=call) served from the cache", ("kind",),
     "{lookup}"),
    ("cache_misses", "pitstop_cache_misses", "counter",
     "Cached steps and calls computed here (nothing cached)", ("kind",), "{lookup}"),
    ("effects", "pitstop_effects", "counter",
     "ctx.effect calls: run (fn called), replayed (the recorded result returned), repeated "
     "(fn ran, but another execution had recorded the effect first)", ("workflow", "outcome"),
     "{call}"),
    ("stream_checkpoints", "pitstop_stream_checkpoints", "counter",
     "Stream partition checkpoints written", ("stream",), "{checkpoint}"),
    ("stream_lag", "pitstop_stream_lag", "gauge",
     "Records in a partition's source after its checkpoint", ("stream", "partition"),
     "{record}"),
)
_BOUNDS = {"checkpoint_seconds": _SECONDS_BUCKETS, "checkpoint_bytes": _BYTES_BUCKETS}

# Read from the watched stores (when scraped or collected): name, description.
STORE_GAUGES = (
    ("pitstop_runs", "Runs by workflow and status"),
    ("pitstop_queue_depth", "Queued runs"),
    ("pitstop_oldest_queued_seconds", "Age of the oldest queued run"),
    ("pitstop_oldest_waiting_seconds", "How long the longest-waiting run has waited"),
)
SCRAPE_ERRORS = ("pitstop_scrape_errors", "Scrapes that could not read the store")


class _Prometheus:
    """The instruments in a prometheus-client registry of their own."""

    def __init__(self, stores: list[Any]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = r = CollectorRegistry(auto_describe=True)
        self.families: dict[str, Any] = {}
        for attr, name, kind, description, labels, _unit in _SPECS:
            if kind == "histogram":
                family: Any = _HistogramCollector(name, description, _BOUNDS[attr])
                r.register(family)
            elif kind == "gauge":
                family = Gauge(name, description, labels, registry=r)
            else:
                family = Counter(name, description, labels, registry=r)
            self.families[attr] = family
        self.scrape_errors = Counter(*SCRAPE_ERRORS, registry=r)
        r.register(_StoreCollector(self, stores))

    def child(self, attr: str, labels: tuple[str, ...], values: tuple[str, ...]) -> Any:
        return self.families[attr].labels(*values)


class _Both:
    """One label set's child in two sinks (Prometheus and OpenTelemetry both on)."""

    __slots__ = ("first", "second")

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def inc(self, amount: float = 1) -> None:
        self.first.inc(amount)
        self.second.inc(amount)

    def observe(self, value: float) -> None:
        self.first.observe(value)
        self.second.observe(value)

    def set(self, value: float) -> None:
        self.first.set(value)
        self.second.set(value)


class _Family:
    """One instrument in every sink that is on; ``labels(*values)`` gives the child to
    ``inc()``, ``observe()`` or ``set()`` (looked up once per label set: no lock)."""

    __slots__ = ("attr", "children", "labelnames", "sinks")

    def __init__(self, attr: str, labelnames: tuple[str, ...], sinks: list[Any]) -> None:
        self.attr, self.labelnames, self.sinks = attr, labelnames, sinks
        self.children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            parts = [sink.child(self.attr, self.labelnames, values) for sink in self.sinks]
            child = parts[0] if len(parts) == 1 else _Both(*parts)
            self.children[values] = child  # two threads may both make it: the same child
        return child


class Metrics:
    """What the runtime records to: Prometheus (a registry of its own), OpenTelemetry (a
    meter of the given provider), or both; per-workflow children cached for the hot path."""

    steps: _Family
    checkpoints: _Family
    checkpoint_seconds: _Family
    checkpoint_bytes: _Family
    takeovers: _Family
    size_warnings: _Family
    cache_hits: _Family
    cache_misses: _Family
    effects: _Family
    stream_checkpoints: _Family
    stream_lag: _Family

    def __init__(self, prometheus: bool = True, meter_provider: Any = None) -> None:
        stores: list[Any] = []
        self._join(_Prometheus(stores) if prometheus else None,
                   None if meter_provider is None else _otel_sink(meter_provider, stores),
                   stores)

    @classmethod
    def _joined(cls, prometheus: _Prometheus | None, otel: Any, stores: list[Any]) -> Metrics:
        joined = cls.__new__(cls)
        joined._join(prometheus, otel, stores)
        return joined

    def _join(self, prometheus: _Prometheus | None, otel: Any, stores: list[Any]) -> None:
        self.prometheus, self.otel, self._stores = prometheus, otel, stores
        self.registry: Any = None if prometheus is None else prometheus.registry
        sinks = [sink for sink in (prometheus, otel) if sink is not None]
        for attr, _name, _kind, _description, labels, _unit in _SPECS:
            setattr(self, attr, _Family(attr, labels, sinks))
        self._by_workflow: dict[str, WorkflowMetrics] = {}

    def for_workflow(self, workflow: str) -> WorkflowMetrics:
        found = self._by_workflow.get(workflow)
        if found is None:
            found = self._by_workflow[workflow] = WorkflowMetrics(self, workflow)
        return found

    def watch(self, store: Any) -> None:
        """Report ``store``'s runs, queue and waits at each scrape or collection."""
        if all(known is not store for known in self._stores):
            self._stores.append(store)

    def cache_lookup(self, kind: str, hit: bool) -> None:
        """A cached step (``kind="step"``) or ``ctx.cached`` call (``"call"``) looked up."""
        (self.cache_hits if hit else self.cache_misses).labels(kind).inc()

    def stream_checkpoint(self, stream: str, partition: int, lag: int | None) -> None:
        """A stream partition's checkpoint, and the records its source holds after it."""
        self.stream_checkpoints.labels(stream).inc()
        if lag is not None:
            self.stream_lag.labels(stream, str(partition)).set(lag)


def _otel_sink(provider: Any, stores: list[Any]) -> Any:
    from .otel_metrics import OtelMetrics

    return OtelMetrics(provider, stores, _SPECS, _BOUNDS)


class WorkflowMetrics:
    """One workflow's label children, looked up once (a labels() call costs a lock and a
    dictionary look-up; a step's budget for metrics is about a microsecond)."""

    __slots__ = ("checkpoint_bytes", "checkpoint_seconds", "errors", "metrics", "ok",
                 "saved", "workflow")

    def __init__(self, metrics: Metrics, workflow: str) -> None:
        self.metrics = metrics
        self.workflow = workflow
        self.ok = metrics.steps.labels(workflow, "ok")
        self.errors = metrics.steps.labels(workflow, "error")
        self.checkpoint_seconds = metrics.checkpoint_seconds.labels(workflow)
        self.checkpoint_bytes = metrics.checkpoint_bytes.labels(workflow)
        self.saved: dict[str, Any] = {}

    def effect(self, outcome: str) -> None:
        """A ``ctx.effect`` call: ``run``, ``replayed`` or ``repeated``."""
        self.metrics.effects.labels(self.workflow, outcome).inc()

    def saved_checkpoint(self, status: str, seconds: float, added: int | None) -> None:
        counter = self.saved.get(status)
        if counter is None:
            counter = self.saved[status] = self.metrics.checkpoints.labels(self.workflow,
                                                                           status)
        counter.inc()
        self.checkpoint_seconds.observe(seconds)
        if added is not None:
            self.checkpoint_bytes.observe(added)


class StoreGauges:
    """What the watched stores hold, summed over them: runs by (workflow, status), queued
    runs, the oldest queued run's age and the longest wait (seconds)."""

    __slots__ = ("oldest_queued", "oldest_waiting", "queued", "runs")

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], float] = {}
        self.queued = self.oldest_queued = self.oldest_waiting = 0.0


def read_stores(stores: list[Any]) -> tuple[StoreGauges, int]:
    """The gauges of ``stores`` and how many of them could not be read (a store down must
    not fail a scrape: it is logged and counted)."""
    gauges, failed = StoreGauges(), 0
    now = time.time()
    for store in list(stores):
        try:
            rows, oldest_queued, oldest_waiting = store._tx(_read_gauges)
        except Exception as exc:
            failed += 1
            log.warning("metrics: could not read %s: %s", getattr(store, "url", store), exc)
            continue
        for workflow, status, count in rows:
            key = (workflow or "", status)
            gauges.runs[key] = gauges.runs.get(key, 0.0) + float(count)
            if status == "queued":
                gauges.queued += float(count)
        if oldest_queued is not None:
            gauges.oldest_queued = max(gauges.oldest_queued, now - float(oldest_queued))
        if oldest_waiting is not None:
            gauges.oldest_waiting = max(gauges.oldest_waiting, now - float(oldest_waiting))
    return gauges, failed


class _StoreCollector:
    """Gauges read from the watched stores when scraped."""

    def __init__(self, prometheus: _Prometheus, stores: list[Any]) -> None:
        self.prometheus, self.stores = prometheus, stores

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only (auto_describe would read the store)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        gauges, failed = read_stores(self.stores)
        if failed:
            self.prometheus.scrape_errors.inc(failed)
        (runs_name, runs_doc), *ages = STORE_GAUGES
        runs = GaugeMetricFamily(runs_name, runs_doc, labels=["workflow", "status"])
        for (workflow, status), count in gauges.runs.items():
            runs.add_metric([workflow, status], count)
        yield runs
        for (name, doc), value in zip(ages, (gauges.queued, gauges.oldest_queued,
                                              gauges.oldest_waiting), strict=True):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            yield family


def _read_gauges(tx: Any) -> tuple[list[Any], Any, Any]:
    rows = tx.all("SELECT workflow, status, COUNT(*) FROM pitstop_runs "
                  "GROUP BY workflow, status")
    oldest_queued = tx.scalar("SELECT MIN(created_at) FROM pitstop_runs WHERE status = ?",
                              ("queued",))
    oldest_waiting = tx.scalar("SELECT MIN(updated_at) FROM pitstop_runs WHERE status = ?",
                               ("waiting",))
    return rows, oldest_queued, oldest_waiting


class _Current:
    metrics: Metrics | None = None  # what the runtime records to; None: off
    prometheus: _Prometheus | None = None
    otel: Any = None  # the OpenTelemetry sink (an OtelMetrics), or None
    otel_forced: bool | None = None  # enable_otel()/disable_otel(); None: on when the
    # application set a global meter provider
    provider: Any = None  # the meter provider ``otel`` records to (or last seen)
    stores: list[Any] = []


_current = _Current()


def _rejoin() -> None:
    prometheus, otel = _current.prometheus, _current.otel
    _current.metrics = None if prometheus is None and otel is None else Metrics._joined(
        prometheus, otel, _current.stores)


def enable(store: Any = None) -> Metrics:
    """Count what runs in this process do from now on, in Prometheus' format (and report
    ``store``'s runs, queue and waits when scraped). Needs the ``metrics`` extra
    (prometheus-client)."""
    if _current.prometheus is None:
        _current.prometheus = _Prometheus(_current.stores)
        _rejoin()
    if store is not None:
        watch(store)
    assert _current.metrics is not None
    return _current.metrics


def enable_otel(meter_provider: Any = None, *, store: Any = None) -> Metrics:
    """Record the same metrics through OpenTelemetry, to ``meter_provider`` (default: the
    global one), from now on; with ``store``, its runs, queue and waits are observed at each
    collection. Needs the ``otel`` extra and an SDK. Without this call, metrics go to the
    global meter provider once the application sets one (as traces do)."""
    from opentelemetry import metrics as api

    _current.otel_forced = True
    _use_otel(meter_provider or api.get_meter_provider())
    if store is not None:
        watch(store)
    assert _current.metrics is not None
    return _current.metrics


def disable_otel() -> None:
    """Record nothing through OpenTelemetry, even to a global meter provider."""
    _current.otel_forced, _current.otel, _current.provider = False, None, None
    _rejoin()


def watch(store: Any) -> None:
    """Report ``store``'s runs, queue depth and oldest queued and waiting ages (read at
    each scrape or collection: one grouped query and two MIN queries)."""
    if all(known is not store for known in _current.stores):
        _current.stores.append(store)


def _use_otel(provider: Any) -> None:
    _current.provider = provider
    _current.otel = _otel_sink(provider, _current.stores)
    _rejoin()


def current() -> Metrics | None:
    """The metrics being recorded, or None (off: the runtime counts nothing). Looks for an
    application's meter provider only when ``opentelemetry.metrics`` is imported."""
    if _current.otel_forced is None:
        api = sys.modules.get("opentelemetry.metrics")
        if api is not None:
            provider = api.get_meter_provider()
            if provider is not _current.provider:
                if _records(api, provider):
                    _use_otel(provider)
                elif _current.otel is not None:
                    _current.otel, _current.provider = None, provider
                    _rejoin()
                else:
                    _current.provider = provider
    return _current.metrics


def _records(api: Any, provider: Any) -> bool:
    """Whether ``provider`` records: not the API's default (a proxy until one is set) nor
    its no-op one."""
    return not (isinstance(provider, api.NoOpMeterProvider)
                or type(provider).__name__ == "_ProxyMeterProvider")


def registry() -> Any:
    """The registry pitstop's metrics live in (enables them)."""
    return enable().registry


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus' text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry()), CONTENT_TYPE_LATEST


def serve(port: int, *, address: str = "0.0.0.0", store: Any = None) -> Any:
    """Serve ``/metrics`` on ``port`` (a thread of its own); OSError if the port is taken."""
    from prometheus_client import start_http_server

    metrics = enable(store)
    server, _thread = start_http_server(port, addr=address, registry=metrics.registry)
    return server


__all__ = ["Metrics", "current", "disable_otel", "enable", "enable_otel", "exposition",
           "registry", "serve", "watch"]
