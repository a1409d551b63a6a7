"""Fuzz everything that decodes bytes from a store or an archive, with atheris.

    pip install -e '.[fuzz]'
    python bench/fuzz.py value --seconds 180          # one target, for three minutes
    python bench/fuzz.py all --seconds 120            # every target in turn
    python bench/fuzz.py value -- -runs=100000        # libFuzzer's own options after --

Targets (each takes arbitrary bytes, as a damaged or crafted store or archive would hold):

* ``value``: a stored value (format byte, compression, msgpack with pitstop's extension
  types) decoded as a load does;
* ``field_map``: a checkpoint record's field map;
* ``chunks``: a chunked value: a manifest and chunk rows whose keys match their bytes (so
  the decode goes past the checksums, into the tree and the items);
* ``archive``: a ``pitstop export`` archive, read whole;
* ``url``: store URLs and their options (SQLite/memory query strings, PostgreSQL URLs and
  conninfo), field paths and checkpoint ids, parsed without connecting.

Any exception other than a :class:`pitstop.PitstopError` is a bug: the fuzzer stops there
and writes the input as ``crash-*``. The starting corpus is ``bench/corpus/<target>/``; a run
adds what it finds to a scratch copy, not to the committed one. tests/test_fuzz.py feeds the
same targets random bytes with hypothesis (bounded) in the default suite.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
sys.path.insert(0, str(HERE.parent / "src"))

import ormsgpack  # noqa: E402

import pitstop  # noqa: E402
from pitstop.errors import PitstopError  # noqa: E402

_codec: Any = None


def codec() -> Any:
    """A value codec as a store has one (the memory store's: no file, no server)."""
    global _codec  # noqa: PLW0603 - one per process, made on first use
    if _codec is None:
        _codec = pitstop.open_store("memory://")._value_codec  # type: ignore[attr-defined]
    return _codec


def value(data: bytes) -> None:
    codec().decode_value(data, None, strict=False, run_id="r", checkpoint_id="c", field="f")


def field_map(data: bytes) -> None:
    from pitstop.store.encoding.records import CheckpointRecord

    record = CheckpointRecord("c", "r", None, 0, 0.0, 1, b"{}", data, 0, 0)
    record.field_map()


def chunks(data: bytes) -> None:
    """Two bytes: the manifest's length; the manifest (version, kind, items, meta, root
    entries); then chunk rows, each after its length in three bytes. The root's keys are
    replaced by the keys of the chunks, so their checksums hold and the decode goes on."""
    from pitstop.serde import chunks as chunking
    from pitstop.serde.framing import unframe_view

    size = int.from_bytes(data[:2], "big")
    manifest, at = data[2 : 2 + size], 2 + size
    pieces = []
    while at < len(data) and len(pieces) < 64:
        length = int.from_bytes(data[at : at + 3], "big")
        pieces.append(data[at + 3 : at + 3 + length])
        at += 3 + length
    pieces = pieces or [b""]
    blobs: dict[bytes, bytes] = {}
    keys = []
    for piece in pieces:
        try:
            fmt, raw = unframe_view(piece)
            key = chunking.chunk_key(fmt, raw)
        except (ValueError, TypeError):
            key = b"\x01" + piece[:16].ljust(16, b"\x00")
        blobs[key] = piece
        keys.append(key)
    try:  # a manifest that parses: point its root at the chunks, keeping its other fields
        version, kind, items, meta, root = ormsgpack.unpackb(manifest)
        root = [[keys[i % len(keys)], *entry[1:]] if isinstance(entry, list) and entry
                else entry for i, entry in enumerate(root)]
        manifest = ormsgpack.packb([version, kind, items, meta, root])
    except Exception:
        pass  # left as it is: the decode must refuse it
    codec().decode_chunked(manifest, blobs, strict=False, run_id="r", checkpoint_id="c",
                           field="f")


def archive(data: bytes) -> None:
    from pitstop.archive import read_archive

    read_archive(io.BytesIO(data))


def url(data: bytes) -> None:
    from pitstop.fieldpath import parse_path
    from pitstop.store.backends.pgurl import conninfo_params, split_url

    text = data.decode("utf-8", "surrogateescape")
    for attempt in (
        lambda: pitstop.open_store("memory://?" + text).close(),
        lambda: pitstop.open_store("memory://" + text).close(),
        lambda: conninfo_params(*split_url("postgresql://u@h/db?" + text, "pg")[:1], "pg"),
        lambda: split_url("postgresql://" + text, "pg"),
        lambda: pitstop.open_store(text[:1] + "://" + text[1:]).close()
        if text[:1] in ("m", "x") else None,
    ):
        with contextlib.suppress(PitstopError):
            attempt()
    with contextlib.suppress(ValueError):  # its documented refusal (a FieldEditError above)
        parse_path(text)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "value": value,
    "field_map": field_map,
    "chunks": chunks,
    "archive": archive,
    "url": url,
}


def checked(target: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``target`` with pitstop's own errors taken as the right answer; anything else raises."""

    def run(data: bytes) -> None:
        with contextlib.suppress(PitstopError):
            target(data)

    return run


def fuzz(name: str, seconds: float, extra: list[str]) -> None:
    import atheris  # the fuzz extra: only this script needs it

    scratch = Path(tempfile.mkdtemp(prefix=f"pitstop-fuzz-{name}-"))
    corpus = scratch / "corpus"
    shutil.copytree(CORPUS / name, corpus)
    args = [sys.argv[0], str(corpus), f"-max_total_time={int(seconds)}", "-max_len=65536",
            f"-artifact_prefix={scratch}/", "-print_final_stats=1", *extra]
    print(f"fuzzing {name} for {seconds:.0f}s; crashes go to {scratch}", flush=True)
    import pitstop.archive
    import pitstop.store.backends.postgres  # noqa: F401

    atheris.instrument_all()  # coverage feedback from every loaded Python function
    atheris.Setup(args, checked(TARGETS[name]))
    atheris.Fuzz()


def seed() -> None:
    """Write the committed corpus: a few small, valid inputs per target (a few KB)."""
    from pitstop.archive import write_archive
    from pitstop.store.encoding.records import CheckpointRecord

    out = {name: CORPUS / name for name in TARGETS}
    for path in out.values():
        path.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="pitstop-fuzz-seed-")
    store = pitstop.open_store(f"sqlite:///{scratch}/seed.db")
    values = [None, 1, -(2**70), 1.5, "text", "a\ud800b", b"\x00\xff", [1, [2, {"k": "v"}]],
              {"a": (1, 2), "b": {1, 2}}, list(range(60))]
    for i, v in enumerate(values):
        blob = codec().encode_value(v, run_id="r", path="v")
        (out["value"] / f"v{i}").write_bytes(blob.data)
    store.save("r", {"small": 1, "list": [{"i": i, "t": f"{i:x}" * 40} for i in range(200)]})
    store.save("r", {"small": 2, "list": [{"i": i, "t": f"{i:x}" * 40} for i in range(201)]})
    from pitstop.store.engine.schema import SELECT_CHECKPOINT

    head = store.latest("r")
    assert head is not None
    rows = store._query(SELECT_CHECKPOINT + " WHERE id = ?", (head.id,))  # type: ignore[attr-defined]
    record = CheckpointRecord(*rows[0])
    (out["field_map"] / "f0").write_bytes(bytes(record.fields))
    for name, ref in record.field_map().items():
        if ref.manifest is not None:  # a chunked value: its manifest and its chunks' rows
            keys = [e.key for e in __import__("pitstop.serde.chunks", fromlist=["x"])
                    .decode_manifest(ref.manifest).root]
            found = store._read_values_alone(keys)  # type: ignore[attr-defined]
            body = b"".join(len(found[k]).to_bytes(3, "big") + found[k] for k in keys)
            head = len(ref.manifest).to_bytes(2, "big")
            (out["chunks"] / f"c-{name}").write_bytes(head + ref.manifest + body)
    buffer = io.BytesIO()
    write_archive(store, "r", buffer)
    (out["archive"] / "a0").write_bytes(buffer.getvalue())
    for i, text in enumerate(["durability=full", "busy_timeout=2.5&compress_threshold=100",
                              "blobs=/tmp/x&blob_threshold=1KiB", "schema=a&pool_max=3",
                              "messages[3].content", 'docs["k"].x']):
        (out["url"] / f"u{i}").write_bytes(text.encode())
    store.close()
    shutil.rmtree(scratch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=[*TARGETS, "all", "seed"])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("extra", nargs="*", help="libFuzzer options (after --)")
    options = parser.parse_args()
    if options.target == "seed":
        seed()
        return
    names = list(TARGETS) if options.target == "all" else [options.target]
    if len(names) == 1:
        fuzz(names[0], options.seconds, options.extra)
        return
    import subprocess

    for name in names:  # libFuzzer runs one target per process
        started = time.monotonic()
        done = subprocess.run([sys.executable, __file__, name, "--seconds",
                               str(options.seconds), *options.extra], check=False)
        print(f"{name}: exit {done.returncode} after {time.monotonic() - started:.0f}s",
              flush=True)


if __name__ == "__main__":
    main()
