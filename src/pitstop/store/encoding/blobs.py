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

The directory store keeps the values one save adds together, in one *pack* file, each at an
offset its row records (:class:`Slot`): a 256 MiB array is 256 chunks, and one file for
them costs one open where a file per chunk cost 256 creates and up to 256 directories (the
``normal`` save was 2.7x ``np.save``, most of the excess in those calls). A pack is deleted
when garbage collection has deleted the last row in it. A value written alone still gets a
file of its own, named by its key, as every value did before packs (those still load).

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

from ...errors import StoreError

Pieces = Sequence[bytes | memoryview]
"""A value given as pieces to write one after the other (a header and an array's memory)."""

ChunkCheck = Callable[[bytes, int, memoryview], None]
"""What checks a value read into place: called with its key, its header byte and its body
(in the place it was read into), raises if the body is not what the key names."""


class Slot(NamedTuple):
    """Where a packed value is: its ``size`` stored bytes at ``offset`` in the pack named
    ``pack`` (a row's ``pack``, ``pack_offset`` and ``size``)."""

    pack: str
    offset: int
    size: int


class BlobStore(ABC):
    """Where large values live, keyed by their content hash. Writes must be durable when
    :meth:`put` returns, and idempotent (the same key always carries the same bytes)."""

    url: str

    orphan_age: float = 3600.0
    """Seconds after which a value no row references is surely abandoned (a save killed
    before its commit), not about to be referenced by a save still in flight: ``prune``
    deletes it then, and ``verify`` reports it."""

    @abstractmethod
    def put(self, key: bytes, data: bytes) -> None:
        """Store ``data`` under ``key`` (a no-op if it is there already)."""

    def put_many(
        self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True, pack: bool = False
    ) -> dict[bytes, Slot]:
        """Store every ``(key, pieces)`` (the value is the pieces joined), all durable when
        this returns. ``pack``: pack even a single value, where a store would name it by its
        key (a sealed store: no name says which values are equal).
        ``sync=False`` (a save with durability ``normal``): each complete and
        readable when this returns, durable once the operating system writes it back; never
        visible partly written. Returns where the values it packed are (their rows record
        it: a packed value is read by its :class:`Slot`); those it stored under their key
        are not in it. This default stores each under its key."""
        for key, pieces in items:
            self.put(key, b"".join(pieces))
        return {}

    @abstractmethod
    def get(self, key: bytes, slot: Slot | None = None) -> bytes | None:
        """The bytes under ``key`` (at ``slot`` if it was packed), or None if there are
        none."""

    def read_into(self, key: bytes, target: memoryview, slot: Slot | None = None) -> int | None:
        """Read the value under ``key`` (at ``slot``), which must be one header byte
        followed by exactly ``len(target)`` bytes, into ``target``; return the header byte
        (None: no such key, or its size differs). Stores that can read into place override
        it (no copy)."""
        data = self.get(key, slot)
        if data is None or len(data) != len(target) + 1:
            return None
        target[:] = memoryview(data)[1:]
        return data[0]

    def read_checked_into(
        self, key: bytes, target: memoryview, slot: Slot | None, check: ChunkCheck
    ) -> int | None:
        """:meth:`read_into`, then ``check`` run on the body in place (it raises if the body
        is not what ``key`` names). A store that reads bodies as they arrive from a network
        (object storage) runs it on each as it lands, while the body is in the processor's
        cache, when :meth:`place` was given the same check."""
        header = self.read_into(key, target, slot)
        if header is not None:
            check(key, header, target)
        return header

    @abstractmethod
    def delete(self, keys: Iterable[bytes]) -> None:
        """Remove these keys (missing ones are ignored)."""

    def delete_packs(self, names: Iterable[str]) -> None:  # noqa: B027 (no packs: nothing)
        """Remove these packs, every value in them (missing ones are ignored). Stores that
        never pack (whose :meth:`put_many` answers no slots) have none to remove."""

    @abstractmethod
    def keys(self, *, older_than: float = 0.0) -> Iterator[bytes]:
        """Every key, or only those written more than ``older_than`` seconds ago."""

    def packs(self, *, older_than: float = 0.0) -> Iterator[str]:
        """Every pack's name, or only those written more than ``older_than`` seconds ago."""
        return iter(())

    def remove_abandoned(self, *, older_than: float) -> int:
        """Remove what writes killed half way left behind (never a value), if older than
        ``older_than`` seconds; how many. Stores whose writes leave nothing do nothing."""
        return 0

    def prefetch(self, values: Sequence[tuple[bytes, Slot | None]]) -> None:  # noqa: B027
        """A load is about to read these values, by key and slot (in any order, from a few
        threads): a store
        whose reads wait on a network starts them all now, concurrently. A disk needs no
        such help."""

    def place(  # noqa: B027
        self,
        places: Sequence[tuple[bytes, Slot | None, memoryview]],
        check: ChunkCheck | None = None,
    ) -> None:
        """A load now knows where the bodies of these prefetched values go (an array's
        chunks, each ``(key, slot, target)``; a key may have several targets), before it
        reads them by :meth:`read_checked_into` with those targets and ``check``: a store
        whose reads wait on a network may start them now, writing straight into the
        targets and checking each body as it lands. Others need not."""

    def why_missing(self, key: bytes, slot: Slot | None = None) -> str:
        """Why :meth:`get` found nothing under ``key`` (what ``verify`` reports)."""
        return f"file missing from {self}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class DirectoryBlobStore(BlobStore):
    """Files under a directory, written atomically: the values one write adds in one pack
    (``packs/ab/ab....pack``), a value written alone in a file named by its key
    (``ab/cd/abcd....blob``).

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

    def put_many(
        self, items: Sequence[tuple[bytes, Pieces]], *, sync: bool = True, pack: bool = False
    ) -> dict[bytes, Slot]:
        """Two values or more (or ``pack``): one pack holding them all, one after the other
        (see :meth:`_put_pack`). One value: its own file (:meth:`_put_files`), which a later
        write of the same bytes finds by its name and keeps."""
        if len(items) > 1 or (pack and items):
            return self._put_pack(items, sync)
        self._put_files(items, sync)
        return {}

    def _put_pack(self, items: Sequence[tuple[bytes, Pieces]], sync: bool) -> dict[bytes, Slot]:
        """The values in a new pack, under a temporary name until all its bytes are written
        (and, with ``sync``, fsynced), then renamed into place; with ``sync`` its directory
        is synced after (and those made for it): never visible before its bytes are durable.
        One ``writev`` per 1,024 pieces (a chunk's header and a view of the array).

        The name is drawn at random (96 bits): packs are never written to twice, so two
        processes or machines sharing the directory never collide, and a pack is either
        complete or absent. Every value is written, even one stored already (in another
        pack, or in a file that power loss left short): its row then points here, at bytes
        known whole, and the old copy is left to garbage collection."""
        name = os.urandom(12).hex()
        path = self._pack_name(name)
        slots: dict[bytes, Slot] = {}
        pieces: list[bytes | memoryview] = []
        offset = 0
        for key, value in items:
            if key in slots:
                continue
            size = sum(memoryview(piece).nbytes for piece in value)
            slots[key] = Slot(name, offset, size)
            pieces.extend(value)
            offset += size
        try:
            done = _write_file(path, pieces, sync)
        except OSError as exc:
            raise StoreError(f"blob directory {self.root}: {exc}") from exc
        self._install(done, path, sync)
        return slots

    def _install(self, done: _Written, path: str, sync: bool) -> None:
        """Rename a written pack into place (its temporary file removed should that fail)
        and, for a synced save, sync the directories that now name it."""
        try:
            try:
                os.replace(done.tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(done.tmp)
                raise
        except OSError as exc:
            raise StoreError(f"blob directory {self.root}: {exc}") from exc
        if sync:
            for directory in (os.path.dirname(path), *done.made):
                _fsync_dir(directory)

    def put_pack_streamed(
        self, sizes: Sequence[tuple[bytes, int]], batches: Iterable[Pieces], sync: bool
    ) -> dict[bytes, Slot]:
        """One pack of the values ``sizes`` names (key, bytes), in that order, their bytes
        given by ``batches``: each batch of pieces is written before the next is asked for,
        so whoever makes them may reuse one buffer (a sealed store seals a chunk into the
        buffer the file was just written from: no fresh page per byte of the save). Written,
        synced and renamed as :meth:`_put_pack` does."""
        name = os.urandom(12).hex()
        path = self._pack_name(name)
        slots: dict[bytes, Slot] = {}
        offset = 0
        for key, size in sizes:
            slots[key] = Slot(name, offset, size)
            offset += size
        try:
            done = _write_file(path, (), sync, batches)
            if done.size != offset:
                with contextlib.suppress(OSError):
                    os.unlink(done.tmp)
                raise OSError(f"pack {name}: {done.size} bytes written, {offset} expected")
        except OSError as exc:
            raise StoreError(f"blob directory {self.root}: {exc}") from exc
        self._install(done, path, sync)
        return slots

    def _pack_name(self, name: str) -> str:
        return f"{self._root_text}/{_PACKS}/{name[:2]}/{name}{_PACK_SUFFIX}"

    def _put_files(self, items: Sequence[tuple[bytes, Pieces]], sync: bool) -> None:
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

    def get(self, key: bytes, slot: Slot | None = None) -> bytes | None:
        # Something else where the file should be (a directory, a dangling path) is a
        # missing value, so loading reports it by field and a fallback passes it.
        if slot is not None:
            data = bytearray(slot.size)
            found = self._read_packed(slot, [memoryview(data)])
            return bytes(data) if found else None
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._unreadable(exc) from exc

    def _unreadable(self, exc: OSError) -> StoreError:
        """A file of the blob store that is there but cannot be read (permissions, an I/O
        error): the store's problem, not the value's, so no fallback passes it."""
        return StoreError(
            f"{self.url}: cannot read {exc.filename or self._root_text} ({exc.strerror or exc}); "
            "make the blob directory and its files readable by this process"
        )

    def why_missing(self, key: bytes, slot: Slot | None = None) -> str:
        if slot is not None:
            pack = self._pack_name(slot.pack)
            size = _size_of(pack)
            if size >= 0:
                return (f"pack {pack} ends at byte {size}, before the value's "
                        f"{slot.size} bytes at {slot.offset}")
            if os.path.isdir(pack):
                return f"{pack} is a directory, not a file"
            return f"pack {pack} missing from {self}"
        path = self._path(key)
        if path.is_dir():
            return f"{path} is a directory, not a file"
        return f"file missing from {self}"

    def read_into(self, key: bytes, target: memoryview, slot: Slot | None = None) -> int | None:
        """Straight from the file into ``target``: the one copy a load of an array makes, in
        one ``readv`` (header byte, the body into place, one byte past it to tell a longer
        file) where the platform has it; from a pack, one ``preadv`` at the value's offset
        (its size is known: no spare byte)."""
        if slot is not None:
            header = bytearray(1)
            if slot.size != target.nbytes + 1:
                return None
            return header[0] if self._read_packed(slot, [memoryview(header), target]) else None
        try:
            fd = os.open(self._name(key), os.O_RDONLY | _O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._unreadable(exc) from exc
        try:
            return _read_framed(fd, target)
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)

    def _read_packed(self, slot: Slot, views: list[memoryview]) -> bool:
        """Fill ``views`` (``slot.size`` bytes) from the slot's pack: False if the pack is
        missing or ends before the value does."""
        try:
            fd = os.open(self._pack_name(slot.pack), os.O_RDONLY | _O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        except OSError as exc:
            raise self._unreadable(exc) from exc
        try:
            offset = slot.offset
            while views:
                n = _preadv(fd, views, offset)
                if not n:
                    return False  # the pack ends before the value does
                offset += n
                _consume(views, n)  # a short read: go on from there
            return True
        except IsADirectoryError:
            return False
        finally:
            os.close(fd)

    def delete(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self._path(key).unlink()

    def delete_packs(self, names: Iterable[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                os.unlink(self._pack_name(name))

    def packs(self, *, older_than: float = 0.0) -> Iterator[str]:
        if not self.root.is_dir():
            return
        cutoff = time.time() - older_than
        for path in self.root.glob(f"{_PACKS}/*/*{_PACK_SUFFIX}"):
            try:
                if not path.is_file() or (older_than and path.stat().st_mtime > cutoff):
                    continue
            except OSError:
                continue
            yield path.stem

    def remove_abandoned(self, *, older_than: float) -> int:
        """Temporary files of writes that never reached their rename (a process killed in a
        save): unreferenced, invisible to loads, only taking space (a pack's are in the
        same place, ``packs/ab/``)."""
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
        _consume(views, n)  # a short read: go on from there
    return header[0] if done == expected else None


def _consume(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``views``: what a ``readv``/``writev`` that moved ``n``
    bytes leaves to do (the finished buffers deleted at once, not one ``pop(0)`` each: a
    pack's write hands over up to 1,024 of them)."""
    done = 0
    while done < len(views) and n >= views[done].nbytes:
        n -= views[done].nbytes
        done += 1
    del views[:done]
    if n:
        views[0] = views[0][n:]


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


def _preadv_seek(fd: int, views: list[memoryview], offset: int) -> int:
    """``os.preadv`` where the platform lacks it (one reader per descriptor: every read
    opens its own)."""
    os.lseek(fd, offset, os.SEEK_SET)
    return _readv(fd, views)


def _preadv_os(fd: int, views: list[memoryview], offset: int) -> int:
    return os.preadv(fd, views[:_IOV_MAX], offset)


_preadv: Callable[[int, list[memoryview], int], int] = (
    _preadv_os if hasattr(os, "preadv") else _preadv_seek
)

_IOV_MAX: Final = 1024
"""Buffers one ``writev``/``preadv`` takes at most (Linux's and macOS's limit)."""


class Deferred(NamedTuple):
    """A value kept in a blob store, not read yet: a load reads it when it knows where its
    bytes should go (an array's buffer: :meth:`BlobStore.read_into`)."""

    store: BlobStore
    key: bytes
    slot: Slot | None = None

    def read(self) -> bytes | None:
        return self.store.get(self.key, self.slot)

    def read_checked_into(self, target: memoryview, check: ChunkCheck) -> int | None:
        return self.store.read_checked_into(self.key, target, self.slot, check)


_PACKS: Final = "packs"
"""The directory of packs, beside the ``ab/`` directories of files named by key (a key's
name is hex: never this)."""
_PACK_SUFFIX: Final = ".pack"

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
    size: int = 0
    """Bytes written."""


def _write_file(path: str, pieces: Pieces, sync: bool,
                batches: Iterable[Pieces] = ()) -> _Written:
    """The pieces (then those of each of ``batches``, each written before the next is asked
    for) in a temporary file next to ``path`` (synced if ``sync``), its directories made if
    missing. The name is unique to this process and call: no random name drawn."""
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
        written = 0
        try:
            for batch in itertools.chain((pieces,), batches):
                views = [v for v in (memoryview(piece).cast("B") for piece in batch) if v.nbytes]
                while views:
                    done = os.writev(fd, views[:_IOV_MAX])  # a chunk's header and body at once
                    if done <= 0:
                        raise OSError(f"{tmp}: write returned {done}")
                    written += done
                    _consume(views, done)  # a short write: go on from there
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return _Written(tmp, path, made, written)


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
    """A blob store from a ``file:///path`` URL or a directory path, or object storage from an
    ``s3://bucket/prefix`` URL (:class:`~pitstop.store.S3BlobStore`), or one given as
    is."""
    if isinstance(spec, BlobStore):
        return spec
    text = os.fspath(spec)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif text.lower().startswith("s3://"):
        from .objects import S3BlobStore  # (obstore imported only for object storage)

        return S3BlobStore(text)
    elif "://" in text:
        raise StoreError(
            f"unsupported blob store {text!r}; use a directory, file:///path or s3://bucket/prefix"
        )
    return DirectoryBlobStore(text)


__all__ = ["BlobStore", "ChunkCheck", "Deferred", "DirectoryBlobStore", "Slot", "open_blob_store"]
