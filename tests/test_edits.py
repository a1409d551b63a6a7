"""apply_field_edits: JSON typed in by people, converted to the types a state holds, or refused.

The rules behind ``pitstop fork --set`` and the web inspector's edits (one function for both):
a registered dataclass stays a dataclass, a typo is not a new field, and a refusal names the
field and says what it expected.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple, TypedDict

import pytest

import pitstop
from pitstop.edits import apply_field_edits
from pitstop.errors import FieldEditError
from pitstop.serde import UnknownObject, to_jsonable


class Risk(enum.Enum):
    LOW = "low"
    HIGH = "high"


@dataclasses.dataclass
class Step:
    name: str
    done: bool = False


@pitstop.register
@dataclasses.dataclass
class Plan:
    goal: str
    steps: list[Step]
    risk: Risk = Risk.LOW


pitstop.register(Step)
pitstop.register(Risk)


class Point(NamedTuple):
    x: int
    y: int


@dataclasses.dataclass
class AgentState:
    plan: Plan | None = None
    count: int = 0
    ratio: float = 0.5
    tags: tuple[str, ...] = ()
    due: datetime | None = None


def refused(state: dict[str, Any], edits: dict[str, Any], **kw: Any) -> str:
    before = to_jsonable(state)
    with pytest.raises(FieldEditError) as info:
        apply_field_edits(state, edits, **kw)
    assert to_jsonable(state) == before  # nothing changed, even partly
    return str(info.value)


def plan() -> Plan:
    return Plan("ship", [Step("build"), Step("test")])


# -- the two traps of the issue ------------------------------------------------------------------


def test_a_dataclass_field_set_from_json_stays_that_dataclass() -> None:
    state = {"plan": plan(), "count": 1}
    out = apply_field_edits(state, {"plan": {"goal": "x", "steps": [{"name": "a"}]}})
    assert out == {"plan": Plan("x", [Step("a")])}
    assert isinstance(out["plan"].steps[0], Step)
    assert state["plan"] == plan()  # the loaded state is never mutated


def test_a_partial_object_is_refused_with_the_missing_field_and_the_way_out() -> None:
    message = refused({"plan": plan()}, {"plan": {"goal": "x"}})
    assert "field 'plan'" in message and "'steps'" in message and "plan.goal=JSON" in message


def test_an_unknown_field_is_refused_unless_adding_is_asked_for() -> None:
    message = refused({"plan": plan(), "count": 1}, {"nosuchfield": 1})
    assert "no field 'nosuchfield'" in message and "count, plan" in message
    assert "--add" in message
    assert apply_field_edits({"count": 1}, {"extra": [1]}, add=True) == {"extra": [1]}


def test_an_unknown_attribute_of_a_dataclass_is_refused() -> None:
    message = refused({"plan": plan()}, {"plan": {"goal": "x", "steps": [], "gaol": 1}})
    assert "has no field 'gaol'" in message and "goal, steps, risk" in message


# -- scalar types ----------------------------------------------------------------------------------


def test_scalars_keep_their_type_or_are_refused() -> None:
    state = {"count": 3, "ratio": 0.5, "name": "a", "flag": True}
    assert apply_field_edits(state, {"count": 4, "ratio": 1, "flag": False}) == {
        "count": 4, "ratio": 1.0, "flag": False}
    assert type(apply_field_edits(state, {"ratio": 1})["ratio"]) is float
    assert "expects an int, got a string '4'" in refused(state, {"count": "4"})
    assert "expects a bool" in refused(state, {"flag": 1})
    assert "expects an int" in refused(state, {"count": True})
    assert "expects a str" in refused(state, {"name": 5})


def test_times_enums_decimals_parse_from_the_text_show_prints() -> None:
    state = {"at": datetime(2026, 1, 1, tzinfo=UTC), "risk": Risk.LOW, "cost": Decimal("1.5"),
             "wait": timedelta(seconds=5)}
    out = apply_field_edits(state, {"at": "2026-02-01T10:00:00+00:00", "risk": "Risk.HIGH",
                                    "cost": "2.25", "wait": 90})
    assert out == {"at": datetime(2026, 2, 1, 10, tzinfo=UTC), "risk": Risk.HIGH,
                   "cost": Decimal("2.25"), "wait": timedelta(seconds=90)}
    assert apply_field_edits(state, {"risk": "high"})["risk"] is Risk.HIGH
    assert "no time zone" in refused(state, {"at": "2026-02-01T10:00:00"})
    assert "members: LOW, HIGH" in refused(state, {"risk": "medium"})


def test_containers_keep_their_kind_and_typed_members() -> None:
    state = {"tags": ("a", "b"), "seen": {1, 2}, "queue": deque([1], maxlen=5), "p": Point(1, 2),
             "steps": [Step("a")]}
    out = apply_field_edits(state, {"tags": ["c"], "seen": [3], "queue": [1, 2],
                                    "p": {"x": 5, "y": 6}, "steps": [{"name": "b"}]})
    assert out["tags"] == ("c",) and out["seen"] == {3} and out["p"] == Point(5, 6)
    assert out["queue"] == deque([1, 2]) and out["queue"].maxlen == 5
    assert out["steps"] == [Step("b")]
    assert "expects a JSON list, got a string" in refused(state, {"tags": "c"})


def test_bytes_cannot_be_written_as_json() -> None:
    assert "bytes" in refused({"blob": b"xx"}, {"blob": "yy"})
    assert apply_field_edits({"blob": b"xx"}, {"blob": b"yy"}) == {"blob": b"yy"}


def test_null_is_refused_where_the_annotation_forbids_it() -> None:
    assert apply_field_edits({"plan": plan()}, {"plan": None}) == {"plan": None}  # no hint
    message = refused({"count": 1}, {"count": None}, state_type=AgentState)
    assert "cannot be null" in message
    assert apply_field_edits({"plan": plan()}, {"plan": None}, state_type=AgentState) == {
        "plan": None}


# -- annotations: the state type, nested dataclasses ---------------------------------------------


def test_the_state_types_annotations_type_fields_that_hold_nothing_yet() -> None:
    state = {"plan": None, "count": 0, "ratio": 0.5, "tags": (), "due": None}
    out = apply_field_edits(
        state, {"plan": {"goal": "g", "steps": [{"name": "s", "done": True}], "risk": "HIGH"},
                "due": "2026-03-01T00:00:00+00:00"}, state_type=AgentState,
    )
    assert out["plan"] == Plan("g", [Step("s", True)], Risk.HIGH)
    assert out["due"] == datetime(2026, 3, 1, tzinfo=UTC)
    assert "AgentState has no field 'nosuch'" in refused(
        state, {"nosuch": 1}, state_type=AgentState, add=True)


def test_a_float_annotation_wins_over_an_int_stored_in_it() -> None:
    out = apply_field_edits({"ratio": 1}, {"ratio": 2.5}, state_type=AgentState)
    assert out == {"ratio": 2.5}


def test_a_typed_dict_state_declares_its_keys() -> None:
    class State(TypedDict, total=False):
        count: int
        plan: Plan

    assert apply_field_edits({}, {"count": 2}, state_type=State) == {"count": 2}
    assert "State has no field 'cnt'" in refused({}, {"cnt": 2}, state_type=State)


def test_a_type_named_in_json_builds_a_registered_class_into_an_untyped_field() -> None:
    out = apply_field_edits({"plan": None}, {"plan": {"$type": "test_edits.Plan", "goal": "g",
                                                       "steps": []}})
    assert out == {"plan": Plan("g", [])}
    assert "not a registered class" in refused({"plan": None}, {"plan": {"$type": "os.system"}})


# -- paths ----------------------------------------------------------------------------------------


def test_a_path_edits_inside_a_value_on_a_copy() -> None:
    state = {"plan": plan(), "messages": [{"role": "user", "content": "hi"}]}
    out = apply_field_edits(state, {"plan.goal": "x", "plan.steps[-1].done": True,
                                    "messages[-1].content": "bye"})
    assert out["plan"] == Plan("x", [Step("build"), Step("test", True)])
    assert out["messages"] == [{"role": "user", "content": "bye"}]
    assert state["plan"] == plan() and state["messages"][0]["content"] == "hi"


def test_a_path_is_typed_by_what_it_reaches() -> None:
    state = {"plan": plan(), "contract": {"budget": 1000}}
    assert "field 'plan.steps[0].done': expects a bool" in refused(
        state, {"plan.steps[0].done": "yes"})
    assert "at plan.steps[1]: holds a test_edits.Step" in refused(
        state, {"plan": {"goal": "g", "steps": [{"name": "a"}, "b"]}})
    assert "expects an int" in refused(state, {"contract.budget": "lots"})
    assert "has 2 items; there is no item 5" in refused(state, {"plan.steps[5].done": True})
    assert "has no key 'budgt'" in refused(state, {"contract.budgt": 1})
    assert apply_field_edits(state, {"contract.limit": 5}, add=True) == {
        "contract": {"budget": 1000, "limit": 5}}
    assert "malformed field path" in refused(state, {"plan..goal": 1})


def test_unknown_classes_cannot_be_edited() -> None:
    state = {"plan": UnknownObject("elsewhere.Plan", {"goal": "g"})}
    assert "not registered in this process" in refused(state, {"plan.goal": "x"})
    assert "not registered in this process" in refused(state, {"plan": {"goal": "x"}})


def test_pydantic_models_validate_with_their_own_rules() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Budget(pydantic.BaseModel):
        amount: int
        currency: str = "EUR"

    pitstop.register(Budget)
    state = {"budget": Budget(amount=5)}
    assert apply_field_edits(state, {"budget": {"amount": "7"}}) == {"budget": Budget(amount=7)}
    assert "at budget.amount" in refused(state, {"budget": {"amount": "many"}})
    assert apply_field_edits(state, {"budget.currency": "USD"})["budget"].currency == "USD"


def test_workflow_fork_from_python_refuses_a_misspelled_field(tmp_path: Any) -> None:
    """``wf.fork(update=...)`` goes through the same checks as ``pitstop fork --set`` (#30):
    a typo is refused naming the field and nothing is written; ``add=True`` adds it; values
    are converted to the field's type and paths reach inside."""
    wf = pitstop.Workflow("edits-fork")

    @wf.step(wait_for="go")
    def draft(state: dict[str, Any], go: Any) -> dict[str, Any]:
        return {"done": True}

    with pitstop.open_store(f"sqlite:///{tmp_path / 'f.db'}") as store:
        started = wf.start(store, {"title": "Q3 plan", "plan": Plan("ship", [Step("a")])},
                           run_id="src")
        runs_before = store.count_runs()
        with pytest.raises(FieldEditError, match="titel") as caught:
            wf.fork(store, started.checkpoint_id, update={"titel": "Q4"})
        assert caught.value.field == "titel"
        assert store.count_runs() == runs_before  # nothing was written
        forked = wf.fork(store, "src", update={"title": "Q4", "plan.steps[0].done": True},
                         run_id="edited")
        assert forked.state["title"] == "Q4"
        assert forked.state["plan"] == Plan("ship", [Step("a", done=True)])
        added = wf.fork(store, "src", update={"titel": "Q4"}, add=True, run_id="added")
        assert added.state["titel"] == "Q4"
