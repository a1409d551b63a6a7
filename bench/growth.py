"""State that grows (issue #12): what a conversation, a dict, an array and a LangGraph messages
channel cost as they grow, pitstop and LangGraph's savers side by side in one run.

    .venv/bin/python bench/growth.py                 # the issue's sizes (several minutes)
    .venv/bin/python bench/growth.py --quick         # smaller (a minute or two)
    .venv/bin/python bench/growth.py --only conversation,langgraph --no-pg

Workloads (random text, so that compression hides nothing: zstd keeps ~3/4 of it):

* ``conversation``: ``turns`` messages of ``--message`` bytes, each turn ``store.save`` of the
  whole list, no hint. Bytes on disk against the final list's serialised size; a late save
  (the last 5% of turns) against one ``ormsgpack.packb`` of the same list, and a restore of
  the latest against one ``ormsgpack.unpackb`` of that buffer, both in interleaved rounds
  (each ratio is the median of per-round ratios). The restore twice: by the store that wrote
  the run (it knows the list's layout) and, as a resume in a new process would, by a second
  store on the same database whose codec has forgotten every layout before each restore
  (``resume``: it reads the list's tree a level per statement).
  ``--store-options compress_threshold=none`` opens the stores with those URL options.
* ``append``: the same conversation through a ``Workflow`` whose step returns
  ``pitstop.Append([message])`` (SQLite, durability ``normal``): per-step time early
  (turns 50-150) and late (the last 100 turns), bytes, and the tail of every step (p50, p99,
  p99.9, max) in wall time and in the step thread's CPU time (which other processes on a
  loaded machine disturb less). ``--torch`` runs it again after importing torch (issue #33:
  a step then once walked the whole state for tensors). The tail target (#33) is for
  ``--turns 10000``: ``--only append --turns 10000 --message 1024 --torch``.
* ``dict``: 10,000 keys of ~100 bytes, one key changed per save, 200 saves: bytes against
  copies of the dict.
* ``array``: a float32 array (64 MiB; 16 MiB with --quick), a 1% region changed per save:
  bytes added per save.
* ``langgraph``: a graph whose ``messages`` channel (``add_messages``) gains one 2 KiB
  message per step, ``--lg-steps`` steps, on ``SqliteSaver`` and ``PitstopSaver`` (SQLite,
  both ``synchronous=NORMAL``) and ``PostgresSaver`` and ``PitstopSaver`` (PostgreSQL):
  bytes and wall ms per step (median of ``--repeats`` invocations in turns).

SQLite bytes are the file after ``wal_checkpoint(TRUNCATE)`` plus its ``-blobs`` directory
(large values, such as an array's 1 MiB chunks, are kept there); PostgreSQL bytes are
``pg_total_relation_size`` summed over the store's tables. Timings on a shared 2-core machine
are noisy: compare the ratios, which are measured close together in time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
from _common import (
    POSTGRES_URL,
    fmt_bytes,
    fmt_time,
    median_ratio,
    message,
    random_text,
    save_results,
    table,
)

import pitstop

PG_URL = POSTGRES_URL
MiB = 1 << 20


def _peers() -> Any:
    """bench/langgraph.py (its savers on fresh databases), loaded under another name: as
    ``langgraph`` it would shadow the package."""
    spec = importlib.util.spec_from_file_location(
        "bench_langgraph", Path(__file__).with_name("langgraph.py")
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# -- stores on fresh databases -------------------------------------------------------------------


def sqlite_file_size(path: str) -> int:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        return int(pages * conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def directory_size(path: str) -> int:
    """Bytes of the files under ``path`` (a SQLite store's ``<file>-blobs`` directory, where
    values of a MiB and more are kept by default); 0 if there is none."""
    total = 0
    for folder, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(folder, name)) for name in names)
    return total


def pg_schema_size(schema: str) -> int:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchone()
        return int(row[0]) if row else 0


@contextmanager
def fresh_store(
    backend: str, durability: str = "normal"
) -> Iterator[tuple[Any, Callable[[], int]]]:
    """A pitstop store on a new database and a function measuring its bytes on disk."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
            path = os.path.join(tmp, "growth.db")
            store = pitstop.open_store(f"sqlite:///{path}?durability={durability}{STORE_OPTIONS}")
            try:
                yield store, lambda: sqlite_file_size(path) + directory_size(path + "-blobs")
            finally:
                store.close()
        return
    import psycopg

    schema = f"bench_growth_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in PG_URL else "?"
    store = pitstop.open_store(f"{PG_URL}{sep}schema={schema}{STORE_OPTIONS}")
    try:
        yield store, lambda: pg_schema_size(schema)
    finally:
        store.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


STORE_OPTIONS = ""
"""``&option=value...`` added to every store URL (``--store-options``)."""


def interleaved(ops: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(rounds):
        for key, op in ops.items():
            start = time.perf_counter()
            op()
            samples[key].append(time.perf_counter() - start)
    return samples


# -- workloads ------------------------------------------------------------------------------------


def conversation(backend: str, turns: int, size: int, rounds: int) -> dict[str, Any]:
    rng = random.Random(12)
    with fresh_store(backend) as (store, disk):
        msgs: list[dict[str, Any]] = []
        late: list[float] = []
        packs: list[float] = []
        early: list[float] = []
        for turn in range(turns):
            msgs.append(message(rng, size, turn))
            start = time.perf_counter()
            store.save("conversation", {"messages": msgs})
            took = time.perf_counter() - start
            if turn >= turns - max(1, turns // 20):
                late.append(took)
                start = time.perf_counter()
                ormsgpack.packb(msgs)
                packs.append(time.perf_counter() - start)
            elif turns // 20 <= turn < turns // 10:
                early.append(took)
        final = ormsgpack.packb(msgs)
        on_disk = disk()
        reader = pitstop.open_store(store.url)  # a second handle: a resume's own store

        def resume() -> Any:
            reader._value_codec._layouts.clear()  # as a new process: no layout known
            return reader.latest("conversation")

        restore = interleaved(
            {
                "latest": lambda: store.latest("conversation"),
                "resume": resume,
                "unpack": lambda: ormsgpack.unpackb(final),
            },
            rounds,
        )
        assert store.latest("conversation").state["messages"] == msgs  # type: ignore[union-attr]
        assert resume().state["messages"] == msgs
        reader.close()
    return {
        "backend": backend,
        "turns": turns,
        "final_bytes": len(final),
        "disk_bytes": on_disk,
        "disk_ratio": on_disk / len(final),
        "early_save_s": statistics.median(early) if early else None,
        "late_save_s": statistics.median(late),
        "late_save_per_packb": median_ratio(late, packs),
        "restore_s": statistics.median(restore["latest"]),
        "restore_per_unpack": median_ratio(restore["latest"], restore["unpack"]),
        "resume_restore_s": statistics.median(restore["resume"]),
        "resume_restore_per_unpack": median_ratio(restore["resume"], restore["unpack"]),
    }


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def append_workflow(turns: int, size: int, label: str = "") -> dict[str, Any]:
    rng = random.Random(13)
    texts = [message(rng, size, i) for i in range(turns)]
    marks: dict[int, float] = {}
    cpu: dict[int, float] = {}
    wf = pitstop.Workflow("bench-append", durability="normal")

    @wf.step
    def talk(state: dict[str, Any]) -> Any:
        turn = state["turn"]
        marks[turn] = time.perf_counter()
        cpu[turn] = time.thread_time()
        update = {"messages": pitstop.Append([texts[turn]]), "turn": turn + 1}
        return pitstop.goto("talk", update) if turn + 1 < turns else update

    with fresh_store("sqlite") as (store, disk):
        wf.max_steps = turns + 10
        result = wf.start(store, {"messages": [], "turn": 0})
        assert result.status is pitstop.RunStatus.COMPLETED
        final = len(ormsgpack.packb(texts))
        on_disk = disk()
    steps = sorted(marks)
    per_step = {t: marks[t + 1] - marks[t] for t in steps[:-1]}
    early = [per_step[t] for t in per_step if 50 <= t < 150]
    late = [per_step[t] for t in per_step if t >= turns - 101]
    walls = sorted(per_step.values())
    cpus = sorted(cpu[t + 1] - cpu[t] for t in steps[:-1])
    tail = {
        f"{kind}_{name}": _quantile(values, q)
        for kind, values in (("wall", walls), ("cpu", cpus))
        for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))
    }
    return {
        "label": label or ("torch imported" if "torch" in sys.modules else "no torch"),
        **tail,
        "load": os.getloadavg()[0],
        "turns": turns,
        "final_bytes": final,
        "disk_bytes": on_disk,
        "disk_ratio": on_disk / final,
        "early_step_s": statistics.median(early),
        "late_step_s": statistics.median(late),
        "late_per_early": statistics.median(late) / statistics.median(early),
    }


def dict_workload(backend: str, keys: int, saves: int) -> dict[str, Any]:
    rng = random.Random(14)
    docs = {f"doc-{i:05d}": random_text(rng, 100) for i in range(keys)}
    with fresh_store(backend) as (store, disk):
        store.save("docs", {"docs": docs})
        first = disk()
        for _ in range(saves):
            docs[f"doc-{rng.randrange(keys):05d}"] = random_text(rng, 100)
            store.save("docs", {"docs": docs})
        on_disk = disk()
        assert store.latest("docs").state["docs"] == docs  # type: ignore[union-attr]
    copy = len(ormsgpack.packb(docs))
    return {
        "backend": backend,
        "keys": keys,
        "saves": saves,
        "copy_bytes": copy,
        "disk_bytes": on_disk,
        "after_first": first,
        "per_save_bytes": (on_disk - first) / saves,
        "copies": on_disk / copy,
        "bound": 1.5 * copy + saves * 4096,
    }


def array_workload(backend: str, mib: int, saves: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(15)
    array = rng.random(mib * MiB // 4, dtype=np.float32)
    region = len(array) // 100
    with fresh_store(backend) as (store, disk):
        store.save("array", {"weights": array})
        first = disk()
        times = []
        for _ in range(saves):
            at = int(rng.integers(0, len(array) - region))
            array[at : at + region] = rng.random(region, dtype=np.float32)
            start = time.perf_counter()
            store.save("array", {"weights": array})
            times.append(time.perf_counter() - start)
        on_disk = disk()
        back = store.latest("array").state["weights"]  # type: ignore[union-attr]
        assert np.array_equal(back, array)
    return {
        "backend": backend,
        "array_bytes": array.nbytes,
        "saves": saves,
        "added_per_save": (on_disk - first) / saves,
        "save_s": statistics.median(times),
    }


def langgraph_workload(steps: int, size: int, repeats: int, pg: bool) -> list[dict[str, Any]]:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    # The functional form: a class body here would be evaluated against module globals.
    State = TypedDict("State", {"messages": Annotated[list[Any], add_messages]})  # noqa: UP013

    rng = random.Random(16)
    texts = [random_text(rng, size) for _ in range(steps)]

    def respond(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content=texts[len(state["messages"]) - 1])]}

    def route(state: Any) -> str:
        return "respond" if len(state["messages"]) <= steps else END

    builder = StateGraph(State)
    builder.add_node("respond", respond)
    builder.add_edge(START, "respond")
    builder.add_conditional_edges("respond", route)

    peers = _peers()
    savers: list[tuple[str, str, Any, str | None]] = [
        ("-", "InMemorySaver (no I/O)", peers.memory_saver, None),
        ("sqlite", "SqliteSaver NORMAL", lambda: peers.sqlite_saver("NORMAL"), None),
        ("sqlite", "PitstopSaver sqlite", lambda: peers.pitstop_sqlite("normal"),
         "SqliteSaver NORMAL"),
    ]
    if pg:
        savers += [
            ("postgres", "PostgresSaver", peers.postgres_saver, None),
            ("postgres", "PitstopSaver postgres", peers.pitstop_postgres, "PostgresSaver"),
        ]

    def invoke(saver: Any) -> tuple[float, float]:
        graph = builder.compile(checkpointer=saver)
        clock = peers.SaverClock(saver)
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex},
                       "recursion_limit": steps + 10}
        start = time.perf_counter()
        out = graph.invoke({"messages": [HumanMessage(content="hi")]}, config)
        took = time.perf_counter() - start
        assert len(out["messages"]) == steps + 1
        return took / steps, clock.seconds / steps

    sizes: dict[str, int] = {}
    for _, name, factory, _ in savers:
        with factory() as opened:
            invoke(opened.saver)
            sizes[name] = opened.size()[0]
    times: dict[str, list[tuple[float, float]]] = {name: [] for _, name, _, _ in savers}
    from contextlib import ExitStack

    with ExitStack() as stack:
        opened_all = [(name, stack.enter_context(factory())) for _, name, factory, _ in savers]
        for _ in range(repeats):
            for name, opened in opened_all:
                times[name].append(invoke(opened.saver))
    rows = []
    for database, name, _, baseline in savers:
        walls = [t[0] for t in times[name]]
        inside = [t[1] for t in times[name]]
        row: dict[str, Any] = {
            "database": database,
            "saver": name,
            "bytes": sizes[name],
            "step_s": statistics.median(walls),
            "saver_s": statistics.median(inside),
        }
        if baseline is not None:
            row["fewer_bytes"] = sizes[baseline] / sizes[name]
            row["speed"] = median_ratio([t[0] for t in times[baseline]], walls)
            row["saver_speed"] = median_ratio([t[1] for t in times[baseline]], inside)
        rows.append(row)
    return rows


# -- report ---------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    out = []
    if "conversation" in results:
        rows = [
            [r["backend"], str(r["turns"]), fmt_bytes(r["final_bytes"]), fmt_bytes(r["disk_bytes"]),
             f"{r['disk_ratio']:.2f}x", fmt_time(r["late_save_s"]),
             f"{r['late_save_per_packb']:.2f}x", fmt_time(r["restore_s"]),
             f"{r['restore_per_unpack']:.2f}x", fmt_time(r["resume_restore_s"]),
             f"{r['resume_restore_per_unpack']:.2f}x"]
            for r in results["conversation"]
        ]
        out.append("Conversation, store.save of the whole list (no hint):\n\n" + table(
            ["store", "turns", "final list", "on disk", "disk/final (<= 1.5)", "late save",
             "save/packb (<= 2)", "restore", "restore/unpack (<= 3)", "resume's restore",
             "/unpack (PostgreSQL <= 5)"], rows))
    if "append" in results:
        runs = results["append"]
        out.append("Conversation through a Workflow returning pitstop.Append (SQLite normal):\n\n"
                   + table(["process", "turns", "on disk", "disk/final (<= 1.5)", "step early",
                            "step late (<= 0.3 ms)", "late/early (<= 1.5)"],
                           [[r["label"], str(r["turns"]), fmt_bytes(r["disk_bytes"]),
                             f"{r['disk_ratio']:.2f}x", fmt_time(r["early_step_s"]),
                             fmt_time(r["late_step_s"]), f"{r['late_per_early']:.2f}x"]
                            for r in runs]))
        rows = []
        for r in runs:
            for kind in ("wall", "cpu"):
                p50 = r[f"{kind}_p50"]
                rows.append([r["label"], "wall" if kind == "wall" else "CPU (step's thread)",
                             fmt_time(p50), fmt_time(r[f"{kind}_p99"]),
                             f"{r[f'{kind}_p99'] / p50:.1f}x", fmt_time(r[f"{kind}_p999"]),
                             f"{r[f'{kind}_p999'] / p50:.1f}x", fmt_time(r[f"{kind}_max"]),
                             f"{r['load']:.1f}"])
        out.append("The same steps' tail (every step of the run):\n\n" + table(
            ["process", "time", "p50", "p99", "p99/p50 (<= 4)", "p99.9", "p99.9/p50 (<= 10)",
             "max", "load"], rows))
    if "dict" in results:
        rows = [[r["backend"], str(r["keys"]), str(r["saves"]), fmt_bytes(r["copy_bytes"]),
                 fmt_bytes(r["disk_bytes"]), fmt_bytes(r["bound"]), f"{r['copies']:.1f}",
                 fmt_bytes(r["per_save_bytes"])] for r in results["dict"]]
        out.append("Dict, one key changed per save:\n\n" + table(
            ["store", "keys", "saves", "one copy", "on disk", "bound (1.5 copies + 4 KiB/save)",
             "copies", "per save"], rows))
    if "array" in results:
        rows = [[r["backend"], fmt_bytes(r["array_bytes"]), str(r["saves"]),
                 fmt_bytes(r["added_per_save"]), fmt_time(r["save_s"])] for r in results["array"]]
        out.append("float32 array, a 1% region changed per save:\n\n" + table(
            ["store", "array", "saves", "added per save (<= 4 MiB)", "save"], rows))
    if "langgraph" in results:
        rows = [[r["database"], r["saver"], fmt_bytes(r["bytes"]), fmt_time(r["step_s"]),
                 fmt_time(r["saver_s"]),
                 f"{r['fewer_bytes']:.1f}x" if "fewer_bytes" in r else "",
                 f"{r['speed']:.2f}x" if "speed" in r else "",
                 f"{r['saver_speed']:.2f}x" if "saver_speed" in r else ""]
                for r in results["langgraph"]]
        out.append("LangGraph, a messages channel (add_messages) growing a message per step "
                   "(wall time per step, and the time inside the saver's put/put_writes/"
                   "get_tuple):\n\n"
                   + table(["database", "saver", "bytes", "per step", "in saver",
                            "fewer bytes", "speed (wall)", "speed (in saver)"], rows))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--message", type=int, default=2048)
    parser.add_argument("--lg-steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--pg-only", action="store_true", help="PostgreSQL only")
    parser.add_argument("--store-options", default="",
                        help="URL options for every store, e.g. compress_threshold=none")
    parser.add_argument("--only", default="conversation,append,dict,array,langgraph")
    parser.add_argument("--torch", action="store_true",
                        help="append: run it again after importing torch (issue #33)")
    args = parser.parse_args(argv)
    turns = args.turns or (500 if args.quick else 2000)
    lg_steps = args.lg_steps or (100 if args.quick else 300)
    backends = ["sqlite"] if args.no_pg else ["postgres"] if args.pg_only else [
        "sqlite", "postgres"]
    global STORE_OPTIONS  # noqa: PLW0603 (read by fresh_store, deep in every workload)
    STORE_OPTIONS = f"&{args.store_options}" if args.store_options else ""
    only = set(args.only.split(","))
    results: dict[str, Any] = {}
    if "conversation" in only:
        results["conversation"] = [
            conversation(b, turns, args.message, args.rounds) for b in backends
        ]
    if "append" in only:
        results["append"] = [append_workflow(turns, args.message)]
        if args.torch:  # the same steps in a process that has imported torch (an app with a model)
            import torch  # noqa: F401

            results["append"].append(append_workflow(turns, args.message))
    if "dict" in only:
        results["dict"] = [dict_workload(b, 10_000, 50 if args.quick else 200) for b in backends]
    if "array" in only:
        results["array"] = [array_workload(b, 16 if args.quick else 64, 5 if args.quick else 10)
                            for b in backends]
    if "langgraph" in only:
        results["langgraph"] = langgraph_workload(lg_steps, args.message, args.repeats,
                                                  not args.no_pg)
    markdown = report(results)
    print(markdown)
    path = save_results("growth", "bench/growth.py " + " ".join(argv or []), results, markdown)
    print(f"\n(results in {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
