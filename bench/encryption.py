"""Encryption at rest benchmark (issue #31): what sealing the blob store costs, side by side
with the same work unsealed and with ``cryptography``'s own AES-GCM, in one run.

    .venv/bin/python bench/encryption.py            # 256 MiB, 5 interleaved rounds
    .venv/bin/python bench/encryption.py --quick    # 64 MiB, 2 rounds

* array save: a new 256 MiB float32 array saved with ``durability="full"`` to a SQLite store
  with its blob directory, sealed against not (target <= 1.3x);
* sealing speed: ``Encryption.seal`` of 1 MiB chunks (a header byte and a view of the array,
  as a save hands them over) on one thread, against ``AESGCM.encrypt`` of the same bytes
  (joined, as it needs them) (target >= 80%);
* small step: a save of ~1 KiB of agent state (no value reaches the blob store), sealed
  store against plain (target <= 1.1x).

Ratios are medians of per-round ratios (a round's figures taken one right after the other).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import base_state, fmt_time, median_ratio, save_results, table

import pitstop
from pitstop import Encryption

MiB = 1 << 20


def save_array(root: Path, size: int, ring: Encryption | None, seed: int) -> float:
    array = np.random.default_rng(seed).standard_normal(size // 4, dtype=np.float32)
    path = root / f"{'sealed' if ring else 'plain'}-{seed}.db"
    with pitstop.open_store(f"sqlite:///{path}", durability="full", encryption=ring) as store:
        os.sync()
        t0 = time.perf_counter()
        store.save("train", {"w": array, "step": seed})
        return time.perf_counter() - t0


def small_steps(stores: dict[str, pitstop.Store], steps: int) -> dict[str, float]:
    """Seconds per save of a small step on each store after 100 saves of warm-up (the run's
    first saves make its row and fill the caches), the stores taking turns (20 saves
    each, the first of a turn alternating) so that both meet the same moments of the
    machine."""
    state = base_state()
    for store in stores.values():  # warm: the run's first saves (its row, the caches) apart
        for j in range(100):
            store.save("agent", {**state, "i": j})
    took = dict.fromkeys(stores, 0.0)
    names = list(stores)
    for i in range(0, steps, 20):
        turn = names if i % 40 == 0 else names[::-1]  # who goes first alternates
        for name in turn:
            store = stores[name]
            t0 = time.perf_counter()
            for j in range(i, i + 20):
                store.save("agent", {**state, "i": j})
            took[name] += time.perf_counter() - t0
    return {name: seconds / steps for name, seconds in took.items()}


def sealing(ring: Encryption, chunks: int) -> tuple[float, float]:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    body = np.random.default_rng(1).bytes(chunks * MiB)
    view = memoryview(body)
    pieces = [(b"\x01", view[i * MiB : (i + 1) * MiB]) for i in range(chunks)]
    keys = [os.urandom(17) for _ in range(chunks)]
    t0 = time.perf_counter()
    for key, parts in zip(keys, pieces, strict=True):
        ring.seal(key, parts)
    ours = time.perf_counter() - t0
    cipher = AESGCM(ring.keys[ring.current])
    joined = [b"".join(parts) for parts in pieces]
    t0 = time.perf_counter()
    for key, data in zip(keys, joined, strict=True):
        cipher.encrypt(os.urandom(12), data, key)
    theirs = time.perf_counter() - t0
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    size = (64 if args.quick else 256) * MiB
    rounds = args.rounds or (2 if args.quick else 5)
    ring = Encryption(keys={"k1": os.urandom(32)}, current="k1")
    root = Path(tempfile.mkdtemp())
    sealed_saves, plain_saves, ours, theirs, sealed_small, plain_small = [], [], [], [], [], []
    try:
        for r in range(rounds):
            # Who goes first alternates by round: the second of two back-to-back saves of
            # 256 MiB meets the first one's writeback on a busy machine.
            if r % 2:
                sealed_saves.append(save_array(root, size, ring, r))
                plain_saves.append(save_array(root, size, None, r))
            else:
                plain_saves.append(save_array(root, size, None, r))
                sealed_saves.append(save_array(root, size, ring, r))
            for path in root.iterdir():  # keep the disk's free space as it was
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            o, t = sealing(ring, size // MiB)
            ours.append(o)
            theirs.append(t)
            with pitstop.open_store(f"sqlite:///{root / 'small-plain.db'}") as plain, \
                    pitstop.open_store(f"sqlite:///{root / 'small-sealed.db'}",
                                       encryption=ring) as sealed:
                step = small_steps({"plain": plain, "sealed": sealed}, 600)
            plain_small.append(step["plain"])
            sealed_small.append(step["sealed"])
            print(f"round {r}: save {fmt_time(sealed_saves[-1])} sealed vs "
                  f"{fmt_time(plain_saves[-1])}; seal {fmt_time(o)} vs {fmt_time(t)}; "
                  f"step {fmt_time(sealed_small[-1])} vs {fmt_time(plain_small[-1])}",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mib = size // MiB
    save_x = median_ratio(sealed_saves, plain_saves)
    seal_x = median_ratio(theirs, ours)
    step_x = median_ratio(sealed_small, plain_small)
    rows = [
        [f"save {mib} MiB array, durability=full", f"{save_x:.2f}x the unsealed save",
         "<= 1.3x"],
        [f"sealing {mib} x 1 MiB chunks, one thread",
         f"{seal_x:.0%} of cryptography's AES-GCM", ">= 80%"],
        ["small agent step (~1 KiB state)", f"{step_x:.2f}x the unsealed save", "<= 1.1x"],
    ]
    markdown = table(["case", "sealed", "target"], rows)
    print(markdown)
    load = os.getloadavg()[0]
    print(f"(load average {load:.1f}, {rounds} rounds)")
    save_results("encryption", " ".join(["bench/encryption.py", *sys.argv[1:]]),
                 {"save_ratio": save_x, "seal_speed": seal_x, "step_ratio": step_x,
                  "load_average": load}, markdown)


if __name__ == "__main__":
    main()
