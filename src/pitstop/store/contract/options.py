"""Store options: each one's type and range, checked once when a store opens.

An option comes from a URL's query string (``sqlite:///runs.db?busy_timeout=5``) or as a
keyword (``open_store(url, busy_timeout=5)``); either way it is checked here before the store
touches a file or a server, so ``busy_timeout=nan`` or ``compress_threshold=-5`` is one
:class:`~pitstop.UnsupportedStoreError` naming the option, never a store that misbehaves later
(a NaN timeout that never expires, a pool that waits for a schema the server cannot have).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import UnsupportedStoreError

# PostgreSQL cuts identifiers to NAMEDATALEN - 1 bytes without an error, so two schema names
# that differ only after that many bytes would be one schema: refused instead.
PG_IDENTIFIER_MAX_BYTES = 63


class _Bad(ValueError):
    """An option value out of its range: the text says what it must be (and, when it says
    it, what the value is; else the value is shown after it)."""

    def __init__(self, text: str, *, says_value: bool = False) -> None:
        super().__init__(text)
        self.says_value = says_value


@dataclass(frozen=True, slots=True)
class _Option:
    parse: Callable[[str], Any]
    """From the URL's text to a value (``ValueError``: not of the option's type)."""
    check: Callable[[Any], None]
    """Raises :class:`_Bad` (what the value must be) for a value out of range or of the
    wrong type."""


def _number(value: Any, what: str, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad(f"must be {what}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise _Bad(f"must be {what}")


def _seconds(*, positive: bool = False) -> _Option:
    what = "a number of seconds " + ("> 0" if positive else ">= 0")
    return _Option(float, lambda v: _number(v, what, positive=positive))


def _count(minimum: int, what: str) -> _Option:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _Bad(f"must be {what}")

    return _Option(int, check)


def _bytes_or_none(text: str) -> int | None:
    return None if text.lower() in ("none", "off", "") else int(text)


def _threshold_check(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise _Bad("must be a size in bytes >= 0, or none")


def _durability(value: Any) -> None:
    if value not in ("full", "normal"):
        raise _Bad("must be 'full' or 'normal'")


def _text(value: Any) -> None:
    if not isinstance(value, str):
        raise _Bad("must be text")


def _blobs_text(text: str) -> str | bool:
    """``?blobs=off`` (or none, false): large values stay in the database file."""
    return False if text.lower() in ("none", "off", "false") else text


def _blobs(value: Any) -> None:
    if isinstance(value, str) and not value:
        raise _Bad("must name a directory or a blob store URL")


def _encryption(value: Any) -> None:
    if isinstance(value, str) and not (value.startswith("env:") and len(value) > 4):
        raise _Bad("must be env:VARIABLE (the key ring in an environment variable) or a "
                   "pitstop.Encryption")


def _chunk_hash(value: Any) -> None:
    if value not in ("xxh3", "sha256"):
        raise _Bad("must be 'xxh3' or 'sha256'")


def _schema(value: Any) -> None:
    if not isinstance(value, str) or not value or "\0" in value:
        raise _Bad("must be a schema name (not empty)")
    size = len(value.encode())
    if size > PG_IDENTIFIER_MAX_BYTES:
        raise _Bad(
            f"must be at most {PG_IDENTIFIER_MAX_BYTES} bytes, not {size}: PostgreSQL cuts "
            "longer names silently, so stores whose names differ only after that would be one",
            says_value=True,
        )


OPTIONS: dict[str, _Option] = {
    "durability": _Option(str, _durability),
    "compress_threshold": _Option(_bytes_or_none, _threshold_check),
    "busy_timeout": _seconds(),
    "blobs": _Option(_blobs_text, _blobs),
    "blob_threshold": _count(0, "a size in bytes >= 0"),
    "chunk_hash": _Option(str, _chunk_hash),
    "encryption": _Option(str, _encryption),
    # PostgreSQL only
    "schema": _Option(str, _schema),
    "pool_min": _count(0, "a whole number >= 0"),
    "pool_max": _count(1, "a whole number >= 1"),
    "statement_timeout": _seconds(),
    "connect_timeout": _seconds(positive=True),
    "application_name": _Option(str, _text),
}
"""Every option pitstop reads from a store URL, by name."""


def parse_option(where: str, name: str, text: str) -> Any:
    """The value of option ``name`` given as ``text`` in a URL, checked (see :func:`check`)."""
    option = OPTIONS[name]
    try:
        value = option.parse(text)
    except ValueError:
        value = text
    check(where, {name: value})
    return value


def check(where: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`~pitstop.UnsupportedStoreError` (``where: option 'x' must be ...``) for the
    first option in ``options`` whose value is of the wrong type or out of range. Names this
    module does not know (a ``serializer``, a ``BlobStore``) are left to their users."""
    for name, value in options.items():
        option = OPTIONS.get(name)
        if option is None:
            continue
        if name in ("blobs", "encryption") and not isinstance(value, str):
            continue  # a BlobStore or Encryption object (or None)
        try:
            option.check(value)
        except _Bad as exc:
            shown = "" if exc.says_value else f", not {_shown(value)}"
            raise UnsupportedStoreError(f"{where}: option {name!r} {exc}{shown}") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["OPTIONS", "PG_IDENTIFIER_MAX_BYTES", "check", "parse_option"]
