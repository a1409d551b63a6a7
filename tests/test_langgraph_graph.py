"""Real LangGraph graphs on PitstopSaver: interrupts resumed in another process, history,
update_state forks, subgraphs, unchanged big channels, and no silent forks between writers."""

from __future__ import annotations

import itertools
import json
import operator
import os
import sys
import threading
import types
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import pitstop
from conftest import BACKENDS, run_python
from pitstop import RetentionPolicy, RunStatus, Store
from pitstop.integrations.langgraph import (
    WORKFLOW,
    PitstopSaver,
    ThreadConflictError,
    run_id_for,
    stored_id,
)
from pitstop.store import SaveRequest

SHARED = [b for b in BACKENDS if b != "memory"]  # backends several processes can share
MiB = 1024 * 1024

# The approval graph, as source: the test process and its subprocesses build the same one.
APPROVAL = '''
import operator
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

class Approval(TypedDict, total=False):
    log: Annotated[list, operator.add]
    decision: str

def draft(state):
    return {"log": ["draft"]}

def review(state):
    decision = interrupt({"question": "ship it?", "log": state["log"]})
    return {"decision": decision, "log": ["review"]}

def publish(state):
    return {"log": ["published" if state["decision"] == "yes" else "dropped"]}

def approval_graph(checkpointer):
    builder = StateGraph(Approval)
    builder.add_node("draft", draft)
    builder.add_node("review", review)
    builder.add_node("publish", publish)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile(checkpointer=checkpointer)
'''


def _approval_module() -> types.ModuleType:
    # A real module (LangGraph resolves the state's annotations in its class's module).
    module = sys.modules.get("_langgraph_approval")
    if module is None:
        module = types.ModuleType("_langgraph_approval")
        sys.modules[module.__name__] = module
        exec(APPROVAL, module.__dict__)
    return module


def approval_graph(saver: PitstopSaver) -> Any:
    return _approval_module().approval_graph(saver)


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def children(store: Store, run_id: str) -> Counter[str | None]:
    """How many children each checkpoint of the run has (a fork shows as 2)."""
    return Counter(s.parent_id for s in store.history(run_id, limit=None))


# -- interrupt in one process, resume in another ------------------------------------------------

STEP = APPROVAL + '''
import json, sys
import pitstop
from langgraph.types import Command
from pitstop.integrations.langgraph import PitstopSaver

url, thread, action = sys.argv[1:4]
with pitstop.open_store(url) as store:
    graph = approval_graph(PitstopSaver(store))
    cfg = {"configurable": {"thread_id": thread}}
    if action == "start":
        out = graph.invoke({"log": []}, cfg)
        print(json.dumps({"interrupt": out["__interrupt__"][0].value,
                          "next": list(graph.get_state(cfg).next)}))
    else:
        out = graph.invoke(Command(resume=action), cfg)
        print(json.dumps({"state": out, "next": list(graph.get_state(cfg).next)}))
'''


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
@pytest.mark.slow
def test_interrupt_then_resume_in_another_process(store_url: str, store: Store) -> None:
    first = run_python(STEP, store_url, "t-approval", "start")
    assert first.returncode == 0, first.stderr
    paused = json.loads(first.stdout)
    assert paused == {
        "interrupt": {"question": "ship it?", "log": ["draft"]},
        "next": ["review"],
    }
    # The first process is gone: the thread waits in the store, visible to pitstop's tools.
    run = store.get_run("t-approval")
    assert run.status == RunStatus.WAITING and run.workflow == WORKFLOW

    second = run_python(STEP, store_url, "t-approval", "yes")
    assert second.returncode == 0, second.stderr
    done = json.loads(second.stdout)
    assert done == {
        "state": {"log": ["draft", "review", "published"], "decision": "yes"},
        "next": [],
    }
    assert store.get_run("t-approval").status == RunStatus.RUNNING
    assert [s.source for s in store.history("t-approval")] == [
        "loop", "loop", "loop", "loop", "input"
    ]
    assert store.verify() == []


# -- history and pitstop's own tools -----------------------------------------------------------


def test_history_matches_pitstop_history_and_prune(store: Store) -> None:
    saver = PitstopSaver(store)
    graph = approval_graph(saver)
    cfg = config("t-history")
    graph.invoke({"log": []}, cfg)
    graph.invoke(Command(resume="no"), cfg)

    snapshots = list(graph.get_state_history(cfg))
    assert [s.metadata["step"] for s in snapshots] == [3, 2, 1, 0, -1]
    assert snapshots[0].values == {"log": ["draft", "review", "dropped"], "decision": "no"}
    assert snapshots[2].next == ("review",) and snapshots[2].tasks[0].interrupts
    for newer, older in itertools.pairwise(snapshots):
        assert newer.parent_config["configurable"]["checkpoint_id"] == (
            older.config["configurable"]["checkpoint_id"]
        )
    # The same checkpoints, newest first, as pitstop shows them (no state decoded).
    history = store.history("t-history")
    assert [s.id for s in history] == [
        stored_id(s.config["configurable"]["checkpoint_id"], "t-history") for s in snapshots
    ]
    assert [(s.step, s.source, s.metadata["step_name"]) for s in history] == [
        (3, "loop", "publish"),
        (2, "loop", "review"),
        (1, "loop", "draft"),
        (0, "loop", "__start__"),
        (-1, "input", None),
    ]
    assert [r.id for r in store.runs(workflow=WORKFLOW)] == ["t-history"]
    assert store.get_run("t-history").metadata == {"thread_id": "t-history", "checkpoint_ns": ""}
    # LangGraph's filters and pagination.
    assert [s.metadata["step"] for s in graph.get_state_history(cfg, filter={"source": "input"})] \
        == [-1]
    assert [s.metadata["step"] for s in graph.get_state_history(cfg, before=snapshots[1].config,
                                                                 limit=2)] == [1, 0]

    # config=None lists every LangGraph thread in the store.
    assert [t.metadata["step"] for t in saver.list(None, limit=2)] == [3, 2]

    # pitstop's retention applies to LangGraph threads like to any run.
    report = store.prune(RetentionPolicy(keep_last=2), run_id="t-history")
    assert len(report.checkpoints) == 3
    assert graph.get_state(cfg).values == snapshots[0].values
    assert len(list(graph.get_state_history(cfg))) == 2
    assert store.verify() == []


# -- update_state: continuing the head, branching from an earlier checkpoint -------------------


def test_update_state_forks_from_earlier_checkpoint(store: Store) -> None:
    graph = approval_graph(PitstopSaver(store))
    cfg = config("t-fork")
    graph.invoke({"log": []}, cfg)  # paused at review
    graph.invoke(Command(resume="yes"), cfg)  # published
    history = list(graph.get_state_history(cfg))
    at_review = next(s for s in history if s.next == ("review",))

    # Edit the past: answer as the reviewer on the checkpoint that waited for one.
    branch = graph.update_state(at_review.config, {"decision": "no", "log": ["edited"]},
                                as_node="review")
    assert graph.get_state(cfg).next == ("publish",)  # the branch is now the thread's latest
    out = graph.invoke(None, branch)
    assert out == {"log": ["draft", "edited", "dropped"], "decision": "no"}

    # The first branch is intact; the checkpoint we branched from now has two children.
    original = graph.get_state(history[0].config)
    assert original.values == {"log": ["draft", "review", "published"], "decision": "yes"}
    assert children(store, "t-fork")[stored_id(
        at_review.config["configurable"]["checkpoint_id"], "t-fork")] == 2
    sources = [s.source for s in store.history("t-fork")]
    assert sources[:2] == ["loop", "update"]

    # update_state on the latest checkpoint continues the thread (a plain child of the head).
    graph.update_state(cfg, {"log": ["note"]}, as_node="publish")
    assert graph.get_state(cfg).values["log"][-1] == "note"
    assert store.verify() == []


# -- subgraphs: one run per checkpoint namespace ------------------------------------------------


class Inner(TypedDict, total=False):
    log: Annotated[list, operator.add]


def test_subgraph_namespaces(store: Store) -> None:
    def inner_step(state: Inner) -> Inner:
        return {"log": [f"inner:{interrupt('inner?')}"]}

    inner = StateGraph(Inner)
    inner.add_node("inner_step", inner_step)
    inner.add_edge(START, "inner_step")
    inner.add_edge("inner_step", END)

    def outer_first(state: Inner) -> Inner:
        return {"log": ["outer"]}

    outer = StateGraph(Inner)
    outer.add_node("outer_first", outer_first)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "outer_first")
    outer.add_edge("outer_first", "sub")
    outer.add_edge("sub", END)
    saver = PitstopSaver(store)
    graph = outer.compile(checkpointer=saver)
    cfg = config("t-sub")

    graph.invoke({"log": []}, cfg)
    state = graph.get_state(cfg, subgraphs=True)
    assert state.next == ("sub",)
    sub_state = state.tasks[0].state
    assert sub_state is not None and sub_state.values == {"log": ["outer"]}
    ns = sub_state.config["configurable"]["checkpoint_ns"]
    assert ns.startswith("sub:")
    assert {r.id for r in store.runs(workflow=WORKFLOW)} == {"t-sub", run_id_for("t-sub", ns)}
    assert store.get_run(run_id_for("t-sub", ns)).metadata == {
        "thread_id": "t-sub", "checkpoint_ns": ns
    }
    # list() without a namespace covers every namespace of the thread, newest first.
    every = list(saver.list({"configurable": {"thread_id": "t-sub"}}))
    assert {t.config["configurable"]["checkpoint_ns"] for t in every} == {"", ns}
    ids = [t.checkpoint["id"] for t in every]
    assert ids == sorted(ids, reverse=True)

    out = graph.invoke(Command(resume="ok"), cfg)
    assert out["log"][-1] == "inner:ok"
    saver.delete_thread("t-sub")
    assert store.runs(workflow=WORKFLOW) == []


# -- unchanged channels are stored once ---------------------------------------------------------


class Loop(TypedDict, total=False):
    counter: int
    big: Any


def loop_graph(saver: PitstopSaver, steps: int, big: Any) -> Any:
    def load(state: Loop) -> Loop:
        return {"big": big}  # written once; no later step changes it

    def step(state: Loop) -> Loop:
        return {"counter": state["counter"] + 1}

    builder = StateGraph(Loop)
    builder.add_node("load", load)
    builder.add_node("step", step)
    builder.add_edge(START, "load")
    builder.add_edge("load", "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["counter"] < steps else END)
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("kind", ["str", "list"])
@pytest.mark.slow
def test_unchanged_big_channel_is_stored_once(store: Store, kind: str) -> None:
    # Random base64 text: compression cannot make it small (it keeps ~3/4 of its size).
    text = __import__("base64").b64encode(os.urandom(MiB * 3 // 4)).decode()
    big: Any = text if kind == "str" else [text[i : i + 64] for i in range(0, MiB, 64)]
    graph = loop_graph(PitstopSaver(store), 200, big)
    cfg = {**config(f"t-big-{kind}"), "recursion_limit": 300}
    out = graph.invoke({"counter": 0}, cfg)
    assert out["counter"] == 200 and out["big"] == big
    stats = store.stats()
    assert stats.checkpoints >= 200
    assert stats.bytes < 2 * MiB, stats
    assert graph.get_state(cfg).values["big"] == big


# -- no silent forks ----------------------------------------------------------------------------


def _race(
    graphs: list[Any], start: Callable[[int], Any], cfg: Any
) -> dict[int, Any]:
    """Run ``start(i)`` for each graph in its own thread; return results or exceptions."""
    results: dict[int, Any] = {}

    def worker(i: int) -> None:
        try:
            results[i] = graphs[i].invoke(start(i), cfg)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(graphs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
def test_two_writers_on_one_thread_never_fork_it(open_store: Callable[..., Store]) -> None:
    """LangGraph issue 8796: two workers resume one thread from the same checkpoint. Both run
    the node (a barrier makes sure), both try to write its result on the same parent: one
    wins, the other gets ThreadConflictError, and the thread's history stays a line."""
    barrier = threading.Barrier(2, timeout=30)

    class State(TypedDict, total=False):
        log: Annotated[list, operator.add]

    def review(state: State) -> State:
        answer = interrupt("who?")
        barrier.wait()  # both workers are inside the node, from the same checkpoint
        return {"log": [answer]}

    builder = StateGraph(State)
    builder.add_node("review", review)
    builder.add_edge(START, "review")
    builder.add_edge("review", END)
    stores = [open_store(), open_store()]  # two savers, two connections: like two processes
    graphs = [builder.compile(checkpointer=PitstopSaver(s)) for s in stores]
    cfg = config("t-race")
    graphs[0].invoke({"log": []}, cfg)

    results = _race(graphs, lambda i: Command(resume=f"worker-{i}"), cfg)
    errors = [r for r in results.values() if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], ThreadConflictError), results
    (winner,) = [r for r in results.values() if not isinstance(r, Exception)]
    assert max(children(stores[0], "t-race").values()) == 1
    assert graphs[1].get_state(cfg).values == winner
    assert "another writer moved this LangGraph thread on" in str(errors[0])


@pytest.mark.parametrize("store_url", SHARED, indirect=True)
def test_two_first_invocations_on_an_empty_thread(open_store: Callable[..., Store]) -> None:
    barrier = threading.Barrier(2, timeout=10)

    def node(state: Loop) -> Loop:
        barrier.wait()
        return {"counter": state["counter"] + 1}

    builder = StateGraph(Loop)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    stores = [open_store(), open_store()]
    graphs = [builder.compile(checkpointer=PitstopSaver(s)) for s in stores]
    # Both read the thread as empty and write its first (input) checkpoint, which LangGraph
    # saves in the background while the node runs: the barrier holds both inside the node,
    # so both really started from nothing. Only one may start the thread.
    results = _race(graphs, lambda i: {"counter": 10 * i}, config("t-first"))
    conflicts = [r for r in results.values() if isinstance(r, ThreadConflictError)]
    assert len(conflicts) == 1, results
    assert [r for r in results.values() if not isinstance(r, Exception)] == [
        {"counter": 1} if isinstance(results[1], Exception) else {"counter": 11}
    ]
    roots = [s for s in stores[0].history("t-first", limit=None) if s.parent_id is None]
    assert len(roots) == 1
    assert max(children(stores[0], "t-first").values()) == 1


def _put(saver: PitstopSaver, thread: str, parent: str | None, source: str, step: int,
         **configurable: Any) -> str:
    checkpoint = empty_checkpoint()
    cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": "", **configurable}}
    if parent:
        cfg["configurable"]["checkpoint_id"] = parent
    saver.put(cfg, checkpoint, {"source": source, "step": step, "parents": {}}, {})  # type: ignore[typeddict-item]
    return checkpoint["id"]


def _read(saver: PitstopSaver, thread: str, checkpoint_id: str | None = None) -> Any:
    cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if checkpoint_id:
        cfg["configurable"]["checkpoint_id"] = checkpoint_id
    return saver.get_tuple(cfg)


def test_which_puts_must_continue_the_head(store: Store) -> None:
    saver = PitstopSaver(store)
    assert _read(saver, "t-rules") is None  # the thread is read as empty...
    root = _put(saver, "t-rules", None, "input", -1)  # ...and started
    a = _put(saver, "t-rules", root, "loop", 0)
    # A loop step whose parent is no longer the head: another writer moved the thread on.
    with pytest.raises(ThreadConflictError):
        _put(saver, "t-rules", root, "loop", 0)
    # An input or update on a checkpoint read as the latest continues the thread: its
    # parent must still be the head when it is written.
    assert _read(saver, "t-rules").checkpoint["id"] == a
    _put(store_saver := PitstopSaver(store), "t-rules", a, "loop", 1)  # another process
    with pytest.raises(ThreadConflictError):
        _put(saver, "t-rules", a, "input", 2)
    # ...but one on a checkpoint read as an earlier one was addressed on purpose: a branch.
    assert _read(saver, "t-rules", root).checkpoint["id"] == root
    b = _put(saver, "t-rules", root, "update", 1)
    _put(saver, "t-rules", a, "fork", 1)  # time travel without input, __copy__: branches
    # An input on a config made by hand (never read here) is a branch; a loop step goes on.
    _put(PitstopSaver(store), "t-rules", root, "input", 0)
    # A parentless checkpoint in a namespace that has checkpoints (a replay into a subgraph
    # from before its first run) is a new root, unless its writer read the thread empty.
    _put(saver, "t-rules", None, "input", -1)
    # Configs are exactly what LangGraph's savers return: nothing private in them.
    latest = _read(saver, "t-rules")
    assert latest.config == {"configurable": {"thread_id": "t-rules", "checkpoint_ns": "",
                                              "checkpoint_id": latest.checkpoint["id"]}}
    assert _read(saver, "t-rules", latest.checkpoint["id"]).config == latest.config
    # Putting the same checkpoint again (a retried call) is not an error.
    checkpoint = empty_checkpoint()
    meta: Any = {"source": "loop", "step": 2, "parents": {}}
    saver.put(latest.config, checkpoint, meta, {})
    saver.put(latest.config, checkpoint, meta, {})
    assert b != checkpoint["id"] and store_saver is not saver
    assert store.verify() == []


def test_two_readers_in_one_saver_cannot_both_continue(store: Store) -> None:
    """Two invocations through one saver (a server handling a duplicate request) read the
    same latest checkpoint, or both read an empty thread: only the first write wins."""
    saver = PitstopSaver(store)
    assert _read(saver, "t-same") is None and _read(saver, "t-same") is None
    root = _put(saver, "t-same", None, "input", -1)
    with pytest.raises(ThreadConflictError):
        _put(saver, "t-same", None, "input", -1)
    assert _read(saver, "t-same").checkpoint["id"] == root
    assert _read(saver, "t-same").checkpoint["id"] == root
    _put(saver, "t-same", root, "input", 0)
    with pytest.raises(ThreadConflictError):
        _put(saver, "t-same", root, "update", 0)


# -- async graphs ------------------------------------------------------------------------------


async def test_async_graph_uses_the_async_api(store: Store) -> None:
    saver = PitstopSaver(store)
    graph = approval_graph(saver)
    cfg = config("t-async")
    out = await graph.ainvoke({"log": []}, cfg)
    assert out["__interrupt__"][0].value["question"] == "ship it?"
    out = await graph.ainvoke(Command(resume="yes"), cfg)
    assert out["log"] == ["draft", "review", "published"]
    steps = [t.metadata["step"] async for t in saver.alist(cfg)]
    assert steps == [3, 2, 1, 0, -1]
    latest = await saver.aget_tuple(cfg)
    assert latest is not None and latest.checkpoint["channel_values"]["decision"] == "yes"
    await saver.acopy_thread("t-async", "t-async-copy")
    copied = await saver.aget_tuple(config("t-async-copy"))
    assert copied is not None and copied.checkpoint["id"] == latest.checkpoint["id"]
    await saver.adelete_thread("t-async")
    assert await saver.aget_tuple(cfg) is None
    assert (await graph.aget_state(config("t-async-copy"))).values["decision"] == "yes"


# -- odd corners --------------------------------------------------------------------------------


def test_metadata_that_is_not_json_round_trips(store: Store) -> None:
    from datetime import UTC, datetime

    saver = PitstopSaver(store)
    checkpoint = empty_checkpoint()
    when = datetime(2024, 5, 1, tzinfo=UTC)
    cfg: Any = {"configurable": {"thread_id": "t-meta", "checkpoint_ns": ""}}
    meta: Any = {"source": "input", "step": -1, "parents": {}, "when": when}
    saver.put(cfg, checkpoint, meta, {})
    found = saver.get_tuple(cfg)
    assert found is not None and found.metadata["when"] == when
    assert [t.metadata["when"] for t in saver.list(cfg, filter={"source": "input"})] == [when]


def test_delete_for_runs_can_delete_the_head_and_prune_refuses_delta_threads(
    store: Store,
) -> None:
    saver = PitstopSaver(store)
    run_a, run_b = uuid.uuid4().hex, uuid.uuid4().hex
    first = _put(saver, "t-runs", None, "input", -1, run_id=run_a)
    second = _put(saver, "t-runs", first, "loop", 0, run_id=run_b)
    saver.delete_for_runs([run_b])
    latest = saver.get_tuple(config("t-runs"))
    assert latest is not None and latest.checkpoint["id"] == first
    assert store.get_run("t-runs").head_id == stored_id(first, "t-runs")
    assert second not in [t.checkpoint["id"] for t in saver.list(config("t-runs"))]
    # The thread continues from its new head.
    _put(saver, "t-runs", first, "loop", 0)

    checkpoint = empty_checkpoint()
    saver.put(
        {"configurable": {"thread_id": "t-delta", "checkpoint_ns": ""}},
        checkpoint,
        {"source": "input", "step": -1, "parents": {},  # type: ignore[typeddict-unknown-key]
         "counters_since_delta_snapshot": {"messages": [1, 1]}},
        {},
    )
    with pytest.raises(NotImplementedError, match="t-delta"):
        saver.prune(["t-runs", "t-delta"])
    saver.prune(["t-runs"])
    assert len(list(saver.list(config("t-runs")))) == 1


def test_run_status_is_written_only_when_it_may_have_changed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    statuses: list[RunStatus | None] = []
    save = store.save_request

    def spy(request: SaveRequest) -> Any:
        statuses.append(request.control.status)
        return save(request)

    monkeypatch.setattr(store, "save_request", spy)
    save_step = getattr(store, "save_step", None)
    if save_step is not None:  # a loop step's save on SQLite (pitstop.store.engine.steps)

        def spy_step(request: SaveRequest) -> Any:
            written = save_step(request)
            if written:
                statuses.append(request.control.status)
            return written

        monkeypatch.setattr(store, "save_step", spy_step)
    graph = approval_graph(PitstopSaver(store))
    cfg = config("t-status")
    graph.invoke({"log": []}, cfg)
    # The thread's first checkpoint names the status; loop steps continuing it do not.
    assert statuses == [RunStatus.RUNNING, None, None]
    assert store.get_run("t-status").status == RunStatus.WAITING
    # Resumed (in a new saver, as another process would): the first checkpoint after the
    # interrupt marks the run running again, the next step leaves it.
    statuses.clear()
    graph = approval_graph(PitstopSaver(store))
    assert graph.invoke(Command(resume="yes"), cfg)["log"][-1] == "published"
    assert statuses == [RunStatus.RUNNING, None]
    assert store.get_run("t-status").status == RunStatus.RUNNING
    # A saver going on from a checkpoint it recorded an interrupt on, without reading it.
    statuses.clear()
    saver = PitstopSaver(store)
    root = _put(saver, "t-status-2", None, "input", -1)
    paused = _put(saver, "t-status-2", root, "loop", 0)
    saver.put_writes(
        {"configurable": {"thread_id": "t-status-2", "checkpoint_ns": "",
                          "checkpoint_id": paused}},
        [("__interrupt__", "ok?")],
        "task",
    )
    assert store.get_run("t-status-2").status == RunStatus.WAITING
    _put(saver, "t-status-2", _put(saver, "t-status-2", paused, "loop", 1), "loop", 2)
    assert statuses == [RunStatus.RUNNING, None, RunStatus.RUNNING, None]
    assert store.get_run("t-status-2").status == RunStatus.RUNNING


def test_values_and_writes_in_the_earlier_format_are_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Channel values and pending writes are stored as msgpack byte strings; the tuples
    earlier versions stored are still read."""
    import pitstop.integrations.langgraph as integration

    saver = PitstopSaver(store)
    for thread, old in (("t-old", True), ("t-new", False)):
        if old:
            monkeypatch.setattr(integration, "pack_typed", lambda typed: typed)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": 1, "b": ["x", b"y"]}
        checkpoint["channel_versions"] = {"a": 1, "b": 1}
        cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        meta: Any = {"source": "input", "step": -1, "parents": {}}
        saved = saver.put(cfg, checkpoint, meta, {"a": 1, "b": 1})
        monkeypatch.undo()
        head = store.latest(thread)
        assert head is not None
        assert isinstance(head.state["a"], tuple if old else bytes)
        type_, data = saver.serde.dumps_typed({"v": 1})
        store.record_effects(  # a pending write as earlier versions stored it
            thread,
            {f"{checkpoint['id']}/task-a/0": ("task-a", "a", type_, data, "", 0)},
            checkpoint_id=head.id,
        )
        saver.put_writes(saved, [("b", ["z"]), ("__error__", "boom")], "task-b")
        found = PitstopSaver(store).get_tuple(cfg)
        assert found is not None
        assert found.checkpoint["channel_values"] == {"a": 1, "b": ["x", b"y"]}
        assert found.pending_writes == [
            ("task-a", "a", {"v": 1}),
            ("task-b", "__error__", "boom"),
            ("task-b", "b", ["z"]),
        ]


def test_saver_opened_from_a_url_owns_its_store(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'owned.db'}"
    with PitstopSaver(url) as saver:
        graph = approval_graph(saver)
        graph.invoke({"log": []}, config("t-url"))
    with pitstop.open_store(url) as store:
        assert store.get_run("t-url").status == RunStatus.WAITING


def test_store_delete_checkpoints(store: Store) -> None:
    """The store method delete_for_runs is built on (added for it): deletes any checkpoints,
    the head included, with their effect records and the values nothing else uses."""
    a = store.save("r", {"v": "a" * 5000, "keep": 1})
    b = store.save("r", {"v": "b" * 5000, "keep": 1})
    c = store.save("r", {"v": "c" * 5000, "keep": 1})
    store.record_effects("r", {"w": 1}, checkpoint_id=c.id)
    blobs = store.stats().blobs
    dry = store.delete_checkpoints("r", [b.id, c.id, "not-there"], dry_run=True)
    assert dry.dry_run and sorted(dry.checkpoints) == sorted([b.id, c.id])
    assert store.get_run("r").head_id == c.id
    report = store.delete_checkpoints("r", [b.id, c.id])
    assert sorted(report.checkpoints) == sorted([b.id, c.id]) and report.blobs >= 1
    assert store.stats().blobs < blobs
    run = store.get_run("r")
    assert (run.head_id, run.step, run.checkpoints) == (a.id, a.step, 1)
    assert store.effects("r") == {}
    assert store.latest("r").state == {"v": "a" * 5000, "keep": 1}  # type: ignore[union-attr]
    assert store.verify() == []
    store.delete_checkpoints("r", [a.id])
    assert store.latest("r") is None and store.get_run("r").head_id is None
    assert store.delete_checkpoints("missing", [a.id]).checkpoints == []
