"""Store benchmark (issue #2): what a checkpoint costs on the embedded SQLite store.

    .venv/bin/python bench/store.py            # full run (~2 min)
    .venv/bin/python bench/store.py --quick    # smaller history, fewer repeats

Everything is measured in this one run on this machine, with the raw-SQLite floor (one
INSERT + COMMIT of the same bytes in the same durability mode) beside it, so each figure is
also a ratio. Medians of many repeats; wall-clock noise on a shared 2-core box is large, so
compare ratios, not absolute numbers from different runs. The floor and the ~1 KiB saves are
measured in interleaved rounds, and their ratios are medians of each round's ratio.
"""

from __future__ import annotations

import argparse
import base64
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (  # bench/_common.py (it takes bench/ off sys.path)
    base_state,
    fmt_bytes,
    fmt_time,
    median_of,
    median_ratio,
    median_time,
    save_results,
    table,
)

import pitstop

MiB = 1 << 20


def raw_floor(path: Path, synchronous: str, payload: bytes) -> tuple[Callable[[], None], Any]:
    """One INSERT + COMMIT of ``payload`` in WAL mode: the least any SQLite checkpoint costs.
    Returns the operation and the connection (to close)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB)")
    counter = iter(range(10**9))

    def insert() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (id, data) VALUES (?, ?)", (next(counter), payload))
        conn.execute("COMMIT")

    return insert, conn


def bench_saves(
    tmp: Path, durability: str, payload: bytes, repeat: int, rounds: int
) -> dict[str, float]:
    """The floor and both saves, measured in interleaved rounds: this shared VM's speed
    drifts within seconds, so each round's ratios compare neighbours in time and the
    reported ratio is the median of them."""
    floor, conn = raw_floor(tmp / f"floor-{durability}.db", durability.upper(), payload)
    store = pitstop.open_store(f"sqlite:///{tmp / f'saves-{durability}.db'}", durability=durability)
    counter = iter(range(10**9))

    def save_plain() -> None:
        store.save("plain", base_state(i=next(counter)))

    def save_hinted() -> None:
        store.save("hinted", base_state(i=next(counter)), changed=["i"])

    ops = {"floor": floor, "save_1k": save_plain, "save_1k_changed_hint": save_hinted}
    samples: dict[str, list[float]] = {key: [] for key in ops}
    for r in range(rounds):
        for key, op in ops.items():
            samples[key].append(median_time(op, max(1, repeat // rounds), warmup=20 if r else 100))
    store.close()
    conn.close()
    out = {key: median_of(values) for key, values in samples.items()}
    for key in ("save_1k", "save_1k_changed_hint"):
        out[f"{key}_ratio"] = median_ratio(samples[key], samples["floor"])
    return out


def bench_big_field(tmp: Path, repeat: int) -> dict[str, float]:
    """200 saves of a state with one unchanging 1 MiB field and one small changing field."""
    path = tmp / "big.db"
    store = pitstop.open_store(f"sqlite:///{path}")
    # Random text: zstd cannot make it vanish, so what is measured is deduplication.
    big = base64.b64encode(os.urandom(3 * MiB // 4)).decode()
    assert len(big) == MiB
    times = []
    for i in range(200):
        t0 = time.perf_counter()
        store.save("big", {"document": big, "i": i})
        times.append(time.perf_counter() - t0)
    hinted = []
    for i in range(repeat):
        t0 = time.perf_counter()
        store.save("big", {"document": big, "i": 200 + i}, changed=["i"])
        hinted.append(time.perf_counter() - t0)
    stored = store.stats().bytes
    store.close()
    on_disk = sum(p.stat().st_size for p in tmp.glob("big.db*"))
    times.sort()
    hinted.sort()
    return {
        "save_1mib_unchanged": times[len(times) // 2],
        "save_1mib_unchanged_changed_hint": hinted[len(hinted) // 2],
        "bytes_200_saves_1mib_on_disk": on_disk,
        "bytes_200_saves_1mib_stored": stored,
    }


def bench_restore_and_history(tmp: Path, big_history: int, repeat: int) -> dict[str, float]:
    store = pitstop.open_store(f"sqlite:///{tmp / 'history.db'}")
    for i in range(10):
        store.save("short", base_state(i=i))
    t0 = time.perf_counter()
    for i in range(big_history):
        store.save("long", base_state(i=i), changed=["i"] if i else None)
    build = time.perf_counter() - t0
    out = {
        "restore_latest_10": median_time(lambda: store.latest("short"), repeat),
        f"restore_latest_{big_history}": median_time(lambda: store.latest("long"), repeat),
        "history_10000": median_time(lambda: store.history("long", limit=10_000), 15),
        "build_seconds": build,
        "history_size": big_history,
    }
    # a fresh process-level view: no caches
    store.close()
    cold = pitstop.open_store(f"sqlite:///{tmp / 'history.db'}")
    out["restore_latest_cold_open"] = median_time(lambda: cold.latest("long"), repeat)
    cold.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeat = 300 if args.quick else 2000
    big_history = 20_000 if args.quick else 100_000

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        payload = pitstop.MsgpackSerializer().dumps(base_state(i=0))
        saves = {
            # Many short rounds: a slow spell of this shared VM (seconds long) then lands in
            # a minority of them, and the median of per-round ratios passes over it.
            "normal": bench_saves(tmp, "normal", payload, repeat, 40 if not args.quick else 10),
            "full": bench_saves(tmp, "full", payload, min(repeat, 500), 5),
        }
        floors = {mode: saves[mode]["floor"] for mode in saves}
        big = bench_big_field(tmp, 100)
        hist = bench_restore_and_history(tmp, big_history, repeat)

    rows = []
    for mode in ("normal", "full"):
        floor = floors[mode]
        rows.append([f"raw SQLite INSERT+COMMIT of {len(payload)} B ({mode})", fmt_time(floor),
                     "1.0x", ""])
        for key, label in (("save_1k", "save ~1 KiB state"),
                           ("save_1k_changed_hint", "save ~1 KiB state, changed=['i']")):
            value = saves[mode][key]
            target = "<= 4x floor" if mode == "normal" or key == "save_1k" else ""
            rows.append([f"{label} ({mode})", fmt_time(value),
                         f"{saves[mode][key + '_ratio']:.1f}x", target])
    normal = floors["normal"]
    rows += [
        ["save, 1 MiB field unchanged (content compared)", fmt_time(big["save_1mib_unchanged"]),
         f"{big['save_1mib_unchanged'] / normal:.1f}x", ""],
        ["save, 1 MiB field unchanged, changed=['i']",
         fmt_time(big["save_1mib_unchanged_changed_hint"]),
         f"{big['save_1mib_unchanged_changed_hint'] / normal:.1f}x", ""],
        ["on disk after 200 saves with an unchanged 1 MiB field",
         fmt_bytes(big["bytes_200_saves_1mib_on_disk"]), "", "< 2 MiB (SqliteSaver: 203 MiB)"],
        ["restore latest, 10 checkpoints in history", fmt_time(hist["restore_latest_10"]),
         f"{hist['restore_latest_10'] / normal:.1f}x", "<= 1 ms"],
        [f"restore latest, {hist['history_size']:,} checkpoints in history",
         fmt_time(hist[f"restore_latest_{big_history}"]),
         f"{hist[f'restore_latest_{big_history}'] / normal:.1f}x", "<= 1 ms, same as 10"],
        ["restore latest, freshly opened store", fmt_time(hist["restore_latest_cold_open"]), "",
         ""],
        ["list 10,000 history entries", fmt_time(hist["history_10000"]), "", "<= 50 ms"],
    ]
    markdown = table(["what (median)", "time / size", "vs raw floor", "target"], rows)
    command = "python bench/store.py" + (" --quick" if args.quick else "")
    print(markdown)
    path = save_results(
        "store", command, {"floors": floors, "saves": saves, "big": big, "history": hist},
        markdown,
    )
    print(f"\n(results written to {path})")


if __name__ == "__main__":
    main()
