"""The ceiling (issue #33, target 6): small workflow steps per second on one PostgreSQL server
with 1, 2 and 4 worker processes, against ``pgbench`` running the statement a step runs.

    .venv/bin/python bench/ceiling.py [--rounds 5] [--steps 1500]

1. **What a step sends.** One run of the benchmark's loop is traced at the driver (every
   ``psycopg.Cursor.execute``/``executemany`` call, pipelined ones included, with its
   parameters): how many statements a steady step sends, and the statement itself.
2. **pitstop.** N worker processes (real processes, each with its own store and its own run)
   each run ``--steps`` steps of the no-op loop on the ~1 KiB state (``bench/_common.py``,
   durability ``normal``: ``synchronous_commit = off``), started together once all are up;
   steps per second over all of them, from the start signal to the last one's end. Each
   process also reports its own CPU per step and that of its server backends (read from
   ``/proc``: the server is on this machine).
3. **psycopg.** The floor of a Python client: N processes each sending that statement with
   the traced step's parameters (the ids, step and expected head computed per transaction)
   through one autocommit psycopg connection, nothing else; their CPU and their backends'.
4. **pgbench.** The same statement as a custom script (written to a temporary file at bench
   time), ``-M prepared`` (psycopg prepares a statement it has run 5 times): every parameter
   psycopg sends is a parameter here too, cast to psycopg's type, the traced step's values as
   ``-D`` variables, and the new id, the run, the expected head and the step number computed
   per transaction so each one moves its client's run's head as a step does;
   ``synchronous_commit = off`` like ``normal``; the same client count and transactions per
   client. Its backends' CPU is sampled from ``/proc`` while they run (CPU per second over
   the rate).

Rounds are interleaved (1, 2, 4 clients; pitstop, psycopg, pgbench, the order reversing
every other turn); each ratio is the median of per-round ratios of neighbours in time. The
machine has 2 cores shared with the server and other work: the load average is printed with
each round, and each pitstop worker reports how long it waited for a CPU per step (the run
queue, ``/proc/self/schedstat``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import (
    POSTGRES_URL,  # bench/_common.py (takes bench/ off sys.path)
    base_state,
    noop,
    save_results,
    table,
)

import pitstop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_URL = POSTGRES_URL
CLIENTS = (1, 2, 4)


def proc_cpu(pid: int) -> float:
    """Seconds process ``pid`` has run on a CPU (``/proc/PID/schedstat``, in nanoseconds:
    a clock tick of ``/proc/PID/stat`` is 10 ms, a few hundred steps), or 0 if it is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def backend_pids(url: str, application_name: str) -> list[int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchall()
    return [int(pid) for (pid,) in rows]


def schema_url(url: str) -> tuple[str, str]:
    name = f"ceiling_{uuid.uuid4().hex[:10]}"
    return f"{url}{'&' if '?' in url else '?'}schema={name}", name


def drop_schema(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


# -- 1. what a step sends ---------------------------------------------------------------------

def trace_steps(url: str, steps: int = 40) -> tuple[float, str, list[Any]]:
    """(statements per steady step, the step's statement, its parameters) from one traced
    run: the statements sent between the 10th step and the last-but-one."""
    import psycopg

    sent: list[tuple[str, Any]] = []
    marks: dict[int, int] = {}
    originals = {name: getattr(psycopg.Cursor, name) for name in ("execute", "executemany")}

    def traced(name: str) -> Any:
        def call(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
            sent.append((str(query), params))
            return originals[name](self, query, params, *args, **kwargs)
        return call

    store_url, name = schema_url(url)
    try:
        with pitstop.open_store(store_url) as store:
            wf = pitstop.Workflow("bench-normal")  # pitstop_loop's, counting statements

            @wf.step
            def work(state: dict[str, Any]) -> Any:
                marks[state["i"]] = len(sent)
                update = noop(state)
                return pitstop.goto("work", update) if update["i"] < steps else update

            for attr, fn in ((n, traced(n)) for n in originals):
                setattr(psycopg.Cursor, attr, fn)
            try:
                wf.start(store, base_state())
            finally:
                for attr, fn in originals.items():
                    setattr(psycopg.Cursor, attr, fn)
    finally:
        drop_schema(url, name)
    first, last = 10, steps - 2
    window = sent[marks[first]:marks[last]]
    statement, params = window[-1]
    return len(window) / (last - first), statement, list(params)


# -- 2. pitstop -------------------------------------------------------------------------------

WORKER = """
import os, resource, sys, time
sys.path.insert(0, sys.argv[2])
from ceiling import backend_pids, proc_cpu  # first: _common takes bench/ off sys.path
from _common import base_state, pitstop_loop
import pitstop
store_url, _, go, steps, app = sys.argv[1:6]
store = pitstop.open_store(store_url + "&application_name=" + app)
store.stats()  # connected before the clock starts
wf = pitstop_loop(int(steps))
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
pids = backend_pids(store_url.split("?")[0], app)
server0 = sum(proc_cpu(p) for p in pids)
usage0 = resource.getrusage(resource.RUSAGE_SELF)
waited0 = int(open("/proc/self/schedstat").read().split()[1])
wf.start(store, base_state())
usage1 = resource.getrusage(resource.RUSAGE_SELF)
waited = (int(open("/proc/self/schedstat").read().split()[1]) - waited0) / 1e9
end = time.time()
server = sum(proc_cpu(p) for p in backend_pids(store_url.split("?")[0], app)) - server0
client = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
print(end, client, server, waited, flush=True)
store.close()
"""


def pitstop_round(url: str, clients: int, steps: int) -> dict[str, float]:
    store_url, name = schema_url(url)
    try:
        with pitstop.open_store(store_url):
            pass  # the schema, created once and not by the racing workers
        go = Path(tempfile.gettempdir()) / f"ceiling-go-{uuid.uuid4().hex}"
        apps = [f"ceiling-{uuid.uuid4().hex[:8]}" for _ in range(clients)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, store_url, str(HERE), str(go), str(steps), app],
                stdout=subprocess.PIPE, text=True, cwd=ROOT,
            )
            for app in apps
        ]
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        t0 = time.time()
        go.write_text("go")
        ends, client, server, waited = [], 0.0, 0.0, 0.0
        for p in procs:
            out, _ = p.communicate()
            assert p.returncode == 0, out
            end, c, s, w = map(float, out.split())
            ends.append(end)
            client += c
            server += s
            waited += w
        go.unlink()
        total = clients * steps
        return {"rate": total / (max(ends) - t0), "client_us": client / total * 1e6,
                "server_us": server / total * 1e6,
                "runqueue_us": waited / total * 1e6}
    finally:
        drop_schema(url, name)


# -- 2b. the same statement from Python, psycopg alone ---------------------------------------

PSYCOPG = """
import os, pickle, resource, sys, time
import psycopg
url, schema, go, steps, client, spec, here = sys.argv[1:8]
sys.path.insert(0, here)
from ceiling import proc_cpu
statement, params, variables = pickle.loads(bytes.fromhex(spec))
steps, client = int(steps), int(client)
conn = psycopg.connect(url, autocommit=True,
                       options=f"-c search_path={schema} -c synchronous_commit=off")
backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
server0 = proc_cpu(backend)
usage0 = resource.getrusage(resource.RUSAGE_SELF)
run = str(client)
for n in range(1, steps + 1):
    values = {"cur": str(client * 1000000000 + n), "prev": str(client * 1000000000 + n - 1),
              "run": run, "n": n}
    for at, name in variables.items():
        params[at] = values[name]
    if conn.execute(statement, params).rowcount != 1:
        raise SystemExit("the head did not move")
usage1 = resource.getrusage(resource.RUSAGE_SELF)
print(time.time(), (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime),
      proc_cpu(backend) - server0, flush=True)
"""


def prepare_runs(url: str, lease: tuple[str, int], clients: int) -> tuple[str, str]:
    """A fresh store schema with runs "0".."clients-1", each at head ``client * 10^9`` and
    leased as the traced step's run was: what the statement expects to find."""
    import psycopg

    store_url, name = schema_url(url)
    with pitstop.open_store(store_url) as store:
        for c in range(clients):
            store.save(str(c), {"i": 0})
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{name}".pitstop_runs SET head_id = (run_id::bigint * 1000000000)::text, '
            "lease_owner = %s, fence = %s, status = 'running'", lease,
        )
    return store_url, name


def written(url: str, name: str, clients: int, steps: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        (count,) = conn.execute(
            f'SELECT count(*) - %s FROM "{name}".pitstop_checkpoints', (clients,)
        ).fetchone() or (0,)
    assert count == clients * steps, (count, clients * steps)  # every head moved


def psycopg_round(url: str, spec: str, lease: tuple[str, int], clients: int,
                  steps: int) -> dict[str, float]:
    _, name = prepare_runs(url, lease, clients)
    try:
        go = Path(tempfile.gettempdir()) / f"ceiling-go-{uuid.uuid4().hex}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PSYCOPG, url.split("?", maxsplit=1)[0], name, str(go),
                 str(steps), str(c), spec, str(HERE)], stdout=subprocess.PIPE, text=True,
                cwd=ROOT,
            )
            for c in range(clients)
        ]
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        t0 = time.time()
        go.write_text("go")
        ends, client, server = [], 0.0, 0.0
        for p in procs:
            out, _ = p.communicate()
            assert p.returncode == 0, out
            end, c, s = map(float, out.split())
            ends.append(end)
            client += c
            server += s
        go.unlink()
        written(url, name, clients, steps)
        total = clients * steps
        return {"rate": total / (max(ends) - t0), "client_us": client / total * 1e6,
                "server_us": server / total * 1e6}
    finally:
        drop_schema(url, name)


# -- 3. pgbench -------------------------------------------------------------------------------

def find_pgbench() -> str:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None)
    if found is None:
        raise SystemExit("pgbench not found (it comes with the PostgreSQL server)")
    return found


def step_variables(params: list[Any]) -> dict[int, str]:
    """Which of a step statement's parameters change from step to step, by position: the
    head UPDATE's new head, step, run and expected head, and the INSERT's first four columns
    (id, run_id, parent_id, step)."""
    n = len(params)
    assert params[0] == params[n - 11], "not the step statement"
    assert params[5] == params[n - 9], "not the step statement"
    return {0: "cur", 1: "n", 4: "run", 5: "prev", n - 11: "cur", n - 10: "run",
            n - 9: "prev", n - 8: "n"}


_CASTS = {str: "text", int: "bigint", float: "double precision", bytes: "bytea"}


def pgbench_script(statement: str, params: list[Any]) -> tuple[str, list[str]]:
    """The traced step's statement for pgbench, and its ``-D`` definitions. Every parameter
    psycopg sends is a parameter here too (``-M prepared``), cast to the type psycopg gives
    it (pgbench sends its variables untyped): the traced step's values as fixed variables
    ``p0``, ``p1``..., except the new checkpoint's id, the run, the expected head (the
    parent) and the step number, which each transaction computes so it moves its client's
    run's head as a step does (ids are numbers as text: the client's number times 10^9 plus
    its step)."""
    changing = step_variables(params)
    types = {"cur": "text", "run": "text", "prev": "text", "n": "integer"}
    out, defines, at = [], ["n=0"], 0
    for piece in re.split(r"(%[sb])", statement):
        if piece not in ("%s", "%b"):
            out.append(piece)
            continue
        value = params[at]
        if at in changing:
            out.append(f":{changing[at]}::{types[changing[at]]}")
        elif value is None:
            out.append("NULL")
        else:
            text = "\\x" + value.hex() if isinstance(value, bytes) else str(value)
            defines.append(f"p{at}={text}")
            out.append(f":p{at}::{_CASTS[type(value)]}")
        at += 1
    body = "".join(out)
    script = (
        "\\set prev :client_id * 1000000000 + :n\n"
        "\\set n :n + 1\n"
        "\\set cur :client_id * 1000000000 + :n\n"
        "\\set run :client_id\n"
        f"{body};\n"
    )
    return script, defines


def pgbench_round(url: str, pgbench: str, script: tuple[str, list[str]],
                  lease: tuple[str, int], clients: int, steps: int) -> dict[str, float]:
    import psycopg

    _, name = prepare_runs(url, lease, clients)
    app = f"ceiling-pgbench-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
            f.write(script[0])
        env = dict(os.environ, PGAPPNAME=app,
                   PGOPTIONS=f"-c search_path={name} -c synchronous_commit=off")
        seen: dict[int, list[tuple[float, float]]] = {}  # pid -> [(first), (last)] (time, cpu)
        stop = threading.Event()

        def watch() -> None:  # the backends' CPU while they exist: their rate, not a total
            with psycopg.connect(url, autocommit=True) as conn:
                while not stop.is_set():
                    pids = [int(p) for (p,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))]
                    for pid in pids:
                        sample = (time.perf_counter(), proc_cpu(pid))
                        if sample[1]:
                            seen.setdefault(pid, [sample, sample])[1] = sample
                    stop.wait(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        base = url.split("?", maxsplit=1)[0]
        done = subprocess.run(
            [pgbench, "-n", "-M", "prepared", "-f", f.name, "-c", str(clients),
             "-j", str(clients), "-t", str(steps),
             *(arg for define in script[1] for arg in ("-D", define)), base],
            capture_output=True, text=True, env=env, check=False,
        )
        stop.set()
        watcher.join()
        os.unlink(f.name)
        if done.returncode != 0:
            raise SystemExit(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
        tps = float(re.search(r"tps = ([\d.]+) \(without initial", done.stdout).group(1))  # type: ignore[union-attr]
        written(url, name, clients, steps)
        # Server CPU per transaction: the backends' CPU per second while polled, over the rate.
        cpu_per_s = sum((b[1] - a[1]) / (b[0] - a[0]) for a, b in seen.values() if b[0] > a[0])
        return {"rate": tps, "server_us": cpu_per_s / tps * 1e6}
    finally:
        drop_schema(url, name)


def loadavg() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1500, help="steps per client per round")
    args = parser.parse_args()

    pgbench = find_pgbench()
    per_step, statement, params = trace_steps(args.url)
    script = pgbench_script(statement, params)
    lease = (params[6], params[7])  # the traced step's lease owner and fence
    print(f"a steady step sends {per_step:g} statement(s); pgbench script:\n{script[0]}"
          f"with {' '.join(script[1])}")

    import pickle

    variables = step_variables(params)
    spec = pickle.dumps((statement, params, variables)).hex()  # for the psycopg processes
    contenders = ("pitstop", "psycopg", "pgbench")
    samples: dict[int, dict[str, list[dict[str, float]]]] = {
        n: {who: [] for who in contenders} for n in CLIENTS}
    loads = []
    for r in range(args.rounds):
        for n in CLIENTS:
            order = contenders if (r + n) % 2 == 0 else contenders[::-1]
            for who in order:
                load = loadavg()
                loads.append(load)
                if who == "pitstop":
                    got = pitstop_round(args.url, n, args.steps)
                elif who == "psycopg":
                    got = psycopg_round(args.url, spec, lease, n, args.steps)
                else:
                    got = pgbench_round(args.url, pgbench, script, lease, n, args.steps)
                samples[n][who].append(got)
                print(f"round {r + 1} clients {n} {who:8} {got['rate']:8.0f} steps/s "
                      f"load {load:.1f} {got}", flush=True)

    def ratio(n: int, a: str, b: str) -> float:
        return statistics.median(
            x["rate"] / y["rate"] for x, y in zip(samples[n][a], samples[n][b], strict=True))

    rows, results = [], {}
    for n in CLIENTS:
        med = {who: {k: statistics.median(s[k] for s in samples[n][who])
                     for k in samples[n][who][0]} for who in contenders}
        ratios = {"pitstop/pgbench": ratio(n, "pitstop", "pgbench"),
                  "psycopg/pgbench": ratio(n, "psycopg", "pgbench"),
                  "pitstop/psycopg": ratio(n, "pitstop", "psycopg")}
        results[n] = {**med, "ratios": ratios}
        ours = med["pitstop"]
        rows.append([
            str(n), f"{ours['rate']:.0f}", f"{med['psycopg']['rate']:.0f}",
            f"{med['pgbench']['rate']:.0f}", f"{ratios['pitstop/pgbench']:.2f}x",
            f"{ratios['psycopg/pgbench']:.2f}x", f"{ratios['pitstop/psycopg']:.2f}x",
            f"{ours['client_us']:.0f} µs", f"{med['psycopg']['client_us']:.0f} µs",
            f"{ours['server_us']:.0f} µs", f"{med['psycopg']['server_us']:.0f} µs",
            f"{med['pgbench']['server_us']:.0f} µs",
            f"{ours['runqueue_us']:.0f} µs",
        ])
    markdown = table([
        "clients", "pitstop steps/s", "psycopg tx/s", "pgbench tx/s", "pitstop / pgbench",
        "psycopg / pgbench", "pitstop / psycopg", "client CPU/step: pitstop",
        "psycopg", "server CPU/step: pitstop", "psycopg", "pgbench",
        "pitstop waiting for a CPU/step",
    ], rows)
    print()
    print(f"statements per step: {per_step:g}; load average {min(loads):.1f}-{max(loads):.1f}")
    print(markdown)
    save_results("ceiling", " ".join(sys.argv), {
        "statements_per_step": per_step, "script": script, "load": [min(loads), max(loads)],
        "results": {str(n): v for n, v in results.items()},
        "samples": {str(n): v for n, v in samples.items()},
    }, markdown)


if __name__ == "__main__":
    main()
