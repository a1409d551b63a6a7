"""Fault injection for the tests: a TCP proxy that cuts or black-holes connections, a disk that
fills up, files the process may not write, and a process killed at a chosen SQL statement.

Everything here produces a real fault the code under test meets through the operating system
(a reset connection, a silent peer, ENOSPC/EFBIG, EACCES, SIGKILL): nothing of pitstop is
replaced or patched.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from conftest import PG_URL, ROOT

# -- the network -------------------------------------------------------------------------------


class FaultProxy:
    """A TCP relay on 127.0.0.1 in front of a real server, with faults on demand.

    * :meth:`cut` resets every open connection (a server restart, a NAT dropping state);
    * :meth:`down` cuts them and resets every new one until :meth:`heal`: a server that is
      away (restarting, unreachable);
    * :meth:`blackhole` stops forwarding in both directions without closing anything, as a
      network partition does: each side's kernel still acknowledges what it receives (so TCP
      keepalives and ``tcp_user_timeout`` never fire), but no byte gets through until
      :meth:`heal`; new connections are accepted and then hear nothing;
    * :meth:`cut_on` arms a one-shot trigger: a client message containing a pattern
      (``b"COMMIT"``; the first after ``skip`` others) is forwarded to the server, or
      dropped, and the connection is reset before the server's answer gets back: the client
      cannot tell whether it was applied;
    * :meth:`blackhole_on` arms a one-shot trigger that starts a black hole (for a while, or
      until :meth:`heal`) at the first client message containing a pattern, that message
      held back with the rest: a network that stalls in the middle of a large write.
    """

    def __init__(self, target: tuple[str, int] | None = None) -> None:
        if target is None:
            parts = urlsplit(PG_URL)
            target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._trigger: tuple[bytes, bool, bool] | None = None
        self._skip = 0
        self._refusing = False
        self._stall_on: tuple[bytes, float | None] | None = None
        self._rate: float | None = None
        self.triggered = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def url(self, base: str = PG_URL, **query: str) -> str:
        """``base`` (a postgresql:// URL) routed through this proxy, with extra options."""
        parts = urlsplit(base)
        userinfo, at, _ = parts.netloc.rpartition("@")
        url = urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{self.port}"))
        for key, value in query.items():
            url += ("&" if "?" in url else "?") + f"{key}={value}"
        return url

    # -- faults ----------------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every connection open now (new ones are accepted as usual)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _reset(*pair)

    def down(self) -> None:
        """Cut every connection and refuse new ones (accepted, then reset) until healed."""
        self._refusing = True
        self.cut()

    def blackhole(self) -> None:
        """Stop forwarding anything, closing nothing."""
        self._flowing.clear()

    def heal(self) -> None:
        """Undo :meth:`down` and :meth:`blackhole` (what waited in the kernels' buffers is
        delivered, nothing lost)."""
        self._refusing = False
        self._flowing.set()

    def cut_on(
        self, pattern: bytes, *, deliver: bool = True, skip: int = 0, then_down: bool = False
    ) -> None:
        """Reset the connection of a client message containing ``pattern`` (the first after
        ``skip`` such messages); with ``deliver`` the server receives that message first
        (and, for a COMMIT, commits). With ``then_down`` the proxy also refuses connections
        from that moment on, until healed: set before the reset, so a client that retries at
        once cannot slip through (a test thread calling :meth:`down` after ``triggered``
        loses that race now and then)."""
        self.triggered.clear()
        with self._lock:
            self._trigger = (pattern, deliver, then_down)
            self._skip = skip

    def throttle(self, bytes_per_second: float | None) -> None:
        """Forward at most ``bytes_per_second`` from clients to the server (None: no limit):
        a slow link, on which a large write takes many socket buffers' worth of time."""
        self._rate = bytes_per_second

    def blackhole_on(self, pattern: bytes, *, heal_after: float | None = None) -> None:
        """Black-hole everything from the first client message containing ``pattern`` on
        (that message included); heal by itself after ``heal_after`` seconds if given."""
        self.triggered.clear()
        with self._lock:
            self._stall_on = (pattern, heal_after)

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.cut()

    # -- relaying -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(
                target=self._relay, args=(client, server), name="fault-relay", daemon=True
            ).start()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            try:
                selector.register(client, selectors.EVENT_READ)
                selector.register(server, selectors.EVENT_READ)
            except (OSError, ValueError):  # cut() reset the pair before this thread began
                return
            try:
                while not self._closed:
                    if not self._flowing.is_set():
                        self._flowing.wait(0.05)  # black hole: leave it in the kernel buffers
                        continue
                    for key, _ in selector.select(0.05):
                        src: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = src.recv(1 << 16)
                        if not data:
                            raise OSError("closed")
                        if src is client and self._fire(data, client, server):
                            return
                        if src is client and self._stall(data):
                            self._flowing.wait()  # the black hole began with this message
                        rate = self._rate
                        if src is client and rate:
                            time.sleep(len(data) / rate)
                        peer[src].sendall(data)
            except (OSError, ValueError):
                pass
            finally:
                _reset(client, server)

    def _fire(self, data: bytes, client: socket.socket, server: socket.socket) -> bool:
        with self._lock:
            trigger = self._trigger
            if trigger is None or trigger[0] not in data:
                return False
            if self._skip:
                self._skip -= 1
                return False
            self._trigger = None
        if trigger[1]:
            server.sendall(data)
            # The server has the message; give it a moment to act on it before the cut.
            with contextlib.suppress(OSError):
                server.settimeout(2)
                server.recv(1 << 16)
        if trigger[2]:
            self._refusing = True
            self.cut()  # the other open connections too, as down() does
        _reset(client, server)
        self.triggered.set()
        return True


    def _stall(self, data: bytes) -> bool:
        with self._lock:
            stall = self._stall_on
            if stall is None or stall[0] not in data:
                return False
            self._stall_on = None
        self.blackhole()
        if stall[1] is not None:
            timer = threading.Timer(stall[1], self.heal)
            timer.daemon = True
            timer.start()
        self.triggered.set()
        return True


def _reset(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            # SO_LINGER 0: close with a RST, as a dropped connection looks to the peer.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()


# -- processes -------------------------------------------------------------------------------


def python(code: str, *args: str) -> list[str]:
    """The command line running ``code`` in a fresh interpreter."""
    return [sys.executable, "-c", code, *args]


def pitstop_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pitstop", *args]


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str = ROOT,
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=_env(cwd, env),
        preexec_fn=preexec,
        check=False,
    )


def spawn(
    argv: Sequence[str], *, cwd: Path | str = ROOT, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """:func:`run` without waiting: stdout and stderr are pipes, read them with communicate."""
    return subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=_env(cwd, env),
    )


def _env(cwd: Path | str, extra: dict[str, str] | None) -> dict[str, str]:
    # This checkout's src first: the child runs the code under test, not whatever pitstop
    # the interpreter has installed (another checkout's, in a worktree).
    path = os.pathsep.join(map(str, (ROOT / "src", ROOT / "tests", cwd)))
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def file_size_limit(limit: int) -> Callable[[], None]:
    """A ``preexec`` giving the child ``RLIMIT_FSIZE``: no file it writes grows past
    ``limit`` bytes (``write`` fails with EFBIG, as on a full disk, instead of SIGXFSZ)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


# Root bypasses file permissions through these two capabilities; without them a root process
# meets a read-only file or directory exactly as an ordinary user does (the interpreter itself
# lives under /root here, out of reach of a real unprivileged user).
_DAC_CAPS = "-dac_override,-dac_read_search"


def unprivileged(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that file permissions apply to it: as is for an ordinary user; for
    root, without the capabilities that let root write any file."""
    if os.geteuid() != 0:
        return list(argv)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("setpriv (util-linux) is needed to drop root's file capabilities")
    return [setpriv, f"--bounding-set={_DAC_CAPS}", f"--inh-caps={_DAC_CAPS}", *argv]


@contextlib.contextmanager
def small_disk(size: str = "2m") -> Iterator[Path]:
    """A directory on a tmpfs of ``size``: writes past it fail with ENOSPC. Raises
    ``PermissionError`` where mounting is not allowed (not root, or no CAP_SYS_ADMIN)."""
    mountpoint = Path(tempfile.mkdtemp(prefix="pitstop-small-disk-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        mountpoint.rmdir()
        raise PermissionError(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            mountpoint.rmdir()


# Prepended to a script: ``kill_at_statement(pattern, n)`` makes this process SIGKILL itself
# just before the n-th SQL statement (0: the first) counted from the first one matching
# ``pattern``. SQLite reports each statement it is about to run through its trace callback,
# installed here on every connection (sqlite3.connect is wrapped before pitstop is imported);
# psycopg has no such hook, so for PostgreSQL the statements the client hands to
# Cursor.execute/executemany are counted (pipelined ones may not have reached the server).
# ``fork_each(points, fn)`` runs ``fn()`` in a forked child per kill point (imports done once)
# and returns each child's exit status: -9 if it was killed there, else its own status.
KILL_AT_STATEMENT = r"""
import os, re, signal, sqlite3, sys
_kill = {"pattern": None, "at": -1, "seen": -1}

def kill_at_statement(pattern, at):
    _kill.update(pattern=re.compile(pattern, re.I), at=at, seen=-1)

def _tick(statement):
    if _kill["pattern"] is None:
        return
    if _kill["seen"] < 0 and not _kill["pattern"].search(statement or ""):
        return
    _kill["seen"] += 1
    if _kill["seen"] == _kill["at"]:
        os.kill(os.getpid(), signal.SIGKILL)

_connect = sqlite3.connect
def _traced(*args, **kwargs):
    conn = _connect(*args, **kwargs)
    conn.set_trace_callback(_tick)
    return conn
sqlite3.connect = _traced

try:
    import psycopg
except ImportError:
    psycopg = None
if psycopg is not None:
    for _name in ("execute", "executemany"):
        def _counted(self, query, *args, _orig=getattr(psycopg.Cursor, _name), **kwargs):
            _tick(query if isinstance(query, str) else str(query))
            return _orig(self, query, *args, **kwargs)
        setattr(psycopg.Cursor, _name, _counted)

def fork_each(points, fn, pattern):
    statuses = []
    for at in points:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                kill_at_statement(pattern, at)
                fn(at)
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        statuses.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                        else os.WEXITSTATUS(status))
    return statuses
"""


__all__ = [
    "KILL_AT_STATEMENT",
    "FaultProxy",
    "file_size_limit",
    "pitstop_cli",
    "python",
    "run",
    "small_disk",
    "spawn",
    "unprivileged",
]
