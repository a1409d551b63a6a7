"""The inspector in a real browser: Playwright driving Debian's Chromium against the real
``pitstop ui`` process, on a real SQLite store.

Every flow a person has: list and filter runs and watch them update live, open a run and
read its tree and state, open a diff, approve a waiting run from the inbox and see it move
on (``--workflow`` resumes it), fork with an edit, cancel, read-only mode, the token login,
hostile state shown as text, a LangGraph thread as a conversation. The screenshots in docs/
come from the same code (tests/ui_browser.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi", reason="the ui extra is not installed")

import pitstop
from pitstop import RunStatus, Store
from ui_browser import (
    SHOTS,
    Server,
    browser,
    chromium_missing,
    fresh_page,
    take_screenshots,
)
from ui_workflows import XSS_RUN, XSS_STATE, approval, populate

_MISSING = chromium_missing()
if _MISSING is not None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run in CI: {_MISSING}", pytrace=False)
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

TOKEN = "reviewer:browser-token-42"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One populated store and three servers on it: with the approval workflow, read-only,
    and behind a token."""
    path = Path(tmp_path_factory.mktemp("browser")) / "ui.db"
    url = f"sqlite:///{path}"
    store = pitstop.open_store(url)
    ids = populate(store)
    servers = {
        "main": Server(url, "--workflow", "ui_workflows:approval"),
        "read_only": Server(url, "--read-only"),
        "token": Server(url, "--token", TOKEN),
    }
    try:
        yield {"store": store, "ids": ids, "url": url,
               **{name: s.url for name, s in servers.items()}}
    finally:
        for server in servers.values():
            server.stop()
        store.close()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with browser() as p:
        yield p


@pytest.fixture
def page(playwright: Any) -> Iterator[Any]:
    with fresh_page(playwright) as p:
        yield p
        assert not p.pitstop_errors, p.pitstop_errors  # no script errors on any page


def _live(page: Any) -> None:
    page.wait_for_selector("body[data-live=on]")


@pytest.mark.slow
def test_runs_page_lists_filters_and_updates_live(world: dict[str, Any], page: Any) -> None:
    base = world["main"]
    page.goto(base + "/")
    _live(page)
    rows = page.locator("tr.run")
    assert rows.count() == 13
    assert page.locator("a.tab.t-waiting .n").inner_text() == "5"
    page.locator("a.tab.t-failed").click()
    page.wait_for_url(re.compile(r"status=failed"))
    assert page.locator("tr.run").count() == 1
    assert "ValueError" in page.locator("tr.run .err-line").inner_text()
    page.goto(base + "/")
    page.fill("input[name=id]", "inv-101")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"id=inv-101"))
    assert page.locator("tr.run").count() == 3
    page.goto(base + "/?status=queued")
    _live(page)
    page.evaluate("window.__same_page = true")
    approval.enqueue(world["store"], {"vendor": "Live Co", "amount": 5}, run_id="live-arrival")
    page.wait_for_selector("tr.run[data-run='live-arrival']")  # no reload: pushed by SSE
    assert page.evaluate("window.__same_page") is True
    assert page.locator("a.tab.t-queued .n").inner_text() == "3"


@pytest.mark.slow
def test_run_page_tree_state_and_diff(world: dict[str, Any], page: Any) -> None:
    store: Store = world["store"]
    run_id = world["ids"]["branched"]
    page.goto(f"{world['main']}/runs/{run_id}")
    _live(page)
    assert page.locator("tr.ck").count() == 12
    assert page.locator(".pill.branch").count() == 2
    assert page.locator("svg circle.head-ring").count() == 1
    lanes = {c for c in page.eval_on_selector_all(
        "svg .dot", "els => els.map(e => e.getAttribute('class'))") for c in c.split()
        if c.startswith("lane-")}
    assert len(lanes) >= 2  # branches drawn in lanes of their own
    assert page.locator("svg rect.dot").count() == 2  # the milestones
    page.click("button.find-forks")
    page.locator("dd.forks a", has_text="inv-1003-umbrella-fix").wait_for()
    # pick the review checkpoint of the first line: its risk changed from "unknown"
    review = next(h for h in reversed(store.history(run_id, limit=None))
                  if h.metadata.get("step_name") == "review")
    page.click(f"tr.ck[data-checkpoint='{review.id}'] td.id a")
    page.wait_for_selector(f"section.checkpoint[data-checkpoint='{review.id}']")
    tree = page.locator("section.checkpoint .tree")
    assert "Umbrella" in tree.inner_text()
    invoice = tree.locator("details.node", has=page.locator("summary .key", has_text="invoice"))
    assert invoice.locator("summary .type").first.inner_text() == "Invoice"
    assert "consulting" not in invoice.inner_text()  # deeper levels start collapsed
    first_line = invoice.locator("details.node details.node").first
    first_line.locator("summary").click()
    assert "consulting" in invoice.inner_text()
    diff = page.locator("#diff")
    assert diff.locator(".seg-delete").first.inner_text() == "unknown"
    assert diff.locator(".seg-insert").first.inner_text() == "low"
    first = store.history(run_id, limit=None)[-1]
    page.select_option("form.against select", first.id)
    page.click("form.against button")
    page.wait_for_url(re.compile(r"against="))
    assert page.locator("table.diff tr.op-added").count() >= 2  # risk and summary appeared


@pytest.mark.slow
def test_approve_from_the_inbox_and_see_the_run_move_on(world: dict[str, Any],
                                                        page: Any) -> None:
    store: Store = world["store"]
    page.goto(world["main"] + "/inbox")
    _live(page)
    card = page.locator("article.ask[data-run='inv-1010-acme']")
    assert "Acme Corp" in card.locator(".shown").inner_text()
    assert "submitted_by" not in card.locator(".shown").inner_text()  # only what it shows
    card.locator("button.fill", has_text="approve").click()
    with page.expect_response(lambda r: r.url.endswith("/inputs")) as sent:
        card.locator("button[type=submit]", has_text="Send approval").click()
    assert sent.value.status == 201 and "resuming" in sent.value.json()["message"]
    page.wait_for_selector("article.ask[data-run='inv-1010-acme']", state="detached")
    assert store.get_run("inv-1010-acme").status is RunStatus.COMPLETED
    page.goto(world["main"] + "/runs/inv-1010-acme")
    assert page.locator(".run-head .status").first.inner_text() == "completed"
    page.locator(".audit summary").click()
    assert "input approval by local" in page.locator(".audit").inner_text().replace("\n", " ")


@pytest.mark.slow
def test_the_json_editor_checks_before_anything_is_sent(world: dict[str, Any],
                                                        page: Any) -> None:
    page.goto(world["main"] + "/runs/inv-1011-hooli")
    form = page.locator("form.send")
    area = form.locator("textarea")
    area.fill('{"approved": yes}')
    assert "not valid JSON" in form.locator(".json-error").inner_text()
    assert form.locator("button[type=submit]").is_disabled()
    area.fill('{"approved": false, "reason": "over budget"}')
    assert form.locator(".json-error").inner_text() == ""
    assert form.locator("button[type=submit]").is_enabled()
    assert world["store"].inputs("inv-1011-hooli") == {}
    # the server's refusal shows inline too: a second input of the same name
    pitstop.send(world["store"], "inv-1011-hooli", "approval", {"approved": True})
    form.locator("button[type=submit]").click()
    form.locator(".result.bad", has_text="not consumed").wait_for()


@pytest.mark.slow
def test_fork_with_an_edit(world: dict[str, Any], page: Any) -> None:
    store: Store = world["store"]
    review = next(h for h in store.history("inv-1012-soylent", limit=None)
                  if h.metadata.get("step_name") == "review")
    page.goto(f"{world['main']}/runs/inv-1012-soylent?checkpoint={review.id}")
    page.locator("details.fork-section > summary").click()
    form = page.locator("form.fork")
    form.locator("select.field").select_option("amount")
    area = form.locator("textarea")
    page.wait_for_function("() => document.querySelector('form.fork textarea').value === '3400'")
    area.fill("1234")
    form.locator("input.run-id").fill("soylent-cheaper")
    form.locator("button[type=submit]").click()
    # What the form sent, then what the store holds, then what the page shows: a failure
    # here says which of the three went wrong.
    result = form.locator(".result.ok", has_text="forked run")
    result.wait_for()
    assert "1234" in area.input_value(), result.inner_text()
    head = store.latest("soylent-cheaper")
    assert head is not None and head.state["amount"] == 1234, result.inner_text()
    form.locator("a.forked-link").click()
    page.wait_for_url(re.compile(r"/runs/soylent-cheaper"))
    assert "1234" in page.locator("section.checkpoint .tree").inner_text()
    assert store.latest("inv-1012-soylent").state["amount"] == 3400
    # an unknown field is refused, with the reason inline
    page.goto(f"{world['main']}/runs/inv-1012-soylent?checkpoint={review.id}")
    page.locator("details.fork-section > summary").click()
    form = page.locator("form.fork")
    form.locator("input.add").check()
    form.locator("input.new-field").fill("budget")
    form.locator("textarea").fill("10")
    form.locator("input.add").uncheck()
    form.locator("input.add").check()
    form.locator("button[type=submit]").click()
    form.locator(".result.ok", has_text="forked run").wait_for()


@pytest.mark.slow
def test_cancel_from_the_run_page(world: dict[str, Any], page: Any) -> None:
    page.goto(world["main"] + "/runs/etl-2026-12-02")
    _live(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form.cancel button")
    page.wait_for_selector(".run-head .status.s-cancelled")  # the header refreshed live
    assert world["store"].get_run("etl-2026-12-02").status is RunStatus.CANCELLED


@pytest.mark.slow
def test_read_only_hides_every_action(world: dict[str, Any], page: Any) -> None:
    base = world["read_only"]
    for path in ("/inbox", "/runs/inv-1003-umbrella", "/runs/etl-2026-11-30"):
        page.goto(base + path)
        assert page.locator("form[data-action]").count() == 0, path
        assert page.locator(".mode").inner_text() == "read-only"
    status = page.evaluate("""async () => (await fetch('/api/runs/etl-2026-12-01/cancel',
        {method: 'POST', headers: {'Content-Type': 'application/json',
         'X-Pitstop-CSRF': document.body.dataset.csrf}})).status""")
    assert status == 403


@pytest.mark.slow
def test_token_login(world: dict[str, Any], page: Any) -> None:
    base = world["token"]
    response = page.goto(base + "/runs/inv-1003-umbrella")
    assert response.status == 401
    assert page.locator("tr.ck").count() == 0
    page.fill("input[name=token]", "not-the-token")
    page.click("button[type=submit]")
    assert "not valid" in page.locator(".problem").inner_text()
    page.fill("input[name=token]", "browser-token-42")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/runs/inv-1003-umbrella$"))
    _live(page)
    assert page.locator("tr.ck").count() == 12
    assert page.locator(".who").inner_text() == "reviewer"
    assert "pitstop_session" not in page.evaluate("document.cookie")  # HttpOnly
    cookie = next(c for c in page.context.cookies() if c["name"] == "pitstop_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.click("header.top form button")
    page.wait_for_url(re.compile(r"/login"))
    assert page.goto(base + "/").status == 401


@pytest.mark.slow
def test_hostile_state_is_shown_as_text(world: dict[str, Any], page: Any) -> None:
    for path in ("/", f"/runs/{quote(XSS_RUN, safe='')}"):
        page.goto(world["main"] + path)
        _live(page)
        assert page.evaluate("window.__pitstop_xss") is None
        assert page.locator("img[src=x]").count() == 0
    text = page.locator("section.checkpoint .tree").inner_text()
    for value in XSS_STATE.values():
        assert value in text
    assert page.locator("section.run-head h1").inner_text() == XSS_RUN


@pytest.mark.slow
def test_langgraph_thread_reads_as_a_conversation(world: dict[str, Any], page: Any) -> None:
    page.goto(f"{world['main']}/runs/{world['ids']['thread']}")
    messages = page.locator("ol.chat li.msg")
    assert messages.count() == 4
    roles = [c.split()[1] for c in messages.evaluate_all("els => els.map(e => e.className)")]
    assert roles == ["role-user", "role-assistant", "role-tool", "role-assistant"]
    assert "invoice_status" in messages.nth(1).inner_text()
    assert "waiting for finance approval" in messages.nth(3).inner_text()
    # Its graph ended: the store still says running (as every LangGraph saver leaves it),
    # the page says idle and why.
    badge = page.locator(".run-head .title .status")
    assert badge.inner_text() == "idle"
    assert "no node left to run" in (badge.get_attribute("title") or "")


@pytest.mark.slow
def test_failed_run_shows_its_traceback(world: dict[str, Any], page: Any) -> None:
    page.goto(world["main"] + "/runs/etl-2026-11-30")
    failure = page.locator(".failure")
    assert "ValueError" in failure.inner_text() and "in step transform" in failure.inner_text()
    assert "Traceback (most recent call last)" in failure.locator("pre").inner_text()


@pytest.mark.slow
def test_screenshots(world: dict[str, Any], page: Any, tmp_path: Path) -> None:
    """The pictures in docs/ and the README: PITSTOP_UI_SCREENSHOTS=docs/images refreshes them
    (so does ``python tests/ui_browser.py``)."""
    out = Path(os.environ.get("PITSTOP_UI_SCREENSHOTS") or tmp_path)
    made = take_screenshots(page, world["main"], out, branched=world["ids"]["branched"])
    assert [p.name for p in made] == list(SHOTS.values())
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
