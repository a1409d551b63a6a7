"""What incremental auto-vacuum costs and gives back on SQLite (issue #30).

Two SQLite stores side by side in one run: one made as pitstop makes them now
(``auto_vacuum=INCREMENTAL``) and one as before (no auto-vacuum). Measures

* one ``store.save`` of a ~1 KiB state (the common path, which frees nothing): median of
  interleaved rounds, as a ratio incremental / none;
* a training loop of 20 checkpoints of 4 MiB weights with the Checkpointer's default
  retention (keep the newest 3): the file's size at the end on each.

``python bench/autovacuum.py [--rounds 7] [--saves 1000]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import pitstop


def _legacy(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA auto_vacuum=NONE")
        db.execute("PRAGMA journal_mode=WAL")


def _saves(path: Path, count: int) -> float:
    with pitstop.open_store(f"sqlite:///{path}") as store:
        state = {"messages": "x" * 900, "n": 0}
        started = time.perf_counter()
        for n in range(count):
            store.save("r", {**state, "n": n}, changed=["n"])
        return (time.perf_counter() - started) / count


def _loop(path: Path) -> int:
    with pitstop.open_store(f"sqlite:///{path}", blobs=False) as store, \
            pitstop.Checkpointer(store, "train") as ckpt:
        for step in range(20):
            ckpt.save({"weights": np.random.default_rng(step).random(1 << 19), "step": step})
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--saves", type=int, default=1000)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"incremental": [], "none": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for kind in (("incremental", "none") if round_ % 2 == 0 else ("none", "incremental")):
                path = Path(tmp) / f"{kind}-{round_}.db"
                if kind == "none":
                    _legacy(path)
                times[kind].append(_saves(path, args.saves))
        sizes = {}
        for kind in ("incremental", "none"):
            path = Path(tmp) / f"loop-{kind}.db"
            if kind == "none":
                _legacy(path)
            sizes[kind] = _loop(path)
    load = os.getloadavg()[0]
    inc, none = statistics.median(times["incremental"]), statistics.median(times["none"])
    print(f"load average {load:.1f} on {os.cpu_count()} cores; {args.rounds} interleaved rounds")
    print(f"store.save, 1 KiB state: incremental {inc * 1e6:.1f} us, none {none * 1e6:.1f} us, "
          f"ratio {inc / none:.2f}")
    print(f"20 x 4 MiB checkpoints, keep_last=3: incremental {sizes['incremental'] / 2**20:.1f} "
          f"MiB, none {sizes['none'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
