"""Helpers shared by the benchmarks: timing (medians), tables, result files."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import string
import struct
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pitstop

# A benchmark run as a script has bench/ first on sys.path, where bench/langgraph.py would
# shadow the real langgraph package (a namespace package loses to any module of its name,
# wherever it is on the path). Once these helpers are imported, bench/ leaves the path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

RESULTS = _HERE.parent / ".bench"


def size_and_rounds(description: str) -> tuple[int, int]:
    """``--mib`` (default 256) and ``--rounds`` (default 7) of the object storage benches:
    the state's size in bytes and the rounds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    return args.mib << 20, args.rounds


POSTGRES_URL = os.environ.get(
    "PITSTOP_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
"""The PostgreSQL server the benches use (the tests' variable and default)."""

_ALPHABET = string.ascii_letters + string.digits + "     .,;"


def random_text(rng: random.Random, n: int) -> str:
    """``n`` characters of word-like text (zstd shrinks it about as it shrinks prose)."""
    return "".join(rng.choices(_ALPHABET, k=n))


def message(rng: random.Random, size: int, i: int) -> dict[str, Any]:
    """Turn ``i`` of a conversation: a chat message of ``size`` characters."""
    return {"role": "user" if i % 2 else "assistant", "content": random_text(rng, size)}


def median_time(fn: Callable[[], Any], repeat: int, *, warmup: int = 3) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def median_of(samples: list[float]) -> float:
    return statistics.median(samples)


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of per-round ratios of two interleaved series: each round's pair was
    measured close together in time, so a slow spell of the machine cancels out."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) + " |"
        for r in rows
    ]
    return "\n".join([line, sep, *body])


def machine() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}, " \
           f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}"


def save_results(name: str, command: str, data: dict[str, Any], markdown: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(
        json.dumps(
            {
                "name": name,
                "command": command,
                "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                "machine": machine(),
                "results": data,
                "markdown": markdown,
            },
            indent=2,
        )
    )
    return out


# -- the workload the runtime benchmarks share ----------------------------------------------------


def base_state(**extra: Any) -> dict[str, Any]:
    """~1 KiB of agent-like state, plus a counter the steps increment."""
    return {
        "messages": [
            {"role": "user", "content": "Please review vendor Acme Corp for onboarding."},
            {"role": "assistant", "content": "Running the security questionnaire now. " * 6},
            {"role": "tool", "name": "soc2_lookup", "content": "SOC 2 Type II, valid 2026."},
        ],
        "vendor": {"name": "Acme Corp", "country": "DE", "tier": 2, "contacts": ["a", "b"]},
        "notes": "x" * 300,
        "i": 0,
        **extra,
    }


def noop(state: dict[str, Any]) -> dict[str, Any]:
    return {"i": state["i"] + 1}


def pitstop_loop(
    steps: int, durability: str = "normal", marks: dict[int, float] | None = None
) -> pitstop.Workflow:
    """One no-op step looping ``steps`` times, a checkpoint after each. With ``marks``, each
    step records when it started, so a run's steady per-step cost can be read off without
    its one-off start (``steady_per_step``)."""
    wf = pitstop.Workflow(f"bench-{durability}", durability=durability)  # type: ignore[arg-type]

    @wf.step
    def work(state: dict[str, Any]) -> Any:
        if marks is not None:
            marks[state["i"]] = time.perf_counter()
        update = noop(state)
        return pitstop.goto("work", update) if update["i"] < steps else update

    return wf


def steady_per_step(marks: dict[int, float]) -> float:
    """Seconds per step between the second step and the last (each with its checkpoint)."""
    first, last = 1, max(marks)
    return (marks[last] - marks[first]) / (last - first)


def langgraph_loop(steps: int, **extra_fields: type) -> Any:
    """The same loop as a LangGraph graph (uncompiled), or None without langgraph."""
    try:
        from typing import TypedDict

        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:
        print(f"(LangGraph not measured: {exc})", flush=True)
        return None
    fields: dict[str, Any] = {"messages": list, "vendor": dict, "notes": str, "i": int}
    fields.update(extra_fields)
    state_type = TypedDict("State", fields)  # type: ignore[operator]
    graph = StateGraph(state_type)
    graph.add_node("work", noop)
    graph.add_edge(START, "work")
    graph.add_conditional_edges("work", lambda s: "work" if s["i"] < steps else END)
    return graph


def time_invoke(app: Any, state: dict[str, Any], steps: int, thread: str) -> float:
    """Seconds per step of one LangGraph invocation on a new thread."""
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    t0 = time.perf_counter()
    out = app.invoke(state, config)
    elapsed = time.perf_counter() - t0
    assert out["i"] == steps
    return elapsed / steps


def wal_commits(wal: Path | str) -> list[list[int]]:
    """The pages each committed transaction wrote, in order, read from a SQLite WAL file:
    its frames since SQLite last started the file over (those carrying the header's salts),
    a commit's ending with the frame whose "database size" field is set."""
    data = Path(wal).read_bytes()
    if len(data) < 32:  # the WAL header
        return []
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    commits: list[list[int]] = []
    pages: list[int] = []
    offset = 32
    while offset + 24 + page_size <= len(data):  # a frame: a 24-byte header and the page
        page, size_after = struct.unpack(">II", data[offset : offset + 8])
        if data[offset + 8 : offset + 16] != salts:
            break  # a frame of an earlier pass over the file
        pages.append(page)
        if size_after:
            commits.append(pages)
            pages = []
        offset += 24 + page_size
    return commits
