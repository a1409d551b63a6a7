"""One lazy-attribute mechanism for pitstop's packages (module ``__getattr__``, PEP 562).

``pitstop`` and ``pitstop.serde`` name their public objects without importing the modules
that define them, so ``pitstop runs`` never pays for the codec (tests/test_cli_imports.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, namespace: dict[str, Any],
                 homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name in ``homes`` is imported from its
    submodule on first use and cached in ``namespace`` (the package's globals); any other
    name is tried as a submodule (``pkg.sub`` without ``import pkg.sub`` first)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
