"""Large values in object storage: any S3-compatible service (AWS S3, MinIO, Cloudflare R2,
Google Cloud Storage's interoperability API, ...), through obstore.

``blobs="s3://bucket/prefix"`` keeps each value of at least ``blob_threshold`` bytes (an
array's 1 MiB chunks, a large document) as one object named by its content key,
``prefix/<key in hex>.blob``. The rules of :mod:`pitstop.store.encoding.blobs` hold unchanged:

* an object is uploaded, whole, *before* the transaction that references it commits (a PUT
  is atomic: an object is either absent or complete), and deleted only *after* the
  transaction that dropped its last reference has committed;
* a save killed between the upload and its commit leaves at worst objects no row names:
  ``verify`` reports them and ``prune`` deletes them once older than an hour (the age of an
  object is the service's ``Last-Modified``), never an object a row references;
* an object is shared by every checkpoint and run holding the value: an unchanged re-save
  uploads nothing, and a value saved again by another run is uploaded again to the same name
  (the same key always names the same bytes, so the PUT is idempotent).

Writes are parallel: the values of one save are uploaded by several threads at once (obstore
releases the GIL while it waits on the network), and a value larger than
:data:`MULTIPART_FROM` goes up as a multipart upload of parallel parts. Reads are parallel
too: a load tells the store where each of an array's chunks goes before any GET starts,
and each pack's GET then streams its chunks straight into the array's memory (one set of
fresh pages), checking each chunk as it lands; a pack is read by one GET however
many levels of the array's tree name its chunks; a large single value is read as parallel
ranged GETs.

Settings come from the standard AWS environment variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``, container and instance credentials), a named profile (``AWS_PROFILE``,
read by boto3 when no keys are in the environment), and from the URL's own query:
``s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1`` (the endpoint may
also be given as ``S3BlobStore(url, endpoint=...)``). Rows record the URL without its
query, so a store moved behind another endpoint keeps reading its values.

Why obstore (the ``s3`` extra), not boto3: measured against the same local S3 server,
parallel uploads of 1 MiB objects ran at 147 MiB/s with obstore and 107 MiB/s with boto3
(eight threads each, bench/objects.py measures the rest), and obstore is one wheel with no
Python dependencies, where boto3 brings botocore, s3transfer and jmespath and costs ~0.3 s
to import.
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, NamedTuple
from urllib.parse import parse_qsl, urlsplit

from ...errors import StoreError
from .blobs import BlobStore, ChunkCheck, Pieces, Slot

if TYPE_CHECKING:
    from obstore.store import ClientConfig, S3Config

MULTIPART_FROM: Final = 64 << 20
"""Values of this many bytes and more are uploaded in parts (parallel); smaller ones by one
PUT. An array is stored as 1 MiB chunks, so its values never get here: a multipart upload
that a killed process leaves unfinished is invisible to listings (a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` removes those), so they are kept for values too large for
one request to be sensible."""

PART_SIZE: Final = 16 << 20
"""The size of one part of a multipart upload, and of one ranged GET of a large value."""

PACK_SIZE: Final = 32 << 20
"""The most bytes one pack object holds (the values of one save are packed: see
:meth:`S3BlobStore.put_many`)."""

READ_SIZE: Final = PACK_SIZE
"""At most how many bytes of a pack one ranged GET reads on a load: the values a load wants
of a pack in one request (a whole pack, for a new array). Not less: S3-compatible servers
that answer a range by reading the whole object (moto, some gateways) then cost that many
times the pack's size; AWS S3 answers one request at 90+ MiB/s, and the packs of a large
value are read in parallel."""

_THREADS: Final = 16
"""Uploads in flight at once (network-bound: more than the cores)."""

_SUFFIX: Final = ".blob"
_PACKS: Final = "packs/"
_PACK_SUFFIX: Final = ".pack"
_KEY_NAME = re.compile(r"^[0-9a-f]{2,128}$")
"""A key's or a pack's name, in hex."""

_URL_OPTIONS: Final = ("endpoint", "region")

_NOT_PREFETCHED: Final = object()

_STREAM_PIECE: Final = 1 << 20
"""Bytes of a response handed over at a time when streamed into place."""

_PENDING_MAX: Final = 4 << 30
"""Bytes of prefetched values kept for reads still to come (see S3BlobStore.prefetch)."""


class S3BlobStore(BlobStore):
    """Values as objects in an S3-compatible bucket, under a prefix (see the module)."""

    def __init__(
        self,
        url: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        check: bool = True,
    ) -> None:
        """``url``: ``s3://bucket/prefix``, optionally with ``?endpoint=...&region=...``.
        ``check``: one LIST request now (whose answer is empty), so a bucket that does not
        exist, an endpoint that does not answer or credentials that are refused is one
        error at open (naming the URL and the reason), not a failure at the first large
        save."""
        bucket, prefix, query = _parse(url)
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        endpoint = endpoint or query.get("endpoint")
        region = region or query.get("region")
        try:
            from obstore.store import S3Store
        except ImportError as exc:
            raise StoreError(
                f"blob store {self.url}: object storage needs the s3 extra: "
                f"pip install 'pitstop[s3]' ({exc})"
            ) from exc
        config: S3Config = {}
        if endpoint:
            config["endpoint"] = endpoint
        if region:
            config["region"] = region
        elif not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
            config["region"] = "us-east-1"  # what AWS's own clients assume
        given_endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
            "AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
        self.endpoint = given_endpoint
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[bytes, Future[Any] | _Group] = {}
        self._waiting: dict[str, list[_Group]] = {}
        """Of each pack, the groups whose GET waits for a place (see prefetch)."""
        self._pending_bytes = 0
        client: ClientConfig = {"allow_http": bool(given_endpoint) and str(
            given_endpoint).startswith("http://")}
        self._forked_from: int | None = None
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _forked(ref))
        try:
            provider = _profile_credentials()
            self._client = S3Store(bucket, config=config, client_options=client,
                                   credential_provider=provider)
            if check:
                # One request, few retries and a short connect timeout: an endpoint that does
                # not answer is an error in seconds, not after the default minutes of retries.
                probe = S3Store(
                    bucket,
                    config=config,
                    client_options={**client, "connect_timeout": timedelta(seconds=5),
                                    "timeout": timedelta(seconds=30)},
                    retry_config={"max_retries": 1, "retry_timeout": timedelta(seconds=10)},
                    credential_provider=provider,
                )
                self._probe(probe)
        except StoreError as exc:  # (a profile that cannot be read)
            raise StoreError(f"blob store {self._where()}: {exc}") from None
        except Exception as exc:
            raise StoreError(f"blob store {self._where()}: {_reason(exc)}") from None

    @property
    def _store(self) -> Any:
        """The client (obstore's ``S3Store``); a clear error in a process forked after it
        was made (see :func:`_forked`)."""
        if self._forked_from is not None:
            raise StoreError(
                f"blob store {self._where()}: opened in process {self._forked_from}, before "
                "this process was forked from it, and object storage clients do not work "
                "across fork: open the store in this process (or start it with spawn), "
                "and open none in the parent before forking"
            )
        return self._client

    def _executor(self) -> ThreadPoolExecutor:
        """The threads that upload and prefetch (made on first use: a store that only
        lists runs starts none)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="pitstop-s3")
            return self._pool

    def _where(self) -> str:
        return self.url + (f" (endpoint {self.endpoint})" if self.endpoint else "")

    def _probe(self, store: Any) -> None:
        """One LIST of the prefix, asking for the keys after ``~``, which sorts after any
        name pitstop gives (hex, ``packs/``): the bucket and the credentials are checked as
        by any listing, and the answer is empty however many objects the prefix holds (a
        listing of the prefix itself took a request per 1,000 values stored alone, at
        every open)."""
        import obstore

        prefix = self._path_prefix()
        next(iter(obstore.list(store, prefix or None, offset=f"{prefix}~", chunk_size=1)), None)

    def _path_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def _path(self, key: bytes) -> str:
        return f"{self._path_prefix()}{key.hex()}{_SUFFIX}"

    def _pack_path(self, name: str) -> str:
        return f"{self._path_prefix()}{_PACKS}{name}{_PACK_SUFFIX}"

    def _failed(self, exc: BaseException, what: str) -> StoreError:
        if isinstance(exc, StoreError):  # ours, saying all already
            return exc
        return StoreError(f"blob store {self._where()}: {what}: {_reason(exc)}")

    # -- writing ------------------------------------------------------------------------------

    def put(self, key: bytes, data: bytes) -> None:
        self.put_many([(key, (data,))])

    def put_many(
        self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True, pack: bool = False
    ) -> dict[bytes, Slot]:
        """Two values or more: packs of up to :data:`PACK_SIZE` bytes, each one object
        uploaded by one PUT, several at once; the slots say where each value is. One value:
        an object named by its key (a multipart upload from :data:`MULTIPART_FROM` bytes).
        An acknowledged PUT is durable on the service whatever ``sync`` says.

        Why packs: every request costs a round trip and the service's per-request work
        (and, on AWS, a fee per PUT and GET), so a 256 MiB array is 8 objects, not 256;
        a load reads each pack's chunks by ranged GETs of :data:`READ_SIZE` bytes. A pack's
        name is drawn at random (96 bits): packs are never written twice, and a pack is
        whole or absent."""
        todo = dict(items)  # (a key given twice is uploaded once)
        if not todo:
            return {}
        if len(todo) == 1 and not pack:
            ((key, pieces),) = todo.items()
            self._upload(self._path(key), pieces, key.hex()[:16])
            return {}
        slots: dict[bytes, Slot] = {}
        packs: list[tuple[str, list[bytes | memoryview]]] = []
        pieces_of_pack: list[bytes | memoryview] = []
        name, offset = "", PACK_SIZE
        for key, pieces in todo.items():
            size = sum(memoryview(piece).nbytes for piece in pieces)
            if offset and offset + size > PACK_SIZE:
                name, pieces_of_pack, offset = os.urandom(12).hex(), [], 0
                packs.append((name, pieces_of_pack))
            slots[key] = Slot(name, offset, size)
            pieces_of_pack.extend(pieces)
            offset += size
        pool = self._executor()
        futures = [
            pool.submit(self._upload, self._pack_path(name), pieces, f"pack {name}")
            for name, pieces in packs
        ]
        wait(futures)
        for future in futures:  # every one has finished: the first error is the answer
            error = future.exception()
            if error is not None:
                raise error
        return slots

    def _upload(self, path: str, pieces: Pieces, what: str) -> None:
        import obstore

        size = sum(memoryview(piece).nbytes for piece in pieces)
        try:
            if size >= MULTIPART_FROM:
                obstore.put(
                    self._store, path, _parts(pieces), use_multipart=True,
                    chunk_size=PART_SIZE, max_concurrency=_THREADS,
                )
            else:
                body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                obstore.put(self._store, path, body, use_multipart=False)
        except Exception as exc:
            raise self._failed(exc, f"upload of {what}") from None

    # -- reading ------------------------------------------------------------------------------

    def prefetch(self, values: Sequence[tuple[bytes, Slot | None]]) -> None:
        """Get ready to read these values, :data:`_THREADS` requests at once: the load's
        own threads (two on two cores) then find them read or on their way. Packed values
        are read by ranged GETs of about :data:`READ_SIZE` bytes (values side by side in a
        pack in one request), the others by a GET each, started now.

        The GETs of packs wait for the load to say where the values go (:meth:`place`: an
        array's chunks, which a GET then writes into the array's memory as its bytes
        arrive), or for the first read of one of them (then every GET of the load starts,
        each read into a buffer of its own). Why wait: a pack read whole and then copied
        into a new array touches two sets of fresh pages, and on a busy machine those page
        faults cost more than the download (bench/object_reads.py: 0.42-0.62x one GET's
        throughput copied, 1.17-1.43x streamed into place).

        A load prefetches in a few calls (a level of an array's tree each), and the values
        of one pack may come in two of them: while their GETs wait, they are merged, so a
        pack is still one request (a fresh handle's load of 256 MiB made eleven GETs of nine
        packs, two of them ranged, which a server that reads the whole object for a range,
        as moto does, answers at the cost of the whole pack each).

        A value read is dropped from here; what a failed load never read is dropped once
        the pending bytes pass :data:`_PENDING_MAX` (the bytes under a key never change, so
        a value read before a delete is still right)."""
        by_pack: dict[str, dict[bytes, Slot]] = {}
        alone: list[bytes] = []
        for key, slot in values:
            if slot is None:
                alone.append(key)
            else:
                by_pack.setdefault(slot.pack, {})[key] = slot
        if len(alone) == 1 and not by_pack:
            return  # nothing to read side by side: read when asked (large: in ranges)
        pool = self._executor()  # (takes the lock: before it)
        pending: dict[bytes, Future[Any] | _Group] = {}
        for key in alone:
            pending[key] = pool.submit(self._get_object, key)
        wanted = PART_SIZE * len(alone)
        with self._lock:
            # A load prefetches in a few batches (a layout's nodes, then its leaves): each
            # adds to what is pending. What was never read (a load that failed) is let go
            # once the pending bytes pass a bound, not kept for the life of the store.
            batches: dict[int, list[_Group]] = {}  # those of the groups merged here
            made: list[_Group] = []
            for name, members in by_pack.items():
                waiting = self._waiting.pop(name, [])
                wanted += sum(slot.size for key, slot in members.items()
                              if not any(key in group.keys for group in waiting))
                for group in waiting:
                    for key, slot in group.members:
                        members.setdefault(key, slot)
                    batches.setdefault(id(group.batch), group.batch).remove(group)
                groups = _groups(name, members)
                self._waiting[name] = groups
                made.extend(groups)
                for group in groups:
                    for key in group.keys:
                        pending[key] = group
            # One batch for this call's groups and those of the calls they merged with (the
            # levels of one load's tree): a read of one before any place starts them all.
            batch: list[_Group] = next(iter(batches.values()), [])
            for other in list(batches.values())[1:]:
                for group in other:
                    group.batch = batch
                batch.extend(other)
            for group in made:
                group.batch = batch
            batch.extend(made)
            if self._pending_bytes + wanted > _PENDING_MAX:
                self._pending.clear()
                self._pending_bytes = 0
                self._waiting = {name: self._waiting[name] for name in by_pack}
            self._pending.update(pending)
            self._pending_bytes += wanted

    def place(
        self,
        places: Sequence[tuple[bytes, Slot | None, memoryview]],
        check: ChunkCheck | None = None,
    ) -> None:
        """Start the GETs of the packs these prefetched values are in, each writing the
        values' bodies straight into their targets as the response arrives (see
        :meth:`prefetch`), and running ``check`` on each body as soon as it is whole, while
        it is still in the processor's cache: the checks no longer wait for the last pack
        (the load of 256 MiB went on 16-26 ms after its last GET, now under 1 ms) nor read
        the array's memory again. A GET already started (a read came first) is left as it
        is."""
        starting: dict[int, _Group] = {}
        pool = self._executor()  # (takes the lock: before it)
        with self._lock:
            for key, _, target in places:
                group = self._pending.get(key)
                if not isinstance(group, _Group):
                    continue
                # (read as many times as it has places, whether its GET started or not)
                group.unread[key] = group.unread.get(key, 0) + 1
                if group.future is None:
                    group.places.setdefault(key, []).append(target)
                    group.check = check
                    starting[id(group)] = group
            for group in starting.values():
                self._start(group, pool)

    def _start(self, group: _Group, pool: ThreadPoolExecutor) -> None:
        """(Under the lock.) Submit the GET of a waiting group."""
        waiting = self._waiting.get(group.pack)
        if waiting is not None and group in waiting:
            waiting.remove(group)
            if not waiting:
                del self._waiting[group.pack]
        if group.places:
            group.future = pool.submit(
                self._get_group_into, group.pack, group.members, group.places, group.check)
        else:  # (a load that never placed: the response's own buffer, no copy)
            group.future = pool.submit(self._get_group, group.pack, group.members)

    def _get_group_into(
        self,
        pack: str,
        group: list[tuple[bytes, Slot]],
        places: dict[bytes, list[memoryview]],
        check: ChunkCheck | None = None,
    ) -> dict[bytes, Any]:
        """The values of ``group`` by one ranged GET streamed into place: the body of a
        value in ``places`` into its (first) target, its header byte kept, ``check`` run on
        it as soon as it is whole (:class:`_Placed`; its other targets copied from the
        first), any other value into a buffer of its own. None for a value the pack ends
        before."""
        import obstore

        start = group[0][1].offset
        end = max(slot.offset + slot.size for _, slot in group)
        # (pack offset where it starts, where it ends, the memory it goes to, the key whose
        # body it is when it is one to check), in order
        segments: list[tuple[int, int, memoryview, bytes | None]] = []
        headers: dict[bytes, bytearray] = {}
        own: dict[bytes, bytearray] = {}
        errors: dict[bytes, BaseException] = {}
        for key, slot in group:
            targets = places.get(key)
            if targets and targets[0].nbytes + 1 == slot.size:
                headers[key] = bytearray(1)
                segments.append((slot.offset, slot.offset + 1, memoryview(headers[key]), None))
                segments.append((slot.offset + 1, slot.offset + slot.size, targets[0], key))
            else:
                own[key] = bytearray(slot.size)
                segments.append(
                    (slot.offset, slot.offset + slot.size, memoryview(own[key]), None))
        path = self._pack_path(pack)
        try:
            if start == 0 and end >= PACK_SIZE // 2:  # (see _get_range: no Range header)
                result = obstore.get(self._store, path)
            else:
                result = obstore.get(self._store, path, options={"range": (start, end)})
            at, index = start, 0
            for piece in result.stream(min_chunk_size=_STREAM_PIECE):
                data = memoryview(piece)
                done, size = 0, data.nbytes
                while done < size and index < len(segments):
                    seg_start, seg_end, into, checked = segments[index]
                    if at < seg_start:  # a value of the pack not wanted here: skip it
                        skip = min(seg_start - at, size - done)
                        at, done = at + skip, done + skip
                        continue
                    n = min(seg_end - at, size - done)
                    into[at - seg_start : at - seg_start + n] = data[done : done + n]
                    at, done = at + n, done + n
                    if at == seg_end:
                        index += 1
                        if checked is not None and check is not None:
                            try:
                                check(checked, headers[checked][0], into)
                            except Exception as exc:  # raised by the read that wants it
                                errors[checked] = exc
                if index == len(segments):
                    break
        except FileNotFoundError:
            at = start  # the pack is missing: every value
        except Exception as exc:
            if "416" not in str(exc) and "InvalidRange" not in str(exc):
                raise
            at = start  # the pack ends before the range starts
        out: dict[bytes, Any] = {}
        for key, slot in group:
            if slot.offset + slot.size > at:
                out[key] = None
            elif key in headers:
                targets = places[key]
                for other in targets[1:]:  # (a chunk the array holds more than once)
                    other[:] = targets[0]
                out[key] = _Placed(headers[key][0], targets, check, errors.get(key))
            else:
                out[key] = own[key]
        return out

    def _get_object(self, key: bytes) -> Any:
        import obstore

        try:
            return obstore.get(self._store, self._path(key)).bytes()
        except FileNotFoundError:
            return None

    def _get_group(self, pack: str, group: list[tuple[bytes, Slot]]) -> dict[bytes, Any]:
        """The values of ``group`` (side by side in ``pack``) by one ranged GET: key ->
        their bytes (None: the pack is missing or ends before the value does)."""
        start = group[0][1].offset
        end = max(slot.offset + slot.size for _, slot in group)
        data = self._get_range(pack, start, end)
        if data is None:
            return dict.fromkeys((key for key, _ in group), None)
        view = memoryview(data)
        return {
            key: (view[slot.offset - start : slot.offset - start + slot.size]
                  if slot.offset + slot.size - start <= len(view) else None)
            for key, slot in group
        }

    def _get_range(self, pack: str, start: int, end: int) -> Any:
        import obstore

        try:
            if start == 0 and end >= PACK_SIZE // 2:
                # Most of the pack from its start (a load of what one save wrote): the whole
                # object, no Range header. Servers that answer a range by reading the whole
                # object and slicing it (moto) serve this as fast as a plain download.
                return obstore.get(self._store, self._pack_path(pack)).bytes()
            return obstore.get_range(self._store, self._pack_path(pack), start=start, end=end)
        except FileNotFoundError:
            return None
        except Exception as exc:
            if "416" in str(exc) or "InvalidRange" in str(exc):
                return None  # the pack ends before the range starts
            raise

    def _prefetched(self, key: bytes, target: memoryview | None = None) -> Any:
        """The prefetched bytes of ``key`` (waiting for them; None: missing; a
        :class:`_Placed` if its body was streamed into place), or ``_NOT_PREFETCHED``. A
        value placed into several targets stays pending until each has been asked for."""
        pool = self._executor()  # (takes the lock: before it)
        with self._lock:
            found = self._pending.get(key)
            if found is None:
                return _NOT_PREFETCHED
            if isinstance(found, _Group):
                if found.future is None:  # a read before any place: start its batch
                    for group in found.batch:
                        if group.future is None:
                            self._start(group, pool)
                left = 0
                if target is not None and key in found.unread:
                    left = found.unread[key] - 1
                    found.unread[key] = left
                if left <= 0:
                    self._pending.pop(key)
                found = found.future
            else:
                self._pending.pop(key)
        assert found is not None
        try:
            result = found.result()
        except Exception as exc:
            raise self._failed(exc, f"read of {key.hex()[:16]}") from None
        return result.get(key) if isinstance(result, dict) else result

    def get(self, key: bytes, slot: Slot | None = None) -> bytes | None:
        data = self._read(key, slot)
        return None if data is None else bytes(data)

    def _read(self, key: bytes, slot: Slot | None) -> Any:
        """The value's bytes as the client hands them over (no copy; None: missing):
        prefetched, or read now by a ranged GET of its slot, a GET, or parallel ranged GETs
        for a large one."""
        data = self._prefetched(key)
        if isinstance(data, _Placed):
            return bytes((data.header,)) + bytes(data.targets[0])
        if data is not _NOT_PREFETCHED:
            return data
        return self._read_now(key, slot)

    def _read_now(self, key: bytes, slot: Slot | None) -> Any:
        import obstore

        try:
            if slot is not None:
                return self._get_group(slot.pack, [(key, slot)]).get(key)
            path = self._path(key)
            result = obstore.get(self._store, path)
            size = result.meta["size"]
            if size >= 2 * PART_SIZE:  # a large value: parallel ranges
                return self._get_ranged(path, size)
            return result.bytes()
        except FileNotFoundError:  # (what obstore raises for a 404)
            return None
        except Exception as exc:
            raise self._failed(exc, f"read of {key.hex()[:16]}") from None

    def _get_ranged(self, path: str, size: int) -> bytearray:
        import obstore

        starts = list(range(0, size, PART_SIZE))
        ends = [min(start + PART_SIZE, size) for start in starts]
        out = bytearray(size)
        view = memoryview(out)
        parts = obstore.get_ranges(self._store, path, starts=starts, ends=ends, coalesce=0)
        for start, end, part in zip(starts, ends, parts, strict=True):
            view[start:end] = memoryview(part)
        return out

    def read_into(self, key: bytes, target: memoryview, slot: Slot | None = None) -> int | None:
        """The value (prefetched, or read now: a ranged GET of its slot, a GET, or parallel
        ranged GETs for a large one) copied into ``target``; the header byte returned (None:
        no such value, or its size differs)."""
        return self._read_into(key, target, slot, None)

    def read_checked_into(
        self, key: bytes, target: memoryview, slot: Slot | None, check: ChunkCheck
    ) -> int | None:
        """:meth:`read_into`, the body checked: by the GET that streamed it into place, as
        it landed, if :meth:`place` was given this ``check`` (its error raised here), or
        now."""
        return self._read_into(key, target, slot, check)

    def _read_into(
        self, key: bytes, target: memoryview, slot: Slot | None, check: ChunkCheck | None
    ) -> int | None:
        expected = target.nbytes + 1
        if slot is not None and slot.size != expected:
            return None
        data = self._prefetched(key, target)
        if isinstance(data, _Placed):  # streamed into place (see place)
            if not any(placed is target for placed in data.targets):
                target[:] = data.targets[0]
            if check is not None:
                if data.checked_by is not check:
                    check(key, data.header, target)
                elif data.error is not None:
                    raise data.error
            return data.header
        if data is _NOT_PREFETCHED:
            data = self._read_now(key, slot)  # straight from the client's buffer: one copy
        if data is None or len(data) != expected:
            return None
        body = memoryview(data)
        target[:] = body[1:]
        if check is not None:
            check(key, body[0], target)
        return body[0]

    def why_missing(self, key: bytes, slot: Slot | None = None) -> str:
        if slot is not None:
            return (f"pack object {self._pack_path(slot.pack)} missing from {self.url}, or "
                    f"ending before the value's {slot.size} bytes at {slot.offset}")
        return f"object {self._path(key)} missing from {self.url}"

    # -- listing and deleting -----------------------------------------------------------------

    def delete(self, keys: Iterable[bytes]) -> None:
        self._delete([self._path(key) for key in keys])

    def delete_packs(self, names: Iterable[str]) -> None:
        self._delete([self._pack_path(name) for name in names])

    def _delete(self, paths: list[str]) -> None:
        import obstore

        for i in range(0, len(paths), 1000):  # DeleteObjects takes 1,000 at most
            try:
                obstore.delete(self._store, paths[i : i + 1000])
            except Exception as exc:
                raise self._failed(exc, "delete") from None

    def keys(self, *, older_than: float = 0.0) -> Iterator[bytes]:
        """Every key of a value stored alone (``<hex>.blob`` under the prefix; anything
        else there is not ours and left alone), or those last modified more than
        ``older_than`` seconds ago by this machine's clock."""
        for stem in self._names(self._path_prefix(), _SUFFIX, older_than):
            if len(stem) % 2 == 0:
                yield bytes.fromhex(stem)

    def packs(self, *, older_than: float = 0.0) -> Iterator[str]:
        return self._names(self._path_prefix() + _PACKS, _PACK_SUFFIX, older_than)

    def _names(self, prefix: str, suffix: str, older_than: float) -> Iterator[str]:
        """The hex names of the objects right under ``prefix`` ending in ``suffix``."""
        import obstore

        cutoff = time.time() - older_than
        try:
            for batch in obstore.list(self._store, prefix or None, chunk_size=1000):
                for meta in batch:
                    name = meta["path"][len(prefix):]
                    if not name.endswith(suffix) or "/" in name:
                        continue
                    stem = name[: -len(suffix)]
                    if not _KEY_NAME.match(stem):
                        continue
                    if older_than and meta["last_modified"].timestamp() > cutoff:
                        continue
                    yield stem
        except Exception as exc:
            raise self._failed(exc, "listing") from None

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"


class _Group:
    """Values side by side in one pack, read by one GET (see S3BlobStore.prefetch): not
    started yet while ``future`` is None."""

    __slots__ = ("batch", "check", "future", "keys", "members", "pack", "places", "unread")

    def __init__(self, pack: str, members: list[tuple[bytes, Slot]]):
        self.pack = pack
        self.members = members
        self.keys = {key for key, _ in members}
        self.batch: list[_Group] = []
        """The groups of the same load (a read of one before any place starts all)."""
        self.future: Future[Any] | None = None
        self.check: ChunkCheck | None = None
        """What checks each placed body as it lands (see S3BlobStore.place)."""
        self.places: dict[bytes, list[memoryview]] = {}
        """Where the bodies of its values go (given before the GET starts)."""
        self.unread: dict[bytes, int] = {}
        """Of a placed value, how many of its places have not been asked for yet."""


class _Placed(NamedTuple):
    """A value whose body a GET wrote into ``targets`` (each a copy), and its header; the
    check that GET ran on it, and what that check raised."""

    header: int
    targets: list[memoryview]
    checked_by: ChunkCheck | None
    error: BaseException | None


def _groups(pack: str, members: dict[bytes, Slot]) -> list[_Group]:
    """The values of one pack in groups of consecutive values spanning at most
    :data:`READ_SIZE` bytes (a GET each)."""
    out: list[_Group] = []
    group: list[tuple[bytes, Slot]] = []
    for key, slot in sorted(members.items(), key=lambda member: member[1].offset):
        if group and slot.offset + slot.size - group[0][1].offset > READ_SIZE:
            out.append(_Group(pack, group))
            group = []
        group.append((key, slot))
    if group:
        out.append(_Group(pack, group))
    return out


def _forked(ref: weakref.ReferenceType[S3BlobStore]) -> None:
    """In a forked child: obstore's runtime threads are not there, and no client made in
    this process works any more (a request waits forever, measured with obstore 0.12). The
    store then refuses every request with an error saying so, not a hang."""
    store = ref()
    if store is not None:
        store._forked_from = os.getppid()
        store._lock = threading.Lock()
        store._pool = None
        store._pending = {}
        store._waiting = {}


def _profile_credentials() -> Any:
    """Credentials of a named profile (``AWS_PROFILE``: ``~/.aws/config`` and
    ``~/.aws/credentials``, SSO, assumed roles), read by boto3, when no keys are in the
    environment: obstore itself reads the environment and instance or container
    credentials, not profiles. None: obstore's own chain."""
    if not os.environ.get("AWS_PROFILE") or os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        raise StoreError(
            f"AWS_PROFILE={os.environ['AWS_PROFILE']} names a profile, which boto3 reads: "
            f"pip install boto3, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({exc})"
        ) from None
    return Boto3CredentialProvider(boto3.Session(profile_name=os.environ["AWS_PROFILE"]))


def _parts(pieces: Pieces) -> Iterator[memoryview]:
    for piece in pieces:
        view = memoryview(piece).cast("B")
        if view.nbytes:
            yield view


def _parse(url: str) -> tuple[str, str, dict[str, str]]:
    """(bucket, prefix without slashes at its ends, query options) of an ``s3://`` URL."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3" or not parts.netloc:
        raise StoreError(f"blob store {url!r}: object storage URLs look like s3://bucket/prefix")
    query: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _URL_OPTIONS:
            raise StoreError(
                f"blob store s3://{parts.netloc}{parts.path}: unknown option {name!r}; "
                f"known: {', '.join(_URL_OPTIONS)}"
            )
        query[name] = value
    return parts.netloc, parts.path.strip("/"), query


_SECRETS: Final = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def _reason(exc: BaseException) -> str:
    """An obstore error as one line: its kind and the service's or the network's reason,
    without the request details (and never a credential, even should one be quoted)."""
    text = " ".join(str(exc).split())
    text = re.sub(r"\s*Debug source:.*$", "", text)
    for name in _SECRETS:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    # The service's error code and message, where it gave them (an XML body).
    code = re.search(r"<Code>([^<]+)</Code>", text)
    message = re.search(r"<Message>([^<]+)</Message>", text)
    if code:
        return code.group(1) + (f": {message.group(1)}" if message else "")
    for pattern, short in (
        (r"error sending request|Connection refused|connect", "cannot connect"),
        (r"dns error|failed to lookup", "cannot resolve the endpoint's host"),
        (r"timed out|timeout", "timed out"),
    ):
        if re.search(pattern, text, re.IGNORECASE):
            return f"{short} ({_shorten(text)})"
    return _shorten(text)


def _shorten(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


__all__ = ["MULTIPART_FROM", "PART_SIZE", "S3BlobStore"]
