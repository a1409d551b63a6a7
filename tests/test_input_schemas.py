"""Input schemas (issue #30): ``@wf.step(wait_for=..., input_schema=T)`` with a pydantic model,
a TypedDict or a dataclass. A payload that does not fit is refused when it is sent, from
Python, the CLI and the inspector alike, naming the field; the step gets the payload as T;
the inspector's form starts from the schema and prefills nothing undeclared."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import pydantic
import pytest

import pitstop
from clitools import one_error_line, pitstop_exe


class ApprovalModel(pydantic.BaseModel):
    approved: bool
    reason: str = ""


class ApprovalDict(TypedDict):
    approved: bool
    reason: NotRequired[str]


@dataclasses.dataclass
class ApprovalData:
    approved: bool
    reason: str = ""


def _workflow(schema: Any) -> pitstop.Workflow:
    wf = pitstop.Workflow(f"schema-{schema.__name__}")

    @wf.step(wait_for="approval", input_schema=schema)
    def decide(state: dict[str, Any], approval: Any) -> dict[str, Any]:
        return {"kind": type(approval).__name__, "approved": bool(
            approval["approved"] if isinstance(approval, dict) else approval.approved)}

    return wf


@pytest.mark.parametrize("schema", [ApprovalModel, ApprovalDict, ApprovalData])
def test_python_send_checks_the_payload_and_the_step_gets_the_type(
    tmp_path: Path, schema: Any
) -> None:
    wf = _workflow(schema)
    with pitstop.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        wf.start(store, {}, run_id="r")
        for payload, field, says in (
            ({"aproved": True}, "approval.aproved", "is not a field of"),
            ({"approved": "yes"}, "approval.approved", "expected a boolean, got str 'yes'"),
            ({"reason": "ok"}, "approval.approved", "is required and missing"),
            (True, "approval", "expected an object"),
        ):
            with pytest.raises(pitstop.InputError, match=says) as refused:
                pitstop.send(store, "r", "approval", payload)
            assert refused.value.field == field and field in str(refused.value)
            assert store.inputs("r") == {}  # nothing was stored
        pitstop.send(store, "r", "approval", {"approved": True})
        done = wf.resume(store, "r")
        assert done.state == {"kind": "dict" if schema is ApprovalDict else schema.__name__,
                              "approved": True}


def test_a_payload_of_the_declared_class_is_taken_as_it_is(tmp_path: Path) -> None:
    wf = _workflow(ApprovalData)
    with pitstop.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        wf.start(store, {}, run_id="r")
        pitstop.send(store, "r", "approval", ApprovalData(approved=False, reason="late"))
        assert wf.resume(store, "r").state == {"kind": "ApprovalData", "approved": False}


def test_a_schema_must_be_a_model_typeddict_or_dataclass() -> None:
    wf = pitstop.Workflow("bad-schema")
    with pytest.raises(TypeError, match="pydantic model, a TypedDict or a dataclass"):
        wf.step(wait_for="go", input_schema=int)(lambda state, go: None)
    with pytest.raises(TypeError, match="waits for none"):
        wf.step(input_schema=ApprovalData)(lambda state: None)


FLOWS = '''
from typing import TypedDict
import pitstop


class Approval(TypedDict):
    approved: bool
    reason: str


wf = pitstop.Workflow("cli-schema")


@wf.step(wait_for="approval", input_schema=Approval)
def decide(state, approval):
    return {"approved": approval["approved"]}
'''


@pytest.mark.slow
def test_pitstop_send_refuses_a_wrong_payload_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(FLOWS)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert pitstop_exe("start", "flows:wf", "--run-id", "c", store=url, cwd=tmp_path).code == 0
    # the CLI checks without the workflow's code: the schema is recorded with the wait
    line = one_error_line(pitstop_exe("send", "c", "approval", '{"approved": 1, "reason": ""}',
                                      store=url))
    assert "field 'approval.approved' expected a boolean, got int 1" in line, line
    ok = pitstop_exe("send", "c", "approval", '{"approved": true, "reason": "fine"}', store=url)
    assert ok.code == 0, ok


def test_the_inspector_refuses_it_too_and_builds_its_form_from_the_schema(
    tmp_path: Path,
) -> None:
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    declared = _workflow(ApprovalModel)
    plain = pitstop.Workflow("no-schema")

    @plain.step(wait_for="go")
    def wait(state: dict[str, Any], go: Any) -> None:
        return None

    with pitstop.open_store(f"sqlite:///{tmp_path / 'u.db'}") as store:
        declared.start(store, {}, run_id="declared")
        plain.start(store, {}, run_id="undeclared")
        with TestClient(create_app(store)) as client:
            sent = client.post("/api/runs/declared/inputs",
                               json={"name": "approval", "payload": {"approved": "no"}})
            assert sent.status_code in (409, 422)
            assert "field 'approval.approved' expected a boolean" in sent.text, sent.text
            assert store.inputs("declared") == {}
            inbox = client.get("/inbox").text
    declared_form = inbox.split('data-run="declared"', 1)[1].split("</form>", 1)[0]
    assert "{&#34;approved&#34;: false, &#34;reason&#34;: &#34;&#34;}</textarea>" in \
        declared_form, declared_form
    assert "<code>approved</code> (boolean, required)" in declared_form
    assert ">approve</button>" in declared_form
    undeclared_form = inbox.split('data-run="undeclared"', 1)[1].split("</form>", 1)[0]
    assert "approved" not in undeclared_form  # nothing the workflow did not declare
    assert '></textarea>' in undeclared_form
