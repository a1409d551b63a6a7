"""PitstopSaver with a growing messages channel (issue #12): each step stores the new
message, not the channel; DeltaChannel keeps working."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

from pitstop import Store


def _chat_graph(steps: int, channel: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    state = TypedDict("state", {"messages": Annotated[list[Any], channel]})  # type: ignore[misc]  # noqa: UP013

    def respond(s: Any) -> dict[str, Any]:
        n = len(s["messages"])
        return {"messages": [{"role": "ai", "content": f"{n}:" + "x" * 1500, "id": str(n)}]}

    def route(s: Any) -> str:
        return "respond" if len(s["messages"]) <= steps else END

    builder = StateGraph(state)
    builder.add_node("respond", respond)
    builder.add_edge(START, "respond")
    builder.add_conditional_edges("respond", route)
    return builder


def test_langgraph_messages_channel_stores_only_new_messages(store: Store) -> None:
    from langgraph.graph.message import add_messages

    from pitstop.integrations.langgraph import PitstopSaver

    saver = PitstopSaver(store)
    graph = _chat_graph(60, add_messages).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
    out = graph.invoke({"messages": [{"role": "user", "content": "hi"}]}, config)
    assert len(out["messages"]) == 61
    added = [s.added for s in store.history("t", limit=20)]
    assert max(added) < 8000, added  # each step: the new message, not the channel
    again = PitstopSaver(store)  # a fresh saver (another process) reads it back whole
    state = _chat_graph(60, add_messages).compile(checkpointer=again).get_state(config)
    assert [m.content for m in state.values["messages"]] == [m.content for m in out["messages"]]
    assert store.verify() == []


@pytest.mark.slow
def test_langgraph_delta_channel_keeps_working(store: Store) -> None:
    from langgraph.channels import DeltaChannel

    def extend(log: list[int], batches: list[list[int]]) -> list[int]:
        return log + [item for batch in batches for item in batch]

    from pitstop.integrations.langgraph import PitstopSaver

    def build() -> Any:
        from langgraph.graph import END, START, StateGraph

        state = TypedDict(  # type: ignore[misc]  # noqa: UP013
            "state", {"log": Annotated[list[int], DeltaChannel(extend)]}
        )

        def step(s: Any) -> dict[str, Any]:
            return {"log": [len(s["log"])]}

        builder = StateGraph(state)
        builder.add_node("step", step)
        builder.add_edge(START, "step")
        builder.add_conditional_edges("step", lambda s: "step" if len(s["log"]) < 40 else END)
        return builder

    config: Any = {"configurable": {"thread_id": "d"}, "recursion_limit": 100}
    out = build().compile(checkpointer=PitstopSaver(store)).invoke({"log": []}, config)
    assert out["log"] == list(range(40))
    state = build().compile(checkpointer=PitstopSaver(store)).get_state(config)
    assert state.values["log"] == list(range(40))
