"""Every error pitstop raises on purpose is defined in ``pitstop.errors`` and exported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pitstop
from pitstop import errors

SRC = Path(pitstop.__file__).parent


def test_every_public_error_is_exported_from_pitstop() -> None:
    for name in errors.__all__:
        error = getattr(errors, name)
        assert issubclass(error, pitstop.PitstopError), name
        assert getattr(pitstop, name) is error, name
        assert name in pitstop.__all__, name
    assert {"ArchiveError", "StepFailedError"} <= set(errors.__all__)


@pytest.mark.slow
def test_no_public_error_class_is_defined_elsewhere() -> None:
    """Framework integrations may refine an error for their own API (LangGraph's
    ``ThreadConflictError``); the library's own errors live in one place."""
    elsewhere = []
    for path in SRC.rglob("*.py"):
        if path.name == "errors.py" or "integrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ClassDef) and node.name.endswith("Error")
                    and not node.name.startswith("_")
                    and any(getattr(base, "id", "").endswith("Error") for base in node.bases)):
                elsewhere.append(f"{path.relative_to(SRC)}:{node.name}")
    assert elsewhere == []


def test_archive_errors_are_pitstop_errors(tmp_path: Path) -> None:
    from pitstop.archive import read_archive

    bad = tmp_path / "x.pitstop"
    bad.write_bytes(b"not an archive")
    with pytest.raises(pitstop.ArchiveError, match="not a pitstop archive"):
        read_archive(bad)
