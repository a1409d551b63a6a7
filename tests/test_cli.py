"""The `pitstop` command line, driven as an operator drives it.

Most cases call the CLI's entry point in this process (``pitstop.cli.app.run``: the same
parsing, store opening, output and error handling as the console script, minus interpreter
start-up); the key flows also run as real subprocesses (``python -m pitstop``) so that
exit statuses, stderr and "no traceback" are checked on the real thing. Stores are real
SQLite files and the real PostgreSQL server.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest

import pitstop
from clitools import Result
from clitools import one_error_line as one_line_error
from conftest import BACKENDS, ROOT, drop_pg_schema, pg_schema_url
from pitstop import RetentionPolicy, RunStatus, Store
from pitstop.cli.app import all_commands, run
from pitstop.display.state import diff, lookup, parse_path
from pitstop.store.engine import schema as store_schema

# The workflow the tests operate, written to a file for subprocesses and executed here for
# in-process use: one definition for both.
FLOWS = '''
import pitstop

approval = pitstop.Workflow("vendor-approval")


@approval.step
def intake(state):
    return {"vendor": state["vendor"].title(),
            "messages": [{"role": "user", "content": "onboard " + state["vendor"]}]}


@approval.step(milestone=True)
def security_review(state, ctx):
    scan = ctx.effect("scan", lambda: {"score": 7, "blob": "x" * 5000})
    return {"risk": "low", "scan": scan,
            "messages": state["messages"] + [{"role": "tool", "content": "scan passed"}]}


@approval.step
def draft(state):
    return {"contract": {"vendor": state["vendor"], "budget": state.get("budget", 1000)}}


@approval.step(wait_for="approval")
def decide(state, approval):
    return {"approved": approval["approved"],
            "messages": state["messages"] + [{"role": "human", "content": approval.get("note")}]}


@approval.step
def finalize(state):
    return {"outcome": "signed" if state["approved"] else "rejected"}


not_a_workflow = 42
'''

flows = types.ModuleType("pitstop_test_flows")
exec(compile(FLOWS, "<flows>", "exec"), flows.__dict__)
approval: pitstop.Workflow = flows.approval

CLI_BACKENDS = [b for b in BACKENDS if b != "memory"]  # memory:// dies with each command


# -- driving the CLI ---------------------------------------------------------------------------


@pytest.fixture
def pitstop_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run the CLI in this process: ``pitstop_cli("runs", "--json", store=url)``."""

    def call(*args: str, store: str | None = None) -> Result:
        argv = [*args, *(["--store", store] if store else [])]
        code = run(argv)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return call


def subprocess_cli(
    *args: str, store: str | None = None, cwd: Path | None = None, stdin: bytes | None = None
) -> Result:
    """Run ``python -m pitstop`` for real (piped stdout: plain text)."""
    env = {k: v for k, v in os.environ.items() if k != "PITSTOP_STORE"}
    if store:
        env["PITSTOP_STORE"] = store
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                      env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "pitstop", *args],
        capture_output=True,
        input=stdin,
        cwd=cwd or ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.fixture
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL for the backend under test (``sqlite`` unless parametrized)."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        target = f"sqlite:///{tmp_path / 'store.db'}"
        pitstop.open_store(target).close()
        yield target
    else:
        schema = f"t_cli_{uuid.uuid4().hex[:10]}"
        target = pg_schema_url(schema)
        pitstop.open_store(target).close()
        yield target
        drop_pg_schema(schema)


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    with pitstop.open_store(url) as s:
        yield s


def start(store: Store, vendor: str, budget: int = 1000) -> str:
    result = approval.start(store, {"vendor": vendor, "budget": budget}, run_id=f"vendor-{vendor}")
    assert result.status is RunStatus.WAITING
    return result.run_id


def sqlite_dump(url: str) -> list[str]:
    """Every row of a SQLite store, to prove a failed command wrote nothing."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


# -- help and exit codes -----------------------------------------------------------------------


def test_every_command_has_help_with_an_example(pitstop_cli: Callable[..., Result]) -> None:
    top = pitstop_cli("--help")
    assert top.code == 0
    for code in ("0  ok", "1  problems found", "2  bad usage or input"):
        assert code in top.out
    for name, command in all_commands().items():
        result = pitstop_cli(name, "--help")
        assert result.code == 0, name
        assert "Example" in result.out, name
        # A group's commands (pitstop cache ls) take the options.
        leaves = ([[name, sub] for sub in command.commands]
                  if isinstance(command, click.Group) else [[name]])
        for leaf in leaves:
            result = pitstop_cli(*leaf, "--help")
            assert "Example" in result.out, leaf
            assert "--store URL" in result.out, leaf
            assert "--json" in result.out, leaf


# -- the read/steer commands, on SQLite and on PostgreSQL ----------------------------------------


@pytest.mark.parametrize("url", CLI_BACKENDS, indirect=True)
@pytest.mark.slow
def test_operating_runs(url: str, store: Store, pitstop_cli: Callable[..., Result]) -> None:
    acme = start(store, "acme")
    globex = start(store, "globex", budget=5000)

    listing = pitstop_cli("runs", store=url)
    assert listing.code == 0
    header, *lines = listing.out.splitlines()
    assert header.split()[:3] == ["ID", "STATUS", "WORKFLOW"]
    assert [line.split()[0] for line in lines] == [globex, acme]
    assert all("waiting" in line and "approval" in line for line in lines)
    assert "\x1b[" not in listing.out  # piped: no colours

    runs = pitstop_cli("runs", "--json", "--status", "waiting", "--since", "1h", store=url).json
    assert {r["id"] for r in runs["runs"]} == {acme, globex}
    assert runs["runs"][0]["waiting_for"] == ["approval"]
    assert pitstop_cli("runs", "--json", "--status", "completed", store=url).json["runs"] == []
    page = pitstop_cli("runs", "--json", "--limit", "1", store=url).json
    assert len(page["runs"]) == 1
    assert page["more"] is True
    assert pitstop_cli("runs", "--json", "--workflow", "other", store=url).json["runs"] == []

    shown = pitstop_cli("show", acme, store=url)
    assert shown.code == 0
    assert "step:        3 · draft" in shown.out
    assert "waiting for: approval" in shown.out
    state = json.loads(shown.out[shown.out.index("\n{") : shown.out.rindex("}") + 1])
    assert state["contract"] == {"vendor": "Acme", "budget": 1000}
    field = pitstop_cli("show", acme, "--field", "messages[1].content", "--json", store=url).json
    assert field["value"] == "scan passed"
    assert field["checkpoint"]["head"] is True

    hist = pitstop_cli("history", acme, "--json", store=url).json
    names = [c["step_name"] for c in hist["checkpoints"]]
    assert names == ["draft", "security_review", "intake", None]
    assert hist["checkpoints"][0]["head"] is True
    assert hist["checkpoints"][1]["tags"] == ["security_review"]  # the milestone
    assert all(c["size"] > 0 and c["added"] is not None for c in hist["checkpoints"])
    plain = pitstop_cli("history", acme, store=url).out
    assert "head" in plain
    assert "security_review" in plain

    first, latest = hist["checkpoints"][-1]["id"], hist["checkpoints"][0]["id"]
    changes = pitstop_cli("diff", first, f"{acme}", "--json", store=url).json
    by_path = {c["path"]: c for c in changes["changes"]}
    assert by_path["vendor"] == {"op": "changed", "path": "vendor", "old": "acme", "new": "Acme"}
    assert by_path["contract"]["op"] == "added"
    assert changes["changed"] >= 1
    assert changes["added"] >= 3
    short = pitstop_cli("diff", f"{acme}@{latest[-8:]}", latest, store=url)
    assert short.code == 0
    assert "0 changes (identical states)" in short.out

    sent = pitstop_cli("send", acme, "approval", '{"approved": true, "note": "ok"}', store=url)
    assert sent.code == 0
    assert "waits for nothing more" in sent.out
    assert set(store.inputs(acme)) == {"approval"}

    cancelled = pitstop_cli("cancel", globex, "--json", store=url).json
    assert cancelled == {"run_id": globex, "status": "cancelled", "previous": "waiting"}
    assert store.get_run(globex).status is RunStatus.CANCELLED
    assert "already cancelled" in pitstop_cli("cancel", globex, store=url).out

    stats = pitstop_cli("stats", "--json", store=url).json
    assert stats["runs"] == 2
    assert stats["runs_by_status"] == {"waiting": 1, "cancelled": 1}
    assert stats["checkpoints"] == 8
    assert stats["bytes"] > 0

    verified = pitstop_cli("verify", store=url)
    assert verified.code == 0
    assert "no problems" in verified.out

    assert pitstop_cli("migrate", "--json", store=url).json["to"] >= 1


def test_history_draws_branches_and_fork_origins(
    url: str, store: Store, pitstop_cli: Callable[..., Result]
) -> None:
    acme = start(store, "acme")
    store.send(acme, "approval", {"approved": True})
    assert approval.resume(store, acme).status is RunStatus.COMPLETED
    entries = store.history(acme)
    security = next(e for e in entries if e.metadata.get("step_name") == "security_review")
    approval.resume(store, acme, from_checkpoint=security.id)  # a second branch
    approval.fork(store, entries[0].id, update={"approved": False}, run_id="acme-fork")

    hist = pitstop_cli("history", acme, "--json", store=url).json
    by_id = {c["id"]: c for c in hist["checkpoints"]}
    assert by_id[security.id]["branch_point"] is True
    assert sum(c["branch_point"] for c in hist["checkpoints"]) == 1
    resumed = next(c for c in hist["checkpoints"] if c["source"] == "resume")
    assert resumed["note"] == f"resumed from {security.id[-8:]}"

    graph = pitstop_cli("history", acme, store=url).out.splitlines()
    point = next(line for line in graph
                 if security.id[-8:] in line and "resumed from" not in line)
    assert "branch point" in point
    assert "┘" in point
    assert any(line.startswith("│ ●") for line in graph)  # the abandoned branch's lane

    forked = pitstop_cli("history", "acme-fork", "--json", store=url).json
    assert forked["forked_from"] == acme
    assert forked["checkpoints"][-1]["note"] == f"forked from {acme}@{entries[0].id[-8:]}"
    short_page = pitstop_cli("history", acme, "--limit", "2", "--json", store=url).json
    assert len(short_page["checkpoints"]) == 2
    assert short_page["more"] is True


@pytest.mark.parametrize("url", CLI_BACKENDS, indirect=True)
def test_history_and_show_sizes_of_a_chunked_field(
    url: str, store: Store, pitstop_cli: Callable[..., Result]
) -> None:
    """SIZE is the state's serialised size and ADDED what a checkpoint really stored: for a
    chunked list, the first save stores it all, an append the new item (not the list again),
    an edit of an early item about one chunk, an unchanged save nothing but its record."""
    import random
    import string

    import ormsgpack

    rng = random.Random(3)

    def text() -> str:  # ~1 KiB of random text: zstd takes about a fifth off, not all
        return "".join(rng.choices(string.ascii_letters + string.digits + " ", k=1080))

    msgs = [{"role": "user", "content": f"{i}:{text()}"} for i in range(200)]
    store.save("conv", {"messages": msgs})
    msgs.append({"role": "assistant", "content": "whole-list append " + text()})
    store.save("conv", {"messages": msgs})  # the whole new list, no hint
    extra = {"role": "user", "content": "Append " + text()}
    store.save("conv", {"messages": pitstop.Append([extra])})
    msgs.append(extra)
    msgs[3] = {"role": "user", "content": "edited"}
    store.save("conv", {"messages": msgs})
    store.save("conv", {"messages": msgs})  # unchanged
    full = len(ormsgpack.packb({"messages": msgs}))
    item = len(ormsgpack.packb(extra))

    hist = pitstop_cli("history", "conv", "--json", store=url).json["checkpoints"]
    unchanged, edited, appended, whole, first = hist
    for entry in hist:  # the state's size, within a few bytes of framing per field
        assert abs(entry["size"] - full) < 2 * item, entry
    # What a save stored is counted after compression: PostgreSQL compresses a list's
    # chunks where it pays (random text: by about a fifth), SQLite does not.
    shrunk = 0.7 if url.startswith("postgresql") else 1.0
    assert first["added"] >= shrunk * first["size"]
    for entry in (whole, appended):
        assert shrunk * item <= entry["added"] < 3 * item, entry
    assert edited["added"] < full / 4  # about one chunk (plus the record)
    assert unchanged["added"] < 1024  # the record alone
    assert sum(e["added"] for e in hist) < 1.6 * full

    table = pitstop_cli("history", "conv", store=url).out.splitlines()
    rows = {line.split()[1]: line for line in table if line.split()[1:2] and
            any(line.split()[1] == e["id"][-8:] for e in hist)}
    from pitstop.display.text import human_bytes

    for entry in hist:
        line = rows[entry["id"][-8:]]
        assert human_bytes(entry["size"]) in line
        assert "+" + human_bytes(entry["added"]) in line
    shown = pitstop_cli("show", "conv", store=url).out
    assert (f"size:       {human_bytes(unchanged['size'])} state, "
            f"+{human_bytes(unchanged['added'])} stored") in shown


def test_field_paths_and_diff() -> None:
    old = {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}],
           "draft": "v1", "odd key": {"n": 1}, "n": 1}
    new = {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "y"},
                        {"role": "ai", "content": "done"}],
           "odd key": {"n": 2}, "n": 1.0, "extra": None}
    changes = {(c.op, c.path) for c in diff(old, new)}
    assert changes == {
        ("changed", "messages[1].content"),
        ("added", "messages[2]"),
        ("removed", "draft"),
        ("changed", '["odd key"].n'),
        ("changed", "n"),  # int -> float is a change of type
        ("added", "extra"),
    }
    assert parse_path('messages[-1].content') == ["messages", -1, "content"]
    assert parse_path('["odd key"].n') == ["odd key", "n"]
    assert lookup(new, '["odd key"].n') == 2
    with pytest.raises(LookupError, match="there: 3 items"):
        lookup(new, "messages[7]")
    with pytest.raises(ValueError, match="malformed"):
        parse_path("messages[")


# -- prune: what goes and what must stay -----------------------------------------------------------


@pytest.mark.parametrize("url", CLI_BACKENDS, indirect=True)
@pytest.mark.slow
def test_prune_never_takes_a_head_or_a_referenced_value(
    url: str, store: Store, pitstop_cli: Callable[..., Result]
) -> None:
    shared = "s" * 20_000  # stored once, referenced by two runs
    for i in range(6):
        store.save("long", {"shared": shared, "i": i, "note": f"v{i}" * 500},
                   metadata={"tags": ["kept"]} if i == 1 else {"source": "step"})
    store.save("other", {"shared": shared, "j": 0})
    head_state = store.latest("long").state  # type: ignore[union-attr]

    def stats() -> dict[str, Any]:
        return pitstop_cli("stats", "--json", store=url).json  # type: ignore[no-any-return]

    before = stats()
    dry = pitstop_cli("prune", "--keep-last", "1", "--dry-run", "--json", store=url).json
    assert dry["dry_run"] is True
    assert len(dry["checkpoints"]) == 4
    assert dry["bytes_reclaimed"] > 0
    assert stats() == before  # a dry run deletes nothing
    text = pitstop_cli("prune", "--keep-last", "1", "--dry-run", store=url).out
    assert "would delete 4 checkpoints" in text
    assert "nothing was deleted" in text

    done = pitstop_cli("prune", "--keep-last", "1", "--json", store=url).json
    assert done["checkpoints"] == dry["checkpoints"]
    assert done["bytes_reclaimed"] == dry["bytes_reclaimed"]
    after = stats()
    assert before["bytes"] - after["bytes"] == done["bytes_reclaimed"]  # stats show it
    assert after["checkpoints"] == before["checkpoints"] - 4
    assert store.latest("long").state == head_state  # type: ignore[union-attr]
    assert store.latest("other").state["shared"] == shared  # type: ignore[union-attr]
    assert [h.tags for h in store.history("long")] == [(), ("kept",)]
    assert pitstop_cli("verify", store=url).code == 0

    # Without milestones the tagged one goes too; the head still never does.
    last = pitstop_cli("prune", "--run", "long", "--keep-last", "1", "--no-keep-milestones",
                       "--json", store=url).json
    assert len(last["checkpoints"]) == 1
    assert [h.id for h in store.history("long")] == [store.get_run("long").head_id]
    store.update_run("other", status=RunStatus.COMPLETED)
    gone = pitstop_cli("prune", "--finished-older-than", "0s", "--json", store=url).json
    assert gone["runs"] == ["other"]
    assert store.latest("long").state["shared"] == shared  # type: ignore[union-attr]
    assert pitstop_cli("verify", store=url).code == 0


def test_workflow_retention_prunes_a_run_when_it_completes(tmp_path: Path) -> None:
    keep_two = pitstop.Workflow("retained", retention=RetentionPolicy(keep_last=2,
                                                                     keep_milestones=False))

    @keep_two.step
    def one(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 1}

    @keep_two.step
    def two(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 2}

    @keep_two.step
    def three(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 3}

    with pitstop.open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        result = keep_two.start(store, {"n": 0}, run_id="r")
        assert result.status is RunStatus.COMPLETED
        kept = store.history("r")
        assert len(kept) == 2
        assert kept[0].id == store.get_run("r").head_id
        assert store.latest("r").state == {"n": 3}  # type: ignore[union-attr]
        # The same policy through the Python API, on a run that did not prune itself.
        for i in range(5):
            store.save("manual", {"i": i})
        report = store.prune(RetentionPolicy(keep_last=1), run_id="manual")
        assert len(report.checkpoints) == 4
        assert len(store.history("manual")) == 1


# -- export and import -------------------------------------------------------------------------


def _snapshot(store: Store, run_id: str) -> dict[str, Any]:
    """Everything an import must carry over exactly."""
    history = store.history(run_id, limit=None)
    return {
        "checkpoints": [
            (h.id, h.parent_id, h.step, h.checksum, h.size, h.added, dict(h.metadata),
             store.get(h.id).state)
            for h in history
        ],
        "inputs": {k: (v.id, v.payload, v.consumed_by)
                   for k, v in store.inputs(run_id, pending=False).items()},
        "effects": store.effects(run_id),
        "run": {k: v for k, v in vars_of(store.get_run(run_id)).items()
                if k not in ("owner", "lease_expires_at")},
    }


def vars_of(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


@pytest.mark.postgres
@pytest.mark.slow
def test_export_import_round_trip_sqlite_postgres_sqlite(tmp_path: Path) -> None:
    if "postgres" not in BACKENDS:
        pytest.skip("no PostgreSQL backend")
    source_url = f"sqlite:///{tmp_path / 'source.db'}"
    final_url = f"sqlite:///{tmp_path / 'final.db'}"
    schema = f"t_cli_{uuid.uuid4().hex[:10]}"
    pg_url = pg_schema_url(schema)
    try:
        with pitstop.open_store(source_url) as source:
            run_id = start(source, "acme")
            source.send(run_id, "approval", {"approved": True, "note": "fine"})
            approval.resume(source, run_id)
            security = next(h for h in source.history(run_id)
                            if h.metadata.get("step_name") == "security_review")
            approval.resume(source, run_id, from_checkpoint=security.id)
            original = _snapshot(source, run_id)
        assert original["effects"]
        assert original["inputs"]

        out = subprocess_cli("export", run_id, "-o", str(tmp_path / "a.pitstop"),
                             store=source_url)
        assert out.code == 0, out.err
        assert "exported run vendor-acme" in out.out
        into_pg = subprocess_cli("import", str(tmp_path / "a.pitstop"), store=pg_url)
        assert into_pg.code == 0, into_pg.err
        back = subprocess_cli("export", run_id, "-o", str(tmp_path / "b.pitstop"), "--json",
                              store=pg_url)
        assert back.code == 0, back.err
        assert back.json["source"]["kind"] == "postgresql"
        home = subprocess_cli("import", str(tmp_path / "b.pitstop"), store=final_url)
        assert home.code == 0, home.err

        for target in (pg_url, final_url):
            with pitstop.open_store(target) as imported:
                assert _snapshot(imported, run_id) == original
                assert imported.verify() == []

        again = subprocess_cli("import", str(tmp_path / "b.pitstop"), store=final_url)
        assert "already exists" in one_line_error(again)
        copy = subprocess_cli("import", str(tmp_path / "b.pitstop"), "--run-id", "acme-copy",
                              "--json", store=final_url)
        assert copy.code == 0, copy.err
        with pitstop.open_store(final_url) as final:
            copied = final.history("acme-copy", limit=None)
            assert len(copied) == len(original["checkpoints"])
            assert {h.id for h in copied}.isdisjoint(c[0] for c in original["checkpoints"])
            assert [final.get(h.id).state for h in copied] == [
                c[-1] for c in original["checkpoints"]
            ]
            assert final.get_run("acme-copy").metadata["copied_from"] == run_id
            assert final.verify() == []
    finally:
        drop_pg_schema(schema)


@pytest.mark.slow
def test_export_to_stdout_and_import_from_stdin(
    url: str, store: Store, tmp_path: Path, pitstop_cli: Callable[..., Result]
) -> None:
    run_id = start(store, "initech")
    raw = subprocess.run([sys.executable, "-m", "pitstop", "export", run_id, "-o", "-"],
                         capture_output=True, env={**os.environ, "PITSTOP_STORE": url,
                                                   "PYTHONPATH": str(ROOT / "src")},
                         check=True).stdout
    assert raw.startswith(b"\x89PITSTOP")
    target = f"sqlite:///{tmp_path / 'piped.db'}"
    loaded = subprocess_cli("import", "-", store=target, stdin=raw)
    assert loaded.code == 0, loaded.err
    with pitstop.open_store(target) as other:
        assert other.latest(run_id).state == store.latest(run_id).state  # type: ignore[union-attr]
    exists = pitstop_cli("export", run_id, "-o", str(tmp_path), store=url)
    assert "exists" in one_line_error(exists)


def test_import_refuses_damaged_foreign_and_newer_archives(
    url: str, store: Store, tmp_path: Path, pitstop_cli: Callable[..., Result]
) -> None:
    from pitstop import archive

    run_id = start(store, "acme")
    good = tmp_path / "good.pitstop"
    assert pitstop_cli("export", run_id, "-o", str(good), store=url).code == 0
    raw = good.read_bytes()
    target = tmp_path / "never.db"

    damaged = tmp_path / "damaged.pitstop"
    damaged.write_bytes(raw[:200] + bytes([raw[200] ^ 0xFF]) + raw[201:])
    truncated = tmp_path / "truncated.pitstop"
    truncated.write_bytes(raw[: len(raw) // 2])
    foreign = tmp_path / "foreign.pitstop"
    foreign.write_bytes(b"PK\x03\x04 not an archive")

    # A well-formed archive from a future pitstop.
    newer = tmp_path / "newer.pitstop"
    old_version = archive.VERSION
    archive.VERSION = old_version + 1  # type: ignore[misc]
    try:
        with pitstop.open_store(url) as again:
            archive.write_archive(again, run_id, newer)
    finally:
        archive.VERSION = old_version  # type: ignore[misc]

    for path, reason in ((damaged, "damaged"), (truncated, "truncated"),
                         (foreign, "not a pitstop archive"), (newer, "newer than this pitstop"),
                         (tmp_path / "missing.pitstop", "cannot read archive")):
        result = pitstop_cli("import", str(path), store=f"sqlite:///{target}")
        assert reason in one_line_error(result), (path, result)
        assert not target.exists()  # verified before the store was even opened


# -- verify --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", CLI_BACKENDS, indirect=True)
def test_verify_exits_1_and_lists_a_corrupt_record(
    url: str, store: Store, pitstop_cli: Callable[..., Result]
) -> None:
    run_id = start(store, "acme")
    victim = store.history(run_id)[1].id
    sql = "UPDATE pitstop_checkpoints SET metadata = '{\"tampered\": true}' WHERE id = %s"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql.replace("%s", "?"), (victim,))
    else:
        import psycopg

        schema = url.rsplit("schema=", 1)[1]
        with psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(sql, (victim,))

    result = pitstop_cli("verify", store=url)
    assert result.code == 1
    assert f"problem: checkpoint {victim} (run {run_id}): " in result.out
    assert "checksum" in result.out
    report = pitstop_cli("verify", "--json", store=url)
    assert report.code == 1
    assert report.json["ok"] is False
    assert [p["id"] for p in report.json["problems"]] == [victim]
    shown = pitstop_cli("show", run_id, "--checkpoint", victim, store=url)
    assert shown.code == 1
    assert "corrupt" in shown.err
    assert len(shown.err.splitlines()) == 1


# -- bad input -------------------------------------------------------------------------------------


BROKEN_MODULES = {
    "wf_syntax": "def oops(:\n",
    "wf_raises": "raise RuntimeError('no config')\n",
    "wf_needs": "import module_that_is_not_installed\n",
}


def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    pitstop_cli: Callable[..., Result],
) -> None:
    acme = start(store, "acme")
    first = store.history(acme)[-1].id
    (tmp_path / "wf_ok.py").write_text(FLOWS)
    for name, source in BROKEN_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = sqlite_dump(url)
    cases: list[tuple[list[str], str]] = [
        (["show", "nope"], "no run 'nope'"),
        (["history", "nope"], "no run 'nope'"),
        (["show", acme, "--checkpoint", "ffffffff"], "no checkpoint 'ffffffff'"),
        (["show", acme, "--field", "nothing"], "no 'nothing'"),
        (["diff", first, "missing-checkpoint"], "no checkpoint or run 'missing-checkpoint'"),
        (["send", "nope", "approval", "true"], "no run 'nope'"),
        (["send", acme, "approval", "{not json"], "not valid JSON"),
        (["send", acme, "approval", "@missing.json"], "cannot read"),
        (["send", acme, "other", "1"], "waits for 'approval'"),
        (["cancel", "nope"], "no run 'nope'"),
        (["resume", "nope", "--workflow", "wf_ok:approval"], "no run 'nope'"),
        (["resume", acme, "--from", "zzzzzzzz", "--workflow", "wf_ok:approval"],
         "no checkpoint 'zzzzzzzz'"),
        (["resume", acme, "--workflow", "wf_ok"], "must look like module:attr"),
        (["resume", acme, "--workflow", "no_such_module:wf"], "cannot import workflow module"),
        (["resume", acme, "--workflow", "wf_syntax:wf"], "SyntaxError"),
        (["resume", acme, "--workflow", "wf_raises:wf"], "RuntimeError: no config"),
        (["resume", acme, "--workflow", "wf_needs:wf"], "module_that_is_not_installed"),
        (["resume", acme, "--workflow", "wf_ok:missing"], "has no attribute 'missing'"),
        (["resume", acme, "--workflow", "wf_ok:not_a_workflow"], "is a int, not a pitstop"),
        (["fork", first, "--set", "budget={", "--workflow", "wf_ok:approval"],
         "--set budget is not valid JSON"),
        (["fork", first, "--set", "budget", "--workflow", "wf_ok:approval"], "FIELD=JSON"),
        (["fork", first, "--workflow", "wf_ok:approval", "--run-id", acme], "already exists"),
        (["runs", "--since", "someday"], "neither a duration"),
        (["runs", "--status", "sleeping"], "Invalid value for '--status'"),
        (["runs", "--bogus"], "No such option"),
        (["prune"], "say what to prune"),
        (["prune", "--keep-last", "2", "--run", "nope"], "no run 'nope'"),
        (["export", "nope", "-o", str(tmp_path / "x.pitstop")], "no run 'nope'"),
        (["import", str(tmp_path / "wf_ok.py")], "not a pitstop archive"),
    ]
    for args, expected in cases:
        line = one_line_error(pitstop_cli(*args, store=url))
        assert expected in line, (args, line)
    assert sqlite_dump(url) == before
    assert not (tmp_path / "x.pitstop").exists()

    missing = tmp_path / "typo.db"
    for store_url, expected in (
        (f"sqlite:///{missing}", "no store at"),
        ("mysql://db/x", "unknown store URL scheme 'mysql'"),
        ("postgresql://postgres@127.0.0.1:1/none?connect_timeout=2", "unreachable"),
        (str(tmp_path / "wf_ok.py"), "file is not a database"),
    ):
        line = one_line_error(pitstop_cli("runs", store=store_url))
        assert expected in line, (store_url, line)
    assert not missing.exists()


@pytest.mark.slow
def test_errors_from_a_real_process_have_no_traceback(url: str, tmp_path: Path) -> None:
    (tmp_path / "broken_flow.py").write_text("def oops(:\n")
    for args, expected in (
        (["show", "nope"], "error: no run 'nope' in this store"),
        (["send", "nope", "x", "{"], "not valid JSON"),
        (["resume", "r", "--workflow", "broken_flow:wf"], "SyntaxError"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ):
        result = subprocess_cli(*args, store=url, cwd=tmp_path)
        assert expected in one_line_error(result), result


# -- resume and fork through a workflow module ----------------------------------------------------


@pytest.mark.parametrize("url", CLI_BACKENDS, indirect=True)
@pytest.mark.slow
def test_resume_and_fork_with_a_workflow_module(url: str, store: Store, tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(FLOWS)
    acme = start(store, "acme")
    sent = subprocess_cli("send", acme, "approval", "@-", store=url,
                          stdin=b'{"approved": true, "note": "go"}')
    assert sent.code == 0, sent.err
    resumed = subprocess_cli("resume", acme, "--workflow", "flows:approval", "--json",
                             store=url, cwd=tmp_path)
    assert resumed.code == 0, resumed.err
    assert resumed.json["status"] == "completed"
    assert resumed.json["step"] == "finalize"
    assert store.latest(acme).state["outcome"] == "signed"  # type: ignore[union-attr]

    decided = next(h for h in store.history(acme) if h.metadata.get("step_name") == "decide")
    forked = subprocess_cli("fork", f"{acme}@{decided.id[-8:]}", "--set", "approved=false",
                            "--set", 'note="re-run"', "--add", "--workflow", "flows:approval",
                            "--run-id", "acme-rejected", store=url, cwd=tmp_path)
    assert forked.code == 0, forked.err
    assert "completed" in forked.out
    state = store.latest("acme-rejected").state  # type: ignore[union-attr]
    assert state["outcome"] == "rejected"
    assert state["note"] == "re-run"
    assert store.latest(acme).state["outcome"] == "signed"  # type: ignore[union-attr]

    security = next(h for h in store.history(acme)
                    if h.metadata.get("step_name") == "security_review")
    branch = subprocess_cli("resume", acme, "--from", security.id[-8:], "--workflow",
                            "flows:approval", store=url, cwd=tmp_path)
    assert branch.code == 0, branch.err
    assert "waiting" in branch.out
    assert "approval" in branch.out
    assert store.get_run(acme).status is RunStatus.WAITING


@pytest.mark.slow
def test_worker_command_executes_queued_and_released_runs(
    url: str, store: Store, tmp_path: Path
) -> None:
    (tmp_path / "flows.py").write_text(FLOWS)
    queued = [approval.enqueue(store, {"vendor": f"v{i}"}).id for i in range(3)]
    first = subprocess_cli("worker", "--workflow", "flows:approval", "--until-idle",
                           "--concurrency", "2", "--json", store=url, cwd=tmp_path)
    assert first.code == 0, first.err
    assert first.json == {"executed": 3, "by_status": {"waiting": 3}, "errors": 0}
    for run_id in queued:
        pitstop.send(store, run_id, "approval", {"approved": True})
    second = subprocess_cli("worker", "--workflow", "flows:approval", "--until-idle",
                            "--limit", "vendor-approval=1", store=url, cwd=tmp_path)
    assert second.code == 0, second.err
    assert "executed 3 run(s): 3 completed" in second.out
    assert all(store.get_run(r).status is RunStatus.COMPLETED for r in queued)
    bad = subprocess_cli("worker", "--workflow", "flows:approval", "--limit", "oops",
                         store=url, cwd=tmp_path)
    assert bad.code == 2 and "--limit" in bad.err


@pytest.mark.slow
def test_a_failed_run_exits_1(url: str, store: Store, tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(
        "import pitstop\nwf = pitstop.Workflow('failing')\n"
        "@wf.step\ndef boom(state):\n    raise ValueError('card declined')\n"
    )
    store.create_run("f1", workflow="failing", status=RunStatus.QUEUED)
    store.save("f1", {"x": 1}, metadata={"source": "input", "next": "boom"},
               workflow="failing", schema_version=1)
    result = subprocess_cli("resume", "f1", "--workflow", "failing:wf", store=url, cwd=tmp_path)
    assert result.code == 1, result.err
    assert "failed" in result.out
    assert "card declined" in result.out


def test_since_accepts_iso_dates(url: str, store: Store,
                                 pitstop_cli: Callable[..., Result]) -> None:
    start(store, "acme")
    today = datetime.now(UTC).date().isoformat()
    assert len(pitstop_cli("runs", "--since", today, "--json", store=url).json["runs"]) == 1
    assert pitstop_cli("runs", "--since", "2999-01-01", "--json", store=url).json["runs"] == []


@pitstop.register(name="test_cli.Quote")
@dataclass
class Quote:
    vendor: str
    amount: int


@pytest.mark.slow
def test_show_and_diff_states_of_classes_the_cli_does_not_know(url: str, store: Store) -> None:
    store.save("q", {"quote": Quote("acme", 100), "n": 1})
    store.save("q", {"quote": Quote("acme", 120), "n": 1})
    shown = subprocess_cli("show", "q", "--json", store=url)  # a process without Quote
    assert shown.code == 0, shown.err
    assert shown.json["state"]["quote"] == {"$type": "test_cli.Quote", "vendor": "acme",
                                            "amount": 120}
    first = store.history("q")[-1].id
    changed = subprocess_cli("diff", first, "q", store=url)
    assert changed.code == 0, changed.err
    assert "~ quote.amount: 100 → 120" in changed.out


def test_migrate_creates_a_store_and_read_commands_never_do(
    tmp_path: Path, pitstop_cli: Callable[..., Result]
) -> None:
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert "no store at" in one_line_error(pitstop_cli("stats", store=fresh))
    assert not (tmp_path / "fresh.db").exists()
    created = pitstop_cli("migrate", store=fresh)
    assert created.code == 0
    latest = store_schema.LATEST_SCHEMA
    assert f"schema version 0 → {latest}" in created.out
    assert pitstop_cli("migrate", store=fresh).out.strip() == (
        f"schema version {latest}: already up to date"
    )
    assert pitstop_cli("runs", "--json", store=fresh).json == {"runs": [], "more": False}


@pytest.mark.postgres
def test_read_commands_leave_an_empty_postgres_schema_alone(
    pitstop_cli: Callable[..., Result],
) -> None:
    if "postgres" not in BACKENDS:
        pytest.skip("no PostgreSQL backend")
    schema = f"t_cli_{uuid.uuid4().hex[:10]}"
    target = pg_schema_url(schema)
    try:
        line = one_line_error(pitstop_cli("runs", store=target))
        assert f"no pitstop store in schema {schema!r}" in line  # not "run pitstop migrate"
        migrated = pitstop_cli("migrate", "--json", store=target).json
        assert (migrated["from"], migrated["to"]) == (0, store_schema.LATEST_SCHEMA)
        assert pitstop_cli("stats", "--json", store=target).json["runs"] == 0
    finally:
        drop_pg_schema(schema)
