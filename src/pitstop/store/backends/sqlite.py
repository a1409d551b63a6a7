"""SQLite: the embedded default store. One file, no server, safe for many processes.

Durability (WAL journal; one transaction per checkpoint):

* ``normal`` (default): ``synchronous=NORMAL``. A committed checkpoint survives the process
  being killed at any instant. On power loss or an OS crash, the last commits before the
  failure may be lost (never torn: the store stays consistent, it just ends earlier). Large
  values in the blob directory are complete files before the commit but not synced, so after
  power loss one of the last checkpoints may also be left with a damaged file, which every
  load detects (see :mod:`pitstop.store.encoding.blobs`).
* ``full``: ``synchronous=FULL``. Every commit is fsynced before ``save`` returns, so a
  checkpoint that was saved survives power loss too. Costs one fsync per checkpoint (and
  one per blob-directory file it adds, issued together).

Several processes may use one file: writes take SQLite's write lock with ``BEGIN IMMEDIATE``
(so a transaction never has to upgrade a read lock and fail), wait on a busy timeout, and the
whole transaction is retried with backoff if SQLite still reports the database busy.
The file must be on a local disk: SQLite's locking over network file systems is unreliable.

WAL checkpoints (copying committed pages from the ``-wal`` file back into the database, and
their fsyncs) run on a thread of the store (:class:`_WalCheckpointer`), not inside a save:
SQLite's default runs one in whichever commit crosses 1,000 WAL pages, which made that save
tens of milliseconds long and, spread over the saves, cost more than their own SQL. The
thread checkpoints about every 256 WAL pages (it counts the pages a transaction writes), so
that a commit crossing the WAL's bound, which checkpoints itself, has little left to copy. The
guarantees do not change: a checkpoint only moves pages that are already committed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ...errors import CorruptCheckpointError, StoreError
from ...process import current_pid
from ...serde import Serializer
from ..contract import options
from ..contract.base import Durability
from ..encoding.blobs import BlobStore, DirectoryBlobStore
from ..engine.backend import Dialect, Tx
from ..engine.sql import SqlStore
from ..transfer.runs import RunTransfer

if TYPE_CHECKING:
    from ..encoding.sealed import Encryption

_TEXT: Final = functools.partial(str, encoding="utf-8", errors="surrogateescape")
"""How a TEXT value is read: bytes that are not UTF-8 (a BLOB whose record header was
damaged into TEXT) come back escaped, so the load names the record or field at fault, where
SQLite's own decoding failed the whole statement (a StoreError no fallback passed)."""


class SQLiteDialect(Dialect):
    def json_equals(self, column: str, key: str, value: Any) -> tuple[str, list[Any]]:
        path = "$." + _json_key(key)
        if value is None:
            return f"json_type({column}, ?) = 'null'", [path]
        if isinstance(value, int) and not isinstance(value, bool) and not (
            -(1 << 63) <= value < 1 << 63
        ):
            raise ValueError(
                f"metadata filter {key!r}: SQLite compares integers of at most 64 bits"
            )
        if isinstance(value, dict | list):
            import json

            return f"json_extract({column}, ?) = json(?)", [path, json.dumps(value)]
        return f"json_extract({column}, ?) = ?", [path, value]


def _json_key(key: str) -> str:
    if not key or '"' in key or "\\" in key:
        raise ValueError(f"unsupported metadata key {key!r}")
    return f'"{key}"'


SQLITE = SQLiteDialect(
    name="sqlite",
    blob="BLOB",
    real="REAL",
    bigint="INTEGER",
    without_rowid=" WITHOUT ROWID",
    null_safe_eq="IS",
)

_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}

_CHECKPOINT_EVERY: Final = 128
"""At most this many write transactions of a store between two WAL checkpoints on its
checkpointing thread (the first interval; a small save is 3-8 WAL pages)."""

_CHECKPOINT_PAGES: Final = 256
"""About how many WAL pages the thread lets a store write between two of its checkpoints: it
sets the interval in transactions from the pages each one wrote (``_WalCheckpointer.every``).
What the thread has not copied yet when a commit crosses :data:`_WAL_BOUND` that commit copies
itself, with one ``pwrite`` per page, in the step: 128 transactions of a 14-page Append step
were ~1,800 pages (5-10 ms, every ~300 steps, the p99.9 and the max of a long run); 256 pages
are ~1 ms. More frequent checkpoints copy a page written by several of them more than once
(the run's row, the indexes' upper pages): a few pages each."""

_WAL_BOUND: Final = 4096
"""WAL pages after which a commit checkpoints by itself after all (SQLite's
``wal_autocheckpoint``): bounds the WAL (16 MiB of 4 KiB pages). SQLite starts the WAL over
from its beginning only at a write that finds every page of it checkpointed; a writer that
never pauses keeps the thread's checkpoints one step behind, so the WAL grows up to this
bound, where the commit's own checkpoint finds nearly everything copied already. The file is
not cut back when it starts over: commits then overwrite it in place, where appending would
make every ``full`` commit's fsync write the file's new size to the file system's journal
too (twice the time of the sync here)."""

log = logging.getLogger("pitstop.store")


class _WalCheckpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection and thread when poked.

    PASSIVE never waits for readers or writers and never blocks them: a checkpoint that
    cannot finish leaves the rest for the next one (or for the bound above). The thread
    starts on the first poke, belongs to the process that started it (a forked child starts
    its own) and ends with :meth:`stop`.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        # Held while the thread is inside SQLite, and by fork() (see _hold_for_fork): a child
        # forked while this thread held one of SQLite's own mutexes (the unix VFS's inode
        # lock, say) would block forever on its first connect.
        self._busy = threading.Lock()
        _CHECKPOINTERS.add(self)
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.runs = 0
        """Checkpoints run (for tests)."""
        self.every = _CHECKPOINT_EVERY
        """Write transactions between two pokes: set by the thread, read by the writer."""
        self.commits = 0
        """Write transactions counted by the pokes (by writers, which hold the store's lock)."""
        self._log = 0  # WAL frames at the last checkpoint, and the commits counted then
        self._commits_then = 0
        self._salt = b""  # the WAL header's salts then: they change when the WAL starts over

    def poke(self, commits: int = 0) -> None:
        """Wake the thread (started here if need be): ``commits`` write transactions were
        made since the last poke."""
        self.commits += commits
        pid = current_pid()
        if self._thread is None or self._pid != pid:
            if self._stopped:
                return
            if self._pid:  # a forked child: the parent's Event may be mid-use by its thread
                self._wake = threading.Event()
            self._pid = pid
            self._thread = threading.Thread(
                target=self._run, name="pitstop-wal-checkpoint", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        thread = self._thread
        if thread is not None and self._pid == current_pid() and thread.is_alive():
            thread.join(timeout=5.0)
        self._thread = None

    def _pace(self, log: int, commits: int, restarted: bool) -> None:
        """Set :attr:`every` from the WAL frames (``log`` now) written by the transactions
        counted since the last checkpoint (``commits`` now): about :data:`_CHECKPOINT_PAGES`
        pages between two checkpoints. ``restarted``: the WAL started over since then, so all
        of ``log`` is new, even when it is longer than the last (a thread starved of CPU
        checkpoints late)."""
        grown = log if restarted or log < self._log else log - self._log
        made = commits - self._commits_then
        self._log, self._commits_then = log, commits
        if grown > 0 and made > 0:
            self.every = max(1, min(_CHECKPOINT_EVERY, _CHECKPOINT_PAGES * made // grown))

    def _wal_salt(self) -> bytes:
        """The WAL header's two salts: SQLite draws new ones each time the WAL starts over.
        Whether it did cannot be told from the checkpoint's counts: after a checkpoint that
        copied every frame, a reader still on the old WAL keeps the next writer from
        starting over, and guessing "it did" then counted the whole WAL as new each time,
        paced the thread to a checkpoint a commit, and sorted the WAL's frames in each (2x
        the instructions of a 1 KiB save)."""
        try:
            with open(self._path + "-wal", "rb") as wal:
                return wal.read(24)[16:24]
        except OSError:
            return b""

    def _run(self) -> None:
        try:
            with self._busy:  # opening and closing take SQLite's mutexes too
                conn = sqlite3.connect(self._path, timeout=0, isolation_level=None,
                                       check_same_thread=False)
        except sqlite3.Error:
            log.exception("could not open %r to checkpoint its WAL", self._path)
            return
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopped:
                    return
                # Busy, or the file went away: the next poke tries again.
                with self._busy, contextlib.suppress(sqlite3.Error):
                    commits = self.commits
                    done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    for busy, frames, _copied in done:  # (busy, WAL frames, frames copied)
                        if not busy:
                            salt = self._wal_salt()
                            self._pace(int(frames), commits, restarted=salt != self._salt)
                            self._salt = salt
                self.runs += 1
        finally:
            with self._busy:
                conn.close()


_CHECKPOINTERS: weakref.WeakSet[_WalCheckpointer] = weakref.WeakSet()
_HELD_FOR_FORK: list[_WalCheckpointer] = []


def _hold_for_fork() -> None:
    """Before fork(): wait until no checkpointer thread is inside SQLite, and keep it out."""
    for checkpointer in list(_CHECKPOINTERS):
        checkpointer._busy.acquire()
        _HELD_FOR_FORK.append(checkpointer)


def _release_after_fork() -> None:
    # Both sides: the forking thread took the locks, and in the child it is that same thread.
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop()._busy.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_hold_for_fork, after_in_parent=_release_after_fork,
                        after_in_child=_release_after_fork)


class QmarkTx(Tx):
    """:class:`Tx` for sqlite3, which takes ``?`` placeholders as written.

    ``cur`` is the connection (each query gets a cursor of its own, so a result is never
    cut short by the next query); ``writer`` is one cursor kept for statements that return
    no rows, which saves making a cursor per statement on every checkpoint. ``run`` is that
    cursor's own ``execute``, bound with it: such a statement then runs no Python frame of
    ours (two or more on every checkpoint, ~0.6k instructions each).
    """

    __slots__ = ("run", "writer")
    run: Callable[..., Any]  # Tx.run(sql, params=()): cursor.execute takes the same

    def __init__(self, cur: Any, dialect: Dialect, writer: Any) -> None:
        self.dialect = dialect
        self.after = None
        self.use(cur, writer)

    def use(self, cur: Any, writer: Any) -> None:
        """Run on ``cur`` (the connection) and ``writer`` (its kept cursor) from now on."""
        self.cur = cur
        self.writer = writer
        if writer is not None:
            self.run = writer.execute

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.cur.execute(sql, params).fetchall())

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(sql, rows)


class _Transaction:
    """A SQLite transaction (what the store's ``_transaction`` hook returns): holds the store's
    lock from entry to exit, BEGINs on entry, COMMITs on a normal exit, rolls back on an
    exception. ``autocommit``: the body is a single statement, which SQLite makes atomic by
    itself, so no BEGIN and COMMIT are sent.

    A class rather than a generator, and one object per store for each usual kind, made once,
    with the one :class:`QmarkTx` it hands out: it runs on every checkpoint. Reusing both
    across threads is safe because everything they keep (``conn``, the Tx's connection,
    cursor and callbacks) is set after the lock is taken and read before it is released
    (``SqlBackend._tx`` takes the callbacks before the exit), so only the thread holding the
    lock ever touches it.
    """

    __slots__ = ("autocommit", "conn", "durability", "store", "tx", "write")

    def __init__(
        self, store: SQLiteStore, write: bool, durability: Durability | None, autocommit: bool
    ) -> None:
        self.store = store
        self.write = write
        self.durability = durability
        self.autocommit = autocommit
        self.tx = QmarkTx(None, SQLITE, None)

    def __enter__(self) -> QmarkTx:
        store = self.store
        store._lock.acquire()
        try:
            conn = store._conn
            if conn is None or store._pid != current_pid():
                conn = store._connection()
            writer = store._writer or conn.cursor()
            level = self.durability or store.durability
            if level != store._synchronous:
                # Per-commit durability: SQLite only lets this change outside a transaction.
                conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[level]}")
                store._synchronous = level
            if not self.autocommit:
                writer.execute("BEGIN IMMEDIATE" if self.write else "BEGIN")
        except BaseException:
            store._lock.release()
            raise
        self.conn = conn
        tx = self.tx
        if tx.writer is not writer or tx.cur is not conn:  # the first, or a new connection
            tx.use(conn, writer)
        tx.after = None
        return tx

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        conn = self.conn
        try:
            if exc_type is None and not self.autocommit:
                try:
                    self.tx.writer.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                if self.write:
                    store = self.store
                    store._commits += 1
                    wal = store._wal
                    if wal is not None and store._commits >= wal.every:
                        wal.poke(store._commits)
                        store._commits = 0
            elif exc_type is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self.store._lock.release()


# What a damaged file looks like to SQLite when it is not reported as SQLITE_CORRUPT: a page
# of the schema or of an index read as something else.
_DAMAGE = ("malformed", "no such column", "no such table", "no such index", "not a database")


def _undecodable_sqlite_message(exc: BaseException | None) -> sqlite3.DatabaseError | None:
    """The SQLite error Python's sqlite3 raised as a ``UnicodeDecodeError``: it does so when
    SQLite's message is not UTF-8, as when a damaged schema names a table by bytes that are
    not text (``malformed database schema (pi\\xff)``). None for any other exception."""
    if not isinstance(exc, UnicodeDecodeError) or not isinstance(exc.object, bytes):
        return None
    text = exc.object.decode("utf-8", "backslashreplace")
    if not any(sign in text.lower() for sign in _DAMAGE):
        return None
    return sqlite3.DatabaseError(text)


def sqlite_error(url: str, path: str, exc: sqlite3.Error) -> Exception:
    """``exc`` as the one-line error to raise: what happened to which file and what to do.

    A full disk, a read-only file or directory and an I/O error are :class:`StoreError`; a
    damaged file is :class:`CorruptCheckpointError` (``pitstop verify`` says what is still
    readable). Each says that the store keeps its last committed transaction: SQLite rolls
    back the one that failed, so fixing the cause and running the command again is enough.
    Errors that are not about the file (a constraint, a bad parameter) are returned as they
    are: they are bugs, or handled by the caller.
    """
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return exc
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    text = str(exc)
    where = repr(path)
    kept = "a write that failed was rolled back: the store is intact"
    if code == sqlite3.SQLITE_FULL:
        return StoreError(
            f"{url}: the disk holding {where} is full ({text}); free some space and run the "
            f"command again ({kept})"
        )
    if code == sqlite3.SQLITE_READONLY or (code == sqlite3.SQLITE_CANTOPEN and path != ":memory:"
                                           and not _writable(path)):
        return StoreError(
            f"{url}: {where} cannot be written by this process ({text}); make the file and its "
            f"directory writable (SQLite keeps {os.path.basename(path)}-wal and -shm beside it) "
            "and run the command again"
        )
    if code == sqlite3.SQLITE_IOERR:
        return StoreError(
            f"{url}: cannot write {where} ({text}: a full disk, a file size limit or a failing "
            f"device); free some space, or check the device, and run the command again ({kept})"
        )
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or any(
        sign in text.lower() for sign in _DAMAGE
    ):
        return CorruptCheckpointError(
            f"the SQLite file {where} is damaged ({text}); `pitstop verify` shows what is "
            f"affected: restore the file from a backup, or try `sqlite3 {path} .recover`"
        )
    if isinstance(exc, sqlite3.OperationalError):
        return StoreError(f"{url}: {text} (SQLite file {where})")
    return exc


def _writable(path: str) -> bool:
    """Whether this process may write ``path`` and create files beside it."""
    parent = os.path.dirname(os.path.abspath(path))
    return os.access(parent, os.W_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))


_INTEGRITY_LINES = 100
"""At most this many problems from SQLite's integrity check (a badly damaged file has more)."""


def default_blob_dir(path: str) -> str:
    """Where a SQLite store keeps its large values unless told otherwise: ``<file>-blobs``
    beside the database file (as SQLite's own ``-wal`` and ``-shm`` files are)."""
    return os.fspath(path) + "-blobs"


BLOB_THRESHOLD: Final = 128 * 1024
"""SQLite's default ``blob_threshold``: values and chunks of at least this many stored bytes
go to the blob directory. A row in the file is written twice (the WAL, then the database at a
WAL checkpoint), a pack file once: a ~5 MB model ``state_dict`` (tensors of 41-410 KB, one
chunk each) below the former 1 MiB wrote 20.9 MB a ``Checkpointer.save`` (the WAL, the
checkpoint, the prune of the previous save's rows) and took 6.0x ``torch.save`` + fsync; from
128 KiB, 5.7 MB and 1.1-1.9x. A list's chunks (at most 64 KiB but for a bigger item) and a
dict's stay in the file, where a growing list's open chunk is kept as a prefix alias."""

_RECLAIM_FROM: Final = 1 << 20
"""Free bytes inside the file from which a prune gives them back to the file system."""


class SQLiteStore(SqlStore, RunTransfer):
    """A store in one SQLite file (or in memory, for :class:`~pitstop.store.MemoryStore`)."""

    dialect = SQLITE
    step_saves = True  # (one writer at a time, statements in-process: see store.steps)
    prunes_in_save = True  # (one writer at a time: see SqlBackend.prunes_in_save)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "normal",
        serializer: Serializer | None = None,
        compress_threshold: int | None = 4096,
        busy_timeout: float = 60.0,
        auto_migrate: bool = True,
        url: str | None = None,
        blobs: BlobStore | str | bool | None = None,
        blob_threshold: int = BLOB_THRESHOLD,
        chunk_hash: str = "xxh3",
        encryption: Encryption | str | None = None,
    ) -> None:
        options.check(url or f"sqlite:///{os.fspath(path)}", {
            "encryption": encryption,
            "durability": durability,
            "compress_threshold": compress_threshold,
            "busy_timeout": busy_timeout,
            "blobs": blobs,
            "blob_threshold": blob_threshold,
            "chunk_hash": chunk_hash,
        })
        self.path = os.fspath(path)
        if blobs is None or blobs is True:
            # By default values (and array chunks) of blob_threshold bytes and more live in
            # files beside the database, "<file>-blobs/": written and synced concurrently,
            # read into place, and kept out of the WAL (SQLite would write them twice). The
            # directory appears with the first such value; blobs=False keeps them in the file.
            blobs = (
                DirectoryBlobStore(default_blob_dir(self.path), create=False)
                if self.path != ":memory:"
                else None
            )
        elif blobs is False:
            blobs = None
        self.durability = durability
        self.busy_timeout = busy_timeout
        super().__init__(
            url or f"sqlite:///{self.path}",
            serializer=serializer,
            compress_threshold=compress_threshold,
            blobs=blobs,
            blob_threshold=blob_threshold,
            chunk_hash=chunk_hash,
            encryption=encryption,
        )
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._writer: sqlite3.Cursor | None = None  # see QmarkTx
        self._pid = 0
        self._closed = False
        self._synchronous: str = durability
        self._commits = 0  # write transactions since the last poke of _wal
        self._wal = _WalCheckpointer(self.path) if self.path != ":memory:" else None
        self._writing = _Transaction(self, True, None, False)
        self._reading = _Transaction(self, False, None, False)
        try:
            self._connection()
            self._ensure_schema(auto_migrate)
        except CorruptCheckpointError as exc:
            # Damage in the file's own schema: nothing can be read, not even by verify.
            self.close()
            cause = _undecodable_sqlite_message(exc.__cause__) or exc.__cause__
            if getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
                raise StoreError(
                    f"{self.url}: {self.path!r} is not a SQLite database ({cause}); check "
                    "the path (if it was a store, its header is damaged: restore it from a "
                    "backup)"
                ) from exc
            raise StoreError(
                f"{self.url}: the SQLite file {self.path!r} is too damaged to open "
                f"({cause or exc}); restore it from a backup, or try SQLite's "
                f"`sqlite3 {self.path} .recover`"
            ) from exc

    # -- connections -------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise StoreError(f"{self.url}: directory {parent!r} does not exist")
        try:
            conn = sqlite3.connect(
                self.path, timeout=5.0, isolation_level=None, check_same_thread=False
            )
            conn.text_factory = _TEXT
        except sqlite3.Error as exc:
            if os.path.isdir(self.path):
                raise StoreError(f"{self.url}: {self.path!r} is a directory, not a SQLite "
                                 "file") from None
            error = self._store_error(exc)
            if error is exc:
                raise StoreError(f"{self.url}: cannot open ({exc})") from exc
            raise error from exc
        try:
            if self.path != ":memory:":
                # Set before the file's first page is written: prunes then give freed pages
                # back to the file system (vacuum.reclaim). Only on a new file: on an
                # existing one the pragma rewrites the header page (a WAL frame per open).
                if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
                # Switching to WAL needs a moment of exclusive access; other processes opening
                # the same new file at once may hold it, so retry like any busy transaction.
                self._retrying(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.durability]}")
            conn.execute(
                "PRAGMA fullfsync=1" if self.durability == "full" else "PRAGMA fullfsync=0"
            )
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute("PRAGMA cache_size=-16000")
            if self.path != ":memory:":
                conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_BOUND}")  # see _WalCheckpointer
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            conn.close()
            raise self._store_error(exc) from (_undecodable_sqlite_message(exc) or exc)
        self._synchronous = self.durability
        return conn

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"{self.url}: store is closed")
        pid = current_pid()
        if self._conn is None or self._pid != pid:
            # After fork() the inherited connection must not be used (or closed) by the child.
            self._conn = self._open()
            self._writer = self._conn.cursor()
            self._pid = pid
        return self._conn

    def _transaction(self, write: bool, durability: Durability | None = None) -> _Transaction:
        # The usual case: one object per kind, made once (see _Transaction). A workflow
        # names its durability on every save, mostly the store's own: the same object.
        if durability is None or durability == self.durability:
            return self._writing if write else self._reading
        return _Transaction(self, write, durability, False)

    def _autocommit_read(self, sql: str, params: Sequence[Any]) -> Any:
        # One SELECT is atomic by itself: no BEGIN and COMMIT around it (a cache lookup's
        # row is this, on every step that has a CachePolicy).
        def attempt() -> Any:
            with _Transaction(self, False, None, True) as tx:
                return tx.one(sql, params)

        return self._retrying(attempt)

    def _autocommit_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        def attempt() -> list[Any]:
            with _Transaction(self, True, None, True) as tx:
                return tx.all(sql, params)

        return self._retrying(attempt)

    def _store_error(self, exc: Exception) -> Exception:
        if isinstance(exc, sqlite3.Error):
            return sqlite_error(self.url, self.path, exc)
        damage = _undecodable_sqlite_message(exc)
        if damage is not None:
            return sqlite_error(self.url, self.path, damage)
        return exc

    def _duplicate_checkpoint(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "pitstop_checkpoints." in str(exc)

    def _retryable(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        message = str(exc).lower()
        return "locked" in message or "busy" in message

    def _read_schema_version(self, tx: Tx) -> int:
        exists = tx.one(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pitstop_schema'"
        )
        if exists is None:
            return 0
        return int(tx.scalar("SELECT MAX(version) FROM pitstop_schema") or 0)

    def _file_bytes(self) -> int | None:
        if self.path == ":memory:":
            return None
        return sum(
            os.path.getsize(p)
            for p in (self.path, self.path + "-wal")
            if os.path.exists(p)
        )

    def _integrity_problems(self, notes: list[str]) -> list[str]:
        # integrity_check, not quick_check: only it compares each index with its table.
        try:
            rows = self._query(f"PRAGMA integrity_check({_INTEGRITY_LINES})")
        except (sqlite3.DatabaseError, CorruptCheckpointError, StoreError) as exc:
            return [str(exc)]  # too damaged to check: that is the finding
        return [str(line) for (line,) in rows if line != "ok"]

    def _give_space_back(self) -> None:
        from .vacuum import reclaim

        if self.path == ":memory:":
            return
        # Only when there is something worth a connection and a log checkpoint: a loop that
        # prunes after every save frees a little each time.
        pages, page_size = self._tx(lambda tx: (tx.one("PRAGMA freelist_count"),
                                                tx.one("PRAGMA page_size")))
        if pages and page_size and int(pages[0]) * int(page_size[0]) >= _RECLAIM_FROM:
            reclaim(self)

    def close(self) -> None:
        self._run_before_close()
        if self._wal is not None:
            self._wal.stop()
        with self._lock:
            if self._conn is not None and self._pid == current_pid():
                self._conn.close()
            self._conn = self._writer = None
            self._closed = True


__all__ = ["SQLITE", "SQLiteDialect", "SQLiteStore"]
