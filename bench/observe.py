"""Observability costs (issue #29): `pitstop du` on a large store, tracing and metrics overhead.

    .venv/bin/python bench/observe.py du [--checkpoints 100000] [--postgres URL]
    .venv/bin/python bench/observe.py overhead [--steps 2000 --rounds 7] [--modes metrics]
    valgrind --tool=callgrind .venv/bin/python bench/observe.py instructions --steps 1000

``du``: a store of ``--checkpoints`` checkpoints (1,000 runs of 100, each checkpoint a small
state whose list grows, so values, references and effects exist), then `pitstop du`,
`pitstop du --by field` and `pitstop du RUN` each in a fresh process as an operator runs them
(interpreter start included), medians of 5. Target: <= 2 s on SQLite and PostgreSQL.

``overhead``: a small workflow step (~1 KiB of state, a checkpoint every step, SQLite) with
tracing off, tracing on (the OpenTelemetry SDK, a batch span processor exporting to
nothing), tracing with 1% of traces sampled, metrics on (Prometheus; and OpenTelemetry's SDK,
whose reader does not collect during the run), and the SDK on its own in place: pitstop's
tracing off, the step itself making the two spans a traced step makes (the same names,
parent and attributes, its step span current while it works), in interleaved rounds: the
process's CPU time per step (its threads included), each mode's ratio to a run with
everything off next to it (before it in one round, after it in the next), the median of the
rounds. "off again" pairs two runs with everything off: the spread a ratio has on this
machine. Targets: tracing <= 1.05x, metrics <= 1.02x. ``--modes`` runs some modes only (the
SDK floor row needs ``tracing``).

``instructions``: for callgrind. The same step ``--steps`` times with metrics on, tracing on
(every span recorded, a batch span processor) or both off, after
200 warm-up steps of each; run it with ``--steps 0`` and ``--steps 1000`` and subtract: the
instructions a step costs, which the machine's load does not change (set
``PYTHONHASHSEED=0``; the store's background threads still make runs differ by ~0.5k).
``--mode "sdk span"`` counts ``--steps`` spans of the SDK alone instead (no pitstop step).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    POSTGRES_URL,
    base_state,
    fmt_time,
    machine,
    median_of,
    median_ratio,
    noop,
    pitstop_loop,
    save_results,
    table,
)

import pitstop

RUNS_OF = 100
PG_DEFAULT = POSTGRES_URL


def build(url: str, checkpoints: int) -> str:
    """Runs of RUNS_OF checkpoints each; returns one run's id."""
    runs = max(1, checkpoints // RUNS_OF)
    with pitstop.open_store(url) as store:
        for r in range(runs):
            run_id = f"run-{r:05d}"
            messages: list[str] = []
            for i in range(RUNS_OF):
                messages = [*messages, f"message {i} of run {r}"]
                store.save(run_id, {"messages": messages, "i": i, "model": "m" * 60},
                           metadata={"source": "step", "step_name": f"step_{i % 5}",
                                     "status": "running", "duration": 0.001},
                           workflow="bench")
            store.record_effect(run_id, f"{run_id}:e", {"paid": r})
    return "run-00000"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _pitstop(url: str, *args: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of ``pitstop ARGS`` in a fresh process."""
    env = {**os.environ, "PITSTOP_STORE": url}
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pitstop", *args], env=env,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"pitstop {' '.join(args)} failed: {done.stderr}")
    return elapsed, _children_cpu() - cpu


def bench_du(url: str, checkpoints: int, label: str, repeat: int) -> list[list[str]]:
    t0 = time.perf_counter()
    one = build(url, checkpoints)
    built = time.perf_counter() - t0
    print(f"{label}: built {checkpoints:,} checkpoints in {built:.0f} s", flush=True)
    # One untimed call first: the first process to open the store after the build pays for
    # checkpointing SQLite's write-ahead log of it, a one-off of the build, not of `du`.
    _pitstop(url, "stats")
    rows = []
    for args in (["du"], ["du", "--by", "field"], ["du", one], ["stats"]):
        samples = [_pitstop(url, *args) for _ in range(repeat)]
        wall = median_of([w for w, _ in samples])
        cpu = median_of([c for _, c in samples])
        rows.append([label, "pitstop " + " ".join(args), fmt_time(wall), fmt_time(cpu),
                     "yes" if wall <= 2.0 else "NO"])
    return rows


def _pg_url(base: str) -> str:
    import psycopg

    schema = f"bench_observe_{os.getpid()}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}schema={schema}"


def _drop_pg(base: str, url: str) -> None:
    import psycopg

    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main_du(args: argparse.Namespace) -> None:
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += bench_du(f"sqlite:///{Path(tmp) / 'du.db'}", args.checkpoints, "SQLite",
                         args.repeat)
    if args.postgres:
        url = _pg_url(args.postgres)
        try:
            rows += bench_du(url, args.checkpoints, "PostgreSQL", args.repeat)
        finally:
            _drop_pg(args.postgres, url)
    headers = ["store", "command", "median wall (process start included)", "child CPU",
               "<= 2 s"]
    text = table(headers, rows)
    print(text)
    markdown = (f"`pitstop du` on {args.checkpoints:,} checkpoints, load "
                f"{os.getloadavg()[0]:.1f} ({machine()}):\n\n" + text)
    save_results("observe-du", " ".join(sys.argv), {"rows": rows}, markdown)


def _per_step(store: Any, steps: int, tracer: Any = None) -> float:
    """CPU seconds a step (with its checkpoint) costs the process, its threads included (a
    batch span processor exports on one): steadier than wall time on a shared machine. With
    ``tracer``, each step makes its spans itself (:func:`_spans_in_step`)."""
    wf = pitstop_loop(steps) if tracer is None else _spans_in_step(steps, tracer)
    started = time.process_time()
    wf.start(store, base_state())
    return (time.process_time() - started) / steps


def _spans_in_step(steps: int, tracer: Any) -> pitstop.Workflow:
    """The bench loop whose step makes, with the SDK alone, the two spans a traced step
    makes: a step span (current while the step works) and a save span, children of a run
    span, with pitstop's attributes. What the SDK costs in place, between the store's work,
    where a loop of spans alone (:func:`_span_floor`) keeps the SDK's code and data warm."""
    from opentelemetry import context, trace

    wf = pitstop.Workflow("bench-sdk-spans")
    run_id = "01a24365-4bd7-7000-bca1-aa4f2545267e"
    parent = trace.set_span_in_context(tracer.start_span("pitstop.run bench-sdk-spans"))

    @wf.step
    def work(state: dict[str, Any]) -> Any:
        span = tracer.start_span("pitstop.step work", context=parent, attributes={
            "pitstop.run.id": run_id, "pitstop.step.name": "work",
            "pitstop.step.position": state["i"], "pitstop.step.attempt": 1})
        token = context.attach(trace.set_span_in_context(span))
        try:
            update = noop(state)
        finally:
            context.detach(token)
            span.end()
        tracer.start_span("pitstop.checkpoint.save", context=parent, attributes={
            "pitstop.run.id": run_id, "pitstop.checkpoint.id": "01a24365-4bee-7000-8148",
            "pitstop.checkpoint.step": state["i"], "pitstop.checkpoint.status": "running",
            "pitstop.checkpoint.source": "step", "db.system.name": "sqlite",
            "db.operation.name": "save", "pitstop.checkpoint.bytes": 330},
            start_time=time.time_ns()).end()
        return pitstop.goto("work", update) if update["i"] < steps else update

    return wf


class _Dropping:
    """A span exporter that drops what it gets: the cost measured is pitstop's and the SDK's,
    not a collector's."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _span_floor(provider: Any, count: int) -> float:
    """CPU seconds one SDK span costs on its own (started, given a save span's attributes,
    ended, queued to the batch processor and exported), median of 5."""
    tracer = provider.get_tracer("floor")
    attributes = {"pitstop.run.id": "01a24365-4bd7-7000-bca1-aa4f2545267e",
                  "pitstop.checkpoint.id": "01a24365-4bee-7000-8148-88f5686279b3",
                  "pitstop.checkpoint.step": 1, "pitstop.checkpoint.status": "running",
                  "pitstop.checkpoint.source": "step", "db.system.name": "sqlite",
                  "db.operation.name": "save"}
    samples = []
    for _ in range(5):
        started = time.process_time()
        for _ in range(count):
            tracer.start_span("pitstop.checkpoint.save", attributes=attributes).end()
        provider.force_flush()
        samples.append((time.process_time() - started) / count)
    return median_of(samples)


def main_overhead(args: argparse.Namespace) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from pitstop.observe import metrics, tracing

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropping()))  # type: ignore[arg-type]
    sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    sampled.add_span_processor(BatchSpanProcessor(_Dropping()))  # type: ignore[arg-type]
    counting = metrics.Metrics()
    # A reader that collects only when asked: the run pays what recording costs.
    otel_counting = metrics.Metrics(prometheus=False, meter_provider=MeterProvider(
        metric_readers=[InMemoryMetricReader()]))
    in_step = provider.get_tracer("bench")
    # "off again": nothing turned on; its ratio is what the pairing itself measures (the
    # noise and any bias of the order), the yardstick for the small ratios.
    modes = tuple(mode for mode in ("metrics", "metrics, OpenTelemetry", "tracing",
                                    "tracing 1%", "SDK spans in the step", "off again")
                  if args.modes is None or mode in args.modes.split(","))
    series: dict[str, list[float]] = {"off": [], **{mode: [] for mode in modes}}
    baseline: dict[str, list[float]] = {mode: [] for mode in modes}

    def switch(mode: str) -> None:
        tracing.disable()
        metrics._current.metrics = None
        if mode == "tracing":
            tracing.enable(provider)
        elif mode == "tracing 1%":
            tracing.enable(sampled)
        elif mode == "metrics":
            metrics._current.metrics = counting
        elif mode == "metrics, OpenTelemetry":
            metrics._current.metrics = otel_counting

    with tempfile.TemporaryDirectory() as tmp:
        store = pitstop.open_store(f"sqlite:///{Path(tmp) / 'o.db'}")
        _per_step(store, 200)  # warm up
        for round_number in range(args.rounds):
            # Each mode next to a run with everything off, before it in one round and after
            # it in the next: its ratio is to that run, so a slow spell of the shared machine
            # (or the store's growth) cancels out.
            for mode in modes:
                for part in ("off", mode) if round_number % 2 else (mode, "off"):
                    switch(part)
                    spent = _per_step(store, args.steps,
                                      in_step if part == "SDK spans in the step" else None)
                    if part == "off":
                        series["off"].append(spent)
                        baseline[mode].append(spent)
                    else:
                        series[mode].append(spent)
                    # The export thread's work must not land in the next run's CPU time.
                    provider.force_flush()
                    sampled.force_flush()
        switch("off")
        store.close()
    floor = _span_floor(provider, args.steps) if "tracing" in modes else None
    provider.shutdown()
    sampled.shutdown()
    off = median_of(series["off"])
    rows = [["off", fmt_time(off), "1.00x", ""]]
    for mode, target in (("off again", None), ("tracing", 1.05), ("tracing 1%", 1.05),
                         ("metrics", 1.02), ("metrics, OpenTelemetry", 1.02),
                         ("SDK spans in the step", None)):
        if mode not in modes:
            continue
        ratio = median_ratio(series[mode], baseline[mode])
        rows.append([mode, fmt_time(median_of(series[mode])), f"{ratio:.3f}x",
                     "" if target is None else
                     f"<= {target:.2f}x: {'yes' if ratio <= target else 'NO'}"])
    # What the SDK costs on its own, in a loop of spans: a traced step makes two (its step,
    # its save). In place ("SDK spans in the step") the same two cost more.
    if floor is not None:
        rows.append(["SDK floor: 2 spans a step, in a loop", fmt_time(off + 2 * floor),
                     f"{(off + 2 * floor) / off:.3f}x", f"a span alone: {fmt_time(floor)}"])
    headers = ["mode", "CPU per step (median)", "ratio to off (median of rounds)", "target"]
    text = table(headers, rows)
    print(text)
    load = os.getloadavg()[0]
    markdown = (f"A small workflow step with a checkpoint each (SQLite), {args.steps} steps, "
                f"{args.rounds} interleaved rounds, load {load:.1f} ({machine()}):\n\n" + text)
    save_results("observe-overhead", " ".join(sys.argv),
                 {"rows": rows, "series": series, "baseline": baseline},
                 markdown)


def main_instructions(args: argparse.Namespace) -> None:
    from pitstop.observe import metrics, tracing

    counting = metrics.Metrics()
    provider: Any = None
    if args.mode == "tracing":
        # Every span recorded and handed to a batch processor exporting to nothing; its
        # export thread's instructions count too (callgrind counts every thread, and the
        # shutdown below exports what is queued).
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(_Dropping()))  # type: ignore[arg-type]
    if args.mode == "sdk span":
        # One SDK span alone, as _span_floor makes it, ``--steps`` times: what the SDK costs
        # per span, against which a step's instructions set the tracing target's budget.
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(_Dropping()))  # type: ignore[arg-type]
        _span_floor(provider, 10)  # warm
        if args.steps:
            _span_floor(provider, args.steps // 5)  # 5 loops of steps / 5 spans
        provider.shutdown()
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = pitstop.open_store(f"sqlite:///{Path(tmp) / 'i.db'}")
        for warm in (True, False):  # both paths warm, whichever is counted
            metrics._current.metrics = counting if warm else None
            if warm and provider is not None:
                tracing.enable(provider)
            pitstop_loop(200).start(store, base_state())
            tracing.disable()
        metrics._current.metrics = counting if args.mode == "metrics" else None
        if provider is not None:
            tracing.enable(provider)
        if args.steps:
            pitstop_loop(args.steps).start(store, base_state())
        metrics._current.metrics = None
        tracing.disable()
        store.close()
    if provider is not None:
        provider.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    du = sub.add_parser("du")
    du.add_argument("--checkpoints", type=int, default=100_000)
    du.add_argument("--postgres", nargs="?", const=PG_DEFAULT, default=None)
    du.add_argument("--repeat", type=int, default=5)
    overhead = sub.add_parser("overhead")
    overhead.add_argument("--steps", type=int, default=2000)
    overhead.add_argument("--rounds", type=int, default=7)
    overhead.add_argument("--modes", help="comma-separated: only these modes")
    instructions = sub.add_parser("instructions")
    instructions.add_argument("--mode", choices=("off", "metrics", "tracing", "sdk span"),
                              default="metrics")
    instructions.add_argument("--steps", type=int, default=1000)
    args: Any = parser.parse_args()
    if args.what == "du":
        main_du(args)
    elif args.what == "instructions":
        main_instructions(args)
    else:
        main_overhead(args)


if __name__ == "__main__":
    main()
