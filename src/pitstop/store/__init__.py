"""Stores and how to open one from a URL: the public face of the store.

What a program uses is exported here (and the most used names again from ``pitstop``). The
folders below are the store's layers, internal and free to change: ``contract`` (what every
store promises), ``encoding`` (values as bytes), ``engine`` (the SQL), ``transfer``
(export and import) and ``backends`` (SQLite, memory, PostgreSQL); tests/test_layers.py
keeps their imports in that order.

``open_store()`` with no argument opens ``$PITSTOP_STORE``, else ``sqlite:///pitstop.db`` in
the current directory. Backends are imported only when their scheme is used, so the
PostgreSQL driver is needed only by those who use PostgreSQL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from ..errors import StoreError, UnsupportedStoreError
from ..lazy import lazy_getattr
from .contract.base import (
    UNSET,
    Durability,
    Input,
    Lease,
    PreparedSave,
    Problem,
    Problems,
    PruneReport,
    RetentionPolicy,
    RunList,
    Store,
    StoreStats,
)
from .contract.options import parse_option
from .contract.save import RunControl, SaveOptions, SaveRequest
from .contract.urls import check_text, redact

if TYPE_CHECKING:
    from .backends.vacuum import Space, VacuumReport, free_bytes, free_space, vacuum
    from .encoding.objects import S3BlobStore
    from .encoding.sealed import Encryption, SealedBlobStore

# Reclaiming space reads a backend's files and tables, object storage needs obstore and
# sealing cryptography: each imported on first use.
__getattr__ = lazy_getattr(__name__, globals(), {
    **dict.fromkeys(
        ("Space", "VacuumReport", "free_bytes", "free_space", "vacuum"), "backends.vacuum"),
    "S3BlobStore": "encoding.objects",
    **dict.fromkeys(("Encryption", "SealedBlobStore"), "encoding.sealed"),
})

DEFAULT_URL = "sqlite:///pitstop.db"

# libpq's key=value connection strings ("host=h dbname=d"): refused, not taken for a path.
_CONNINFO = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options"
    r"|application_name|connect_timeout|target_session_attrs)\s*=",
    re.IGNORECASE,
)
ENV_VAR = "PITSTOP_STORE"


def _sqlite(url: str, options: dict[str, Any]) -> Store:
    from .backends.sqlite import SQLiteStore

    if not url.startswith("sqlite:///"):
        raise UnsupportedStoreError(
            f"{url!r}: SQLite URLs look like sqlite:///relative.db or sqlite:////absolute.db"
        )
    path = unquote(url[len("sqlite:///") :])
    if path in ("", ":memory:"):
        return _memory(url, options)
    return SQLiteStore(path, url=url, **options)


def _memory(url: str, options: dict[str, Any]) -> Store:
    from .backends.memory import MemoryStore

    if options.get("encryption") is not None:
        # Refused rather than dropped: code that asked for encryption must not run unsealed
        # believing otherwise, and a memory store has nothing at rest to seal.
        raise UnsupportedStoreError(
            f"{url}: a memory store keeps nothing at rest, so encryption= has nothing to "
            "seal; drop it there, or use a file (sqlite:///runs.db)"
        )
    return MemoryStore(**_pick(options, "serializer", "compress_threshold", "chunk_hash"))


def _postgres(url: str, options: dict[str, Any]) -> Store:
    try:
        from .backends.postgres import PostgresStore
    except ImportError as exc:
        raise StoreError(
            f"{redact(url)}: the PostgreSQL store needs the postgres extra: "
            f"pip install 'pitstop[postgres]' ({exc})"
        ) from exc
    return PostgresStore(url, **options)


_SCHEMES: dict[str, Callable[[str, dict[str, Any]], Store]] = {
    "sqlite": _sqlite,
    "memory": _memory,
    "postgresql": _postgres,
    "postgres": _postgres,
}


def _pick(options: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in names}


# The options a SQLite (or memory://) URL's query string may set; see options.py.
_QUERY_OPTIONS = (
    "durability",
    "compress_threshold",
    "busy_timeout",
    "blobs",
    "blob_threshold",
    "chunk_hash",
    "encryption",
)


def open_store(url: str | None = None, **options: Any) -> Store:
    """Open the store named by ``url`` (default: ``$PITSTOP_STORE``, else ``sqlite:///pitstop.db``).

    Supported: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``memory://``,
    ``postgresql://user@host/db`` (with ``pitstop[postgres]``); a plain file path means a
    SQLite file. Options may also be given in the query string of SQLite URLs, e.g.
    ``sqlite:///runs.db?durability=full``. Keyword options (``serializer=``,
    ``durability=``, ``compress_threshold=``...) are passed to the backend.
    """
    url = url or os.environ.get(ENV_VAR) or DEFAULT_URL
    check_text(url)
    if "://" not in url:
        if url.startswith(("sqlite:", "memory:", "postgres")):
            raise UnsupportedStoreError(f"{url!r}: malformed store URL (missing '//')")
        if _CONNINFO.match(url):
            # A libpq "host=... dbname=..." string would otherwise become a SQLite file of
            # that name, and the run's checkpoints would go there without a word.
            raise UnsupportedStoreError(
                f"{redact(url)!r} looks like a libpq connection string, not a store URL; "
                "name a PostgreSQL store by URL: postgresql://USER@HOST:PORT/DBNAME"
            )
        url = "sqlite:///" + url
    scheme = url.split("://", 1)[0].lower()
    opener = _SCHEMES.get(scheme)
    if opener is None:
        supported = ", ".join(f"{s}://" for s in _SCHEMES)
        raise UnsupportedStoreError(
            f"unknown store URL scheme {scheme!r} in {redact(url)!r}; supported: {supported}"
        )
    if scheme in ("sqlite", "memory") and "?" in url:
        base, query = url.split("?", 1)
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key not in _QUERY_OPTIONS:
                raise UnsupportedStoreError(
                    f"unknown option {key!r} in {url!r}; known: {', '.join(_QUERY_OPTIONS)}"
                )
            options.setdefault(key, parse_option(redact(base), key, value))
        url = base
    return opener(url, options)


def register_scheme(scheme: str, opener: Callable[[str, dict[str, Any]], Store]) -> None:
    """Make ``open_store`` understand another URL scheme (for third-party backends)."""
    _SCHEMES[scheme.lower()] = opener


__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "UNSET",
    "Durability",
    "Encryption",
    "Input",
    "Lease",
    "PreparedSave",
    "Problem",
    "Problems",
    "PruneReport",
    "RetentionPolicy",
    "RunControl",
    "RunList",
    "S3BlobStore",
    "SaveOptions",
    "SaveRequest",
    "SealedBlobStore",
    "Space",
    "Store",
    "StoreStats",
    "VacuumReport",
    "free_bytes",
    "free_space",
    "open_store",
    "register_scheme",
    "vacuum",
]
