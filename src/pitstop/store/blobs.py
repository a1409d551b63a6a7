"""Large values outside the database: a pluggable blob store, a directory implementation.

A store given a blob store keeps every value of at least ``blob_threshold`` bytes (stored
size, after compression) there instead of in its values table. Nothing else changes: the
value is still keyed and verified by its content hash, shared by every checkpoint and run
that holds it, and deleted by the same garbage collection, once nothing references it.

The order of writes keeps the database honest: a value is written to the blob store *before*
the transaction that references it commits, and deleted only *after* the transaction that
dropped its last reference commits. A crash in between leaves at worst an unreferenced file
(or the temporary file of a write killed before its rename), which
:meth:`~pitstop.Store.prune` removes once it is old enough to be certain no save is still
about to reference it.

How durable a written file is follows the save's durability, as the database's commit does:

* ``full``: each file (and each directory entry) is fsynced before the commit: a checkpoint
  that was saved survives power loss, files and all.
* ``normal``: each file is complete under a temporary name and renamed into place before the
  commit, not synced. A process killed at any instant (the operating system keeps what was
  written) leaves every committed checkpoint's files whole, as SQLite's ``synchronous=NORMAL``
  in WAL mode keeps its commits. Power loss or an OS crash may lose the files of the last
  checkpoints as it may lose their commits; the database does not order its writes after the
  files', so such a checkpoint can survive with a file missing or short. Every chunk is checked
  against its key on load: ``latest(fallback=True)`` then returns the newest intact checkpoint,
  ``verify`` names the damaged ones, and a later save rewrites a file whose size is wrong
  rather than trusting it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Final, NamedTuple

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

    def put_many(self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True) -> None:
        """Store every ``(key, pieces)`` (the value is the pieces joined), all durable when
        this returns (a store may write them concurrently: a save of many chunks then waits
        for one round of syncs, not one after the other). ``sync=False`` (a save with
        durability ``normal``): each complete and readable when this returns, durable once
        the operating system writes it back; never visible partly written."""
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

    def remove_abandoned(self, *, older_than: float) -> int:
        """Remove what writes killed half way left behind (never a value), if older than
        ``older_than`` seconds; how many. Stores whose writes leave nothing do nothing."""
        return 0

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
        self._root_text = os.fspath(self.root)  # paths built as text on the load path
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

    def put_many(self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True) -> None:
        """Each file written under a temporary name, then renamed: a file is never visible
        before all its bytes are written. With ``sync`` each is fsynced before its rename and
        each directory touched is synced after: never visible before its bytes are durable.

        Synced files are written by several threads (``fsync`` releases the GIL): the file
        system commits concurrent syncs together, so 256 chunks of 1 MiB are durable in about
        half the time one 256 MiB file takes (measured on ext4), where one after the other
        they take longer than it. Unsynced ones are written one after the other. A file's
        directories are made when its first open finds them missing (no look before each
        file).

        A file already under a key is kept if its size is right (same key, same bytes); one
        of another size (what an OS crash can leave of an unsynced write) is written again.
        """
        todo = []
        for key, pieces in items:
            path = self._name(key)
            if _size_of(path) != sum(memoryview(piece).nbytes for piece in pieces):
                todo.append((path, pieces))
        if not todo:
            return
        written: list[_Written] = []
        try:
            if len(todo) == 1 or not sync:
                # Unsynced, a write is a copy into the page cache (~70 ms of kernel time for
                # 256 MiB): threads gain little there and lose more to GIL hand-offs between
                # the calls (strace of 8 writers: 7,000 futex waits for 256 files).
                for path, data in todo:
                    written.append(_write_file(path, data, sync))
            else:
                # (Imported here: a store that only reads rows never starts a thread pool.)
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(min(_WRITE_THREADS, len(todo))) as pool:
                    futures = [pool.submit(_write_file, path, data, sync) for path, data in todo]
                failed: BaseException | None = None
                for future in futures:  # every one has finished: keep the written ones
                    error = future.exception()
                    if error is None:
                        written.append(future.result())
                    elif failed is None:
                        failed = error
                if failed is not None:
                    raise failed
            for done in written:
                os.replace(done.tmp, done.path)
        except OSError as exc:
            for done in written:
                with contextlib.suppress(OSError):
                    os.unlink(done.tmp)
            raise StoreError(f"blob directory {self.root}: {exc}") from exc
        except BaseException:
            for done in written:
                with contextlib.suppress(OSError):
                    os.unlink(done.tmp)
            raise
        if not sync:
            return
        dirs = {os.path.dirname(done.path) for done in written}
        for done in written:
            dirs.update(done.made)  # a new directory's entry is in its parent
        if len(dirs) == 1:
            _fsync_dir(dirs.pop())
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(_WRITE_THREADS, len(dirs))) as pool:
                list(pool.map(_fsync_dir, sorted(dirs, key=lambda d: -d.count(os.sep))))

    def _name(self, key: bytes) -> str:
        """Where ``key``'s file is, as text (the paths of a save or load of many chunks)."""
        name = key.hex()
        return f"{self._root_text}/{name[:2]}/{name[2:4]}/{name}.blob"

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
        """Straight from the file into ``target``: the one copy a load of an array makes, in
        one ``readv`` (header byte, the body into place, one byte past it to tell a longer
        file) where the platform has it."""
        try:
            fd = os.open(self._name(key), os.O_RDONLY | _O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            return _read_framed(fd, target)
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)

    def delete(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self._path(key).unlink()

    def remove_abandoned(self, *, older_than: float) -> int:
        """Temporary files of writes that never reached their rename (a process killed in a
        save): unreferenced, invisible to loads, only taking space."""
        if not self.root.is_dir():
            return 0
        cutoff = time.time() - older_than
        removed = 0
        for path in self.root.glob(f"*/*/{_TEMPORARY}*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime <= cutoff:
                    path.unlink()
                    removed += 1
        return removed

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


_WRITE_THREADS = 8


def _size_of(path: str) -> int:
    """The size of the regular file at ``path`` (-1: none there)."""
    try:
        st = os.stat(path)
    except OSError:
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


def _read_framed(fd: int, target: memoryview) -> int | None:
    """Read a file of one header byte and exactly ``target.nbytes`` bytes: the body into
    ``target``, the header returned (None: the file's size differs). One ``readv`` for a
    whole file: header, body, and a spare byte that fills only if the file is longer (a
    regular file reads short only at its end, or when interrupted: then the rest is read)."""
    header, spare = bytearray(1), bytearray(1)
    views = [memoryview(header), target, memoryview(spare)]
    expected = target.nbytes + 1
    done = 0
    while views:
        n = _readv(fd, views)
        if not n:
            break
        done += n
        if done >= expected:  # all of it (and, if the spare filled, more than it)
            break
        while views and n >= views[0].nbytes:  # a short read: go on from there
            n -= views[0].nbytes
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return header[0] if done == expected else None


def _readv_file(fd: int, views: list[memoryview]) -> int:
    """``os.readv`` where the platform lacks it."""
    with open(fd, "rb", buffering=0, closefd=False) as f:
        n = 0
        for view in views:
            got = f.readinto(view) or 0
            n += got
            if got < view.nbytes:
                break
        return n


_readv: Callable[[int, list[memoryview]], int] = getattr(os, "readv", _readv_file)


class Deferred(NamedTuple):
    """A value kept in a blob store, not read yet: a load reads it when it knows where its
    bytes should go (an array's buffer: :meth:`BlobStore.read_into`)."""

    store: BlobStore
    key: bytes

    def read(self) -> bytes | None:
        return self.store.get(self.key)

    def read_into(self, target: memoryview) -> int | None:
        return self.store.read_into(self.key, target)


_TEMPORARY: Final = ".tmp-"
"""Prefix of a file being written (renamed to its key's name once complete)."""

_names = itertools.count()
_TOKEN: Final = os.urandom(4).hex()
"""With the pid, tells apart processes sharing a directory from several machines."""


class _Written(NamedTuple):
    tmp: str
    path: str
    made: tuple[str, ...]
    """Directories made for it, whose entries are in their parents (synced with them)."""


def _write_file(path: str, pieces: Pieces, sync: bool) -> _Written:
    """The pieces in a temporary file next to ``path`` (synced if ``sync``), its directories
    made if missing. The name is unique to this process and call: no random name drawn."""
    parent = os.path.dirname(path)
    tmp = f"{parent}/{_TEMPORARY}{os.getpid()}-{_TOKEN}-{next(_names)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
    made: tuple[str, ...] = ()
    try:
        # 0o666 less the umask, as SQLite creates the database file.
        fd = os.open(tmp, flags, 0o666)
    except FileNotFoundError:
        made = _make_dirs(parent)
        fd = os.open(tmp, flags, 0o666)
    try:
        try:
            views = [v for v in (memoryview(piece).cast("B") for piece in pieces) if v.nbytes]
            while views:
                done = os.writev(fd, views)  # one call for the header and the chunk
                if done <= 0:
                    raise OSError(f"{tmp}: write returned {done}")
                while views and done >= views[0].nbytes:  # a short write: go on from there
                    done -= views[0].nbytes
                    views.pop(0)
                if done:
                    views[0] = views[0][done:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return _Written(tmp, path, made)


def _make_dirs(path: str) -> tuple[str, ...]:
    """Make ``path`` and its missing parents; the parents whose entries changed (for a
    synced write to sync). Another thread or process making one first is fine."""
    made: list[str] = []
    missing = []
    here = path
    while not os.path.isdir(here):
        missing.append(here)
        up = os.path.dirname(here)
        if up == here:
            break
        here = up
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
        made.append(os.path.dirname(directory))
    return tuple(made)


_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


def _fsync_dir(path: str) -> None:
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
