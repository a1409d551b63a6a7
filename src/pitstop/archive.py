"""Portable run archives: move a run between stores (SQLite <-> PostgreSQL) bit for bit.

An archive holds one run exactly as its store keeps it: the run record, every checkpoint
record (ids, parents, metadata and checksums unchanged), every value they reference (the
stored bytes with their content hashes), the run's inputs and its effect records. Nothing is
deserialised on the way, so an archive can carry values of classes the exporting or importing
process does not know, and the imported checkpoints verify with their original checksums.

File format, version 3 (the only one this pitstop reads: versions 1 and 2 came before any
release, and a reader refuses them)::

    MAGIC                  11 bytes, b"\\x89PITSTOP\\r\\n\\x1a\\n" (detects text-mode mangling)
    zstd stream of frames  each frame: 4-byte big-endian length, then one msgpack map
        {"t": "header", "format": "pitstop-archive", "version": 3, "created": ISO-8601,
         "source": {"kind": "sqlite" | "postgresql" | ..., "pitstop": version}, "run_id": ...,
         "counts": {"checkpoints": n, "values": n, "inputs": n, "effects": n},
         "sizes": {"frames": bytes, "largest": bytes}}
        {"t": "run", ...the run's stored columns}
        {"t": "value", "hash": bytes, "data": bytes}          one per referenced value
        {"t": "value", "hash": bytes, "prefix_of": bytes, "size": n}   a value stored as
            the first n stored bytes of the value prefix_of (written after it)
        {"t": "checkpoint", ...the checkpoint's stored columns}   oldest first, with
            "writes", the records attached to it after it was saved (None if none)
        {"t": "input", ...}  {"t": "effect", ...}
        {"t": "end", "frames": n, "sha256": hex}    SHA-256 of every frame byte before it

A reader refuses a file without the magic, an archive of another version than 3, a stream
that ends before the ``end`` frame, and any checksum mismatch, before anything is written.
Unknown keys in a frame are ignored, so a minor addition does not need a new version.

Sizes are bounded before memory is spent, since a few kilobytes of zstd can claim gigabytes:
``sizes`` declares the bytes of every frame between the header and the end frame (length
prefixes included) and the largest frame. A reader refuses a frame larger than declared,
frames that add up to more or less than declared, counts that differ from the header's, a
frame whose first byte does not start a map, a value whose hash does not match as soon as it
is read, and declared sizes beyond this machine's memory; frame bodies are read in pieces, so
a length prefix alone never allocates. An archive without ``sizes`` is refused.

Importing under a new run id (:func:`renamed`) copies a run into a store that may already
hold it: checkpoint and input ids are unique keys in a store, so the copy gets fresh ones (in
the original order, so history order and ancestry are kept) and new record checksums, after
the original records were verified. Values are content-addressed and shared, not copied.
Effect records keep their keys: like a fork, the copy is a new run, so steps it executes
from here on record new effects under its own id.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import ormsgpack
import zstandard

from pitstop.errors import ArchiveError, CorruptCheckpointError
from pitstop.ids import new_id
from pitstop.model import Run
from pitstop.store.contract.base import Progress, Store
from pitstop.store.encoding.records import CheckpointRecord, encode_metadata
from pitstop.store.transfer.runs import (
    CheckedValues,
    EffectRecord,
    InputRecord,
    RunExport,
    RunRecord,
    check_value,
    export_problem,
)

FORMAT = "pitstop-archive"
VERSION = 3
"""The archive version this pitstop writes and the only one it reads. A reader ignores unknown
keys, so an addition a reader must not drop (as 3 added a checkpoint's attached records) takes
a new version, which older readers refuse. Versions 1 and 2 predate the first release: no
released pitstop wrote them, and they are refused."""
MAGIC = b"\x89PITSTOP\r\n\x1a\n"
SUFFIX = ".pitstop"

_LENGTH = struct.Struct(">I")
_MAX_FRAME = 1 << 31
_HEADER_MAX = 1 << 20
"""The header frame, read before any size is declared, is small."""
_END_MAX = 1024
"""The end frame (frame count and digest) is not among the declared sizes."""
_PIECE = 1 << 20
"""Frame bodies are read this much at a time: memory follows the bytes that arrive, not the
length a frame claims."""
SPOOL_IN_MEMORY = 16 << 20
"""An archive's values are kept in memory up to this many bytes, beyond it in a temporary
file (see :class:`SpooledValues`)."""
_MAP_STARTS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
"""First bytes of a msgpack map: every frame is one."""


@dataclass(frozen=True, slots=True)
class ArchiveInfo:
    """What an archive says about itself (its header), plus what reading it found."""

    run_id: str
    version: int
    created: str
    source: Mapping[str, Any]
    counts: Mapping[str, int]
    sha256: str = ""
    bytes: int = 0
    """Size of the archive file (compressed)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Counter:
    """Counts bytes passing through, for progress on streams of unknown length."""

    done: int = 0
    total: int | None = None
    progress: Progress | None = None

    def add(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)


# -- writing -------------------------------------------------------------------------------------


def write_archive(
    store: Store, run_id: str, dest: str | os.PathLike[str] | IO[bytes], *,
    progress: Progress | None = None,
) -> ArchiveInfo:
    """Export ``run_id`` from ``store`` into an archive file (or a binary stream).

    The run is read in one snapshot and verified before a byte is written; a file target is
    written to a temporary name and renamed into place, so a failed export leaves nothing.
    Values are read from the store one at a time (twice: once to measure the frames the
    header declares, once to write them) and records a page at a time into temporary files
    read back for each pass, so memory holds a page of records and the largest value,
    never all of either (and the values' 32-byte keys).
    """
    data = store.export_run(run_id, stream=True)
    data.verify()
    if isinstance(dest, str | os.PathLike):
        path = Path(dest)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "wb") as fh:
                info = _write(data, store, fh, progress)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return info
    return _write(data, store, dest, progress)


def _write(data: RunExport, store: Store, fh: IO[bytes], progress: Progress | None) -> ArchiveInfo:
    counts = {
        "checkpoints": len(data.checkpoints),
        "values": len(data.blobs),
        "inputs": len(data.inputs),
        "effects": len(data.effects),
    }
    header: dict[str, Any] = {
        "t": "header",
        "format": FORMAT,
        "version": VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": {"kind": store.url.split("://", 1)[0], "pitstop": _pitstop_version()},
        "run_id": data.run.run_id,
        "counts": counts,
    }
    total = 2 + sum(counts.values())
    # Declared up front so a reader can bound what it reads: a pass that packs each frame
    # only to measure it (packing is a copy; compression costs far more), keeping the sum.
    body_bytes = largest = 0
    for kind, body in _bodies(data):
        length = len(ormsgpack.packb({"t": kind, **body}))
        body_bytes += _LENGTH.size + length
        largest = max(largest, length)
    header["sizes"] = {"frames": body_bytes, "largest": largest}
    hasher = hashlib.sha256()
    start = fh.tell() if fh.seekable() else 0
    fh.write(MAGIC)
    frames = 0
    with zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(
        fh, closefd=False
    ) as out:

        def emit(kind: str, body: Mapping[str, Any]) -> None:
            nonlocal frames
            packed = ormsgpack.packb({"t": kind, **body})
            framed = _LENGTH.pack(len(packed)) + packed
            hasher.update(framed)
            out.write(framed)
            frames += 1
            if progress is not None:
                progress(frames, total)

        emit("header", header)
        for kind, body in _bodies(data):
            emit(kind, body)
        digest = hasher.hexdigest()
        end = ormsgpack.packb({"t": "end", "frames": frames, "sha256": digest})
        out.write(_LENGTH.pack(len(end)) + end)
    size = fh.tell() - start if fh.seekable() else 0
    return ArchiveInfo(
        run_id=data.run.run_id,
        version=VERSION,
        created=header["created"],
        source=header["source"],
        counts=counts,
        sha256=digest,
        bytes=size,
    )


def _bodies(data: RunExport) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every frame after the header, in archive order: (kind, body)."""
    yield "run", asdict(data.run)
    prefixes = data.prefixes
    for h, blob in data.blobs.items():
        if h not in prefixes:
            yield "value", {"hash": h, "data": blob}
    for h, (target, size) in prefixes.items():  # after every whole value: their targets
        yield "value", {"hash": h, "prefix_of": target, "size": size}
    for record in data.checkpoints:
        yield "checkpoint", _record_fields(record)
    for item in data.inputs:
        yield "input", asdict(item)
    for effect in data.effects:
        yield "effect", asdict(effect)


def _record_fields(record: CheckpointRecord) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _pitstop_version() -> str:
    from pitstop import __version__

    return __version__


# -- reading -------------------------------------------------------------------------------------


def read_archive(
    src: str | os.PathLike[str] | IO[bytes], *, progress: Progress | None = None
) -> tuple[ArchiveInfo, RunExport]:
    """Read and fully verify an archive: its format, version, SHA-256 and every record.

    Raises :class:`ArchiveError` (not an archive, newer version, truncated, checksum
    mismatch) or :class:`~pitstop.CorruptCheckpointError` (a damaged record inside).
    """
    if isinstance(src, str | os.PathLike):
        path = Path(src)
        try:
            fh: IO[bytes] = path.open("rb")
        except OSError as exc:
            raise ArchiveError(f"cannot read archive {str(path)!r}: {exc.strerror}") from None
        with fh:
            return _read(fh, str(path), path.stat().st_size, progress)
    return _read(src, "<stdin>", None, progress)


def _read(
    fh: IO[bytes], name: str, size: int | None, progress: Progress | None
) -> tuple[ArchiveInfo, RunExport]:
    counter = _Counter(total=size, progress=progress)
    magic = fh.read(len(MAGIC))
    if magic != MAGIC:
        raise ArchiveError(f"{name}: not a pitstop archive (no {FORMAT} signature)")
    counter.add(len(magic))
    hasher = hashlib.sha256()
    limits = _Limits(name)
    frames = _frames(_CountingReader(fh, counter), name, hasher, limits)
    header = next(frames, None)
    if header is None:
        raise ArchiveError(f"{name}: the archive is truncated (it ends before its header)")
    if header.get("t") != "header" or header.get("format") != FORMAT:
        raise ArchiveError(f"{name}: not a pitstop archive (no header)")
    version = header.get("version")
    if isinstance(version, int) and version > VERSION:
        raise ArchiveError(
            f"{name}: archive format version {version} is newer than this pitstop reads "
            f"({VERSION}); upgrade pitstop to import it"
        )
    if version != VERSION:
        raise ArchiveError(
            f"{name}: archive format {version!r} is not supported; this pitstop reads "
            f"format {VERSION}"
        )
    limits.declare(header.get("sizes"))
    run: RunRecord | None = None
    data: RunExport | None = None
    blobs = SpooledValues(str(header.get("run_id")))
    prefixes: dict[bytes, tuple[bytes, int]] = {}
    checkpoints: list[CheckpointRecord] = []
    inputs: list[InputRecord] = []
    effects: list[EffectRecord] = []
    count = 1
    for frame in frames:
        kind = frame.get("t")
        if kind == "end":
            if frame.get("frames") != count or frame.get("sha256") != hasher.hexdigest():
                raise ArchiveError(f"{name}: archive checksum mismatch (the file is damaged)")
            if fh.read(1) or next(frames, None) is not None:
                raise ArchiveError(f"{name}: unexpected data after the end of the archive")
            if run is None:
                raise ArchiveError(f"{name}: the archive holds no run")
            data = RunExport(run, checkpoints, blobs, inputs, effects, prefixes)
            break
        count += 1
        try:
            if kind == "run":
                run = RunRecord(**_known(RunRecord, frame))
            elif kind == "value" and "prefix_of" in frame:
                key, target, size = bytes(frame["hash"]), bytes(frame["prefix_of"]), frame["size"]
                if target not in blobs or target in prefixes or type(size) is not int \
                        or not 0 < size <= blobs.size_of(target):
                    raise ArchiveError(f"{name}: malformed value record (prefix of a value "
                                       "the archive does not hold before it)")
                blobs.add(key, blobs[target][:size])  # checked against its hash
                prefixes[key] = (target, size)
            elif kind == "value":
                # Checked as it arrives: a bogus value is refused before the next is read.
                blobs.add(bytes(frame["hash"]), bytes(frame["data"]))
            elif kind == "checkpoint":
                checkpoints.append(CheckpointRecord(**_known(CheckpointRecord, frame)))
            elif kind == "input":
                inputs.append(InputRecord(**_known(InputRecord, frame)))
            elif kind == "effect":
                effects.append(EffectRecord(**_known(EffectRecord, frame)))
        except (KeyError, TypeError) as exc:
            raise ArchiveError(f"{name}: malformed {kind} record ({exc})") from None
        except CorruptCheckpointError as exc:
            raise ArchiveError(f"{name}: malformed value record ({exc.detail})") from None
    if data is None:
        raise ArchiveError(f"{name}: the archive is truncated (no end marker)")
    limits.finish()
    _check_counts(name, header.get("counts"), data)
    problem = export_problem(data)
    if problem:
        raise ArchiveError(f"{name}: malformed {problem}")
    data.verify()
    info = ArchiveInfo(
        run_id=run.run_id if run else "",
        version=version,
        created=str(header.get("created", "")),
        source=dict(header.get("source") or {}),
        counts=dict(header.get("counts") or {}),
        sha256=hasher.hexdigest(),
        bytes=counter.done,
    )
    return info, data


class SpooledValues(CheckedValues):
    """An archive's values by hash, their bytes in a temporary file (in memory up to
    :data:`SPOOL_IN_MEMORY` bytes, then on disk): reading and importing an archive holds a
    value, or a batch of them, at a time, not every value of the run. Each value is checked
    against its hash as it is added, so it is read back once: to be written."""

    __slots__ = ("_file", "_run_id", "_where")

    def __init__(self, run_id: str) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        self._where: dict[bytes, tuple[int, int]] = {}
        self._run_id = run_id

    def add(self, key: bytes, value: bytes) -> None:
        """Keep ``value`` under ``key`` (a second one under the same key replaces it);
        :class:`~pitstop.CorruptCheckpointError` if it does not match its hash."""
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise TypeError("a value's hash and bytes must be bytes")
        check_value(value, key, run_id=self._run_id, what=f"value {key.hex()[:16]}")
        self._file.seek(0, os.SEEK_END)
        self._where[key] = (self._file.tell(), len(value))
        self._file.write(value)

    def size_of(self, key: bytes) -> int:
        """The length of the value under ``key``, without reading it."""
        return self._where[key][1]

    def __getitem__(self, key: bytes) -> bytes:
        offset, length = self._where[key]
        self._file.seek(offset)
        return self._file.read(length)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def close(self) -> None:
        """Give the temporary file back (also done when this is garbage-collected)."""
        self._file.close()


def _check_counts(name: str, declared: Any, data: RunExport) -> None:
    found = {"checkpoints": len(data.checkpoints), "values": len(data.blobs),
             "inputs": len(data.inputs), "effects": len(data.effects)}
    if not isinstance(declared, Mapping):
        raise ArchiveError(f"{name}: damaged archive (its header has no record counts)")
    for kind, n in found.items():
        if declared.get(kind, n) != n:
            raise ArchiveError(
                f"{name}: the archive declares {declared.get(kind)!r} {kind} but holds {n} "
                "(damaged or altered)"
            )


def _known(cls: type, frame: Mapping[str, Any]) -> dict[str, Any]:
    """The frame's values for ``cls``'s fields (extra keys from a later minor version
    skipped)."""
    return {f.name: frame[f.name] for f in fields(cls)}


def _memory_bytes() -> int | None:
    """This machine's physical memory, if the platform says."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _size(sizes: Any, key: str) -> int | None:
    value = sizes.get(key) if isinstance(sizes, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class _Limits:
    """How large the next frame may be, from what the header declares (see the module doc)."""

    __slots__ = ("declared", "largest", "name", "remaining")

    def __init__(self, name: str) -> None:
        self.name = name
        self.largest = _HEADER_MAX
        self.declared: int | None = None
        self.remaining: int | None = None

    def declare(self, sizes: Any) -> None:
        total = _size(sizes, "frames")
        largest = _size(sizes, "largest")
        if total is None or largest is None:
            raise ArchiveError(f"{self.name}: damaged archive (its declared sizes are {sizes!r})")
        memory = _memory_bytes()
        if memory is not None and total > memory:
            raise ArchiveError(
                f"{self.name}: the archive declares {total / 2**30:.1f} GiB of records, more "
                f"than this machine's memory ({memory / 2**30:.1f} GiB)"
            )
        if largest > min(total, _MAX_FRAME):
            raise ArchiveError(f"{self.name}: damaged archive (its declared sizes are {sizes!r})")
        self.largest = largest
        self.declared = self.remaining = total

    def check(self, length: int) -> None:
        """Refuse a frame of ``length`` bytes, before reading it, if it is too big."""
        if length > max(self.largest, _END_MAX):
            raise ArchiveError(
                f"{self.name}: damaged archive (a frame of {length} bytes, larger than the "
                f"{self.largest} it declares)"
            )

    def count(self, length: int) -> None:
        """Account for a frame read (any but the header and the end frame)."""
        if self.remaining is not None:
            self.remaining -= _LENGTH.size + length
            if self.remaining < 0:
                self._mismatch()

    def finish(self) -> None:
        if self.remaining:
            self._mismatch()

    def _mismatch(self) -> None:
        raise ArchiveError(
            f"{self.name}: damaged archive (its frames do not add up to the "
            f"{self.declared} bytes it declares)"
        )


class _CountingReader:
    __slots__ = ("_counter", "_fh")

    def __init__(self, fh: IO[bytes], counter: _Counter) -> None:
        self._fh = fh
        self._counter = counter

    def read(self, n: int = -1) -> bytes:
        chunk = self._fh.read(n)
        self._counter.add(len(chunk))
        return chunk


def _frames(
    raw: _CountingReader, name: str, hasher: Any, limits: _Limits
) -> Iterator[dict[str, Any]]:
    """Frames from the compressed stream; every frame but the end one goes into ``hasher``.
    The header is the first; every other frame is bounded by ``limits`` (which the header
    sets) before its body is read."""
    first = True
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)  # type: ignore[arg-type]
        while True:
            head = _read_exact(reader, _LENGTH.size, name)
            if not head:
                return
            (length,) = _LENGTH.unpack(head)
            if length > _MAX_FRAME:
                raise ArchiveError(f"{name}: damaged archive (frame of {length} bytes)")
            if first and length > _HEADER_MAX:
                raise ArchiveError(f"{name}: damaged archive (a header of {length} bytes)")
            if not first:
                limits.check(length)
            body = _read_body(reader, length, name)
            frame = ormsgpack.unpackb(body)
            if not isinstance(frame, dict):
                raise ArchiveError(f"{name}: damaged archive (a frame is not a map)")
            if frame.get("t") != "end":
                hasher.update(head)
                hasher.update(body)
                if not first:
                    limits.count(length)
            first = False
            yield frame
    except zstandard.ZstdError as exc:
        raise ArchiveError(f"{name}: damaged archive ({exc})") from None
    except ormsgpack.MsgpackDecodeError as exc:
        raise ArchiveError(f"{name}: damaged archive ({exc})") from None
    except MemoryError:
        raise ArchiveError(f"{name}: not enough memory to read the archive") from None


def _read_body(reader: Any, length: int, name: str) -> bytes:
    """A frame's bytes: its first byte must start a map (a stream of zeros is refused
    before it is read), the rest read in pieces."""
    start = _read_exact(reader, min(length, 1), name)
    if start and start[0] not in _MAP_STARTS:
        raise ArchiveError(f"{name}: damaged archive (a frame is not a map)")
    body = start + _read_exact(reader, length - len(start), name)
    if len(body) != length:
        raise ArchiveError(f"{name}: the archive is truncated")
    return body


def _read_exact(reader: Any, n: int, name: str) -> bytes:
    parts = bytearray()
    while len(parts) < n:
        chunk = reader.read(min(n - len(parts), _PIECE))
        if not chunk:
            break
        parts += chunk
    if parts and len(parts) < n:
        raise ArchiveError(f"{name}: the archive is truncated")
    return bytes(parts)


# -- importing -----------------------------------------------------------------------------------


def import_archive(
    store: Store,
    data: RunExport,
    *,
    run_id: str | None = None,
    progress: Progress | None = None,
) -> Run:
    """Write a verified archive's run into ``store``, as is or as a copy named ``run_id``."""
    if run_id is not None and run_id != data.run.run_id:
        data = renamed(data, run_id)
    return store.import_run(data, progress=progress)


def renamed(data: RunExport, run_id: str) -> RunExport:
    """A copy of ``data`` as run ``run_id``, with fresh checkpoint and input ids.

    ``data`` must have been verified: the copy's records get new checksums, which would
    otherwise launder a damaged record into a valid-looking one.
    """
    old = data.run.run_id
    ids: dict[str, str] = {}
    for record in data.checkpoints:  # oldest first: fresh ids keep the order
        ids[record.id] = new_id(after=ids.get(record.parent_id or ""))
    input_ids = {item.id: new_id() for item in data.inputs}
    checkpoints = []
    for record in data.checkpoints:
        copy = CheckpointRecord(
            id=ids[record.id],
            run_id=run_id,
            parent_id=ids.get(record.parent_id or "", record.parent_id),
            step=record.step,
            created_at=record.created_at,
            schema_version=record.schema_version,
            metadata=_remap_metadata(record.metadata, ids, input_ids, run_id),
            fields=record.fields,
            size=record.size,
            added=record.added,
            writes=record.writes,
        )
        copy.checksum = copy.compute_checksum()
        checkpoints.append(copy)
    run_meta = json.loads(data.run.metadata or "{}")
    run_meta["copied_from"] = old
    run = RunRecord(
        **{
            **asdict(data.run),
            "run_id": run_id,
            "parent_run": None,  # a copy is not one of the parent's children
            "head_id": ids.get(data.run.head_id or "", data.run.head_id),
            "metadata": encode_metadata(run_meta, run_id),
        }
    )
    return RunExport(
        run,
        checkpoints,
        data.blobs,
        [
            InputRecord(
                input_ids[i.id], run_id, i.name, i.payload, i.hash, i.created_at,
                ids.get(i.consumed_by or "", i.consumed_by),
            )
            for i in data.inputs
        ],
        [
            EffectRecord(
                run_id, e.key, ids.get(e.checkpoint_id or "", e.checkpoint_id), e.result, e.hash,
                e.created_at,
            )
            for e in data.effects
        ],
        data.prefixes,
    )


def _remap_metadata(
    text: str, ids: Mapping[str, str], input_ids: Mapping[str, str], run_id: str
) -> str:
    """Checkpoint metadata with the ids it names (``resumed_from``, ``inputs``) remapped."""
    meta = json.loads(text or "{}")
    changed = False
    if meta.get("resumed_from") in ids:
        meta["resumed_from"] = ids[meta["resumed_from"]]
        changed = True
    consumed = meta.get("inputs")
    if isinstance(consumed, dict):
        mapped = {name: input_ids.get(i, i) for name, i in consumed.items()}
        changed = changed or mapped != consumed
        meta["inputs"] = mapped
    return encode_metadata(meta, run_id) if changed else text


# -- helpers for callers -------------------------------------------------------------------------


def default_path(run_id: str) -> str:
    """``<run id>.pitstop`` with characters unsafe in file names replaced."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id).lstrip(".")
    return (safe or "run") + SUFFIX


__all__ = [
    "FORMAT",
    "MAGIC",
    "SPOOL_IN_MEMORY",
    "SUFFIX",
    "VERSION",
    "ArchiveError",
    "ArchiveInfo",
    "SpooledValues",
    "default_path",
    "import_archive",
    "read_archive",
    "renamed",
    "write_archive",
]
