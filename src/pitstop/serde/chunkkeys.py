"""The content addresses of chunks: plain hashes, or keyed ones in a sealed store.

A chunk key is 17 bytes, a kind byte then 16 bytes:

* :data:`KEY_XXH3`: xxh3-128 of the chunk, seeded by its serializer's format (the default:
  ~20 GB/s; detects any accidental damage);
* :data:`KEY_SHA256`: SHA-256 of the format byte and the chunk, cut to 128 bits (a store
  opened with ``chunk_hash="sha256"``: no one can make two chunks with one key);
* :data:`KEY_KEYED` and :data:`KEY_KEYED_SHA256` (a store opened with ``encryption=``):
  BLAKE2b-128, keyed with a secret derived from the store's current key
  (:meth:`pitstop.store.encoding.sealed.Encryption.chunk_keys`), of the chunk's plain key
  of the first or second kind.

A plain key is a public function of the chunk: whoever reads the value table could confirm a
guess of a chunk ("is this the list of messages I think it is?") and see that two stores
hold the same chunk. A keyed key tells neither to anyone without the key, and equal chunks
in one store still have one key, so a save still finds those it has (deduplication).
Keying the plain key rather than the chunk costs one BLAKE2b call of 17 bytes per chunk
(~1 us) on top of xxh3's pass; BLAKE2b over the chunk itself runs at ~0.45 GB/s here, which
would cost a 256 MiB sealed save ~0.6 s of CPU more than AES-GCM's whole pass. What the
keyed key adds to the plain one is secrecy, not collision resistance: two chunks with one
plain key have one keyed key (``chunk_hash="sha256"`` is for content from untrusted
sources, sealed or not). Integrity is AES-GCM's: a sealed chunk is bound to its key.

In a sealed store, where a list or dict is cut is keyed too (:attr:`ChunkKeys.cut_seed`):
the item counts of a manifest's root entries are plaintext, and a cut that depended on the
items alone would let a guess of the items be checked against them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Final

import xxhash

from . import parallel

KEY_XXH3: Final = 0x01
"""Kind byte of a chunk key: xxh3-128. (SHA-256 value keys are 32 bytes with no kind byte.)"""
KEY_SHA256: Final = 0x02
"""Kind byte of a chunk key: the first 16 bytes of SHA-256 over the format byte and the chunk
(a store opened with ``chunk_hash="sha256"``)."""
KEY_KEYED: Final = 0x03
"""Kind byte of a chunk key: keyed BLAKE2b-128 of its :data:`KEY_XXH3` key (a sealed store)."""
KEY_KEYED_SHA256: Final = 0x04
"""Kind byte of a chunk key: keyed BLAKE2b-128 of its :data:`KEY_SHA256` key (a sealed
store with ``chunk_hash="sha256"``)."""
KEY_SIZE: Final = 17
SHA256_KEYS: Final = 0x100
"""Set in the format id handed to the chunker: key new chunks with SHA-256, not xxh3."""

_PLAIN_KIND: Final = {KEY_KEYED: KEY_XXH3, KEY_KEYED_SHA256: KEY_SHA256}
"""The plain kind a keyed kind keys."""


def chunk_key(format_id: int, raw: bytes | memoryview) -> bytes:
    """The plain content address of a chunk: the kind byte, then xxh3-128 seeded by the
    format (or, with :data:`SHA256_KEYS` set, SHA-256 of the format byte and the chunk, cut to
    128 bits: ~10x slower, and no one can make two chunks with one key)."""
    if format_id & SHA256_KEYS:
        hasher = hashlib.sha256(bytes((format_id & 0xFF,)))
        hasher.update(raw)
        return b"\x02" + hasher.digest()[:16]
    if len(raw) >= _UNLOCKED_MIN:  # the hasher object hashes with the GIL released
        return b"\x01" + xxhash.xxh3_128(raw, seed=format_id).digest()
    return b"\x01" + xxhash.xxh3_128_digest(raw, seed=format_id)


_UNLOCKED_MIN: Final = 64 * 1024
"""Chunks from this size are hashed with the GIL released (by threads, in parallel: see
:mod:`pitstop.serde.parallel`); smaller ones by the one-call function, which is cheaper."""


def check_chunk(key: bytes, format_id: int, raw: bytes | memoryview) -> bool:
    """Whether ``raw`` is the chunk the plain key ``key`` names (a keyed key: False; see
    :meth:`ChunkKeys.check`)."""
    if len(key) != KEY_SIZE or key[0] not in (KEY_XXH3, KEY_SHA256):
        return False
    fmt = format_id & 0xFF
    return chunk_key(fmt | SHA256_KEYS if key[0] == KEY_SHA256 else fmt, raw) == key


Mac = Callable[[bytes], bytes]


def _mac(secret: bytes) -> Mac:
    """Keyed BLAKE2b-128 under ``secret``: a copy of a hasher that has taken the key (half
    the cost of keying a new one, ~1 us against ~2 for 17 bytes)."""
    keyed = hashlib.blake2b(key=secret, digest_size=16)

    def mac(data: bytes) -> bytes:
        hasher = keyed.copy()
        hasher.update(data)
        return hasher.digest()

    return mac


class ChunkKeys:
    """How a store keys the chunks it writes and checks the chunks it reads (see the module).

    ``format_id``: the serializer's format id, with :data:`SHA256_KEYS` for SHA-256 keys.
    ``secret``: a sealed store's chunk-address secret (keyed keys), None for plain ones;
    ``others``: the secrets of the ring's other keys, under which chunks read back may have
    been keyed before a rotation. ``cut_seed``: the seed of the hash that decides where a
    list or dict is cut (0: plain)."""

    __slots__ = ("_check_macs", "_mac", "_secrets", "cut_seed", "format_id", "keyed")

    def __init__(self, format_id: int, *, secret: bytes | None = None,
                 others: Sequence[bytes] = (), cut_seed: int = 0) -> None:
        self.format_id = format_id
        self.keyed = secret is not None
        self.cut_seed = cut_seed
        self._secrets = (secret, tuple(others))
        self._mac: Mac | None = None if secret is None else _mac(secret)
        self._check_macs: list[Mac] | None = None  # made on the first chunk keyed otherwise

    def with_format(self, format_id: int) -> ChunkKeys:
        """The same keying for chunks of another serializer format (a value read back)."""
        fmt = (format_id & 0xFF) | (self.format_id & SHA256_KEYS)
        if fmt == self.format_id:
            return self
        secret, others = self._secrets
        return ChunkKeys(fmt, secret=secret, others=others, cut_seed=self.cut_seed)

    def __call__(self, raw: bytes | memoryview) -> bytes:
        """The key of a new chunk of bytes ``raw``."""
        plain = chunk_key(self.format_id, raw)
        return plain if self._mac is None else self.keyed_from(plain)

    def many(self, pieces: Sequence[memoryview]) -> list[bytes]:
        """The key of each piece of a buffer, by several threads for a large one."""
        return parallel.each(self, pieces, sum(p.nbytes for p in pieces))

    def keyed_from(self, plain: bytes) -> bytes:
        """The keyed key of the chunk whose plain key is ``plain`` (what an import into a
        sealed store gives a chunk, from its key alone)."""
        assert self._mac is not None
        kind = KEY_KEYED if plain[0] == KEY_XXH3 else KEY_KEYED_SHA256
        return bytes((kind,)) + self._mac(plain)

    def of_xxh3(self, digest: bytes) -> bytes:
        """The key of a chunk whose xxh3-128 (seeded by the format) is ``digest``, or b""
        if these keys are not made from xxh3: what a save compares with its parent's keys
        after one hash of the bytes in place (:func:`pitstop.serde.chunks.split`)."""
        if self.format_id & SHA256_KEYS:
            return b""
        plain = b"\x01" + digest
        return plain if self._mac is None else self.keyed_from(plain)

    def matches_xxh3(self, key: bytes, digest: bytes) -> bool:
        """Whether ``key`` names the chunk whose xxh3-128 (seeded by its format) is
        ``digest``: a plain xxh3 key, or one keyed under the current key. (One keyed under
        another key of the ring: False, and the caller's per-chunk :meth:`check` finds it.)"""
        kind = key[0]
        if kind == KEY_XXH3:
            return key[1:] == digest
        return kind == KEY_KEYED and self._mac is not None and key[1:] == self._mac(
            b"\x01" + digest)

    def check(self, key: bytes, format_id: int, raw: bytes | memoryview) -> bool:
        """Whether ``raw`` (a chunk of serializer format ``format_id``) is the chunk ``key``
        names: a plain key of any kind, or a keyed one under any key of the ring."""
        if len(key) != KEY_SIZE or key[0] not in _PLAIN_KIND:
            return check_chunk(key, format_id, raw)
        if self._mac is None:
            return False  # (a sealed chunk read without the keys is refused before this)
        plain_kind = _PLAIN_KIND[key[0]]
        fmt = format_id & 0xFF
        plain = chunk_key(fmt | SHA256_KEYS if plain_kind == KEY_SHA256 else fmt, raw)
        tail = key[1:]
        if self._mac(plain) == tail:
            return True
        if self._check_macs is None:
            self._check_macs = [_mac(secret) for secret in self._secrets[1]]
        return any(mac(plain) == tail for mac in self._check_macs)


def is_keyed(key: bytes) -> bool:
    """Whether ``key`` is a keyed chunk key (a sealed store's), not a plain one."""
    return key[0] in _PLAIN_KIND


def plain_key_of(key: bytes, format_id: int, raw: bytes | memoryview) -> bytes:
    """The plain key of the chunk ``raw`` that has the key ``key`` (a keyed key's plain
    kind; a plain key as it is): what an export carries it under."""
    if key[0] not in _PLAIN_KIND:
        return key
    fmt = format_id & 0xFF
    return chunk_key(fmt | SHA256_KEYS if _PLAIN_KIND[key[0]] == KEY_SHA256 else fmt, raw)


PLAIN_MSGPACK: Final = ChunkKeys(0)
"""Plain keys of pitstop's own msgpack format (a layout's default)."""


Keying = ChunkKeys | int
"""How the chunker keys new chunks: a :class:`~pitstop.serde.chunkkeys.ChunkKeys`, or a
serializer's format id alone (plain keys)."""


def keying(keys: Keying) -> ChunkKeys:
    """``keys`` as a :class:`~pitstop.serde.chunkkeys.ChunkKeys`."""
    return keys if isinstance(keys, ChunkKeys) else ChunkKeys(keys)


__all__ = [
    "KEY_KEYED",
    "KEY_KEYED_SHA256",
    "KEY_SHA256",
    "KEY_SIZE",
    "KEY_XXH3",
    "PLAIN_MSGPACK",
    "SHA256_KEYS",
    "ChunkKeys",
    "Keying",
    "check_chunk",
    "chunk_key",
    "is_keyed",
    "keying",
    "plain_key_of",
]
