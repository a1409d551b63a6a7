"""The documentation site: it builds with ``mkdocs build --strict``, its API reference covers
every public name (each with a docstring), every page is in the nav, and the troubleshooting
page lists every error message the code can raise."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pitstop
from conftest import ROOT

DOCS = ROOT / "docs"
REFERENCE = "\n".join(p.read_text() for p in sorted((DOCS / "reference").glob("*.md")))
TROUBLESHOOTING = " ".join((DOCS / "troubleshooting.md").read_text().split())


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]')")
@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "workflows" / "index.html").exists()
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "pitstop start" in cli_page and "--log-level" in cli_page
    tools_page = (tmp_path / "site" / "reference" / "tools" / "index.html").read_text()
    assert 'id="pitstop.ui.create_app"' in tools_page
    # the site works offline and leaks nothing: no page loads anything from another host
    for page in (tmp_path / "site").rglob("*.html"):
        remote = re.findall(r'<(?:link|script)[^>]+(?:href|src)="(https?://[^"]+)"',
                            page.read_text())
        assert remote == [], f"{page.relative_to(tmp_path)} loads {remote}"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
             if not p.relative_to(DOCS).as_posix().startswith("_")]
    missing = [p for p in pages if f": {p}" not in nav]
    assert not missing, f"add these to mkdocs.yml's nav (one line each): {missing}"


def _public() -> list[str]:
    return [name for name in pitstop.__all__ if name != "__version__"]


def test_every_public_name_has_a_reference_entry() -> None:
    entries = set(re.findall(r"^::: ([\w.]+)", REFERENCE, re.MULTILINE))
    missing = [name for name in _public() if f"pitstop.{name}" not in entries]
    assert not missing, f"add `::: pitstop.NAME` to a page of docs/reference/: {missing}"


def test_every_public_name_and_member_has_a_docstring() -> None:
    missing = []
    for name in _public():
        obj = getattr(pitstop, name)
        if not inspect.getdoc(obj):
            missing.append(name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_") or isinstance(value, type):
                continue
            target = value.fget if isinstance(value, property) else \
                getattr(value, "__func__", value)
            if callable(target) and not inspect.getdoc(target):
                missing.append(f"{name}.{attr}")
    assert not missing, f"document these: {missing}"


# -- the troubleshooting page ------------------------------------------------------------------

_NOT_USER_ERRORS = {"ValueError", "TypeError", "NotImplementedError", "AssertionError",
                    "AttributeError", "RuntimeError", "KeyError", "LookupError", "OSError",
                    "_Disconnected", "StopIteration", "PathNotFound"}


def _template(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
    if isinstance(node, ast.BinOp):
        return (_template(node.left) or "\0") + (_template(node.right) or "\0")
    return None


def _messages() -> list[tuple[str, str]]:
    """(where, template) of every error raised with a literal message."""
    found = []
    for path in sorted((ROOT / "src" / "pitstop").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else None
            if not isinstance(call, ast.Call) or not call.args:
                continue
            func = call.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            text = _template(call.args[0])
            if name in _NOT_USER_ERRORS or text is None:
                continue
            found.append((f"{path.relative_to(ROOT)}:{node.lineno}", text))
    return found


def test_every_error_class_has_a_section() -> None:
    from pitstop import errors

    classes = [*errors.__all__, "ArchiveError", "ThreadConflictError", "StepFailedError"]
    headings = set(re.findall(r"^#+ (\w+)", (DOCS / "troubleshooting.md").read_text(),
                              re.MULTILINE))
    missing = [c for c in classes if c not in headings]
    assert not missing, f"add a section to docs/troubleshooting.md for: {missing}"


@pytest.mark.slow
def test_every_error_message_is_on_the_troubleshooting_page() -> None:
    missing = []
    for where, text in _messages():
        pieces = [" ".join(p.split()) for p in text.split("\0")]
        longest = max(pieces, key=len).strip(" :;,()")
        if len(longest) >= 12 and longest not in TROUBLESHOOTING:
            missing.append(f"{where}: {longest!r}")
    assert not missing, "say what these mean in docs/troubleshooting.md:\n" + "\n".join(missing)
