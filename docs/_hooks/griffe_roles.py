"""A griffe extension for the API reference: Sphinx roles in docstrings become links, and
interactive examples (``>>>`` lines) become highlighted code blocks.

pitstop's docstrings cross-reference with ``:class:`~pitstop.Store``` and friends. Rendered
as they are, the role markup shows; here each becomes inline code, linked (through
mkdocs-autorefs) to the reference entry of the public name it starts from. Only names in
``pitstop.__all__`` are linked, since every one of them has an entry (tests/test_docs.py
checks that); anything else stays plain code, so a reference to a private helper never breaks
the strict build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

import pitstop

_EXAMPLE = re.compile(r"(?m)^(?:(?:>>>|\.\.\.)(?: .*)?\n?)+")
_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`(~?)([\w.]+)`")
_PUBLIC = frozenset(pitstop.__all__)


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1) == "~", match.group(2)
    parts = target.split(".")
    shown = parts[-1] if short else target
    if parts[0] == "pitstop" and not any(p.startswith("_") for p in parts):
        for i, part in enumerate(parts[1:], start=1):
            if part in _PUBLIC:
                member = ".".join(parts[i:])
                return f"[`{shown if short else member}`][pitstop.{part}]"
    return f"`{shown}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(_replace, obj.docstring.value)
            obj.docstring.value = _EXAMPLE.sub(
                lambda m: f"```pycon\n{m.group(0).rstrip()}\n```\n", text
            )
