"""State that grows: pitstop.Append / pitstop.Merge as step results, in state declarations and
their errors (the chunk layout itself is tested in test_chunks.py)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, TypedDict

import pytest

import pitstop
from pitstop import Append, Merge
from pitstop.delta import combine


def test_apply_and_combine() -> None:
    base = [1, 2]
    assert Append([3]).apply(base) == [1, 2, 3]
    assert base == [1, 2]  # never changed in place
    assert Append((4, 5)).apply(None) == [4, 5]
    assert Merge({"a": 1}, b=2).apply({"a": 0, "z": 9}) == {"a": 1, "z": 9, "b": 2}
    assert list(Merge({"new": 1}).apply({"x": 0, "y": 1})) == ["x", "y", "new"]
    assert combine(Append([1]), Append([2])) == Append([1, 2])
    assert combine(Merge(a=1), Merge(a=2, b=3)) == Merge(a=2, b=3)
    with pytest.raises(TypeError, match="messages"):
        combine(Append([1]), Merge(a=1), field="messages")
    with pytest.raises(TypeError, match=r"'notes'.*str"):
        Append(["x"]).apply("text", field="notes")
    with pytest.raises(TypeError, match=r"'docs'.*list"):
        Merge(a=1).apply([], field="docs")
    with pytest.raises(TypeError, match="Append takes"):
        Append("abc")  # type: ignore[arg-type]
    assert repr(Append([1])) == "pitstop.Append([1])"


def test_step_results_append_and_merge(store: pitstop.Store) -> None:
    wf = pitstop.Workflow("grow-results")

    @wf.step
    def first(state: dict[str, Any], ctx: Any) -> Any:
        return {"messages": Append([{"role": "user", "content": "hi"}]), "docs": Merge(a=1)}

    @wf.step
    def second(state: dict[str, Any], ctx: Any) -> Any:
        assert state["messages"][-1]["content"] == "hi"  # later steps see the applied value
        return pitstop.finish({"messages": Append(["bye"]), "docs": Merge({"b": 2})})

    result = wf.start(store, {"messages": ["start"]})
    state = store.latest(result.run_id).state  # type: ignore[union-attr]
    assert state["messages"] == ["start", {"role": "user", "content": "hi"}, "bye"]
    assert state["docs"] == {"a": 1, "b": 2}  # Merge on a missing field starts a dict


def test_declared_fields_append_what_steps_return(store: pitstop.Store) -> None:
    class State(TypedDict):
        messages: Annotated[list[str], Append]
        seen: Annotated[dict[str, int], Merge]
        last: str

    wf = pitstop.Workflow("grow-declared", state=State)

    @wf.step
    def talk(state: State, ctx: Any) -> Any:
        update = {"messages": [f"m{len(state['messages'])}"], "seen": {"talk": 1}, "last": "t"}
        if len(state["messages"]) < 3:
            return pitstop.goto("talk", update)
        return update

    result = wf.start(store, {"messages": [], "seen": {"start": 0}, "last": ""})
    state = store.latest(result.run_id).state  # type: ignore[union-attr]
    assert state["messages"] == ["m0", "m1", "m2", "m3"]
    assert state["seen"] == {"start": 0, "talk": 1}
    assert state["last"] == "t"


def test_declared_dataclass_field(store: pitstop.Store) -> None:
    @dataclasses.dataclass
    class State:
        log: Annotated[list[int], Append] = dataclasses.field(default_factory=list)

    wf = pitstop.Workflow("grow-dataclass", state=State)

    @wf.step
    def one(state: State, ctx: Any) -> Any:
        return {"log": [1]}

    @wf.step
    def two(state: State, ctx: Any) -> Any:
        return {"log": Append([2, 3])}  # an explicit delta is taken as it is

    result = wf.start(store, State(log=[0]))
    assert store.latest(result.run_id).state["log"] == [0, 1, 2, 3]  # type: ignore[union-attr]


def test_append_to_a_field_that_is_not_a_list_names_it(store: pitstop.Store) -> None:
    wf = pitstop.Workflow("grow-wrong")

    @wf.step
    def bad(state: dict[str, Any], ctx: Any) -> Any:
        return {"count": Append([1])}

    with pytest.raises(TypeError, match=r"'count'.*int"):
        wf.start(store, {"count": 5})
