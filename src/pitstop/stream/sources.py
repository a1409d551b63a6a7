"""Where a stream job reads: a Redis stream per partition, or an in-process iterable.

A source reads each partition from a position, in order, and says where it stands; it never
acknowledges anything to the broker: the position lives in the partition's checkpoint, next
to the state it produced, so a restart seeks to it (nothing is read twice, nothing skipped).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable as IterableOf
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import ormsgpack

from ..errors import BrokerUnavailableError, TrimmedError, UndecodableRecordError
from .records import Position, Record

Undecodable = Literal["fail", "dead-letter"]

log = logging.getLogger("pitstop.stream")


class Source(Protocol):
    """What :class:`~pitstop.stream.Job` needs of a source (write your own to this shape)."""

    partitions: int

    def describe(self) -> str:
        """A short text naming the source (kept in each partition run's metadata)."""

    def first_position(self, partition: int, start: str) -> tuple[Position | None, int]:
        """Where a partition with no checkpoint starts, and how many records of the partition
        come before it: ``(None, 0)`` (before its first record) with ``start="beginning"``,
        its current last record with ``start="end"``."""

    def check_position(
        self, partition: int, position: Position | None, offset: int, on_trimmed: str
    ) -> None:
        """Raise :class:`~pitstop.errors.TrimmedError` if records after ``position`` (the
        ``offset``-th record of the partition) are gone and ``on_trimmed`` is ``"fail"``."""

    def read(
        self, positions: Mapping[int, Position | None], count: int, block: float
    ) -> dict[int, list[Record]]:
        """Up to ``count`` records of each partition after its position, waiting up to
        ``block`` seconds when there are none."""

    def lag(self, partition: int, position: Position | None) -> int | None:
        """Records in the partition after ``position`` (None: unknown)."""

    def close(self) -> None: ...


class Iterable:
    """``(key, value)`` pairs from any iterable, spread over ``partitions`` by a stable hash
    of the key: for tests, files and replays. Positions are indexes in the partition, so the
    same items give the same positions in every process (a generator is read once per
    process, whole: give a list, or a function returning a fresh iterable, to resume)."""

    def __init__(self, items: IterableOf[tuple[Any, Any]], *, partitions: int = 1) -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        self.partitions = partitions
        self._items = items
        self._split: list[list[tuple[Any, Any]]] | None = None

    def describe(self) -> str:
        return f"iterable ({self.partitions} partitions)"

    def _parts(self) -> list[list[tuple[Any, Any]]]:
        if self._split is None:
            parts: list[list[tuple[Any, Any]]] = [[] for _ in range(self.partitions)]
            for key, value in self._items:
                parts[partition_of(key, self.partitions)].append((key, value))
            self._split = parts
        return self._split

    def first_position(self, partition: int, start: str) -> tuple[Position | None, int]:
        size = len(self._parts()[partition])
        return (size - 1, size) if start == "end" and size else (None, 0)

    def check_position(
        self, partition: int, position: Position | None, offset: int, on_trimmed: str
    ) -> None:
        return None  # an iterable forgets nothing

    def read(
        self, positions: Mapping[int, Position | None], count: int, block: float
    ) -> dict[int, list[Record]]:
        parts = self._parts()
        out: dict[int, list[Record]] = {}
        for partition, position in positions.items():
            first = 0 if position is None else int(position) + 1
            items = parts[partition][first : first + count]
            if items:
                out[partition] = [
                    Record(partition, first + i, key, value) for i, (key, value) in
                    enumerate(items)
                ]
        if not out and block > 0:
            import time

            time.sleep(min(block, 0.05))
        return out

    def lag(self, partition: int, position: Position | None) -> int | None:
        size = len(self._parts()[partition])
        return size - (0 if position is None else int(position) + 1)

    def close(self) -> None:
        return None


def partition_of(key: Any, partitions: int) -> int:
    """The partition of ``key``: a stable hash (CRC-32 of its text), the same in every
    process and on every machine (unlike ``hash()``, salted per process)."""
    if partitions == 1:
        return 0
    data = key if isinstance(key, bytes) else str(key).encode()
    return zlib.crc32(data) % partitions


class RedisStream:
    """Redis streams ``<name>:0`` … ``<name>:<partitions-1>``, one per partition, read with
    XREAD from the stored entry id (a restart seeks; no consumer group is needed, since the
    position is kept in the checkpoint). A record's ``value`` is the entry's field map
    decoded to ``str``, its ``key`` the field named ``key_field`` (None if absent).

    Entries whose bytes are not UTF-8 follow ``undecodable``: ``"fail"`` stops the
    partition with :class:`~pitstop.errors.UndecodableRecordError`; ``"dead-letter"`` copies
    the raw entry to the stream ``<name>:dead-letter`` (with its partition and id) and goes on.
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        partitions: int = 1,
        key_field: str = "key",
        undecodable: Undecodable = "fail",
    ) -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        if undecodable not in ("fail", "dead-letter"):
            raise ValueError('undecodable must be "fail" or "dead-letter"')
        self.url = url
        self.name = name
        self.partitions = partitions
        self.key_field = key_field
        self.undecodable = undecodable
        self._client: Any = None
        self._script: Any = None
        """The registered read script (see :meth:`_read_packed`); False once the server
        refused it, and XREAD alone is used."""
        self._job = "?"

    def describe(self) -> str:
        return f"redis stream {self.name} ({self.partitions} partitions) at {_safe_url(self.url)}"

    def stream_name(self, partition: int) -> str:
        return f"{self.name}:{partition}"

    def _redis(self) -> Any:
        if self._client is None:
            try:
                import redis
            except ImportError as exc:
                raise ImportError(
                    "stream.RedisStream needs redis-py: pip install 'pitstop[stream]'"
                ) from exc
            client = redis.Redis.from_url(self.url, socket_timeout=30.0)
            # XREAD's reply as parsed off the wire (entries as [id, [field, value, ...]]):
            # redis-py would build a dict per entry, which read() builds anyway, decoded.
            client.set_response_callback("XREAD", _as_received)
            self._client = client
        return self._client

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import redis

        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise BrokerUnavailableError(
                f"Redis at {_safe_url(self.url)} does not answer ({what}: {exc})", job=self._job
            ) from exc

    def _info(self, partition: int) -> dict[str, Any] | None:
        import redis

        client = self._redis()
        try:
            info = self._call("XINFO STREAM", client.xinfo_stream, self.stream_name(partition))
        except redis.ResponseError:  # no such stream (yet)
            return None
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in info.items()}

    def first_position(self, partition: int, start: str) -> tuple[Position | None, int]:
        if start != "end":
            return None, 0
        info = self._info(partition)
        if info is None or not info.get("length"):
            return None, int(info.get("entries-added", 0)) if info else 0
        # Read together: the last id and how many entries were ever added up to it.
        return _text(info["last-generated-id"]), int(info["entries-added"])

    def check_position(
        self, partition: int, position: Position | None, offset: int, on_trimmed: str
    ) -> None:
        """Trimming (MAXLEN, MINID) removes the oldest entries, XDEL any: records after
        ``position`` are gone if an XDEL passed it, or if the oldest entry left is after it
        and fewer entries remain than were added after it."""
        info = self._info(partition)
        if info is None:
            return
        position = position or "0-0"
        deleted = _text(info.get("max-deleted-entry-id", b"0-0"))
        after = int(info.get("entries-added", 0)) - offset
        first = info.get("first-entry")
        lost = _id_key(deleted) > _id_key(str(position)) or (
            first is not None and _id_key(_text(first[0])) > _id_key(str(position))
            and int(info.get("length", 0)) < after
        )
        if lost and on_trimmed == "fail":
            name = self.stream_name(partition)
            raise TrimmedError(
                f"the stream {name} no longer holds the records after the stored position "
                f"{position} (they were trimmed or deleted before the job read them); "
                'pass on_trimmed="skip" to go on from the oldest record still there',
                job=self._job, partition=partition,
            )
        if lost:
            log.warning("stream job %r: partition %d: records after %s were trimmed; "
                        "going on from the oldest one left", self._job, partition, position)

    def read(
        self, positions: Mapping[int, Position | None], count: int, block: float
    ) -> dict[int, list[Record]]:
        client = self._redis()
        streams = {self.stream_name(p): (pos or "0-0") for p, pos in positions.items()}
        if not streams:
            return {}
        if self._script is not False:
            packed = self._read_packed(client, streams, count)
            if packed or (packed is not None and block <= 0):
                return packed
            # Nothing new (or an entry that is not UTF-8): XREAD waits for records, and
            # decodes entry by entry.
        replies = self._call(
            "XREAD", client.xread, streams, count=count,
            block=int(block * 1000) if block > 0 else None,
        )
        out: dict[int, list[Record]] = {}
        key_field = self.key_field
        # RESP3 answers a map of streams, RESP2 a list of [stream, entries] pairs.
        pairs = replies.items() if isinstance(replies, dict) else (replies or ())
        decode = bytes.decode
        new = tuple.__new__
        for stream, entries in pairs:
            partition = int(stream.rsplit(b":", 1)[1])
            try:
                # The per-record hot path, in one comprehension: an entry's fields
                # [f1, v1, f2, v2, ...] decoded by one map walked in pairs, and the Record
                # built by tuple.__new__ (a named tuple's own __new__ is Python code).
                out[partition] = [
                    new(Record, (
                        partition, decode(entry_id),
                        (value := dict(zip(texts := map(decode, flat), texts, strict=True)))
                        .get(key_field),
                        value,
                    ))
                    for entry_id, flat in entries
                ]
            except UnicodeDecodeError:  # some entry is not UTF-8: entry by entry
                out[partition] = self._decode_each(client, partition, entries)
        return out

    def _read_packed(
        self, client: Any, streams: dict[str, Position], count: int
    ) -> dict[int, list[Record]] | None:
        """The records after each position, read by a script that runs XRANGE on each
        stream and answers one msgpack string (:data:`_READ_SCRIPT`); None when an entry is
        not UTF-8 or the server refuses the script (then XREAD is used from now on).

        Why: redis-py parses a reply in Python, ~5 calls per entry (the entry, its id, its
        field list, each field), which was most of a stream job's time: 200,000 entries
        took 1.5-1.9 s of CPU to parse, as long as the plain consumer loop the job is
        measured against took in all. Unpacked by ormsgpack (in C, text decoded there too)
        they take a quarter of that. The script is XRANGE alone, as XREAD without BLOCK
        is: no write, one round trip."""
        import redis

        if self._script is None:
            self._script = client.register_script(_READ_SCRIPT)
        names = list(streams)
        try:
            data = self._call("EVALSHA (XRANGE)", self._script, keys=names,
                              args=[*streams.values(), count])
        except redis.ResponseError as exc:
            # ACLs without scripting, a server without Lua's cmsgpack or XRANGE's "("
            # (Redis < 6.2): XREAD reads the same records.
            log.info("stream job %r: reading with XREAD (the read script was refused: %s)",
                     self._job, exc)
            self._script = False
            return None
        try:
            replies = ormsgpack.unpackb(data)
        except ormsgpack.MsgpackDecodeError:  # an entry that is not UTF-8
            return None
        out: dict[int, list[Record]] = {}
        key_field = self.key_field
        new = tuple.__new__
        for stream, entries in zip(names, replies, strict=True):
            if not entries:
                continue
            partition = int(stream.rsplit(":", 1)[1])
            # The per-record hot path, one comprehension: the field list [f1, v1, ...]
            # walked in pairs (Redis keeps them paired: zip's strict check cost a quarter
            # of the decoding), the Record built by tuple.__new__ (a named tuple's own
            # __new__ is Python code).
            out[partition] = [
                new(Record, (
                    partition, entry_id,
                    (value := dict(zip(pairs := iter(flat), pairs)))  # noqa: B905
                    .get(key_field),
                    value,
                ))
                for entry_id, flat in entries
            ]
        return out

    def _decode_each(self, client: Any, partition: int, entries: Any) -> list[Record]:
        """The entries of a reply one by one, those that are not UTF-8 handled as
        ``undecodable`` says."""
        decode = bytes.decode
        key_field_text = self.key_field
        records: list[Record] = []
        append = records.append
        for entry_id, flat in entries:
            try:
                texts = iter(list(map(decode, flat)))
                value = dict(zip(texts, texts, strict=True))
            except UnicodeDecodeError as exc:
                position = entry_id.decode()
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                self._undecodable(client, partition, position, fields, exc)
                append(Record(partition, position, None, _SKIPPED))
                continue
            key = value.get(key_field_text)
            append(Record(partition, decode(entry_id), key, value))
        return records

    def _undecodable(
        self, client: Any, partition: int, position: str, fields: Mapping[bytes, bytes],
        exc: Exception,
    ) -> None:
        if self.undecodable == "fail":
            raise UndecodableRecordError(
                f"entry {position} of {self.stream_name(partition)} is not UTF-8 ({exc}); "
                'pass undecodable="dead-letter" to set such entries aside',
                job=self._job, partition=partition,
            )
        letter = {b"partition": str(partition).encode(), b"id": position.encode(),
                  b"error": str(exc).encode()}
        letter.update({b"field:" + k: v for k, v in fields.items()})
        self._call("XADD", client.xadd, f"{self.name}:dead-letter", letter)

    def lag(self, partition: int, position: Position | None) -> int | None:
        client = self._redis()
        try:
            entries = self._call(
                "XRANGE", client.xrange, self.stream_name(partition),
                min=f"({position}" if position else "-", max="+", count=1_000_000,
            )
        except BrokerUnavailableError:
            return None
        return len(entries)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_READ_SCRIPT = """
local out = {}
local count = ARGV[#KEYS + 1]
for i, name in ipairs(KEYS) do
  out[i] = redis.call('XRANGE', name, '(' .. ARGV[i], '+', 'COUNT', count)
end
return cmsgpack.pack(out)
"""
"""For each stream (KEYS) the entries after its position (ARGV, then the count): one msgpack
array per stream of ``[id, [field, value, ...]]``, as XREAD answers, packed in one string."""

_SKIPPED: Any = object()
"""The value of a record set aside by the dead-letter policy: the job moves past it."""


def _as_received(response: Any, **options: Any) -> Any:
    return response


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


def _safe_url(url: str) -> str:
    """The URL without its password, for messages and metadata."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}" if user else netloc))


def dumps_value(value: Any) -> str:
    """An output's value as a sink stores it: JSON (a str stays itself)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


__all__ = ["Iterable", "RedisStream", "Source", "Undecodable", "partition_of"]
