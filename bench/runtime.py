"""Runtime benchmark (issue #3): what running a step under pitstop costs.

    .venv/bin/python bench/runtime.py            # full run
    .venv/bin/python bench/runtime.py --quick

1. Per-step cost of no-op steps on a ~1 KiB state, checkpointing after every step, with
   durability normal, full and background, next to the same loop of plain function calls.
2. The same workflow on LangGraph (a node looping through a conditional edge) with
   SqliteSaver as its docs set it up (SQLite's default ``synchronous=FULL``: an fsync per
   commit), with SqliteSaver on ``synchronous=NORMAL`` (no fsync, pitstop ``normal``'s
   promise), and without a checkpointer, when ``langgraph`` is installed (extra ``bench``).
3. Restart latency: from spawning ``python`` to the first resumed step of a run whose
   process was killed with SIGKILL (interpreter start and imports included).

Rounds are interleaved (each round measures every variant once) and ratios are the median
of the per-round ratios, so a slow spell of the shared machine lands on all variants alike.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # bench/_common.py (it takes bench/ off sys.path)
    base_state,
    fmt_time,
    langgraph_loop,
    median_ratio,
    noop,
    pitstop_loop,
    save_results,
    table,
    time_invoke,
)

import pitstop

ROOT = Path(__file__).resolve().parent.parent


WARMUP = 100  # untimed steps before each timed run: every variant is measured warm


def pitstop_once(tmp: Path, steps: int, durability: str, name: str) -> float:
    store = pitstop.open_store(f"sqlite:///{tmp / f'{name}.db'}")
    pitstop_loop(WARMUP, durability).start(store, base_state())
    t0 = time.perf_counter()
    result = pitstop_loop(steps, durability).start(store, base_state())
    elapsed = (time.perf_counter() - t0) / steps
    assert result.state["i"] == steps
    store.close()
    return elapsed


def plain_once(steps: int) -> float:
    state = base_state()
    t0 = time.perf_counter()
    while state["i"] < steps:
        state = {**state, **noop(state)}
    return (time.perf_counter() - t0) / steps


def langgraph_once(
    tmp: Path, steps: int, name: str, saver: bool, synchronous: str | None = None
) -> float | None:
    graph = langgraph_loop(steps)
    if graph is None:
        return None
    if saver:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(tmp / f"{name}.db", check_same_thread=False)
        checkpointer = SqliteSaver(conn)
        if synchronous is not None:  # SqliteSaver's default is SQLite's: FULL (an fsync)
            checkpointer.setup()
            conn.execute(f"PRAGMA synchronous={synchronous}")
        app = graph.compile(checkpointer=checkpointer)
    else:
        app = graph.compile()
    warm = langgraph_loop(WARMUP)
    warm_app = warm.compile(checkpointer=app.checkpointer) if saver else warm.compile()
    time_invoke(warm_app, base_state(), WARMUP, f"{name}-warmup")
    return time_invoke(app, base_state(), steps, name)


def interleaved(tmp: Path, steps: int, rounds: int) -> dict[str, list[float]]:
    """Every variant once per round, rounds in turn: a slow spell of this shared machine
    then lands on all of them alike, so per-round ratios stay meaningful."""
    samples: dict[str, list[float]] = {}
    for r in range(rounds):
        measured = {
            "plain": plain_once(steps),
            "normal": pitstop_once(tmp, steps, "normal", f"normal-{r}"),
            "full": pitstop_once(tmp, steps, "full", f"full-{r}"),
            "background": pitstop_once(tmp, steps, "background", f"background-{r}"),
            "langgraph_sqlite": langgraph_once(tmp, steps, f"lg-{r}", saver=True),
            "langgraph_sqlite_normal": langgraph_once(
                tmp, steps, f"lg-normal-{r}", saver=True, synchronous="NORMAL"
            ),
            "langgraph_none": langgraph_once(tmp, steps, f"lg-none-{r}", saver=False),
        }
        for key, value in measured.items():
            if value is not None:
                samples.setdefault(key, []).append(value)
    return samples


RESTART = """
import sys, time
sys.path.insert(0, sys.argv[3])
import pitstop
from runtime import restart_workflow
store = pitstop.open_store(sys.argv[1])
restart_workflow(sys.argv[2]).resume(store, "restart")
"""

SLOW_START = """
import sys
sys.path.insert(0, sys.argv[3])
import pitstop
from runtime import restart_workflow
store = pitstop.open_store(sys.argv[1])
restart_workflow(sys.argv[2]).start(store, {"n": 0}, run_id="restart")
"""


def restart_workflow(stamp: str) -> pitstop.Workflow:
    wf = pitstop.Workflow("restart")

    @wf.step
    def first(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 1}

    @wf.step
    def second(state: dict[str, Any]) -> dict[str, Any]:
        if not Path(stamp + ".armed").exists():
            Path(stamp + ".armed").write_text("x")
            time.sleep(60)  # killed here
        Path(stamp).write_text(repr(time.time()))
        return {"n": 2}

    return wf


def restart_latency(tmp: Path, rounds: int) -> float:
    samples = []
    here = str(Path(__file__).resolve().parent)
    for r in range(rounds):
        url = f"sqlite:///{tmp / f'restart-{r}.db'}"
        stamp = str(tmp / f"stamp-{r}")
        proc = subprocess.Popen([sys.executable, "-c", SLOW_START, url, stamp, here])
        while not Path(stamp + ".armed").exists():
            time.sleep(0.01)
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.time()
        subprocess.run([sys.executable, "-c", RESTART, url, stamp, here], check=True)
        samples.append(float(Path(stamp).read_text()) - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    steps = 300 if args.quick else 1000
    rounds = 3 if args.quick else 7

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        samples = interleaved(tmp, steps, rounds)
        restart = restart_latency(tmp, 5 if args.quick else 10)
    results: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    results["restart"] = restart
    if "langgraph_sqlite" in samples:
        for key, ours, theirs in (
            ("ratio_langgraph_sqlite", "normal", "langgraph_sqlite"),
            ("ratio_langgraph_sqlite_normal", "normal", "langgraph_sqlite_normal"),
            ("ratio_langgraph_sqlite_vs_full", "full", "langgraph_sqlite"),
        ):
            results[key] = median_ratio(samples[theirs], samples[ours])
    plain = results["plain"]

    def overhead(key: str) -> float:
        return float(results[key] - plain)

    rows = [["plain Python loop (no checkpoints)", fmt_time(plain), "", "", ""]]
    for durability in ("normal", "full", "background"):
        target = "<= 0.15 ms" if durability == "normal" else ""
        rows.append([f"pitstop, checkpoint every step, {durability}",
                     fmt_time(results[durability]), fmt_time(overhead(durability)), "", target])
    if "langgraph_sqlite" in results:
        lg, lg_none = results["langgraph_sqlite"], results["langgraph_none"]
        rows.append(["LangGraph, no checkpointer", fmt_time(lg_none), "", "", ""])
        rows.append(["LangGraph + SqliteSaver", fmt_time(lg), fmt_time(lg - lg_none),
                     f"{results['ratio_langgraph_sqlite']:.1f}x slower per step "
                     f"({(lg - lg_none) / overhead('normal'):.0f}x the checkpoint overhead)",
                     ">= 10x"])
        lg_normal = results["langgraph_sqlite_normal"]
        rows.append(["LangGraph + SqliteSaver, synchronous=NORMAL (no fsync, like pitstop normal)",
                     fmt_time(lg_normal), fmt_time(lg_normal - lg_none),
                     f"{results['ratio_langgraph_sqlite_normal']:.1f}x slower per step", ""])
        rows.append(["LangGraph + SqliteSaver (FULL) vs pitstop full (both fsync)", "", "",
                     f"{results['ratio_langgraph_sqlite_vs_full']:.1f}x slower per step", ""])
    rows.append(["restart after SIGKILL -> first resumed step (incl. python start)",
                 fmt_time(results["restart"]), "", "", "<= 300 ms"])
    markdown = table(["what (median per step)", "time", "overhead vs plain", "vs pitstop normal",
                      "target"], rows)
    print(markdown)
    command = "python bench/runtime.py" + (" --quick" if args.quick else "")
    print(f"\n(results written to {save_results('runtime', command, results, markdown)})")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
