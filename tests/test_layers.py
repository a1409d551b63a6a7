"""Imports go down the layers, never up: read from the source (ast), so no import is missed.

Two orders are kept. The packages: ``serde`` -> ``store`` -> ``runtime`` -> ``integrations`` ->
``display`` (what both front ends show) -> ``ui`` -> ``cli`` (whose ``inspect`` starts the
``ui``); each may import those before it, not those after it. Inside
``pitstop.store``, its folders: ``contract`` -> ``encoding`` -> ``engine`` -> ``transfer`` ->
``backends`` -> the package itself (``open_store``). Every import counts, at module level or
inside a function (a function-level import hides a circle, it does not remove it), except
those a type checker alone reads (``if TYPE_CHECKING:``), which must be listed below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE_RANK = {
    "serde": 0, "store": 1, "runtime": 2, "integrations": 3, "display": 4, "ui": 5, "cli": 6,
}
STORE_LAYERS = ("contract", "encoding", "engine", "transfer", "backends")

# (importer, imported): upward imports that only a type checker reads, and why.
TYPE_ONLY_ALLOWED = {
    # Store.export_run returns a RunExport; its rows are the engine's tables, so the class
    # lives with the transfer code, and the contract names it for annotations only.
    ("pitstop.store.contract.base", "pitstop.store.transfer.runs"),
    # Store.cache_get returns a CacheHit (of CacheEntry rows): made by the engine's cache
    # code from its table's rows; Store.schedule_rows returns the schedules' rows.
    ("pitstop.store.contract.base", "pitstop.store.engine.cache"),
    ("pitstop.store.contract.base", "pitstop.store.engine.schema"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                inside.update(id(n) for n in ast.walk(child))
    return inside


def imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported pitstop module, line, type-checking only) for each import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    typing_only = type_checking_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pitstop"):
                    yield alias.name, node.lineno, id(node) in typing_only
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("pitstop"):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                yield (target if is_module(target) else base), node.lineno, id(node) in typing_only


def package_rank(module: str) -> int | None:
    parts = module.split(".")
    return PACKAGE_RANK.get(parts[1]) if len(parts) > 1 else None


def store_rank(module: str) -> int | None:
    """The store layer of ``module`` (its folder's place), the package itself above them all."""
    parts = module.split(".")
    if parts[:2] != ["pitstop", "store"]:
        return None
    if len(parts) == 2:
        return len(STORE_LAYERS)
    return STORE_LAYERS.index(parts[2])


def sources() -> list[Path]:
    return sorted((SRC / "pitstop").rglob("*.py"))


def test_the_store_is_in_layer_folders() -> None:
    store = SRC / "pitstop" / "store"
    loose = [p.name for p in store.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"a store module outside the layer folders: {loose}"
    folders = sorted(p.name for p in store.iterdir() if (p / "__init__.py").exists())
    assert folders == sorted(STORE_LAYERS)


def is_upward(importer: str, target: str) -> bool:
    """Whether ``importer`` importing ``target`` goes up a package or a store layer."""
    low, high = package_rank(importer), package_rank(target)
    if low is not None and high is not None and importer.split(".")[1] != target.split(".")[1]:
        return high > low
    low, high = store_rank(importer), store_rank(target)
    return low is not None and high is not None and high > low


def test_no_import_goes_up_a_layer() -> None:
    found = []
    for path in sources():
        importer = module_name(path)
        for target, line, typing_only in imports(path):
            if typing_only and (importer, target) in TYPE_ONLY_ALLOWED:
                continue
            if is_upward(importer, target):
                found.append(f"{path.relative_to(SRC)}:{line}: {importer} imports {target}")
    assert sorted(set(found)) == []


@pytest.mark.parametrize(("importer", "target", "upward"), [
    ("pitstop.store.engine.sql", "pitstop.store.transfer.runs", True),
    ("pitstop.store.contract.base", "pitstop.store.backends.sqlite", True),
    ("pitstop.store.engine.steps", "pitstop.store", True),
    ("pitstop.serde.codec", "pitstop.store.contract.base", True),
    ("pitstop.ui.views", "pitstop.cli.graph", True),
    ("pitstop.display.graph", "pitstop.ui.graph", True),
    ("pitstop.cli.inspector", "pitstop.ui.server", False),
    ("pitstop.store.backends.sqlite", "pitstop.store.engine.sql", False),
    ("pitstop.store", "pitstop.store.backends.memory", False),
    ("pitstop.runtime.engine", "pitstop.store.contract.base", False),
    ("pitstop.store.engine.sql", "pitstop.errors", False),
])
def test_what_counts_as_upward(importer: str, target: str, upward: bool) -> None:
    assert is_upward(importer, target) is upward
