"""Hostile input and damaged stores: crafted archives, tampered rows, bad URLs, odd values.

Each case is something an adversarial run against pitstop found: an archive that was half
imported and then broke `pitstop runs`, a run row pointing at another run's checkpoint, an
index damaged under `verify`, options accepted silently. Stores are real SQLite files and
PostgreSQL schemas, tampered with by plain SQL from outside pitstop.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
import zstandard

import pitstop
from conftest import BACKENDS, PG_URL, drop_pg_schema, pg_schema_url
from pitstop import Store
from pitstop.cli.app import run as cli_run
from pitstop.store.encoding.records import CheckpointRecord, decode_field_map, encode_field_map
from pitstop.store.engine.schema import SELECT_CHECKPOINT

SQL_BACKENDS = [b for b in BACKENDS if b != "memory"]


@pytest.fixture(params=SQL_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        schema = f"h_{uuid.uuid4().hex[:12]}"
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


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *args: str, store: str) -> tuple[int, str, str]:
        code = cli_run([*args, "--store", store])
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], err
    return lines[0]


# -- values that save must load, and show (item 4) ----------------------------------------------


def test_a_huge_int_in_state_shows_and_loads(tmp_path: Path, cli: Cli) -> None:
    url = f"sqlite:///{tmp_path / 'big.db'}"
    with pitstop.open_store(url) as store:
        store.save("r", {"n": 10**5000, "small": 1})
        assert store.latest("r").state["n"] == 10**5000  # type: ignore[union-attr]
    code, out, err = cli("show", "r", store=url)
    assert code == 0, err
    assert "5,001 digits" in out
    code, out, err = cli("show", "r", "--json", store=url)
    assert code == 0, err
    assert json.loads(out)


# -- archives (item 3 and the size limits) ----------------------------------------------


def write_frames(path: Path, frames: list[Mapping[str, Any]]) -> None:
    """An archive of exactly these frames (after the header), checksummed as a real one, its
    sizes declared honestly unless the header declares some: what a hostile writer who read
    archive.py can produce."""
    from pitstop import archive

    if "sizes" not in frames[0]:
        lengths = [len(ormsgpack.packb(frame)) for frame in frames[1:]]
        sizes = {"frames": sum(4 + n for n in lengths), "largest": max(lengths, default=0)}
        frames = [{**frames[0], "sizes": sizes}, *frames[1:]]
    hasher = hashlib.sha256()
    body = bytearray()
    for frame in frames:
        packed = ormsgpack.packb(frame)
        framed = struct.pack(">I", len(packed)) + packed
        hasher.update(framed)
        body += framed
    end = ormsgpack.packb({"t": "end", "frames": len(frames), "sha256": hasher.hexdigest()})
    body += struct.pack(">I", len(end)) + end
    path.write_bytes(archive.MAGIC + zstandard.ZstdCompressor().compress(bytes(body)))


def export_frames(store: Store, run_id: str) -> list[dict[str, Any]]:
    from pitstop import archive

    data = store.export_run(run_id)
    header = {"t": "header", "format": "pitstop-archive", "version": archive.VERSION,
              "created": "now",
              "source": {"kind": "sqlite"}, "run_id": run_id, "counts": {}}
    out: list[dict[str, Any]] = [header, {"t": "run", **asdict(data.run)}]
    out += [{"t": "value", "hash": h, "data": d} for h, d in data.blobs.items()]
    out += [{"t": "checkpoint", **{f.name: getattr(r, f.name) for f in fields(r)}}
            for r in data.checkpoints]
    out += [{"t": "input", **asdict(i)} for i in data.inputs]
    out += [{"t": "effect", **asdict(e)} for e in data.effects]
    return out


def _edit(kind: str, **changes: Any) -> Callable[[list[dict[str, Any]]], None]:
    def apply(frames: list[dict[str, Any]]) -> None:
        next(f for f in frames if f["t"] == kind).update(changes)

    return apply


def _drop(kind: str, key: str) -> Callable[[list[dict[str, Any]]], None]:
    def apply(frames: list[dict[str, Any]]) -> None:
        del next(f for f in frames if f["t"] == kind)[key]

    return apply


def _duplicate(kind: str) -> Callable[[list[dict[str, Any]]], None]:
    def apply(frames: list[dict[str, Any]]) -> None:
        frame = next(f for f in frames if f["t"] == kind)
        frames.insert(frames.index(frame), dict(frame))

    return apply


HOSTILE: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "run metadata not JSON": (_edit("run", metadata="not json"), "run record"),
    "waiting_for not JSON": (_edit("run", waiting_for='{"x'), "run record"),
    "unknown status": (_edit("run", status="bogus"), "run record"),
    "created_at a string": (_edit("run", created_at="yesterday"), "run record"),
    "priority 2**63": (_edit("run", priority=2**63), "run record"),
    # Every format-3 archive names the run's parent (format 3 came after parent_run).
    "run without parent_run": (_drop("run", "parent_run"), "run record"),
    "size -1": (_edit("checkpoint", size=-1), "checkpoint"),
    "size a dict": (_edit("checkpoint", size={"a": 1}), "checkpoint"),
    "hash of the wrong type": (_edit("value", hash="abc"), "value"),
    "duplicate checkpoint": (_duplicate("checkpoint"), "checkpoint"),
    "duplicate effect": (_duplicate("effect"), "effect"),
}





@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_archive_is_refused_whole_in_one_line(
    tmp_path: Path, cli: Cli, case: str, url: str
) -> None:
    source = pitstop.open_store(f"sqlite:///{tmp_path / 'source.db'}")
    wf = pitstop.Workflow("hostile")
    wf.step(name="one")(lambda state, ctx: {"r": ctx.effect("e", lambda: 1), "big": "x" * 100})
    wf.start(source, {}, run_id="victim")
    frames = export_frames(source, "victim")
    source.close()
    mangle, names = HOSTILE[case]
    mangle(frames)
    path = tmp_path / "hostile.pitstop"
    write_frames(path, frames)
    with pitstop.open_store(url) as store:
        store.save("bystander", {"a": 1})
    code, out, err = cli("import", str(path), store=url)
    assert code == 2, (code, out, err)
    assert names in one_line(err)
    code, out, err = cli("runs", "--json", store=url)
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["runs"]] == ["bystander"]  # nothing written



def _victim_frames(tmp_path: Path) -> list[dict[str, Any]]:
    with pitstop.open_store(f"sqlite:///{tmp_path / 'source.db'}") as source:
        source.save("victim", {"n": 1, "blob": os.urandom(3000)})
        return export_frames(source, "victim")


def _zstd_bomb(path: Path, header: Mapping[str, Any], length: int) -> None:
    """A header, then a frame claiming ``length`` bytes followed by that many zeros: 2 GiB
    of zeros compress to about 65 KB."""
    from pitstop import archive

    packed = ormsgpack.packb(header)
    with path.open("wb") as fh:
        fh.write(archive.MAGIC)
        with zstandard.ZstdCompressor(level=3).stream_writer(fh, closefd=False) as out:
            out.write(struct.pack(">I", len(packed)) + packed + struct.pack(">I", length))
            zeros = bytes(16 << 20)
            for _ in range(length // len(zeros)):
                out.write(zeros)
            out.write(bytes(length % len(zeros)))


@pytest.mark.parametrize(
    ("declared", "reason"),
    [
        ({"version": 1}, "archive format 1 is not supported"),  # no sizes: a pre-release format
        ({"sizes": {"frames": 2**31 + 10, "largest": 2**31 - 1}}, "damaged archive"),
        ({"sizes": {"frames": 1000, "largest": 500}}, "damaged archive"),
    ],
    ids=["format-1", "declared-honestly", "declared-small"],
)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="measures through /proc")
@pytest.mark.slow
def test_an_archive_inflating_to_2_gib_is_refused_in_little_memory(
    tmp_path: Path, declared: Mapping[str, Any], reason: str
) -> None:
    import subprocess
    import sys

    from conftest import ROOT
    from pitstop import archive

    header = {"t": "header", "format": "pitstop-archive", "version": archive.VERSION,
              "created": "now", "source": {"kind": "sqlite"}, "run_id": "bomb", "counts": {},
              **declared}
    bomb = tmp_path / "bomb.pitstop"
    _zstd_bomb(bomb, header, 2**31 - 1)
    assert bomb.stat().st_size < 100_000
    # The peak resident size of this process image (VmHWM starts afresh at exec, unlike
    # ru_maxrss, which counts the forked copy of a large test process too).
    probe = (
        "import re, sys\n"
        "from pitstop.cli.app import run\n"
        "code = run(['import', sys.argv[1], '--store', sys.argv[2]])\n"
        "status = open('/proc/self/status').read()\n"
        "print(code, int(re.search(r'VmHWM:\\s+(\\d+)', status).group(1)) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(bomb), f"sqlite:///{tmp_path / 't.db'}"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    code, peak_mib = map(int, done.stdout.split())
    assert code == 2, done.stderr
    assert reason in one_line(done.stderr)
    assert peak_mib < 200, peak_mib  # the interpreter and pitstop: nothing of the 2 GiB
    assert not (tmp_path / "t.db").exists()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="measures through /proc")
@pytest.mark.slow
def test_export_streams_a_run_larger_than_its_memory_bound(tmp_path: Path, cli: Cli) -> None:
    """``pitstop export`` of a run of 96 MiB of values (24 checkpoints, a new random 4 MiB
    value each) in a fresh process: the values are read one at a time, so neither the
    Python heap (tracemalloc) nor the process (VmHWM) grows by anything near the run's
    size (it held the whole run before). The archive imports back bit for bit."""
    import subprocess
    import sys

    from conftest import ROOT

    source = f"sqlite:///{tmp_path / 'big.db'}"
    with pitstop.open_store(source) as store:
        for n in range(24):
            store.save("big", {"n": n, "blob": os.urandom(4 << 20)})
        head = store.latest("big")
        assert head is not None
    probe = (
        "import re, sys, tracemalloc\n"
        "import pitstop\n"
        "from pitstop.archive import write_archive\n"
        "def hwm():\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])\n"
        "store = pitstop.open_store(sys.argv[1])\n"
        "store.get_run('big')\n"
        "before = hwm()\n"
        "tracemalloc.start()\n"
        "write_archive(store, 'big', sys.argv[2])\n"
        "peak = tracemalloc.get_traced_memory()[1]\n"
        "print(peak >> 20, (hwm() - before) >> 10)\n"
    )
    archive = tmp_path / "big.pitstop"
    done = subprocess.run(
        [sys.executable, "-c", probe, source, str(archive)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    heap_mib, grown_mib = map(int, done.stdout.split())
    assert heap_mib < 32, heap_mib  # a value and its frame at a time, not 96 MiB
    assert grown_mib < 48, grown_mib
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    code, _, err = cli("import", str(archive), store=target)
    assert code == 0, err
    with pitstop.open_store(target) as store:
        copy = store.latest("big")
        assert copy is not None and copy.id == head.id and copy.state == head.state
        assert store.verify() == []


def test_declared_sizes_and_counts_must_match_the_frames(tmp_path: Path, cli: Cli) -> None:
    frames = _victim_frames(tmp_path)
    url = f"sqlite:///{tmp_path / 'target.db'}"
    body = sum(4 + len(ormsgpack.packb(f)) for f in frames[1:])
    largest = max(len(ormsgpack.packb(f)) for f in frames[1:])
    cases = {
        "fewer bytes": ({"frames": body - 1, "largest": largest}, {}, "do not add up"),
        "more bytes": ({"frames": body + 1, "largest": largest}, {}, "do not add up"),
        "smaller largest": ({"frames": body, "largest": largest - 1}, {}, "larger than"),
        "counts": ({"frames": body, "largest": largest}, {"checkpoints": 2}, "declares 2"),
        "sizes not numbers": ({"frames": "lots", "largest": largest}, {}, "declared sizes"),
    }
    for case, (sizes, counts, reason) in cases.items():
        frames[0] = {**frames[0], "sizes": sizes, "counts": counts}
        path = tmp_path / f"{case}.pitstop"
        write_frames(path, frames)
        code, _, err = cli("import", str(path), store=url)
        assert code == 2 and reason in one_line(err), (case, err)
    frames[0] = {**frames[0], "sizes": {"frames": body, "largest": largest}, "counts": {}}
    write_frames(tmp_path / "exact.pitstop", frames)
    code, _, err = cli("import", str(tmp_path / "exact.pitstop"), store=url)
    assert code == 0, err


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ({"version": 1}, "archive format 1 is not supported; this pitstop reads format 3"),
        ({"version": 2}, "archive format 2 is not supported; this pitstop reads format 3"),
        ({"version": "3"}, "archive format '3' is not supported"),
        ({"sizes": None}, "damaged archive (its declared sizes are None)"),
    ],
    ids=["format-1", "format-2", "version-not-a-number", "no-sizes"],
)
def test_an_archive_of_a_pre_release_format_is_refused(
    tmp_path: Path, cli: Cli, header: Mapping[str, Any], reason: str
) -> None:
    """Archive formats 1 and 2 (the second without declared sizes or attached records) came
    before the first release: nothing to import from them, so they are refused, not read."""
    frames = _victim_frames(tmp_path)
    frames[0] = {**frames[0], **header}
    write_frames(tmp_path / "old.pitstop", frames)
    code, _, err = cli("import", str(tmp_path / "old.pitstop"),
                       store=f"sqlite:///{tmp_path / 't.db'}")
    assert code == 2 and reason in one_line(err), err


def test_an_export_declares_its_sizes_and_a_bad_value_is_refused_as_read(
    tmp_path: Path, cli: Cli
) -> None:
    from pitstop import archive

    with pitstop.open_store(f"sqlite:///{tmp_path / 'source.db'}") as source:
        source.save("victim", {"text": "a value stored on its own " * 4})
        archive.write_archive(source, "victim", tmp_path / "real.pitstop")
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(
        (tmp_path / "real.pitstop").read_bytes()[len(archive.MAGIC):]
    )
    (length,) = struct.unpack(">I", raw[:4])
    header = ormsgpack.unpackb(raw[4 : 4 + length])
    assert header["sizes"]["frames"] > header["sizes"]["largest"] > 0

    frames = _victim_frames(tmp_path)
    value = next(f for f in frames if f["t"] == "value")
    value["data"] = b"\x00" * len(value["data"])
    write_frames(tmp_path / "bad.pitstop", frames)
    code, _, err = cli("import", str(tmp_path / "bad.pitstop"),
                       store=f"sqlite:///{tmp_path / 't.db'}")
    assert code == 2 and "malformed value record" in one_line(err), err



@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="measures through /proc")
@pytest.mark.slow
def test_import_memory_does_not_grow_with_the_archive(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import ROOT
    from pitstop import archive

    with pitstop.open_store(f"sqlite:///{tmp_path / 'source.db'}") as source:
        for i in range(12):  # 192 MiB of values that do not compress
            source.save("big", {f"v{j}": os.urandom(1 << 20) for j in range(16)},
                        metadata={"i": i})
        archive.write_archive(source, "big", tmp_path / "big.pitstop")
    probe = (
        "import re, sys\n"
        "from pitstop.cli.app import run\n"
        "code = run(['import', sys.argv[1], '--store', sys.argv[2]])\n"
        "status = open('/proc/self/status').read()\n"
        "print(code, int(re.search(r'VmHWM:\\s+(\\d+)', status).group(1)) // 1024)\n"
    )
    target = f"sqlite:///{tmp_path / 'target.db'}"
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "big.pitstop"), target],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    code, peak_mib = map(int, done.stdout.split()[-2:])
    assert code == 0, done.stderr
    assert peak_mib < 150, peak_mib  # the values are spooled, not all held
    with pitstop.open_store(target) as imported:
        assert imported.verify() == []
        assert len(imported.history("big")) == 12


# -- URL options (items 5 and 8) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "option"),
    [("busy_timeout=nan", "busy_timeout"), ("busy_timeout=-1", "busy_timeout"),
     ("compress_threshold=-5", "compress_threshold"), ("blob_threshold=-1", "blob_threshold"),
     ("durability=maybe", "durability")],
)
def test_bad_sqlite_url_options_are_refused_naming_the_option(
    tmp_path: Path, cli: Cli, query: str, option: str
) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    pitstop.open_store(url).close()
    with pytest.raises(pitstop.UnsupportedStoreError, match=option):
        pitstop.open_store(f"{url}?{query}")
    code, _, err = cli("runs", store=f"{url}?{query}")
    assert code == 2 and option in one_line(err)


@pytest.mark.skipif("postgres" not in BACKENDS, reason="no PostgreSQL backend")
@pytest.mark.parametrize(
    ("query", "option"),
    [("statement_timeout=nan", "statement_timeout"), ("connect_timeout=inf", "connect_timeout"),
     ("busy_timeout=nan", "busy_timeout"), ("compress_threshold=-5", "compress_threshold"),
     ("schema=", "schema"), ("schema=" + "s" * 64, "schema"), ("schema=" + "é" * 32, "schema"),
     ("pool_max=0", "pool_max"), ("pool_min=-1", "pool_min"), ("pool_max=1.5", "pool_max"),
     ("statement_timeout=-1", "statement_timeout"), ("blob_threshold=x", "blob_threshold"),
     ("durability=off", "durability")],
)
def test_bad_postgres_url_options_are_refused_at_once(
    cli: Cli, query: str, option: str
) -> None:
    import time

    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}{query}"
    started = time.monotonic()
    with pytest.raises(pitstop.UnsupportedStoreError, match=option):
        pitstop.open_store(url)
    assert time.monotonic() - started < 2  # not after a pool timeout
    code, _, err = cli("runs", store=url)
    assert code == 2 and option in one_line(err)


@pytest.mark.parametrize(
    ("options", "option"),
    [({"busy_timeout": float("nan")}, "busy_timeout"), ({"busy_timeout": "5"}, "busy_timeout"),
     ({"compress_threshold": True}, "compress_threshold"),
     ({"compress_threshold": 1.5}, "compress_threshold"),
     ({"blob_threshold": -1}, "blob_threshold"), ({"durability": "off"}, "durability")],
)
def test_bad_keyword_options_are_refused_like_url_ones(
    tmp_path: Path, options: dict[str, Any], option: str
) -> None:
    path = tmp_path / "kw.db"
    with pytest.raises(pitstop.UnsupportedStoreError, match=f"option '{option}' must be"):
        pitstop.open_store(f"sqlite:///{path}", **options)
    assert not path.exists()  # refused before the file was made


def test_good_url_options_still_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ok.db'}?busy_timeout=0.5&compress_threshold=none"
    with pitstop.open_store(url + "&blob_threshold=0&durability=full") as store:
        assert store.busy_timeout == 0.5  # type: ignore[attr-defined]
        assert store.save("r", {"a": 1}).state == {"a": 1}


@pytest.mark.skipif("postgres" not in BACKENDS, reason="no PostgreSQL backend")
def test_a_schema_name_of_63_bytes_is_taken_and_one_of_64_refused() -> None:
    from pitstop.store.backends.postgres import PostgresStore

    name = f"h{uuid.uuid4().hex[:8]}_" + "é" * 26 + "x"  # 10 + 52 + 1 = 63 bytes
    assert len(name.encode()) == 63
    try:
        with PostgresStore(PG_URL, schema=name) as store:
            assert store.schema == name
            store.save("r", {"a": 1})
    finally:
        drop_pg_schema(name)
    with pytest.raises(pitstop.UnsupportedStoreError, match="at most 63 bytes, not 64"):
        PostgresStore(PG_URL, schema=name + "y")


# -- run rows (medium: the runs table is protected like checkpoints) ------------------------


def test_a_head_pointing_at_another_runs_checkpoint_is_corruption(url: str) -> None:
    with pitstop.open_store(url) as store:
        store.save("a", {"who": "a"})
        b = store.save("b", {"who": "b"})
        tamper(url, "UPDATE pitstop_runs SET head_id = ? WHERE run_id = 'a'", (b.id,))
        with pytest.raises(pitstop.CorruptCheckpointError, match="run 'b'"):
            store.latest("a")
        assert any(p.run_id == "a" or p.id == "a" for p in store.verify())


def test_a_head_pointing_nowhere_is_corruption_not_an_empty_run(url: str) -> None:
    with pitstop.open_store(url) as store:
        store.save("a", {"n": 1})
        tamper(url, "UPDATE pitstop_runs SET head_id = 'nowhere' WHERE run_id = 'a'")
        with pytest.raises(pitstop.CorruptCheckpointError):
            store.latest("a")
        assert store.verify()


@pytest.mark.parametrize(
    "damage",
    ["status = 'bogus'", "metadata = 'not json'", "waiting_for = '{\"x'", "metadata = '[1]'"],
)
def test_a_damaged_run_row_is_reported_and_the_others_still_listed(
    url: str, cli: Cli, damage: str
) -> None:
    with pitstop.open_store(url) as store:
        for name in ("good-1", "bad", "good-2"):
            store.save(name, {"n": 1})
    tamper(url, f"UPDATE pitstop_runs SET {damage} WHERE run_id = 'bad'")
    with pitstop.open_store(url) as store:
        assert {r.id for r in store.runs()} == {"good-1", "good-2"}
        assert any("bad" in (p.run_id, p.id) for p in store.verify())
    code, out, err = cli("runs", store=url)
    assert code == 1, err  # listed, and the damage reported
    assert "good-1" in out and "good-2" in out
    assert "bad" in err and "pitstop verify" in err


# -- filters (item 7) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filters", "error", "names"),
    [({"metadata": {"k": object()}}, TypeError, "metadata filter 'k'"),
     ({"metadata": {"k": float("nan")}}, ValueError, "metadata filter 'k'"),
     ({"metadata": {"k": {"deep": object()}}}, TypeError, "metadata filter 'k'"),
     ({"metadata": {"": 1}}, ValueError, "metadata key"),
     ({"metadata": {"k": [1, 2**70]}, "status": ["queued"]}, None, None),
     ({"metadata": {1: 1}}, TypeError, "metadata key"),
     ({"status": "bogus"}, ValueError, "status 'bogus'"),
     ({"status": ["queued", 5]}, ValueError, "status 5"),
     ({"workflow": 5}, TypeError, "workflow"),
     ({"since": "yesterday"}, TypeError, "since"),
     ({"until": float("nan")}, ValueError, "until"),
     ({"id_prefix": b"r"}, TypeError, "id_prefix"),
     ({"limit": -1}, ValueError, "limit"),
     ({"limit": "5"}, TypeError, "limit"),
     ({"offset": -1}, ValueError, "offset"),
     ({"before": 3}, TypeError, "before")],
)
def test_filter_values_are_refused_clearly(
    url: str, filters: dict[str, Any], error: type[Exception] | None, names: str
) -> None:
    with pitstop.open_store(url) as store:
        store.save("r", {"a": 1})
        store.update_run("r", metadata={"k": 1})
        if error is None:  # a filter that is fine, and matches nothing
            assert store.runs(**filters) == []
            return
        with pytest.raises(error, match=names):
            store.runs(**filters)
        if "limit" not in filters and "offset" not in filters and "before" not in filters:
            with pytest.raises(error, match=names):
                store.count_runs(**filters)
        assert [r.id for r in store.runs(metadata={"k": 1})] == ["r"]  # still usable


def test_a_metadata_filter_of_a_huge_int_is_answered_or_refused_clearly(url: str) -> None:
    with pitstop.open_store(url) as store:
        store.save("r", {"a": 1})
        store.update_run("r", metadata={"k": 2**70})
        if url.startswith("sqlite"):
            with pytest.raises(ValueError, match="metadata filter 'k': SQLite compares"):
                store.runs(metadata={"k": 2**70})
        else:
            assert [r.id for r in store.runs(metadata={"k": 2**70})] == ["r"]


# -- a damaged SQLite file (item 7) --------------------------------------------------------------


def _damage_table(path: Path, table: str) -> None:
    """Overwrite the header of ``table``'s root page, as a disk or a stray write might."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                             (table,)).fetchone()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * 8)


def _sqlite_store(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "damaged.db"
    url = f"sqlite:///{path}"
    with pitstop.open_store(url) as store:
        for n in range(3):
            store.save("r", {"n": n})
    return path, url


def test_a_damaged_table_is_corruption_naming_the_file(tmp_path: Path, cli: Cli) -> None:
    path, url = _sqlite_store(tmp_path)
    _damage_table(path, "pitstop_runs")
    with pitstop.open_store(url) as store, \
            pytest.raises(pitstop.CorruptCheckpointError, match=str(path)):
        store.runs()
    code, _, err = cli("runs", store=url)
    assert code == 1, err
    line = one_line(err)
    assert str(path) in line and "damaged" in line and "pitstop verify" in line


def test_a_damaged_column_is_corruption_not_an_internal_error(tmp_path: Path, cli: Cli) -> None:
    path, url = _sqlite_store(tmp_path)
    with sqlite3.connect(path) as db:  # what a flipped byte in the schema text can do
        db.execute("ALTER TABLE pitstop_checkpoints RENAME COLUMN size TO sise")
    with pitstop.open_store(url) as store, \
            pytest.raises(pitstop.CorruptCheckpointError, match="no such column"):
        store.history("r")
    code, _, err = cli("history", "r", store=url)
    assert code == 1, err
    assert str(path) in one_line(err)


def test_a_file_too_damaged_to_open_says_so(tmp_path: Path, cli: Cli) -> None:
    path, url = _sqlite_store(tmp_path)
    with open(path, "r+b") as f:  # page 1 holds the schema: its b-tree header follows the
        f.seek(100)  # 100-byte file header
        f.write(b"\xff" * 8)
    with pytest.raises(pitstop.StoreError, match="too damaged to open"):
        pitstop.open_store(url)
    code, _, err = cli("runs", store=url)
    assert code == 2 and ".recover" in one_line(err)


def test_random_byte_flips_never_end_in_an_internal_error(tmp_path: Path, cli: Cli) -> None:
    """Each trial flips three random bits of a small store, then reads it the usual ways:
    the answer may be right, a corrupt record (exit 1) or an unusable store (exit 2), each
    one line, never an internal error (exit 3; 4 of 600 trials before)."""
    import random
    import shutil

    base = tmp_path / "base.db"
    wf = pitstop.Workflow("flips")

    @wf.step
    def grow(state: dict[str, Any], ctx: pitstop.StepContext) -> Any:
        n = state.get("n", 0)
        ctx.effect(f"e{n}", lambda: n)
        if n < 5:
            items = [*state.get("items", []), "x" * 40 * n]
            return pitstop.goto("grow", {"n": n + 1, "items": items})
        return {"n": n}

    with pitstop.open_store(f"sqlite:///{base}") as store:
        for i in range(6):
            wf.start(store, {"i": i}, run_id=f"run-{i}")
    size = base.stat().st_size
    damaged = tmp_path / "damaged.db"
    url = f"sqlite:///{damaged}"
    for trial in range(40):
        rnd = random.Random(trial)
        shutil.copy(base, damaged)
        with open(damaged, "r+b") as f:
            for _ in range(3):
                f.seek(at := rnd.randrange(size))
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ (1 << rnd.randrange(8))]))
        for command in (["runs"], ["show", "run-3"], ["history", "run-4"], ["verify"]):
            code, _, err = cli(*command, store=url)
            assert code in (0, 1, 2) and "internal error" not in err, (trial, command, err)


# -- fallback past corruption (item 6) ------------------------------------------------------


def _five(store: Store) -> list[str]:
    return [store.save("a", {"n": n, "text": f"value {n} " * 20}).id for n in range(5)]


@pytest.mark.parametrize("parent", ["nowhere", "oldest"])
def test_fallback_does_not_trust_a_corrupt_heads_parent_link(url: str, parent: str) -> None:
    with pitstop.open_store(url) as store:
        ids = _five(store)
        target = "nowhere" if parent == "nowhere" else ids[0]
        tamper(url, "UPDATE pitstop_checkpoints SET parent_id = ? WHERE id = ?", (target, ids[4]))
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError, match="checksum"):
            store.latest("a")
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[3] and found.state["n"] == 3
        assert len(found.skipped) == 1 and ids[4] in found.skipped[0]
        _, head = store.latest_with_run("a", fallback=True)
        assert head is not None and head.id == ids[3]


def test_fallback_passes_an_unreadable_field_map(url: str) -> None:
    with pitstop.open_store(url) as store:
        ids = _five(store)
        tamper(url, "UPDATE pitstop_checkpoints SET fields = ? WHERE id IN (?, ?)",
               (b"\xc1\xc1", ids[4], ids[3]))
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError):
            store.latest("a")
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[2]
        assert [s.split(":")[0] for s in found.skipped] == [ids[4], ids[3]]
        _, head = store.latest_with_run("a", fallback=True)
        assert head is not None and head.id == ids[2]


def test_a_re_checksummed_value_with_trailing_bytes_is_corruption(url: str) -> None:
    """Bytes appended to a small (inline) value, with the record's checksum made to match
    again: the checksum cannot tell, but pitstop never writes bytes after a value, so a load
    names the field as corrupt, ``fallback=True`` passes the checkpoint and ``verify``
    reports it (it was a SerializationError, which fallback does not pass)."""
    with pitstop.open_store(url) as store:
        ids = _five(store)
        rows = store._query(SELECT_CHECKPOINT + " WHERE id = ?", (ids[4],))  # type: ignore[attr-defined]
    record = CheckpointRecord(*rows[0])
    fields = decode_field_map(record.fields)
    assert fields["n"].inline is not None
    fields["n"] = fields["n"]._replace(inline=fields["n"].inline + b"\x00")
    record.fields = encode_field_map(fields)
    tamper(url, "UPDATE pitstop_checkpoints SET fields = ?, checksum = ? WHERE id = ?",
           (record.fields, record.compute_checksum(), ids[4]))
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError, match="trailing") as info:
            store.latest("a")
        assert (info.value.run_id, info.value.checkpoint_id, info.value.field) == ("a", ids[4], "n")
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[3] and found.state["n"] == 3
        problems = store.verify()
        assert [(p.kind, p.id) for p in problems] == [("checkpoint", ids[4])], problems


def test_fallback_never_goes_past_the_head_to_newer_checkpoints(url: str) -> None:
    with pitstop.open_store(url) as store:
        ids = _five(store)
        # The run was moved back to checkpoint 2 (3 and 4 are a branch it left); 2 rots.
        tamper(url, "UPDATE pitstop_runs SET head_id = ? WHERE run_id = 'a'", (ids[2],))
        tamper(url, "UPDATE pitstop_checkpoints SET step = step + 9 WHERE id = ?", (ids[2],))
    with pitstop.open_store(url) as store:
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[1]


@pytest.mark.parametrize("head", ["another run's", "nowhere"])
def test_fallback_from_a_head_outside_the_run_takes_its_newest_valid(url: str, head: str) -> None:
    with pitstop.open_store(url) as store:
        ids = _five(store)
        other = store.save("b", {"who": "b"}).id
        tamper(url, "UPDATE pitstop_runs SET head_id = ? WHERE run_id = 'a'",
               (other if head == "another run's" else "nowhere",))
    with pitstop.open_store(url) as store:
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[4] and found.run_id == "a"
        assert len(found.skipped) == 1
        _, via_run = store.latest_with_run("a", fallback=True)
        assert via_run is not None and via_run.id == ids[4]


def test_fallback_on_a_branched_run_stays_on_the_runs_own_branch(url: str) -> None:
    """A run resumed from checkpoint 1 (``resume --from``) left 2..4 on a branch of their
    own; the two checkpoints of its branch rot. By stored order the newest valid one is 4,
    a state the run abandoned; along the head's ancestry (the records' checksums hold, so
    their parent links are true) it is the branch point, 1."""
    from pitstop.store.encoding.records import decode_field_map

    with pitstop.open_store(url) as store:
        ids = _five(store)
        b1 = store.save("a", {"n": 11, "text": "branch one " * 20}, parent_id=ids[1]).id
        b2 = store.save("a", {"n": 12, "text": "branch two " * 20}).id
        for rotten in (b1, b2):  # its value of `text`, not its record
            row = store._tx(lambda tx, c=rotten: tx.one(  # type: ignore[attr-defined]
                "SELECT fields FROM pitstop_checkpoints WHERE id = ?", (c,)))
            tamper(url, "UPDATE pitstop_blobs SET data = ? WHERE hash = ?",
                   (b"\x00" * 8, decode_field_map(bytes(row[0]))["text"].hash))
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError):
            store.latest("a")
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == ids[1] and found.state["n"] == 1
        assert [s.split(":")[0] for s in found.skipped] == [b2, b1]
        _, head = store.latest_with_run("a", fallback=True)
        assert head is not None and head.id == ids[1]


# -- the database's own structures, and the blob store (verify) --------------------------------


def test_verify_reports_sqlite_index_damage(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with pitstop.open_store(url) as store:
        for n in range(3):
            store.save("a", {"n": n})
    # The id index no longer holds ids: lookups by id find nothing (what byte flips in an
    # index page do), while every table row is intact.
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = 'CREATE UNIQUE INDEX pitstop_checkpoints_id "
            "ON pitstop_checkpoints (checksum)' WHERE name = 'pitstop_checkpoints_id'"
        )
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError):
            store.latest("a")  # not None: the run has a head
        problems = store.verify()
        assert any(p.kind == "store" and "pitstop_checkpoints_id" in p.message
                   for p in problems), problems


needs_postgres = pytest.mark.skipif("postgres" not in BACKENDS, reason="no PostgreSQL backend")


@pytest.fixture
def pg_url() -> Iterator[str]:
    schema = f"v_{uuid.uuid4().hex[:12]}"
    yield pg_schema_url(schema)
    drop_pg_schema(schema)


@needs_postgres
def test_verify_reports_postgres_index_damage_through_amcheck(pg_url: str, cli: Cli) -> None:
    """Checkpoints written while the id index was not maintained (rows the index lacks,
    what a lost index page leaves): lookups by id find nothing, every row and checksum is
    intact, and only the server's index check (amcheck, installed by verify as the
    superuser the tests run as) can tell."""
    schema = pg_url.rsplit("schema=", 1)[1]
    index = f'"{schema}".pitstop_checkpoints_id'
    with pitstop.open_store(pg_url) as store:
        store.save("a", {"n": 0})
        clean = store.verify()
        assert clean == [] and clean.notes == []
    tamper(pg_url, f"UPDATE pg_index SET indisready = false WHERE indexrelid = '{index}'::regclass")
    with pitstop.open_store(pg_url) as store:
        lost = store.save("a", {"n": 1}).id
    tamper(pg_url, f"UPDATE pg_index SET indisready = true WHERE indexrelid = '{index}'::regclass")
    with pitstop.open_store(pg_url) as store:
        with pytest.raises(pitstop.CheckpointNotFoundError):
            store.get(lost)  # by id, through the damaged index
        problems = store.verify()
        assert [p.kind for p in problems] == ["store"], problems
        assert "pitstop_checkpoints_id" in problems[0].message
        assert "lacks matching index tuple" in problems[0].message
        assert "REINDEX" in problems[0].message
    code, out, _ = cli("verify", store=pg_url)
    assert code == 1 and "pitstop_checkpoints_id" in out


@needs_postgres
def test_verify_says_when_it_cannot_check_postgres_indexes(pg_url: str, cli: Cli) -> None:
    """A role that may not run amcheck: verify checks everything else and says, as a note,
    that the indexes went unchecked and what to grant."""
    import psycopg

    schema = pg_url.rsplit("schema=", 1)[1]
    role = f"r_{schema}"
    with pitstop.open_store(pg_url) as store:
        store.save("a", {"n": 0})
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
    plain = pg_url.replace("://postgres@", f"://{role}@", 1)
    assert plain != pg_url
    try:
        with pitstop.open_store(plain) as store:
            problems = store.verify()
            assert problems == [] and len(problems.notes) == 1, problems.notes
            assert "index check skipped" in problems.notes[0]
        code, out, _ = cli("verify", store=plain)
        assert code == 0 and "note: index check skipped" in out and "ok:" in out
        code, out, _ = cli("verify", "--json", store=plain)
        assert code == 0 and "index check skipped" in json.loads(out)["notes"][0]
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_a_blob_file_replaced_by_a_directory_is_corruption_with_fallback(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    url = f"sqlite:///{tmp_path / 'store.db'}?blobs={blobs}&blob_threshold=1000"
    with pitstop.open_store(url) as store:
        good = store.save("a", {"big": os.urandom(5000)})
        first = set(blobs.glob("*/*/*.blob"))
        store.save("a", {"big": os.urandom(5000)})
    (newest,) = set(blobs.glob("*/*/*.blob")) - first
    newest.unlink()
    newest.mkdir()
    with pitstop.open_store(url) as store:
        with pytest.raises(pitstop.CorruptCheckpointError, match="big"):
            store.latest("a")
        found = store.latest("a", fallback=True)
        assert found is not None and found.id == good.id
        assert any(p.kind == "blob" and "directory" in p.message for p in store.verify())
        store.prune(pitstop.RetentionPolicy(keep_last=1))  # the sweep steps over it


def test_a_worker_drains_the_others_past_a_damaged_queued_run(url: str) -> None:
    wf = pitstop.Workflow("drain")
    wf.step(name="one")(lambda state, ctx: {"done": True})
    with pitstop.open_store(url) as store:
        for i in range(3):
            wf.enqueue(store, {"n": i}, run_id=f"r{i}")
        tamper(url, "UPDATE pitstop_runs SET metadata = 'not json' WHERE run_id = 'r1'")
        worker = pitstop.Worker(store, [wf], poll_interval=0.02,
                                on_error=pitstop.Retry(attempts=2, backoff=0.01, jitter=0.0))
        stats = worker.run(until_idle=True, handle_signals=False)
        assert stats.executed == 2 and stats.given_up == 1
        assert [store.get_run(f"r{i}").status.value for i in range(3)] == [
            "completed", "failed", "completed"]
        failed = store.get_run("r1").metadata
        assert "damaged run row" in failed["error"]["message"]
        assert failed["unreadable_metadata"] == "not json"  # kept, not thrown away


def test_verify_checks_every_run_field_sqlite_would_keep(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pitstop.open_store(url) as store:
        store.save("a", {"n": 1})
        store.save("b", {"n": 1})
        tamper(url, "UPDATE pitstop_runs SET priority = 'high', checkpoints = -3 "
               "WHERE run_id = 'a'")
        assert [(p.kind, p.id) for p in store.verify()] == [("run", "a")]
        assert "checkpoints -3 is out of range" in store.verify()[0].message


def test_verify_reports_a_file_too_damaged_to_read_instead_of_raising(
    tmp_path: Path, cli: Cli
) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with pitstop.open_store(url) as store:
        store.save("a", {"n": 1})
    with sqlite3.connect(path) as conn:  # the table's schema entry damaged: a column gone
        conn.execute("PRAGMA writable_schema = ON")
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'pitstop_checkpoints'"
                           ).fetchone()[0]
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'pitstop_checkpoints'",
                     (sql.replace("size INTEGER NOT NULL,", ""),))
    with pitstop.open_store(url) as store:
        problems = store.verify()
    assert problems and all(p.kind == "store" for p in problems), problems
    code, out, _ = cli("verify", store=url)
    assert code == 1 and "problem: store" in out
