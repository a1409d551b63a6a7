"""How a load should read packs from S3 (issue #31's load target): eight 32 MiB packs, as
a 256 MiB save writes them, read in parallel into a new array two ways, against one GET of
the same bytes as one object, in one run against a local S3 server (moto, started here).

    .venv/bin/python bench/object_reads.py            # 256 MiB, 7 interleaved rounds
    .venv/bin/python bench/object_reads.py --mib 64 --rounds 3

* copy: each pack's whole body (``obstore.get(...).bytes()``), then copied into the array:
  what ``S3BlobStore`` does now (its prefetch reads packs before the load knows where their
  chunks go);
* stream: each pack's body streamed (``GetResult.stream``) and each piece copied into the
  array's memory as it arrives: one set of new pages touched instead of two.

Reported as medians of per-round throughput ratios against the one GET (the order of the
three cases alternates by round).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from _common import fmt_time, median_ratio, size_and_rounds  # takes bench/ off sys.path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from s3server import start as start_server  # (tests/s3server.py: moto on a free loopback port)

MiB = 1 << 20
PACK = 32 * MiB


def main() -> None:
    size, rounds = size_and_rounds(__doc__.split("\n")[0])

    import obstore
    from obstore.store import S3Store

    server = start_server()
    os.environ.update(server.env())
    try:
        store = S3Store(server.new_bucket(), client_options={"allow_http": True})
        data = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32)
        body = memoryview(data).cast("B")
        obstore.put(store, "whole", body)
        starts = list(range(0, size, PACK))
        for start in starts:
            obstore.put(store, f"pack{start}", body[start : start + PACK])
        pool = ThreadPoolExecutor(len(starts))

        def one_get() -> object:
            return obstore.get(store, "whole").bytes()

        def copy() -> object:
            out = np.empty(size, np.uint8)

            def part(start: int) -> None:
                got = obstore.get(store, f"pack{start}").bytes()
                out[start : start + len(got)] = np.frombuffer(got, np.uint8)

            list(pool.map(part, starts))
            return out

        def stream() -> object:
            out = np.empty(size, np.uint8)
            view = memoryview(out)

            def part(start: int) -> None:
                at = start
                for piece in obstore.get(store, f"pack{start}").stream(
                        min_chunk_size=256 << 10):
                    view[at : at + len(piece)] = memoryview(piece)
                    at += len(piece)

            list(pool.map(part, starts))
            return out

        cases: dict[str, Callable[[], object]] = {"get": one_get, "copy": copy,
                                                  "stream": stream}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(rounds):
            for name in (list(cases) if r % 2 == 0 else list(reversed(cases))):
                t0 = time.perf_counter()
                out = cases[name]()
                times[name].append(time.perf_counter() - t0)
                del out
        for name in ("copy", "stream"):
            print(f"{name}: {fmt_time(statistics.median(times[name]))} against one GET's "
                  f"{fmt_time(statistics.median(times['get']))}: "
                  f"{median_ratio(times['get'], times[name]):.2f}x its throughput")
        print(f"(load average {os.getloadavg()[0]:.1f}, {rounds} rounds, {size >> 20} MiB)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
