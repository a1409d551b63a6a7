"""What a command imports: only what it needs (issue #18, item 13).

``pitstop runs`` and ``pitstop stats`` read run rows and counts; they never decode a value, so
they must not import the codec and its type tables, numpy, the workflow runtime (asyncio), the
web inspector, or rich when not printing to a terminal. Start-up is most of what such a command
costs on a large store, and an import creeps back in unnoticed: these tests say which modules
load, in a fresh interpreter, never how long anything takes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import pitstop
from conftest import POSTGRES_SKIP, drop_pg_schema, pg_schema_url, run_python

NEVER_FOR_LISTING = [
    "pitstop.serde.codec",
    "pitstop.serde.exttypes",
    "pitstop.serde.registry",
    "pitstop.runtime",
    "pitstop.ui",
    "pitstop.archive",
    "numpy",
    "asyncio",
    "rich",
    # What encodes and decodes values (store.encoding.valuecodec): rows and counts need none.
    "pitstop.store.encoding.valuecodec",
    "pitstop.store.encoding.chunkreads",
    "pitstop.store.encoding.layouts",
    "pitstop.serde.chunks",
    "pitstop.serde.chunkcuts",
    "pitstop.serde.chunkmanifest",
    "pitstop.serde.chunktree",
    "pitstop.serde.chunkpatches",
    "pitstop.serde.chunkkeys",
    "pitstop.serde.partchunks",
    "pitstop.serde.framing",
    "zstandard",
    "xxhash",
    "concurrent.futures",  # the chunker's and the blob store's thread pools
    "socket",  # pitstop.owners reads the host name from os.uname()
    "secrets",  # only a worker naming itself draws a token
]

_LOADED = """
import json, sys
from pitstop.cli.app import run
code = run(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded_by(*argv: str) -> set[str]:
    """The modules a command left in ``sys.modules`` (run in a fresh interpreter, piped)."""
    done = run_python(_LOADED, *argv)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0, done.stderr
    return set(result["modules"])


def packages(modules: set[str]) -> set[str]:
    """Each module and every package above it (``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``)."""
    return {".".join(m.split(".")[:i + 1]) for m in modules for i in range(m.count(".") + 1)}


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pitstop.open_store(url) as store:
        wf = pitstop.Workflow("imports")

        @wf.step
        def only(state: dict[str, int]) -> dict[str, int]:
            return {"n": state.get("n", 0) + 1}

        wf.start(store, {"n": 1}, run_id="done")
        wf.enqueue(store, {"n": 2}, run_id="queued")
    return url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    if POSTGRES_SKIP:
        pytest.skip(POSTGRES_SKIP)
    schema = f"t_imports_{uuid.uuid4().hex[:10]}"
    url = pg_schema_url(schema)
    with pitstop.open_store(url) as store:
        store.create_run("r1", workflow="imports")
    yield url
    drop_pg_schema(schema)


@pytest.mark.parametrize("argv", [["runs"], ["runs", "--status", "queued"], ["runs", "--json"],
                                  ["stats"], ["stats", "--json"], ["du"],
                                  ["du", "--by", "field"]])
def test_listing_and_stats_do_not_import_the_codec(sqlite_url: str, argv: list[str]) -> None:
    loaded = packages(loaded_by(*argv, "--store", sqlite_url))
    assert not loaded & set(NEVER_FOR_LISTING), sorted(loaded & set(NEVER_FOR_LISTING))
    assert "psycopg" not in loaded and "psycopg_pool" not in loaded  # a SQLite store
    # Only the module of the command that runs (see pitstop.cli.group.MODULES).
    others = {"runs": {"checkpoints", "control", "inspector", "maintenance"},
              "stats": {"checkpoints", "control", "inspector", "runs"},
              "du": {"checkpoints", "control", "inspector", "runs", "maintenance"}}[argv[0]]
    assert not loaded & {f"pitstop.cli.{m}" for m in others}, sorted(loaded)


@pytest.mark.slow
def test_on_postgresql_too(postgres_url: str) -> None:
    for argv in (["runs", "--status", "queued"], ["stats"]):
        loaded = packages(loaded_by(*argv, "--store", postgres_url))
        assert "psycopg_pool" in loaded  # the store's own driver is what it does need
        never = set(NEVER_FOR_LISTING) - {"asyncio", "concurrent.futures", "socket"}  # psycopg's
        assert not loaded & never, sorted(loaded & never)


def test_show_imports_the_codec_it_needs(sqlite_url: str) -> None:
    # The other side of the lazy imports: a command that decodes a state gets the codec.
    loaded = loaded_by("show", "done", "--store", sqlite_url)
    assert {"pitstop.serde.codec", "pitstop.store.encoding.valuecodec"} <= loaded


def test_the_row_layer_knows_the_chunk_key_size() -> None:
    # records.py keeps its own copy so that reading rows does not import the chunker.
    from pitstop.serde.chunks import KEY_SIZE
    from pitstop.store.encoding.records import CHUNK_KEY_SIZE

    assert CHUNK_KEY_SIZE == KEY_SIZE


def test_import_pitstop_is_cheap_and_its_names_all_resolve() -> None:
    done = run_python(
        "import json, sys, pitstop\n"
        "before = sorted(sys.modules)\n"
        "missing = [n for n in pitstop.__all__ if getattr(pitstop, n, None) is None]\n"
        "print(json.dumps({'before': before, 'missing': missing}))\n"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    loaded = packages(set(result["before"]))
    assert not loaded & {*NEVER_FOR_LISTING, "click", "pitstop.store.backends.sqlite",
                         "pitstop.serde.chunks"}, sorted(loaded)
    assert result["missing"] == []  # every public name still there, loaded on first use


def test_the_owner_host_name_is_the_socket_one() -> None:
    # pitstop.owners avoids importing socket; the name it compares must still be this one.
    import socket

    from pitstop.owners import owner_alive, owner_id

    assert owner_id().startswith(socket.gethostname() + ":")
    assert owner_alive(owner_id()) is True
