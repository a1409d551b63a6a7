"""Store URLs as they may be shown: with passwords hidden.

Every message, log line and ``repr`` that names a store uses :func:`redact`, whichever
backend the URL is for, so a password never reaches a terminal or a log file.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# ``password=...`` and ``sslpassword=...``: in a URL's query string or a key=value conninfo,
# bare or single-quoted.
_SECRET_PARAM = re.compile(r"((?:^|[\s&?])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)")


def check_text(url: str) -> None:
    """Refuse a URL holding a lone surrogate (how Python decodes an environment variable
    of bytes that are not UTF-8): no parser of it could take it, nor a server."""
    if url.isascii():
        return
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        from ...errors import UnsupportedStoreError

        raise UnsupportedStoreError(
            f"{url!r}: a store URL must be text; this one holds bytes that are not UTF-8"
        ) from None


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (userinfo and ``password=`` options)."""
    if "://" in url:
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:  # malformed (a bracketed host that is no IP): hide all userinfo
            return _SECRET_PARAM.sub(r"\1***", re.sub(r"(://)[^/?#]*@", r"\1***@", url))
        if password is not None:
            userinfo, _, hosts = parts.netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            url = urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))
    return _SECRET_PARAM.sub(r"\1***", url)


__all__ = ["check_text", "redact"]
