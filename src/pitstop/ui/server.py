"""Serving the inspector: what ``pitstop ui`` runs.

It binds to loopback unless told otherwise, and refuses another address without a token:
the inspector can send inputs and cancel runs, so anyone who can reach it can steer them.
Without a token it also accepts only loopback ``Host`` headers, so a web page elsewhere
cannot reach it through a DNS name that resolves to 127.0.0.1 (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..runtime import Workflow
    from ..store import Store

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, tokens: object) -> None:
    """ValueError (one line) for a non-loopback address without a token."""
    if not tokens and not is_loopback(host):
        raise ValueError(
            f"refusing to serve on {host} without a token: anyone who reaches it could "
            "steer runs; give --token (or $PITSTOP_UI_TOKEN), or bind 127.0.0.1"
        )


def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | Sequence[str] | None = None,
    read_only: bool = False,
    workflows: Sequence[Workflow] = (),
    announce: Literal["text", "json", "none"] = "text",
    max_body: int = 1 << 20,
) -> None:
    """Serve the inspector until interrupted (Ctrl-C / SIGTERM)."""
    import uvicorn
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    from .app import create_app
    from .security import parse_tokens

    tokens = parse_tokens(token)
    check_exposure(host, tokens)
    app = create_app(store, token=tokens, read_only=read_only, workflows=workflows,
                     max_body=max_body)
    served = app
    if not tokens:
        allowed = [*LOOPBACK_NAMES, host]
        served = TrustedHostMiddleware(app, allowed_hosts=allowed)  # type: ignore[assignment]
    config = uvicorn.Config(served, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=2, proxy_headers=False)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    if announce == "json":
        print(json.dumps({"url": f"http://{shown}:{port}/", "store": store.url,
                          "read_only": read_only, "tokens": sorted(tokens),
                          "workflows": [wf.name for wf in workflows]}), flush=True)
    elif announce == "text":
        mode = ", read-only" if read_only else ""
        auth = f", {len(tokens)} token(s)" if tokens else ""
        print(f"pitstop ui: http://{shown}:{port}/ on {store.url}{mode}{auth}", flush=True)
    server.run()


__all__ = ["check_exposure", "is_loopback", "serve"]
