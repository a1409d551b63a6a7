"""Training that survives SIGKILL: a small torch model on synthetic data, resumed bit for bit.

    python examples/train.py                       # train (or resume) run "train-demo"
    python examples/train.py --steps 400 --async   # asynchronous snapshots
    python examples/train.py demo                  # kill it three times, resume, compare

Every checkpoint holds the model's and the optimizer's ``state_dict()``, the step and
``pitstop.rng_state()`` (batch sampling and dropout draw from torch's generator). A process
killed at any moment and started again continues from the latest checkpoint and ends with
weights bit-identical to a run that was never interrupted; ``demo`` shows it. The last line
printed is the SHA-256 of the final weights. No data is downloaded: the data set is made
from a fixed seed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

import pitstop


def make_data(n: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed synthetic regression task (its own generator: not part of the run's RNG)."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 32, generator=gen)
    y = torch.sin(x @ torch.randn(32, 4, generator=gen)) + 0.05 * torch.randn(n, 4, generator=gen)
    return x, y


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(128, 4)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)


def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def train(store: str, run_id: str, steps: int, every: int, async_save: bool,
          step_delay: float) -> str:
    torch.set_num_threads(1)  # one thread: reductions in a fixed order, bit for bit
    x, y = make_data()
    model, opt = make_model()
    policy = pitstop.CheckpointPolicy(every=every)
    with pitstop.Checkpointer(store, run_id, policy=policy, async_save=async_save) as ckpt:
        state = ckpt.restore(default=None)
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            pitstop.set_rng_state(state["rng"])
            start = state["step"]
        print(f"training from step {start}", flush=True)
        for step in range(start, steps):
            batch = torch.randint(0, len(x), (64,))
            model.train()
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            # Read when a checkpoint is taken, right after this step's update.
            ckpt.save(lambda step=step: {"model": model.state_dict(), "optim": opt.state_dict(),
                                         "step": step + 1, "rng": pitstop.rng_state()})
            if step_delay:
                time.sleep(step_delay)
        ckpt.save(lambda: {"model": model.state_dict(), "optim": opt.state_dict(),
                           "step": steps, "rng": pitstop.rng_state()}, force=True)
    digest = weights_digest(model)
    print(f"final weights sha256 {digest}", flush=True)
    return digest


def demo(args: argparse.Namespace) -> None:
    """An uninterrupted run, then the same run SIGKILLed three times and resumed."""
    with tempfile.TemporaryDirectory() as tmp:
        base = [sys.executable, __file__, "--steps", str(args.steps), "--every", "7"]
        clean = subprocess.run([*base, "--store", f"sqlite:///{tmp}/clean.db"],
                               capture_output=True, text=True, check=True)
        expected = clean.stdout.split()[-1]
        url = f"sqlite:///{tmp}/killed.db"
        rng = random.Random(args.seed)
        watch = pitstop.open_store(url)
        for _ in range(3):
            before = _checkpointed_step(watch, args.run_id)
            proc = subprocess.Popen([*base, "--store", url, "--step-delay", "0.005"],
                                    stdout=subprocess.DEVNULL)
            # Kill only once this process has checkpointed: importing torch alone can take
            # seconds, and a kill before training began would prove nothing.
            while _checkpointed_step(watch, args.run_id) == before:
                if proc.poll() is not None:
                    sys.exit(f"the training process ended early (exit {proc.returncode})")
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.kill()
            proc.wait()
            print(f"killed with SIGKILL (exit {proc.returncode}) after it had checkpointed "
                  f"step {_checkpointed_step(watch, args.run_id)}")
        watch.close()
        done = subprocess.run([*base, "--store", url], capture_output=True, text=True, check=True)
        print(done.stdout.splitlines()[0])
        got = done.stdout.split()[-1]
        print(f"uninterrupted: {expected}\nkilled+resumed: {got}")
        print("bit-identical" if got == expected else "DIFFERENT")
        sys.exit(0 if got == expected else 1)


def _checkpointed_step(store: pitstop.Store, run_id: str) -> int:
    """The step of the run's latest checkpoint (-1: none yet), read without its state."""
    try:
        head = store.get_run(run_id).head_id
    except pitstop.RunNotFoundError:
        return -1
    return -1 if head is None else int(store.summary(head).metadata.get("iteration", 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["train", "demo"], default="train")
    parser.add_argument("--store", default=os.environ.get("PITSTOP_STORE", "sqlite:///train.db"))
    parser.add_argument("--run-id", default="train-demo")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--async", dest="async_save", action="store_true")
    parser.add_argument("--step-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args: Any = parser.parse_args(argv)
    if args.command == "demo":
        demo(args)
    else:
        train(args.store, args.run_id, args.steps, args.every, args.async_save, args.step_delay)


if __name__ == "__main__":
    main()
