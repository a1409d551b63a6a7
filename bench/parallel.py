"""Parallel work benchmark (issue #17): what ``ctx.map`` costs over running items by hand.

    .venv/bin/python bench/parallel.py            # full run
    .venv/bin/python bench/parallel.py --quick

1. Wall time of 100 async items that each await 50 ms, ``concurrency=20`` (target: <= 0.4 s,
   about five rounds of 50 ms), through ``await ctx.amap`` in an async step and ``ctx.map``
   in a sync step, next to the floor: the same items under an ``asyncio.Semaphore`` with
   nothing recorded.
2. Recording overhead per item on SQLite (target: <= 0.2 ms): a map of items that return at
   once, minus the same items run without pitstop, divided by the item count. Measured for
   async items at concurrency 20 (results that finish together share a write), for async
   items one at a time (every result its own write: the worst case) and for sync items in
   the thread pool; next to recording each item by hand with ``ctx.aeffect`` (a lookup and
   a write per item), what a step without ``ctx.map`` would do.

Rounds are interleaved (each round measures every variant once) and figures are medians, so
a slow spell of the shared machine lands on all variants alike.

3. ``--children``: a parent run with 1,000 children (``ctx.run_children``) on PostgreSQL,
   executed by 4 worker processes (``PITSTOP_BENCH_POSTGRES_URL``, default the test server;
   a schema of its own, dropped after). Reports the wall time until the parent completed,
   how many times the parent was woken (target: once), and how long ``pitstop show PARENT``
   takes as a command, process start included (target: < 0.5 s; median of 5).

    .venv/bin/python bench/parallel.py --children [--kids 1000] [--workers 4]

4. ``--fanout`` (issue #33): ``ctx.map(fn, items, concurrency=4)`` over ``--items`` (10,000)
   items, each parsing a 32 KiB JSON document (~0.2 ms of work), on SQLite and PostgreSQL,
   against the same items through a plain ``ThreadPoolExecutor(4)`` (target: <= 1.10x); and
   tiny items (``fn`` returns at once): the overhead per item (target: <= 10 µs). Rounds are
   interleaved; wall ratios are medians of per-round ratios, and the process CPU time (all
   threads) is given too, which a loaded machine disturbs less than wall time.

    .venv/bin/python bench/parallel.py --fanout [--items 10000] [--rounds 5] [--no-pg]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import (  # bench/_common.py (takes bench/ off the path)
    fmt_time,
    median_ratio,
    save_results,
    table,
)

import pitstop


async def sleepy(x: int) -> int:
    await asyncio.sleep(0.05)
    return x


async def instant(x: int) -> int:
    return x


def instant_sync(x: int) -> int:
    return x


class Timed:
    """A workflow of one step whose body is timed from inside (no run start/finish cost)."""

    def __init__(self, store: pitstop.Store, name: str, body: Callable[..., Any]) -> None:
        self.store = store
        self.seconds = 0.0
        self.wf = pitstop.Workflow(name)
        timed = self

        if asyncio.iscoroutinefunction(body):

            @self.wf.step(name="fan")
            async def fan_async(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
                t0 = time.perf_counter()
                out = await body(ctx)
                timed.seconds = time.perf_counter() - t0
                return {"n": len(out)}
        else:

            @self.wf.step(name="fan")
            def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
                t0 = time.perf_counter()
                out = body(ctx)
                timed.seconds = time.perf_counter() - t0
                return {"n": len(out)}

    def once(self) -> float:
        if asyncio.iscoroutinefunction(self.wf.steps["fan"].fn):
            result = asyncio.run(self.wf.astart(self.store, {}))
        else:
            result = self.wf.start(self.store, {})
        assert result.status is pitstop.RunStatus.COMPLETED, result.error
        return self.seconds


def floor_async(fn: Callable[[int], Coroutine[Any, Any, int]], n: int, concurrency: int) -> float:
    async def main() -> float:
        gate = asyncio.Semaphore(concurrency)

        async def one(x: int) -> int:
            async with gate:
                return await fn(x)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(x) for x in range(n)))
        return time.perf_counter() - t0

    return asyncio.run(main())


def floor_threads(n: int, concurrency: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(instant_sync, range(n)))
    return time.perf_counter() - t0


def primitives(store: pitstop.Store, n: int = 200) -> dict[str, float]:
    """What one write and one thread hop cost right now: the load the figures were taken
    under, since a map one item at a time pays one of each per item."""
    store.create_run("primitives", exist_ok=True)
    t0 = time.perf_counter()
    for i in range(n):
        store.record_effects("primitives", {f"k{time.time_ns()}-{i}": i})
    commit = (time.perf_counter() - t0) / n

    async def hops() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await asyncio.to_thread(int)
        return (time.perf_counter() - t0) / n

    return {"one SQLite write (1 row)": commit, "one asyncio.to_thread hop": asyncio.run(hops())}


# -- 3. a thousand children on PostgreSQL -------------------------------------------------------

leaf = pitstop.Workflow("bench-leaf")


@leaf.step
def leaf_work(state: dict[str, Any]) -> dict[str, Any]:
    return {"y": state["x"] * 2}


trunk = pitstop.Workflow("bench-trunk")


@trunk.step
def trunk_fan(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    with open(state["log"], "a") as f:  # one line per execution of the step: the wake-ups
        f.write(f"{time.time()}\n")
    results = ctx.run_children([(leaf, {"x": i}) for i in range(state["kids"])])
    return {"total": sum(r.state["y"] for r in results)}


WORKER = """
import sys
sys.path.insert(0, "bench")
import parallel, pitstop
store = pitstop.open_store(sys.argv[1])
pitstop.Worker(store, [parallel.trunk, parallel.leaf], concurrency=1, poll_interval=1.0).run()
"""


def show_in_process(url: str, run_id: str = "trunk") -> float:
    """``pitstop show RUN`` run in this process (no interpreter start), output discarded."""
    import contextlib
    import io

    from pitstop.cli.app import run

    os.environ["PITSTOP_STORE"] = url
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = run(["show", run_id])
    assert code == 0
    return time.perf_counter() - t0


def children_bench(kids: int, workers: int) -> None:
    import psycopg

    base = os.environ.get("PITSTOP_BENCH_POSTGRES_URL",
                          "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    url = f"{base}{'&' if '?' in base else '?'}schema={schema}"
    root = Path(__file__).resolve().parent.parent
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, pitstop.open_store(url) as store:
            log = Path(tmp) / "wakes.log"
            trunk.enqueue(store, {"kids": kids, "log": str(log)}, run_id="trunk")
            t0 = time.perf_counter()
            procs = [subprocess.Popen([sys.executable, "-c", WORKER, url], cwd=root,
                                      stderr=subprocess.DEVNULL) for _ in range(workers)]
            started = None
            while store.get_run("trunk").status is not pitstop.RunStatus.COMPLETED:
                if started is None and store.get_run("trunk").status.value == "waiting":
                    started = time.perf_counter() - t0
                time.sleep(0.05)
            wall = time.perf_counter() - t0
            counts = store.count_runs(parent_run="trunk")
            head = store.latest("trunk")
            assert head is not None
            assert head.state["total"] == kids * (kids - 1)
            executions = len(log.read_text().splitlines())
            show, cpu, inside, alone = [], [], [], []
            exe = str(Path(sys.executable).with_name("pitstop"))
            cpu_alone: list[float] = []
            for _ in range(6):
                for run_id, walls, cpus in (("trunk", show, cpu), ("trunk.0-0", [], cpu_alone)):
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t1 = time.perf_counter()
                    subprocess.run([exe, "show", run_id],
                                   env={**os.environ, "PITSTOP_STORE": url},
                                   check=True, capture_output=True)
                    walls.append(time.perf_counter() - t1)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpus.append(after.ru_utime + after.ru_stime
                                - before.ru_utime - before.ru_stime)
                inside.append(show_in_process(url))
                alone.append(show_in_process(url, "trunk.0-0"))
            cpu_alone = cpu_alone[1:]
            show, cpu, inside, alone = show[1:], cpu[1:], inside[1:], alone[1:]  # warm-up
            from pitstop.cli.children import Family

            t1 = time.perf_counter()
            Family.of(store, store.get_run("trunk"))
            family = time.perf_counter() - t1
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    rows = [
        ["children", str(kids), ""],
        ["children completed", str(counts.get("completed", 0)), str(kids)],
        ["worker processes (concurrency 1 each)", str(workers), ""],
        ["parent waiting after (children started)",
         fmt_time(started) if started is not None else "-", ""],
        ["wall time until the parent completed", fmt_time(wall), ""],
        ["executions of the parent's step", str(executions), "2 (woken once)"],
        ["`pitstop show PARENT` (command, wall, median of 5)", fmt_time(statistics.median(show)),
         "< 0.5 s"],
        ["  CPU time of that process (user + sys)", fmt_time(statistics.median(cpu)), ""],
        ["  CPU time of `pitstop show CHILD` (no children)",
         fmt_time(statistics.median(cpu_alone)), ""],
        ["  what the 1,000 children add (PARENT - CHILD, in-process)",
         fmt_time(statistics.median(inside) - statistics.median(alone)), ""],
        ["  the command in-process (opening the store included)",
         fmt_time(statistics.median(inside)), ""],
        ["  the same for a run without children (a child)",
         fmt_time(statistics.median(alone)), ""],
        ["  of which the children summary (1 statement)", fmt_time(family), ""],
    ]
    markdown = (f"A parent with {kids} children on PostgreSQL, {workers} workers:\n\n"
                + table(["measure", "value", "target"], rows))
    print(markdown)
    data = {"kids": kids, "workers": workers, "wall_seconds": wall,
            "parent_executions": executions, "show_seconds": statistics.median(show),
            "show_cpu_seconds": statistics.median(cpu),
            "show_in_process_seconds": statistics.median(inside),
            "completed": counts.get("completed", 0)}
    print("\nresults:", save_results("parallel-children", "bench/parallel.py --children",
                                      data, markdown))


# -- 4. fan-out items against a plain thread pool -------------------------------------------


def _json_document() -> str:
    import json
    import random
    import string

    rng = random.Random(33)
    rows = [{"id": i, "name": "".join(rng.choices(string.ascii_letters, k=20)),
             "score": rng.random(), "tags": ["a", "b"]} for i in range(345)]
    return json.dumps(rows)


def fanout_bench(items: int, rounds: int, with_pg: bool) -> None:
    import json

    document = _json_document()

    def parse(i: int) -> int:
        return len(json.loads(document)) + i

    def tiny(i: int) -> int:
        return i

    def plain(fn: Callable[[int], int], n: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(fn, range(n)))
        return time.perf_counter() - t0, time.process_time() - c0

    def mapped(store: pitstop.Store, fn: Callable[[int], int], n: int) -> Callable[[], Any]:
        wf = pitstop.Workflow(f"fan-{fn.__name__}")
        box: dict[str, tuple[float, float]] = {}

        @wf.step
        def fan(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            out = ctx.map(fn, range(n), concurrency=4)
            box["t"] = (time.perf_counter() - t0, time.process_time() - c0)
            return {"n": len(out)}

        def once() -> tuple[float, float]:
            result = wf.start(store, {})
            assert result.status is pitstop.RunStatus.COMPLETED, result.error
            return box["t"]

        return once

    backends = ["sqlite", *(["postgres"] if with_pg else [])]
    rows: list[list[str]] = []
    data: dict[str, Any] = {"items": items, "rounds": rounds, "document_bytes": len(document)}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            schema = f"bench_{uuid.uuid4().hex[:10]}"
            base = os.environ.get("PITSTOP_BENCH_POSTGRES_URL",
                                  "postgresql://postgres@127.0.0.1:5432/test")
            url = (f"sqlite:///{Path(tmp) / 'fan.db'}" if backend == "sqlite"
                   else f"{base}{'&' if '?' in base else '?'}schema={schema}")
            try:
                with pitstop.open_store(url) as store:
                    for label, fn, n in (("32 KiB JSON items", parse, items),
                                         ("tiny items", tiny, items)):
                        run = mapped(store, fn, n)
                        run(), plain(fn, n)  # warm-up
                        walls, cpus = [], []
                        plain_walls, plain_cpus = [], []
                        for _ in range(rounds):
                            w, c = plain(fn, n)
                            plain_walls.append(w)
                            plain_cpus.append(c)
                            w, c = run()
                            walls.append(w)
                            cpus.append(c)
                        ratio = median_ratio(walls, plain_walls)
                        cpu_ratio = statistics.median(cpus) / statistics.median(plain_cpus)
                        per_item = (statistics.median(walls) - statistics.median(plain_walls)) / n
                        cpu_item = (statistics.median(cpus) - statistics.median(plain_cpus)) / n
                        target = "<= 1.10x" if fn is parse else "<= 10 µs an item"
                        rows.append([backend, label, fmt_time(statistics.median(plain_walls)),
                                     fmt_time(statistics.median(walls)), f"{ratio:.2f}x",
                                     f"{cpu_ratio:.2f}x",
                                     f"{per_item * 1e6:.1f} µs / {cpu_item * 1e6:.1f} µs",
                                     target])
                        data[f"{backend} {label}"] = {
                            "plain_s": statistics.median(plain_walls),
                            "map_s": statistics.median(walls), "wall_ratio": ratio,
                            "cpu_ratio": cpu_ratio, "per_item_s": per_item,
                            "cpu_per_item_s": cpu_item}
            finally:
                if backend == "postgres":
                    import psycopg

                    with psycopg.connect(base, autocommit=True) as conn:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    load = os.getloadavg()[0]
    markdown = (
        f"ctx.map(concurrency=4) over {items:,} items against ThreadPoolExecutor(4) (median "
        f"of {rounds} interleaved rounds, load {load:.1f} at the end):\n\n"
        + table(["backend", "items", "thread pool", "ctx.map", "wall ratio", "CPU ratio",
                 "overhead an item (wall / CPU)", "target"], rows)
    )
    print(markdown)
    data["load"] = load
    print("\nresults:", save_results("parallel-fanout", "bench/parallel.py --fanout",
                                      data, markdown))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--children", action="store_true",
                        help="the child-runs benchmark on PostgreSQL instead")
    parser.add_argument("--kids", type=int, default=1000, help="children (with --children)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--fanout", action="store_true",
                        help="ctx.map over many small items against a plain thread pool")
    parser.add_argument("--items", type=int, default=10_000, help="items (with --fanout)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (with --fanout)")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only (with --fanout)")
    args = parser.parse_args()
    if args.fanout:
        fanout_bench(args.items, args.rounds, not args.no_pg)
        return
    if args.children:
        children_bench(args.kids, args.workers)
        return
    rounds = 5 if args.quick else 15
    items = 500  # per overhead measurement

    with tempfile.TemporaryDirectory() as tmp:
        store = pitstop.open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")

        async def amap_sleepy(ctx: pitstop.StepContext) -> list[Any]:
            return await ctx.amap(sleepy, range(100), concurrency=20)

        def map_sleepy(ctx: pitstop.StepContext) -> list[Any]:
            return ctx.map(sleepy, range(100), concurrency=20)

        def amap_instant(concurrency: int) -> Callable[..., Any]:
            async def body(ctx: pitstop.StepContext) -> list[Any]:
                return await ctx.amap(instant, range(items), concurrency=concurrency)

            return body

        def map_threads(ctx: pitstop.StepContext) -> list[Any]:
            return ctx.map(instant_sync, range(items), concurrency=8)

        async def by_hand(ctx: pitstop.StepContext) -> list[Any]:
            gate = asyncio.Semaphore(20)

            async def one(x: int) -> Any:
                async with gate:
                    return await ctx.aeffect(f"item-{x}", instant, x)

            return await asyncio.gather(*(one(x) for x in range(items)))

        wall = {
            "await ctx.amap (async step)": Timed(store, "wall-amap", amap_sleepy),
            "ctx.map (sync step)": Timed(store, "wall-map", map_sleepy),
        }
        overhead = {
            "async, concurrency 20": (Timed(store, "ov-a20", amap_instant(20)),
                                      lambda: floor_async(instant, items, 20)),
            "async, concurrency 1": (Timed(store, "ov-a1", amap_instant(1)),
                                     lambda: floor_async(instant, items, 1)),
            "sync threads, concurrency 8": (Timed(store, "ov-t8", map_threads),
                                            lambda: floor_threads(items, 8)),
            "ctx.aeffect per item (by hand), concurrency 20": (
                Timed(store, "ov-hand", by_hand), lambda: floor_async(instant, items, 20)),
        }
        samples: dict[str, list[float]] = {name: [] for name in [*wall, "floor (asyncio)"]}
        per_item: dict[str, list[float]] = {name: [] for name in overhead}
        for _ in range(2):  # warm-up
            for timed in wall.values():
                timed.once()
            for timed, floor in overhead.values():
                timed.once()
                floor()
        reference: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, seconds in primitives(store).items():
                reference.setdefault(name, []).append(seconds)
            samples["floor (asyncio)"].append(floor_async(sleepy, 100, 20))
            for name, timed in wall.items():
                samples[name].append(timed.once())
            for name, (timed, floor) in overhead.items():
                mapped = timed.once()
                per_item[name].append((mapped - floor()) / items)
        store.close()

    wall_rows = [
        [name, fmt_time(statistics.median(s)), "<= 0.4 s" if name != "floor (asyncio)" else ""]
        for name, s in samples.items()
    ]
    over_rows = [[name, fmt_time(statistics.median(s)), "<= 0.2 ms"] for name, s in
                 per_item.items()]
    over_rows += [[f"(reference) {name}", fmt_time(statistics.median(s)), ""]
                  for name, s in reference.items()]
    markdown = (
        "100 async items x 50 ms, concurrency=20 (median of "
        f"{rounds} rounds):\n\n"
        + table(["variant", "wall time", "target"], wall_rows)
        + f"\n\nRecording overhead per item on SQLite ({items} items that return at once, "
        "minus the same items without pitstop):\n\n"
        + table(["variant", "per item", "target"], over_rows)
    )
    print(markdown)
    data = {
        "wall_seconds": {k: statistics.median(v) for k, v in samples.items()},
        "overhead_per_item_seconds": {k: statistics.median(v) for k, v in per_item.items()},
        "reference_seconds": {k: statistics.median(v) for k, v in reference.items()},
        "rounds": rounds,
    }
    print("\nresults:", save_results("parallel", "bench/parallel.py", data, markdown))


if __name__ == "__main__":
    main()
