"""The recipes of docs/training.md resume bit for bit after a SIGKILL (issue #30).

Each recipe (examples/training_recipes.py, included in the guide as written) runs once
uninterrupted, once SIGKILLed by itself at a chosen step in a subprocess and then resumed:
the final weights match. Epochs that reshuffle, a learning-rate scheduler and a batch fetched
before the optimizer step each broke this before the guide said how.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import pitstop
from conftest import ROOT

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")

SCRIPT = ROOT / "examples" / "training_recipes.py"


@pytest.fixture(scope="module")
def recipes() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("training_recipes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script does: reductions in a fixed order
    yield module
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("recipe", "kill_at"), [("epochs", 11), ("schedule", 23),
                                                 ("prefetch", 22)])
def test_a_recipe_killed_mid_run_ends_with_the_same_weights(
    recipes: ModuleType, tmp_path: Path, recipe: str, kill_at: int
) -> None:
    train = recipes.RECIPES[recipe]
    never = recipes.die_at(None)
    expected = train(f"sqlite:///{tmp_path / 'clean.db'}", recipe, never)
    killed = f"sqlite:///{tmp_path / 'killed.db'}"
    done = subprocess.run([sys.executable, str(SCRIPT), recipe, "--store", killed,
                           "--die-at", str(kill_at)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == -9, done.stderr
    with pitstop.open_store(killed) as store:
        latest = store.latest(recipe)
        assert latest is not None and 0 < latest.state["step"] < kill_at  # resumed mid-run
    assert train(killed, recipe, never) == expected


def test_epoch_order_depends_on_seed_and_epoch_only() -> None:
    first = pitstop.epoch_order(100, seed=7, epoch=0)
    assert sorted(first) == list(range(100)) and first != list(range(100))
    torch.manual_seed(123)  # the program's generators play no part
    assert pitstop.epoch_order(100, seed=7, epoch=0) == first
    assert pitstop.epoch_order(100, seed=7, epoch=1) != first
    assert pitstop.epoch_order(100, seed=8, epoch=0) != first
    assert pitstop.epoch_order(0, seed=7, epoch=0) == []


def test_the_training_guide_shows_each_recipe_as_tested() -> None:
    guide = (ROOT / "docs" / "training.md").read_text()
    code = SCRIPT.read_text()
    for recipe in ("epochs", "schedule", "prefetch"):
        assert f'--8<-- "training_recipes.py:{recipe}"' in guide
        assert f"# --8<-- [start:{recipe}]" in code and f"# --8<-- [end:{recipe}]" in code
