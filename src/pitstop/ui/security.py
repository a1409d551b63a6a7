"""Who may use the inspector, and proof that a state-changing request came from its pages.

Without tokens the inspector trusts whoever can reach it (it binds to loopback, and refuses
another address without a token). With tokens every request names one: an
``Authorization: Bearer`` header (scripts), or the session cookie the login form sets
(HttpOnly, SameSite=Strict). The cookie holds an HMAC of the token, never the token itself,
and survives a restart of the server as long as the token is the same.

Cross-site requests: a state-changing request is refused when the browser says it comes from
another site (``Sec-Fetch-Site``, ``Origin``); one carried by the cookie (or by nothing, on a
token-less local server) must also bear the CSRF token the pages embed, or be JSON, which a
cross-site form cannot send and a cross-site script cannot send without a preflight this
server never answers.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

COOKIE = "pitstop_session"
CSRF_HEADER = "x-pitstop-csrf"
MIN_TOKEN = 8
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    """The token's name, or ``local`` on a server without tokens: what actions record."""
    via: Literal["local", "bearer", "cookie"]


def parse_tokens(specs: str | Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``{name: secret}`` from ``"secret"``, ``"name:secret"``, several of those separated by
    commas, or a mapping. A bare secret is named ``token`` (errors call it "the token").
    ValueError if one is too short or two share a name."""
    if specs is None:
        return {}
    if isinstance(specs, Mapping):
        pairs = [(str(k), str(v), True) for k, v in specs.items()]
    else:
        items = [specs] if isinstance(specs, str) else list(specs)
        pairs = []
        for item in items:
            for part in item.split(","):
                spec = part.strip()
                if not spec:
                    continue
                name, sep, secret = spec.partition(":")
                named = bool(sep) and bool(_NAME.match(name))
                if not named:
                    name, secret = "token", spec
                pairs.append((name, secret, named))
    tokens: dict[str, str] = {}
    for name, secret, named in pairs:
        if not _NAME.match(name):
            raise ValueError(f"token name {name!r}: use letters, digits, '_', '.' or '-'")
        if len(secret) < MIN_TOKEN:
            # Say whose token, never the secret itself (a bare one has no name of its own).
            which = f"the secret of token {name!r}" if named else "the token"
            raise ValueError(f"{which} has {len(secret)} characters; use at least {MIN_TOKEN} "
                             "(e.g. --token \"$(openssl rand -hex 16)\")")
        if name in tokens:
            raise ValueError(f"two tokens are named {name!r} (name them: --token NAME:SECRET)")
        tokens[name] = secret
    return tokens


class Guard:
    """Checks credentials and CSRF tokens for one app."""

    def __init__(self, tokens: Mapping[str, str],
                 throttle: LoginThrottle | None = None) -> None:
        self.tokens = dict(tokens)
        self.throttle = throttle or LoginThrottle()
        # Per process: CSRF tokens of a previous run of the server stop working, cookies not.
        self._csrf_key = os.urandom(32)

    @property
    def required(self) -> bool:
        return bool(self.tokens)

    def bearer(self, header: str | None) -> Identity | None:
        if not header or header[:7].lower() != "bearer ":
            return None
        offered = header[7:].strip().encode()
        found = None
        for name, secret in self.tokens.items():  # every token compared: no timing hint
            if hmac.compare_digest(offered, secret.encode()):
                found = Identity(name, "bearer")
        return found

    def login(self, offered: str) -> Identity | None:
        return self.bearer("Bearer " + offered)

    def cookie_value(self, identity: Identity) -> str:
        return f"{identity.name}.{self._seal(identity.name)}"

    def cookie(self, value: str | None) -> Identity | None:
        if not value or "." not in value:
            return None
        name, _, seal = value.rpartition(".")
        if name not in self.tokens:
            return None
        if not hmac.compare_digest(seal.encode(), self._seal(name).encode()):
            return None
        return Identity(name, "cookie")

    def _seal(self, name: str) -> str:
        key = self.tokens[name].encode()
        return hmac.new(key, b"pitstop-ui session " + name.encode(), hashlib.sha256).hexdigest()

    def csrf(self, identity: Identity) -> str:
        msg = f"{identity.via}:{identity.name}".encode()
        return hmac.new(self._csrf_key, msg, hashlib.sha256).hexdigest()

    def csrf_ok(self, identity: Identity, offered: str | None) -> bool:
        return bool(offered) and hmac.compare_digest(
            (offered or "").encode(), self.csrf(identity).encode()
        )


class LoginThrottle:
    """Failed logins (a wrong token in the login form or a bearer header) counted per client
    address: after ``free`` of them, the client is refused (429, ``Retry-After``) for
    ``first_lock`` seconds, doubling with each failure after, up to ``max_lock``. A
    successful login clears the count; so does ``forget`` seconds without a failure.

    A token of 8 characters or more cannot be guessed at the ~200 tries a second the server
    answered unthrottled, but a short or reused one could: this makes each guess after the
    first few cost seconds. Behind a proxy every client has the proxy's address, so a
    guesser there locks everyone out for a while (the price of not trusting a forwarded
    header the client sets).
    """

    def __init__(self, *, free: int = 5, first_lock: float = 1.0, max_lock: float = 300.0,
                 forget: float = 900.0, clients: int = 10_000) -> None:
        self.free = free
        self.first_lock = first_lock
        self.max_lock = max_lock
        self.forget = forget
        self.clients = clients
        """Clients remembered at most (the oldest forgotten first): bounded memory."""
        self._failures: OrderedDict[str, tuple[int, float, float]] = OrderedDict()
        self._lock = threading.Lock()  # pages run in a thread pool

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until ``client`` may try again, or None: it may now."""
        with self._lock:
            found = self._failures.get(client)
        if found is None:
            return None
        _, _, until = found
        left = until - time.monotonic()
        return math.ceil(left) if left > 0 else None

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            count, last, until = self._failures.pop(client, (0, now, 0.0))
            if now - last > self.forget:
                count = 0
            count += 1
            if count > self.free:
                until = now + min(self.max_lock, self.first_lock * 2 ** (count - self.free - 1))
            self._failures[client] = (count, now, until)
            while len(self._failures) > self.clients:
                self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)


def cross_site(headers: Mapping[str, str], host: str | None) -> bool:
    """Whether the browser says this request comes from another site than ours."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:  # what browsers send now; it outranks Origin, which a
        return fetch_site not in ("same-origin", "none")  # referrer policy may null
    origin = headers.get("origin")
    if origin is None:
        return False
    if origin == "null":
        return True
    return origin.partition("://")[2].rstrip("/").lower() != (host or "").lower()


__all__ = ["COOKIE", "CSRF_HEADER", "Guard", "Identity", "cross_site", "parse_tokens"]
