"""How one serialised value is stored: a header byte, optional zstd, and its content hash.

The header names the serialiser (so a store can mix formats) and whether the body is
compressed. The digest covers the format and the *uncompressed* bytes, so the same value always
has the same address whether or not it happened to be compressed, and at whatever level.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import NoReturn

import zstandard

FORMAT_MASK = 0x0F
"""The header bits that hold the serializer's ``format_id``."""
COMPRESSED = 0x10
"""The header bit of a zstd-compressed body."""

# zstandard compressors and decompressors must not be shared between threads, and building one
# per call is wasteful, so each thread keeps its own.
_local = threading.local()


def _compressor(level: int, checksum: bool = True) -> zstandard.ZstdCompressor:
    cache: dict[tuple[int, bool], zstandard.ZstdCompressor] | None = getattr(
        _local, "compressors", None
    )
    if cache is None:
        cache = _local.compressors = {}
    compressor = cache.get((level, checksum))
    if compressor is None:
        # The checksum lets unframe() tell corruption from data; the content size lets the
        # decompressor allocate the output once.
        compressor = cache[level, checksum] = zstandard.ZstdCompressor(
            level=level, write_checksum=checksum, write_content_size=True
        )
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def _refuse_format(format_id: int) -> NoReturn:
    """The error for a ``format_id`` out of range (checked where it is used, without a
    call: :func:`frame` and :func:`digest` run for every value written)."""
    raise ValueError(f"format_id must be between 0 and {FORMAT_MASK}, got {format_id}")


SAMPLE_FROM = 1 << 20
"""Values at least this large are compressed only if a sample of them compresses well."""
_SAMPLE = 16 << 10
_SAMPLES = 4
MIN_SAVING = 0.2
"""The share a sample must shrink by for the whole value to be compressed."""


def compressible(raw: bytes | memoryview, level: int = 3) -> bool:
    """Whether zstd is worth running over ``raw``: four 16 KiB samples spread over it must
    shrink by :data:`MIN_SAVING` together.

    Float data (weights, optimizer moments, embeddings) shrinks by 5-10% at ~150 MB/s: far
    slower than writing it raw, and slower to load again. Text, JSON-like msgpack and sparse
    or integer arrays shrink by half or more and pass. Costs ~0.1 ms, whatever the size.
    """
    view = memoryview(raw).cast("B")
    if len(view) <= _SAMPLE * _SAMPLES:
        return True
    step = (len(view) - _SAMPLE) // (_SAMPLES - 1)
    compressor = _compressor(level)
    packed = sum(
        len(compressor.compress(view[i * step : i * step + _SAMPLE])) for i in range(_SAMPLES)
    )
    return packed <= _SAMPLE * _SAMPLES * (1 - MIN_SAVING)


def frame(
    raw: bytes | memoryview,
    format_id: int,
    *,
    compress_threshold: int | None = 4096,
    level: int = 3,
    checksum: bool = True,
) -> bytes:
    """The stored form of ``raw``: compressed only when it is big enough and it actually helps.

    Small values are left alone because zstd's frame overhead outweighs any gain and reading
    them stays a plain slice; values of :data:`SAMPLE_FROM` bytes and more are compressed only
    when a sample says it pays (:func:`compressible`). ``compress_threshold=None`` turns
    compression off. ``checksum=False`` leaves zstd's own checksum out, for bytes checked
    against a hash of them on every read anyway (chunks: 4 bytes less each, and decompressing
    a conversation's thousands of small chunks takes ~1/3 less time).
    """
    if not 0 <= format_id <= FORMAT_MASK:
        _refuse_format(format_id)
    if compress_threshold is not None and len(raw) >= compress_threshold:
        if len(raw) >= SAMPLE_FROM and not compressible(raw, level):
            return bytes((format_id,)) + raw
        packed = _compressor(level, checksum).compress(raw)
        if len(packed) < len(raw):
            return bytes((format_id | COMPRESSED,)) + packed
    return bytes((format_id,)) + raw


def unframe(stored: bytes) -> tuple[int, bytes]:
    """``(format_id, raw)`` from a stored blob; ``ValueError`` if it is not one pitstop wrote."""
    if not stored:
        raise ValueError("empty blob: the header byte is missing")
    header = stored[0]
    if header & ~(FORMAT_MASK | COMPRESSED):
        if stored[:4] == b"\xffPSE":  # pitstop.store.encoding.sealed.MAGIC
            from ..errors import EncryptionKeyError

            key_id = bytes(stored[4:20]).rstrip(b"\0").decode(errors="replace")
            raise EncryptionKeyError(
                f"value is sealed (encrypted at rest) with key {key_id!r}; open the store "
                "with its keys: open_store(..., encryption=pitstop.Encryption(...))",
                key_id=key_id,
            )
        raise ValueError(f"unknown blob header 0x{header:02x} (written by a newer pitstop?)")
    if not header & COMPRESSED:
        return header & FORMAT_MASK, bytes(stored[1:])
    try:
        raw = _decompressor().decompress(memoryview(stored)[1:], allow_extra_data=False)
    except (zstandard.ZstdError, MemoryError) as exc:
        raise ValueError(f"corrupt or truncated compressed blob: {exc}") from exc
    return header & FORMAT_MASK, raw


_MANY_THREADS_MIN = 1 << 20
"""Compressed bytes from which :func:`decompress_many` spreads the frames over threads."""


def decompress_many(bodies: Sequence[bytes | memoryview]) -> list[memoryview]:
    """The zstd bodies (frames after the header byte) decompressed in one call, by zstd's C
    loop (no Python call per frame) and, for many bytes, on two threads: a restore of a
    conversation stored on PostgreSQL decompresses a frame per message, thousands of them.
    ``ValueError`` if one is corrupt."""
    threads = 2 if sum(len(b) for b in bodies) >= _MANY_THREADS_MIN else 1
    try:
        done = _decompressor().multi_decompress_to_buffer(list(bodies), threads=threads)
    except (zstandard.ZstdError, MemoryError, ValueError) as exc:  # ValueError: no size
        raise ValueError(f"corrupt or truncated compressed blob: {exc}") from exc
    return [memoryview(done[i]) for i in range(len(bodies))]  # type: ignore[arg-type]


def is_compressed(stored: bytes) -> bool:
    """Whether a stored blob's body is zstd-compressed (a prefix of it is not a prefix of
    its bytes)."""
    return bool(stored) and bool(stored[0] & COMPRESSED)


def unframe_view(stored: bytes) -> tuple[int, bytes | memoryview]:
    """Like :func:`unframe`, without copying an uncompressed body (a view of ``stored``):
    what reading many chunks to join them wants."""
    if stored and not stored[0] & ~FORMAT_MASK:
        return stored[0], memoryview(stored)[1:]
    return unframe(stored)


def digest(format_id: int, raw: bytes) -> bytes:
    """The 32-byte content address of a value: SHA-256 of the format byte, then the raw bytes.

    The format is part of the hash so that identical bytes from two serialisers never collide.
    """
    if not 0 <= format_id <= FORMAT_MASK:
        _refuse_format(format_id)
    hasher = hashlib.sha256()
    hasher.update(bytes((format_id,)))
    hasher.update(raw)  # a second update instead of concatenating: no copy of a large value
    return hasher.digest()


__all__ = [
    "compressible",
    "decompress_many",
    "digest",
    "frame",
    "is_compressed",
    "unframe",
    "unframe_view",
]
