"""The inspector's request limits (issue #34), over real HTTP against the real ``pitstop ui``:
a request body above the limit is answered 413 before it is read whole (it read 200 MiB
whole before, 662 MiB of memory), and failed logins from one address are slowed down
(429 with ``Retry-After``; 200 wrong logins were answered in 1.2 s)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the ui extra is not installed")

import httpx

import pitstop
from conftest import ROOT

SECRET = "correct-horse-battery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    def __init__(self, store: Path, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "PITSTOP_UI_TOKEN"}
        env["PYTHONPATH"] = str(ROOT / "src")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pitstop", "ui", "--store", f"sqlite:///{store}",
             "--port", str(self.port), *args],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.proc.communicate()
            try:
                httpx.get(self.url + "/login", timeout=5)
                return
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=30)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "ui.db"
    wf = pitstop.Workflow("approve")

    @wf.step(wait_for="approval")
    def ask(state: dict[str, object], ctx: pitstop.StepContext) -> object:
        return {"answer": ctx.input("approval")}

    with pitstop.open_store(f"sqlite:///{path}") as store:
        for run_id in ("r", "s"):
            wf.start(store, {"n": 1}, run_id=run_id)
    return path


@pytest.fixture
def server(store_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    args = getattr(request, "param", ())
    srv = Server(store_path, *args)
    yield srv
    srv.stop()


def _input(size: int) -> bytes:
    return b'{"name": "approval", "payload": "' + b"x" * size + b'"}'


@pytest.mark.slow
def test_a_body_over_the_limit_is_413_even_declared_or_chunked(server: Server) -> None:
    url = f"{server.url}/api/runs/r/inputs"
    json_type = {"content-type": "application/json"}
    small = httpx.post(url, content=_input(100), headers=json_type)
    assert small.status_code == 201, small.text  # under the limit: delivered
    big = httpx.post(url, content=_input(2 << 20), headers=json_type)
    assert big.status_code == 413 and "1,048,576" in big.json()["message"], big.text
    url = f"{server.url}/api/runs/s/inputs"  # r took its input; s still waits

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"name": "approval", "payload": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}'

    chunked = httpx.post(url, content=chunks(), headers=json_type)
    assert chunked.status_code == 413, chunked.text

    # A declared 200 MiB is refused on its header, before the body is sent.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(b"POST /api/runs/r/inputs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 209715200\r\n\r\n")
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


@pytest.mark.parametrize("server", [("--max-body", "4096")], indirect=True)
@pytest.mark.slow
def test_the_body_limit_is_configurable(server: Server) -> None:
    url = f"{server.url}/api/runs/r/inputs"
    json_type = {"content-type": "application/json"}
    assert httpx.post(url, content=_input(8000), headers=json_type).status_code == 413
    answer = httpx.post(f"{server.url}/api/runs/s/inputs", content=_input(1000),
                        headers=json_type)
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize("server", [("--token", f"alice:{SECRET}")], indirect=True)
@pytest.mark.slow
def test_failed_logins_are_throttled_with_retry_after(server: Server) -> None:
    with httpx.Client(base_url=server.url) as client:
        for _ in range(5):  # the first few wrong logins are answered at once
            wrong = client.post("/login", data={"token": "wrong-token-123", "next": "/"})
            assert wrong.status_code == 401
        wrong = client.post("/login", data={"token": "wrong-token-123", "next": "/"})
        assert wrong.status_code == 401  # the sixth failure: locked from now on
        locked = client.post("/login", data={"token": SECRET, "next": "/"})
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
        assert "too many failed logins" in locked.text.lower()
        bearer = client.get("/api/runs", headers={"authorization": f"Bearer {SECRET}"})
        assert bearer.status_code == 429 and "retry-after" in bearer.headers
        time.sleep(int(locked.headers["retry-after"]) + 0.2)
        ok = client.post("/login", data={"token": SECRET, "next": "/"})
        assert ok.status_code == 303 and "pitstop_session" in ok.headers["set-cookie"]
        # Wrong bearer tokens count alike, and a success cleared the count.
        api = f"{server.url}/api/runs"  # (without the client's session cookie)
        for _ in range(6):
            denied = httpx.get(api, headers={"authorization": "Bearer nope-nope-1"})
            assert denied.status_code == 401
        denied = httpx.get(api, headers={"authorization": f"Bearer {SECRET}"})
        assert denied.status_code == 429
        # Pages with the session cookie are not throttled: no guess is being made.
        assert client.get("/api/runs").status_code == 200
