"""Hosts on a simulated network, for the partition tests: each "host" is a Linux network
namespace joined to this one by a veth pair, reaching the PostgreSQL server through a TCP
forwarder on its veth address (the server listens on loopback only, and its configuration
is not touched). Faults are nftables rules inside the host's namespace (100% loss: a
partition, one direction or both; a random share of packets dropped) and a delay the
forwarder adds to every chunk it passes (this kernel has no ``netem`` qdisc).

Needs root, ``ip`` (iproute2) and ``nft`` (nftables, which ``.ci/run`` installs).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import uuid
from dataclasses import dataclass, field

SUBNET = "10.231"


def unavailable() -> str | None:
    """Why hosts cannot be simulated here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2 nftables)"
    probe = f"pstp{uuid.uuid4().hex[:6]}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here ({done.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str
    netns: str
    index: int
    port: int = 0
    """Where the host reaches the first upstream (PostgreSQL)."""
    ports: dict[int, int] = field(default_factory=dict)
    """Upstream port -> the forwarder's port for this host (every upstream)."""
    delay: float = 0.0
    """Seconds the forwarder holds each chunk to and from this host."""
    faults: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The root namespace's end of the veth pair: where the forwarder listens."""
        return f"{SUBNET}.{self.index}.1"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index}.2"

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def _rules(self, *rules: str) -> None:
        """Replace the host's fault rules (inside its namespace; its loopback untouched)."""
        _sh(*self.exec_prefix(), "nft", "flush", "ruleset")
        if not rules:
            return
        script = ["table inet fault {",
                  "  chain out { type filter hook output priority 0; oifname \"lo\" accept; "
                  + " ".join(r for r in rules if r.startswith("out:")).replace("out:", "")
                  + " }",
                  "  chain in { type filter hook input priority 0; iifname \"lo\" accept; "
                  + " ".join(r for r in rules if r.startswith("in:")).replace("in:", "")
                  + " }",
                  "}"]
        subprocess.run([*self.exec_prefix(), "nft", "-f", "-"], input="\n".join(script),
                       check=True, capture_output=True, text=True)

    def partition(self, direction: str = "both") -> None:
        """100% loss: ``both``, ``out`` (the server never hears the host) or ``in`` (the
        host never hears the server: its requests are applied, their answers lost)."""
        rules = []
        if direction in ("both", "out"):
            rules.append("out:drop;")
        if direction in ("both", "in"):
            rules.append("in:drop;")
        self._rules(*rules)

    def lose(self, percent: int) -> None:
        """Drop ``percent``% of packets each way, at random."""
        self._rules(f"out:numgen random mod 100 < {percent} drop;",
                    f"in:numgen random mod 100 < {percent} drop;")

    def heal(self) -> None:
        self._rules()


class Network:
    """Three (or ``count``) hosts and the forwarders that let them reach ``upstream`` and
    each of ``also`` (e.g. Redis, which listens on loopback only too)."""

    def __init__(self, count: int = 3, upstream: tuple[str, int] = ("127.0.0.1", 5432),
                 also: tuple[tuple[str, int], ...] = ()) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.upstream = upstream
        self.upstreams = (upstream, *also)
        self.hosts = [Host(f"h{i + 1}", f"pst{self.tag}h{i + 1}", 0) for i in range(count)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="netsim-forwarder")
        self._servers: list[asyncio.base_events.Server] = []

    def __enter__(self) -> Network:
        base = 40 + (int(self.tag, 16) % 150)  # another run's leftovers never collide
        try:
            for i, host in enumerate(self.hosts):
                host.index = base + i
                outer = f"pv{self.tag}{i}"
                _sh("ip", "netns", "add", host.netns)
                _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0",
                    "netns", host.netns)
                _sh("ip", "addr", "add", f"{host.gateway}/24", "dev", outer)
                _sh("ip", "link", "set", outer, "up")
                _sh(*host.exec_prefix(), "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
                _sh(*host.exec_prefix(), "ip", "link", "set", "eth0", "up")
                _sh(*host.exec_prefix(), "ip", "link", "set", "lo", "up")
            self._thread.start()
            for host in self.hosts:
                for target in self.upstreams:
                    future = asyncio.run_coroutine_threadsafe(self._listen(host, target),
                                                              self._loop)
                    future.result(timeout=10)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            async def close() -> None:
                for server in self._servers:
                    server.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        for i, host in enumerate(self.hosts):
            subprocess.run(["ip", "link", "del", f"pv{self.tag}{i}"], capture_output=True,
                           check=False)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)

    async def _listen(self, host: Host, upstream: tuple[str, int]) -> None:
        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    if host.delay:
                        await asyncio.sleep(host.delay)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()  # the other side sees the close, as it would the host's

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(*upstream)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        server = await asyncio.start_server(accept, host.gateway, 0)
        port = server.sockets[0].getsockname()[1]
        host.ports[upstream[1]] = port
        if upstream == self.upstream:
            host.port = port
        self._servers.append(server)
