"""Metrics, in Prometheus' format and through OpenTelemetry: what runs do (counted as they
do it) and where the store stands (read when scraped or collected).

Prometheus: turned on by :func:`enable` (``pitstop worker --metrics-port N`` and ``pitstop
ui`` do it); metrics live in their own registry (:func:`registry`), exposed by :func:`serve`
or :func:`exposition`. OpenTelemetry: on once the application sets a global meter provider
(as traces are), or after :func:`enable_otel`; the same instruments, names and labels (as
attributes) on a meter named ``pitstop``. Until one of them is on nothing here imports
either package, and each step and save checks one attribute. Once on, the runtime counts in
plain Python (:class:`_Counts`: a step and a save append to their workflow's lists, counted
and bucketed when read; other counts go to lists each thread owns; no lock on either path)
and each sink reads the counts when scraped or collected, so a step calls neither library
(but for OpenTelemetry's histograms, which have no asynchronous form). Labels are bounded:
workflow names, statuses, step sources; never a run id.

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

import logging
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

log = logging.getLogger("pitstop.metrics")

# Seconds a save takes: from a tiny SQLite step (~50 µs) to a large state on a remote server.
_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BYTES_BUCKETS = tuple(float(4 ** n) for n in range(3, 15))  # 64 B .. 256 MiB


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


# Observations a workflow's pending list holds before the thread adding one folds them into
# the tally: bounds the memory of a process nobody scrapes (a float or an int and a list
# item, ~40 bytes an observation). A fold sorts each histogram's batch (~270 instructions an
# observation at 512) instead of a bisection per save (~900-1,400).
_FOLD_AT = 512


class _Tally:
    """Numbers that many threads add to without a lock: each thread adds to a list of its own
    (a slot per number), and a reader sums the lists.

    A count pays a ``threading.local`` look-up and a list item's ``+=`` (~0.4 µs in place): no
    lock, no call into prometheus-client (whose counter, its checks and its lock, cost ~1 µs)
    and no increment lost to a race, since only the thread that owns a list writes to it.
    (Steps and saves, the most frequent, append to lists instead: :class:`_Pending`.) Readers
    (a scrape, a collection) hold ``lock``, as do slot allocation and thread registration. A
    thread's list outlives the thread: when a new thread registers, the lists of threads
    that ended are added into ``retired`` (so threads started and ended by ``ctx.map`` do
    not make the tally grow)."""

    __slots__ = ("local", "lock", "retired", "size", "threads")

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.size = 0  # slots allocated
        self.threads: list[tuple[threading.Thread, list[float]]] = []
        self.retired: list[float] = []

    def allocate(self, count: int) -> int:
        """The first of ``count`` new slots."""
        with self.lock:
            first = self.size
            self.size += count
            return first

    def cells(self) -> list[float]:
        """This thread's list, with every slot allocated so far."""
        try:
            cells: list[float] = self.local.cells
        except AttributeError:
            cells = self._register()
        missing = self.size - len(cells)
        if missing > 0:
            cells.extend([0] * missing)  # only this thread changes its list's length
        return cells

    def _register(self) -> list[float]:
        cells: list[float] = []
        with self.lock:
            live = []
            for thread, counted in self.threads:
                if thread.is_alive():
                    live.append((thread, counted))
                else:  # it ended: nothing writes to its list any more
                    _add_into(self.retired, counted)
            live.append((threading.current_thread(), cells))
            self.threads = live
        self.local.cells = cells
        return cells

    def read(self) -> list[float]:
        """Every slot summed over the threads (each slot as it was when its list was read)."""
        with self.lock:
            totals: list[float] = [0] * self.size  # counts stay int, sums become float
            _add_into(totals, self.retired)
            for _thread, counted in self.threads:
                _add_into(totals, list(counted))
        return totals


def _add_into(totals: list[float], values: list[float]) -> None:
    if len(totals) < len(values):
        totals.extend([0] * (len(values) - len(totals)))
    for slot, value in enumerate(values):
        totals[slot] += value


class _Counter:
    """A counter's child: one slot of the tally."""

    __slots__ = ("created", "local", "slot", "tally")

    def __init__(self, tally: _Tally) -> None:
        self.tally, self.local = tally, tally.local
        self.slot = tally.allocate(1)
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        try:
            self.local.cells[self.slot] += amount
        except (AttributeError, IndexError):  # a thread's first count, or a new slot
            self.tally.cells()[self.slot] += amount


class _Histogram:
    """A histogram's child: a slot per bucket (the last above every bound: +Inf only), then
    one for the sum of the values observed."""

    __slots__ = ("bounds", "first", "tally")

    def __init__(self, tally: _Tally, bounds: tuple[float, ...]) -> None:
        self.tally, self.bounds = tally, bounds
        self.first = tally.allocate(len(bounds) + 2)

    def observe(self, value: float) -> None:
        cells = self.tally.cells()
        cells[self.first + bisect_left(self.bounds, value)] += 1
        cells[self.first + len(self.bounds) + 1] += value

    def read(self, totals: list[float]) -> tuple[list[float], float]:
        """(bucket counts, sum) in ``totals`` (a :meth:`_Tally.read`)."""
        end = self.first + len(self.bounds) + 1
        return totals[self.first:end], totals[end]


class _Gauge:
    """A gauge's child: the value last set (one store: no lock)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value


class _Pending:
    """One workflow's steps and saves not counted yet: a step appends a mark, a save its
    duration (to its status's list) and the bytes it added, each one ``list.append`` (a single
    operation under the GIL: no lock, nothing lost between threads). A fold counts them into
    the tally, histograms bucketed a batch at a time (sorted, one bisection a bound): at each
    scrape or collection, and by the thread whose append fills a list to ``_FOLD_AT``.

    A fold, holding ``fold_lock``, copies a list's first n items and then deletes those n;
    since only folds delete (one at a time) and appends go to the end, an observation
    appended meanwhile stays in the list for the next fold: never lost, never counted twice.
    A list is never swapped for a new one, as a thread that had loaded the old list would
    append to a list nobody reads any more."""

    __slots__ = ("added", "bytes_at", "counts", "durations", "ok", "saved", "seconds_at",
                 "steps", "steps_slot", "workflow")

    def __init__(self, counts: _Counts, workflow: str) -> None:
        self.counts, self.workflow = counts, workflow
        self.steps: list[bool] = []  # a mark per step that ended well
        self.ok = _Marks(self)
        self.steps_slot: int = counts.child("steps", (workflow, "ok")).slot
        self.seconds_at: int = counts.child("checkpoint_seconds", (workflow,)).first
        self.bytes_at: int = counts.child("checkpoint_bytes", (workflow,)).first
        self.durations: dict[str, list[float]] = {}  # by status: its saves' seconds
        self.saved: dict[str, int] = {}  # by status: its checkpoints counter's slot
        self.added: list[int] = []  # bytes each save added (none when it wrote in background)

    def status(self, status: str) -> list[float]:
        """The list a save of ``status`` appends its duration to (its counter made)."""
        with self.counts.fold_lock:  # a fold iterates over the statuses
            found = self.durations.get(status)
            if found is None:
                self.saved[status] = self.counts.child("checkpoints",
                                                       (self.workflow, status)).slot
                found = self.durations[status] = []
            return found

    def fold(self) -> None:
        with self.counts.fold_lock:
            self.fold_held()

    def fold_held(self) -> None:
        """Count what is pending into this thread's list of the tally (``fold_lock`` held)."""
        cells = self.counts.tally.cells()
        steps = len(self.steps)
        del self.steps[:steps]  # the marks are all alike: only how many
        cells[self.steps_slot] += steps
        durations: list[float] = []
        for status, pending in self.durations.items():
            taken = _take(pending)
            cells[self.saved[status]] += len(taken)
            durations += taken
        _bucket(cells, self.seconds_at, _SECONDS_BUCKETS, durations)
        _bucket(cells, self.bytes_at, _BYTES_BUCKETS, _take(self.added))


class _Marks:
    """A workflow's count of steps that ended well (``inc()``, as a counter's child): a mark
    appended to its :class:`_Pending`, counted at the next fold."""

    __slots__ = ("pending", "steps")

    def __init__(self, pending: _Pending) -> None:
        self.pending, self.steps = pending, pending.steps

    def inc(self) -> None:
        steps = self.steps
        steps.append(True)
        if len(steps) >= _FOLD_AT:
            self.pending.fold()


def _take(pending: list[Any]) -> list[Any]:
    """The items of ``pending``, removed from it (items appended meanwhile stay)."""
    taken = pending[:len(pending)]
    del pending[:len(taken)]
    return taken


def _bucket(cells: list[float], first: int, bounds: tuple[float, ...],
            values: list[Any]) -> None:
    """Adds ``values`` to a histogram's slots from ``first`` (see :class:`_Histogram`): each
    to the first bucket whose bound is >= it (where ``bisect_left(bounds, value)`` puts it),
    and to the sum."""
    if not values:
        return
    values.sort()
    below = 0
    for index, bound in enumerate(bounds):
        upto = bisect_right(values, bound, below)
        cells[first + index] += upto - below
        below = upto
    cells[first + len(bounds)] += len(values) - below
    cells[first + len(bounds) + 1] += sum(values)


class _Counts:
    """What the runtime counts, in plain Python: per instrument, its children by label
    values, and each workflow's observations not folded yet (:class:`_Pending`). Prometheus'
    collector and OpenTelemetry's callbacks read them when scraped or collected; nothing on
    a step's path calls either library."""

    def __init__(self) -> None:
        self.tally = _Tally()
        self.lock = threading.Lock()
        # Held by each fold, and by a read while it folds and sums (so a read sees every fold
        # whole); the step's path never takes it. Taken before ``lock`` and the tally's.
        self.fold_lock = threading.Lock()
        self.pending: dict[str, _Pending] = {}
        self.children: dict[str, dict[tuple[str, ...], Any]] = {attr: {} for attr, *_ in _SPECS}
        self.kinds = {attr: kind for attr, _name, kind, *_ in _SPECS}

    def child(self, attr: str, values: tuple[str, ...]) -> Any:
        children = self.children[attr]
        found = children.get(values)
        if found is None:
            with self.lock:
                found = children.get(values)
                if found is None:
                    kind = self.kinds[attr]
                    found = _Counter(self.tally) if kind == "counter" else \
                        _Histogram(self.tally, _BOUNDS[attr]) if kind == "histogram" else _Gauge()
                    children[values] = found
        return found

    def children_of(self, attr: str) -> list[tuple[tuple[str, ...], Any]]:
        """An instrument's children by label values (a copy: threads add more)."""
        with self.lock:
            return list(self.children[attr].items())

    def pending_of(self, workflow: str) -> _Pending:
        """``workflow``'s pending observations (one for every :class:`Metrics` joined)."""
        with self.fold_lock:
            found = self.pending.get(workflow)
            if found is None:
                found = self.pending[workflow] = _Pending(self, workflow)
            return found

    def totals(self) -> list[float]:
        """Every slot summed over the threads, everything pending folded in first."""
        return self.read()[0]

    def read(self) -> tuple[list[float], dict[str, list[tuple[tuple[str, ...], Any]]]]:
        """Per instrument, its children; and the totals, everything pending folded in. One
        fold after another: no save's fold is seen in part, nor a checkpoint status counted
        in a histogram without its counter. The totals are read after the children, so every
        child's slot is in them."""
        with self.fold_lock:
            for pending in self.pending.values():
                pending.fold_held()
            with self.lock:
                children = {attr: list(found.items()) for attr, found in self.children.items()}
            return self.tally.read(), children


def _since(totals: list[float], base: list[float]) -> list[float]:
    """``totals`` less what was counted before ``base`` was read (a sink reports what was
    counted since it was turned on)."""
    return [total - (base[slot] if slot < len(base) else 0) for slot, total in enumerate(totals)]


class _Prometheus:
    """A prometheus-client registry of its own, whose collector reads :class:`_Counts` at
    each scrape."""

    def __init__(self, counts: _Counts, stores: list[Any]) -> None:
        from prometheus_client import CollectorRegistry, Counter

        self.registry = r = CollectorRegistry(auto_describe=True)
        r.register(_RuntimeCollector(counts))
        self.scrape_errors = Counter(*SCRAPE_ERRORS, registry=r)
        r.register(_StoreCollector(self, stores))


class _RuntimeCollector:
    """The runtime's instruments as Prometheus metric families, built from the counts when
    scraped (what was counted since this collector was made)."""

    def __init__(self, counts: _Counts) -> None:
        self.counts = counts
        self.base = counts.totals()

    def describe(self) -> list[Any]:
        return list(self.collect())

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        totals, children = self.counts.read()
        totals = _since(totals, self.base)
        for attr, name, kind, description, labels, _unit in _SPECS:
            family: Any
            if kind == "counter":
                family = CounterMetricFamily(name, description, labels=labels)
                for values, counter in children[attr]:
                    family.add_metric(values, totals[counter.slot], created=counter.created)
            elif kind == "histogram":
                family = HistogramMetricFamily(name, description, labels=labels)
                bounds = [*map(repr, _BOUNDS[attr]), "+Inf"]
                for values, histogram in children[attr]:
                    counts, total = histogram.read(totals)
                    family.add_metric(values, list(zip(bounds, accumulate(counts),
                                                       strict=True)), total)
            else:
                family = GaugeMetricFamily(name, description, labels=labels)
                for values, gauge in children[attr]:
                    family.add_metric(values, gauge.value)
            yield family


class _Both:
    """A histogram's child and its OpenTelemetry instrument (OpenTelemetry on): a histogram
    has no asynchronous form there, so each value is recorded to the SDK as well."""

    __slots__ = ("counted", "recorded")

    def __init__(self, counted: _Histogram, recorded: Any) -> None:
        self.counted, self.recorded = counted, recorded

    def observe(self, value: float) -> None:
        self.counted.observe(value)
        self.recorded.observe(value)


class _Family:
    """One instrument: ``labels(*values)`` gives the child to ``inc()``, ``observe()`` or
    ``set()`` (cached per label values: a dictionary look-up)."""

    __slots__ = ("attr", "children", "counts", "labelnames", "otel")

    def __init__(self, attr: str, labelnames: tuple[str, ...], counts: _Counts,
                 otel: Any) -> None:
        self.attr, self.labelnames, self.counts = attr, labelnames, counts
        self.otel = otel if otel is not None and attr in _BOUNDS else None
        self.children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            child = self.counts.child(self.attr, values)
            if self.otel is not None:
                child = _Both(child, self.otel.child(self.attr, self.labelnames, values))
            self.children[values] = child  # two threads may both make it: the same child
        return child


class Metrics:
    """What the runtime records to: counts kept in plain Python (:class:`_Counts`), exposed
    to Prometheus (a registry of its own), to OpenTelemetry (a meter of the given provider),
    or both; per-workflow children cached for the hot path."""

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
        counts = _Counts()
        self._join(counts, _Prometheus(counts, stores) if prometheus else None,
                   None if meter_provider is None else _otel_sink(meter_provider, counts, stores),
                   stores)

    @classmethod
    def _joined(cls, counts: _Counts, prometheus: _Prometheus | None, otel: Any,
                stores: list[Any]) -> Metrics:
        joined = cls.__new__(cls)
        joined._join(counts, prometheus, otel, stores)
        return joined

    def _join(self, counts: _Counts, prometheus: _Prometheus | None, otel: Any,
              stores: list[Any]) -> None:
        self.counts, self.prometheus, self.otel, self._stores = counts, prometheus, otel, stores
        self.registry: Any = None if prometheus is None else prometheus.registry
        for attr, _name, _kind, _description, labels, _unit in _SPECS:
            setattr(self, attr, _Family(attr, labels, counts, otel))
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


def _otel_sink(provider: Any, counts: _Counts, stores: list[Any]) -> Any:
    from .otel_metrics import OtelMetrics

    return OtelMetrics(provider, counts, stores, _SPECS, _BOUNDS)


class WorkflowMetrics:
    """One workflow's children, looked up once. A step appends a mark and a save its
    duration and its bytes to lists (:class:`_Pending`), counted and bucketed when read."""

    __slots__ = ("added", "durations", "errors", "metrics", "ok", "otel_bytes", "otel_seconds",
                 "pending", "workflow")

    def __init__(self, metrics: Metrics, workflow: str) -> None:
        self.metrics = metrics
        self.workflow = workflow
        counts = metrics.counts
        self.pending = counts.pending_of(workflow)
        self.ok: _Marks = self.pending.ok
        self.errors: _Counter = counts.child("steps", (workflow, "error"))
        self.durations, self.added = self.pending.durations, self.pending.added
        # With OpenTelemetry on, its histograms record each value too (no asynchronous form).
        seconds = metrics.checkpoint_seconds.labels(workflow)
        self.otel_seconds: Any = seconds.recorded if isinstance(seconds, _Both) else None
        added = metrics.checkpoint_bytes.labels(workflow)
        self.otel_bytes: Any = added.recorded if isinstance(added, _Both) else None

    def effect(self, outcome: str) -> None:
        """A ``ctx.effect`` call: ``run``, ``replayed`` or ``repeated``."""
        self.metrics.effects.labels(self.workflow, outcome).inc()

    def saved_checkpoint(self, status: str, seconds: float, added: int | None) -> None:
        durations = self.durations.get(status)
        if durations is None:
            durations = self.pending.status(status)
        durations.append(seconds)
        if added is not None:
            self.added.append(added)
        if len(durations) >= _FOLD_AT:  # the bytes' list is at most as long as all of them
            self.pending.fold()
        if self.otel_seconds is not None:
            self.otel_seconds.observe(seconds)
            if added is not None:
                self.otel_bytes.observe(added)


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
    counts: _Counts | None = None  # the process's counts, shared by the sinks
    prometheus: _Prometheus | None = None
    otel: Any = None  # the OpenTelemetry sink (an OtelMetrics), or None
    otel_forced: bool | None = None  # enable_otel()/disable_otel(); None: on when the
    # application set a global meter provider
    provider: Any = None  # the meter provider ``otel`` records to (or last seen)
    stores: list[Any] = []


_current = _Current()


def _counts() -> _Counts:
    if _current.counts is None:
        _current.counts = _Counts()
    return _current.counts


def _rejoin() -> None:
    prometheus, otel = _current.prometheus, _current.otel
    _current.metrics = None if prometheus is None and otel is None else Metrics._joined(
        _counts(), prometheus, otel, _current.stores)


def enable(store: Any = None) -> Metrics:
    """Count what runs in this process do from now on, in Prometheus' format (and report
    ``store``'s runs, queue and waits when scraped). Needs the ``metrics`` extra
    (prometheus-client)."""
    if _current.prometheus is None:
        _current.prometheus = _Prometheus(_counts(), _current.stores)
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
    _current.otel = _otel_sink(provider, _counts(), _current.stores)
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
