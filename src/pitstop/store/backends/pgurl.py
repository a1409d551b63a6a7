"""A PostgreSQL store's URL: pitstop's own query options apart from libpq's, the TCP
settings that notice a vanished server, and the server as messages name it. Kept apart from
:mod:`.postgres` so the store class reads as connections, transactions and statements."""

from __future__ import annotations

import math
import os
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pitstop.errors import UnsupportedStoreError
from pitstop.store.contract.options import OPTIONS, parse_option
from pitstop.store.contract.urls import check_text, redact

# pitstop's own URL query options (parsed and checked by options.py); anything else is libpq's.
_URL_OPTIONS = frozenset(OPTIONS)


def tcp_defaults(connect_timeout: float) -> dict[str, str]:
    """libpq settings used unless the URL sets them, so a server that vanishes from the
    network (no RST, no FIN) is noticed in about ``connect_timeout`` instead of the many
    minutes TCP would wait by default: unacknowledged data gives up after it
    (``tcp_user_timeout``), and an idle or waiting connection is probed from then on."""
    seconds = max(1, math.ceil(connect_timeout))
    return {
        "keepalives": "1",
        "keepalives_idle": str(seconds),
        "keepalives_interval": str(max(1, seconds // 3)),
        "keepalives_count": "3",
        "tcp_user_timeout": str(seconds * 1000),
    }


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of text (a driver message can span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def split_url(url: str, safe_url: str) -> tuple[str, dict[str, Any]]:
    """The libpq conninfo (our options removed) and pitstop's options read from the URL."""
    check_text(url)
    if "://" not in url:
        return url, {}  # a key=value conninfo string: options come as keywords only
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:  # a bracketed host that is no IP address, text not UTF-8
        raise UnsupportedStoreError(f"{safe_url}: malformed URL ({exc})") from None
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise UnsupportedStoreError(f"{safe_url}: not a postgresql:// URL")
    kept: list[tuple[str, str]] = []
    options: dict[str, Any] = {}
    for key, value in query:
        if key not in _URL_OPTIONS:
            kept.append((key, value))
            continue
        options[key] = parse_option(safe_url, key, value)
    return urlunsplit(parts._replace(query=urlencode(kept))), options


def conninfo_params(conninfo: str, safe_url: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise UnsupportedStoreError(f"{safe_url}: {redact(one_line(exc))}") from None


def describe_target(params: dict[str, Any]) -> str:
    """``host:port/db`` for messages, with libpq's defaults filled in."""
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    user = params.get("user") or os.environ.get("PGUSER") or ""
    db = params.get("dbname") or os.environ.get("PGDATABASE") or user
    where = f"{host}:{port}" if not str(host).startswith("/") else f"{host} (socket, port {port})"
    return f"{where}/{db}"
