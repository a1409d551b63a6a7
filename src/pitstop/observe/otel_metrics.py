"""pitstop's metrics through OpenTelemetry: the instruments of :mod:`pitstop.observe.metrics`
(same names, same attributes as its Prometheus labels) on a meter of the application's
provider. Imported only when OpenTelemetry metrics are on (``opentelemetry-api``, extra
``otel``); the SDK the application set up aggregates and exports them.

Counters are observable: each collection reads what the runtime counted in plain Python
(:class:`~pitstop.observe.metrics._Counts`, since this sink was made), so a step makes no
call into the SDK for them. Histograms have no asynchronous form in OpenTelemetry: a save
records its two values to the SDK. The stream lag (a gauge set at each checkpoint) and the
store's gauges (runs, queue, oldest ages, read from the watched stores) are observed at each
collection, the store read once per collection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .metrics import SCRAPE_ERRORS, STORE_GAUGES, _since, read_stores
from .tracing import _release

if TYPE_CHECKING:
    from .metrics import _Counts

# A store read serves every store gauge of one collection (they are observed one after the
# other); a reader collecting more often than this reads again.
_READ_FOR = 1.0


class _Record:
    """A histogram's child: ``observe`` records a value with its attributes."""

    __slots__ = ("attributes", "instrument")

    def __init__(self, instrument: Any, attributes: dict[str, str]) -> None:
        self.instrument, self.attributes = instrument, attributes

    def observe(self, value: float) -> None:
        self.instrument.record(value, self.attributes)


class OtelMetrics:
    """The instruments on a meter named ``pitstop``."""

    def __init__(self, provider: Any, counts: _Counts, stores: list[Any],
                 specs: Iterable[tuple[str, str, str, str, tuple[str, ...], str]],
                 bounds: dict[str, tuple[float, ...]]) -> None:
        from opentelemetry.metrics import Observation

        self._observation = Observation
        self.counts = counts
        self.base = counts.totals()  # what was counted before: not this sink's
        meter = provider.get_meter("pitstop", _release())
        self.instruments: dict[str, Any] = {}
        for attr, name, kind, description, labels, unit in specs:
            if kind == "counter":
                meter.create_observable_counter(name, [self._counter(attr, labels)], unit=unit,
                                                description=description)
            elif kind == "histogram":
                self.instruments[attr] = _histogram(meter, name, unit, description,
                                                    bounds[attr])
            else:
                meter.create_observable_gauge(name, [self._gauge(attr, labels)], unit=unit,
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
        """A histogram's child: records each value with its attributes."""
        return _Record(self.instruments[attr], dict(zip(labels, values, strict=True)))

    def _counter(self, attr: str, labels: tuple[str, ...]) -> Any:
        def observe(options: Any) -> list[Any]:
            totals, children = self.counts.read()
            totals = _since(totals, self.base)
            # A child never added to is left out, as a synchronous counter would be.
            return [self._observation(totals[counter.slot],
                                      dict(zip(labels, values, strict=True)))
                    for values, counter in children[attr] if totals[counter.slot]]

        return observe

    def _gauge(self, attr: str, labels: tuple[str, ...]) -> Any:
        def observe(options: Any) -> list[Any]:
            return [self._observation(gauge.value, dict(zip(labels, values, strict=True)))
                    for values, gauge in self.counts.children_of(attr)]

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
