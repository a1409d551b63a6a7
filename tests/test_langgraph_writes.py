"""A LangGraph step's pending writes commit with its next checkpoint (one transaction per
step), or on their own within a bounded delay; special writes before put_writes returns."""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from conftest import BACKENDS, run_python
from pitstop import Store
from pitstop.integrations.langgraph import (
    PitstopSaver,
    ThreadConflictError,
    langgraph_id,
    stored_id,
)

SHARED = [b for b in BACKENDS if b != "memory"]  # backends several processes can share


class Counter(TypedDict, total=False):
    counter: int


def counting_graph(saver: PitstopSaver, steps: int) -> Any:
    builder = StateGraph(Counter)
    builder.add_node("step", lambda s: {"counter": s["counter"] + 1})
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["counter"] < steps else END)
    return builder.compile(checkpointer=saver)


def _cfg(thread: str, checkpoint_id: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _put(saver: PitstopSaver, thread: str, parent: str | None, source: str) -> str:
    checkpoint = empty_checkpoint()
    meta: Any = {"source": source, "step": 0, "parents": {}}
    saver.put(_cfg(thread, parent), checkpoint, meta, {})
    return checkpoint["id"]


def _stored_writes(store: Store, thread: str, checkpoint_id: str) -> set[str]:
    """Keys of the pending writes committed on a checkpoint, as any other reader sees them."""
    return set(store.attachments(thread, stored_id(checkpoint_id, thread)))


def _where(store: Store, run_id: str) -> dict[str, str]:
    """Checkpoint id -> where its pending writes are stored (its row, or effect records),
    read through the store's own SQL (no API says where)."""
    rows = store._query(  # type: ignore[attr-defined]
        "SELECT id, 'row' FROM pitstop_checkpoints WHERE run_id = ? AND writes IS NOT NULL "
        "UNION ALL SELECT checkpoint_id, 'effects' FROM pitstop_effects WHERE run_id = ?",
        (run_id, run_id),
    )
    return {langgraph_id(ckpt): kind for ckpt, kind in rows}


def test_a_steps_writes_commit_with_the_next_checkpoint(store: Store) -> None:
    saver = PitstopSaver(store, writes_delay=600)  # nothing commits them on its own
    root = _put(saver, "t-next", None, "input")
    saver.put_writes(_cfg("t-next", root), [("counter", 1), ("other", 2)], "task-a")
    assert _where(store, "t-next") == {}  # held
    step = _put(saver, "t-next", root, "loop")
    # In the transaction of the next checkpoint, appended to their own checkpoint's row.
    assert _where(store, "t-next") == {root: "row"}
    # LangGraph may call put_writes on a checkpoint before its put: the put takes them, into
    # the row it inserts.
    late = empty_checkpoint()
    saver.put_writes(_cfg("t-next", late["id"]), [("counter", 2)], "task-b")
    saver.put(_cfg("t-next", step), late, {"source": "loop", "step": 1, "parents": {}}, {})
    assert _where(store, "t-next") == {root: "row", late["id"]: "row"}
    # A task's regular writes are one record.
    assert _stored_writes(store, "t-next", root) == {f"{root}/task-a"}
    assert saver.get_tuple(_cfg("t-next", root)).pending_writes == [  # type: ignore[union-attr]
        ("task-a", "counter", 1), ("task-a", "other", 2)
    ]
    assert saver.get_tuple(_cfg("t-next", late["id"])).pending_writes == [  # type: ignore[union-attr]
        ("task-b", "counter", 2)
    ]


def _checkpoints(store: Store, run_id: str) -> list[str]:
    rows = store._query(  # type: ignore[attr-defined]
        "SELECT id FROM pitstop_checkpoints WHERE run_id = ?", (run_id,)
    )
    return sorted(langgraph_id(r[0]) for r in rows)


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
@pytest.mark.parametrize("api", ["invoke", "ainvoke"])
@pytest.mark.slow
async def test_async_durability_keeps_a_steps_writes_in_its_checkpoints_row(
    store: Store, api: str
) -> None:
    # durability="async": LangGraph puts each checkpoint on a background thread, each after
    # the one before, and the next step's tasks often finish (put_writes on it) first. Those
    # writes wait for their checkpoint's put, which inserts them in its row; none becomes an
    # effect record. (A long delay: on a loaded machine the timer could commit a write on a
    # written checkpoint before the next put comes, which is right but not what is tested.)
    saver = PitstopSaver(store, writes_delay=600)
    graph = counting_graph(saver, 40)
    cfg = {**_cfg(f"t-async-{api}"), "recursion_limit": 100}
    if api == "invoke":
        out = graph.invoke({"counter": 0}, cfg, durability="async")
    else:
        out = await graph.ainvoke({"counter": 0}, cfg, durability="async")
    assert out == {"counter": 40}
    where = _where(store, f"t-async-{api}")  # before any read of the saver (reads commit)
    checkpoints = _checkpoints(store, f"t-async-{api}")
    assert len(checkpoints) == 42  # the input's, then one per step
    # Every checkpoint but the last (the graph ended there) has its writes in its own row.
    assert where == dict.fromkeys(checkpoints[:-1], "row")
    plain = PitstopSaver(store, writes_delay=None)
    counting_graph(plain, 40).invoke({"counter": 0}, {**_cfg("t-plain"), "recursion_limit": 100})
    ours = [[w[1:] for w in t.pending_writes or ()] for t in saver.list(cfg)]
    theirs = [[w[1:] for w in t.pending_writes or ()] for t in plain.list(_cfg("t-plain"))]
    assert ours == theirs and sum(map(len, ours)) == 2 * 40 + 1


class Review(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
@pytest.mark.parametrize("durability", ["exit", "async"])
def test_an_interrupt_beside_a_finished_task_without_waiting_for_puts(
    store: Store, durability: Any
) -> None:
    # Two tasks in one step, one finishes and one interrupts. With durability="exit" both
    # put_writes calls come with the only put, after the run; with "async" while the step's
    # checkpoint may still be on its way. The finished task's (regular) writes go into that
    # checkpoint's row whichever comes first; the interrupt (a special write) commits before
    # its put_writes returns, into the row if the checkpoint is there by then. Resuming does
    # not run the finished task again.
    ran: list[str] = []

    def draft(state: Review) -> Review:
        ran.append("draft")
        return {"log": ["draft"]}

    def ask(state: Review) -> Review:
        return {"log": [f"answer:{interrupt('why?')}"]}

    builder = StateGraph(Review)
    builder.add_node("draft", draft)
    builder.add_node("ask", ask)
    builder.add_edge(START, "draft")
    builder.add_edge(START, "ask")
    builder.add_edge("draft", END)
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=PitstopSaver(store, writes_delay=600))
    for n in range(5):
        thread = f"t-{durability}-{n}"
        graph.invoke({"log": []}, _cfg(thread), durability=durability)
        effects = store._query(  # type: ignore[attr-defined]
            "SELECT key FROM pitstop_effects WHERE run_id = ?", (thread,)
        )
        assert all(key.count("/") == 2 for key, in effects)  # special writes only
        state = graph.get_state(_cfg(thread))
        assert state.next == ("ask",)
        assert [i.value for task in state.tasks for i in task.interrupts] == ["why?"]
        out = graph.invoke(Command(resume="ok"), _cfg(thread), durability=durability)
        assert sorted(out["log"]) == ["answer:ok", "draft"]
    assert ran == ["draft"] * 5


@pytest.mark.slow
def test_a_read_leaves_writes_on_a_checkpoint_not_written_yet_to_its_put(store: Store) -> None:
    saver = PitstopSaver(store, writes_delay=600)
    root = _put(saver, "t-ahead", None, "input")
    saver.put_writes(_cfg("t-ahead", root), [("counter", 1)], "task-a")
    ahead = empty_checkpoint()  # its put has not come yet (durability="async")
    saver.put_writes(_cfg("t-ahead", ahead["id"]), [("counter", 2)], "task-b")
    # A read commits the writes on the written checkpoint; those on the other cannot be read
    # before it exists, and wait for its put.
    assert saver.get_tuple(_cfg("t-ahead", ahead["id"])) is None
    assert _where(store, "t-ahead") == {root: "row"}
    saver.put(_cfg("t-ahead", root), ahead, {"source": "loop", "step": 0, "parents": {}}, {})
    assert _where(store, "t-ahead") == {root: "row", ahead["id"]: "row"}
    got = saver.get_tuple(_cfg("t-ahead", ahead["id"]))
    assert got is not None and got.pending_writes == [("task-b", "counter", 2)]
    # Writes on a checkpoint whose put never comes are committed once no put of their run is
    # running for the delay, as effect records naming it (found if it is written later).
    never = empty_checkpoint()
    PitstopSaver(store, writes_delay=0.05).put_writes(
        _cfg("t-ahead", never["id"]), [("counter", 3)], "task-c"
    )
    deadline = time.monotonic() + 5
    while never["id"] not in _where(store, "t-ahead") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _where(store, "t-ahead")[never["id"]] == "effects"


def test_a_graph_has_the_writes_of_a_saver_that_does_not_hold_them(store: Store) -> None:
    grouped, plain = PitstopSaver(store), PitstopSaver(store, writes_delay=None)
    for saver, thread in ((grouped, "t-grouped"), (plain, "t-plain")):
        graph = counting_graph(saver, 30)
        assert graph.invoke({"counter": 0}, {**_cfg(thread), "recursion_limit": 50}) == {
            "counter": 30
        }
    ours = [t.pending_writes for t in grouped.list(_cfg("t-grouped"))]
    theirs = [t.pending_writes for t in plain.list(_cfg("t-plain"))]
    assert [[w[1:] for w in ws or ()] for ws in ours] == [
        [w[1:] for w in ws or ()] for ws in theirs
    ]
    assert sum(map(len, ours)) == 2 * 30 + 1  # each step's two writes, the input's one


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
def test_writes_without_a_next_checkpoint_commit_within_the_delay(
    open_store: Callable[..., Store],
) -> None:
    store, reader = open_store(), open_store()  # two handles: like two processes
    saver = PitstopSaver(store, writes_delay=0.05)
    root = _put(saver, "t-late", None, "input")
    saver.put_writes(_cfg("t-late", root), [("counter", 1)], "task-a")
    # Held for the next put; another reader sees them once the delay has passed.
    deadline = time.monotonic() + 5
    while not _stored_writes(reader, "t-late", root) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _stored_writes(reader, "t-late", root) == {f"{root}/task-a"}
    # The same on a checkpoint another saver wrote (this one has neither written nor read
    # it): committed into its row, not kept for a put of it.
    other = PitstopSaver(store, writes_delay=0.05)
    other.put_writes(_cfg("t-late", root), [("counter", 2)], "task-b")
    while len(_stored_writes(reader, "t-late", root)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _stored_writes(reader, "t-late", root) == {f"{root}/task-a", f"{root}/task-b"}
    assert _where(reader, "t-late") == {root: "row"}


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
def test_special_writes_commit_before_put_writes_returns(
    open_store: Callable[..., Store],
) -> None:
    store, reader = open_store(), open_store()  # two handles: like two processes
    saver = PitstopSaver(store, writes_delay=600)
    root = _put(saver, "t-int", None, "input")
    step = _put(saver, "t-int", root, "loop")
    saver.put_writes(_cfg("t-int", step), [("counter", 2)], "task-a")  # held...
    saver.put_writes(_cfg("t-int", step), [("__interrupt__", "why?")], "task-b")
    # ...until an interrupt on the same checkpoint: no child will follow it.
    assert _stored_writes(reader, "t-int", step) == {f"{step}/task-a", f"{step}/task-b/-3"}
    # Writes on a checkpoint that is not a loop or input step's (update_state's) are never
    # held either.
    update = _put(saver, "t-int", step, "update")
    saver.put_writes(_cfg("t-int", update), [("counter", 3)], "task-c")
    assert _stored_writes(reader, "t-int", update) == {f"{update}/task-c"}
    # A saver that does not group commits every call before it returns.
    plain = PitstopSaver(store, writes_delay=None)
    loop = _put(plain, "t-plain", None, "input")
    plain.put_writes(_cfg("t-plain", loop), [("counter", 1)], "task-a")
    assert _stored_writes(reader, "t-plain", loop) == {f"{loop}/task-a"}


def test_reads_see_held_writes_and_a_refused_put_still_commits_them(store: Store) -> None:
    saver = PitstopSaver(store)
    root = _put(saver, "t-read", None, "input")
    saver.put_writes(_cfg("t-read", root), [("counter", 1), ("other", 2)], "task-a")
    saver.put_writes(_cfg("t-read", root), [("counter", 9)], "task-a")  # kept once
    got = saver.get_tuple(_cfg("t-read", root))
    assert got is not None and got.pending_writes == [("task-a", "counter", 1),
                                                       ("task-a", "other", 2)]
    # A put that loses a race still records the writes held on its parent.
    step = _put(saver, "t-read", root, "loop")
    saver.put_writes(_cfg("t-read", step), [("counter", 5)], "task-b")
    _put(PitstopSaver(store), "t-read", step, "loop")  # another writer moves the thread on
    with pytest.raises(ThreadConflictError):
        _put(saver, "t-read", step, "loop")
    assert _stored_writes(store, "t-read", step) == {f"{step}/task-b"}


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
def test_closing_the_store_under_a_saver_commits_its_held_writes(
    open_store: Callable[..., Store], caplog: pytest.LogCaptureFixture
) -> None:
    store, reader = open_store(), open_store()  # two handles: like two processes
    saver = PitstopSaver(store, writes_delay=0.05)
    root = _put(saver, "t-close", None, "input")
    saver.put_writes(_cfg("t-close", root), [("counter", 1)], "task-a")
    never = empty_checkpoint()  # a checkpoint whose put never comes
    saver.put_writes(_cfg("t-close", never["id"]), [("counter", 2)], "task-b")
    # The store is closed, not the saver (as a `with open_store(...)` block does): what the
    # saver held is committed first, and its thread finds nothing left to do on a closed
    # store (it used to log a failed lookup every tick).
    with caplog.at_level(logging.WARNING, logger="pitstop"):
        store.close()
        time.sleep(0.3)
    assert _stored_writes(reader, "t-close", root) == {f"{root}/task-a"}
    assert _where(reader, "t-close") == {root: "row", never["id"]: "effects"}
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
@pytest.mark.slow
def test_held_writes_commit_when_the_process_exits(store_url: str, store: Store) -> None:
    code = f"""
import pitstop
from langgraph.checkpoint.base import empty_checkpoint
from pitstop.integrations.langgraph import PitstopSaver
saver = PitstopSaver(pitstop.open_store({store_url!r}))
cfg = {{"configurable": {{"thread_id": "t-exit", "checkpoint_ns": ""}}}}
checkpoint = empty_checkpoint()
saver.put(cfg, checkpoint, {{"source": "input", "step": -1, "parents": {{}}}}, {{}})
cfg["configurable"]["checkpoint_id"] = checkpoint["id"]
saver.put_writes(cfg, [("counter", 1)], "task-a")
print(checkpoint["id"])
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    root = done.stdout.strip()
    assert _stored_writes(store, "t-exit", root) == {f"{root}/task-a"}


def test_write_records_of_every_stored_form_read_back() -> None:
    from pitstop.integrations.langgraph_values import pack_write, pack_writes, unpack_writes

    one = ("task-a", "a", "msgpack", b"\x01", "", 0)
    two = ("task-a", "b", "msgpack", b"\x02", "", 1)
    assert unpack_writes(pack_writes([one, two])) == [one, two]  # a task's regular writes
    assert unpack_writes(pack_write("task-a", "a", ("msgpack", b"\x01"), "", 0)) == [one]
    assert unpack_writes(one) == [one]  # the tuple earlier versions stored
    assert unpack_writes(b"\x01") == [] and unpack_writes({"not": "a write"}) == []
