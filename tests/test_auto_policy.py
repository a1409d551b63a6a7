"""CheckpointPolicy.auto: the interval follows measured costs; deterministic with a fake clock."""

from __future__ import annotations

import math
from typing import Any

import pytest

import pitstop
from pitstop import CheckpointPolicy, RunStatus, Store, Workflow


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def simulate(policy: CheckpointPolicy, *, step: float, cost: float, seconds: float) -> float:
    """A loop of ``step``-second iterations whose checkpoints take ``cost`` seconds, for
    ``seconds`` of simulated time; returns the share of time spent checkpointing."""
    clock = FakeClock()
    schedule = policy.schedule(clock)
    start, spent = clock.now, 0.0
    while clock.now - start < seconds:
        clock.advance(step)
        if schedule.due():
            clock.advance(cost)
            spent += cost
            schedule.taken(cost)
    return spent / (clock.now - start)


def test_overhead_budget_is_met_for_the_issue_loop() -> None:
    # 10 ms steps, 200 ms checkpoints, a 2% budget: the measured overhead lands in 1-3%.
    overhead = simulate(CheckpointPolicy.auto(overhead=0.02), step=0.01, cost=0.2, seconds=600)
    assert 0.01 <= overhead <= 0.03
    assert overhead == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("budget", [0.01, 0.05, 0.2])
@pytest.mark.parametrize(("step", "cost"), [(0.001, 0.05), (0.1, 2.0), (0.5, 0.01)])
def test_overhead_tracks_the_budget(budget: float, step: float, cost: float) -> None:
    interval = cost * (1 - budget) / budget
    overhead = simulate(CheckpointPolicy.auto(overhead=budget), step=step, cost=cost,
                        seconds=40 * interval)
    # Decisions fall on step boundaries (within half a step of the aimed interval), and the
    # first checkpoint, at the start, is one more than the interval accounts for.
    slack = step / 2 / interval + 1 / 40
    assert overhead == pytest.approx(budget, rel=0.05 + slack)


def test_young_daly_with_mtbf() -> None:
    clock = FakeClock()
    schedule = CheckpointPolicy.auto(overhead=0.05, mtbf=3600).schedule(clock)
    assert schedule.due()  # the first chance measures the cost
    schedule.taken(2.0)
    assert schedule.interval == pytest.approx(math.sqrt(2 * 2.0 * 3600))  # 120 s > 38 s budget
    # With a short MTBF the optimum would checkpoint more often than the budget allows.
    capped = CheckpointPolicy.auto(overhead=0.05, mtbf=10).schedule(clock)
    capped.due()
    capped.taken(2.0)
    assert capped.interval == pytest.approx(2.0 * 0.95 / 0.05)


def test_cost_is_a_moving_average_and_forced_saves_do_not_count() -> None:
    clock = FakeClock()
    schedule = CheckpointPolicy.auto(overhead=0.1).schedule(clock)
    schedule.due()
    schedule.taken(1.0)
    schedule.taken(None)  # a forced checkpoint
    assert schedule.cost == 1.0
    schedule.taken(2.0)
    assert 1.0 < (schedule.cost or 0) < 2.0


def test_checkpointer_uses_the_policy_with_its_clock(tmp_path: object) -> None:
    clock = FakeClock()
    store = pitstop.open_store("memory://")
    taken = []
    with pitstop.Checkpointer(store, "r", policy=CheckpointPolicy.auto(overhead=0.5),
                              clock=clock) as ckpt:
        for _ in range(40):
            clock.advance(1.0)  # one second of work per iteration

            def state() -> dict[str, float]:
                clock.advance(0.5)  # building and writing the checkpoint: half a second
                return {"t": clock.now}

            taken.append(ckpt.save(state))
    # cost 0.5 s at a 50% budget: one checkpoint per ~0.5 s of work, i.e. at every call.
    assert taken[0] and sum(taken) >= 35
    with pitstop.Checkpointer(store, "r2", policy=CheckpointPolicy.auto(overhead=0.05),
                              clock=clock) as ckpt:
        flags = []
        for _ in range(100):
            clock.advance(1.0)

            def costly() -> dict[str, int]:
                clock.advance(2.0)
                return {}

            flags.append(ckpt.save(costly))
    # cost 2 s at 5%: every 38 s of work.
    assert [i for i, f in enumerate(flags) if f] == [0, 38, 76]


def test_validation() -> None:
    with pytest.raises(ValueError, match="overhead"):
        CheckpointPolicy.auto(overhead=0)
    with pytest.raises(ValueError, match="mtbf"):
        CheckpointPolicy.auto(mtbf=-1)
    fixed = CheckpointPolicy(every=2).schedule(FakeClock())
    assert [fixed.due() for _ in range(4)] == [False, True, True, True]
    assert fixed.interval is None


def test_auto_policy_in_a_workflow_measures_and_spaces_checkpoints(store: Store) -> None:
    wf = Workflow("auto-steps", policy=CheckpointPolicy.auto(overhead=0.01))

    @wf.step
    def work(state: dict[str, Any]) -> Any:
        update = {"i": state["i"] + 1}
        return pitstop.goto("work", update) if update["i"] < 300 else update

    result = wf.start(store, {"i": 0})
    assert result.status is RunStatus.COMPLETED and result.state["i"] == 300
    # A 1% budget with steps cheaper than a checkpoint: far fewer checkpoints than steps
    # (the input's, the first step's that measures the cost, and the completion's at least).
    assert 3 <= len(store.history(result.run_id, limit=None)) < 100
