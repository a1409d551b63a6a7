"""The public API, the code and the reference docs say the same thing.

The public API is ``pitstop``'s ``__all__`` and the ``__all__`` of the public modules listed
in ``pitstop._PUBLIC_MODULES``; every other module (the store's layer folders, the CLI, the
inspector, ``pitstop.display``...) is internal and may change. So: every exported name
exists; ``pitstop`` exports exactly what it binds (nothing leaks by being imported there);
every object the reference documents (``::: pitstop.x.y``) is exported by a public module;
and every name ``pitstop`` exports is documented.
"""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import pytest

import pitstop

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference"
DOCUMENTED = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)
# Names a module binds that are not exports: the __future__ feature and typing's flag.
NOT_EXPORTS = {"annotations", "TYPE_CHECKING"}


def documented() -> list[str]:
    return sorted({m for page in DOCS.glob("*.md") for m in DOCUMENTED.findall(page.read_text())})


def public_modules() -> list[str]:
    return ["pitstop", *pitstop._PUBLIC_MODULES]


@pytest.mark.parametrize("module_name", public_modules())
def test_every_exported_name_exists(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = module.__all__
    assert len(set(exported)) == len(exported)
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []
    private = [name for name in exported if name.startswith("_") and not name.endswith("__")]
    assert private == []


def test_pitstop_exports_exactly_what_it_binds() -> None:
    # Like httpx's test: a name imported into pitstop for its own use must be private, or
    # users start importing it from here. The lazy names count as bound.
    bound = {
        name for name, value in vars(pitstop).items()
        if not name.startswith("_") and name not in NOT_EXPORTS
        and not isinstance(value, types.ModuleType)
    }
    dunders = {name for name in pitstop.__all__ if name.startswith("__")}  # __version__
    assert sorted(bound | set(pitstop._LAZY) | dunders) == sorted(pitstop.__all__)


@pytest.mark.parametrize("path", documented())
def test_every_documented_object_is_exported_by_a_public_module(path: str) -> None:
    module_name, _, name = path.rpartition(".")
    assert module_name in public_modules(), (
        f"the docs document {path}, but {module_name} is not a public module: export {name} "
        f"from one (pitstop._PUBLIC_MODULES) and document it there"
    )
    module = importlib.import_module(module_name)
    assert name in module.__all__, f"{path} is documented but not in {module_name}.__all__"


def test_every_name_pitstop_exports_is_documented() -> None:
    paths = set(documented())
    undocumented = [name for name in pitstop.__all__
                    if f"pitstop.{name}" not in paths and not name.startswith("__")]
    assert undocumented == []


def test_public_modules_are_not_internal_folders() -> None:
    # pitstop.ui itself is public for create_app (#30: mounting the inspector in a service);
    # its pages, API and templates (pitstop.ui.*) are not.
    internal = ("pitstop.store.", "pitstop.cli", "pitstop.ui.", "pitstop.display")
    assert [m for m in pitstop._PUBLIC_MODULES if m.startswith(internal)] == []
