"""Prometheus metrics: what runs do (counted as they do it) and where the store stands (read
when scraped).

Turned on by :func:`enable` (``pitstop worker --metrics-port N`` and ``pitstop ui`` do it);
until then nothing here is imported by the runtime, and each step and save checks one
attribute. Metrics live in their own registry (:func:`registry`), exposed by
:func:`serve` or :func:`exposition`. Labels are bounded: workflow names, statuses, step
sources; never a run id.

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

Read from the store at each scrape (one grouped query and two MIN queries):

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


class Metrics:
    """The metric objects, and per-workflow children cached for the hot path."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.steps = Counter("pitstop_steps", "Steps executed", ["workflow", "outcome"],
                             registry=r)
        self.checkpoints = Counter("pitstop_checkpoints", "Checkpoints written",
                                   ["workflow", "status"], registry=r)
        self.checkpoint_seconds = _HistogramCollector(
            "pitstop_checkpoint_seconds", "Time a checkpoint took (serialise and write)",
            _SECONDS_BUCKETS)
        self.checkpoint_bytes = _HistogramCollector(
            "pitstop_checkpoint_bytes", "Bytes a checkpoint added to the store", _BYTES_BUCKETS)
        r.register(self.checkpoint_seconds)
        r.register(self.checkpoint_bytes)
        self.takeovers = Counter("pitstop_lease_takeovers",
                                 "Runs taken over from an owner that died", ["workflow"],
                                 registry=r)
        self.size_warnings = Counter("pitstop_size_warnings",
                                     "Checkpoints or fields past their size_warning",
                                     ["workflow", "kind"], registry=r)
        self.cache_hits = Counter("pitstop_cache_hits",
                                  "Steps (kind=step) and ctx.cached calls (kind=call) served "
                                  "from the cache", ["kind"], registry=r)
        self.cache_misses = Counter("pitstop_cache_misses",
                                    "Cached steps and calls computed here (nothing cached)",
                                    ["kind"], registry=r)
        self.effects = Counter("pitstop_effects",
                               "ctx.effect calls: run (fn called), replayed (the recorded "
                               "result returned), repeated (fn ran, but another execution "
                               "had recorded the effect first)", ["workflow", "outcome"],
                               registry=r)
        self.stream_checkpoints = Counter("pitstop_stream_checkpoints",
                                          "Stream partition checkpoints written", ["stream"],
                                          registry=r)
        self.stream_lag = Gauge("pitstop_stream_lag",
                                "Records in a partition's source after its checkpoint",
                                ["stream", "partition"], registry=r)
        self.scrape_errors = Counter("pitstop_scrape_errors",
                                     "Scrapes that could not read the store", registry=r)
        self._stores: list[Any] = []
        self._by_workflow: dict[str, WorkflowMetrics] = {}
        r.register(_StoreCollector(self))

    def for_workflow(self, workflow: str) -> WorkflowMetrics:
        found = self._by_workflow.get(workflow)
        if found is None:
            found = self._by_workflow[workflow] = WorkflowMetrics(self, workflow)
        return found

    def watch(self, store: Any) -> None:
        """Report ``store``'s runs, queue and waits at each scrape."""
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


class _StoreCollector:
    """Gauges read from the watched stores when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only (auto_describe would read the store)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        runs = GaugeMetricFamily("pitstop_runs", "Runs by workflow and status",
                                 labels=["workflow", "status"])
        depth = GaugeMetricFamily("pitstop_queue_depth", "Queued runs")
        queued = GaugeMetricFamily("pitstop_oldest_queued_seconds",
                                   "Age of the oldest queued run")
        waiting = GaugeMetricFamily("pitstop_oldest_waiting_seconds",
                                    "How long the longest-waiting run has waited")
        totals = {"queued": 0.0, "queued_age": 0.0, "waiting_age": 0.0}
        now = time.time()
        for store in list(self.metrics._stores):
            try:
                rows, oldest_queued, oldest_waiting = store._tx(_read_gauges)
            except Exception as exc:  # a store down must not fail the scrape
                self.metrics.scrape_errors.inc()
                log.warning("metrics: could not read %s: %s", getattr(store, "url", store), exc)
                continue
            for workflow, status, count in rows:
                runs.add_metric([workflow or "", status], float(count))
                if status == "queued":
                    totals["queued"] += float(count)
            if oldest_queued is not None:
                totals["queued_age"] = max(totals["queued_age"], now - float(oldest_queued))
            if oldest_waiting is not None:
                totals["waiting_age"] = max(totals["waiting_age"], now - float(oldest_waiting))
        depth.add_metric([], totals["queued"])
        queued.add_metric([], totals["queued_age"])
        waiting.add_metric([], totals["waiting_age"])
        yield from (runs, depth, queued, waiting)


def _read_gauges(tx: Any) -> tuple[list[Any], Any, Any]:
    rows = tx.all("SELECT workflow, status, COUNT(*) FROM pitstop_runs "
                  "GROUP BY workflow, status")
    oldest_queued = tx.scalar("SELECT MIN(created_at) FROM pitstop_runs WHERE status = ?",
                              ("queued",))
    oldest_waiting = tx.scalar("SELECT MIN(updated_at) FROM pitstop_runs WHERE status = ?",
                               ("waiting",))
    return rows, oldest_queued, oldest_waiting


class _Current:
    metrics: Metrics | None = None


_current = _Current()


def enable(store: Any = None) -> Metrics:
    """Count what runs in this process do from now on (and report ``store``'s runs, queue
    and waits when scraped). Needs the ``metrics`` extra (prometheus-client)."""
    if _current.metrics is None:
        _current.metrics = Metrics()
    if store is not None:
        _current.metrics.watch(store)
    return _current.metrics


def current() -> Metrics | None:
    """The metrics being counted, or None (off: the runtime counts nothing)."""
    return _current.metrics


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


__all__ = ["Metrics", "current", "enable", "exposition", "registry", "serve"]
