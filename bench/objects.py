"""Object storage benchmark (issue #31): a large state saved to and loaded from an S3 bucket,
side by side with the same client (obstore) uploading and downloading the same bytes as one
object, in one run against a local S3 server (moto's server mode on loopback, started here).

    .venv/bin/python bench/objects.py             # 256 MiB, 5 interleaved rounds
    .venv/bin/python bench/objects.py --quick     # 64 MiB, 1 round

What it reports, as medians of per-round ratios (a round's figures are taken one right after
the other, so a slow spell of the shared machine cancels out):

* save: ``store.save`` of a new float32 array (a new run each round: every chunk uploaded)
  against one ``obstore.put`` of the array's bytes (the faster of a single PUT and obstore's
  own parallel multipart upload);
* load: ``store.latest`` from a fresh handle against one ``obstore.get`` of that object;
* re-save: objects written by a save of the unchanged state (the target is none).

The S3 server is Python (moto): its own CPU time is in every figure, both sides. The metadata
store is a SQLite file in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import fmt_time, median_ratio, save_results, table  # takes bench/ off sys.path

import pitstop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from s3server import start  # (tests/s3server.py: moto on a free loopback port)

MiB = 1 << 20


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def object_count(store: Any, prefix: str) -> list[tuple[str, Any]]:
    import obstore

    return sorted(
        (meta["path"], meta["last_modified"])
        for batch in obstore.list(store, prefix) for meta in batch
    )


def one_round(
    r: int, array: Any, raw: Any, url: str, blobs: str
) -> tuple[float, float, float, float, int]:
    """(save, put, load, get seconds, objects an unchanged re-save wrote) of one round."""
    import obstore

    payload = memoryview(array).cast("B")
    # The client's best at one object: one PUT, or its own parallel multipart upload (the
    # default for this size), whichever was faster this round.
    t_put = min(
        timed(lambda: obstore.put(raw, f"plain/{r}", payload, use_multipart=False))[0],
        timed(lambda: obstore.put(raw, f"plain/{r}", payload))[0],
    )
    with pitstop.open_store(url, blobs=blobs) as store:
        t_save, _ = timed(lambda: store.save(f"run{r}", {"w": array, "step": 1}))
        before = object_count(raw, "pitstop/")
        store.save(f"run{r}", {"w": array, "step": 2})
        written = len(set(object_count(raw, "pitstop/")) - set(before))
    def load() -> tuple[float, Any]:
        with pitstop.open_store(url, blobs=blobs) as fresh:
            return timed(lambda: fresh.latest(f"run{r}"))

    # Who goes first alternates by round: on a busy machine the second of two back-to-back
    # transfers of 256 MiB often met a stall the first did not.
    if r % 2:
        t_load, state = load()
        t_get, _ = timed(lambda: obstore.get(raw, f"plain/{r}").bytes())
    else:
        t_get, _ = timed(lambda: obstore.get(raw, f"plain/{r}").bytes())
        t_load, state = load()
    assert np.array_equal(state.state["w"], array)
    return t_save, t_put, t_load, t_get, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mib", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    size = (args.mib or (64 if args.quick else 256)) * MiB
    rounds = args.rounds or (1 if args.quick else 5)

    from obstore.store import S3Store

    server = start()
    os.environ.update(server.env())
    try:
        bucket = server.new_bucket()
        raw = S3Store(bucket, client_options={"allow_http": True})
        blobs = f"s3://{bucket}/pitstop"
        tmp = Path(tempfile.mkdtemp())
        url = f"sqlite:///{tmp / 'bench.db'}"
        rng = np.random.default_rng(0)
        saves, puts, loads, gets, resaved = [], [], [], [], []
        for r in range(rounds):
            array = rng.standard_normal(size // 4, dtype=np.float32)
            t_save, t_put, t_load, t_get, written = one_round(r, array, raw, url, blobs)
            saves.append(t_save)
            puts.append(t_put)
            loads.append(t_load)
            gets.append(t_get)
            resaved.append(written)
            print(f"round {r}: save {fmt_time(t_save)} vs put {fmt_time(t_put)}; "
                  f"load {fmt_time(t_load)} vs get {fmt_time(t_get)}", flush=True)
    finally:
        server.stop()
    save_x = median_ratio(puts, saves)  # throughput ratio: theirs time / ours
    load_x = median_ratio(gets, loads)
    mib = size // MiB
    rows = [
        [f"save {mib} MiB array", fmt_time(sorted(saves)[len(saves) // 2]),
         fmt_time(sorted(puts)[len(puts) // 2]), f"{save_x:.2f}x", ">= 0.8x"],
        [f"load {mib} MiB array", fmt_time(sorted(loads)[len(loads) // 2]),
         fmt_time(sorted(gets)[len(gets) // 2]), f"{load_x:.2f}x", ">= 0.8x"],
        ["unchanged re-save: objects written", str(max(resaved)), "-", "-", "0"],
    ]
    markdown = table(
        ["case", "pitstop", "obstore, one object", "throughput vs one object", "target"], rows
    )
    print(markdown)
    load = os.getloadavg()[0]
    print(f"(load average {load:.1f}, {rounds} rounds)")
    save_results(
        "objects",
        " ".join(["bench/objects.py", *sys.argv[1:]]),
        {"save_ratio": save_x, "load_ratio": load_x, "resave_objects": max(resaved),
         "saves": saves, "puts": puts, "loads": loads, "gets": gets, "load_average": load},
        markdown,
    )


if __name__ == "__main__":
    main()
