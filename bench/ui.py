"""Web inspector benchmark (issue #15): its pages and API on a large store.

    .venv/bin/python bench/ui.py                 # 100,000 runs + one run of 10,000 checkpoints
    .venv/bin/python bench/ui.py --quick         # 10,000 + 2,000, fewer rounds
    .venv/bin/python bench/ui.py --store /tmp/ui-bench.db   # keep (and reuse) the store
    .venv/bin/python bench/ui.py --url 'postgresql://postgres@127.0.0.1:5432/test?schema=uibench'

Targets: the runs page and ``GET /api/runs`` answer in <= 100 ms of server time on a store
of 100,000 runs; a run page with 10,000 checkpoints in <= 150 ms (its tree is paginated:
100 checkpoints a page). Server time is the app's own ``Server-Timing`` header (from the
request entering the app to its response starting: store queries, rendering, JSON), read
from real HTTP requests to the app in process; each figure is the median of interleaved
rounds, with the 90th percentile beside it, and the process's CPU time per request: on a
machine other work shares, that is the steadier figure. Not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_time, machine, save_results, table

import pitstop
from pitstop import RunStatus

BIG_RUN = "long-run"
WORKFLOWS = ["vendor-approval", "nightly-etl", "support-agent", "invoice-approval"]
TIMING = re.compile(r"app;dur=([0-9.]+)")


def build(url: str, runs: int, checkpoints: int) -> None:
    """``runs`` runs in every status, one checkpoint each, and one run of ``checkpoints``
    checkpoints with a branch every 500."""
    rng = random.Random(15)
    statuses = [RunStatus.COMPLETED] * 6 + [RunStatus.WAITING, RunStatus.FAILED,
                                            RunStatus.QUEUED, RunStatus.RUNNING]
    with pitstop.open_store(url) as store:
        if store.runs(limit=1):
            return  # built by an earlier run with --store
        for i in range(runs):
            status = rng.choice(statuses)
            meta: dict[str, Any] = {"source": "step", "step_name": "review",
                                    "status": status.value, "next": "decide"}
            if status is RunStatus.WAITING:
                meta["waiting_for"] = ["approval"]
            if status is RunStatus.FAILED:
                meta["error"] = {"type": "ValueError", "message": f"bad row {i}",
                                 "step": "review", "traceback": "Traceback ...\n" * 20}
            store.save(f"run-{i:06d}", {"vendor": f"vendor {i % 977}", "amount": i % 10_000,
                                        "notes": "x" * (i % 200)},
                       metadata=meta, workflow=WORKFLOWS[i % len(WORKFLOWS)], status=status)
        head = None
        branch_from = None
        for i in range(checkpoints):
            parent = branch_from if i % 500 == 499 else head
            ckpt = store.save(BIG_RUN, {"messages": [f"step {j}" for j in range(i % 20)],
                                        "counter": i},
                              parent_id=parent,
                              metadata={"source": "step", "step_name": f"step_{i % 7}",
                                        "status": "running",
                                        **({"tags": ["checkpoint"]} if i % 100 == 0 else {})},
                              workflow="long-agent")
            head = ckpt.id
            if i % 500 == 250:
                branch_from = ckpt.id


def copy_into_postgres(sqlite_path: Path, url: str) -> None:
    """Fill an empty PostgreSQL store with the rows of a SQLite store ``build`` made: saving
    100,000 runs one by one over the network takes hours on a loaded machine, COPY takes
    seconds, and the rows (the schema is the same on both) are what the pages read."""
    import sqlite3

    import psycopg

    with pitstop.open_store(url) as store:  # creates the schema, tables and indexes
        if store.runs(limit=1):
            return
        schema = url.rpartition("schema=")[2].split("&")[0]
    source = sqlite3.connect(sqlite_path)
    tables = ["pitstop_runs", "pitstop_checkpoints", "pitstop_blobs", "pitstop_blob_refs"]
    with psycopg.connect(url.partition("?")[0]) as conn, conn.cursor() as cur:
        cur.execute(f'SET search_path TO "{schema}"')
        for table in tables:
            columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
            names = ", ".join(columns)
            with cur.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in source.execute(f"SELECT {names} FROM {table}"):
                    copy.write_row(row)
        cur.execute("ANALYZE")
    source.close()


def measure(url: str, rounds: int) -> list[dict[str, Any]]:
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    store = pitstop.open_store(url)
    deep = store.runs(limit=1, offset=50_000 if store.count_runs().get("completed", 0) > 60_000
                      else 100)[0].id
    cases = {
        "runs page (/)": "/",
        "GET /api/runs": "/api/runs",
        "runs page, status=waiting": "/?status=waiting",
        "GET /api/runs?status=failed&workflow=…": "/api/runs?status=failed&workflow=nightly-etl",
        "GET /api/runs, a deep keyset page": f"/api/runs?before={deep}",
        "GET /api/runs?id=run-0999 (prefix)": "/api/runs?id=run-0999",
        "run page, the long run": f"/runs/{BIG_RUN}",
        "GET /api/runs/{id}/history": f"/api/runs/{BIG_RUN}/history",
        "run page, a single-checkpoint run": "/runs/run-000042",
        "inbox page (oldest 50 waiting)": "/inbox",
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    import time

    with TestClient(create_app(store)) as client:
        for _ in range(3):  # warm up: caches, templates, the first connection
            for path in cases.values():
                assert client.get(path).status_code == 200, path
        for _ in range(rounds):
            for name, path in cases.items():  # interleaved: a slow spell hits every case
                t0, c0 = time.perf_counter(), time.process_time()
                response = client.get(path)
                walls[name].append(time.perf_counter() - t0)
                cpus[name].append(time.process_time() - c0)
                found = TIMING.search(response.headers.get("server-timing", ""))
                if response.status_code != 200 or found is None:
                    raise SystemExit(f"{path}: {response.status_code}")
                samples[name].append(float(found.group(1)) / 1000)
    store.close()
    out = []
    for name in cases:
        ordered = sorted(samples[name])
        out.append({
            "case": name,
            "server_median": statistics.median(ordered),
            "server_p90": ordered[int(len(ordered) * 0.9) - 1],
            "wall_median": statistics.median(walls[name]),
            "cpu_median": statistics.median(cpus[name]),
        })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--store", help="SQLite file to build (or reuse) the store in")
    parser.add_argument("--url", help="a PostgreSQL store URL (with ?schema=) to copy the "
                                      "SQLite store into and measure there instead")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.checkpoints, args.rounds = 10_000, 2_000, 10
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.store) if args.store else Path(tmp) / "ui.db"
        print(f"building {args.runs:,} runs and a run of {args.checkpoints:,} checkpoints "
              f"in {path} ...", flush=True)
        build(f"sqlite:///{path}", args.runs, args.checkpoints)
        url = f"sqlite:///{path}"
        if args.url:
            print(f"copying them into {args.url} ...", flush=True)
            copy_into_postgres(path, args.url)
            url = args.url
        results = measure(url, args.rounds)
    targets = {"runs page (/)": 0.1, "GET /api/runs": 0.1, "run page, the long run": 0.15}
    rows = [[r["case"], fmt_time(r["server_median"]), fmt_time(r["server_p90"]),
             fmt_time(r["cpu_median"]),
             (f"≤ {fmt_time(targets[r['case']])}: "
              + ("met" if r["server_median"] <= targets[r["case"]] else "MISSED"))
             if r["case"] in targets else ""]
            for r in results]
    backend = "PostgreSQL" if url.startswith("postgres") else "SQLite"
    markdown = (f"Store: {backend}, {args.runs:,} runs, one run of {args.checkpoints:,} "
                f"checkpoints; {args.rounds} interleaved rounds; {machine()}\n\n"
                + table(["request", "server median", "server p90", "CPU median", "target"],
                        rows)
                + "\n\nServer: the app's Server-Timing (wall clock inside the app). CPU: the "
                  "process's CPU time for the whole request, client included: steadier than "
                  "wall time when other work shares the cores.")
    print(markdown)
    saved = save_results("ui", " ".join(sys.argv), {"results": results, "backend": backend,
                                                     "runs": args.runs,
                                                     "checkpoints": args.checkpoints},
                         markdown)
    print(f"\nresults: {saved}")


if __name__ == "__main__":
    main()
