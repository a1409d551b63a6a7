"""pitstop's metrics through OpenTelemetry: the instruments of :mod:`pitstop.observe.metrics`
(same names, same attributes as its Prometheus labels) on a meter of the application's
provider. Imported only when OpenTelemetry metrics are on (``opentelemetry-api``, extra
``otel``); the SDK the application set up aggregates and exports them.

Counters and histograms are recorded as the runtime counts; the stream lag (a gauge set at
each checkpoint) and the store's gauges (runs, queue, oldest ages, read from the watched
stores) are observed at each collection, the store read once per collection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from .metrics import SCRAPE_ERRORS, STORE_GAUGES, read_stores
from .tracing import _release

# A store read serves every store gauge of one collection (they are observed one after the
# other); a reader collecting more often than this reads again.
_READ_FOR = 1.0


class _Add:
    """A counter's child: ``inc`` adds to the counter with its attributes."""

    __slots__ = ("attributes", "instrument")

    def __init__(self, instrument: Any, attributes: dict[str, str]) -> None:
        self.instrument, self.attributes = instrument, attributes

    def inc(self, amount: float = 1) -> None:
        self.instrument.add(amount, self.attributes)


class _Record:
    """A histogram's child: ``observe`` records a value with its attributes."""

    __slots__ = ("attributes", "instrument")

    def __init__(self, instrument: Any, attributes: dict[str, str]) -> None:
        self.instrument, self.attributes = instrument, attributes

    def observe(self, value: float) -> None:
        self.instrument.record(value, self.attributes)


class _Last:
    """A gauge's child: ``set`` keeps the value, which the gauge's callback observes."""

    __slots__ = ("attributes", "values")

    def __init__(self, values: dict[tuple[str, ...], Any], attributes: dict[str, str]) -> None:
        self.values, self.attributes = values, attributes

    def set(self, value: float) -> None:
        self.values[tuple(self.attributes.values())] = (self.attributes, value)


class OtelMetrics:
    """The instruments on a meter named ``pitstop``."""

    def __init__(self, provider: Any, stores: list[Any],
                 specs: Iterable[tuple[str, str, str, str, tuple[str, ...], str]],
                 bounds: dict[str, tuple[float, ...]]) -> None:
        from opentelemetry.metrics import Observation

        self._observation = Observation
        meter = provider.get_meter("pitstop", _release())
        self.instruments: dict[str, Any] = {}
        self.histograms: set[str] = set()
        self.gauges: dict[str, dict[tuple[str, ...], Any]] = {}
        for attr, name, kind, description, _labels, unit in specs:
            if kind == "counter":
                self.instruments[attr] = meter.create_counter(name, unit=unit,
                                                              description=description)
            elif kind == "histogram":
                self.instruments[attr] = _histogram(meter, name, unit, description,
                                                    bounds[attr])
                self.histograms.add(attr)
            else:
                values = self.gauges[attr] = {}
                meter.create_observable_gauge(name, [self._observer(values)], unit=unit,
                                              description=description)
        self.stores = stores
        self.failed = 0  # store reads that failed, all collections
        self._read: tuple[float, Any] | None = None
        self._lock = threading.Lock()
        (runs_name, runs_doc), (depth_name, depth_doc), (queued_name, queued_doc), \
            (waiting_name, waiting_doc) = STORE_GAUGES
        meter.create_observable_gauge(runs_name, [self._runs], unit="{run}",
                                      description=runs_doc)
        meter.create_observable_gauge(depth_name, [self._age("queued")], unit="{run}",
                                      description=depth_doc)
        meter.create_observable_gauge(queued_name, [self._age("oldest_queued")], unit="s",
                                      description=queued_doc)
        meter.create_observable_gauge(waiting_name, [self._age("oldest_waiting")], unit="s",
                                      description=waiting_doc)
        meter.create_observable_counter(SCRAPE_ERRORS[0], [self._failures], unit="{read}",
                                        description=SCRAPE_ERRORS[1])

    def child(self, attr: str, labels: tuple[str, ...], values: tuple[str, ...]) -> Any:
        attributes = dict(zip(labels, values, strict=True))
        gauge = self.gauges.get(attr)
        if gauge is not None:
            return _Last(gauge, attributes)
        kind = _Record if attr in self.histograms else _Add
        return kind(self.instruments[attr], attributes)

    def _observer(self, values: dict[tuple[str, ...], Any]) -> Any:
        def observe(options: Any) -> list[Any]:
            return [self._observation(value, attributes)
                    for attributes, value in list(values.values())]

        return observe

    def _gauges(self) -> Any:
        """The watched stores' gauges: read at most once per collection (``_READ_FOR``)."""
        with self._lock:
            now = time.monotonic()
            if self._read is None or now - self._read[0] > _READ_FOR:
                gauges, failed = read_stores(self.stores)
                self.failed += failed
                self._read = (now, gauges)
            return self._read[1]

    def _runs(self, options: Any) -> list[Any]:
        if not self.stores:
            return []
        return [self._observation(count, {"workflow": workflow, "status": status})
                for (workflow, status), count in self._gauges().runs.items()]

    def _age(self, which: str) -> Any:
        def observe(options: Any) -> list[Any]:
            if not self.stores:
                return []
            return [self._observation(getattr(self._gauges(), which))]

        return observe

    def _failures(self, options: Any) -> list[Any]:
        return [self._observation(self.failed)] if self.stores else []


def _histogram(meter: Any, name: str, unit: str, description: str,
               bounds: tuple[float, ...]) -> Any:
    """A histogram with Prometheus' buckets (the SDK's defaults are for milliseconds); an
    API before 1.23 takes no bucket advice: the SDK's defaults, or the application's view."""
    try:
        return meter.create_histogram(name, unit=unit, description=description,
                                      explicit_bucket_boundaries_advisory=list(bounds))
    except TypeError:  # pragma: no cover - opentelemetry-api < 1.23
        return meter.create_histogram(name, unit=unit, description=description)
