"""SIGKILL during saves to object storage: the harness shared by tests/test_objects.py (a
few rounds) and bench/objects_kill.py (fifty).

A fork server (one interpreter that imported pitstop and numpy once) forks a saver per
round; the saver opens the store (its own S3 client: nothing of the network is inherited
through the fork) and saves a growing run of large arrays and documents as fast as it can,
and is killed at a random moment after its first save. Then a fresh handle checks the store:
every run's head loads (no torn checkpoint), ``verify`` finds nothing but orphaned objects,
and ``prune`` removes those, leaving every object some row references.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SAVER = r"""
import os, signal, sys, time
import numpy as np
import pitstop

def save_forever(url, blobs, first_saved):
    rng = np.random.default_rng(os.getpid())
    run = f"r{os.getpid() % 4}"
    keys = os.environ.get("PITSTOP_KILL_KEYS")
    sealed = {"encryption": keys} if keys else {}
    with pitstop.open_store(url, blobs=blobs, blob_threshold=100_000, **sealed) as store:
        head = store.latest(run)
        state = dict(head.state) if head else {"w": rng.standard_normal(1 << 20).astype("f4"),
                                                "i": 0}
        while True:
            w = np.array(state["w"])
            w[rng.integers(0, w.size, 3)] = rng.standard_normal(3)  # a few chunks change
            state = {"w": w, "doc": os.urandom(150_000), "i": state["i"] + 1}
            store.save(run, state)
            if first_saved is not None:
                os.write(first_saved, b"s")
                os.close(first_saved)
                first_saved = None

for line in sys.stdin:
    ready, first_saved = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready)
        try:
            save_forever(sys.argv[1], sys.argv[2], first_saved)
        finally:
            os._exit(1)
    os.close(first_saved)
    got = os.read(ready, 1)
    os.close(ready)
    if got:
        time.sleep(float(line))
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    print("killed" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
          else f"ended {os.waitstatus_to_exitcode(status)}", flush=True)
"""


@dataclass
class Outcome:
    kills: int = 0
    saves: int = 0
    """Checkpoints found after the last round."""
    orphans_found: int = 0
    """Objects ``verify`` named as unreferenced before the prune (what kills left)."""
    problems: list[str] = field(default_factory=list)
    """Anything else: a head that does not load, a missing object, orphans after the prune."""


def kill_saves(url: str, blobs: str, rounds: int, *, seed: int = 0,
               max_delay: float = 0.4, encryption: str | None = None) -> Outcome:
    """``encryption``: ``env:NAME``, the savers' and the checker's key ring (sealed blobs)."""
    import pitstop

    rng = random.Random(seed)
    outcome = Outcome()
    server = subprocess.Popen(
        [sys.executable, "-c", SAVER, url, blobs],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, **({"PITSTOP_KILL_KEYS": encryption} if encryption else {})},
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for _ in range(rounds):
            server.stdin.write(f"{rng.uniform(0, max_delay):.3f}\n")
            server.stdin.flush()
            answer = server.stdout.readline().strip()
            if answer == "killed":
                outcome.kills += 1
            else:
                outcome.problems.append(f"saver {answer or 'gave no answer'}")
    finally:
        server.stdin.close()
        server.wait(60)
    sealed = {"encryption": encryption} if encryption else {}
    with pitstop.open_store(url, blobs=blobs, blob_threshold=100_000, **sealed) as store:
        for run in store.runs():
            head = store.latest(run.id)  # strict: a torn head raises
            outcome.saves += len(store.history(run.id, limit=None))
            if head is None:
                outcome.problems.append(f"run {run.id} has no head")
        store.blobs.orphan_age = 0.0  # type: ignore[attr-defined]  # every saver is dead: nothing is about to commit
        for problem in store.verify():
            if "no record references" in problem.message:
                outcome.orphans_found += 1
            else:
                outcome.problems.append(str(problem))
        store.prune(pitstop.RetentionPolicy(keep_last=1000))
        outcome.problems.extend(
            f"after prune: {problem}"
            for problem in store.verify()
        )
    return outcome
