"""Large values outside the database: a pluggable blob store, a directory implementation.

A store given a blob store keeps every value of at least ``blob_threshold`` bytes (stored
size, after compression) there instead of in its values table. Nothing else changes: the
value is still keyed and verified by its content hash, shared by every checkpoint and run
that holds it, and deleted by the same garbage collection, once nothing references it.

The order of writes keeps the database honest: a value is written (and synced) to the blob
store *before* the transaction that references it commits, and deleted only *after* the
transaction that dropped its last reference commits. A crash in between leaves at worst an
unreferenced file, which :meth:`~pitstop.Store.prune` removes once it is old enough to be
certain no save is still about to reference it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from ..errors import StoreError

Pieces = Sequence[bytes | memoryview]
"""A value given as pieces to write one after the other (a header and an array's memory)."""


class BlobStore(ABC):
    """Where large values live, keyed by their content hash. Writes must be durable when
    :meth:`put` returns, and idempotent (the same key always carries the same bytes)."""

    url: str

    @abstractmethod
    def put(self, key: bytes, data: bytes) -> None:
        """Store ``data`` under ``key`` (a no-op if it is there already)."""

    def put_many(self, items: Sequence[tuple[bytes, Pieces]]) -> None:
        """Store every ``(key, pieces)`` (the value is the pieces joined), all durable when
        this returns (a store may write them concurrently: a save of many chunks then waits
        for one round of syncs, not one after the other)."""
        for key, pieces in items:
            self.put(key, b"".join(pieces))

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The bytes under ``key``, or None if there are none."""

    def read_into(self, key: bytes, target: memoryview) -> int | None:
        """Read the value under ``key``, which must be one header byte followed by exactly
        ``len(target)`` bytes, into ``target``; return the header byte (None: no such key,
        or its size differs). Stores that can read into place override it (no copy)."""
        data = self.get(key)
        if data is None or len(data) != len(target) + 1:
            return None
        target[:] = memoryview(data)[1:]
        return data[0]

    @abstractmethod
    def delete(self, keys: Iterable[bytes]) -> None:
        """Remove these keys (missing ones are ignored)."""

    @abstractmethod
    def keys(self, *, older_than: float = 0.0) -> Iterator[bytes]:
        """Every key, or only those written more than ``older_than`` seconds ago."""

    def why_missing(self, key: bytes) -> str:
        """Why :meth:`get` found nothing under ``key`` (what ``verify`` reports)."""
        return f"file missing from {self}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class DirectoryBlobStore(BlobStore):
    """One file per value under a directory (``ab/cd/abcd....blob``), written atomically.

    Any file system works, local or shared (NFS, a mounted volume) as long as renames are
    atomic on it, which is what lets several processes and machines use one directory.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        """``create=False``: the directory is made by the first write (a store that never
        holds a large value leaves no empty directory behind)."""
        self.root = Path(root).expanduser().resolve()
        self.url = f"file://{self.root}"
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"blob directory {self.root}: {exc.strerror}") from exc

    def _path(self, key: bytes) -> Path:
        name = key.hex()
        return self.root / name[:2] / name[2:4] / f"{name}.blob"

    def put(self, key: bytes, data: bytes) -> None:
        self.put_many([(key, (data,))])

    def put_many(self, items: Sequence[tuple[bytes, Pieces]]) -> None:
        """Each file written and synced under a temporary name, then renamed, then each
        directory touched synced: a file is never visible before its bytes are durable.

        Several files are synced at once (threads; ``fsync`` releases the GIL): the file
        system commits concurrent syncs together, so 256 chunks of 1 MiB are durable in
        about half the time one 256 MiB file takes (measured on ext4), where one after the
        other they take longer than it."""
        todo = [(self._path(key), data) for key, data in items]
        todo = [(path, data) for path, data in todo if not path.is_file()]
        if not todo:
            return
        dirs: set[Path] = set()
        if not self.root.is_dir():
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"blob directory {self.root}: {exc.strerror}") from exc
            dirs.add(self.root.parent)
        for path, _ in todo:
            parent = path.parent
            if parent not in dirs and not parent.is_dir():
                parent.mkdir(parents=True, exist_ok=True)
                dirs.update((parent.parent, parent.parent.parent))  # new entries in those
            dirs.add(parent)
        written: list[tuple[str, Path]] = []
        try:
            if len(todo) == 1:
                written.append(_write_synced(*todo[0]))
            else:
                with ThreadPoolExecutor(min(_SYNC_THREADS, len(todo))) as pool:
                    futures = [pool.submit(_write_synced, path, data) for path, data in todo]
                failed: BaseException | None = None
                for future in futures:  # every one has finished: keep the written ones
                    error = future.exception()
                    if error is None:
                        written.append(future.result())
                    elif failed is None:
                        failed = error
                if failed is not None:
                    raise failed
            for tmp, path in written:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in written:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        if len(dirs) == 1:
            _fsync_dir(dirs.pop())
        else:
            with ThreadPoolExecutor(min(_SYNC_THREADS, len(dirs))) as pool:
                list(pool.map(_fsync_dir, sorted(dirs, key=lambda d: -len(d.parts))))

    def get(self, key: bytes) -> bytes | None:
        # Something else where the file should be (a directory, a dangling path) is a
        # missing value, so loading reports it by field and a fallback passes it.
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def why_missing(self, key: bytes) -> str:
        path = self._path(key)
        if path.is_dir():
            return f"{path} is a directory, not a file"
        return f"file missing from {self}"

    def read_into(self, key: bytes, target: memoryview) -> int | None:
        """Straight from the file into ``target``: the one copy a load of an array makes."""
        try:
            f = open(self._path(key), "rb", buffering=0)  # noqa: SIM115 - closed below
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        with f:
            if os.fstat(f.fileno()).st_size != len(target) + 1:
                return None
            header = f.read(1)
            done = 0
            while done < len(target):
                n = f.readinto(target[done:])
                if not n:
                    return None
                done += n
        return header[0]

    def delete(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self._path(key).unlink()

    def keys(self, *, older_than: float = 0.0) -> Iterator[bytes]:
        if not self.root.is_dir():
            return
        cutoff = time.time() - older_than
        for path in self.root.glob("*/*/*.blob"):
            try:
                if not path.is_file() or (older_than and path.stat().st_mtime > cutoff):
                    continue
                yield bytes.fromhex(path.stem)
            except (OSError, ValueError):
                continue


_SYNC_THREADS = 8


class Deferred(NamedTuple):
    """A value kept in a blob store, not read yet: a load reads it when it knows where its
    bytes should go (an array's buffer: :meth:`BlobStore.read_into`)."""

    store: BlobStore
    key: bytes

    def read(self) -> bytes | None:
        return self.store.get(self.key)

    def read_into(self, target: memoryview) -> int | None:
        return self.store.read_into(self.key, target)


def _write_synced(path: Path, pieces: Pieces) -> tuple[str, Path]:
    """The pieces in a synced temporary file next to ``path``: ``(temporary name, path)``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp, path


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (where the platform allows fsync on a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_blob_store(spec: str | os.PathLike[str] | BlobStore) -> BlobStore:
    """A blob store from a ``file:///path`` URL or a directory path (or one given as is)."""
    if isinstance(spec, BlobStore):
        return spec
    text = os.fspath(spec)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise StoreError(f"unsupported blob store {text!r}; use a directory or file:///path")
    return DirectoryBlobStore(text)


__all__ = ["BlobStore", "Deferred", "DirectoryBlobStore", "open_blob_store"]
