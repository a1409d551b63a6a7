"""Encryption at rest of a blob store: every value in it sealed with AES-256-GCM.

``blobs=SealedBlobStore("s3://bucket/prefix", pitstop.Encryption(keys={"k2": key2, "k1":
key1}, current="k2"))`` (any blob store: a directory, a bucket) seals each value the store
writes under the current key, and opens values sealed under any key of the ring: old keys
keep decrypting, and ``pitstop rekey --to k2`` (:func:`pitstop.store.engine.rekey.rekey`) seals
again under ``k2`` whatever an older key sealed. ``?encryption=env:PITSTOP_KEYS`` reads the
ring from an environment variable (:meth:`Encryption.from_env`).

What it covers, exactly: the bytes in the blob store, i.e. every value of at least
``blob_threshold`` stored bytes (1 MiB by default) and every chunk of a large array or
buffer; and, in the database, the records of a run (inputs, effects' results, attached
writes: :meth:`Encryption.seal_small`, under a keyed content address,
:meth:`Encryption.address`) and the state's values kept there (inline fields,
:meth:`Encryption.seal_small`; value rows and chunks, :meth:`Encryption.seal_row`), sealed
by the value codec whichever the backend (:mod:`pitstop.store.encoding.sealing`). Records
and the state's whole values are under keyed addresses (:meth:`Encryption.address`), chunks
and chunk-tree nodes under keyed chunk keys (:meth:`Encryption.chunk_keys`); run ids, step
names, metadata and sizes stay plaintext there.

A sealed value is ``magic (4) | key id (16, NUL-padded) | nonce (12) | ciphertext | tag (16)``:
a fixed 48 bytes more than the value, so a row's recorded size still locates it in its pack.
The value's content key is the authenticated data: a sealed value moved under another key
(swapped in a pack, copied between packs) fails to open, as does any altered byte; the load
then reports the value as damaged (``CorruptCheckpointError``, passed over by
``latest(fallback=True)``, named by ``verify``). A value sealed under a key the ring does not
have is refused with :class:`~pitstop.EncryptionKeyError` naming the key id, never handed on
as garbage.

Every value is written into a pack (also a save's single value, which a plain store names by
its content key): object and file names are random, so whoever can list the bucket learns
sizes and times, not which values equal which.

A large save into a directory is sealed a batch at a time by one thread while another
writes the batch before it to the pack (no buffer the size of the save); into a bucket,
on several threads (``cryptography``'s AES-GCM releases the GIL). bench/encryption.py
measures it against ``cryptography`` alone and against an unsealed save.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import mmap
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ...errors import EncryptionKeyError, UnsupportedStoreError
from .blobs import BlobStore, Pieces, Slot

if TYPE_CHECKING:
    from ...serde.chunkkeys import ChunkKeys

MAGIC: Final = b"\xffPSE"
"""The first bytes of a sealed value (0xff is never a plain value's header byte)."""
_KEY_ID_SIZE: Final = 16
_NONCE_SIZE: Final = 12
_TAG_SIZE: Final = 16
OVERHEAD: Final = len(MAGIC) + _KEY_ID_SIZE + _NONCE_SIZE + _TAG_SIZE
"""Bytes a sealed value has beyond its plaintext."""

_PARALLEL_FROM: Final = 8 << 20
"""Bytes of a save from which values are sealed by several threads (or, into a directory,
streamed: sealed by one thread while another writes)."""
_STREAM_BUFFERS: Final = 2
_STREAM_BATCH: Final = 8 << 20
"""Bytes sealed into one of a streamed save's buffers while another is written. Batches of
1 to 64 MiB and two to eight buffers were tried at load 12-16 on 2 cores: none was
consistently faster than another (sealing one batch after writing the last, on one thread,
was slower than all)."""


class _Nonces:
    """Fresh 96-bit AES-GCM nonces: 8 random bytes drawn once per process (and again in a
    forked child, which must not repeat its parent's), then a 32-bit count (NIST SP
    800-38D's deterministic construction: unique per key, which is all GCM asks).
    ``os.urandom(12)`` per value was a ``getrandom`` call each: ~17 us of a small sealed
    step's ~150 us on the loaded machine, where this is a fraction of one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._draw()
        os.register_at_fork(after_in_child=self._draw)

    def _draw(self) -> None:
        self._prefix = os.urandom(8)
        self._count = itertools.count()

    def __call__(self) -> bytes:
        n = next(self._count)  # (atomic under the GIL)
        if n >> 32:
            with self._lock:  # 2**32 values sealed by this process: a new prefix
                if next(self._count) >> 32:
                    self._draw()
            return self()
        return self._prefix + n.to_bytes(4, "big")


_nonce = _Nonces()


@dataclass(frozen=True)
class Encryption:
    """A key ring for encryption at rest: ``keys`` by id (32 bytes each, AES-256), and the id
    of the ``current`` key, which seals everything written. The others only open what they
    sealed before, until ``pitstop rekey`` has sealed it again under the current one."""

    keys: Mapping[str, bytes]
    current: str
    _ciphers: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)
    _address_keys: dict[str, bytes] = field(default_factory=dict, init=False, repr=False,
                                            compare=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise UnsupportedStoreError("encryption: no keys given")
        for key_id, key in self.keys.items():
            if not key_id or len(key_id.encode()) > _KEY_ID_SIZE or "\0" in key_id:
                raise UnsupportedStoreError(
                    f"encryption: key id {key_id!r} must be 1 to {_KEY_ID_SIZE} bytes"
                )
            if not isinstance(key, bytes | bytearray) or len(key) != 32:
                raise UnsupportedStoreError(
                    f"encryption: key {key_id!r} must be 32 bytes (AES-256), not "
                    f"{len(key) if isinstance(key, bytes | bytearray) else type(key).__name__}"
                )
        if self.current not in self.keys:
            raise UnsupportedStoreError(
                f"encryption: the current key {self.current!r} is not among the keys "
                f"({', '.join(sorted(self.keys))})"
            )
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:
            raise UnsupportedStoreError(
                "encryption at rest needs the encryption extra: "
                f"pip install 'pitstop[encryption]' ({exc})"
            ) from exc
        for key_id, key in self.keys.items():
            self._ciphers[key_id] = AESGCM(bytes(key))

    def __repr__(self) -> str:  # never the keys
        return f"Encryption(keys=[{', '.join(sorted(self.keys))}], current={self.current!r})"

    @classmethod
    def from_env(cls, name: str = "PITSTOP_KEYS") -> Encryption:
        """The ring in the environment variable ``name``: ``id=base64key,id=base64key``, the
        first one current (``k2=...,k1=...``: seal under k2, open k1's too)."""
        text = os.environ.get(name)
        if not text:
            raise UnsupportedStoreError(f"encryption: environment variable {name} is not set")
        keys: dict[str, bytes] = {}
        for item in text.split(","):
            key_id, sep, encoded = item.strip().partition("=")
            if not sep:
                raise UnsupportedStoreError(
                    f"encryption: {name} must be id=base64key[,id=base64key...]"
                )
            try:
                keys[key_id.strip()] = base64.b64decode(encoded.strip() + "==", validate=False)
            except ValueError:
                raise UnsupportedStoreError(
                    f"encryption: key {key_id.strip()!r} in {name} is not base64"
                ) from None
        return cls(keys=keys, current=next(iter(keys)))

    def with_current(self, key_id: str) -> Encryption:
        """The same ring, sealing under ``key_id`` (one of its keys)."""
        return Encryption(keys=self.keys, current=key_id)

    def seal(self, key: bytes, pieces: Sequence[bytes | memoryview]) -> memoryview:
        """The value (``pieces`` one after the other) sealed under the current key, bound to
        the content key ``key``, in a new buffer (see :meth:`seal_into`)."""
        size = sum(memoryview(piece).nbytes for piece in pieces)
        out = memoryview(bytearray(sealed_size(size)))
        return out[: self.seal_into(key, pieces, out)]

    def seal_into(self, key: bytes, pieces: Sequence[bytes | memoryview],
                  target: memoryview) -> int:
        """Seal the value (``pieces`` one after the other: a chunk's header byte and a view
        of an array) under the current key, bound to the content key ``key``, into
        ``target`` (:func:`sealed_size` bytes or more); how many bytes it took.

        AES-GCM's streaming form, each piece encrypted straight into place: joining a
        chunk's two pieces first and prefixing the header after (two fresh 1 MiB copies per
        chunk) sealed at 5% of ``cryptography``'s one-shot speed on the same bytes here;
        this runs at ~93% of it (bench/encryption.py)."""
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        nonce = _nonce()
        head = len(MAGIC) + _KEY_ID_SIZE
        target[: len(MAGIC)] = MAGIC
        target[len(MAGIC) : head] = _padded(self.current)
        target[head : head + _NONCE_SIZE] = nonce
        encryptor = Cipher(
            algorithms.AES(self.keys[self.current]), modes.GCM(nonce)
        ).encryptor()
        encryptor.authenticate_additional_data(key)
        at = head + _NONCE_SIZE
        for piece in pieces:
            view = memoryview(piece).cast("B")
            if view.nbytes:
                at += encryptor.update_into(view, target[at:])
        encryptor.finalize()
        target[at : at + _TAG_SIZE] = encryptor.tag
        return at + _TAG_SIZE

    def seal_small(self, key: bytes, data: bytes) -> bytes:
        """A small value (a record kept in the database: an input, an effect's result, an
        attached write) sealed under the current key, bound to its content key ``key``: the
        same layout as :meth:`seal_into`, by AES-GCM's one-shot form (~1 us for 64 bytes,
        where the streaming form's objects cost several)."""
        nonce = _nonce()
        body: bytes = self._ciphers[self.current].encrypt(nonce, data, key)
        return MAGIC + _padded(self.current) + nonce + body

    def seal_row(self, key: bytes, data: bytes) -> bytes:
        """A row of the value table (a small value or chunk of a state, under its content
        key ``key``) sealed under the current key, bound to ``key``: :meth:`seal_small`'s
        layout, with the nonce a keyed BLAKE2b of ``key`` and ``data`` (a synthetic IV) in
        place of a random one. The same value sealed twice under one key is then the same
        bytes: a save that sends a chunk stored already (another run's, a fork's) finds it
        equal where the row's bytes are compared (PostgreSQL's one-statement save, the
        collision check), which a random nonce would report as a clash every time. Equal
        rows are one row anyway (their key says so), so this tells nobody more; distinct
        values get distinct nonces but with the chance of a 96-bit collision."""
        hasher = hashlib.blake2b(bytes((len(key),)) + key, digest_size=_NONCE_SIZE,
                                 key=self._derived(b"pitstop row nonce v1"))
        hasher.update(data)
        nonce = hasher.digest()
        body: bytes = self._ciphers[self.current].encrypt(nonce, data, key)
        return MAGIC + _padded(self.current) + nonce + body

    def _derived(self, info: bytes, key_id: str | None = None) -> bytes:
        """A 32-byte secret for ``info`` derived from the key ``key_id`` (the current one by
        default) by HKDF-SHA256 (kept apart from the AES key, and from each other)."""
        key_id = self.current if key_id is None else key_id
        secret = self._address_keys.get(key_id + "\0" + info.decode())
        if secret is None:
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.kdf.hkdf import HKDF

            secret = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(
                bytes(self.keys[key_id])
            )
            self._address_keys[key_id + "\0" + info.decode()] = secret
        return secret

    def address(self, format_id: int, raw: bytes) -> bytes:
        """The content key of a record or whole value of the state a sealed store keeps, in
        place of :func:`pitstop.serde.digest`'s SHA-256 (32 bytes too): BLAKE2b-256 keyed with a
        secret derived from the current key by HKDF-SHA256. Whoever lacks the key cannot
        tell which rows hold equal values, nor confirm a guess of a value from its key (a
        plain hash of a short value, "approved", is both). BLAKE2b's keyed mode is a PRF by
        design, one pass where HMAC-SHA256 takes two (a 64-byte value: ~1 us, as SHA-256);
        HKDF keeps the address secret apart from the AES key. A key rotation changes the
        addresses of new values only: an address is never recomputed on reading (the seal
        binds it, as authenticated data), so ``rekey`` leaves it as it is."""
        return self._address(format_id, raw, None)

    def _address(self, format_id: int, raw: bytes | memoryview, key_id: str | None) -> bytes:
        secret = self._derived(b"pitstop content address v1", key_id)
        hasher = hashlib.blake2b(bytes((format_id,)), digest_size=32, key=secret)
        hasher.update(raw)
        return hasher.digest()

    def chunk_keys(self, format_id: int) -> ChunkKeys:
        """How a sealed store keys its chunks and chunk-tree nodes
        (:mod:`pitstop.serde.chunkkeys`): BLAKE2b-128 of a chunk's plain key, keyed with a
        secret derived from the current key as :meth:`address`'s is (another ``info``), in
        place of the plain key, which anyone can compute from a guess of the chunk; and
        lists and dicts cut where a hash seeded by a third secret says. The secrets of the
        ring's other keys check chunks keyed under them before a rotation. As with
        :meth:`address`, a rotation changes the keys of new chunks only (``rekey`` seals
        a chunk again under its key as it was): the first save of a value after it writes
        the value's chunks again, under keys of the new key, and deduplicates from then on.
        ``format_id``: the serializer's, with ``SHA256_KEYS`` if the store keys chunks by
        SHA-256."""
        from ...serde.chunkkeys import ChunkKeys

        info = b"pitstop chunk address v1"
        seed = self._derived(b"pitstop chunk cuts v1")
        return ChunkKeys(
            format_id, secret=self._derived(info),
            others=[self._derived(info, key_id) for key_id in self.keys if key_id != self.current],
            cut_seed=int.from_bytes(seed[:8], "big"),
        )

    def addresses(self, format_id: int, raw: bytes | memoryview, key: bytes) -> bool:
        """Whether ``key`` is the address (:meth:`address`) of ``raw`` under some key of the
        ring: the check of a whole value of the state read back, whichever key was current
        when it was saved (the current one tried first)."""
        if self._address(format_id, raw, None) == key:
            return True
        return any(self._address(format_id, raw, key_id) == key
                   for key_id in self.keys if key_id != self.current)

    def open(self, key: bytes, sealed: bytes | memoryview) -> bytes | None:
        """The plaintext of ``sealed`` (None: altered, or bound to another key). Raises
        :class:`~pitstop.EncryptionKeyError` if its key is not in the ring."""
        from cryptography.exceptions import InvalidTag

        view = memoryview(sealed)
        if len(view) < OVERHEAD or not is_sealed(view):
            return None
        key_id = key_id_of(view)
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise EncryptionKeyError(
                f"value {key.hex()[:16]} is sealed with key {key_id!r}, which this store's "
                f"Encryption does not have (it has {', '.join(sorted(self.keys))})",
                key_id=key_id,
            )
        start = len(MAGIC) + _KEY_ID_SIZE
        nonce = bytes(view[start : start + _NONCE_SIZE])
        try:
            return bytes(cipher.decrypt(nonce, view[start + _NONCE_SIZE :], key))
        except InvalidTag:
            return None


class Opened(bytes):
    """The plaintext of a whole value of the state, or of a chunk under a keyed key, read
    back from a sealed store's value table or blob store (:meth:`SealedBlobStore.get`,
    ``Sealing.open_row``): AES-GCM authenticated it bound to its content key, so a load
    checks no hash of it again. Its key is a keyed address (:meth:`Encryption.address`,
    :meth:`Encryption.chunk_keys`) computed under whichever key was current when it was
    saved, which may have left the ring since (``rekey`` sealed it again under the new
    key, the address as it was): the plaintext alone could not be checked against it
    then."""

    __slots__ = ()


def opens_checked(key: bytes) -> bool:
    """Whether a value under ``key`` is handed on as :class:`Opened` once opened: a whole
    value (32 bytes) or a chunk under a keyed key (not a plain chunk key, which a load
    checks by its hash, as in any store)."""
    return len(key) == 32 or key[0] in _KEYED_CHUNK_KINDS


_KEYED_CHUNK_KINDS: Final = frozenset({0x03, 0x04})
"""The kind bytes of keyed chunk keys (:data:`pitstop.serde.chunkkeys.KEY_KEYED`, ...),
here so that reading rows does not import the chunker."""


def sealed_size(size: int) -> int:
    """Room :meth:`Encryption.seal_into` needs for a value of ``size`` bytes (the sealed
    value takes ``size + OVERHEAD``; AES-GCM's streaming form wants a block's slack)."""
    return size + OVERHEAD + 15


def key_id_of(sealed: bytes | memoryview) -> str:
    """The id of the key ``sealed`` is sealed under (from its header)."""
    raw = bytes(memoryview(sealed)[len(MAGIC) : len(MAGIC) + _KEY_ID_SIZE])
    return raw.rstrip(b"\0").decode(errors="replace")


def is_sealed(data: bytes | memoryview) -> bool:
    return bytes(memoryview(data)[: len(MAGIC)]) == MAGIC


def _padded(key_id: str) -> bytes:
    return key_id.encode().ljust(_KEY_ID_SIZE, b"\0")


class SealedBlobStore(BlobStore):
    """A blob store (``inner``: a directory, a bucket, a URL naming one) whose every value is
    sealed with :class:`Encryption` (see the module)."""

    def __init__(self, inner: BlobStore | str | os.PathLike[str], encryption: Encryption
                 ) -> None:
        from .blobs import open_blob_store

        self.inner = open_blob_store(inner)
        self.encryption = encryption
        self.url = self.inner.url
        self.orphan_age = self.inner.orphan_age
        self._failure = threading.local()

    def _inner_slot(self, slot: Slot | None) -> Slot | None:
        """Where the sealed value is: rows record the plaintext size, which locates it."""
        return None if slot is None else Slot(slot.pack, slot.offset, slot.size + OVERHEAD)

    # -- writing ------------------------------------------------------------------------------

    def put(self, key: bytes, data: bytes) -> None:
        self.put_many([(key, (data,))])

    def put_many(
        self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True, pack: bool = True
    ) -> dict[bytes, Slot]:
        """Each value sealed (several threads for a large save), then all packed by the
        inner store; the slots answered name the plaintext sizes (what rows record)."""
        todo = dict(items)
        if not todo:
            return {}
        keys = list(todo)
        sizes = [sum(memoryview(p).nbytes for p in todo[key]) for key in keys]
        if sum(sizes) >= _PARALLEL_FROM and len(keys) > 1:
            from .blobs import DirectoryBlobStore

            if isinstance(self.inner, DirectoryBlobStore):
                return self._put_streamed(self.inner, keys, sizes, todo, sync)
        # One buffer for the whole save: a fresh 1 MiB buffer per chunk costs its allocation
        # and page faults on top of the cipher (256 of them per 256 MiB). An anonymous
        # mapping: its pages are faulted in by the sealing threads as they write, where
        # bytearray(n) zeroes all of it on this thread first (0.75 s for 256 MiB on a busy
        # machine) and partchunks.uninitialised's huge-page-aligned buffer made sealing into
        # it and writing it out take 0.55 s + 0.66 s (a plain one: 0.06 s + 0.09 s).
        starts = list(itertools.accumulate((sealed_size(n) for n in sizes), initial=0))
        buffer = memoryview(mmap.mmap(-1, starts[-1]))

        def seal(i: int) -> memoryview:
            start = starts[i]
            done = self.encryption.seal_into(keys[i], todo[keys[i]],
                                             buffer[start : starts[i + 1]])
            return buffer[start : start + done]

        if starts[-1] >= _PARALLEL_FROM and len(keys) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(4, os.cpu_count() or 1, len(keys))) as pool:
                sealed = list(pool.map(seal, range(len(keys)), chunksize=16))
        else:
            sealed = [seal(i) for i in range(len(keys))]
        slots = self.inner.put_many(
            [(key, (body,)) for key, body in zip(keys, sealed, strict=True)], sync=sync,
            pack=True,
        )
        return {key: Slot(s.pack, s.offset, s.size - OVERHEAD) for key, s in slots.items()}

    def _put_streamed(self, inner: Any, keys: list[bytes], sizes: list[int],
                      todo: dict[bytes, Pieces], sync: bool) -> dict[bytes, Slot]:
        """A large save into a directory: one pack, its values sealed a batch of ~8 MiB at a
        time into one of a few buffers by a thread while this one writes another batch to
        the file. Sealing the whole save into a buffer of its own first took ~0.6-1.4 s of
        page faults for 256 MiB on the loaded 2-core machine, where sealing into a buffer
        used again took 0.09 s (bench/encryption.py: a sealed save 1.83-2.05x the plain
        one before, 1.2-1.8x after, at load 12-16; docs/benchmarks.md)."""
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        groups: list[range] = []
        start = room = 0
        for i, size in enumerate(sizes):
            room += sealed_size(size)
            if room >= _STREAM_BATCH:
                groups.append(range(start, i + 1))
                start, room = i + 1, 0
        if start < len(keys):
            groups.append(range(start, len(keys)))
        capacity = max(sum(sealed_size(sizes[i]) for i in group) for group in groups)
        buffers = [memoryview(bytearray(capacity))
                   for _ in range(min(_STREAM_BUFFERS, len(groups)))]

        def seal(number: int) -> list[memoryview]:
            buffer = buffers[number % len(buffers)]
            at = 0
            out = []
            for i in groups[number]:
                done = self.encryption.seal_into(keys[i], todo[keys[i]], buffer[at:])
                out.append(buffer[at : at + done])
                at += done
            return out

        def batches() -> Iterator[list[memoryview]]:
            # The sealing thread runs up to a buffer per batch ahead of the writer; batch n
            # takes the buffer batch n - len(buffers) was written from, once it has been.
            ahead = len(buffers)
            with ThreadPoolExecutor(1) as pool:
                pending = deque(pool.submit(seal, number) for number in range(ahead))
                for number in range(len(groups)):
                    yield pending.popleft().result()
                    if number + ahead < len(groups):  # (batch `number` is written now)
                        pending.append(pool.submit(seal, number + ahead))

        slots = inner.put_pack_streamed(
            [(key, size + OVERHEAD) for key, size in zip(keys, sizes, strict=True)],
            batches(), sync,
        )
        return {key: Slot(s.pack, s.offset, s.size - OVERHEAD) for key, s in slots.items()}

    # -- reading ------------------------------------------------------------------------------

    def prefetch(self, values: Sequence[tuple[bytes, Slot | None]]) -> None:
        self.inner.prefetch([(key, self._inner_slot(slot)) for key, slot in values])

    def get(self, key: bytes, slot: Slot | None = None) -> bytes | None:
        found = self._open(key, slot)
        if found is None:
            return None
        data, opened = found
        return Opened(data) if opened and opens_checked(key) else data  # see Opened

    def _open(self, key: bytes, slot: Slot | None) -> tuple[bytes, bool] | None:
        """The value's plaintext, and whether AES-GCM authenticated it (it was sealed)."""
        data = self.inner.get(key, self._inner_slot(slot))
        if data is None:
            self._failure.reason = None
            return None
        if not is_sealed(data):
            if slot is not None:  # whatever this store packed, it sealed
                self._failure.reason = "not sealed, where this store seals every value"
                return None
            return data, False  # written before the store was sealed: `rekey` seals it
        plain = self.encryption.open(key, data)
        if plain is None:
            self._failure.reason = (
                f"fails authentication under key {key_id_of(data)!r} (altered, or moved "
                "from another value's place)"
            )
            return None
        return plain, True

    def read_into(self, key: bytes, target: memoryview, slot: Slot | None = None) -> int | None:
        """As :meth:`BlobStore.read_into`; a chunk under a keyed key only if it was sealed
        (authenticated: the caller checks no hash of it), else None (the caller's
        :meth:`get` then names it, or checks it against its key)."""
        found = self._open(key, slot)
        if found is None:
            return None
        data, opened = found
        if len(data) != target.nbytes + 1 or (not opened and opens_checked(key)):
            return None
        target[:] = memoryview(data)[1:]  # (not through Opened: a copy of a MiB less)
        return data[0]

    def why_missing(self, key: bytes, slot: Slot | None = None) -> str:
        self.get(key, slot)
        reason = getattr(self._failure, "reason", None)
        if reason:
            return f"sealed value {key.hex()[:16]} {reason}"
        return self.inner.why_missing(key, self._inner_slot(slot))

    def sealed_with(self, key: bytes, slot: Slot | None) -> str | None:
        """The id of the key the stored value is sealed under (None: missing, or plain)."""
        data = self.inner.get(key, self._inner_slot(slot))
        return key_id_of(data) if data is not None and is_sealed(data) else None

    # -- the rest, as the inner store does it -------------------------------------------------

    def delete(self, keys: Iterable[bytes]) -> None:
        self.inner.delete(keys)

    def delete_packs(self, names: Iterable[str]) -> None:
        self.inner.delete_packs(names)

    def keys(self, *, older_than: float = 0.0) -> Iterator[bytes]:
        return self.inner.keys(older_than=older_than)

    def packs(self, *, older_than: float = 0.0) -> Iterator[str]:
        return self.inner.packs(older_than=older_than)

    def remove_abandoned(self, *, older_than: float) -> int:
        return self.inner.remove_abandoned(older_than=older_than)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "orphan_age" and "inner" in self.__dict__:
            self.inner.orphan_age = value

    def __repr__(self) -> str:
        return f"SealedBlobStore({self.inner!r}, {self.encryption!r})"


__all__ = [
    "OVERHEAD", "Encryption", "Opened", "SealedBlobStore", "is_sealed", "key_id_of",
    "opens_checked"]
