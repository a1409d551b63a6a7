"""``create_app``: the inspector as an ASGI application, to serve or to mount.

One FastAPI app holds the pages, the JSON API and the static files. In front of it sits
:class:`Gate`, a plain ASGI middleware that authenticates every request (bearer header or
session cookie, when tokens are set), refuses cross-site and CSRF-less state changes, and
adds the security headers (a CSP that allows only this server's own script and styles) and a
``Server-Timing`` header with the time the request took on the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    CheckpointNotFoundError,
    ConflictError,
    InputError,
    PitstopError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    SerializationError,
)
from ..store import Store
from . import api, pages
from .actions import ActionError, Actions
from .context import IDENTITY, UI
from .live import Ticker
from .security import (
    COOKIE,
    CSRF_HEADER,
    Guard,
    Identity,
    LoginThrottle,
    cross_site,
    parse_tokens,
)

if TYPE_CHECKING:
    from ..runtime import Workflow

log = logging.getLogger("pitstop.ui")

HERE = Path(__file__).parent
LOCAL = Identity("local", "local")
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_PUBLIC = ("/static/", "/login", "/logout", "/favicon.ico")
DEFAULT_MAX_BODY = 1 << 20
"""Bytes a request body may have unless told otherwise: an input's payload is JSON a person
or a script sends, and the server read any size whole (200 MiB: 662 MiB of memory)."""

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def create_app(
    store: Store,
    *,
    token: str | Iterable[str] | Mapping[str, str] | None = None,
    read_only: bool = False,
    workflows: Iterable[Workflow] = (),
    poll_interval: float = 1.0,
    max_body: int = DEFAULT_MAX_BODY,
    throttle: LoginThrottle | None = None,
) -> FastAPI:
    """The inspector for ``store`` as an ASGI app (FastAPI), e.g. to mount in a service::

        app.mount("/pitstop", pitstop.ui.create_app(store, token=os.environ["TOKEN"]))

    ``token``: one secret, ``"name:secret"``, several of those (a list, or separated by
    commas) or a ``{name: secret}`` mapping; then every page and API call needs one (the
    name is what actions record as who did them). ``read_only`` refuses every action.
    ``workflows`` lets the inspector resume runs of those workflows itself after an input or
    a fork; without, it says that a worker must pick them up. ``poll_interval`` is how often
    live pages look for changes (PostgreSQL stores also wake them by LISTEN/NOTIFY).
    ``max_body``: bytes a request body may have (an input's payload, a fork's edits); a
    larger one is answered 413 before it is read. ``throttle``: how failed logins are
    slowed down (:class:`~pitstop.ui.security.LoginThrottle`: after 5 failures from one
    address, 429 with ``Retry-After`` for 1 s, doubling per failure up to 5 minutes).

    The app reads the store through its public API and never holds a run's lease, except
    while it executes a run of one of ``workflows``.
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body must be a whole number of bytes >= 1, not {max_body!r}")
    guard = Guard(parse_tokens(token), throttle)
    ui = UI(store=store, guard=guard, actions=Actions(store, workflows), read_only=read_only,
            ticker=Ticker(store, poll_interval), max_body=max_body)
    interval = min(poll_interval, 1.0)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Also started by the first request (Gate): a mounted app gets no lifespan events.
        if not read_only:
            ui.actions.start_watching(interval)
        yield
        ui.actions.stop_watching()

    app = FastAPI(
        lifespan=lifespan,
        title="pitstop inspector",
        version=_version(),
        description="Runs, checkpoints and approvals of a pitstop store.",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.pitstop_ui = ui
    app.state.pitstop_templates = pages.templates()
    app.include_router(api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _errors(app)
    app.add_middleware(Gate, ui=ui, watch_interval=None if read_only else interval)
    return app


def _version() -> str:
    from .. import __version__

    return __version__


# -- errors ----------------------------------------------------------------------------------------


def _status_of(exc: Exception) -> int:
    if isinstance(exc, ActionError):
        return exc.status
    if isinstance(exc, RunNotFoundError | CheckpointNotFoundError):
        return 404
    if isinstance(exc, InputError | ConflictError | RunExistsError | RunBusyError):
        return 409
    if isinstance(exc, SerializationError | ValueError | UnicodeError):
        return 422
    return 500


def _message(exc: Exception) -> str:
    if isinstance(exc, RunNotFoundError | CheckpointNotFoundError):
        return str(exc) or "not found"
    return str(exc)


def _wants_json(request: Request) -> bool:
    path = _relative(request.scope)
    return path.startswith("/api/") or path == "/openapi.json"


def problem(status: int, message: str, detail: list[Any] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"message": message, "status": status}
    if detail is not None:
        body["detail"] = detail
    return JSONResponse(body, status_code=status)


def _errors(app: FastAPI) -> None:
    async def on_error(request: Request, exc: Exception) -> Response:
        status = _status_of(exc)
        if status == 500:
            log.error("internal error on %s %s", request.method, request.url.path,
                      exc_info=exc)
            message = "internal error (the server's log has the details)"
        else:
            message = _message(exc)
        if _wants_json(request):
            return problem(status, message)
        return pages.error_page(request, status, message)

    async def on_invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = json.loads(json.dumps(exc.errors(), default=str))
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
        message = f"{where}: {first.get('msg', 'invalid')}"
        if _wants_json(request):
            return problem(422, message, [{k: e.get(k) for k in ("loc", "msg", "type")}
                                          for e in errors])
        return pages.error_page(request, 422, message)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = exc.status_code
        message = str(exc.detail) if exc.detail else "error"
        if status == 400:  # FastAPI's "error parsing the body": a bad payload, like the rest
            status, message = 422, "body: not valid JSON (or not UTF-8)"
        if _wants_json(request):
            response: Response = problem(status, message)
        else:
            response = pages.error_page(request, status, message)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_http)
    for kind in (ActionError, PitstopError, ValueError, UnicodeError, Exception):
        app.add_exception_handler(kind, on_error)


# -- the gate ------------------------------------------------------------------------------------


def _relative(scope: Scope) -> str:
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class Gate:
    """Authentication, CSRF and security headers for every HTTP request of the app."""

    def __init__(self, app: ASGIApp, ui: UI, watch_interval: float | None = None) -> None:
        self.app = app
        self.ui = ui
        self.watch_interval = watch_interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.watch_interval is not None:  # resume runs made ready elsewhere (idempotent)
            self.ui.actions.start_watching(self.watch_interval)
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        path = _relative(scope)
        guard = self.ui.guard
        method = scope.get("method", "GET")
        identity: Identity | None = LOCAL
        if guard.required:
            client = scope["client"][0] if scope.get("client") else "unknown"
            offered = headers.get("authorization")
            if offered or (method == "POST" and path == "/login"):
                wait = guard.throttle.retry_after(client)
                if wait is not None:
                    await self._refuse(
                        scope, receive, send, 429,
                        f"too many failed logins from {client}; try again in {wait} s",
                        started, {"retry-after": str(wait)})
                    return
            identity = guard.bearer(offered) or guard.cookie(
                _cookie(headers.get("cookie", ""), COOKIE))
            if offered and identity is None:
                guard.throttle.failed(client)
        public = path.startswith(_PUBLIC)
        refusal: tuple[int, str] | None = None
        if identity is None and not public:
            refusal = (401, "a valid token is needed (Authorization: Bearer TOKEN, or log in)")
        elif method not in _SAFE:
            refusal = self._cross_site(headers, identity, public)
        if refusal is None and method not in _SAFE:
            bounded = await self._bounded_body(headers, receive)
            if bounded is None:
                refusal = (413, f"the request body is larger than {self.ui.max_body:,} bytes, "
                                "the inspector's limit (pitstop ui --max-body)")
            else:
                receive = bounded
        if refusal is not None:
            await self._refuse(scope, receive, send, *refusal, started)
            return
        scope[IDENTITY] = identity or Identity("anonymous", "local")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(SECURITY_HEADERS)
                if not path.startswith("/static/"):
                    extra.append((b"cache-control", b"no-store"))
                took = (time.perf_counter() - started) * 1000
                extra.append((b"server-timing", f"app;dur={took:.2f}".encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _bounded_body(self, headers: Mapping[str, str], receive: Receive
                            ) -> Receive | None:
        """The request's body read whole (it is at most ``max_body`` bytes), replayed to the
        app; None if it is larger: refused on its declared length before a byte is read, or
        once what arrives (a chunked body declares none) passes the limit."""
        limit = self.ui.max_body
        declared = headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > limit:
            return None
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app sees it
                return _replay([message], receive)
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > limit:
                return None
            parts.append(body)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(parts), "more_body": False}
        return _replay([whole], receive)

    def _cross_site(self, headers: Mapping[str, str], identity: Identity | None,
                    public: bool) -> tuple[int, str] | None:
        if cross_site(headers, headers.get("host")):
            return 403, "cross-site requests are refused"
        if public or identity is None or identity.via == "bearer":
            return None  # a browser never adds a bearer header on its own
        if self.ui.guard.csrf_ok(identity, headers.get(CSRF_HEADER)):
            return None
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if identity.via == "local" and content_type == "application/json":
            return None  # a cross-site page cannot send JSON without a preflight
        return 403, "missing or wrong CSRF token (send the X-Pitstop-CSRF header)"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int,
                      message: str, started: float,
                      headers: Mapping[str, str] | None = None) -> None:
        request = Request(scope, receive)
        response: Response
        if status == 401 and not _wants_json(request):
            response = pages.login_page(request, status=401)
        elif status == 429 and _relative(scope) == "/login":
            response = pages.login_page(request, status=429, error=message[:1].upper()
                                        + message[1:] + ".", target="/")
        else:
            response = problem(status, message)
        for name, text in (headers or {}).items():
            response.headers[name] = text
        if status == 401:
            response.headers["www-authenticate"] = 'Bearer realm="pitstop"'
        for key, value in SECURITY_HEADERS:
            response.headers[key.decode()] = value.decode()
        response.headers["cache-control"] = "no-store"
        took = (time.perf_counter() - started) * 1000
        response.headers["server-timing"] = f"app;dur={took:.2f}"
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then whatever ``receive`` gives."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


__all__ = ["DEFAULT_MAX_BODY", "create_app"]
