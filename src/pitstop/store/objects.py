"""Large values in object storage: any S3-compatible service (AWS S3, MinIO, Cloudflare R2,
Google Cloud Storage's interoperability API, ...), through obstore.

``blobs="s3://bucket/prefix"`` keeps each value of at least ``blob_threshold`` bytes (an
array's 1 MiB chunks, a large document) as one object named by its content key,
``prefix/<key in hex>.blob``. The rules of :mod:`pitstop.store.blobs` hold unchanged:

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
too: an array's chunks are read by the load's threads, each its own GET straight into the
array's buffer, and a large single value as parallel ranged GETs.

Settings come from the standard AWS environment variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``, container and instance credentials), and from the URL's own query:
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
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, urlsplit

from ..errors import StoreError
from .blobs import BlobStore, Pieces, Slot

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

_THREADS: Final = 16
"""Uploads in flight at once (network-bound: more than the cores)."""

_SUFFIX: Final = ".blob"
_KEY_NAME = re.compile(r"^[0-9a-f]{2,128}$")

_URL_OPTIONS: Final = ("endpoint", "region")


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
        ``check``: list the prefix once now, so a bucket that does not exist, an endpoint
        that does not answer or credentials that are refused is one error at open (naming
        the URL and the reason), not a failure at the first large save."""
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
        client: ClientConfig = {"allow_http": bool(given_endpoint) and str(
            given_endpoint).startswith("http://")}
        try:
            self._store = S3Store(bucket, config=config, client_options=client)
            if check:
                # One request, few retries and a short connect timeout: an endpoint that does
                # not answer is an error in seconds, not after the default minutes of retries.
                probe = S3Store(
                    bucket,
                    config=config,
                    client_options={**client, "connect_timeout": timedelta(seconds=5),
                                    "timeout": timedelta(seconds=30)},
                    retry_config={"max_retries": 1, "retry_timeout": timedelta(seconds=10)},
                )
                self._probe(probe)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"blob store {self._where()}: {_reason(exc)}") from None

    def _where(self) -> str:
        return self.url + (f" (endpoint {self.endpoint})" if self.endpoint else "")

    def _probe(self, store: Any) -> None:
        import obstore

        obstore.list_with_delimiter(store, self._path_prefix() or None)

    def _path_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def _path(self, key: bytes) -> str:
        return f"{self._path_prefix()}{key.hex()}{_SUFFIX}"

    def _failed(self, exc: BaseException, what: str) -> StoreError:
        return StoreError(f"blob store {self._where()}: {what}: {_reason(exc)}")

    # -- writing ------------------------------------------------------------------------------

    def put(self, key: bytes, data: bytes) -> None:
        self.put_many([(key, (data,))])

    def put_many(
        self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True
    ) -> dict[bytes, Slot]:
        """Every value as its own object, several uploads at once. An acknowledged PUT is
        durable on the service whatever ``sync`` says. Returns no slots: nothing is packed
        (a GET per value is what a pack would save on a disk, not here)."""
        todo = dict(items)  # (a key given twice is uploaded once)
        if not todo:
            return {}
        if len(todo) == 1:
            ((key, pieces),) = todo.items()
            self._upload(key, pieces)
            return {}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(_THREADS, len(todo))) as pool:
            futures = [pool.submit(self._upload, key, pieces) for key, pieces in todo.items()]
        for future in futures:  # every one has finished: the first error is the answer
            error = future.exception()
            if error is not None:
                raise error
        return {}

    def _upload(self, key: bytes, pieces: Pieces) -> None:
        import obstore

        size = sum(memoryview(piece).nbytes for piece in pieces)
        try:
            if size >= MULTIPART_FROM:
                obstore.put(
                    self._store, self._path(key), _parts(pieces), use_multipart=True,
                    chunk_size=PART_SIZE, max_concurrency=_THREADS,
                )
            else:
                body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                obstore.put(self._store, self._path(key), body, use_multipart=False)
        except Exception as exc:
            raise self._failed(exc, f"upload of {key.hex()[:16]}") from None

    # -- reading ------------------------------------------------------------------------------

    def get(self, key: bytes, slot: Slot | None = None) -> bytes | None:
        import obstore

        path = self._path(key)
        try:
            if slot is not None and slot.size >= 2 * PART_SIZE:
                return bytes(self._get_ranged(path, slot.size))
            result = obstore.get(self._store, path)
            size = result.meta["size"]
            if size >= 2 * PART_SIZE:  # a large value: the rest in parallel ranges
                return bytes(self._get_ranged(path, size))
            return bytes(result.bytes())
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
        for start, end, part in zip(
            starts, ends, obstore.get_ranges(self._store, path, starts=starts, ends=ends,
                                             coalesce=0),
            strict=True,
        ):
            view[start:end] = memoryview(part)
        return out

    def read_into(self, key: bytes, target: memoryview, slot: Slot | None = None) -> int | None:
        """One GET (a chunk) or parallel ranged GETs (a large value) copied into ``target``
        (the header byte returned; None: no such object, or its size differs)."""
        import obstore

        path = self._path(key)
        expected = target.nbytes + 1
        try:
            if expected < 2 * PART_SIZE:
                data = obstore.get(self._store, path).bytes()
                if len(data) != expected:
                    return None
                body = memoryview(data)
                target[:] = body[1:]
                return body[0]
            meta = obstore.head(self._store, path)
            if meta["size"] != expected:
                return None
            starts = list(range(0, expected, PART_SIZE))
            ends = [min(start + PART_SIZE, expected) for start in starts]
            parts = obstore.get_ranges(self._store, path, starts=starts, ends=ends, coalesce=0)
            header = memoryview(parts[0])[0]
            for start, end, part in zip(starts, ends, parts, strict=True):
                body = memoryview(part)
                if start == 0:
                    target[: end - 1] = body[1:]
                else:
                    target[start - 1 : end - 1] = body
            return header
        except FileNotFoundError:  # (what obstore raises for a 404)
            return None
        except Exception as exc:
            raise self._failed(exc, f"read of {key.hex()[:16]}") from None

    def why_missing(self, key: bytes, slot: Slot | None = None) -> str:
        return f"object {self._path(key)} missing from {self.url}"

    # -- listing and deleting -----------------------------------------------------------------

    def delete(self, keys: Iterable[bytes]) -> None:
        import obstore

        paths = [self._path(key) for key in keys]
        for i in range(0, len(paths), 1000):  # DeleteObjects takes 1,000 at most
            try:
                obstore.delete(self._store, paths[i : i + 1000])
            except Exception as exc:
                raise self._failed(exc, "delete") from None

    def keys(self, *, older_than: float = 0.0) -> Iterator[bytes]:
        """Every value's key (objects under the prefix named ``<hex>.blob``; anything else
        there is not ours and left alone), or those last modified more than ``older_than``
        seconds ago by this machine's clock."""
        import obstore

        cutoff = time.time() - older_than
        start = len(self._path_prefix())
        try:
            for batch in obstore.list(self._store, self._path_prefix() or None,
                                      chunk_size=1000):
                for meta in batch:
                    name = meta["path"][start:]
                    if not name.endswith(_SUFFIX) or "/" in name:
                        continue
                    stem = name[: -len(_SUFFIX)]
                    if not _KEY_NAME.match(stem) or len(stem) % 2:
                        continue
                    if older_than and meta["last_modified"].timestamp() > cutoff:
                        continue
                    yield bytes.fromhex(stem)
        except Exception as exc:
            raise self._failed(exc, "listing") from None

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"


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
