"""PitstopSaver behaves as LangGraph's reference savers where LangGraph's own test suite
looks: configs exactly as theirs, replay into a persistent subgraph from before its first
run, threads whose channel versions are strings. (The suite itself runs from a LangGraph
checkout with tests/external/langgraph_suite.py.)"""

from __future__ import annotations

import operator
from collections import ChainMap
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from pitstop import Store
from pitstop.integrations.langgraph import PitstopSaver


class Notes(TypedDict, total=False):
    notes: Annotated[list, operator.add]
    answer: str


def _ask_graph(checkpointer: Any) -> Any:
    def write(state: Notes) -> Notes:
        return {"notes": ["written"]}

    def ask(state: Notes) -> Notes:
        return {"answer": interrupt("which?")}

    builder = StateGraph(Notes)
    builder.add_node("write", write)
    builder.add_node("ask", ask)
    builder.add_edge(START, "write")
    builder.add_edge("write", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=checkpointer)


def _shape(config: Any) -> Any:
    """A config with its checkpoint id replaced by a marker (ids differ between savers)."""
    if config is None:
        return None
    conf = dict(config["configurable"])
    conf["checkpoint_id"] = "<id>" if conf.get("checkpoint_id") else conf.get("checkpoint_id")
    return {**config, "configurable": conf}


def test_configs_are_exactly_what_the_reference_saver_returns(store: Store) -> None:
    """No private entries: StateSnapshot and CheckpointTuple configs, parent configs and
    the configs put returns are LangGraph's three keys, and a checkpoint's config does not
    change when the thread moves on (nothing in it says whether it was the latest)."""
    shapes = []
    for saver in (InMemorySaver(), PitstopSaver(store)):
        graph = _ask_graph(saver)
        cfg = {"configurable": {"thread_id": "t-configs"}}
        graph.invoke({"notes": []}, cfg)
        paused = graph.get_state(cfg)
        debug = [e for e in graph.stream(Command(resume="a"), cfg, stream_mode="debug")
                 if e["type"] == "checkpoint"]
        again = graph.get_state(paused.config)
        history = list(graph.get_state_history(cfg))
        tuples = list(saver.list(cfg))
        assert again.config == paused.config and again.parent_config == paused.parent_config
        assert [t.config for t in tuples] == [s.config for s in history]
        for snapshot in history:
            assert set(snapshot.config["configurable"]) == {
                "thread_id", "checkpoint_ns", "checkpoint_id"}
        shapes.append((
            _shape(paused.config),
            _shape(paused.parent_config),
            [_shape(s.config) for s in history],
            [_shape(s.parent_config) for s in history],
            [(_shape(e["payload"]["config"]), _shape(e["payload"]["parent_config"]))
             for e in debug],
            _shape(graph.update_state(cfg, {"notes": ["edit"]})),
        ))
    reference, pitstop = shapes
    assert pitstop == reference


class Trail(TypedDict):
    trail: Annotated[list, operator.add]


class Outer(TypedDict):
    runs: Annotated[list, operator.add]


def test_replay_into_a_persistent_subgraph_from_before_its_first_run(store: Store) -> None:
    """A subgraph compiled with checkpointer=True keeps one namespace across invocations.
    Replaying the parent from before the subgraph's first run makes it start again from
    nothing: a parentless checkpoint in a namespace that has checkpoints, which is a
    branch, not another writer racing to start the thread."""
    seen: list[list[str]] = []

    def step(state: Trail) -> Trail:
        seen.append(list(state["trail"]))
        return {"trail": [f"t{len(state['trail'])}"]}

    inner = StateGraph(Trail)
    inner.add_node("step", step)
    inner.add_edge(START, "step")
    inner.add_edge("step", END)

    def before(state: Outer) -> Outer:
        return {"runs": ["before"]}

    outer = StateGraph(Outer)
    outer.add_node("before", before)
    outer.add_node("keeper", inner.compile(checkpointer=True))
    outer.add_edge(START, "before")
    outer.add_edge("before", "keeper")
    outer.add_edge("keeper", END)
    graph = outer.compile(checkpointer=PitstopSaver(store))
    cfg = {"configurable": {"thread_id": "t-keeper"}}
    for _ in range(3):
        graph.invoke({"runs": []}, cfg)
    assert seen == [[], ["t0"], ["t0", "t1"]]  # the subgraph's state persists

    before_keeper = [s.config for s in reversed(list(graph.get_state_history(cfg)))
                     if s.next == ("keeper",)]  # oldest first: one per invocation
    seen.clear()
    graph.invoke(None, before_keeper[0])
    assert seen == [[]]  # replayed from before its first run: empty again
    seen.clear()
    graph.invoke(None, before_keeper[1])
    assert seen == [["t0"]]  # ...and from before its second run: the state it had then
    assert store.verify() == []


def test_thread_with_string_versions_continues(store: Store) -> None:
    """A thread whose channel versions are strings (as SqliteSaver, PostgresSaver and
    InMemorySaver write them), moved into pitstop checkpoint by checkpoint, goes on: new
    versions stay strings and keep increasing, where an int would not compare with them."""
    source = InMemorySaver()
    graph = _ask_graph(source)
    cfg = {"configurable": {"thread_id": "t-strings"}}
    graph.invoke({"notes": []}, cfg)  # paused in ask

    saver = PitstopSaver(store)
    for item in reversed(list(source.list(cfg))):
        parent = item.parent_config or {"configurable": {"thread_id": "t-strings",
                                                         "checkpoint_ns": ""}}
        saved = saver.put(parent, item.checkpoint, item.metadata,
                          item.checkpoint["channel_versions"])
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in item.pending_writes or []:
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            saver.put_writes(saved, writes, task_id)
    before = saver.get_tuple(cfg)
    assert before is not None
    old_versions = before.checkpoint["channel_versions"]
    assert old_versions and all(isinstance(v, str) for v in old_versions.values())

    graph = _ask_graph(saver)
    assert graph.invoke(Command(resume="b"), cfg) == {"notes": ["written"], "answer": "b"}
    graph.invoke({"notes": ["more"]}, cfg)
    after = saver.get_tuple(cfg)
    assert after is not None
    versions = after.checkpoint["channel_versions"]
    assert all(isinstance(v, str) for v in versions.values()), versions
    assert max(versions.values()) > max(old_versions.values())
    assert graph.get_state(cfg).values["notes"] == ["written", "more", "written"]
    assert saver.get_next_version(None, None) == 1 and saver.get_next_version(7, None) == 8
    assert saver.get_next_version(max(versions.values()), None) > max(versions.values())


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c"}},
        {
            "metadata": ChainMap({"thread_id": "t", "user": "a\0b"}),
            "configurable": {"thread_id": "t", "__pregel_x": 1, "run": 2, "ratio": 0.5,
                             "flag": True, "obj": object(), "source": "not copied",
                             "writes": "dropped", "user": "second", "nul": "x\0"},
        },
        {"metadata": {"b": 1, "a": 2}, "configurable": {"a": 3, "c": "4"}},
        {
            # Several maps: the first that has a key gives its value; keys in the order
            # ChainMap iterates them (the last map's first).
            "metadata": ChainMap({"a": "first", "z": 1}, {"b": 2, "a": "hidden"}, {"c": 3.5}),
            "configurable": ChainMap({}, {"thread_id": "t", "__pregel_y": 1, "d": False}),
        },
        {"metadata": ChainMap(), "configurable": ChainMap({})},
    ],
)
def test_checkpoint_metadata_is_langgraphs(config: Any) -> None:
    # What put stores is what LangGraph's savers store, key order included; asked twice,
    # since the second call uses what the first worked out.
    from langgraph.checkpoint.base import get_serializable_checkpoint_metadata

    from pitstop.integrations.langgraph_meta import checkpoint_metadata

    metadata = {"source": "loop", "step": 3, "parents": {}, "writes": {"n": 1}, "s": "y\0"}
    expected = get_serializable_checkpoint_metadata(config, metadata)  # type: ignore[arg-type]
    for _ in range(2):
        got = checkpoint_metadata(config, metadata)  # type: ignore[arg-type]
        assert got == expected
        assert list(got) == list(expected)
    assert "writes" in metadata  # the caller's metadata is left alone
