"""Deleting runs of every kind (workflows with effects, inputs and children, a Checkpointer
loop, a LangGraph thread, a stream job's partitions) leaves no row behind that names them:
checkpoints, effect records, inputs, value reference rows and values (what the soak's
retention relies on for a store whose size stays level)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest

import pitstop
from pitstop.store import Store

BACKENDS = pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
TABLES = ("pitstop_runs", "pitstop_checkpoints", "pitstop_effects", "pitstop_inputs",
          "pitstop_blob_refs", "pitstop_blobs")


class GraphState(TypedDict):
    log: Annotated[list[str], operator.add]


def _rows(store: Store) -> dict[str, int]:
    return {t: int(store._tx(lambda tx, t=t: tx.scalar(f"SELECT COUNT(*) FROM {t}")))  # type: ignore[attr-defined]
            for t in TABLES}


def _workflows() -> pitstop.Workflow:
    child = pitstop.Workflow("leaves-child")

    @child.step
    def work(state: dict[str, Any]) -> dict[str, Any]:
        return {"notes": [f"child note {i} " * 20 for i in range(state["n"])]}

    wf = pitstop.Workflow("leaves-parent")

    @wf.step
    def begin(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        paid = ctx.effect("charge", lambda: {"receipt": "r-" + "x" * 300})
        return {"paid": paid, "items": [f"item {i} " * 30 for i in range(40)]}

    @wf.step(wait_for="ok")
    def approve(state: dict[str, Any], ok: Any) -> dict[str, Any]:
        return {"approved": ok}

    @wf.step
    def fan_out(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"child": len(ctx.run_child(child, {"n": 30}).state["notes"])}

    return wf


@BACKENDS
def test_deleting_runs_of_every_kind_leaves_no_row(
    open_store: Callable[..., Store], store_url: str
) -> None:
    from langgraph.graph import END, START, StateGraph

    from pitstop import stream
    from pitstop.integrations.langgraph import PitstopSaver

    store = open_store()
    wf = _workflows()
    for n in range(2):  # two runs sharing values, deleted one after the other
        assert wf.start(store, {}, run_id=f"p{n}").status is pitstop.RunStatus.WAITING
        pitstop.send(store, f"p{n}", "ok", True)
        assert wf.resume(store, f"p{n}").status is pitstop.RunStatus.COMPLETED
    with pitstop.Checkpointer(store, "loop-1",
                              retention=pitstop.RetentionPolicy(keep_last=2)) as ck:
        state = ck.restore({"i": 0, "seen": []})
        while state["i"] < 10:
            state = {"i": state["i"] + 1, "seen": [*state["seen"], "s" * 100]}
            ck.save(state)
    graph = StateGraph(GraphState)
    graph.add_node("a", lambda s: {"log": ["a" * 200]})
    graph.add_node("b", lambda s: {"log": ["b" * 200]})
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    saver = PitstopSaver(store)
    app = graph.compile(checkpointer=saver)
    for _ in range(3):
        app.invoke({"log": []}, {"configurable": {"thread_id": "t-1"}})
    job = stream.Job("leaves-stream", every=20, seconds=60, source=stream.Iterable(
        [(f"user{i % 7}", "v" * 150) for i in range(200)], partitions=2))
    job.handler(lambda state, record, emit: state.__setitem__(
        record.key, [*state.get(record.key, [])[-20:], record.value]))
    job.run(store, idle_exit=0.05)
    assert len(job.state(store)) == 7
    assert {r.id for r in store.runs(id_prefix="leaves-stream", limit=None)} == {
        "leaves-stream/0", "leaves-stream/1"}
    before = _rows(store)
    assert all(before[t] > 0 for t in TABLES), before  # every kind of row was written

    saver.delete_thread("t-1")
    store.prune(pitstop.RetentionPolicy(finished_older_than=0))  # the workflows and children
    for run in store.runs(limit=None):  # what is left: the loop, the stream's partitions
        store.delete_run(run.id)
    assert _rows(store) == dict.fromkeys(TABLES, 0)
    assert store.verify() == []
