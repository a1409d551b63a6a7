"""Hostile inputs, third round (issue #34): damage and values that used to end in a raw
Python exception or an internal error (exit 3) instead of a pitstop error naming the run,
checkpoint and field at fault. Stores are real SQLite files and PostgreSQL schemas,
tampered with by plain SQL from outside pitstop."""

from __future__ import annotations

import random
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from conftest import BACKENDS, PG_URL, drop_pg_schema, pg_schema_url
from pitstop.cli.app import run as cli_run
from pitstop.serde.chunks import decode_manifest
from pitstop.store.encoding.records import decode_field_map, is_chunk_key

SQL_BACKENDS = [b for b in BACKENDS if b != "memory"]


@pytest.fixture(params=SQL_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        schema = f"h3_{uuid.uuid4().hex[:12]}"
        yield pg_schema_url(schema)
        drop_pg_schema(schema)


def tamper(url: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Change the store behind pitstop's back (``?`` placeholders)."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0]) as conn:
            conn.execute(sql, params)
        return
    import psycopg

    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(sql.replace("?", "%s"), params)


def cli(capsys: pytest.CaptureFixture[str], *args: str, store: str) -> tuple[int, str, str]:
    code = cli_run([*args, "--store", store])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _messages(count: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    return [{"i": i, "text": "".join(rng.choices("abcdefgh ", k=300))} for i in range(count)]


def _chunked_run(store: pitstop.Store) -> tuple[str, list[bytes]]:
    """A run whose ``messages`` field is stored as chunks: its head id and chunk keys."""
    msgs = _messages(300)
    store.save("conv", {"messages": msgs[:100], "n": 1})
    head = store.save("conv", {"messages": msgs, "n": 2})
    rows = store._query(  # type: ignore[attr-defined]
        "SELECT fields FROM pitstop_checkpoints WHERE id = ?", (head.id,))
    ref = decode_field_map(bytes(rows[0][0]))["messages"]
    assert ref.manifest is not None
    keys = [e.key for e in decode_manifest(ref.manifest).root if is_chunk_key(e.key)]
    assert len(keys) >= 2
    return head.id, keys


# -- alias cycles ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["self", "pair"])
@pytest.mark.slow
def test_an_alias_cycle_is_corruption_naming_run_checkpoint_and_field(
    url: str, shape: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chunk row made an alias of itself, or two made aliases of each other, was followed
    without end: RecursionError from ``latest`` and exit 3 from ``show``/``diff``."""
    with pitstop.open_store(url) as store:
        head, keys = _chunked_run(store)
        first = store.history("conv")[-1].id
    pairs = [(keys[0], keys[0])] if shape == "self" else [
        (keys[0], keys[1]), (keys[1], keys[0])]
    for key, target in pairs:
        tamper(url, "UPDATE pitstop_blobs SET data = ?, alias = ?, size = ? WHERE hash = ?",
               (b"", target, 10, key))
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError) as info:
            store.latest("conv")
        error = info.value
        assert (error.run_id, error.checkpoint_id, error.field) == ("conv", head, "messages")
        with pytest.raises(pitstop.CorruptCheckpointError):
            store.get(head)
        problems = store.verify()
        assert any(p.kind == "blob" and "messages" in p.message and "loops" in p.message
                   for p in problems), problems
    for command in (["show", "conv"], ["diff", first, head]):
        code, _, err = cli(capsys, *command, store=url)
        assert code == 1, (command, err)
        assert "internal error" not in err and "messages" in err, err


# -- a BLOB column read back as TEXT --------------------------------------------------------


def _as_text(path: Path, sql: str) -> None:
    """Give a BLOB column the storage class TEXT, bytes unchanged: what one flipped bit in a
    SQLite record header does (serial type 2n+12 becomes 2n+13)."""
    with sqlite3.connect(path) as conn:
        conn.execute(sql)


@pytest.mark.parametrize("column", ["fields", "value"])
def test_a_blob_read_back_as_text_is_a_damaged_checkpoint(
    tmp_path: Path, column: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with pitstop.open_store(url) as store:
        ids = [store.save("a", {"n": n, "big": bytes([n]) * 5000 + b"\xff\xfe"}).id
               for n in range(3)]
    if column == "fields":
        _as_text(path, f"UPDATE pitstop_checkpoints SET fields = CAST(fields AS TEXT) "
                 f"WHERE id = '{ids[2]}'")
    else:  # the value row only the newest checkpoint refers to
        _as_text(path, "UPDATE pitstop_blobs SET data = CAST(data AS TEXT) "
                 "WHERE created_at = (SELECT MAX(created_at) FROM pitstop_blobs)")
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError) as info:
            store.latest("a")
        assert (info.value.run_id, info.value.checkpoint_id) == ("a", ids[2])
        if column == "value":
            assert info.value.field == "big"
        assert "TEXT" in str(info.value)
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[1] and found.state["n"] == 1
        assert len(found.skipped) == 1 and ids[2] in found.skipped[0]
        problems = store.verify()
        assert problems and all("TEXT" in p.message for p in problems), problems
        assert store.history("a")[0].id == ids[2]  # listing history reads no field map
    code, out, err = cli(capsys, "verify", store=url)
    assert code == 1 and "TEXT" in out, (out, err)
    code, out, err = cli(capsys, "show", "a", store=url)
    assert code == 1 and "internal error" not in err and ids[2] in err, err


# -- a lone surrogate in state ----------------------------------------------------------------


def test_a_lone_surrogate_in_state_is_shown_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python strings may hold a lone surrogate, which no UTF-8 output can: such a state
    saved and resumed, but ``pitstop show`` exited 2 and its inspector page answered 422.
    Both now show it escaped (``\\ud800``); the JSON outputs stay JSON that reads back to
    the very string."""
    import json

    url = f"sqlite:///{tmp_path / 'store.db'}"
    state = {"text": "a\ud800b", "keys": {"x\udcff": 1}}
    with pitstop.open_store(url) as store:
        head = store.save("r", state)
    code, out, err = cli(capsys, "show", "r", store=url)
    assert code == 0, err
    code, out, err = cli(capsys, "show", "r", "--json", store=url)
    assert code == 0, err
    assert json.loads(out)["state"] == state
    code, out, err = cli(capsys, "show", "r", "--field", "text", store=url)
    assert code == 0 and "\\ud800" in out, (out, err)

    pytest.importorskip("fastapi", reason="the ui extra is not installed")
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    with pitstop.open_store(url) as store, TestClient(create_app(store)) as client:
        page = client.get("/runs/r")
        assert page.status_code == 200 and "\\ud800" in page.text
        page = client.get(f"/runs/r?checkpoint={head.id}")
        assert page.status_code == 200
        second = store.save("r", {**state, "text": "c\udfffd"})
        for path in ("/api/runs/r", f"/api/checkpoints/{head.id}",
                     f"/api/checkpoints/{head.id}?path=text",
                     f"/api/checkpoints/{second.id}/diff"):
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.text)
            json.loads(answer.content)
        assert client.get(f"/api/checkpoints/{head.id}").json()["state"] == state


# -- run ids every backend can keep ---------------------------------------------------------


@pytest.mark.parametrize("run_id", ["a\x00b", "\x00", "a\ud800b"])
def test_a_run_id_no_backend_can_keep_is_refused_alike_everywhere(url: str, run_id: str) -> None:
    """SQLite took a run id holding NUL (which ``verify`` then reported as a damaged row)
    and PostgreSQL refused it with a StoreError: one check, before any SQL, for both."""
    wf = pitstop.Workflow("ids")
    wf.step(name="one")(lambda state, ctx: {"done": True})
    with pitstop.open_store(url) as store:
        with pytest.raises(ValueError, match="run_id") as info:
            store.save(run_id, {"n": 1})
        assert not isinstance(info.value, pitstop.StoreError)
        with pytest.raises(ValueError, match="run_id"):
            wf.start(store, {"n": 1}, run_id=run_id)
        with pytest.raises(ValueError, match="run_id"):
            wf.enqueue(store, {"n": 1}, run_id=run_id)
        assert store.runs() == [] and store.verify() == []
        store.save("plain-é", {"n": 1})  # non-ASCII text is fine
        assert store.latest("plain-é") is not None


@pytest.mark.parametrize("bad", ["a\x00b", "\x00", "a\ud800b"])
def test_a_workflow_name_no_backend_can_keep_is_refused_alike_everywhere(
    store_url: str, bad: str
) -> None:
    """SQLite stored a workflow name holding NUL, PostgreSQL refused it (a StoreError), a
    lone surrogate failed as a raw UnicodeEncodeError: one check for every backend, a
    ValueError naming the field, nothing written."""
    with pitstop.open_store(store_url) as store:
        with pytest.raises(ValueError, match="workflow") as info:
            store.create_run("r1", workflow=bad)
        assert not isinstance(info.value, pitstop.StoreError)
        with pytest.raises(ValueError, match="workflow"):
            store.save("r2", {"n": 1}, workflow=bad)
        head = store.save("r3", {"n": 1}, workflow="fine")
        with pytest.raises(ValueError, match="workflow"):
            store.save("r3", {"n": 2}, workflow=bad)
        wf = pitstop.Workflow(bad)
        wf.step(name="one")(lambda state, ctx: {"done": True})
        with pytest.raises(ValueError, match="workflow"):
            wf.start(store, {"n": 1}, run_id="r4")
        with pytest.raises(ValueError, match="workflow"):
            wf.enqueue(store, {"n": 1}, run_id="r5")
        assert [run.id for run in store.runs()] == ["r3"]
        assert store.latest("r3").id == head.id  # type: ignore[union-attr]
        assert store.verify() == []
        store.save("r6", {"n": 1}, workflow="flux-é")  # non-ASCII text is fine
        assert store.get_run("r6").workflow == "flux-é"


@pytest.mark.parametrize(("metadata", "field"), [
    ({"note": "a\x00b"}, "metadata.note"),
    ({"note": "a\ud800b"}, "metadata.note"),
    ({"deep": {"list": [1, "\x00"]}}, "metadata.deep.list[1]"),
    ({"k\x00": 1}, "the key"),
    ({"\ud800": 1}, "the key"),
])
def test_metadata_no_backend_can_keep_is_refused_alike_everywhere(
    store_url: str, metadata: dict[str, Any], field: str
) -> None:
    """Metadata holding NUL was stored by SQLite and by PostgreSQL as JSON text that its
    jsonb (metadata filters) refuses; a lone surrogate failed as a raw UnicodeEncodeError.
    Now one check for every backend: a SerializationError naming run and field."""
    with pitstop.open_store(store_url) as store:
        with pytest.raises(pitstop.SerializationError, match=r"NUL|surrogate") as info:
            store.create_run("r1", metadata=metadata)
        assert field in str(info.value) and "'r1'" in str(info.value)
        head = store.save("r2", {"n": 1})
        with pytest.raises(pitstop.SerializationError, match=r"NUL|surrogate") as info:
            store.save("r2", {"n": 2}, metadata=metadata)
        assert field in str(info.value)
        with pytest.raises(pitstop.SerializationError, match=r"NUL|surrogate"):
            store.save("r2", {"n": 2}, changed=["n"], metadata=metadata)
        assert [run.id for run in store.runs()] == ["r2"]
        assert store.latest("r2").id == head.id  # type: ignore[union-attr]
        fine = {"note": "café \\u0000 (a backslash, not a NUL)", "n": None}
        store.save("r2", {"n": 3}, metadata=fine)
        assert store.latest("r2").metadata == fine  # type: ignore[union-attr]
        store.create_run("r3", metadata=fine)
        assert [run.id for run in store.runs(metadata={"note": fine["note"]})] == ["r3"]
        assert store.verify() == []


# -- raw Python exceptions that escaped ---------------------------------------------------------


def test_a_schema_naming_a_table_by_bytes_not_text_is_a_store_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python's sqlite3 raises ``UnicodeDecodeError``, not a DatabaseError, when SQLite's
    message is not UTF-8: a damaged schema naming a table ``pi\\xff`` made ``open_store``
    raise it raw."""
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with pitstop.open_store(url) as store:
        store.save("a", {"n": 1})
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET name = CAST(x'7069ff' AS TEXT) "
                     "WHERE name = 'pitstop_runs'")
    with pytest.raises(pitstop.StoreError, match=r"too damaged to open.*pi\\xff"):
        pitstop.open_store(url)
    code, _, err = cli(capsys, "runs", store=url)
    assert code == 2 and "too damaged to open" in err and "internal error" not in err, err


_UNREADABLE = """
import sys, pitstop
url = sys.argv[1]
with pitstop.open_store(url) as store:
    try:
        store.latest("a")
    except pitstop.StoreError as exc:
        print("StoreError:", exc)
    try:
        store.latest("a", fallback=True)
    except pitstop.StoreError as exc:
        print("StoreError:", exc)
"""


@pytest.mark.slow
def test_an_unreadable_blob_directory_is_a_store_error(tmp_path: Path) -> None:
    """``latest()`` raised a raw ``PermissionError`` when the blob directory could not be
    read. Root reads any file, so as root the reader runs without the capabilities that
    let it (setpriv drops them)."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    blobs = tmp_path / "blobs"
    url = f"sqlite:///{tmp_path / 'store.db'}?blobs={blobs}&blob_threshold=1000"
    with pitstop.open_store(url) as store:
        store.save("a", {"big": os.urandom(5000)})
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv (util-linux) to read as root without DAC override")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}"}
    blobs.chmod(0o000)
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", _UNREADABLE, url],
                              capture_output=True, text=True, env=env, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 2 and all("Permission denied" in line and str(blobs) in line
                                       for line in lines), done.stdout
        done = subprocess.run([*prefix, sys.executable, "-m", "pitstop", "show", "a",
                               "--store", url], capture_output=True, text=True, env=env,
                              timeout=60, check=False)
        assert done.returncode == 2 and "Permission denied" in done.stderr, done.stderr
        assert "internal error" not in done.stderr
    finally:
        blobs.chmod(0o755)
