"""Stream jobs (pitstop.stream, issue #27), side by side in one run.

* throughput: one partition, N Redis events (10,000 keys), counting per key with
  ``every=1000`` on SQLite, against a plain redis-py loop doing the same counting (XREAD 1,000
  at a time, no checkpoints), and against the job's own reads alone (``RedisStream.read``,
  which reads through a script: what the job and its checkpoints add); interleaved rounds,
  the median ratios.
* checkpoint cost with 1,000,000 keys in the state: bytes added and time of a checkpoint
  after 1,000 records (O(changed keys), not O(state)).
* restart: with N events behind the checkpoint, the time from ``job.run`` to the first record
  handled (a seek, not a replay).
* ``--kills``: the full-size exactly-once test: 4 partitions, 200,000 events over 10,000
  keys, 3 ``job.run`` processes on a PostgreSQL store, 30 SIGKILLs (and on SQLite, one host).

    python bench/stream.py [--events 200000] [--rounds 3] [--kills]

* ``--bytewax PYTHON``: against Bytewax 0.21 (run by PYTHON, an interpreter that has it:
  it is not a pitstop dependency), its SQLite recovery on: the same 1,000,000 in-memory
  events counted per key, the same snapshot interval (1 s), events/s and bytes stored.

Needs Redis on 127.0.0.1:6379 (and PostgreSQL for --kills).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _common import fmt_bytes, machine, median_of, save_results, table

import pitstop
from pitstop import stream

REDIS_URL = os.environ.get("PITSTOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parent.parent


def _client() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def fill(client: Any, key: str, events: int, keys: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    users = [f"user{rng.randrange(keys)}" for _ in range(events)]
    for first in range(0, events, 5000):
        with client.pipeline(transaction=False) as pipe:
            for user in users[first:first + 5000]:
                pipe.xadd(key, {"user": user})
            pipe.execute()
    return users


def plain_loop(client: Any, key: str, events: int) -> tuple[float, dict[str, int]]:
    """The baseline: XREAD 1,000 at a time, count per key, no checkpoints."""
    counts: dict[str, int] = {}
    position = "0-0"
    seen = 0
    start = time.perf_counter()
    while seen < events:
        reply = client.xread({key: position}, count=1000)
        if not reply:
            break
        for entry_id, fields in reply[0][1]:
            user = fields[b"user"].decode()
            counts[user] = counts.get(user, 0) + 1
            position = entry_id
            seen += 1
    return time.perf_counter() - start, counts


def source_loop(name: str, events: int) -> tuple[float, dict[str, int]]:
    """The job's own reads (``RedisStream.read``, 1,000 at a time) and the same counting,
    no job and no checkpoints: what the job adds over its reading alone."""
    source = stream.RedisStream(REDIS_URL, name)
    counts: dict[str, int] = {}
    position = None
    seen = 0
    start = time.perf_counter()
    while seen < events:
        records = source.read({0: position}, 1000, 0.0).get(0)
        if not records:
            break
        for record in records:
            user = record.value["user"]
            counts[user] = counts.get(user, 0) + 1
        position = records[-1].position
        seen += len(records)
    seconds = time.perf_counter() - start
    source.close()
    return seconds, counts


def counting_job(name: str, **options: Any) -> stream.Job:
    job = stream.Job(name, source=stream.RedisStream(REDIS_URL, name, partitions=1),
                     **{"every": 1000, "seconds": 60.0, **options})

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        user = record.value["user"]
        state[user] = state.get(user, 0) + 1

    return job


def pitstop_run(store_url: str, name: str) -> float:
    store = pitstop.open_store(store_url)
    job = counting_job(name)
    start = time.perf_counter()
    job.run(store, idle_exit=0.0)
    seconds = time.perf_counter() - start
    store.close()
    return seconds


def throughput(events: int, rounds: int) -> dict[str, Any]:
    client = _client()
    name = f"bench{uuid.uuid4().hex[:8]}"
    users = fill(client, f"{name}:0", events, 10_000)
    expected = Counter(users)
    plain: list[float] = []
    reads: list[float] = []
    ours: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            seconds, counts = plain_loop(client, f"{name}:0", events)
            assert counts == expected
            plain.append(seconds)
            seconds, counts = source_loop(name, events)
            assert counts == expected
            reads.append(seconds)
            url = f"sqlite:///{tmp}/r{r}.db"
            ours.append(pitstop_run(url, name))
            store = pitstop.open_store(url)
            assert counting_job(name).state(store) == expected
            store.close()
    client.delete(f"{name}:0")
    # idle_exit=0 still waits one empty read (50 ms block) at the end: not counted.
    ours = [s - 0.05 for s in ours]
    return {
        "events": events,
        "plain_eps": events / median_of(plain),
        "reads_eps": events / median_of(reads),
        "pitstop_eps": events / median_of(ours),
        "ratio": median_of([p / o for p, o in zip(plain, ours, strict=True)]),
        "ratio_to_reads": median_of([r / o for r, o in zip(reads, ours, strict=True)]),
    }


def checkpoint_cost(keys: int) -> dict[str, Any]:
    """A state of ``keys`` keys, then 1,000 records changing 1,000 of them: what that
    checkpoint adds to the store and how long its write takes."""
    from pitstop.stream import job as job_module

    items: list[tuple[str, int]] = [(f"k{i}", 1) for i in range(keys)]
    rng = random.Random(1)
    tail = [(f"k{rng.randrange(keys)}", 1) for _ in range(1000)]
    times: list[float] = []
    original = job_module.Job._write

    def timed(self: Any, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        original(self, *args, **kwargs)
        times.append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        store = pitstop.open_store(f"sqlite:///{tmp}/c.db")
        job = stream.Job("big", source=stream.Iterable(items + tail), every=1000,
                         seconds=600.0)

        @job.handler
        def count(state: Any, record: stream.Record, emit: Any) -> None:
            state[record.key] = state.get(record.key, 0) + record.value

        job_module.Job._write = timed  # type: ignore[method-assign]
        try:
            job.run(store, idle_exit=0.0)
        finally:
            job_module.Job._write = original  # type: ignore[method-assign]
        head = store.history("big/0", limit=1)[0]
        assert "full" not in store.get(head.id).state
        start = time.perf_counter()
        state = job.state(store)
        load = time.perf_counter() - start
        assert len(state) == keys
        store.close()
    return {"keys": keys, "bytes": head.added, "seconds": times[-1], "load_seconds": load}


def restart(events: int) -> dict[str, Any]:
    """``events`` handled and checkpointed; one more arrives; a new process-like job.run:
    the time until that record is handled."""
    client = _client()
    name = f"bench{uuid.uuid4().hex[:8]}"
    fill(client, f"{name}:0", events, 10_000)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/r.db"
        pitstop_run(url, name)
        client.xadd(f"{name}:0", {"user": "late"})
        store = pitstop.open_store(url)
        job = counting_job(name)
        first: list[float] = []

        @job.handler
        def count(state: Any, record: stream.Record, emit: Any) -> None:
            if not first:
                first.append(time.perf_counter())
            job.stop()

        start = time.perf_counter()
        job.run(store)
        store.close()
    client.delete(f"{name}:0")
    return {"events": events, "seconds": first[0] - start}


def kills(events: int, kills_count: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import drop_pg_schema, pg_schema_url  # type: ignore[import-not-found]
    from streamkill import run_kill_test  # type: ignore[import-not-found]

    out = []
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        for label, url, procs, broker in [
            ("PostgreSQL, 3 processes", pg_schema_url(schema), 3, "redis"),
            ("SQLite, 3 processes (one host)", None, 3, "redis"),
            ("JetStream, SQLite, 3 processes", None, 3, "jetstream"),
        ]:
            with tempfile.TemporaryDirectory() as tmp:
                store_url = url or f"sqlite:///{tmp}/k.db"
                result = run_kill_test(
                    store_url, f"bk{uuid.uuid4().hex[:8]}", partitions=4, events=events,
                    keys=10_000, kills=kills_count, processes=procs, seed=7,
                    pace=max(6.0, kills_count * 0.8), timeout=900, broker=broker,
                )
            out.append({"label": label, **vars(result), "ok": result.ok})
            print(label, result, flush=True)
    finally:
        drop_pg_schema(schema)
    return out


BYTEWAX = r"""
import sys, time, tempfile, os, random
from datetime import timedelta
from pathlib import Path
from bytewax.dataflow import Dataflow
import bytewax.operators as op
from bytewax.testing import TestingSource, TestingSink, run_main
from bytewax.recovery import RecoveryConfig, init_db_dir

events, keys = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(0)
items = [(f"user{rng.randrange(keys)}", 1) for _ in range(events)]
flow = Dataflow("count")
stream = op.input("inp", flow, TestingSource(items, batch_size=1000))

def count(state, item):
    return (state or 0) + item, ()

counted = op.stateful_flat_map("count", stream, count)
op.output("out", counted, TestingSink([]))
with tempfile.TemporaryDirectory() as tmp:
    init_db_dir(Path(tmp), 1)
    start = time.perf_counter()
    run_main(flow, epoch_interval=timedelta(seconds=1),
             recovery_config=RecoveryConfig(Path(tmp)))
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
print(seconds, size)
"""


def bytewax(python: str, events: int, keys: int, rounds: int) -> dict[str, Any]:
    """Bytewax (in its own interpreter) and pitstop on the same in-memory events."""
    import subprocess

    theirs: list[float] = []
    ours: list[float] = []
    their_bytes = our_bytes = 0
    rng = random.Random(0)
    items = [(f"user{rng.randrange(keys)}", 1) for _ in range(events)]
    for _ in range(rounds):
        done = subprocess.run([python, "-c", BYTEWAX, str(events), str(keys)],
                              capture_output=True, text=True, check=True)
        seconds, size = done.stdout.split()
        theirs.append(float(seconds))
        their_bytes = int(size)
        with tempfile.TemporaryDirectory() as tmp:
            store = pitstop.open_store(f"sqlite:///{tmp}/b.db")
            job = stream.Job("count", source=stream.Iterable(items), every=10**9,
                             seconds=1.0)

            @job.handler
            def count(state: Any, record: stream.Record, emit: Any) -> None:
                state[record.key] = state.get(record.key, 0) + record.value

            start = time.perf_counter()
            job.run(store, idle_exit=0.0)
            ours.append(time.perf_counter() - start - 0.05)
            store.close()
            our_bytes = sum(p.stat().st_size for p in Path(tmp).iterdir())
    return {"events": events, "bytewax_eps": events / median_of(theirs),
            "pitstop_eps": events / median_of(ours),
            "ratio": median_of([t / o for t, o in zip(theirs, ours, strict=True)]),
            "bytewax_bytes": their_bytes, "pitstop_bytes": our_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--state-keys", type=int, default=1_000_000)
    parser.add_argument("--restart-events", type=int, default=1_000_000)
    parser.add_argument("--kills", action="store_true", help="the full-size kill test only")
    parser.add_argument("--kill-count", type=int, default=30)
    parser.add_argument("--bytewax", metavar="PYTHON",
                        help="only the Bytewax 0.21 comparison, Bytewax run by PYTHON")
    args = parser.parse_args()
    if args.bytewax:
        bw = bytewax(args.bytewax, args.restart_events, 10_000, args.rounds)
        md = table(["1,000,000 in-memory events, count per key, snapshot every 1 s",
                    "events/s", "bytes stored"], [
            ["Bytewax 0.21, SQLite recovery", f"{bw['bytewax_eps']:,.0f}",
             fmt_bytes(bw["bytewax_bytes"])],
            ["pitstop.stream (Iterable), SQLite", f"{bw['pitstop_eps']:,.0f}",
             fmt_bytes(bw["pitstop_bytes"])],
            ["ratio pitstop / Bytewax", f"{bw['ratio']:.2f}x", ""],
        ])
        print(md)
        save_results("stream-bytewax", " ".join(sys.argv), bw, md)
        return
    if args.kills:
        results = kills(args.events, args.kill_count)
        rows = [[r["label"], f"{r['events']:,}", str(r["kills"]), f"{r['seconds']:.0f} s",
                 "yes" if r["state_exact"] else "NO",
                 f"{r['outputs_found']:,} / {r['outputs_expected']:,}",
                 str(r["duplicates"]), str(r["missing"])] for r in results]
        md = table(["store", "events", "SIGKILLs", "wall", "state exact", "outputs",
                    "twice", "missing"], rows)
        print(md)
        save_results("stream-kills", " ".join(sys.argv), {"results": results}, md)
        return
    tp = throughput(args.events, args.rounds)
    print(f"throughput: {tp}", flush=True)
    cost = checkpoint_cost(args.state_keys)
    print(f"checkpoint: {cost}", flush=True)
    rs = restart(args.restart_events)
    print(f"restart: {rs}", flush=True)
    md = "\n\n".join([
        f"machine: {machine()}",
        table(["one partition, counting", "events/s"], [
            ["plain redis-py XREAD loop, no checkpoints", f"{tp['plain_eps']:,.0f}"],
            ["the job's reads alone (RedisStream.read), no checkpoints",
             f"{tp['reads_eps']:,.0f}"],
            ["pitstop.stream, every=1000, SQLite", f"{tp['pitstop_eps']:,.0f}"],
            ["ratio to the plain loop (median of rounds)", f"{tp['ratio']:.2f}x"],
            ["ratio to its reads alone (median of rounds)", f"{tp['ratio_to_reads']:.2f}x"],
        ]),
        table(["checkpoint after 1,000 records", "value"], [
            ["keys in state", f"{cost['keys']:,}"],
            ["bytes added", fmt_bytes(cost["bytes"])],
            ["write time", f"{cost['seconds'] * 1000:.1f} ms"],
            ["job.state load", f"{cost['load_seconds']:.2f} s"],
        ]),
        table(["restart", "value"], [
            ["events behind the checkpoint", f"{rs['events']:,}"],
            ["job.run to first new record", f"{rs['seconds'] * 1000:.0f} ms"],
        ]),
    ])
    print(md)
    save_results("stream", " ".join(sys.argv), {"throughput": tp, "checkpoint": cost,
                                                "restart": rs}, md)


if __name__ == "__main__":
    main()
