"""The inspector's JSON API and pages, in process (Starlette's TestClient) on a real store.

What each endpoint returns, its filters and pages, the status codes of its errors, the
actions and what they record, read-only mode, and the app mounted inside another app.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the ui extra is not installed")

from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.routing import Mount

import pitstop
from pitstop import RunStatus, Store
from pitstop.ui import create_app
from ui_workflows import approval, populate

JSON = {"content-type": "application/json"}


@pytest.fixture
def populated(tmp_path: Path) -> Iterator[tuple[Store, dict[str, str]]]:
    store = pitstop.open_store(f"sqlite:///{tmp_path / 'ui.db'}")
    ids = populate(store)
    yield store, ids
    store.close()


@pytest.fixture
def client(populated: tuple[Store, dict[str, str]]) -> Iterator[TestClient]:
    with TestClient(create_app(populated[0])) as c:
        yield c


def _ids(page: dict[str, Any]) -> list[str]:
    return [r["id"] for r in page["runs"]]


# -- reading ---------------------------------------------------------------------------------------


def test_runs_list_counts_and_filters(client: TestClient) -> None:
    page = client.get("/api/runs").json()
    assert page["counts"] == {"queued": 2, "running": 2, "waiting": 5, "completed": 3,
                              "failed": 1, "cancelled": 0}
    assert page["total"] == 13 and page["next"] is None
    waiting = client.get("/api/runs", params={"status": "waiting"}).json()
    assert {r["status"] for r in waiting["runs"]} == {"waiting"} and waiting["total"] == 5
    # counts keep the other filters but not the status one: the tabs say what each shows
    assert waiting["counts"]["completed"] == 3
    both = client.get("/api/runs", params=[("status", "failed"), ("status", "queued")]).json()
    assert both["total"] == 3
    assert _ids(client.get("/api/runs", params={"workflow": "nightly-etl"}).json())[-1] == \
        "etl-2026-11-30"
    assert _ids(client.get("/api/runs", params={"id": "inv-101"}).json()) == [
        "inv-1012-soylent", "inv-1011-hooli", "inv-1010-acme"]
    assert _ids(client.get("/api/runs", params={"meta": "thread_id=support-chat-42"}).json()) \
        == ["support-chat-42"]
    assert client.get("/api/runs", params={"since": "1h"}).json()["total"] == 13
    assert client.get("/api/runs", params={"since": "2999-01-01"}).json()["total"] == 0
    failed = client.get("/api/runs", params={"status": "failed"}).json()["runs"][0]
    assert failed["error"]["type"] == "ValueError" and failed["error"]["step"] == "transform"
    row = client.get("/api/runs", params={"id": "inv-1010"}).json()["runs"][0]
    assert row["waiting_for"] == ["approval"] and row["waiting_since"] is not None
    assert row["next_step"] == "decide"
    owned = client.get("/api/runs", params={"id": "etl-2026-12-03"}).json()["runs"][0]
    assert owned["owner"] == "worker-7@batch-2:41822" and owned["lease_expires_at"]


@pytest.mark.parametrize(("params", "message"), [
    ({"status": "bogus"}, "status"),
    ({"since": "yesterday-ish"}, "since"),
    ({"meta": "no-equals-sign"}, "key=value"),
    ({"meta": "n=99999999999999999999999"}, "64 bits"),
    ({"limit": "0"}, "limit"),
])
def test_bad_filters_are_422_with_a_message(client: TestClient, params: dict[str, str],
                                            message: str) -> None:
    response = client.get("/api/runs", params=params)
    assert response.status_code == 422
    body = response.json()
    assert body["status"] == 422 and message in body["message"]


def test_a_damaged_run_row_is_named_and_the_others_still_listed(
    populated: tuple[Store, dict[str, str]], client: TestClient, tmp_path: Path
) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "ui.db") as conn:
        conn.execute("UPDATE pitstop_runs SET metadata = 'not json' "
                     "WHERE run_id = 'inv-1010-acme'")
    page = client.get("/api/runs").json()
    assert "inv-1010-acme" not in _ids(page) and len(page["runs"]) == 12
    assert [d["id"] for d in page["damaged"]] == ["inv-1010-acme"]
    assert "not JSON" in page["damaged"][0]["message"]
    assert client.get("/api/runs", params={"id": "inv-1011"}).json()["damaged"] == []


def test_keyset_pages_cover_every_run_once(client: TestClient) -> None:
    seen: list[str] = []
    before = None
    while True:
        params: dict[str, Any] = {"limit": 4}
        if before:
            params["before"] = before
        page = client.get("/api/runs", params=params).json()
        seen.extend(_ids(page))
        before = page["next"]
        if before is None:
            break
    assert len(seen) == len(set(seen)) == 13
    assert seen == _ids(client.get("/api/runs").json())


def test_run_detail_and_failure_traceback(client: TestClient) -> None:
    failed = client.get("/api/runs/etl-2026-11-30").json()
    assert failed["status"] == "failed"
    assert "Traceback (most recent call last)" in failed["error"]["traceback"]
    assert "column 'amount'" in failed["error"]["message"]
    branched = client.get("/api/runs/inv-1003-umbrella").json()
    assert branched["status"] == "waiting" and "forks" not in branched
    forks = client.get("/api/runs/inv-1003-umbrella/forks").json()["runs"]
    assert [f["id"] for f in forks] == ["inv-1003-umbrella-fix"]
    assert client.get("/api/runs/nope/forks").status_code == 404
    assert client.get("/api/runs/inv-1003-umbrella-fix").json()["forked_from"] == \
        "inv-1003-umbrella"
    missing = client.get("/api/runs/no-such-run")
    assert missing.status_code == 404 and "no-such-run" in missing.json()["message"]


def test_a_family_shows_its_parent_link_children_and_filter(tmp_path: Path) -> None:
    """``parent_run`` on every run row (as ``pitstop runs --json`` and archives carry it), the
    parent's step and checkpoint and the children counted and listed on the run's detail
    and page, and ``?parent=`` on the list (as ``pitstop runs --parent``)."""
    double = pitstop.Workflow("ui-double")

    @double.step
    def times_two(state: dict[str, Any]) -> dict[str, Any]:
        return {"y": state["x"] * 2}

    ask = pitstop.Workflow("ui-ask")

    @ask.step(wait_for="ok")
    def decide(state: dict[str, Any], ok: Any) -> dict[str, Any]:
        return {"ok": ok}

    fan = pitstop.Workflow("ui-fan")

    @fan.step
    def start_them(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        ctx.run_children([(double, {"x": i}) for i in range(24)] + [(ask, {})])
        return {}

    with pitstop.open_store(f"sqlite:///{tmp_path / 'family.db'}") as store:
        assert fan.start(store, {}, run_id="fam").status is RunStatus.WAITING
        double.start(store, {"x": 1}, run_id="loner")
        with TestClient(create_app(store)) as c:
            parent = c.get("/api/runs/fam").json()
            assert parent["parent_run"] is None and parent["parent"] is None
            assert parent["children"]["total"] == 25
            assert parent["children"]["counts"] == {"waiting": 1, "completed": 24}
            first = parent["children"]["first"]
            assert len(first) == 20 and first[0] == {
                "id": "fam.0-0", "status": "completed", "workflow": "ui-double",
                "waiting_for": []}
            child = c.get("/api/runs/fam.0-24").json()
            assert child["parent_run"] == "fam"
            assert child["parent"]["run_id"] == "fam"
            assert child["parent"]["step"] == "start_them"
            assert child["parent"]["checkpoint_id"] == store.history("fam")[-1].id
            assert child["waiting_for"] == ["ok"] and child["children"]["total"] == 0
            rows = {r["id"]: r for r in c.get("/api/runs", params={"limit": 100}).json()["runs"]}
            assert rows["fam.0-3"]["parent_run"] == "fam" and rows["loner"]["parent_run"] is None
            kids = c.get("/api/runs", params={"parent": "fam", "limit": 100}).json()
            assert kids["total"] == 25 and {r["id"] for r in kids["runs"]} == {
                f"fam.0-{i}" for i in range(25)}
            assert kids["counts"]["waiting"] == 1
            waiting = c.get("/api/runs", params={"parent": "fam", "status": "waiting"}).json()
            assert [r["id"] for r in waiting["runs"]] == ["fam.0-24"]
            assert c.get("/api/runs", params={"parent": "nobody"}).json()["total"] == 0

            page = c.get("/runs/fam").text
            assert 'href="/runs/fam.0-19"' in page and 'href="/runs/fam.0-20"' not in page
            assert 'href="/?parent=fam"' in page and "24 completed" in page
            assert 'href="/runs/fam"' in c.get("/runs/fam.0-24").text
            listed = c.get("/", params={"parent": "fam"}).text
            assert "children of" in listed and "loner" not in listed


def test_history_is_a_tree_with_branch_points_and_pages(client: TestClient) -> None:
    tree = client.get("/api/runs/inv-1003-umbrella/history").json()
    entries = tree["checkpoints"]
    assert len(entries) == 12 and tree["next"] is None
    assert entries[0]["head"] and entries[0]["id"] == tree["head_id"]
    assert sum(e["branch_point"] for e in entries) == 2
    assert len({e["lane"] for e in entries}) >= 2
    assert any(e["milestone"] and e["tags"] == ["review"] for e in entries)
    assert any(e["resumed_from"] for e in entries)
    first = client.get("/api/runs/inv-1003-umbrella/history", params={"limit": 5}).json()
    rest = client.get("/api/runs/inv-1003-umbrella/history",
                      params={"before": first["next"], "limit": 100}).json()
    assert [e["id"] for e in first["checkpoints"] + rest["checkpoints"]] == \
        [e["id"] for e in entries]
    fork = client.get("/api/runs/inv-1003-umbrella-fix/history").json()["checkpoints"]
    assert fork[-1]["forked_from"]["run_id"] == "inv-1003-umbrella"


def test_checkpoint_state_metadata_inputs_effects_and_paths(
    client: TestClient, populated: tuple[Store, dict[str, str]]
) -> None:
    store, _ = populated
    head = store.get_run("inv-1001-globex").head_id
    detail = client.get(f"/api/checkpoints/{head}").json()
    assert detail["state"]["vendor"] == "Globex" and detail["state"]["paid"] is True
    assert detail["state"]["invoice"]["$type"] == "ui_workflows.Invoice"
    assert detail["checkpoint"]["head"] and detail["checkpoint"]["status"] == "completed"
    consumed = [c for c in store.history("inv-1001-globex", limit=None)
                if c.metadata.get("inputs")]
    got = client.get(f"/api/checkpoints/{consumed[0].id}").json()
    assert got["inputs"][0]["name"] == "approval"
    assert got["inputs"][0]["payload"] == {"approved": True, "by": "maria"}
    value = client.get(f"/api/checkpoints/{head}", params={"path": "invoice.lines[0].item"})
    assert value.json() == {"checkpoint_id": head, "path": "invoice.lines[0].item",
                            "value": "consulting"}
    assert client.get(f"/api/checkpoints/{head}", params={"path": "nope"}).status_code == 422
    assert client.get("/api/checkpoints/no-such-checkpoint").status_code == 404


def test_effects_recorded_by_the_step_show_on_its_checkpoint(tmp_path: Path) -> None:
    store = pitstop.open_store(f"sqlite:///{tmp_path / 'fx.db'}")
    wf = pitstop.Workflow("mailer")

    @wf.step
    def mail(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"receipt": ctx.effect("email", lambda: "queued-7")}

    wf.start(store, {"to": "ops"}, run_id="m1")
    head = store.get_run("m1").head_id
    with TestClient(create_app(store)) as c:
        effects = c.get(f"/api/checkpoints/{head}").json()["effects"]
    # keyed as the runtime keys them: run, branch, position, step, name
    assert list(effects.values()) == ["queued-7"]
    assert next(iter(effects)).endswith(":mail:email")
    store.close()


def test_diff_against_parent_or_any_checkpoint_with_text_diffs(
    client: TestClient, populated: tuple[Store, dict[str, str]]
) -> None:
    store, _ = populated
    chain = list(reversed(store.history("inv-1010-acme", limit=None)))
    extract, review = chain[1], chain[2]
    diff = client.get(f"/api/checkpoints/{review.id}/diff").json()
    assert diff["a"]["id"] == extract.id and diff["b"]["id"] == review.id
    risk = next(c for c in diff["changes"] if c["path"] == "risk")
    assert risk["op"] == "changed" and risk["old"] == "unknown" and risk["new"] == "high"
    assert {"op": "delete", "text": "unknown"} in risk["text"]
    assert {"op": "insert", "text": "high"} in risk["text"]
    other = client.get(f"/api/checkpoints/{review.id}/diff",
                       params={"against": chain[0].id}).json()
    assert {c["path"] for c in other["changes"]} >= {"risk", "summary"}
    fork_head = store.get_run("inv-1003-umbrella-fix").head_id
    across = client.get(f"/api/checkpoints/{fork_head}/diff",
                        params={"against": review.id}).json()
    assert any(c["path"] == "amount" for c in across["changes"])
    assert client.get(f"/api/checkpoints/{chain[0].id}/diff").status_code == 422


def test_langgraph_thread_channels_decoded_without_importing(client: TestClient,
                                                             populated: tuple[Store, Any]) -> None:
    store, ids = populated
    run = client.get(f"/api/runs/{ids['thread']}").json()
    assert run["langgraph"]
    detail = client.get(f"/api/checkpoints/{run['head_id']}").json()
    assert detail["langgraph"] and detail["state"]["topic"] == "invoices"
    roles = [t["role"] for t in detail["conversation"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert detail["conversation"][1]["tool_calls"] == ['invoice_status({"number": "INV-2026010"})']
    assert detail["state"]["messages"][0]["$type"].endswith("HumanMessage")
    head = store.get(run["head_id"])
    fork = client.post(f"/api/checkpoints/{head.id}/fork", json={"updates": {}})
    assert fork.status_code == 409


def _interrupted_thread(store: Store, thread_id: str) -> str:
    """A real LangGraph graph stopped by ``interrupt_before``: its next node is due."""
    import operator
    from typing import Annotated, TypedDict

    from langgraph.graph import END, START, StateGraph

    from pitstop.integrations.langgraph import PitstopSaver

    steps = TypedDict("steps", {"done": Annotated[list[str], operator.add]})  # noqa: UP013
    graph = StateGraph(steps)
    graph.add_node("draft", lambda s: {"done": ["draft"]})
    graph.add_node("send", lambda s: {"done": ["send"]})
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "send")
    graph.add_edge("send", END)
    app = graph.compile(checkpointer=PitstopSaver(store), interrupt_before=["send"])
    config = {"configurable": {"thread_id": thread_id}}
    app.invoke({"done": []}, config)
    assert app.get_state(config).next == ("send",)  # type: ignore[arg-type]
    return thread_id


def test_a_finished_langgraph_thread_reads_as_idle(client: TestClient,
                                                   populated: tuple[Store, Any]) -> None:
    # LangGraph savers write no status when a graph ends: the thread stays "running". The
    # run page tells a finished graph (no node due) from one that still has work.
    store, ids = populated
    paused = _interrupted_thread(store, "paused-before-send")
    finished = client.get(f"/api/runs/{ids['thread']}").json()
    assert finished["status"] == "running" and finished["idle"] is True
    assert client.get(f"/api/runs/{paused}").json()["idle"] is False
    assert not client.get(f"/api/runs/{ids['owned']}").json()["idle"]  # not a thread
    page = client.get(f"/runs/{ids['thread']}").text
    assert 'class="status s-idle"' in page
    assert 'class="status s-idle"' not in client.get(f"/runs/{paused}").text


def test_runs_list_shows_idle_only_from_what_the_saver_recorded(
        client: TestClient, populated: tuple[Store, Any]) -> None:
    # A listing never opens states: a thread is idle there only if its head's metadata
    # records LangGraph's next nodes as none.
    store, ids = populated
    lg = {"checkpoint": {"channel_versions": {}, "versions_seen": {}}}
    store.save("done-thread", {"messages": b""}, workflow="langgraph",
               metadata={"langgraph": {**lg, "next": []}})
    store.save("busy-thread", {"messages": b""}, workflow="langgraph",
               metadata={"langgraph": {**lg, "next": ["agent"]}})
    rows = {r["id"]: r for r in client.get("/api/runs", params={"limit": 100}).json()["runs"]}
    assert rows["done-thread"]["idle"] is True
    assert rows["busy-thread"]["idle"] is False
    # PitstopSaver records LangGraph's next nodes with every checkpoint: a finished graph
    # lists as idle, one stopped before a node does not.
    paused = _interrupted_thread(store, "paused-in-list")
    rows = {r["id"]: r for r in client.get("/api/runs", params={"limit": 100}).json()["runs"]}
    assert rows[ids["thread"]]["idle"] is True and rows[paused]["idle"] is False
    assert store.get_run(ids["thread"]) is not None
    assert store.summary(store.get_run(ids["thread"]).head_id).metadata["langgraph"][
        "next"] == []
    assert store.summary(store.get_run(paused).head_id).metadata["langgraph"]["next"] == [
        "send"]
    assert rows["done-thread"]["status"] == "running"  # the store's status, unchanged
    html = client.get("/", params={"id": "done-thread"}).text
    assert 'class="status s-idle"' in html


def test_inbox_is_oldest_first_and_shows_the_declared_fields(client: TestClient) -> None:
    inbox = client.get("/api/inbox").json()
    ids = [r["id"] for r in inbox["runs"]]
    assert ids[:2] == ["inv-1003-umbrella", "inv-1003-umbrella-fix"]
    assert ids[2:] == ["inv-1010-acme", "inv-1011-hooli", "inv-1012-soylent"]
    acme = inbox["runs"][2]
    assert acme["asks"] == ["approval"]
    assert acme["shown_fields"] == ["vendor", "amount", "risk", "summary"]
    assert set(acme["shown"]) == {"vendor", "amount", "risk", "summary"}


# -- actions ---------------------------------------------------------------------------------------


def test_send_input_records_who_and_when(client: TestClient,
                                         populated: tuple[Store, Any]) -> None:
    store, _ = populated
    sent = client.post("/api/runs/inv-1011-hooli/inputs",
                       json={"name": "approval", "payload": {"approved": True}})
    assert sent.status_code == 201, sent.text
    body = sent.json()
    assert body["ready"] and not body["resumed"] and "worker" in body["message"]
    assert store.inputs("inv-1011-hooli")["approval"].payload == {"approved": True}
    record = store.get_run("inv-1011-hooli").metadata["ui_actions"][-1]
    assert record["action"] == "input" and record["name"] == "approval"
    assert record["by"] == "local" and record["at"]
    again = client.post("/api/runs/inv-1011-hooli/inputs",
                        json={"name": "approval", "payload": {"approved": False}})
    assert again.status_code == 409 and "not consumed" in again.json()["message"]
    assert store.inputs("inv-1011-hooli")["approval"].payload == {"approved": True}


@pytest.mark.parametrize(("run_id", "body", "status", "text"), [
    ("no-such-run", {"name": "approval", "payload": 1}, 404, "no-such-run"),
    ("inv-1001-globex", {"name": "approval", "payload": 1}, 409, "completed"),
    ("inv-1012-soylent", {"name": "other", "payload": 1}, 409, "not waiting for 'other'"),
    ("etl-2026-12-01", {"name": "approval", "payload": 1}, 409, "queued"),
    ("inv-1012-soylent", {"name": "approval"}, 422, "payload"),
    ("inv-1012-soylent", {"payload": 1}, 422, "name"),
    ("inv-1012-soylent", {"name": "", "payload": 1}, 422, "name"),
])
def test_send_refusals(client: TestClient, populated: tuple[Store, Any], run_id: str,
                       body: dict[str, Any], status: int, text: str) -> None:
    store, _ = populated
    response = client.post(f"/api/runs/{run_id}/inputs", json=body)
    assert response.status_code == status, response.text
    assert text in response.json()["message"]
    assert store.inputs("inv-1012-soylent") == {}


def test_send_malformed_json_is_422(client: TestClient) -> None:
    response = client.post("/api/runs/inv-1012-soylent/inputs", content=b"{not json",
                           headers=JSON)
    assert response.status_code == 422
    assert response.json()["status"] == 422


def test_cancel(client: TestClient, populated: tuple[Store, Any]) -> None:
    store, _ = populated
    done = client.post("/api/runs/etl-2026-12-01/cancel", headers=JSON)
    assert done.status_code == 200 and done.json()["previous"] == "queued"
    assert store.get_run("etl-2026-12-01").status is RunStatus.CANCELLED
    assert store.get_run("etl-2026-12-01").metadata["ui_actions"][-1]["action"] == "cancel"
    assert client.post("/api/runs/etl-2026-12-01/cancel", headers=JSON).status_code == 200
    assert client.post("/api/runs/inv-1001-globex/cancel", headers=JSON).status_code == 409
    assert client.post("/api/runs/nope/cancel", headers=JSON).status_code == 404
    # a live owner loses its lease
    owned = client.post("/api/runs/etl-2026-12-03/cancel", headers=JSON)
    assert owned.status_code == 200 and store.get_run("etl-2026-12-03").owner is None


def test_fork_with_edits(client: TestClient, populated: tuple[Store, Any]) -> None:
    store, _ = populated
    source = store.history("inv-1010-acme", limit=None)[0]
    made = client.post(f"/api/checkpoints/{source.id}/fork",
                       json={"updates": {"amount": 99}, "run_id": "acme-retry"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["run_id"] == "acme-retry" and body["fields"] == ["amount"]
    assert body["status"] == "queued" and "worker" in body["message"]
    assert made.headers["location"].endswith("/api/runs/acme-retry")
    head = store.latest("acme-retry")
    assert head is not None and head.state["amount"] == 99
    assert head.state["vendor"] == "Acme Corp"
    assert head.metadata["forked_by"] == "local"
    assert store.get_run("acme-retry").metadata["ui_actions"][-1]["action"] == "fork"
    assert store.latest("inv-1010-acme").state["amount"] == 12_500  # the source is untouched
    exists = client.post(f"/api/checkpoints/{source.id}/fork", json={"run_id": "acme-retry"})
    assert exists.status_code == 409
    typo = client.post(f"/api/checkpoints/{source.id}/fork", json={"updates": {"amuont": 1}})
    assert typo.status_code == 422 and "amuont" in typo.json()["message"]
    added = client.post(f"/api/checkpoints/{source.id}/fork",
                        json={"updates": {"priority": "high"}, "add": True})
    assert added.status_code == 201
    assert client.post("/api/checkpoints/nope/fork", json={}).status_code == 404
    # the rules of `pitstop fork --set`: typed, paths inside fields, wrong types refused
    typed = client.post(f"/api/checkpoints/{source.id}/fork",
                        json={"updates": {"invoice.number": "INV-9", "tags": ["a", "b"]}})
    assert typed.status_code == 201, typed.text
    forked = store.latest(typed.json()["run_id"])
    assert forked is not None and type(forked.state["invoice"]).__name__ == "Invoice"
    assert forked.state["invoice"].number == "INV-9" and forked.state["tags"] == ("a", "b")
    wrong = client.post(f"/api/checkpoints/{source.id}/fork",
                        json={"updates": {"amount": {"not": "a number"}}})
    assert wrong.status_code == 422 and "amount" in wrong.json()["message"]


def test_resume_needs_the_workflow(client: TestClient, populated: tuple[Store, Any]) -> None:
    refused = client.post("/api/runs/etl-2026-11-30/resume", headers=JSON)
    assert refused.status_code == 409 and "worker" in refused.json()["message"]
    assert client.post("/api/runs/inv-1001-globex/resume", headers=JSON).status_code == 409


def _wait_for(store: Store, run_id: str, status: RunStatus, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while store.get_run(run_id).status is not status:
        assert time.monotonic() < deadline, store.get_run(run_id)
        time.sleep(0.05)


@pytest.mark.slow
def test_with_the_workflow_an_approval_resumes_the_run_here(
    populated: tuple[Store, Any]
) -> None:
    store, _ = populated
    with TestClient(create_app(store, workflows=[approval])) as c:
        sent = c.post("/api/runs/inv-1012-soylent/inputs",
                      json={"name": "approval", "payload": {"approved": True}}).json()
        assert sent["resumed"] and "resuming" in sent["message"]
        _wait_for(store, "inv-1012-soylent", RunStatus.COMPLETED)
        assert store.latest("inv-1012-soylent").state["paid"] is True
        assert store.get_run("inv-1012-soylent").owner is None
        # a fork of an approval run starts running here
        review = store.history("inv-1011-hooli", limit=None)[-3]
        fork = c.post(f"/api/checkpoints/{review.id}/fork",
                      json={"updates": {"amount": 5}}).json()
        assert fork["resumed"] and fork["status"] == "running"
        _wait_for(store, fork["run_id"], RunStatus.WAITING)
        # a failed run of a workflow it does not have still needs a worker
        assert c.post("/api/runs/etl-2026-11-30/resume", headers=JSON).status_code == 409


@pytest.mark.slow
def test_with_the_workflow_runs_sent_an_input_elsewhere_resume_here(
    populated: tuple[Store, Any], tmp_path: Path
) -> None:
    """docs/ui.md: with --workflow, runs resume in the server once their inputs arrive, also
    when the input came from `pitstop send` in another process (#30: they stayed waiting)."""
    from clitools import pitstop_exe

    store, _ = populated
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    with TestClient(create_app(store, workflows=[approval], poll_interval=0.2)) as c:
        assert c.get("/api/runs").status_code == 200
        sent = pitstop_exe("send", "inv-1012-soylent", "approval", '{"approved": true}',
                           store=url)
        assert sent.code == 0, sent
        _wait_for(store, "inv-1012-soylent", RunStatus.COMPLETED)
        assert store.latest("inv-1012-soylent").state["paid"] is True
        assert store.get_run("inv-1012-soylent").owner is None
        inbox = c.get("/inbox").text
        assert "inv-1012-soylent" not in inbox
    # a read-only inspector runs nothing, nor does one without the workflow
    pending = [r.id for r in store.runs(status="waiting", workflow="invoice-approval")]
    assert pending, "the populated store has another waiting approval"
    run_id = pending[0]
    with TestClient(create_app(store, workflows=[approval], read_only=True)) as c:
        assert pitstop_exe("send", run_id, "approval", '{"approved": true}', store=url).code == 0
        c.get("/api/runs")
        time.sleep(1.0)
        assert store.get_run(run_id).status is RunStatus.WAITING


def test_read_only_refuses_every_action(populated: tuple[Store, Any]) -> None:
    store, _ = populated
    with TestClient(create_app(store, read_only=True)) as c:
        assert c.get("/api/runs").status_code == 200
        calls = [
            ("/api/runs/inv-1012-soylent/inputs", {"name": "approval", "payload": True}),
            ("/api/runs/inv-1012-soylent/cancel", None),
            ("/api/runs/inv-1012-soylent/resume", None),
            (f"/api/checkpoints/{store.get_run('inv-1012-soylent').head_id}/fork", {}),
        ]
        for path, body in calls:
            response = c.post(path, json=body) if body is not None else c.post(path,
                                                                                headers=JSON)
            assert response.status_code == 403, path
            assert "read-only" in response.json()["message"]
        assert store.inputs("inv-1012-soylent") == {}
        assert store.get_run("inv-1012-soylent").status is RunStatus.WAITING
        page = c.get("/runs/inv-1012-soylent").text
        assert "data-action" not in page and "read-only" in page


# -- pages and the document ------------------------------------------------------------------------


def test_pages_render(client: TestClient, populated: tuple[Store, Any]) -> None:
    store, ids = populated
    for path in ("/", "/?status=waiting", "/inbox", f"/runs/{ids['branched']}",
                 f"/runs/{ids['failed']}", f"/runs/{ids['thread']}", "/?fragment=1",
                 "/inbox?fragment=1", f"/runs/{ids['branched']}?fragment=head",
                 f"/runs/{ids['branched']}?fragment=tree"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:400])
        assert response.headers["content-type"].startswith("text/html")
    other = store.history(ids["completed"], limit=1)[0].id
    wrong = client.get(f"/runs/{ids['branched']}", params={"checkpoint": other})
    assert wrong.status_code == 422
    assert client.get("/runs/no-such-run").status_code == 404
    assert client.get("/?since=garbage").status_code == 422


def test_openapi_document_lists_the_api(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    for path, method in [("/api/runs", "get"), ("/api/runs/{run_id}", "get"),
                         ("/api/runs/{run_id}/history", "get"),
                         ("/api/checkpoints/{checkpoint_id}", "get"),
                         ("/api/runs/{run_id}/inputs", "post"),
                         ("/api/runs/{run_id}/cancel", "post"),
                         ("/api/checkpoints/{checkpoint_id}/fork", "post")]:
        assert method in paths[path], path
    assert "404" in paths["/api/runs/{run_id}"]["get"]["responses"]
    assert {"404", "409", "422"} <= set(paths["/api/runs/{run_id}/inputs"]["post"]["responses"])
    assert not any(p.startswith("/runs") or p == "/" for p in paths)  # pages are not API


def test_mounted_inside_another_app(populated: tuple[Store, Any]) -> None:
    store, ids = populated
    host = Starlette(routes=[Mount("/inspector", app=create_app(store))])
    with TestClient(host) as c:
        page = c.get("/inspector/")
        assert page.status_code == 200
        assert 'href="/inspector/static/app.css"' in page.text
        assert 'href="/inspector/runs/inv-1010-acme"' in page.text
        assert c.get("/inspector/static/app.js").status_code == 200
        assert c.get("/inspector/api/runs").json()["total"] == 13
        run = c.get(f"/inspector/runs/{ids['branched']}")
        assert run.status_code == 200 and 'data-src="?' in run.text


def test_server_timing_header(client: TestClient) -> None:
    response = client.get("/api/runs")
    assert response.headers["server-timing"].startswith("app;dur=")


def test_workflow_option_is_importable_for_the_cli() -> None:
    assert approval.name == "invoice-approval"


@pytest.mark.postgres
def test_live_updates_wake_on_postgres_notify(tmp_path: Path) -> None:
    """On PostgreSQL the stream is woken by the store's LISTEN/NOTIFY, not by polling: with
    a poll interval of a minute, a delivered input still shows within seconds."""
    import threading
    import uuid

    from conftest import drop_pg_schema, pg_schema_url

    schema = f"ui_{uuid.uuid4().hex[:10]}"
    try:
        store = pitstop.open_store(pg_schema_url(schema))
    except pitstop.StoreError as exc:
        pytest.skip(f"PostgreSQL is not available: {exc}")
    try:
        approval.start(store, {"vendor": "PG", "amount": 1, "invoice": None}, run_id="pg-1")
        app = create_app(store, poll_interval=60)
        with TestClient(app) as c, c.stream("GET", "/events?view=run&run=pg-1") as events:
            lines = events.iter_lines()
            assert next(lines).startswith("retry:")
            assert next(lines) == "event: ready"
            timer = threading.Timer(0.5, pitstop.send, (store, "pg-1", "approval",
                                                   {"approved": True}))
            timer.start()
            started = time.monotonic()
            for line in lines:
                if line == "event: changed":
                    break
            assert time.monotonic() - started < 20
            timer.join()
    finally:
        store.close()
        drop_pg_schema(schema)


def test_run_ids_with_a_slash_are_reachable(tmp_path: Path) -> None:
    # Stream partitions are runs "JOB/0", "JOB/1": links quote the "/" as %2F, which the
    # server decodes before routing.
    store = pitstop.open_store(f"sqlite:///{tmp_path / 'slash.db'}")
    store.save("clicks/0", {"n": 1})
    store.save("clicks/0/forks", {"n": 2})
    try:
        with TestClient(create_app(store)) as http:
            assert http.get("/api/runs/clicks%2F0").json()["id"] == "clicks/0"
            assert http.get("/api/runs/clicks/0").json()["id"] == "clicks/0"
            assert http.get("/api/runs/clicks%2F0/history").json()["run_id"] == "clicks/0"
            assert http.get("/api/runs/clicks%2F0/forks").json() == {"runs": []}
            assert http.post("/api/runs/clicks%2F0/cancel", headers=JSON).json()[
                "run_id"] == "clicks/0"
            page = http.get("/runs/clicks%2F0")
            assert page.status_code == 200 and "clicks/0" in page.text
            assert http.get("/api/runs/nope%2F1").status_code == 404
    finally:
        store.close()


def test_the_run_tree_names_the_step_a_waiting_checkpoint_stopped_in(tmp_path: Path) -> None:
    """As `pitstop history` does: the checkpoint a run waits at is listed under the step it
    waits in, not the step that ran before it."""
    wf = pitstop.Workflow("label")

    @wf.step
    def review(state: dict[str, Any]) -> dict[str, Any]:
        return {"reviewed": True}

    @wf.step(wait_for="decision")
    def approve(state: dict[str, Any], decision: Any) -> dict[str, Any]:
        return {"approved": decision}

    with pitstop.open_store(f"sqlite:///{tmp_path / 'label.db'}") as store:
        run = wf.start(store, {}, run_id="label-1")
        assert run.status is pitstop.RunStatus.WAITING
        with TestClient(create_app(store)) as c:
            page = c.get("/runs/label-1")
        assert page.status_code == 200
        assert '<td class="name">approve</td>' in page.text
        assert '<td class="name">review</td>' not in page.text
