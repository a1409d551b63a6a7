"""OpenTelemetry spans for runs, steps, checkpoints, effects, waits, children and map items.

pitstop never imports OpenTelemetry itself: tracing is on when the application uses it
(imported ``opentelemetry.trace`` and set a tracer provider: pitstop's spans join its
traces), or after :func:`enable`; :func:`disable` turns it off. Without the package nothing
here is imported (a test checks it in a fresh interpreter), and a run attempt costs one
dictionary look-up; with tracing off each step and save checks one attribute.

Spans (kind INTERNAL, names of bounded cardinality; attributes below):

* ``pitstop.run {workflow}``: one attempt at a run in one process (from a checkpoint until
  it completes, waits, fails or is handed back); links to the trace that enqueued it and to
  the traces that sent the inputs it consumed (their W3C ``traceparent`` is kept in the
  run's metadata: ``trace.enqueued``, ``trace.inputs``).
* ``pitstop.step {step}``: a step's execution (user spans inside it nest under it); an
  exception marks it ERROR with ``error.type`` and an exception event.
* ``pitstop.checkpoint.save`` and ``pitstop.checkpoint.restore``: ``db.system.name``,
  ``db.operation.name`` (OpenTelemetry's database conventions), checkpoint id, step,
  status and bytes written or read.
* ``pitstop.effect``, ``pitstop.wait``, ``pitstop.children``, ``pitstop.map.item``.

Every span carries ``pitstop.run.id``; step spans ``pitstop.step.name``,
``pitstop.step.position`` and ``pitstop.step.attempt``. An exporter's failure stays in the
exporter: pitstop only starts and ends spans, which a batch span processor queues (bounded)
and exports on its own thread.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class _Settings:
    forced: bool | None = None  # enable()/disable(); None: on when the application uses OTel
    tracer: Any = None
    provider: Any = None  # the provider ``tracer`` came from


_settings = _Settings()

TRACE_KEY = "trace"
"""The run metadata key holding trace contexts: ``{"enqueued": traceparent, "inputs":
{name: traceparent}}``."""


def enable(tracer_provider: Any = None) -> None:
    """Emit spans, through ``tracer_provider`` (default: the global one). Imports
    ``opentelemetry.trace``: needs the ``otel`` extra."""
    from opentelemetry import trace

    _settings.forced = True
    provider = tracer_provider or trace.get_tracer_provider()
    _settings.provider, _settings.tracer = provider, provider.get_tracer("pitstop", _release())


def disable() -> None:
    """Emit no spans, even if the application uses OpenTelemetry."""
    _settings.forced, _settings.tracer, _settings.provider = False, None, None


def _release() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pitstop")
    except PackageNotFoundError:  # pragma: no cover - a source checkout
        return None


def tracer() -> Any:
    """The tracer pitstop emits with, or None when tracing is off: after :func:`enable`, or
    when the application imported ``opentelemetry.trace`` and set a tracer provider (one
    that records: not the API's default)."""
    if _settings.forced is not None:
        return _settings.tracer
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if provider is not _settings.provider:
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None
        _settings.provider, _settings.tracer = provider, provider.get_tracer("pitstop",
                                                                             _release())
    return _settings.tracer


def _trace() -> Any:
    return sys.modules["opentelemetry.trace"]


def _context() -> Any:
    """``opentelemetry.context`` (imported with ``opentelemetry.trace``): a dictionary look-up,
    where ``from opentelemetry import context`` in a function runs the import machinery
    (~1 µs, at each step that made a span)."""
    return sys.modules["opentelemetry.context"]


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (None without one, or tracing off)."""
    if tracer() is None:
        return None
    context = _trace().get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _link(traceparent: Any) -> Any:
    """An OpenTelemetry Link to the span a ``traceparent`` names (None if malformed)."""
    if not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    trace = _trace()
    try:
        context = trace.SpanContext(int(parts[1], 16), int(parts[2], 16), is_remote=True,
                                    trace_flags=trace.TraceFlags(int(parts[3], 16)))
    except ValueError:
        return None
    return trace.Link(context) if context.is_valid else None


def links_of(metadata: Mapping[str, Any]) -> list[Any]:
    """Links to the traces that enqueued a run and sent its inputs (from its metadata)."""
    traced = metadata.get(TRACE_KEY)
    if not isinstance(traced, Mapping):
        return []
    parents = [traced.get("enqueued")]
    inputs = traced.get("inputs")
    if isinstance(inputs, Mapping):
        parents += list(inputs.values())
    return [link for link in map(_link, parents) if link is not None]


class RunSpan:
    """A run attempt's span, started and ended by the engine (a generator: no ``with`` can
    span its yields, and it must not leave a context attached between them).

    ``traced`` says whether the run's step, save and wait spans are made: not when the run's
    span was sampled out and the sampler follows the parent (the SDK's default,
    ``ParentBased``), which would drop them anyway. Those steps then only run inside the
    run's context (user spans inherit its "not sampled"), and pay no span, no attributes.
    """

    __slots__ = ("context", "span", "traced")

    def __init__(self, tracer: Any, workflow: str, run_id: str, status: str,
                 links: list[Any]) -> None:
        self.span = tracer.start_span(
            f"pitstop.run {workflow}", links=links,
            attributes={"pitstop.run.id": run_id, "pitstop.workflow.name": workflow,
                        "pitstop.run.start_status": status})
        self.context = _trace().set_span_in_context(self.span)
        self.traced = self.span.is_recording() or not _follows_parent(tracer)

    def end(self, status: str | None, error: BaseException | None = None) -> None:
        if status is not None:
            self.span.set_attribute("pitstop.run.status", status)
        if error is not None:
            _error(self.span, error)
        self.span.end()


def _follows_parent(tracer: Any) -> bool:
    """Whether ``tracer`` samples a span as its parent was (the SDK's ``ParentBased``
    sampler, its default): then an unsampled run's child spans are unsampled too."""
    sampling = sys.modules.get("opentelemetry.sdk.trace.sampling")
    return sampling is not None and isinstance(getattr(tracer, "sampler", None),
                                               sampling.ParentBased)


def _error(span: Any, error: BaseException) -> None:
    trace = _trace()
    span.record_exception(error)
    span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}"
                       .removeprefix("builtins."))
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)[:200]))


_STEP_SPAN_NAMES: dict[str, str] = {}  # step name -> its span's (bounded: the steps defined)


def traced_step(tracer: Any, parent: Any, fn: Callable[..., Any], attributes: dict[str, Any],
                control: tuple[type[BaseException], ...]) -> Callable[..., Any]:
    """``fn`` (a step's invoke) run inside a ``pitstop.step`` span, current while it runs (an
    async step's span is current while it is awaited). ``control`` exceptions (a sleep, a
    wait for children) are not errors."""
    step = attributes["pitstop.step.name"]
    name = _STEP_SPAN_NAMES.get(step)
    if name is None:
        name = _STEP_SPAN_NAMES[step] = f"pitstop.step {step}"
    context = _context()
    in_span = _trace().set_span_in_context

    def call(*args: Any, **kwargs: Any) -> Any:
        span = tracer.start_span(name, context=parent, attributes=attributes)
        token = context.attach(in_span(span))
        try:
            result = fn(*args, **kwargs)
        except control as stop:
            span.set_attribute("pitstop.step.outcome", type(stop).__name__.lower())
            span.end()
            raise
        except BaseException as exc:
            _error(span, exc)
            span.end()
            raise
        finally:
            context.detach(token)
        if hasattr(result, "__await__"):
            return _awaited(result, span, control)
        span.end()
        return result

    return call


async def _awaited(awaitable: Any, span: Any, control: tuple[type[BaseException], ...]) -> Any:
    otel_context = _context()
    token = otel_context.attach(_trace().set_span_in_context(span))
    try:
        return await awaitable
    except control as stop:
        span.set_attribute("pitstop.step.outcome", type(stop).__name__.lower())
        raise
    except BaseException as exc:
        _error(span, exc)
        raise
    finally:
        otel_context.detach(token)
        span.end()


def in_context(parent: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a step's invoke) run with ``parent`` (an unsampled run's context) current: the
    spans it makes are children of the run, sampled as it was; no span of its own."""
    otel_context = _context()

    def call(*args: Any, **kwargs: Any) -> Any:
        token = otel_context.attach(parent)
        try:
            result = fn(*args, **kwargs)
        finally:
            otel_context.detach(token)
        if hasattr(result, "__await__"):
            return _awaited_in(result, parent)
        return result

    return call


async def _awaited_in(awaitable: Any, parent: Any) -> Any:
    otel_context = _context()
    token = otel_context.attach(parent)
    try:
        return await awaitable
    finally:
        otel_context.detach(token)


@contextmanager
def span(name: str, attributes: dict[str, Any], parent: Any = None) -> Iterator[Any]:
    """A span around a block (current inside it), or nothing when tracing is off."""
    found = tracer()
    if found is None:
        yield None
        return
    with found.start_as_current_span(name, context=parent, attributes=attributes,
                                     record_exception=True, set_status_on_exception=True) as s:
        yield s


def event_span(tracer: Any, parent: Any, name: str, attributes: dict[str, Any]) -> None:
    """A span of no duration: something that happened (a run parking to wait)."""
    tracer.start_span(name, context=parent, attributes=attributes).end()


_DB_SYSTEMS: dict[type, str] = {}


def db_system(store: Any) -> str:
    """OpenTelemetry's ``db.system.name`` for a store (worked out once per store class)."""
    kind = type(store)
    found = _DB_SYSTEMS.get(kind)
    if found is None:
        name = kind.__name__.lower()
        found = _DB_SYSTEMS[kind] = "postgresql" if "postgres" in name else "sqlite" \
            if "sqlite" in name or "memory" in name else name
    return found


def map_item(fn: Callable[[Any], Any], map_name: str, run_id: str) -> Callable[[Any], Any]:
    """``fn`` for a map's pool thread: a ``pitstop.map.item`` span under the step's span (the
    context of the thread that built it, carried over explicitly: pool threads start
    empty)."""
    found = tracer()
    if found is None:
        return fn
    from opentelemetry import context as otel_context

    parent = otel_context.get_current()
    attributes = {"pitstop.run.id": run_id, "pitstop.map.name": map_name}

    def item(value: Any) -> Any:
        with found.start_as_current_span("pitstop.map.item", context=parent,
                                         attributes=attributes, record_exception=True,
                                         set_status_on_exception=True):
            return fn(value)

    return item


__all__ = ["current_traceparent", "disable", "enable", "tracer"]
