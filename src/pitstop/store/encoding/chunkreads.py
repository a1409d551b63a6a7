"""A chunked value read back from its checked leaves into the value it was, by kind.

:meth:`ValueCodec.decode_chunked <pitstop.store.encoding.valuecodec.ValueCodec.decode_chunked>`
reads a manifest, walks its tree of nodes and checks each chunk it reads; what turns the
leaves into the value is here. A list of pitstop's msgpack is decoded from its leaf rows in
one pass (:func:`list_from_leaf_rows`) or a group of leaves at a time (:func:`load_list`);
each returns None where the codec's general path (the leaves' bytes joined, one decode) must
take over and name what is wrong. An array stored whole, or a value holding arrays (parts),
gets each chunk read straight into its place in the array's buffer and checked there
(:func:`read_array`, :func:`read_parts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ...errors import CorruptCheckpointError
from ...serde import chunks as chunking
from ...serde import partchunks
from ...serde.chunkkeys import ChunkKeys
from ...serde.framing import FORMAT_MASK
from .blobs import BlobStore, ChunkCheck, Deferred, Slot
from .leafrows import list_from_rows
from .records import Stored
from .sealed import SealedBlobStore, opens_checked

if TYPE_CHECKING:
    from ...serde.codec import MsgpackSerializer

Corrupt = Callable[[str], CorruptCheckpointError]
"""Makes the error that names the checkpoint and field being read."""
RawOf = Callable[[bytes], bytes | memoryview]
"""A chunk's raw bytes by key, read and checked (the codec's per-chunk path)."""


class RowsReleased(Exception):
    """A decode that dropped rows of the read it was given (``consume=True``) needs them
    again: read the values again and decode without ``consume`` (it then names the error)."""


def list_from_leaf_rows(
    readers: Mapping[int, MsgpackSerializer],
    keying: ChunkKeys,
    items: int,
    leaves: Sequence[chunking.Entry],
    blobs: Mapping[bytes, Stored],
    *,
    strict: bool,
    consume: bool,
) -> tuple[int, list[object]] | None:
    """A chunked list of pitstop's msgpack (a reader of ``readers``) and its format, checked
    and decoded in one pass over its rows (see
    :func:`~pitstop.store.encoding.leafrows.list_from_rows`), or None: rows it does not take,
    or a failed check or decode, which the general path then names. ``consume``: rows are
    dropped from ``blobs`` as they are decoded; after a failure :class:`RowsReleased` then
    asks for a new read."""
    held = len(blobs)
    found = list_from_rows(readers, leaves, blobs, strict=strict, consume=consume, keying=keying)
    if found is not None and len(found[1]) == items:
        return found
    if len(blobs) != held:
        raise RowsReleased
    return None


def load_list(
    readers: Mapping[int, MsgpackSerializer],
    fmt: int,
    items: int,
    leaves: Sequence[chunking.Entry],
    raws: Mapping[bytes, bytes | memoryview],
    *,
    strict: bool,
    rows: dict[bytes, Stored] | None = None,
) -> list[object] | None:
    """A chunked list decoded a group of leaves at a time (pitstop's own msgpack format),
    or None: another serializer, or anything the fast decode refuses, which decoding the
    joined bytes then names exactly as it always did.

    ``rows``: the read's own rows, which nothing else holds. Each leaf's row is dropped
    from them (and from ``raws``) once it is in a group, so the decoded strings reuse
    memory just freed, still in the cache, instead of pages the process must fault in
    (a 2,000-message restore: ~3.1 -> ~2.2 ms of fetch, check and decode). Should the
    fast decode then fail, :class:`RowsReleased` says the rows must be read again."""
    reader = readers.get(fmt)
    if reader is None:
        return None
    released = False
    release = None
    if rows is not None:
        owned = cast(dict[bytes, Any], raws)

        def release(key: bytes) -> None:
            nonlocal released
            released = True
            owned.pop(key, None)
            rows.pop(key, None)

    try:
        value = reader._loads_lists(chunking.list_groups(leaves, raws, release), strict=strict)
    except Exception:
        value = None
    if value is not None and len(value) == items:
        return value
    if released:
        raise RowsReleased
    return None


def read_array(
    meta: Any,
    items: int,
    leaves: Sequence[chunking.Entry],
    blobs: Mapping[bytes, Stored],
    raw_of: RawOf,
    formats: set[int],
    keys: ChunkKeys,
    corrupt: Corrupt,
) -> Any:
    """A numpy array stored whole (the ``ndarray`` kind): one uninitialised buffer, each
    chunk read from its file into its place and checked there, as ``np.load`` reads a
    file into the array it allocates (no chunk read into bytes, no join). ``formats``
    gains the format of each chunk read."""
    kind = "ndarray"
    try:
        import numpy
        from numpy.lib import format as npy_format

        descr, shape = meta
        dtype = npy_format.descr_to_dtype(descr)
        shape = tuple(shape)
    except Exception as exc:
        raise corrupt(f"chunks do not make a {kind} ({type(exc).__name__}: {exc})") from None
    buffer = partchunks.uninitialised(items)
    check = _chunk_check(corrupt, keys)
    fill = _chunk_filler(blobs, raw_of, formats, check)
    try:
        partchunks.fill_buffers([buffer], leaves, fill, _chunk_planner(blobs, check))
        if not shape or 0 in shape:
            return numpy.zeros(shape, dtype=dtype)  # as chunks.assemble builds it
        return numpy.frombuffer(buffer, dtype=dtype).reshape(shape)
    except (ValueError, TypeError) as exc:
        raise corrupt(f"chunks do not make a {kind} ({type(exc).__name__}: {exc})") from None


def read_parts(
    meta: Any,
    items: int,
    leaves: Sequence[chunking.Entry],
    blobs: Mapping[bytes, Stored],
    raw_of: RawOf,
    formats: set[int],
    keys: ChunkKeys,
    corrupt: Corrupt,
) -> tuple[bytes, list[Any]]:
    """A ``parts`` value's skeleton and its arrays' buffers: each chunk checked and copied
    straight into the buffer of its array (one copy; no joined intermediate), for the
    serializer's ``loads_parts`` to build the arrays on. ``formats`` as :func:`read_array`."""
    check = _chunk_check(corrupt, keys)
    fill = _chunk_filler(blobs, raw_of, formats, check)
    try:
        return partchunks.assemble_parts(meta, items, leaves, fill, _chunk_planner(blobs, check))
    except ValueError as exc:
        raise corrupt(f"chunks do not make the stored arrays ({exc})") from None


def _chunk_check(corrupt: Corrupt, keys: ChunkKeys) -> ChunkCheck:
    """What checks a plain chunk read into its place against its key (a chunk of another
    kind is read again, and checked, by the general path)."""

    def check(key: bytes, header: int, body: memoryview) -> None:
        if not header & ~FORMAT_MASK and not keys.check(key, header, body):
            raise corrupt(f"chunk {key.hex()[2:18]}: checksum mismatch (truncated or altered)")

    return check


def _authenticated(key: bytes, header: int, body: memoryview) -> None:
    """The check of a chunk AES-GCM has already authenticated: none to add."""


def _chunk_filler(
    blobs: Mapping[bytes, Stored],
    raw_of: RawOf,
    formats: set[int],
    check: ChunkCheck,
) -> partchunks.Fill:
    """What writes a chunk's raw bytes into its place in an array's buffer: a blob-store file
    read straight into it and checked there (by ``check``; object storage checks each as it
    lands); a chunk in the table copied after ``raw_of`` checked it. Safe to call from
    several threads at once (one place each)."""

    def fill(entry: chunking.Entry, target: memoryview) -> None:
        data = blobs.get(entry.key)
        if isinstance(data, Deferred):
            # From the file into place (no other copy), checked there. A sealed blob store
            # reads a chunk under a keyed key into place only once AES-GCM has authenticated
            # it (see SealedBlobStore.read_into): no second check.
            trusted = opens_checked(entry.key) and isinstance(data.store, SealedBlobStore)
            header = data.read_checked_into(target, _authenticated if trusted else check)
            if header is not None and not header & ~FORMAT_MASK:
                formats.add(header)
                return
        raw = raw_of(entry.key)  # in the table, or not a plain chunk: read, checked
        if len(raw) != len(target):
            raise ValueError(f"chunk {entry.key.hex()[2:18]} has the wrong size")
        target[:] = raw

    return fill


def _chunk_planner(blobs: Mapping[bytes, Stored], check: ChunkCheck) -> partchunks.Plan:
    """What tells the blob store where each chunk still in it goes, before the first is
    read, and how it is checked (object storage then streams each pack into the array's
    memory as it arrives, checking each chunk as it lands)."""

    def plan(jobs: Sequence[tuple[chunking.Entry, memoryview]]) -> None:
        by_store: dict[int, tuple[BlobStore, list[tuple[bytes, Slot | None, memoryview]]]] = {}
        for entry, target in jobs:
            data = blobs.get(entry.key)
            if isinstance(data, Deferred):
                by_store.setdefault(id(data.store), (data.store, []))[1].append(
                    (data.key, data.slot, target))
        for store, places in by_store.values():
            store.place(places, check)

    return plan


__all__ = [
    "Corrupt",
    "RawOf",
    "RowsReleased",
    "list_from_leaf_rows",
    "load_list",
    "read_array",
    "read_parts",
]
