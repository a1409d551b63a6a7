"""Result cache, rerun and schedules benchmark (issue #28).

    .venv/bin/python bench/cache.py              # 1-3
    .venv/bin/python bench/cache.py --quick
    .venv/bin/python bench/cache.py --rerun-only --prefect-python /path/to/venv/bin/python
    .venv/bin/python bench/cache.py --schedule   # 4: the 500-tick kill run (~9 minutes)

1. Rerun to the first uncached step (target: <= 100 ms, including opening the store, and
   >= 70x Prefect 3): a 100-step workflow whose steps all have a CachePolicy ran once; a
   fresh process then opens the SQLite store and reruns it from its first step with one
   field edited that only the last step reads, until that step starts. Timed from opening
   the store, and from the process's first line. Prefect side by side in the same run, its
   rounds interleaved with ours: a fresh process runs the flow whose 100 tasks are cached
   until its uncached task starts, timed from calling the flow (which starts its API
   server), and from the process's first line. ``--prefect-python`` names an interpreter
   that has Prefect (its own virtualenv); if it cannot import Prefect the reason is printed.
   Medians, and medians of the per-round ratios.
2. Cache lookup overhead per step on SQLite (target: <= 0.2 ms): a 200-step run whose steps
   are all served from the cache, against the same run with steps that do the work (a no-op)
   without a policy, both checkpointing every step; (cached - plain) / steps. Beside it the
   all-cached run under the default policy (served steps share one checkpoint). Interleaved
   rounds, medians.
3. Single flight on PostgreSQL (target: the function runs once): 4 worker processes, 200
   queued runs that all need the same key; the step counts its executions in a table.
4. ``--schedule``: 4 `pitstop worker` processes, a 1-second schedule over 500 ticks, a worker
   SIGKILLed and replaced every 0.3-1.5 s: the runs per tick (target: exactly one each).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# bench/_common.py (takes bench/ off the path)
from _common import fmt_time, median_ratio, save_results, table

import pitstop

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("PITSTOP_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

STEPS_FLOW = '''
import pitstop
wf = pitstop.Workflow("hundred")

def make(i):
    def step(state):
        return {f"out{i}": state.get(f"out{i-1}", 0) + 1 if i else 1}
    step.__name__ = f"s{i:03d}"
    return step

for i in range(100):
    inputs = ["edited"] if i == 99 else ([f"out{i-1}"] if i else ["seed"])
    wf.step(cache=pitstop.CachePolicy(inputs=inputs, version="1"))(make(i))
'''

RERUN = '''
import time
started = time.perf_counter()
import dataclasses, sys
sys.path.insert(0, {path!r})
import pitstop, flows

def first_uncached(state):
    print(time.perf_counter() - started, time.perf_counter() - opening, flush=True)
    raise SystemExit(0)

flows.wf.steps["s099"] = dataclasses.replace(flows.wf.steps["s099"], fn=first_uncached)
opening = time.perf_counter()
store = pitstop.open_store({url!r})
flows.wf.rerun(store, {first!r}, from_step="s000", update={{"edited": {n}}})
'''

PREFECT_FLOW = '''
import sys, time
t0 = time.perf_counter()
from prefect import flow, task
from prefect.cache_policies import INPUTS

@task(cache_policy=INPUTS, persist_result=True)
def step(i, value):
    print("COMPUTED", i, flush=True)  # a cached rerun prints none of these
    return value + 1

@task
def fresh(edited):
    now = time.perf_counter()
    print("FIRST_UNCACHED", now - t0, now - called, flush=True)
    return edited

@flow
def hundred(edited):
    value = 0
    for i in range(100):
        value = step(i, value)
    return fresh(edited)

called = time.perf_counter()
hundred(int(sys.argv[1]))
'''


class PitstopRerun:
    """Side 1 of the rerun comparison: each round a fresh process opens the SQLite store and
    reruns the 100-step workflow until its last (uncached) step starts."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="pitstop-bench-cache-"))
        (self.tmp / "flows.py").write_text(STEPS_FLOW)
        self.url = f"sqlite:///{self.tmp}/bench.db"
        sys.path.insert(0, str(self.tmp))
        import flows  # type: ignore[import-not-found]

        sys.path.remove(str(self.tmp))
        with pitstop.open_store(self.url) as store:
            self.first = flows.wf.start(store, {"seed": 1, "edited": 0}).run_id
        # Bytecode as an installed package has it: with PYTHONDONTWRITEBYTECODE set (as on
        # the machine these figures were first taken on) every fresh process compiled
        # pitstop's sources again, ~140 ms of the 340 ms measured. A round before the
        # measured ones writes the bytecode into a private prefix.
        self.env = {key: value for key, value in os.environ.items()
                    if key != "PYTHONDONTWRITEBYTECODE"}
        self.env["PYTHONPYCACHEPREFIX"] = str(self.tmp / "pycache")
        self.edits = 0
        self.round()

    def round(self) -> tuple[float, float]:
        """(seconds from the process's first line, seconds from opening the store)."""
        self.edits += 1
        code = RERUN.format(path=str(self.tmp), url=self.url, first=self.first, n=self.edits)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env=self.env)
        whole, opened = map(float, out.stdout.split())
        return whole, opened


class PrefectRerun:
    """Side 2: Prefect 3 in the interpreter ``python`` (its own virtualenv), its ephemeral
    API server on SQLite; each round a fresh process runs the flow whose 100 tasks are
    cached (INPUTS policy, persisted results) until its uncached task starts."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.error: str | None = None
        self.version = ""
        probe = subprocess.run([python, "-c", "import prefect; print(prefect.__version__)"],
                               capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            self.error = (probe.stderr.strip().splitlines() or ["?"])[-1]
            return
        self.version = probe.stdout.strip()
        self.tmp = Path(tempfile.mkdtemp(prefix="prefect-bench-"))
        (self.tmp / "flow.py").write_text(PREFECT_FLOW)
        self.env = {**os.environ, "PREFECT_HOME": str(self.tmp / "home"),
                    "PREFECT_API_DATABASE_CONNECTION_URL":
                        f"sqlite+aiosqlite:///{self.tmp}/prefect.db",
                    "PREFECT_LOGGING_LEVEL": "ERROR", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    # Its default 20 s is not enough for the server to start on a loaded
                    # machine: the flow then fails instead of being slow.
                    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600"}
        self.edits = 0
        self._run(rerun=False)  # fills the cache (and writes the bytecode)

    def _run(self, *, rerun: bool = True) -> tuple[float, float]:
        # Prefect's ephemeral server may log errors while it shuts down and exit non-zero
        # after the flow finished: the figure is the line the first uncached task printed.
        done = subprocess.run([self.python, str(self.tmp / "flow.py"), str(self.edits)],
                              env=self.env, cwd=self.tmp, capture_output=True, text=True,
                              timeout=600, check=False)
        self.edits += 1
        lines = done.stdout.splitlines()
        figures = [line.split() for line in lines if line.startswith("FIRST_UNCACHED")]
        if not figures:
            raise RuntimeError(f"Prefect's flow printed no figure: {done.stderr[-300:]}")
        computed = sum(line.startswith("COMPUTED") for line in lines)
        if rerun and computed:
            raise RuntimeError(f"Prefect's rerun computed {computed} of its cached tasks")
        return float(figures[-1][1]), float(figures[-1][2])

    def round(self) -> tuple[float, float]:
        """(seconds from the process's first line, seconds from calling the flow)."""
        return self._run()


def rerun_side_by_side(rounds: int, prefect_python: str) -> dict[str, Any]:
    """Both sides in one run, their rounds interleaved: medians, and medians of the
    per-round ratios (each round's pair ran close together, so a slow spell of the shared
    machine falls on both)."""
    ours, theirs = PitstopRerun(), PrefectRerun(prefect_python)
    process, opened, p_process, p_called = [], [], [], []
    for _ in range(rounds):
        whole, from_open = ours.round()
        process.append(whole)
        opened.append(from_open)
        if theirs.error is None:
            p_whole, p_from_call = theirs.round()
            p_process.append(p_whole)
            p_called.append(p_from_call)
    result: dict[str, Any] = {
        "process_s": statistics.median(process), "pitstop_s": statistics.median(opened),
        "samples": opened, "process_samples": process,
    }
    if theirs.error is not None:
        result["prefect"] = {"error": theirs.error}
        return result
    result["prefect"] = {
        "version": theirs.version, "prefect_s": statistics.median(p_called),
        "process_s": statistics.median(p_process), "samples": p_called,
        "process_samples": p_process,
        # Like for like: from opening the store (Prefect: calling the flow, which starts
        # its API server and opens its database), imports not counted; and from each
        # process's first line, imports included.
        "ratio": median_ratio(p_called, opened),
        "process_ratio": median_ratio(p_process, process),
    }
    return result


def _returns(i: int) -> Any:
    def step(state: dict[str, Any]) -> dict[str, Any]:
        return {"x": i}

    return step


def lookup_overhead(rounds: int, steps: int = 200) -> dict[str, Any]:
    # checkpoint=True on every step of both: a run of steps served from the cache writes
    # one checkpoint where the policy would write one per step (they are not counted), so
    # without it the difference would be the checkpoints saved, not the lookup's cost.
    def build(cached: bool, every: bool = True) -> pitstop.Workflow:
        wf = pitstop.Workflow(("cached" if cached else "plain") + ("" if every else "-policy"))
        for i in range(steps):
            wf.step(name=f"s{i}", checkpoint=True if every else None,
                    cache=pitstop.CachePolicy(inputs=["seed"], version="1")
                    if cached else None)(_returns(i))
        return wf

    tmp = tempfile.mkdtemp(prefix="pitstop-bench-lookup-")
    store = pitstop.open_store(f"sqlite:///{tmp}/lookup.db")
    cached, plain, served = build(True), build(False), build(True, every=False)
    cached.start(store, {"seed": 1})  # fills the cache
    served.start(store, {"seed": 1})
    cached_s, plain_s, served_s = [], [], []
    for _ in range(rounds):
        for wf, samples in ((plain, plain_s), (cached, cached_s), (served, served_s)):
            t0 = time.perf_counter()
            wf.start(store, {"seed": 1})
            samples.append(time.perf_counter() - t0)
    store.close()
    cached_m, plain_m = statistics.median(cached_s), statistics.median(plain_s)
    return {"steps": steps, "cached_s": cached_m, "plain_s": plain_m,
            "per_step_s": (cached_m - plain_m) / steps,
            "served_s": statistics.median(served_s)}


FLIGHT_FLOW = '''
import time, pitstop, psycopg, os
wf = pitstop.Workflow("flight")

@wf.step(cache=pitstop.CachePolicy(inputs=["key"], version="1"))
def expensive(state):
    with psycopg.connect(os.environ["COUNT_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO flight_calls VALUES (1)")
    time.sleep(2.0)
    return {"value": 42}
'''


def single_flight(runs: int = 200, workers: int = 4) -> dict[str, Any]:
    import psycopg

    schema = "bench_flight_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.flight_calls (n int)")
    url = f"{PG_URL}?schema={schema}"
    count_url = f"{PG_URL}?options=-csearch_path%3D{schema}"
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-bench-flight-"))
    (tmp / "flightflow.py").write_text(FLIGHT_FLOW)
    sys.path.insert(0, str(tmp))
    import flightflow  # type: ignore[import-not-found]

    sys.path.remove(str(tmp))
    try:
        with pitstop.open_store(url) as store:
            for i in range(runs):
                flightflow.wf.enqueue(store, {"key": "same", "i": i})
        env = {**os.environ, "PITSTOP_STORE": url, "COUNT_URL": count_url}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "pitstop", "worker", "--workflow",
                                   "flightflow:wf", "--until-idle", "--concurrency", "8"],
                                  cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(workers)]
        for p in procs:
            p.wait(600)
        wall = time.perf_counter() - t0
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            calls = conn.execute(f"SELECT COUNT(*) FROM {schema}.flight_calls").fetchone()
        with pitstop.open_store(url) as store:
            completed = store.stats().runs_by_status.get("completed", 0)
        return {"runs": runs, "workers": workers, "calls": int(calls[0]) if calls else -1,
                "completed": completed, "wall_s": wall}
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


TICK_FLOW = '''
import pitstop
wf = pitstop.Workflow("ticks")

@wf.step
def go(state):
    return {"done": True}
'''


def schedule_kill(ticks: int = 500, workers: int = 4) -> dict[str, Any]:
    from pitstop.runtime.schedules import run_id_for

    tmp = Path(tempfile.mkdtemp(prefix="pitstop-bench-ticks-"))
    (tmp / "tickflow.py").write_text(TICK_FLOW)
    url = f"sqlite:///{tmp}/ticks.db"
    sys.path.insert(0, str(tmp))
    import tickflow  # type: ignore[import-not-found]

    sys.path.remove(str(tmp))
    with pitstop.open_store(url) as store:
        tickflow.wf.schedule(store, "bench", cron="* * * * * *", catchup="all", overlap="allow")
        first = store.schedule_rows(name="bench")[0].next_tick
    env = {**os.environ, "PITSTOP_STORE": url}

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "pitstop", "worker", "--workflow",
                                 "tickflow:wf", "--poll", "0.2"], cwd=tmp, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    procs = [spawn() for _ in range(workers)]
    rng = random.Random(500)
    kills = 0
    try:
        while time.time() < first + ticks:
            time.sleep(rng.uniform(0.3, 1.5))
            victim = procs.pop(rng.randrange(len(procs)))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills += 1
            procs.append(spawn())
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
    with pitstop.open_store(url) as store:
        upto = store.schedule_rows(name="bench")[0].next_tick
        found = {r.id for r in store.runs(limit=None) if r.id.startswith("bench@")}
    expected = {run_id_for("bench", first + i) for i in range(int(upto - first))}
    return {"ticks": len(expected), "runs": len(found), "kills": kills,
            "missing": len(expected - found), "extra": len(found - expected)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--schedule", action="store_true", help="only the 500-tick kill run")
    parser.add_argument("--ticks", type=int, default=500, help="ticks of --schedule")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--rerun-only", action="store_true",
                        help="only 1, the rerun side by side with Prefect")
    parser.add_argument("--prefect-python", default=os.environ.get("PREFECT_PYTHON",
                                                                   sys.executable),
                        help="an interpreter that has Prefect 3 (its own virtualenv: "
                             "Prefect pins versions pitstop's may not share); default "
                             "$PREFECT_PYTHON, else this one")
    args = parser.parse_args()
    if args.schedule:
        result = schedule_kill(ticks=args.ticks)
        print(result)
        save_results("cache-schedule", " ".join(sys.argv), result, str(result))
        return
    rounds = 3 if args.quick else 7
    rerun = rerun_side_by_side(rounds, args.prefect_python)
    prefect = rerun.pop("prefect")
    ran = "prefect_s" in prefect
    rows = [["rerun of 100 cached steps to the first uncached step, from opening the store "
             "(Prefect: from calling the flow, which starts its API server)",
             fmt_time(rerun["pitstop_s"]),
             fmt_time(prefect["prefect_s"]) if ran else "n/a",
             f"{prefect['ratio']:.0f}x" if ran else prefect.get("error", "")],
            ["the same, from the process's first line (imports included)",
             fmt_time(rerun["process_s"]),
             fmt_time(prefect["process_s"]) if ran else "n/a",
             f"{prefect['process_ratio']:.0f}x" if ran else ""]]
    lookup: dict[str, Any] = {}
    if not args.rerun_only:
        lookup = lookup_overhead(rounds)
        rows += [["cache lookup per step, SQLite (both runs checkpoint every step)",
                  fmt_time(lookup["per_step_s"]), "", ""],
                 [f"{lookup['steps']} steps all served from the cache, default policy (a "
                  f"plain run of them, checkpoint per step: {fmt_time(lookup['plain_s'])})",
                  fmt_time(lookup["served_s"]), "",
                  f"{lookup['plain_s'] / lookup['served_s']:.1f}x faster than running them"]]
    flight: dict[str, Any] = {}
    if not args.no_postgres and not args.rerun_only:
        flight = single_flight(runs=60 if args.quick else 200)
        rows.append([f"{flight['runs']} runs, {flight['workers']} workers (PG), same key: "
                     "function executions", str(flight["calls"]), "",
                     f"{flight['completed']} completed in {fmt_time(flight['wall_s'])}"])
    peer = f"Prefect {prefect['version']}" if ran else "Prefect"
    markdown = table(["measure", "pitstop", peer, "ratio / note"], rows)
    print(markdown)
    save_results("cache", " ".join(sys.argv),
                 {"rerun": rerun, "prefect": prefect, "lookup": lookup, "flight": flight},
                 markdown)


if __name__ == "__main__":
    main()
