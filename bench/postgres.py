"""PostgreSQL benchmark (issue #4): per-step cost, a large unchanged field, worker throughput.

    .venv/bin/python bench/postgres.py [--url postgresql://postgres@127.0.0.1:5432/test]
    .venv/bin/python bench/postgres.py --quick

1. Per-step cost of a no-op step on a ~1 KiB state (checkpoint after every step, durability
   ``normal`` and ``full``), and with an unchanged 1 MiB string field in the state: timed
   inside the run from its second step to its last, so the run's one-off start is left out;
   bytes the 1 MiB case stored after 200 steps (``pg_total_relation_size`` of its tables).
2. LangGraph's PostgresSaver on the same loop, in the same run, when installed.
3. Throughput: 400 queued runs of 5 steps executed by 1, 2 and 4 worker processes
   (``pitstop.Worker``), in checkpoints per second. The machine has 2 cores shared with the
   PostgreSQL server, so this shows how workers scale when they wait on the database.
   Five interleaved rounds (1, 2, 4 processes, then again); the "x of 1" ratios are medians
   of each round's ratios.

4. ``--depth [--rounds N]``: queue depth (issue #18 item 13). A queue of 1k, 100k and 1M
   queued runs per schema, built once by one bulk INSERT (runs of another workflow, queued
   behind the benchmark's), autovacuum off for the table so it is never analyzed. Then N
   interleaved rounds (default 5; each depth in turn, the order rotating): 300 runs enqueued
   through the API at the head of the queue, one in-process worker's throughput draining
   them (runs/s, target flat within 1.5x of 1k: the median of per-round ratios), and at that
   depth ``store.runs(status="queued")`` (the listing ``pitstop runs --status queued``
   makes), ``store.stats(exact=False)`` (what ``pitstop stats`` asks) and the exact
   ``store.stats()``, and both CLI commands as processes (interpreter start included,
   bytecode cached); target under 0.5 s. Every filler run has an input checkpoint. Run it
   under ``nice`` on a shared machine.

Each measurement uses a fresh schema, dropped afterwards. Medians; ratios within this run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import (
    POSTGRES_URL,  # bench/_common.py (it takes bench/ off sys.path)
    base_state,
    fmt_bytes,
    fmt_time,
    langgraph_loop,
    median_ratio,
    pitstop_loop,
    save_results,
    steady_per_step,
    table,
    time_invoke,
)

import pitstop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_URL = POSTGRES_URL
MiB = 1 << 20
BIG = base64.b64encode(os.urandom(3 * MiB // 4)).decode()  # random: zstd cannot hide it


@contextmanager
def schema(url: str) -> Iterator[tuple[str, str]]:
    """A fresh schema: (pitstop URL with ?schema=, schema name); dropped afterwards."""
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}schema={name}", name
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def relation_bytes(url: str, name: str, prefix: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE %s",
            (name, prefix + "%"),
        ).fetchone()
    return int(row[0]) if row else 0


def per_step_pitstop(url: str, steps: int, rounds: int, durability: str,
                     **extra: Any) -> tuple[float, int]:
    """Steady cost of a step with its checkpoint, timed from inside the run (second to last
    step), so a run's one-off costs (opening it, its first checkpoint of a 1 MiB input) are
    not spread over its steps. Also the bytes stored by the run."""
    samples, stored = [], 0
    for _ in range(rounds):
        with schema(url) as (store_url, name):
            store = pitstop.open_store(store_url, durability=durability)
            marks: dict[int, float] = {}
            result = pitstop_loop(steps, marks=marks).start(store, base_state(**extra))
            assert result.state["i"] == steps
            samples.append(steady_per_step(marks))
            store.close()
            stored = relation_bytes(url, name, "pitstop_")
    return statistics.median(samples), stored


def per_step_postgres_saver(url: str, steps: int, rounds: int,
                            **extra: Any) -> tuple[float, int] | None:
    graph = langgraph_loop(steps, **{k: type(v) for k, v in extra.items()})
    if graph is None:
        return None
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError as exc:
        print(f"(PostgresSaver not measured: {exc})")
        return None
    samples, stored = [], 0
    for r in range(rounds):
        with schema(url) as (_, name):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{name}"')
            conninfo = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}"
            with PostgresSaver.from_conn_string(conninfo) as saver:
                saver.setup()
                app = graph.compile(checkpointer=saver)
                samples.append(time_invoke(app, base_state(**extra), steps, f"t{r}"))
            stored = relation_bytes(url, name, "checkpoint")
    return statistics.median(samples), stored


WORKER = """
import os, sys, time
sys.path.insert(0, sys.argv[2])
import pitstop
from postgres import throughput_workflow
store = pitstop.open_store(sys.argv[1])
worker = pitstop.Worker(store, [throughput_workflow()], concurrency=1, poll_interval=0.05)
print("ready", flush=True)
while not os.path.exists(sys.argv[3]):  # start together, once every worker has started up
    time.sleep(0.005)
print(worker.run(until_idle=True, handle_signals=False).executed, flush=True)
"""


def throughput_workflow() -> pitstop.Workflow:
    wf = pitstop.Workflow("throughput")

    def step(name: str) -> Any:
        return lambda state: {name: state["n"]}

    for name in ("a", "b", "c", "d", "e"):
        wf.step(name=name)(step(name))
    return wf


def throughput(url: str, processes: int, runs: int, tmp: Path) -> float:
    """Checkpoints written per second by ``processes`` worker processes draining ``runs``.

    The clock starts when every worker has started up (interpreter and imports are not what
    is measured) and stops when the last one has found nothing left to do.
    """
    go = tmp / f"go-{processes}-{uuid.uuid4().hex}"
    with schema(url) as (store_url, _):
        with pitstop.open_store(store_url) as store:
            wf = throughput_workflow()
            for n in range(runs):
                wf.enqueue(store, {"n": n})
            before = store.stats().checkpoints
        procs = [
            subprocess.Popen([sys.executable, "-c", WORKER, store_url, str(HERE), str(go)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
            for _ in range(processes)
        ]
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        go.write_text("go")
        executed = sum(int(p.communicate()[0].split()[-1]) for p in procs)
        elapsed = time.perf_counter() - t0
        assert executed == runs, (executed, runs)
        with pitstop.open_store(store_url) as store:
            written = store.stats().checkpoints - before
            assert store.stats().runs_by_status == {"completed": runs}
    return written / elapsed


def fill_queue(store_url: str, name: str, depth: int, runs: int) -> None:
    """Fill the schema's queue up to ``depth`` queued runs behind the benchmark's own, in one
    bulk INSERT (runs of another workflow, created in the future: queued behind every run
    the rounds enqueue), with autovacuum off for the table so it is never analyzed: the
    claim must not depend on statistics being there."""
    import psycopg

    filler = pitstop.Workflow("filler")  # never run: no worker here takes its runs

    @filler.step
    def nothing(state: dict[str, Any]) -> None:
        return None

    with pitstop.open_store(store_url) as store:
        filler.enqueue(store, {"n": 0}, run_id="filler-0")  # its checkpoint is copied below
    with psycopg.connect(store_url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{name}"')
        conn.execute("ALTER TABLE pitstop_runs SET (autovacuum_enabled = false)")
        count = max(0, depth - runs - 1)
        conn.execute(
            "INSERT INTO pitstop_runs (run_id, workflow, status, created_at, updated_at, "
            "checkpoints) SELECT 'filler-' || i, 'filler', 'queued', %s + i, %s + i, 1 "
            "FROM generate_series(1, %s) i",
            (time.time() + 1e6, time.time() + 1e6, count),
        )
        # Each with an input checkpoint, as every enqueued run has: a copy of filler-0's
        # record (its checksum is the original's; nothing here verifies them). What
        # `pitstop stats` counts then grows with the depth too.
        conn.execute(
            "INSERT INTO pitstop_checkpoints (id, run_id, parent_id, step, created_at, "
            "schema_version, metadata, fields, size, added, checksum) "
            "SELECT 'filler-c-' || i, 'filler-' || i, NULL, k.step, k.created_at, "
            "k.schema_version, k.metadata, k.fields, k.size, k.added, k.checksum "
            "FROM generate_series(1, %s) i, "
            "(SELECT * FROM pitstop_checkpoints WHERE run_id = 'filler-0') k",
            (count,),
        )
    cli(["runs", "--limit", "1"], store_url)  # writes the bytecode caches the rounds read


def depth_round(store_url: str, runs: int) -> dict[str, float]:
    """One round at one depth: ``runs`` enqueued through the API at the head of the queue,
    drained by one in-process worker (runs/s); then the listings, in process and as CLI
    processes (interpreter start included)."""
    wf = throughput_workflow()
    out: dict[str, float] = {}
    with pitstop.open_store(store_url) as store:
        for n in range(runs):
            wf.enqueue(store, {"n": n})
        worker = pitstop.Worker(store, [wf], poll_interval=0.01)
        t0 = time.perf_counter()
        executed = worker.run(until_idle=True, handle_signals=False).executed
        out["runs_per_s"] = executed / (time.perf_counter() - t0)
        assert executed == runs, (executed, runs)
        out["list_queued"] = min(
            time_call(lambda: store.runs(status="queued", limit=51)) for _ in range(3)
        )
        out["stats"] = min(time_call(lambda: store.stats(exact=False)) for _ in range(3))
        out["stats_exact"] = min(time_call(store.stats) for _ in range(3))
    for key, argv in (("cli_runs", ["runs", "--status", "queued"]), ("cli_stats", ["stats"]),
                      ("cli_start", ["runs", "--limit", "1", "--status", "cancelled"])):
        out[key] = time_call(lambda argv=argv: cli(argv, store_url))  # type: ignore[misc]
    return out


def cli(argv: list[str], store_url: str) -> None:
    """``pitstop ARGV`` as an operator runs it. With bytecode caches: an installed package
    has them, and a shell with PYTHONDONTWRITEBYTECODE=1 (this VM's) would otherwise make
    every start-up compile all of pitstop from source (about 0.4 s under load)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(["nice", sys.executable, "-m", "pitstop", *argv, "--store", store_url],
                   check=True, capture_output=True, cwd=ROOT, env=env)


def time_call(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def depth_main(url: str, depths: list[int], rounds: int, runs: int = 300) -> None:
    """Every depth's queue is built once; then ``rounds`` interleaved rounds (each depth in
    turn, the order rotating every round) so a slow spell of this shared machine falls on
    every depth alike. Medians over rounds; the throughput ratios are medians of per-round
    ratios to the smallest depth."""
    samples: dict[int, list[dict[str, float]]] = {d: [] for d in depths}
    with contextlib.ExitStack() as stack:
        urls = {}
        for d in depths:
            store_url, name = stack.enter_context(schema(url))
            t0 = time.perf_counter()
            fill_queue(store_url, name, d, runs)
            print(f"queue of {d:,} built in {time.perf_counter() - t0:.1f} s", flush=True)
            urls[d] = store_url
        for r in range(rounds):
            order = depths[r % len(depths):] + depths[:r % len(depths)]
            for d in order:
                samples[d].append(depth_round(urls[d], runs))
            print(f"round {r + 1}/{rounds}: " + ", ".join(
                f"{d:,}: {samples[d][-1]['runs_per_s']:.0f} runs/s" for d in depths), flush=True)
    base = depths[0]
    results: dict[str, Any] = {"rounds": rounds, "runs": runs, "samples": samples}
    rows = []
    for d in depths:
        med = {k: statistics.median(s[k] for s in samples[d]) for k in samples[d][0]}
        ratio = median_ratio([s["runs_per_s"] for s in samples[base]],
                             [s["runs_per_s"] for s in samples[d]])
        results[str(d)] = {**med, "slower_than_smallest": ratio}
        rows.append([f"{d:,} queued", f"{med['runs_per_s']:.0f} runs/s",
                     f"{ratio:.2f}x", fmt_time(med["list_queued"]), fmt_time(med["stats"]),
                     fmt_time(med["stats_exact"]),
                     fmt_time(med["cli_runs"]), fmt_time(med["cli_stats"]),
                     fmt_time(med["cli_start"])])
    markdown = table([f"queue depth (median of {rounds})", "worker",
                      f"time per run vs {base:,} (<= 1.5x)", "runs(queued)",
                      "stats(exact=False)", "stats()",
                      "CLI runs --status queued", "CLI stats",
                      "CLI listing nothing (start-up)"], rows)
    print(markdown)
    command = (f"nice python bench/postgres.py --rounds {rounds} --depth "
               + " ".join(str(d) for d in depths))
    print(f"\n(results written to {save_results('postgres-depth', command, results, markdown)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--depth", type=int, nargs="*",
                        help="only the queue-depth benchmark, at these depths "
                             "(default 1000 100000 1000000)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds of the queue-depth benchmark (default 5)")
    args = parser.parse_args()
    if args.depth is not None:
        depth_main(args.url, args.depth or [1000, 100_000, 1_000_000], args.rounds)
        return
    steps, rounds = (100, 3) if args.quick else (200, 5)
    runs = 120 if args.quick else 400

    results: dict[str, Any] = {}
    results["normal"] = per_step_pitstop(args.url, steps, rounds, "normal")
    results["full"] = per_step_pitstop(args.url, steps, rounds, "full")
    results["big"] = per_step_pitstop(args.url, steps, rounds, "normal", document=BIG)
    results["lg_small"] = per_step_postgres_saver(args.url, steps, rounds)
    results["lg_big"] = per_step_postgres_saver(args.url, steps, rounds, document=BIG)
    # Interleaved rounds (1, 2, 4 processes, again and again): this shared VM's speed drifts
    # by tens of percent within a minute, so each round's ratios compare neighbours in time.
    samples: dict[int, list[float]] = {1: [], 2: [], 4: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(3 if args.quick else 5):
            for n, values in samples.items():
                values.append(throughput(args.url, n, runs, Path(tmp)))
    results["throughput"] = {n: statistics.median(v) for n, v in samples.items()}
    results["throughput_samples"] = samples
    scaling = {
        n: median_ratio(samples[n], samples[1])
        for n in samples
    }
    results["scaling"] = scaling

    normal, big = results["normal"][0], results["big"][0]
    rows = [
        ["pitstop, ~1 KiB state, normal", fmt_time(normal), "", "<= 1.5 ms"],
        ["pitstop, ~1 KiB state, full", fmt_time(results["full"][0]), "", ""],
        ["pitstop, + unchanged 1 MiB string", fmt_time(big), f"{big / normal:.1f}x small",
         "<= 2x small"],
        [f"bytes stored after {steps} steps with the 1 MiB string",
         fmt_bytes(results["big"][1]), "", "< 2 MiB"],
    ]
    for key, label in (("lg_small", "~1 KiB state"), ("lg_big", "+ unchanged 1 MiB string")):
        lg = results[key]
        if lg is None:
            continue
        ours = normal if key == "lg_small" else big
        rows.append([f"LangGraph PostgresSaver, {label}", fmt_time(lg[0]),
                     f"pitstop {lg[0] / ours:.1f}x faster", ""])
        if key == "lg_big":
            rows.append([f"PostgresSaver bytes after {steps} steps with the 1 MiB string",
                         fmt_bytes(lg[1]), f"pitstop {lg[1] / max(results['big'][1], 1):.0f}x "
                         "smaller", ""])
    tp = results["throughput"]
    for n in (1, 2, 4):
        rows.append([f"throughput, {n} worker process{'es' if n > 1 else ''}",
                     f"{tp[n]:.0f} ckpt/s", f"{scaling[n]:.2f}x of 1",
                     ">= 1.3x of 1" if n == 4 else ""])
    markdown = table(["what (median)", "per step / size", "ratio", "target"], rows)
    print(markdown)
    command = "python bench/postgres.py" + (" --quick" if args.quick else "")
    print(f"\n(results written to {save_results('postgres', command, results, markdown)})")


if __name__ == "__main__":
    main()
