"""OpenTelemetry spans (#29), with the real SDK and its in-memory exporter: what a run emits,
trace context through enqueue -> worker and send -> resume, and no import without it."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the test extra installs opentelemetry-sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pitstop
from conftest import run_python
from pitstop import Retry, RunStatus, Store, Workflow
from pitstop.observe import tracing
from pitstop.runtime.worker import run_until_idle

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
# Not the global provider: the rest of the suite must run without tracing.


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    tracing.enable(_PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER
    tracing.disable()
    tracing._settings.forced = None  # back to "on if the application configured OTel"


def _named(found: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def test_a_run_emits_run_step_save_effect_map_and_wait_spans(
    store: Store, spans: InMemorySpanExporter
) -> None:
    wf = Workflow("traced")
    calls = {"n": 0}

    @wf.step(retry=Retry(attempts=2, backoff=0))
    def work(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("once")
        with _PROVIDER.get_tracer("user").start_as_current_span("user work"):
            ctx.effect("pay", lambda: 7)
        ctx.map(lambda x: x + 1, [1, 2, 3], name="incr")
        return {"done": True}

    @wf.step(wait_for=["ok"])
    def later(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    tracer = _PROVIDER.get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        result = wf.start(store, {})
    assert result.status is RunStatus.WAITING
    found = list(spans.get_finished_spans())
    [run] = _named(found, "pitstop.run traced")
    assert run.parent is not None and run.parent.span_id == request.get_span_context().span_id
    assert run.attributes["pitstop.run.id"] == result.run_id
    assert run.attributes["pitstop.run.status"] == "waiting"
    steps = _named(found, "pitstop.step work")
    assert [s.attributes["pitstop.step.attempt"] for s in steps] == [1, 2]
    assert steps[0].status.status_code is trace.StatusCode.ERROR
    assert steps[0].attributes["error.type"] == "ValueError"
    assert all(s.parent.span_id == run.context.span_id for s in steps)
    [user] = _named(found, "user work")
    assert user.parent.span_id == steps[1].context.span_id  # user spans nest in the step
    [effect] = _named(found, "pitstop.effect")
    assert effect.parent.span_id == user.context.span_id
    assert effect.attributes["pitstop.effect.name"] == "pay"
    assert effect.attributes["pitstop.effect.replayed"] is False
    items = _named(found, "pitstop.map.item")
    assert len(items) == 3 and {i.parent.span_id for i in items} == {steps[1].context.span_id}
    saves = _named(found, "pitstop.checkpoint.save")
    assert saves and all(s.attributes["db.system.name"] == "sqlite" or
                         s.attributes["db.system.name"] == "postgresql" for s in saves)
    assert {s.attributes["pitstop.checkpoint.status"] for s in saves} >= {"running", "waiting"}
    assert all(s.attributes["pitstop.checkpoint.id"] for s in saves)
    assert any(s.attributes.get("pitstop.checkpoint.bytes", 0) > 0 for s in saves)
    [wait] = _named(found, "pitstop.wait")
    assert list(wait.attributes["pitstop.wait.inputs"]) == ["ok"]


def test_send_and_enqueue_carry_the_trace_to_the_resumed_run(
    store: Store, spans: InMemorySpanExporter
) -> None:
    wf = Workflow("linked")

    @wf.step(wait_for=["approval"])
    def decide(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    tracer = _PROVIDER.get_tracer("app")
    with tracer.start_as_current_span("enqueue") as enqueuing:
        run = wf.enqueue(store, {})
    run_until_idle(store, wf)
    assert store.get_run(run.id).status is RunStatus.WAITING
    with tracer.start_as_current_span("webhook") as webhook:
        pitstop.send(store, run.id, "approval", {"yes": True})
    spans.clear()
    assert wf.resume(store, run.id).status is RunStatus.COMPLETED
    [resumed] = _named(list(spans.get_finished_spans()), "pitstop.run linked")
    linked = {link.context.span_id for link in resumed.links}
    assert webhook.get_span_context().span_id in linked
    assert enqueuing.get_span_context().span_id in linked
    assert all(link.context.trace_id != resumed.context.trace_id for link in resumed.links)
    [restore] = _named(list(spans.get_finished_spans()), "pitstop.checkpoint.restore")
    assert restore.attributes["pitstop.checkpoint.id"]


async def test_async_steps_are_traced_too(store: Store, spans: InMemorySpanExporter) -> None:
    wf = Workflow("async-traced")

    @wf.step
    async def step(state: dict[str, Any]) -> dict[str, Any]:
        with _PROVIDER.get_tracer("user").start_as_current_span("inside"):
            return {"x": 1}

    assert (await wf.astart(store, {})).status is RunStatus.COMPLETED
    found = list(spans.get_finished_spans())
    [stepped] = _named(found, "pitstop.step step")
    [inside] = _named(found, "inside")
    assert inside.parent.span_id == stepped.context.span_id


@pytest.mark.slow
def test_without_opentelemetry_imported_a_run_imports_none_of_it(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        import pitstop
        wf = pitstop.Workflow("plain")

        @wf.step
        def one(state, ctx):
            ctx.effect("e", lambda: 1)
            ctx.map(lambda x: x, [1, 2])
            return {{"a": 1}}

        store = pitstop.open_store("sqlite:///{tmp_path / 'plain.db'}")
        assert wf.start(store, {{}}).status.value == "completed"
        wf.enqueue(store, {{}}, run_id="queued")
        loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry", "prometheus")))
        assert not loaded, loaded
        print("clean")
    """)
    assert run_python(code).stdout.strip() == "clean"


@pytest.mark.slow
def test_an_application_provider_turns_tracing_on_by_itself(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import pitstop
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        wf = pitstop.Workflow("auto")

        @wf.step
        def one(state):
            return {{"a": 1}}

        store = pitstop.open_store("sqlite:///{tmp_path / 'auto.db'}")
        wf.start(store, {{}})  # the API's default provider: nothing recorded, nothing emitted
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        wf.start(store, {{}})
        print(sorted({{s.name for s in exporter.get_finished_spans()}}))
    """)
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert "pitstop.run auto" in done.stdout and "pitstop.step one" in done.stdout


def test_a_failing_or_stuck_exporter_never_fails_or_holds_a_run(store: Store) -> None:
    import threading

    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    release = threading.Event()

    class Stuck:
        calls = 0

        def export(self, spans: Any) -> SpanExportResult:
            Stuck.calls += 1
            if Stuck.calls == 1:
                release.wait(60)  # a collector that does not answer
            raise ConnectionError("collector down")

        def shutdown(self) -> None:
            release.set()

        def force_flush(self, timeout_millis: int = 0) -> bool:
            return False

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Stuck(), max_queue_size=8,
                                                   max_export_batch_size=4,
                                                   schedule_delay_millis=1))
    wf = Workflow("exported")

    @wf.step
    def loop(state: dict[str, Any]) -> Any:
        n = state["n"] + 1
        return pitstop.goto("loop", {"n": n}) if n < 200 else {"n": n}

    tracing.enable(provider)
    try:
        # 200 steps, ~400 spans, against a queue of 8 and an exporter stuck on its first
        # batch: spans past the queue are dropped, the run does not wait for it.
        assert wf.start(store, {"n": 0}).status is RunStatus.COMPLETED
        assert not release.is_set()  # still stuck when the run was done
    finally:
        tracing.disable()
        tracing._settings.forced = None
        release.set()
        provider.shutdown()


def test_stream_checkpoints_are_spans(store: Store, spans: InMemorySpanExporter) -> None:
    from pitstop import stream

    job = stream.Job("traced-stream", source=stream.Iterable([(f"k{i}", i) for i in range(30)]),
                     every=10, seconds=60)

    @job.handler
    def keep(state: Any, record: stream.Record, emit: Any) -> None:
        state[record.key] = record.value

    report = job.run(store, idle_exit=0.1)
    found = _named(list(spans.get_finished_spans()), "pitstop.stream.checkpoint")
    assert len(found) == report.checkpoints >= 3
    last = found[-1].attributes
    assert last["pitstop.stream.job"] == "traced-stream"
    assert last["pitstop.stream.partition"] == 0
    assert last["pitstop.run.id"] == "traced-stream/0"
    assert last["pitstop.stream.records"] == 30
    assert last["pitstop.checkpoint.id"] == store.latest("traced-stream/0").id


@pytest.mark.parametrize("ratio", [0.0, 1.0])
async def test_an_unsampled_run_makes_no_step_spans_yet_its_steps_keep_its_context(
        store: Store, ratio: float) -> None:
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[tuple[int, bool, bool]] = []
    wf = Workflow("sampled-or-not")

    def note() -> None:
        # What the step's code sees, and a span it makes: a child of the run, sampled as
        # the run was (never a new root sampled on its own).
        current = trace.get_current_span().get_span_context()
        with provider.get_tracer("app").start_as_current_span("inside") as inside:
            seen.append((current.trace_id, inside.get_span_context().trace_id ==
                         current.trace_id, inside.is_recording()))

    @wf.step
    def first(state: dict[str, Any]) -> dict[str, Any]:
        note()
        return {"a": 1}

    @wf.step
    async def second(state: dict[str, Any]) -> dict[str, Any]:
        note()
        return {"b": 2}

    tracing.enable(provider)
    try:
        assert (await wf.astart(store, {})).status is RunStatus.COMPLETED
    finally:
        tracing.disable()
        tracing._settings.forced = None
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert len(seen) == 2 and all(trace_id != 0 and same for trace_id, same, _ in seen)
    if ratio == 0.0:
        assert names == []
        assert not any(recording for _, _, recording in seen)
    else:
        assert names.count("pitstop.step first") == names.count("pitstop.step second") == 1
        assert names.count("inside") == 2 and "pitstop.checkpoint.save" in names
        assert all(recording for _, _, recording in seen)
