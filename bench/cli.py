"""CLI start-up benchmark (issue #5): `pitstop runs` and `pitstop history` on a large store.

    .venv/bin/python bench/cli.py              # 10,000 runs + one run of 10,000 checkpoints
    .venv/bin/python bench/cli.py --quick      # 1,000 + 1,000, fewer repeats

Target: each command answers in <= 0.5 s wall clock INCLUDING interpreter start, measured as
an operator would run it: a fresh subprocess per call. Output piped (plain text, the path
scripts take) and, where a pseudo-terminal is available, on a terminal (rich tables, the path
people take). Wall time is what the target is about; the child's CPU time (user + sys) is
shown beside it because it is steadier than wall time on a busy machine. Baselines: an empty
interpreter and `import pitstop`, so the command's own cost is visible. Medians of several
runs.
"""

from __future__ import annotations

import argparse
import os
import pty
import resource
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_time, machine, median_of, save_results, table

import pitstop

TARGET = 0.5
BIG_RUN = "long-run"


def build(path: Path, runs: int, checkpoints: int) -> str:
    """A store with ``runs`` one-checkpoint runs and one run of ``checkpoints`` checkpoints."""
    url = f"sqlite:///{path}"
    with pitstop.open_store(url) as store:
        for i in range(runs):
            store.save(
                f"run-{i:05d}",
                {"messages": [{"role": "user", "content": f"request {i}"}], "n": i},
                metadata={"source": "step", "step_name": "intake", "status": "waiting",
                          "waiting_for": ["approval"]},
                workflow="vendor-approval",
                status=pitstop.RunStatus.WAITING if i % 3 else pitstop.RunStatus.COMPLETED,
            )
        for i in range(checkpoints):
            store.save(
                BIG_RUN,
                {"messages": [f"step {j}" for j in range(i % 20)], "counter": i},
                metadata={"source": "step", "step_name": f"step_{i % 7}", "status": "running"},
                workflow="long-agent",
            )
    return url


Sample = tuple[float, float]
"""(wall seconds, CPU seconds of the child: user + sys)."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _piped(argv: list[str], env: dict[str, str]) -> Sample:
    cpu = _children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed: {done.stderr.decode()}")
    return elapsed, _children_cpu() - cpu


def _terminal(argv: list[str], env: dict[str, str]) -> Sample:
    """Run with stdout and stderr on a pseudo-terminal (so rich renders), reading it all."""
    t0 = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execve(argv[0], argv, {**env, "COLUMNS": "160", "TERM": "xterm-256color"})
    while True:
        ready, _, _ = select.select([fd], [], [], 5)
        if not ready:
            break
        try:
            if not os.read(fd, 65536):
                break
        except OSError:  # EIO: the child closed the terminal
            break
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed on a terminal")
    return elapsed, usage.ru_utime + usage.ru_stime


def measure(
    fn: Callable[[list[str], dict[str, str]], Sample],
    argv: list[str],
    env: dict[str, str],
    repeat: int,
) -> Sample:
    """Median wall and CPU time of ``repeat`` fresh processes (after one to warm caches)."""
    fn(argv, env)
    samples = [fn(argv, env) for _ in range(repeat)]
    return median_of([w for w, _ in samples]), median_of([c for _, c in samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs, checkpoints, repeat = (1_000, 1_000, 5) if args.quick else (10_000, 10_000, 9)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        url = build(Path(tmp) / "big.db", runs, checkpoints)
        print(f"built {runs:,} runs + 1 run of {checkpoints:,} checkpoints "
              f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        # As installed: bytecode cached. (This repo's dev shells set PYTHONDONTWRITEBYTECODE,
        # which makes every start compile pitstop's sources; measured separately below.)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PITSTOP_STORE=url, PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        no_cache = {**env, "PYTHONDONTWRITEBYTECODE": "1"}
        del no_cache["PYTHONPYCACHEPREFIX"]
        py = sys.executable
        cli = [py, "-m", "pitstop"]
        cases = [
            ("python -c pass (floor)", [py, "-c", "pass"], False),
            ("python -c 'import pitstop'", [py, "-c", "import pitstop"], False),
            ("pitstop runs", [*cli, "runs"], True),
            ("pitstop runs --status waiting --limit 200", [*cli, "runs", "--status", "waiting",
                                                          "--limit", "200"], True),
            ("pitstop runs --json", [*cli, "runs", "--json"], False),
            (f"pitstop history {BIG_RUN}", [*cli, "history", BIG_RUN], True),
            (f"pitstop history {BIG_RUN} --limit 500", [*cli, "history", BIG_RUN, "--limit",
                                                        "500"], False),
            (f"pitstop show {BIG_RUN}", [*cli, "show", BIG_RUN], True),
        ]
        uncached = [
            ("pitstop runs, no bytecode cache", [*cli, "runs"]),
            (f"pitstop history {BIG_RUN}, no bytecode cache", [*cli, "history", BIG_RUN]),
        ]
        rows = []
        results: dict[str, dict[str, float | None]] = {}
        for name, argv, on_terminal in cases:
            piped, piped_cpu = measure(_piped, argv, env, repeat)
            tty, tty_cpu = measure(_terminal, argv, env, repeat) if on_terminal else (None, None)
            is_cli = argv[:3] == cli
            worst = max(piped, tty or 0.0)
            verdict = ("ok" if worst <= TARGET else "SLOW") if is_cli else "baseline"
            rows.append([
                name,
                f"{fmt_time(piped)} ({fmt_time(piped_cpu)})",
                f"{fmt_time(tty)} ({fmt_time(tty_cpu or 0)})" if tty else "-",
                f"{TARGET:.1f} s" if is_cli else "-",
                verdict,
            ])
            results[name] = {"piped_s": piped, "piped_cpu_s": piped_cpu, "terminal_s": tty,
                             "terminal_cpu_s": tty_cpu}
        for name, argv in uncached:
            piped, piped_cpu = measure(_piped, argv, no_cache, repeat)
            rows.append([name, f"{fmt_time(piped)} ({fmt_time(piped_cpu)})", "-", "-",
                         "(dev shells only)"])
            results[name] = {"piped_s": piped, "piped_cpu_s": piped_cpu}
    headers = ["command (fresh process)", "piped: wall (cpu)", "on a terminal: wall (cpu)",
               "target", ""]
    markdown = table(headers, rows)
    print(f"\n{runs:,} runs + 1 run of {checkpoints:,} checkpoints, SQLite, median of "
          f"{repeat}; {machine()}\n")
    print(markdown)
    if not args.quick:
        save_results("cli", "bench/cli.py", results, markdown)


if __name__ == "__main__":
    main()
