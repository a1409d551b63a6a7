"""tests/external/langgraph_suite.py wires PitstopSaver into a LangGraph checkout and takes
the wiring out again; the suite itself needs that checkout and is not run here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from conftest import ROOT


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "langgraph_suite", ROOT / "tests" / "external" / "langgraph_suite.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_wire_and_unwire_a_checkout(tmp_path: Path) -> None:
    suite = _script()
    tests = tmp_path / "libs" / "langgraph" / "tests"
    tests.mkdir(parents=True)
    original = "import pytest\n\n@pytest.fixture\ndef sync_checkpointer():\n    yield None\n"
    (tests / "conftest.py").write_text(original)
    assert suite.tests_dir(tmp_path) == tests
    suite.wire(tests)
    suite.wire(tests)  # twice: still one import line
    text = (tests / "conftest.py").read_text()
    assert text.startswith(original) and text.count(suite.MARK) == 1
    compile((tests / "conftest_pitstop.py").read_text(), "conftest_pitstop.py", "exec")
    suite.unwire(tests)
    assert (tests / "conftest.py").read_text() == original
    assert not (tests / "conftest_pitstop.py").exists()


def test_counts_come_from_the_saver_property(tmp_path: Path) -> None:
    suite = _script()
    report = tmp_path / "report.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.test_a" name="test_x[sqlite-sqlite]">'
        '<properties><property name="saver" value="SqliteSaver"/></properties></testcase>'
        '<testcase classname="tests.test_a" name="test_y[pitstop_sqlite]">'
        '<properties><property name="saver" value="pitstop_sqlite"/></properties>'
        '<failure message="boom"/></testcase>'
        '<testcase classname="tests.test_a" name="test_z"/>'
        "</testsuite></testsuites>"
    )
    counts = suite.summarise(report, ["SqliteSaver", "pitstop_sqlite"])
    assert counts["SqliteSaver"]["passed"] == 1
    assert counts["pitstop_sqlite"]["failed"] == 1
