"""Driving the inspector in Debian's Chromium: the browser, the server, the screenshots.

Shared by tests/test_ui_browser.py and by the docs: ``python tests/ui_browser.py docs/images``
writes the README's screenshots (the runs page, the inbox, a run with branches) from a fresh
populated store, with the same code the browser tests run. Playwright drives the system's
``/usr/bin/chromium`` (``apt-get install -y chromium``); it never downloads a browser.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1360, "height": 860}
SHOTS = {"runs": "ui-runs.png", "inbox": "ui-inbox.png", "run": "ui-run-branches.png"}


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A real ``pitstop ui`` process on a free loopback port."""

    def __init__(self, store_url: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "PITSTOP_UI_TOKEN"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pitstop", "ui", "--store", store_url, "--port",
             str(self.port), *args],
            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"pitstop ui exited {self.proc.returncode}: {err or out}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("pitstop ui did not start within 60 s")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        _, err = self.proc.communicate()
        return err


@contextmanager
def browser() -> Iterator[Any]:
    """Chromium from the system's binary, with a fresh temporary profile (Playwright makes
    one per launch and deletes it afterwards)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def fresh_page(launched: Any) -> Iterator[Any]:
    """A page in a context of its own: no cookies or storage from another test."""
    context = launched.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # Script errors and CSP refusals; not the 4xx answers some tests ask for.
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error"
                and not msg.text.startswith("Failed to load resource") else None)
        page.pitstop_errors = errors
        yield page
    finally:
        context.close()


def take_screenshots(page: Any, base: str, out: Path, *, branched: str) -> list[Path]:
    """The README's three pictures: the runs page, the inbox, a run with branches."""
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for key, path in (("runs", "/"), ("inbox", "/inbox"), ("run", f"/runs/{branched}")):
        page.goto(base + path)
        page.wait_for_selector("body[data-live=on]")
        target = out / SHOTS[key]
        if key == "run":
            # The header, the tree and the top of the checkpoint panel: what a person sees.
            page.set_viewport_size({"width": VIEWPORT["width"], "height": 1200})
            page.screenshot(path=str(target))
            page.set_viewport_size(VIEWPORT)
        else:
            page.screenshot(path=str(target), full_page=key == "runs")
        made.append(target)
    return made


def main(argv: Sequence[str]) -> int:
    """Write the docs' screenshots into argv[0] (default docs/images)."""
    import pitstop
    from ui_workflows import populate

    out = Path(argv[0] if argv else ROOT / "docs" / "images")
    with tempfile.TemporaryDirectory(prefix="pitstop-shots-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'demo.db'}"
        store = pitstop.open_store(url)
        ids = populate(store, hostile=False)
        store.close()
        server = Server(url, "--workflow", "ui_workflows:approval")
        try:
            with browser() as playwright, fresh_page(playwright) as page:
                for path in take_screenshots(page, server.url, out, branched=ids["branched"]):
                    print(path)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    raise SystemExit(main(sys.argv[1:]))
