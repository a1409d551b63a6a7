"""A batch job over 1,000,000 records, one external effect per record, killed and resumed.

    python examples/batch.py                  # run (or resume) the job "batch-demo"
    python examples/batch.py --records 50000  # a smaller job
    python examples/batch.py demo             # SIGKILL it three times, resume, check the ledger

One workflow step walks the records with ``ctx.iterate`` (the position and a running total
are recorded every 1,000 records) and delivers each record to a ledger, a SQLite database
standing for the outside world, with ``ctx.effect``. Kill the process anywhere: the step runs
again from the last recorded position, the records after it are iterated again, and their
deliveries return the recorded results instead of delivering twice. The one window left (the
delivery happened, the process died before pitstop recorded it) is closed on the ledger's
side by the idempotency key, as with a payment API: the ledger counts such attempts, so the
demo shows how often that window was hit.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pitstop

wf = pitstop.Workflow("batch", durability="normal")


def records(n: int) -> Iterator[dict[str, Any]]:
    """The input: n records made on the fly (a real job reads a file or a table)."""
    for i in range(n):
        yield {"id": i, "amount": (i * 7919) % 1000}


class Ledger:
    """The outside world: each delivery is a row; a repeated key is counted, not stored."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS deliveries (key TEXT PRIMARY KEY, "
                        "record INTEGER NOT NULL, amount INTEGER NOT NULL, attempts INTEGER)")

    def deliver(self, record: dict[str, Any], *, idempotency_key: str) -> int:
        self.db.execute(
            "INSERT INTO deliveries VALUES (?, ?, ?, 1) "
            "ON CONFLICT (key) DO UPDATE SET attempts = attempts + 1",
            (idempotency_key, record["id"], record["amount"]),
        )
        return int(record["amount"])


LEDGER: Ledger | None = None


@wf.step
def process(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    assert LEDGER is not None
    items = ctx.iterate(records(state["records"]), every=1000, state={"total": 0, "done": 0})
    if items.resumed_from:
        print(f"resuming after record {items.resumed_from}", flush=True)
    for record in items:
        items.state["total"] += ctx.effect(f"deliver-{record['id']}", LEDGER.deliver, record)
        items.state["done"] += 1
        if record["id"] % 100_000 == 0:
            print(f"record {record['id']}", flush=True)
    return {"total": items.state["total"], "done": items.state["done"]}


def run(store_url: str, ledger: str, run_id: str, n: int) -> dict[str, Any]:
    global LEDGER  # noqa: PLW0603 - the example's one connection to the outside world
    LEDGER = Ledger(ledger)
    with pitstop.open_store(store_url) as store:
        try:
            store.get_run(run_id)
        except pitstop.RunNotFoundError:
            result = wf.start(store, {"records": n}, run_id=run_id)
        else:
            result = wf.resume(store, run_id)
    result.raise_for_status()
    print(f"done: {result.state['done']} records, total {result.state['total']}", flush=True)
    return dict(result.state)


def check(ledger: str, n: int) -> tuple[int, int, int]:
    """(records delivered, distinct records, repeated delivery attempts) in the ledger."""
    db = sqlite3.connect(ledger)
    rows, distinct, attempts = db.execute(
        "SELECT COUNT(*), COUNT(DISTINCT record), COALESCE(SUM(attempts), 0) FROM deliveries"
    ).fetchone()
    return rows, distinct, attempts - rows


def demo(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store, ledger = f"sqlite:///{tmp}/batch.db", f"{tmp}/ledger.db"
        cmd = [sys.executable, __file__, "--records", str(args.records), "--store", store,
               "--ledger", ledger]
        rng = random.Random(args.seed)
        for _ in range(3):
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
            time.sleep(rng.uniform(1.0, 4.0))
            proc.kill()
            proc.wait()
            print(f"killed with SIGKILL; ledger holds {check(ledger, args.records)[0]} records")
        subprocess.run(cmd, check=True)
        rows, distinct, repeats = check(ledger, args.records)
        print(f"ledger: {rows} deliveries of {distinct} distinct records "
              f"(expected {args.records}); {repeats} repeated attempts dropped by key")
        expected = sum(r["amount"] for r in records(args.records))
        with pitstop.open_store(store) as s:
            latest = s.latest("batch-demo")
            assert latest is not None
            total = latest.state["total"]
        print(f"total {total} (expected {expected})")
        ok = rows == distinct == args.records and total == expected
        print("nothing lost, nothing repeated" if ok else "MISMATCH")
        sys.exit(0 if ok else 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["run", "demo"], default="run")
    parser.add_argument("--store", default=os.environ.get("PITSTOP_STORE", "sqlite:///batch.db"))
    parser.add_argument("--ledger", default=str(Path("ledger.db")))
    parser.add_argument("--run-id", default="batch-demo")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(args)
    else:
        run(args.store, args.ledger, args.run_id, args.records)


if __name__ == "__main__":
    main()
