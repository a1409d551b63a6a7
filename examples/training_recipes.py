"""Training loops that resume bit for bit: the recipes of docs/training.md, runnable.

    python examples/training_recipes.py epochs   --store sqlite:///r.db
    python examples/training_recipes.py schedule --store sqlite:///r.db --die-at 23
    python examples/training_recipes.py prefetch --store sqlite:///r.db

Each recipe trains a small torch model on fixed synthetic data and prints the SHA-256 of its
final weights last. ``--die-at STEP`` SIGKILLs the process itself when it reaches that step
(a real kill, at a chosen place): running the same command again without it resumes, and
prints the same digest as a run that was never killed (tests/test_training_recipes.py).

* ``epochs``: epochs that reshuffle, with ``pitstop.epoch_order`` and ``ckpt.iterate``;
* ``schedule``: a learning-rate scheduler, built before the state is loaded;
* ``prefetch``: the next batch fetched before the optimizer step (as nanoGPT does), kept in
  the checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
from collections.abc import Callable
from typing import Any

import torch

import pitstop


def make_data(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression task (its own generator: not part of the run's random state)."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=gen)
    return x, torch.sin(x @ torch.randn(16, 2, generator=gen))


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(32, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> None:
    model.train()
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


Die = Callable[[int], None]


def die_at(step: int | None) -> Die:
    """A SIGKILL of this process when the loop reaches ``step`` (the tests' crash)."""
    def maybe(current: int) -> None:
        if current == step:
            os.kill(os.getpid(), signal.SIGKILL)
    return maybe


# --8<-- [start:epochs]
def train_epochs(store: str, run_id: str, die: Die, epochs: int = 3, batch: int = 32) -> str:
    x, y = make_data()
    model, opt = make_model()
    at = {"epoch": 0, "step": 0}  # where the loop is, saved with the weights

    def snapshot() -> dict[str, Any]:  # read when a checkpoint is taken
        return {"model": model.state_dict(), "optim": opt.state_dict(),
                "rng": pitstop.rng_state(), **at}

    with pitstop.Checkpointer(store, run_id) as ckpt:
        state = ckpt.restore(default=None)
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            pitstop.set_rng_state(state["rng"])
            at = {"epoch": state["epoch"], "step": state["step"]}
        while at["epoch"] < epochs:
            # The epoch's order depends on (seed, epoch) only: a resume mid-epoch gets the
            # same order back, and iterate() continues after the last checkpointed batch.
            order = pitstop.epoch_order(len(x), seed=0, epoch=at["epoch"])
            batches = [order[i:i + batch] for i in range(0, len(order), batch)]
            for indices in ckpt.iterate(batches, every=3, state=snapshot, name="batches"):
                train_step(model, opt, x[indices], y[indices])
                at["step"] += 1
                die(at["step"])
            at["epoch"] += 1
        ckpt.save(snapshot, force=True)
    return weights_digest(model)
# --8<-- [end:epochs]


# --8<-- [start:schedule]
def train_schedule(store: str, run_id: str, die: Die, steps: int = 40) -> str:
    x, y = make_data()
    model, opt = make_model()
    # Build the scheduler BEFORE loading: its constructor sets the optimizer's learning
    # rate to the schedule's first value, which would overwrite the one just loaded.
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)
    policy = pitstop.CheckpointPolicy(every=4)
    with pitstop.Checkpointer(store, run_id, policy=policy) as ckpt:
        state = ckpt.restore(default=None)
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            sched.load_state_dict(state["sched"])
            pitstop.set_rng_state(state["rng"])
            start = state["step"]
        for step in range(start, steps):
            batch = torch.randint(0, len(x), (32,))
            train_step(model, opt, x[batch], y[batch])
            sched.step()
            ckpt.save(lambda step=step: {
                "model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(), "rng": pitstop.rng_state(), "step": step + 1})
            die(step + 1)
    return weights_digest(model)
# --8<-- [end:schedule]


# --8<-- [start:prefetch]
def train_prefetch(store: str, run_id: str, die: Die, steps: int = 40) -> str:
    x, y = make_data()
    model, opt = make_model()

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.randint(0, len(x), (32,))
        return x[batch], y[batch]

    policy = pitstop.CheckpointPolicy(every=4)
    with pitstop.Checkpointer(store, run_id, policy=policy) as ckpt:
        state = ckpt.restore(default=None)
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            pitstop.set_rng_state(state["rng"])
            start = state["step"]
            xb, yb = state["batch"]  # the batch fetched before the checkpoint, not a new one
        else:
            xb, yb = get_batch()
        for step in range(start, steps):
            model.train()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            xb, yb = get_batch()  # fetch the next batch while this one's step is pending
            opt.zero_grad()
            loss.backward()
            opt.step()
            ckpt.save(lambda step=step, xb=xb, yb=yb: {
                "model": model.state_dict(), "optim": opt.state_dict(), "batch": (xb, yb),
                "rng": pitstop.rng_state(), "step": step + 1})
            die(step + 1)
    return weights_digest(model)
# --8<-- [end:prefetch]


RECIPES: dict[str, Callable[..., str]] = {
    "epochs": train_epochs, "schedule": train_schedule, "prefetch": train_prefetch}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--store", default=os.environ.get("PITSTOP_STORE", "sqlite:///train.db"))
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--die-at", type=int, default=None, help="SIGKILL at this step")
    args: Any = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: reductions in a fixed order, bit for bit
    digest = RECIPES[args.recipe](args.store, args.run_id or args.recipe, die_at(args.die_at))
    print(f"final weights sha256 {digest}", flush=True)


if __name__ == "__main__":
    main()
