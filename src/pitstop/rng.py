"""Random number generator state, captured into a checkpoint and put back on resume.

A training run resumed from a checkpoint is bit-identical to an uninterrupted one only if its
random streams (dropout masks, shuffling, augmentation) continue where they stopped.
:func:`rng_state` captures Python's ``random``, numpy's global generator and torch's CPU
generator as plain values the safe serialiser stores; :func:`set_rng_state` restores them.
numpy and torch are captured only when the process has imported them, so calling this never
imports either.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping
from typing import Any


def epoch_order(size: int, *, seed: int, epoch: int) -> list[int]:
    """The indices ``0 .. size-1`` in the shuffled order of epoch ``epoch``.

    The same ``(seed, epoch)`` gives the same order in every process, before and after a
    resume, whatever the program's random generators hold: the order depends on nothing
    else, so a checkpoint needs only the epoch (and ``iterate``'s position within it) to
    continue the epoch exactly. Reshuffling with ``torch.randperm`` at each epoch's start
    instead makes a resume mid-epoch draw a different order (the generator's state at the
    epoch's start is gone), and the run is no longer bit-identical.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, not {size}")
    order = list(range(size))
    # A string seed is hashed with SHA-512 (random's version 2 seeding): stable across
    # Python versions and platforms, and no two (seed, epoch) pairs share a stream.
    random.Random(f"pitstop.epoch_order:{seed}:{epoch}").shuffle(order)
    return order


def rng_state() -> dict[str, Any]:
    """The state of ``random``, numpy's global generator and torch's CPU generator.

    Keys: ``"python"`` always; ``"numpy"`` and ``"torch"`` when those are imported. The
    torch state is kept as bytes, so a checkpoint holding it loads without torch.
    Generators the program made itself (``numpy.random.default_rng()``, ``torch.Generator``)
    are not global: put their states in the checkpoint yourself (``gen.bit_generator.state``,
    ``gen.get_state()``).
    """
    state: dict[str, Any] = {"python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state(legacy=False)
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state().numpy().tobytes()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore generators from :func:`rng_state`'s result (those present in ``state``).

    Raises ``ValueError`` if ``state`` holds a numpy or torch state and that library is not
    installed: continuing with a fresh stream would silently change the run.
    """
    unknown = set(state) - {"python", "numpy", "torch"}
    if unknown:
        raise ValueError(f"not an rng_state(): unknown keys {sorted(unknown)}")
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        try:
            import numpy
        except ImportError as exc:
            raise ValueError("the state holds numpy's generator; numpy is not installed") from exc
        numpy.random.set_state(dict(state["numpy"]))
    if "torch" in state:
        try:
            import torch
        except ImportError as exc:
            raise ValueError("the state holds torch's generator; torch is not installed") from exc
        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))


__all__ = ["epoch_order", "rng_state", "set_rng_state"]
