"""Step timings of LangGraph runs (#29): a real graph through PitstopSaver, read back by
`pitstop history` and `pitstop show --timeline`. Nothing is measured at put: a superstep's
time runs from its parent's LangGraph timestamp (or from when an invocation read its parent)
to its own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph", reason="the langgraph extra is not installed")

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import pitstop
from clitools import pitstop_exe
from pitstop.integrations.langgraph import PitstopSaver

NAP = 0.05  # each node sleeps this long: its step lasts at least that


class State(TypedDict):
    n: int
    answer: str


def _graph(saver: PitstopSaver) -> Any:
    def draft(state: State) -> dict[str, Any]:
        time.sleep(NAP)
        return {"n": state["n"] + 1}

    def review(state: State) -> dict[str, Any]:
        answer = interrupt("approve?")  # the first run stops here; the resume runs it again
        time.sleep(NAP)
        return {"answer": answer}

    def publish(state: State) -> dict[str, Any]:
        time.sleep(NAP)
        return {"n": state["n"] * 10}

    builder = StateGraph(State)
    for name, node in (("draft", draft), ("review", review), ("publish", publish)):
        builder.add_node(name, node)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile(checkpointer=saver)


@pytest.mark.slow
def test_langgraph_steps_have_times_in_history_and_timeline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    config: Any = {"configurable": {"thread_id": "thread-1"}}
    with pitstop.open_store(url) as store:
        graph = _graph(PitstopSaver(store))
        graph.invoke({"n": 1, "answer": ""}, config)
        waited = time.time()
        time.sleep(0.3)  # the human takes a while
        resumed = time.time()
        assert graph.invoke(Command(resume="yes"), config)["n"] == 20

    shown = pitstop_exe("show", "thread-1", "--timeline", "--json", store=url)
    assert shown.code == 0, shown
    steps = {span["label"]: span for span in shown.json["timeline"] if span["kind"] == "step"}
    assert {"draft", "review", "publish"} <= set(steps)
    assert steps["draft"]["seconds"] >= NAP and steps["publish"]["seconds"] >= NAP
    assert steps["draft"]["end"] <= waited
    # The resumed step starts when the resuming invocation read its checkpoint, not when
    # the graph stopped: the wait for the human is not part of it.
    assert steps["review"]["start"] >= resumed
    assert steps["review"]["seconds"] >= NAP

    text = pitstop_exe("show", "thread-1", "--timeline", store=url).out
    assert "draft" in text and "publish" in text and "no timed steps" not in text

    history = pitstop_exe("history", "thread-1", store=url).out
    took = {}
    for line in history.splitlines():
        cells = line.split()
        if len(cells) > 8 and cells[4] in ("loop", "input"):
            took[cells[3]] = cells[8]  # NAME -> TOOK (TIME is a date and a time)
    assert took["-"] == "-"  # the input checkpoint: no node ran
    for name in ("draft", "review", "publish"):
        assert took[name].endswith(("ms", "s")) and took[name] != "-", history
