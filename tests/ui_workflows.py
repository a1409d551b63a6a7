"""Workflows and a populated store for the inspector's tests, its screenshots and bench/ui.py.

Importable by subprocesses (``pitstop ui --workflow ui_workflows:approval`` with ``tests/`` on
the path). :func:`populate` writes what a real store holds after a day of work: approvals
waiting for a person, completed runs, a run with branches and a fork, a failed run with its
traceback, queued runs, one owned by a live worker, a LangGraph thread, and a run whose state
is hostile markup (the XSS tests look for it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import pitstop
from pitstop import Store

XSS_RUN = "xss-<img src=x onerror=alert(1)>"
XSS_STATE = {
    "html": "<script>window.__pitstop_xss = 1</script>",
    "link": "javascript:window.__pitstop_xss = 2",
    "img": '<img src=x onerror="window.__pitstop_xss = 3">',
    "quote": "\"'><svg onload=window.__pitstop_xss=4>",
}


@pitstop.register(name="ui_workflows.Invoice")
@dataclass
class Invoice:
    number: str
    lines: list[dict[str, Any]]
    currency: str = "EUR"


approval = pitstop.Workflow("invoice-approval")


@approval.step
def extract(state: dict[str, Any]) -> dict[str, Any]:
    return {"risk": "unknown", "summary": f"Invoice from {state['vendor']} for "
                                          f"{state['amount']} EUR, net 30."}


@approval.step(milestone=True)
def review(state: dict[str, Any]) -> dict[str, Any]:
    return {"risk": "high" if state["amount"] > 10_000 else "low"}


class Approval(TypedDict):
    approved: bool
    reason: NotRequired[str]
    by: NotRequired[str]


@approval.step(wait_for="approval", show=("vendor", "amount", "risk", "summary"),
               input_schema=Approval)
def decide(state: dict[str, Any], approval: dict[str, Any]) -> Any:
    if not approval.get("approved"):
        return pitstop.finish({"decision": "rejected", "reason": approval.get("reason", "")})
    return {"decision": "approved"}


@approval.step
def pay(state: dict[str, Any]) -> dict[str, Any]:
    return {"paid": True}


etl = pitstop.Workflow("nightly-etl")


@etl.step
def load(state: dict[str, Any]) -> dict[str, Any]:
    return {"rows": 1204, "columns": ["date", "vendor", "amount"]}


@etl.step
def transform(state: dict[str, Any]) -> dict[str, Any]:
    raise ValueError("column 'amount' has 3 values that are not numbers: 'n/a', '-', '12,5'")


def _invoice(n: int, vendor: str, amount: int) -> dict[str, Any]:
    return {
        "vendor": vendor,
        "amount": amount,
        "invoice": Invoice(f"INV-{2026_000 + n}", [
            {"item": "consulting", "hours": 12, "rate": 150},
            {"item": "travel", "cost": amount - 1800},
        ]),
        "submitted_by": "ap-bot",
        "tags": ("q4", "emea"),
    }


def populate(store: Store, *, langgraph: bool = True, hostile: bool = True) -> dict[str, str]:
    """Write the day's runs; returns the ids the tests look for by role.

    ``hostile=False`` leaves out the run whose id, names and state are markup (the XSS
    tests' run): the docs' screenshots show a day's work, not a test fixture.
    """
    ids: dict[str, str] = {}
    # Completed and rejected approvals.
    done = approval.start(store, _invoice(1, "Globex", 4200), run_id="inv-1001-globex")
    pitstop.send(store, done.run_id, "approval", {"approved": True, "by": "maria"})
    approval.resume(store, done.run_id)
    rejected = approval.start(store, _invoice(2, "Initech", 18_900), run_id="inv-1002-initech")
    pitstop.send(store, rejected.run_id, "approval", {"approved": False, "reason": "duplicate"})
    approval.resume(store, rejected.run_id)
    ids["completed"] = done.run_id
    # A run with branches: finished, then resumed twice from earlier checkpoints.
    branched = approval.start(store, _invoice(3, "Umbrella", 7300), run_id="inv-1003-umbrella")
    pitstop.send(store, branched.run_id, "approval", {"approved": True})
    approval.resume(store, branched.run_id)
    history = store.history(branched.run_id, limit=None)
    by_step = {h.metadata.get("step_name"): h.id for h in reversed(history)}
    approval.resume(store, branched.run_id, from_checkpoint=by_step["review"])
    pitstop.send(store, branched.run_id, "approval", {"approved": False, "reason": "re-check"})
    approval.resume(store, branched.run_id)
    approval.resume(store, branched.run_id, from_checkpoint=by_step["extract"])
    ids["branched"] = branched.run_id
    # A fork of it with an edited amount.
    forked = approval.fork(store, by_step["review"], update={"amount": 6900},
                           run_id="inv-1003-umbrella-fix")
    ids["fork"] = forked.run_id
    # Failed.
    failed = etl.start(store, {"date": "2026-11-30"}, run_id="etl-2026-11-30")
    ids["failed"] = failed.run_id
    # One run claimed by a live worker (running, under its lease), two queued behind it.
    busy = etl.enqueue(store, {"date": "2026-12-03"}, run_id="etl-2026-12-03")
    [lease] = store.claim("worker-7@batch-2:41822", workflows=[etl.name], ttl=3600)
    assert lease.run_id == busy.id
    ids["owned"] = busy.id
    for n in range(2):
        etl.enqueue(store, {"date": f"2026-12-0{n + 1}"}, run_id=f"etl-2026-12-0{n + 1}")
    # Waiting for a person: the inbox, oldest first.
    for n, (vendor, amount) in enumerate([("Acme Corp", 12_500), ("Hooli", 980),
                                          ("Soylent", 3400)]):
        waiting = approval.start(store, _invoice(10 + n, vendor, amount),
                                 run_id=f"inv-{1010 + n}-{vendor.split()[0].lower()}")
        ids.setdefault("waiting", waiting.run_id)
        time.sleep(0.01)
    # Hostile markup in ids, names and state.
    if hostile:
        _hostile_run(store)
        ids["xss"] = XSS_RUN
    if langgraph:
        ids["thread"] = _langgraph_thread(store)
    return ids


def _hostile_run(store: Store) -> None:
    store.save(XSS_RUN, XSS_STATE, workflow="<script>window.__pitstop_xss=5</script>",
               status=pitstop.RunStatus.COMPLETED,
               metadata={"step_name": "<b onmouseover=alert(1)>x</b>"})


def _langgraph_thread(store: Store) -> str:
    """A real LangGraph conversation checkpointed by PitstopSaver."""
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    from pitstop.integrations.langgraph import PitstopSaver

    # The functional form: annotations written in a class body would be strings here.
    chat = TypedDict(  # noqa: UP013
        "Chat", {"messages": Annotated[list[Any], add_messages], "topic": str})

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(
            "Let me look up the invoice status.",
            tool_calls=[{"name": "invoice_status", "args": {"number": "INV-2026010"},
                         "id": "call-1"}])]}

    def tool(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [ToolMessage("status: waiting for approval since Monday",
                                         tool_call_id="call-1")]}

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage("INV-2026010 (Acme Corp, 12,500 EUR) is waiting for "
                                       "finance approval since Monday.")]}

    graph = StateGraph(chat)
    graph.add_node("agent", agent)
    graph.add_node("tool", tool)
    graph.add_node("answer", answer)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tool")
    graph.add_edge("tool", "answer")
    graph.add_edge("answer", END)
    app = graph.compile(checkpointer=PitstopSaver(store))
    config = {"configurable": {"thread_id": "support-chat-42"}}
    app.invoke({"messages": [HumanMessage("Where is invoice INV-2026010?")],
                "topic": "invoices"}, config)
    return "support-chat-42"


__all__ = ["XSS_RUN", "XSS_STATE", "approval", "etl", "populate"]
