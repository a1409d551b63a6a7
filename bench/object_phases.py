"""Where a load of a large array from object storage spends its time (issue #31's load
target), phase by phase, beside one GET of the same bytes and beside the same GETs without
pitstop around them, against a local S3 server (moto, started here).

    .venv/bin/python bench/object_phases.py               # 256 MiB, 7 interleaved rounds
    .venv/bin/python bench/object_phases.py --mib 64 --rounds 3

Per round, in an order that alternates by round:

* get: one ``obstore.get(...).bytes()`` of the array's bytes stored as one object;
* bare: the store's own pack objects streamed into a new array by parallel GETs, each chunk
  checked as it lands: what the load's GETs do, without the store around them;
* load: ``store.latest`` from a fresh handle (``open_store`` included), its time split into
  open (of which the bucket check), until the first GET starts (the rows, the array's
  tree, the allocation), the GETs (first start to last end) and after the last GET.

Each case's CPU time is reported too, this process's and the S3 server's (moto is one Python
process: its per-request cost is in every figure). Then the floors of the server and the
client: a request for a 1-byte object (one at a time, and 16 in flight), the LIST that opening
a store sends, and making one obstore client. Phases are timed by wrapping internal methods
of ``S3BlobStore``: this script follows them when they are renamed.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _common import fmt_time, median_ratio, size_and_rounds, table  # takes bench/ off sys.path

import pitstop
from pitstop.serde import chunks
from pitstop.store.encoding import objects

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from s3server import start  # (tests/s3server.py: moto on a free loopback port)

MiB = 1 << 20


class Marks:
    """Times of the first entry and last exit of wrapped methods, per load."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.requests = 0

    def clear(self) -> None:
        self.first, self.last, self.requests = {}, {}, 0

    def wrap(self, owner: Any, name: str, counts: bool = False) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.first.setdefault(name, time.perf_counter())
                self.requests += counts
            try:
                return original(*args, **kwargs)
            finally:
                with self.lock:
                    self.last[name] = time.perf_counter()

        setattr(owner, name, timed)


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    size, rounds = size_and_rounds(__doc__.split("\n")[0])

    import obstore
    from obstore.store import S3Store

    server = start()
    os.environ.update(server.env())
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_server() -> float:
        with open(f"/proc/{server.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    marks = Marks()
    for name in ("_probe", "_get_group_into"):
        marks.wrap(objects.S3BlobStore, name, counts=name == "_get_group_into")
    for name in ("_get_group", "_read_now", "_get_object"):  # (requests besides the packs')
        marks.wrap(objects.S3BlobStore, name, counts=True)
    try:
        bucket = server.new_bucket()
        raw = S3Store(bucket, client_options={"allow_http": True})
        blobs = f"s3://{bucket}/pitstop"
        url = f"sqlite:///{tempfile.mkdtemp()}/phases.db"
        array = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32)
        obstore.put(raw, "plain", memoryview(array).cast("B"))
        with pitstop.open_store(url, blobs=blobs) as store:
            store.save("r", {"w": array, "step": 1})
        packs = [(meta["path"], meta["size"])
                 for batch in obstore.list(raw, "pitstop/packs/") for meta in batch]
        pool = ThreadPoolExecutor(16)
        chunk = MiB + 1  # a header byte, then 1 MiB of the array

        def one_get() -> object:
            return obstore.get(raw, "plain").bytes()

        def bare() -> object:
            out = np.empty(sum(n for _, n in packs), np.uint8)
            view = memoryview(out)
            starts = np.cumsum([0] + [n for _, n in packs[:-1]]).tolist()

            def part(index: int) -> None:
                at = done = starts[index]
                for piece in obstore.get(raw, packs[index][0]).stream(min_chunk_size=MiB):
                    view[at : at + len(piece)] = memoryview(piece)
                    at += len(piece)
                    while at - done >= chunk:
                        chunks.chunk_key(view[done], view[done + 1 : done + chunk])
                        done += chunk

            list(pool.map(part, range(len(packs))))
            return out

        phases: dict[str, list[float]] = {
            name: [] for name in ("open", "check", "to_first_get", "gets", "after")}
        requests: list[int] = []

        def load() -> object:
            marks.clear()
            t0 = time.perf_counter()
            fresh = pitstop.open_store(url, blobs=blobs)
            t1 = time.perf_counter()
            state = fresh.latest("r")
            t2 = time.perf_counter()
            fresh.close()
            first, last = marks.first, marks.last
            phases["open"].append(t1 - t0)
            phases["check"].append(last["_probe"] - first["_probe"])
            phases["to_first_get"].append(first["_get_group_into"] - t1)
            phases["gets"].append(last["_get_group_into"] - first["_get_group_into"])
            phases["after"].append(t2 - last["_get_group_into"])
            requests.append(marks.requests)
            return state

        cases: dict[str, Callable[[], object]] = {"get": one_get, "bare": bare, "load": load}
        wall: dict[str, list[float]] = {name: [] for name in cases}
        mine: dict[str, list[float]] = {name: [] for name in cases}
        theirs: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(rounds):
            for name in list(cases) if r % 2 == 0 else list(reversed(cases)):
                c0, s0, t0 = cpu_self(), cpu_server(), time.perf_counter()
                out = cases[name]()
                wall[name].append(time.perf_counter() - t0)
                mine[name].append(cpu_self() - c0)
                theirs[name].append(cpu_server() - s0)
                del out
            print(f"round {r}: " + ", ".join(
                f"{name} {fmt_time(wall[name][-1])}" for name in cases), flush=True)

        def med(values: list[float]) -> str:
            return fmt_time(statistics.median(values))

        rows = [[name, med(wall[name]), f"{median_ratio(wall['get'], wall[name]):.2f}x",
                 med(mine[name]), med(theirs[name])] for name in cases]
        print(table(["case", "wall", "throughput vs one GET", "client CPU", "server CPU"],
                    rows))
        print(table(["load phase", "median"], [[name, med(values)]
                                               for name, values in phases.items()]))
        print(f"requests of a load's values: {max(requests)} ({len(packs)} packs)")

        # The floors: one request's cost to the server and the client, making a client.
        obstore.put(raw, "tiny", b"x")

        def per_request(fn: Callable[[], object], n: int = 100) -> tuple[float, float, float]:
            c0, s0, t0 = cpu_self(), cpu_server(), time.perf_counter()
            fn()
            return ((time.perf_counter() - t0) / n, (cpu_self() - c0) / n,
                    (cpu_server() - s0) / n)

        floors = {
            "GET of 1 byte, one at a time": lambda: [
                obstore.get(raw, "tiny").bytes() for _ in range(100)],
            "GET of 1 byte, 16 in flight": lambda: list(pool.map(
                lambda _: obstore.get(raw, "tiny").bytes(), range(100))),
            "LIST after the last key (the check at open)": lambda: [
                next(iter(obstore.list(raw, "pitstop/", offset="pitstop/~")), None)
                for _ in range(100)],
            "making an obstore client (no request)": lambda: [
                S3Store(bucket, client_options={"allow_http": True}) for _ in range(100)],
        }
        floor_rows = []
        for name, fn in floors.items():
            samples = [per_request(fn) for _ in range(3)]
            floor_rows.append([name] + [
                fmt_time(statistics.median(s[i] for s in samples)) for i in range(3)])
        print(table(["one request", "wall", "client CPU", "server CPU"], floor_rows))
        print(f"(load average {os.getloadavg()[0]:.1f}, {rounds} rounds, {size >> 20} MiB)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
