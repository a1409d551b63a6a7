"""pitstop.Checkpointer: checkpoints for plain loops, synchronous and asynchronous."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import pitstop
from conftest import ROOT
from pitstop import Checkpointer, CheckpointPolicy, RetentionPolicy


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'loop.db'}"


def test_restore_default_then_latest(url: str) -> None:
    with Checkpointer(url, "train") as ckpt:
        assert ckpt.restore(default={"step": 0}) == {"step": 0}
        assert ckpt.save({"step": 1})
        assert ckpt.save({"step": 2, "w": np.arange(3.0)})
    with Checkpointer(url, "train") as ckpt:
        state = ckpt.restore()
        assert state["step"] == 2 and state["w"].tolist() == [0.0, 1.0, 2.0]


def test_policy_decides_which_saves_are_taken(url: str) -> None:
    built = []

    def state() -> dict[str, int]:
        built.append(1)
        return {"n": len(built)}

    with Checkpointer(url, "r", policy=CheckpointPolicy(every=4)) as ckpt:
        taken = [ckpt.save(state) for _ in range(9)]
        assert taken == [False, False, False, True, False, False, False, True, False]
        assert len(built) == 2  # the callable runs only for a checkpoint
        assert ckpt.save(state, force=True)
    with pitstop.open_store(url) as store:
        history = store.history("r")
        assert [c.metadata["iteration"] for c in history] == [10, 8, 4]
        assert all(c.metadata["source"] == "loop" for c in history)


def test_state_must_be_a_mapping(url: str) -> None:
    with Checkpointer(url, "r") as ckpt, pytest.raises(TypeError, match=r"'r'.*mapping"):
        ckpt.save([1, 2])  # type: ignore[arg-type]


def test_one_process_owns_the_run(url: str) -> None:
    with Checkpointer(url, "r"), pytest.raises(pitstop.RunBusyError):
        Checkpointer(url, "r")
    with Checkpointer(url, "r") as ckpt:  # released on close
        ckpt.save({"a": 1})


# -- asynchronous saves ------------------------------------------------------------------------

class Gate:
    """A registered value whose encoding blocks until the test opens the gate: holds a
    background write in flight for as long as the test needs."""

    opened = threading.Event()
    entered = threading.Event()

    def __init__(self, tag: int) -> None:
        self.tag = tag


def _encode_gate(gate: Gate) -> int:
    Gate.entered.set()
    assert Gate.opened.wait(30)
    return gate.tag


pitstop.register(Gate, name="test.gate", encode=_encode_gate, decode=Gate)


def test_async_snapshot_is_consistent(url: str) -> None:
    weights = np.zeros(1000, dtype=np.float32)
    with Checkpointer(url, "r", async_save=True) as ckpt:
        assert ckpt.save({"w": weights, "meta": {"lr": [0.1]}, "step": 1})
        weights += 1  # in-place updates after save() do not reach the snapshot
        ckpt.wait()
        assert ckpt.latest is not None
        assert ckpt.latest.state["w"].sum() == 0


def test_at_most_one_save_in_flight(url: str) -> None:
    Gate.opened.clear()
    Gate.entered.clear()
    with Checkpointer(url, "r", async_save=True) as ckpt:
        assert ckpt.save({"g": Gate(1)})
        assert Gate.entered.wait(10)
        assert ckpt.save({"g": Gate(2)}) is False  # due, but the first is being written
        assert ckpt.save({"g": Gate(3)}) is False
        Gate.opened.set()
        ckpt.wait()
        assert ckpt.save({"g": Gate(4)})  # still due: taken at the first call after the write
        ckpt.wait()
        assert ckpt.latest is not None and ckpt.latest.state["g"].tag == 4
        Gate.opened.clear()
        assert ckpt.save({"g": Gate(5)})
        threading.Timer(0.2, Gate.opened.set).start()
        assert ckpt.save({"g": Gate(6)}, force=True)  # force waits for the write in flight
        ckpt.wait()
        assert ckpt.latest is not None and ckpt.latest.state["g"].tag == 6


def test_background_errors_surface_on_the_next_call(url: str) -> None:
    with Checkpointer(url, "r", async_save=True) as ckpt:
        assert ckpt.save({"bad": object()})
        with pytest.raises(pitstop.SerializationError, match=r"state\.bad"):
            ckpt.wait()
        assert ckpt.save({"ok": 1})


def test_async_snapshot_of_torch_state() -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
    model = torch.nn.Linear(4, 2)
    store = pitstop.open_store("memory://")
    with Checkpointer(store, "r", async_save=True) as ckpt:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        ckpt.save(lambda: {"model": model.state_dict()})
        with torch.no_grad():
            model.weight.add_(1.0)  # the optimizer's in-place step
        ckpt.wait()
        saved = store.latest("r")
        assert saved is not None
        for key, value in before.items():
            assert torch.equal(saved.state["model"][key], value)


# -- runs of loops are ordinary runs -----------------------------------------------------------

@pytest.mark.slow
def test_history_fork_retention_verify_and_cli(url: str) -> None:
    with Checkpointer(url, "train", retention=RetentionPolicy(keep_last=2)) as ckpt:
        for step in range(5):
            ckpt.save({"step": step, "w": np.full(64, step, dtype=np.float64)})
    with pitstop.open_store(url) as store:
        history = store.history("train")
        assert [c.step for c in history] == [4, 3]  # older ones pruned
        forked = store.fork(history[1].id, new_run_id="train-b", update={"lr": 0.5})
        assert not store.verify()
    with Checkpointer(url, "train-b") as ckpt:
        state = ckpt.restore()
        assert state["step"] == 3 and state["lr"] == 0.5
        ckpt.save({**state, "step": 4})
    with pitstop.open_store(url) as store:
        latest = store.latest("train-b")
        assert latest is not None and latest.parent_id == forked.id
    env = {**os.environ, "PITSTOP_STORE": url}
    out = subprocess.run([sys.executable, "-m", "pitstop", "history", "train", "--json"],
                         capture_output=True, text=True, env=env, check=True, cwd=ROOT).stdout
    assert "train" in out and json.loads(out)


# -- rng state ---------------------------------------------------------------------------------

def test_rng_state_round_trips_through_a_store() -> None:
    import random

    random.seed(1)
    np.random.seed(2)
    store = pitstop.open_store("memory://")
    store.save("r", {"rng": pitstop.rng_state()})
    expected = (random.random(), np.random.rand())
    random.seed(99)
    np.random.seed(99)
    latest = store.latest("r")
    assert latest is not None
    pitstop.set_rng_state(latest.state["rng"])
    assert (random.random(), np.random.rand()) == expected
    with pytest.raises(ValueError, match="unknown keys"):
        pitstop.set_rng_state({"cuda": b""})


def test_rng_state_of_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
    torch.manual_seed(3)
    state = pitstop.rng_state()
    assert isinstance(state["torch"], bytes)
    expected = torch.rand(3)
    torch.manual_seed(4)
    store = pitstop.open_store("memory://")
    store.save("r", {"rng": state})
    latest = store.latest("r")
    assert latest is not None
    pitstop.set_rng_state(latest.state["rng"])
    assert torch.equal(torch.rand(3), expected)


def test_rng_state_does_not_import_numpy_or_torch() -> None:
    code = "import pitstop, sys; s = pitstop.rng_state(); print(sorted(s), 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['python'] False"


# -- SIGKILL during a background write ---------------------------------------------------------

WRITER = """
import sys, numpy as np, pitstop
url, blobs = sys.argv[1], sys.argv[2]
store = pitstop.open_store(url, blobs=blobs, blob_threshold=1 << 16)
with pitstop.Checkpointer(store, "r", async_save=True) as ckpt:
    state = ckpt.restore(default={"n": 0})
    n = state["n"]
    print("resumed", n, flush=True)
    while True:
        n += 1
        w = np.full(1 << 20, n, dtype=np.float32)   # 4 MiB a checkpoint
        if ckpt.save({"n": n, "w": w, "also": np.full(1 << 16, n, dtype=np.int64)}):
            print("saving", n, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_async_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    import random
    import time

    url = f"sqlite:///{tmp_path / 'kill.db'}"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rounds = random.Random(7)
    last = 0
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, str(script), url, str(tmp_path / "blobs")],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        resumed = int(proc.stdout.readline().split()[1])
        assert resumed >= last  # never goes back past a checkpoint that was fully written
        time.sleep(rounds.uniform(0.2, 1.0))
        proc.kill()  # SIGKILL: wherever the background write is
        proc.wait()
        with pitstop.open_store(url, blobs=str(tmp_path / "blobs")) as store:
            latest = store.latest("r")
            assert latest is not None
            n = latest.state["n"]
            assert (latest.state["w"] == n).all() and (latest.state["also"] == n).all()
            assert not [p for p in store.verify() if p.kind != "blob"]
            last = n


def test_a_loop_keeps_its_last_three_checkpoints_and_tagged_ones_by_default(
    tmp_path: Path,
) -> None:
    """20 checkpoints of a model are 20 copies of its weights: by default a Checkpointer
    keeps the newest 3 and every tagged one, and the SQLite file shrinks back (#30)."""
    path = tmp_path / "train.db"
    weights = 1 << 20
    with pitstop.open_store(f"sqlite:///{path}", blobs=False) as store:
        with Checkpointer(store, "train") as ckpt:
            for step in range(20):
                state = {"weights": np.random.default_rng(step).random(weights // 8),
                         "step": step}
                ckpt.save(state, tags=["best"] if step == 5 else ())
        kept = [c.metadata["iteration"] for c in store.history("train", limit=None)]
        assert kept == [20, 19, 18, 6]  # the newest 3 and the one tagged "best"
    assert path.stat().st_size < 6 * weights  # 4 states kept, not 20
    with pitstop.open_store(f"sqlite:///{path}") as store:
        with Checkpointer(store, "all", retention=None) as ckpt:
            for step in range(5):
                ckpt.save({"step": step})
        assert len(store.history("all", limit=None)) == 5


def test_retention_can_keep_every_nth_checkpoint(url: str) -> None:
    policy = RetentionPolicy(keep_last=2, keep_every=5, keep_milestones=False)
    with pitstop.open_store(url) as store:
        with Checkpointer(store, "sparse", retention=policy) as ckpt:
            for step in range(12):
                ckpt.save({"step": step})
        steps = [c.step for c in store.history("sparse", limit=None)]
    assert steps == [11, 10, 5, 0]
    with pytest.raises(ValueError, match="keep_every must be at least 1"):
        RetentionPolicy(keep_every=0)
