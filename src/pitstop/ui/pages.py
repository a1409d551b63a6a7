"""The HTML pages: runs, inbox, one run; the login form; the live-update stream.

Pages are rendered on the server from Jinja2 templates with autoescaping on, so every value
from a store is text in the page, never markup. Each page has a live region that the script
refreshes from ``?fragment=1`` of the same URL when ``/events`` says it changed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, Query
from fastapi.templating import Jinja2Templates
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from ..display.state import compact
from ..display.text import age, duration, human_bytes
from ..errors import PitstopError
from ..model import RunStatus
from . import langgraph_view, live, values, views
from .context import IDENTITY, UI, client_of, ui_of
from .graph import LANE, ROW
from .security import COOKIE, Identity

router = APIRouter(include_in_schema=False)


# -- rendering -------------------------------------------------------------------------------------


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: datetime | None) -> str:
    if value is None:
        return "-"
    text = age(value)
    return text if text.startswith("in ") else f"{text} ago"


def _short(value: str | None) -> str:
    """The short id ``pitstop history`` shows (the end of LangGraph's own id for a LangGraph
    checkpoint, since the tag that ends the stored id is the same for all of a thread's)."""
    from ..display.text import short

    return short(value)


def templates() -> Jinja2Templates:
    found = Jinja2Templates(directory=str(views_dir()))
    env = found.env
    env.autoescape = True
    env.filters.update(
        when=_when, ago=_ago, short=_short, size=human_bytes, compact=compact,
        quote=lambda v: quote(str(v), safe=""),
        pretty=lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str),
        first_line=lambda v: str(v or "").strip().splitlines()[0] if str(v or "").strip()
        else "",
        seconds=duration,
        epoch=lambda v: _when(datetime.fromtimestamp(float(v), UTC)),
    )
    env.globals.update(LANE=LANE, ROW=ROW, statuses=views.STATUSES)
    return found


def views_dir() -> Any:
    from pathlib import Path

    return Path(__file__).parent / "templates"


def _identity(request: Request) -> Identity:
    found: Identity = request.scope.get(IDENTITY) or Identity("anonymous", "local")
    return found


def render(request: Request, name: str, context: dict[str, Any], status: int = 200
           ) -> HTMLResponse:
    ui: UI = request.app.state.pitstop_ui
    identity = _identity(request)
    base = request.scope.get("root_path", "")
    page = {
        "request": request,
        "base": base,
        "ui": ui,
        "identity": identity,
        "csrf": ui.guard.csrf(identity),
        "read_only": ui.read_only,
        "auth": ui.guard.required,
        "store_url": ui.store.url,  # backends redact passwords
        "workflows": sorted(ui.actions.workflows),
        **context,
    }
    engine: Jinja2Templates = request.app.state.pitstop_templates
    try:
        response = engine.TemplateResponse(request, name, page, status_code=status)
    except UnicodeEncodeError:
        # A lone surrogate in a state string (Python holds one, UTF-8 cannot): shown as its
        # escape, ``\\ud800``, rather than the page refused.
        html = engine.get_template(name).render(page)
        return HTMLResponse(html.encode("utf-8", "backslashreplace"), status_code=status)
    assert isinstance(response, HTMLResponse)
    return response


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", {"status": status, "message": message,
                                          "nav": ""}, status)


def login_page(request: Request, *, status: int = 200, error: str = "",
               target: str | None = None) -> HTMLResponse:
    """The login form; after it the browser returns to ``target`` (default: the page that
    was asked for)."""
    base = request.scope.get("root_path", "")
    if target is None:
        target = request.url.path
        if request.url.query:
            target += "?" + request.url.query
        if target.startswith(base + "/login"):
            target = request.query_params.get("next", base + "/")
    return render(request, "login.html", {"next": target, "error": error, "nav": ""}, status)


def _fragment(request: Request) -> bool:
    return request.query_params.get("fragment") == "1"


def _inbox_count(ui: UI) -> int:
    return ui.store.count_runs(status=RunStatus.WAITING).get("waiting", 0)


# -- runs ------------------------------------------------------------------------------------------


def _filters(request: Request) -> views.RunFilter:
    q = request.query_params
    return views.RunFilter.parse(
        statuses=[s for s in q.getlist("status") if s],
        workflow=q.get("workflow") or None,
        meta=[m for m in q.getlist("meta") if m],
        id_prefix=q.get("id") or None,
        since=q.get("since") or None,
        parent=q.get("parent") or None,
    )


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, ui: Annotated[UI, Depends(ui_of)]) -> Response:
    try:
        filters = _filters(request)
    except ValueError as exc:
        return render(request, "runs.html", {"nav": "runs", "filters": views.RunFilter(),
                                             "page": None, "problem": str(exc),
                                             "inbox_count": _inbox_count(ui)}, 422)
    before = request.query_params.get("before") or None
    page = views.list_runs(ui.store, filters, before=before)
    context = {"nav": "runs", "filters": filters, "page": page, "before": before,
               "problem": "", "inbox_count": page["counts"].get("waiting", 0),
               "query": urlencode(filters.query())}
    if _fragment(request):
        return render(request, "_runs_live.html", context)
    return render(request, "runs.html", context)


# -- inbox -----------------------------------------------------------------------------------------


@router.get("/inbox", response_class=HTMLResponse)
def inbox_page(request: Request, ui: Annotated[UI, Depends(ui_of)]) -> Response:
    found = views.inbox(ui.store)
    for row in found["runs"]:
        row["tree"] = values.tree(row["shown"])
    context = {"nav": "inbox", "inbox": found, "inbox_count": found["count"]}
    if _fragment(request):
        return render(request, "_inbox_live.html", context)
    return render(request, "inbox.html", context)


# -- schedules -------------------------------------------------------------------------------------


@router.get("/schedules", response_class=HTMLResponse)
def schedules_page(request: Request, ui: Annotated[UI, Depends(ui_of)]) -> Response:
    """Each schedule: its cron and timezone, paused or not, its next ticks and recent runs."""
    from ..runtime.schedules import schedules

    rows: list[dict[str, Any]] = []
    problem = ""
    try:
        found = schedules(ui.store)
    except PitstopError as exc:  # a store that keeps no schedules says so
        found, problem = [], str(exc)
    for item in found:
        recent = ui.store.runs(id_prefix=f"{item.name}@", workflow=item.workflow, limit=5)
        rows.append({"schedule": item, "upcoming": [] if item.paused else item.upcoming(3),
                     "runs": list(recent)})
    return render(request, "schedules.html",
                  {"nav": "schedules", "schedules": rows, "problem": problem})


# -- one run ---------------------------------------------------------------------------------------


@router.get("/runs/{run_id:path}", response_class=HTMLResponse)
def run_page(
    request: Request,
    ui: Annotated[UI, Depends(ui_of)],
    run_id: str,
    checkpoint: Annotated[str | None, Query()] = None,
    before: Annotated[str | None, Query()] = None,
    against: Annotated[str | None, Query()] = None,
) -> Response:
    store = ui.store
    detail = views.run_detail(store, run_id)
    detail["resuming"] = run_id in ui.actions.resuming
    run = store.get_run(run_id)
    tree = views.history(store, run, before=before or None)
    context: dict[str, Any] = {
        "nav": "runs", "run": detail, "tree": tree, "before": before or "",
        "tree_width": max((g.pixels for g in tree["graph"]), default=LANE),
        "can_resume": run.workflow in ui.actions.workflows,
        "inbox_count": _inbox_count(ui),
        "timeline": views.run_timeline(store, run_id),
    }
    job = views.stream_of(run)
    if job is not None:  # a stream partition: its job's partitions, side by side
        context["stream"] = views.stream_job(store, job)
    selected = checkpoint or run.head_id
    context["selected"] = selected
    part = request.query_params.get("fragment")
    if part in ("head", "tree", "timeline"):
        return render(request, f"_run_{part}.html", context)
    if selected is not None:
        context.update(_checkpoint_panel(ui, run_id, selected, against))
    return render(request, "run.html", context)


def _checkpoint_panel(ui: UI, run_id: str, checkpoint_id: str, against: str | None
                      ) -> dict[str, Any]:
    store = ui.store
    ckpt = store.get(checkpoint_id, strict=False)
    run = store.get_run(ckpt.run_id)
    if ckpt.run_id != run_id:
        raise ValueError(f"checkpoint {checkpoint_id} belongs to run {ckpt.run_id}, "
                         f"not {run_id}")
    detail = views.checkpoint_detail(store, ckpt, run)
    panel: dict[str, Any] = {"ckpt": detail, "state_nodes": values.tree(detail["live_state"]),
                             "fields": sorted(detail["state"])}
    other = against or ckpt.parent_id
    panel["against"] = other
    panel["diff_error"] = ""
    panel["changes"] = []
    if other is not None:
        try:
            old = store.get(other, strict=False)
            old_run = store.get_run(old.run_id)
            threads = (langgraph_view.is_thread(old_run.workflow), detail["langgraph"])
            panel["changes"] = views.diff(old, ckpt, threads=threads)
        except PitstopError as exc:
            panel["diff_error"] = str(exc)
    return panel


# -- live updates ----------------------------------------------------------------------------------


@router.get("/events")
async def events(request: Request, ui: Annotated[UI, Depends(ui_of)]) -> StreamingResponse:
    view = request.query_params.get("view", "runs")
    store = ui.store
    if view == "run":
        run_id = request.query_params.get("run", "")

        def fingerprint() -> str:
            from ..observe import progress

            run = store.get_run(run_id)
            # A loop's position moves without a checkpoint (ctx.iterate records it aside).
            loops = [(loop.name, loop.done) for loop in progress(store, run_id)]
            return live.digest(run.status, run.head_id, run.updated_at, run.owner,
                               run_id in ui.actions.resuming, loops)
    elif view == "inbox":
        def fingerprint() -> str:
            count, waiting = views.oldest_waiting(store, views.PAGE)
            return live.digest(count, [(r.id, r.updated_at) for r in waiting])
    else:
        filters = _filters(request)
        before = request.query_params.get("before") or None

        def fingerprint() -> str:
            found = store.runs(**filters.store_filters(), before=before, limit=views.PAGE)
            counting = filters.store_filters()
            counting.pop("status")
            counts = store.count_runs(**counting)
            return live.digest([(r.id, r.status, r.updated_at) for r in found],
                               sorted(counts.items()))

    return StreamingResponse(live.stream(ui.ticker, fingerprint),
                             media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})


# -- metrics ---------------------------------------------------------------------------------------


@router.get("/metrics", include_in_schema=False)
def metrics_page(ui: Annotated[UI, Depends(ui_of)]) -> Response:
    """Prometheus metrics (pitstop.observe.metrics): the store's runs, queue and waits, and
    what runs this process executed did. Behind the same tokens as every page (Prometheus
    sends one as a bearer token)."""
    from ..observe import metrics

    try:
        metrics.enable(ui.store)
        body, content_type = metrics.exposition()
    except ImportError:
        return Response("metrics need prometheus-client: pip install 'pitstop[metrics]'\n",
                        status_code=404, media_type="text/plain")
    return Response(body, media_type=content_type)


# -- login -----------------------------------------------------------------------------------------


def _local_target(target: str, base: str) -> str:
    """Only a path of this app may follow a login (no open redirect to another site)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return base + "/"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return login_page(request)


@router.post("/login")
def login(
    request: Request,
    ui: Annotated[UI, Depends(ui_of)],
    token: Annotated[str, Form(max_length=4096)] = "",
    next: Annotated[str, Form(max_length=4096)] = "/",
) -> Response:
    base = request.scope.get("root_path", "")
    if not ui.guard.required:
        return RedirectResponse(_local_target(next, base), status_code=303)
    identity = ui.guard.login(token)
    if identity is None:
        ui.guard.throttle.failed(client_of(request))
        return login_page(request, status=401, error="That token is not valid.",
                          target=_local_target(next, base))
    ui.guard.throttle.succeeded(client_of(request))
    response = RedirectResponse(_local_target(next, base), status_code=303)
    response.set_cookie(COOKIE, ui.guard.cookie_value(identity), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https",
                        path=base or "/")
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    base = request.scope.get("root_path", "")
    response = RedirectResponse(base + "/login", status_code=303)
    response.delete_cookie(COOKIE, path=base or "/", httponly=True, samesite="strict")
    return response


__all__ = ["error_page", "login_page", "render", "router", "templates"]
