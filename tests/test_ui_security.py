"""The inspector's security: tokens, the login cookie, CSRF, escaping, exposure, leases.

In process for the request-level rules; the real ``pitstop ui`` executable for the rules of
starting it (a non-loopback address without a token, the Host check).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the ui extra is not installed")

import httpx
from fastapi.testclient import TestClient

import pitstop
from conftest import ROOT
from pitstop import Store
from pitstop.ui import create_app
from pitstop.ui.security import LoginThrottle, parse_tokens
from ui_workflows import XSS_RUN, XSS_STATE, populate

TOKEN = "alice:correct-horse-battery"
SECRET = "correct-horse-battery"


@pytest.fixture
def populated(tmp_path: Path) -> Iterator[tuple[Store, dict[str, str], Path]]:
    path = tmp_path / "sec.db"
    store = pitstop.open_store(f"sqlite:///{path}")
    ids = populate(store, langgraph=False)
    yield store, ids, path
    store.close()


@pytest.fixture
def guarded(populated: tuple[Store, dict[str, str], Path]) -> Iterator[TestClient]:
    # Tests here send many wrong tokens on purpose: the login throttle is tested on its own
    # (test_ui_limits.py), and would answer them 429.
    unthrottled = LoginThrottle(free=10_000)
    with TestClient(create_app(populated[0], token=TOKEN, throttle=unthrottled)) as c:
        yield c


def _leaks(text: str) -> bool:
    return any(name in text for name in ("inv-1010-acme", "Globex", "nightly-etl", "Umbrella"))


# -- tokens ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-123", "Basic YWxpY2U6eA==",
                                    f"Bearer {SECRET}x", "Bearer "])
def test_missing_or_wrong_token_is_401_and_leaks_nothing(guarded: TestClient,
                                                         header: str | None) -> None:
    headers = {"authorization": header} if header else {}
    for path in ("/api/runs", "/api/runs/inv-1010-acme", "/openapi.json", "/", "/inbox",
                 "/runs/inv-1010-acme", "/events?view=runs"):
        response = guarded.get(path, headers=headers)
        assert response.status_code == 401, path
        # the login form may repeat the path asked for (to return there), nothing else
        assert not _leaks(response.text.replace(path, "")), path
        assert "sec.db" not in response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
    api = guarded.get("/api/runs", headers=headers)
    assert api.json()["status"] == 401
    page = guarded.get("/", headers=headers)
    assert 'name="token"' in page.text  # the login form, with status 401
    post = guarded.post("/api/runs/inv-1010-acme/cancel", headers=headers)
    assert post.status_code == 401


def test_bearer_token_opens_everything(guarded: TestClient,
                                       populated: tuple[Store, Any, Path]) -> None:
    auth = {"authorization": f"Bearer {SECRET}"}
    assert guarded.get("/api/runs", headers=auth).json()["total"] == 12
    assert guarded.get("/openapi.json", headers=auth).status_code == 200
    assert guarded.get("/", headers=auth).status_code == 200
    sent = guarded.post("/api/runs/inv-1010-acme/inputs", headers=auth,
                        json={"name": "approval", "payload": {"approved": True}})
    assert sent.status_code == 201
    store = populated[0]
    assert store.get_run("inv-1010-acme").metadata["ui_actions"][-1]["by"] == "alice"
    assert guarded.get("/static/app.css").status_code == 200  # no data in static files


def test_login_sets_an_httponly_strict_cookie(guarded: TestClient) -> None:
    wrong = guarded.post("/login", data={"token": "nope-nope-nope", "next": "/inbox"},
                         follow_redirects=False)
    assert wrong.status_code == 401 and "not valid" in wrong.text
    assert "set-cookie" not in wrong.headers
    good = guarded.post("/login", data={"token": SECRET, "next": "/inbox"},
                        follow_redirects=False)
    assert good.status_code == 303 and good.headers["location"] == "/inbox"
    cookie = good.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert SECRET not in cookie
    assert guarded.get("/inbox").status_code == 200  # the client keeps the cookie
    assert guarded.get("/api/runs").status_code == 200
    guarded.post("/logout", follow_redirects=False)
    guarded.cookies.clear()
    assert guarded.get("/api/runs").status_code == 401


def test_forged_cookie_is_refused(guarded: TestClient) -> None:
    for value in ("alice.0000", "alice", "bob.abc", f"alice.{SECRET}", ""):
        guarded.cookies.set("pitstop_session", value)
        assert guarded.get("/api/runs").status_code == 401, value


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "\\\\evil",
                                    "javascript:alert(1)"])
def test_login_never_redirects_off_site(guarded: TestClient, target: str) -> None:
    response = guarded.post("/login", data={"token": SECRET, "next": target},
                            follow_redirects=False)
    assert response.headers["location"] == "/"


def test_token_specs() -> None:
    assert parse_tokens("s3cret-token") == {"token": "s3cret-token"}
    assert parse_tokens(["alice:aaaaaaaa", "bob:bbbbbbbb"]) == {"alice": "aaaaaaaa",
                                                                 "bob": "bbbbbbbb"}
    assert parse_tokens("alice:aaaaaaaa,bob:bbbbbbbb")["bob"] == "bbbbbbbb"
    assert parse_tokens("a9/+=:x==-longer") == {"token": "a9/+=:x==-longer"}
    # a bare secret is not named 'token' in the message, and the secret is never echoed (#30)
    with pytest.raises(ValueError, match=r"^the token has 3 characters; use at least 8") as bare:
        parse_tokens("abc")
    assert "'token'" not in str(bare.value) and "abc" not in str(bare.value)
    with pytest.raises(ValueError, match="secret of token 'alice' has 5 characters") as named:
        parse_tokens("alice:short")
    assert "short" not in str(named.value).replace("shorter", "")
    with pytest.raises(ValueError, match="two tokens"):
        parse_tokens(["aaaaaaaa", "bbbbbbbb"])


# -- CSRF ------------------------------------------------------------------------------------------


def _csrf(client: TestClient, path: str = "/") -> str:
    page = client.get(path).text
    return page.split('data-csrf="', 1)[1].split('"', 1)[0]


def test_cookie_sessions_need_the_csrf_header(guarded: TestClient,
                                              populated: tuple[Store, Any, Path]) -> None:
    guarded.post("/login", data={"token": SECRET})
    store = populated[0]
    bare = guarded.post("/api/runs/etl-2026-12-01/cancel", json={})
    assert bare.status_code == 403 and "CSRF" in bare.json()["message"]
    wrong = guarded.post("/api/runs/etl-2026-12-01/cancel", json={},
                         headers={"x-pitstop-csrf": "0" * 64})
    assert wrong.status_code == 403
    assert store.get_run("etl-2026-12-01").status.value == "queued"
    ok = guarded.post("/api/runs/etl-2026-12-01/cancel", json={},
                      headers={"x-pitstop-csrf": _csrf(guarded)})
    assert ok.status_code == 200
    assert store.get_run("etl-2026-12-01").status.value == "cancelled"


@pytest.mark.parametrize("headers", [
    {"origin": "https://evil.example"},
    {"origin": "null"},
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site"},
])
def test_cross_site_requests_are_refused(populated: tuple[Store, Any, Path],
                                         headers: dict[str, str]) -> None:
    store = populated[0]
    with TestClient(create_app(store)) as c:
        response = c.post("/api/runs/etl-2026-12-01/cancel", json={},
                          headers={**headers, "x-pitstop-csrf": _csrf(c)})
        assert response.status_code == 403 and "cross-site" in response.json()["message"]
    with TestClient(create_app(store, token=TOKEN)) as c:
        bearer = c.post("/api/runs/etl-2026-12-01/cancel", json={},
                        headers={**headers, "authorization": f"Bearer {SECRET}"})
        assert bearer.status_code == 403
        login = c.post("/login", data={"token": SECRET}, headers=headers,
                       follow_redirects=False)
        assert login.status_code == 403
    assert store.get_run("etl-2026-12-01").status.value == "queued"


def test_a_token_less_server_refuses_form_posts(populated: tuple[Store, Any, Path]) -> None:
    """What a page elsewhere could send to 127.0.0.1 without a preflight: a form."""
    store = populated[0]
    with TestClient(create_app(store)) as c:
        for content_type in ("application/x-www-form-urlencoded", "text/plain",
                             "multipart/form-data; boundary=x"):
            response = c.post("/api/runs/etl-2026-12-01/cancel", content=b"{}",
                              headers={"content-type": content_type})
            assert response.status_code == 403, content_type
        same_origin = c.post("/api/runs/etl-2026-12-01/cancel", json={},
                             headers={"origin": "http://testserver"})
        assert same_origin.status_code == 200
    assert store.get_run("etl-2026-12-01").status.value == "cancelled"


# -- escaping and headers --------------------------------------------------------------------------


def test_state_is_escaped_everywhere(populated: tuple[Store, Any, Path]) -> None:
    store = populated[0]
    with TestClient(create_app(store)) as c:
        from urllib.parse import quote

        pages = [c.get("/").text, c.get("/?fragment=1").text,
                 c.get(f"/runs/{quote(XSS_RUN, safe='')}").text]
        for page in pages:
            assert "<script>window" not in page
            assert "<img src=x" not in page
            assert "<b onmouseover" not in page
            assert "<svg onload" not in page
        run_page = pages[2]
        assert "&lt;script&gt;window.__pitstop_xss = 1&lt;/script&gt;" in run_page
        assert 'href="javascript:' not in run_page
        for value in XSS_STATE.values():  # the API returns the values as they are
            assert value in c.get(f"/api/checkpoints/{store.get_run(XSS_RUN).head_id}").text \
                or value.replace('"', '\\"') in c.get(
                    f"/api/checkpoints/{store.get_run(XSS_RUN).head_id}").text


def test_security_headers(populated: tuple[Store, Any, Path]) -> None:
    with TestClient(create_app(populated[0])) as c:
        headers = c.get("/").headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["cache-control"] == "no-store"
        page = c.get("/").text
        assert "<script>" not in page and " style=" not in page  # nothing inline for the CSP


def test_pages_never_take_a_lease(populated: tuple[Store, Any, Path]) -> None:
    store, ids, _ = populated
    with TestClient(create_app(store)) as c:
        for run_id in (ids["waiting"], ids["branched"], ids["failed"]):
            c.get(f"/runs/{run_id}")
            c.get(f"/api/runs/{run_id}")
            c.get(f"/api/runs/{run_id}/history")
            assert store.get_run(run_id).owner is None
        c.get("/inbox")
        assert all(r.owner is None for r in store.runs(status="waiting", limit=None))
        # and a worker can take a run whose page is open
        lease = store.acquire(ids["waiting"], "worker-1", ttl=5)
        assert lease.owner == "worker-1"
        store.release(lease)


# -- starting the real server ----------------------------------------------------------------------


def _ui(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pitstop", "ui", *args],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # (This checkout's src first: in a worktree the child would run another's pitstop.)
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]),
             **(env or {})},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "example.com", "::"])
@pytest.mark.slow
def test_non_loopback_without_a_token_refuses_to_start(
    populated: tuple[Store, Any, Path], host: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PITSTOP_UI_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "pitstop", "ui", "--store", f"sqlite:///{populated[2]}",
         "--host", host], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
        check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "without a token" in lines[0], done.stderr


def _wait_up(proc: subprocess.Popen[str], url: str, **kw: Any) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            return httpx.get(url, timeout=5, **kw)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


@pytest.mark.slow
def test_loopback_server_checks_the_host_header(populated: tuple[Store, Any, Path]) -> None:
    port = free_port()
    proc = _ui("--store", f"sqlite:///{populated[2]}", "--port", str(port))
    try:
        assert _wait_up(proc, f"http://127.0.0.1:{port}/api/runs").status_code == 200
        assert httpx.get(f"http://localhost:{port}/api/runs").status_code == 200
        rebound = httpx.get(f"http://127.0.0.1:{port}/api/runs",
                            headers={"host": f"evil.example:{port}"})
        assert rebound.status_code == 400 and not _leaks(rebound.text)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_token_from_the_environment(populated: tuple[Store, Any, Path]) -> None:
    port = free_port()
    proc = _ui("--store", f"sqlite:///{populated[2]}", "--port", str(port), "--host",
               "127.0.0.1", env={"PITSTOP_UI_TOKEN": "ops:env-token-1234"})
    try:
        url = f"http://127.0.0.1:{port}/api/runs"
        assert _wait_up(proc, url).status_code == 401
        ok = httpx.get(url, headers={"authorization": "Bearer env-token-1234"})
        assert ok.status_code == 200 and ok.json()["total"] == 12
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "env-token-1234" not in out  # the banner never prints the token
