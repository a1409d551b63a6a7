"""What every command shares: exit codes, the one-line errors, opening the store, parsing
the values people type (durations, JSON, ``module:attr``, checkpoint references).

Kept in one place so that every command fails the same way: a bad run id, a malformed JSON
argument or an unreachable store is one ``error: ...`` line on stderr and exit status 2, with
nothing written, whichever command met it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pitstop.errors import (
    AmbiguousReferenceError,
    CheckpointNotFoundError,
    RunNotFoundError,
    StoreSchemaError,
)
from pitstop.store import DEFAULT_URL, ENV_VAR, Store, open_store
from pitstop.store.contract.urls import redact

from .render import Output

if TYPE_CHECKING:
    from pitstop.model import Checkpoint, CheckpointSummary, Run
    from pitstop.runtime import Workflow

EXIT_OK = 0
EXIT_PROBLEMS = 1
"""``verify`` found damage, a command met a corrupt record, or a resumed run failed."""
EXIT_USAGE = 2
"""Bad usage or input: unknown option, run or checkpoint; malformed JSON; unusable store."""
EXIT_INTERNAL = 3
"""A bug in pitstop (set PITSTOP_DEBUG=1 to see the traceback)."""


class CliError(Exception):
    """A failure the user can fix, reported as one line (never with a traceback)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        self.code = code
        super().__init__(message)


# -- the store -------------------------------------------------------------------------------


def store_url(url: str | None) -> str:
    return url or os.environ.get(ENV_VAR) or DEFAULT_URL


def _sqlite_file(url: str) -> str | None:
    """The file a SQLite URL (or a bare path) names, or None for other stores."""
    if "://" not in url:
        return None if url.startswith(("sqlite:", "memory:", "postgres")) else url
    if not url.lower().startswith("sqlite:///"):
        return None
    path = unquote(url[len("sqlite:///") :].split("?", 1)[0])
    return None if path in ("", ":memory:") else path


def connect(url: str | None, *, create: bool = False, upgrade: bool = False) -> Store:
    """Open the store for a command.

    Only the commands that exist to create or change a store (``import``, ``migrate``) may
    create a SQLite file (``create``) or upgrade the store's tables (``upgrade``). Every
    other command refuses a missing SQLite file, because a typo in ``--store`` must not leave
    an empty database behind, and a store whose tables are older than this pitstop (the error
    says to run ``pitstop migrate``), because reading must not change a store.
    """
    given = url
    url = store_url(url)
    path = _sqlite_file(url)
    if path is not None and not create and not Path(path).exists():
        origin = "--store" if given else (f"${ENV_VAR}" if os.environ.get(ENV_VAR) else
                                          "the default store")
        raise CliError(f"no store at {path!r} (from {origin}); check --store or ${ENV_VAR}")
    if path is not None and not create and os.path.isfile(path) and not os.path.getsize(path):
        # Opening an empty file would make it a SQLite database (WAL mode writes a header).
        raise _no_pitstop_store(url, path)
    try:
        return open_store(url, auto_migrate=upgrade)
    except StoreSchemaError as exc:
        if exc.found != 0 or create:
            raise  # a pitstop store of another version: its message says what to do
        raise _no_pitstop_store(url, path) from None


def _no_pitstop_store(url: str, path: str | None) -> CliError:
    # No pitstop tables at all: `pitstop migrate` would create a store in the wrong place (a
    # typo'd schema, another application's database), so do not suggest it.
    return CliError(
        f"no pitstop store in {_place(url, path)}; check --store or ${ENV_VAR} (a new "
        "store is made only by start, enqueue, import and migrate)"
    )


def _place(url: str, path: str | None) -> str:
    """Where a store URL points, for a message: the file (and what else is in it), or the
    PostgreSQL schema."""
    if path is not None:
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                tables = [row[0] for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        except sqlite3.Error:
            tables = []
        if not tables:
            return f"{path!r} (an empty SQLite database)"
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        return f"{path!r} (a SQLite database of something else, with tables {shown})"
    query = dict(parse_qsl(urlsplit(url).query))
    where = redact(url.split("?", 1)[0])
    if "schema" in query:
        return f"schema {query['schema']!r} of {where}"
    return f"the default schema (search_path) of {where}"


class Session:
    """One command's store connection and output, closed when the command ends."""

    def __init__(self, url: str | None, *, as_json: bool) -> None:
        self.url = url
        self.out = Output(as_json=as_json)
        self._store: Store | None = None

    @property
    def as_json(self) -> bool:
        return self.out.as_json

    def store(self, *, create: bool = False, upgrade: bool = False) -> Store:
        if self._store is None:
            self._store = connect(self.url, create=create, upgrade=upgrade)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


# -- logging ---------------------------------------------------------------------------------

_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def configure_logging(
    level: str | None, *, default: str = "WARNING", verbose: int = 0, quiet: bool = False
) -> None:
    """Send pitstop's log records to stderr, one line each, at the level asked for.

    ``level`` (``--log-level``) wins; otherwise ``default`` made more verbose by each ``-v``
    or reduced to errors by ``-q``. The lines are ``TIME LEVEL LOGGER message`` with the
    message written as ``key=value`` pairs by pitstop (``run=... step=... attempt=...``), so
    ``grep run=01a2`` follows one run through a worker's log.
    """
    import logging

    if level is None:
        index = _LEVELS.index(default.upper())
        index = len(_LEVELS) - 1 if quiet else max(0, index - verbose)
        level = _LEVELS[index]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s", "%Y-%m-%dT%H:%M:%S"
    ))
    logger = logging.getLogger("pitstop")
    for old in list(logger.handlers):
        if getattr(old, "_pitstop_cli", False):
            logger.removeHandler(old)
    handler._pitstop_cli = True  # type: ignore[attr-defined]  # replaced on the next command
    logger.addHandler(handler)
    logger.setLevel(level.upper())


# -- parsing what people type ------------------------------------------------------------------

def parse_json(text: str, what: str) -> Any:
    """A JSON argument: inline, ``@file.json``, or ``@-`` / ``-`` for stdin."""
    source = what
    if text in ("-", "@-"):
        text, source = sys.stdin.read(), f"{what} (stdin)"
    elif text.startswith("@"):
        path = text[1:]
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {what} from {path!r}: {exc.strerror}") from None
        source = f"{what} in {path!r}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "strings need quotes, e.g. '\"yes\"'"
        ) from None


def load_workflow(spec: str) -> Workflow:
    """The :class:`~pitstop.Workflow` named by ``module:attr`` (``attr`` may be dotted).

    The current directory is put on ``sys.path`` first, as ``python -m`` does, so a
    workflow file next to the operator's shell is found without installing anything.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"--workflow {spec!r} must look like module:attr (e.g. myapp.flows:wf)")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(
                f"cannot import workflow module {module_name!r}: no such module "
                f"(looked in the current directory and on sys.path)"
            ) from None
        raise CliError(
            f"workflow module {module_name!r} failed to import: {_describe(exc)}"
        ) from None
    except (Exception, SystemExit) as exc:
        raise CliError(
            f"workflow module {module_name!r} failed to import: {_describe(exc)}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    from pitstop.runtime import Workflow

    if not isinstance(obj, Workflow):
        raise CliError(
            f"{spec!r} is a {type(obj).__name__}, not a pitstop.Workflow"
        )
    return obj


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}"


# -- naming checkpoints ------------------------------------------------------------------------
# The rules live in pitstop.store.contract.lookup (the Python API takes the same short forms); here
# their errors become one `error:` line.

MIN_PREFIX = 4
"""The shortest checkpoint id start or end accepted."""


def find_in_run(store: Store, run_id: str, ref: str) -> str:
    """The id of the checkpoint of ``run_id`` that ``ref`` names: its full id, or a unique
    short form (the end of the id as ``pitstop history`` prints it, or its beginning)."""
    from pitstop.store.contract import lookup

    try:
        return lookup.find_in_run(store, run_id, ref)
    except (AmbiguousReferenceError, CheckpointNotFoundError) as exc:
        raise CliError(str(exc)) from None


def find_run(store: Store, text: str) -> Run:
    """The run ``text`` names: its id, or a unique start of it (``01a2326a-2e98``, ``t``)."""
    from pitstop.store.contract import lookup

    try:
        return lookup.find_run(store, text)
    except AmbiguousReferenceError as exc:
        raise CliError(str(exc)) from None


def run_reference(store: Store, text: str) -> tuple[Run, str | None]:
    """A run argument: a run id or a unique start of one, or ``RUN@ID`` (a checkpoint of
    that run, by the short id ``pitstop history`` prints, or any unique start or end of its
    id). Returns the run and the checkpoint's full id (None without ``@``)."""
    run_text, at, ref = text.rpartition("@") if "@" in text else (text, "", "")
    run = find_run(store, run_text)
    return run, find_in_run(store, run.id, ref) if at else None


def resolve(store: Store, ref: str) -> str:
    """A checkpoint id from what a user typed: a checkpoint id, a run id or a unique start of
    one (its head), ``RUN@ID`` with ID as ``pitstop history RUN`` shows it, or a unique
    start of a checkpoint id. A start that fits a run is taken as the run."""
    from pitstop.store.contract.lookup import resolve_checkpoint

    try:
        return resolve_checkpoint(store, ref)
    except AmbiguousReferenceError as exc:
        raise CliError(str(exc)) from None
    except CheckpointNotFoundError as exc:
        if exc.run_id is not None:  # the run was found; its checkpoint was not
            raise CliError(str(exc)) from None
        where = f"no checkpoint or run {ref!r} in this store"
    except RunNotFoundError:
        where = f"no run {ref.rpartition('@')[0]!r} in this store (from {ref!r})"
    raise CliError(
        f"{where}; give a checkpoint id, a run id (for its latest checkpoint) or RUN@ID "
        "with an id from `pitstop history RUN`"
    )


def load_checkpoint(store: Store, checkpoint_id: str) -> Checkpoint:
    """A checkpoint with its state, values of unknown classes kept as placeholders."""
    return store.get(checkpoint_id, strict=False)


def state_view(store: Store, checkpoint: Checkpoint) -> Any:
    """A checkpoint's state as ``show`` and ``diff`` print it. A LangGraph thread's channels
    are decoded without running code (pickle only on a store opened with PickleSerializer)."""
    from pitstop.integrations.langgraph_values import display_state
    from pitstop.serde import PickleSerializer

    pickled = isinstance(store.serializer, PickleSerializer)
    return display_state(checkpoint, allow_pickle=pickled)


def cached_note(summary: CheckpointSummary) -> str:
    """``cached: fetch (from run R)``: the steps and calls since the previous checkpoint that
    were served from the result cache, and the runs that computed them."""
    served = summary.metadata.get("cached") or ()
    if not served:
        return ""
    names = []
    for item in served:
        if not isinstance(item, dict):
            continue
        name = item.get("step") or item.get("call") or "?"
        source = item.get("run")
        names.append(f"{name} (from run {source})" if source else str(name))
    return "cached: " + ", ".join(names)


def checkpoint_json(summary: CheckpointSummary, *, head_id: str | None = None) -> dict[str, Any]:
    """The JSON shape of a checkpoint's record, shared by ``show``, ``history`` and ``diff``."""
    meta = summary.metadata
    out: dict[str, Any] = {
        "id": summary.id,
        "run_id": summary.run_id,
        "parent_id": summary.parent_id,
        "step": summary.step,
        "step_name": meta.get("step_name"),
        "source": summary.source,
        "status": meta.get("status"),
        "created_at": summary.created_at,
        "size": summary.size,
        "added": summary.added,
        "tags": list(summary.tags),
        "cached": list(meta.get("cached") or ()),
        "checksum": summary.checksum,
        "schema_version": summary.schema_version,
        "started_at": meta.get("started_at"),
        "duration": meta.get("duration"),
    }
    if head_id is not None:
        out["head"] = summary.id == head_id
    return out


@contextmanager
def handling_broken_pipe() -> Iterator[None]:
    """``pitstop runs | head`` must end quietly when ``head`` stops reading."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(EXIT_OK) from None


__all__ = [
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "CliError",
    "Session",
    "checkpoint_json",
    "configure_logging",
    "connect",
    "find_in_run",
    "find_run",
    "load_checkpoint",
    "load_workflow",
    "parse_json",
    "resolve",
    "run_reference",
]
