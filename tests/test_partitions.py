"""Workers on three hosts sharing one PostgreSQL store, under network partitions (#34).

Each host is a network namespace with its own host name (so a worker on another host cannot
tell a partitioned worker from a live one: it must wait for the lease to expire), joined to
this one by a veth pair; the server is reached through a forwarder on the host's veth
address (tests/netsim.py). A worker process runs on every host
(tests/partition_worker.py, leases of 2 s). The network of the host that holds a run is cut
during a claim, a step, the commit of a checkpoint or a step longer than the lease (its
renewals fail), and healed only after the lease expired and another host finished the run;
30% packet loss and 500 ms of delay run beside.

What must hold for every run: it completes exactly once, each step's checkpoint written
once, in one linear history (a write of the worker that lost its lease, once its network is
back, is refused by the fencing token: nothing is written after the lease is lost); the
fencing tokens of the steps never go down; and an effect's function runs again only in the
documented window (its result not recorded yet), never after ``recorded``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import netsim
import pitstop
from conftest import BACKENDS, PG_URL, ROOT, drop_pg_schema, pg_schema_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif("postgres" not in BACKENDS, reason="needs the PostgreSQL server"),
]

TTL = 2.0


@dataclass
class Cluster:
    net: Any
    store: pitstop.Store
    journal: Path
    marks: Path
    procs: dict[str, subprocess.Popen[str]]
    logs: Path

    def host(self, name: str) -> Any:
        return next(h for h in self.net.hosts if h.name == name)

    def pid_of(self, name: str) -> int:
        for line in self.journal.read_text().splitlines():
            parts = line.split()
            if parts[:2] == ["up", name]:
                return int(parts[2])
        raise AssertionError(f"worker on {name} never started")


def wait(what: str, check: Callable[[], Any], timeout: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = netsim.unavailable()
    if why is not None:
        pytest.skip(f"cannot simulate hosts: {why}")
    place = tmp_path_factory.mktemp("partitions")
    schema = f"part_{uuid.uuid4().hex[:10]}"
    journal, marks, logs = place / "journal", place / "marks", place / "logs"
    marks.mkdir()
    logs.mkdir()
    journal.touch()
    store = pitstop.open_store(pg_schema_url(schema))
    procs: dict[str, subprocess.Popen[str]] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PARTITION_TTL": str(TTL)}
    try:
        with netsim.Network(3) as net:
            try:
                for host in net.hosts:
                    base = PG_URL.replace("127.0.0.1:5432", f"{host.gateway}:{host.port}")
                    sep = "&" if "?" in base else "?"
                    # Short timeouts: a connection cut off is given up after ~4 s, not minutes.
                    url = f"{base}{sep}schema={schema}&connect_timeout=2&statement_timeout=2"
                    procs[host.name] = subprocess.Popen(
                        [*host.exec_prefix(), "unshare", "--uts", "--", "sh", "-c",
                         'hostname "$0" && exec "$@"', f"pst-{host.name}", sys.executable,
                         str(ROOT / "tests" / "partition_worker.py"), url, host.name,
                         str(journal), str(marks)],
                        env=env, text=True, stdout=subprocess.DEVNULL,
                        stderr=open(logs / f"{host.name}.log", "w"),  # noqa: SIM115
                    )
                wait("the workers", lambda: all(f"up {h.name} " in journal.read_text()
                                                for h in net.hosts), timeout=60)
                yield Cluster(net, store, journal, marks, procs, logs)
            finally:
                for proc in procs.values():
                    proc.terminate()
                for proc in procs.values():
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    finally:
        # After the network is gone: its forwarders close every connection a host
        # left open (one cut off mid-transaction holds its row locks until then, and
        # dropping the schema would wait on them for good).
        store.close()
        drop_pg_schema(schema)


@pytest.fixture(autouse=True)
def healed(cluster: Cluster) -> Iterator[None]:
    yield
    for host in cluster.net.hosts:
        host.heal()
        host.delay = 0.0


def enqueue(cluster: Cluster, n: int, *, hold: list[Any] | None = None, count: int = 1,
            step_s: float = 0.05) -> list[str]:
    prefix = uuid.uuid4().hex[:6]
    wf = pitstop.Workflow("part")
    wf.step(name="work")(lambda state, ctx: None)  # (enqueued here, executed by the hosts)
    ids = []
    for k in range(count):
        state: dict[str, Any] = {"n": n, "step_s": step_s}
        if hold is not None:
            state["hold"] = hold
        wf.enqueue(cluster.store, state, run_id=f"{prefix}-{k}")
        ids.append(f"{prefix}-{k}")
    return ids


def completed(cluster: Cluster, ids: list[str]) -> Callable[[], bool]:
    def check() -> bool:
        return all(cluster.store.get_run(r).status is pitstop.RunStatus.COMPLETED for r in ids)

    return check


def marker(cluster: Cluster, run_id: str, where: str) -> Callable[[], str | None]:
    path = cluster.marks / f"{run_id}.{where}"

    def check() -> str | None:
        return path.read_text() or None if path.exists() else None

    return check


def check_runs(cluster: Cluster, ids: list[str], n: int) -> list[list[Any]]:
    """Every promise of the module docstring, for ``ids``; their trails."""
    store = cluster.store
    journal = cluster.journal.read_text().splitlines()
    trails = []
    for run_id in ids:
        run = store.get_run(run_id)
        assert run.status is pitstop.RunStatus.COMPLETED, run
        head = store.latest(run_id)
        assert head is not None and head.state["i"] == n
        trail = head.state["trail"]
        assert [step for step, _, _ in trail] == list(range(n)), trail
        fences = [fence for _, _, fence in trail]
        assert fences == sorted(fences), trail
        history = store.history(run_id, limit=1000)
        assert len(history) == n + 1, [(c.id, c.step) for c in history]
        parents = [c.parent_id for c in history]
        assert parents.count(None) == 1 and len(set(parents)) == len(parents)  # linear
        by_key: dict[str, list[str]] = {}
        for line in journal:
            kind, _, rest = line.partition(" ")
            key = rest.split(" ")[0]
            if kind in ("call", "recorded") and key.startswith(f"{run_id}:"):
                by_key.setdefault(key, []).append(kind)
        assert len(by_key) >= n, by_key
        for key, kinds in by_key.items():
            first = kinds.index("recorded") if "recorded" in kinds else len(kinds)
            assert "call" not in kinds[first:], (key, kinds)  # no call once recorded
        trails.append(trail)
    return trails


def effect_calls(cluster: Cluster, run_id: str) -> list[list[str]]:
    return [line.split() for line in cluster.journal.read_text().splitlines()
            if line.startswith("call ") and line.split()[1].startswith(f"{run_id}:")]


@pytest.mark.parametrize("where", ["step", "commit", "renewal"])
def test_a_host_cut_off_holding_a_run_loses_it_and_writes_nothing_after(
    cluster: Cluster, where: str
) -> None:
    """The holder's network is cut during a step, while its checkpoint is being committed,
    or during a step longer than the lease (its renewals fail); healed only once another
    host finished the run: its late commit is refused, nothing of it is written."""
    seconds = {"step": 0.3, "commit": 0.3, "renewal": 3 * TTL}[where]
    (run_id,) = enqueue(cluster, 4, hold=[1, where, seconds])
    victim = cluster.host(wait("the hold", marker(cluster, run_id, where)))
    victim.partition()
    wait("another host to finish the run", completed(cluster, [run_id]))
    victim.heal()
    time.sleep(seconds + TTL + 1.0)  # the victim's step ends and its commit is tried
    (trail,) = check_runs(cluster, [run_id], 4)
    steps_by = {step: host for step, host, _ in trail}
    assert steps_by[0] == victim.name and steps_by[3] != victim.name, trail
    assert cluster.procs[victim.name].poll() is None  # the victim's worker goes on
    # The victim's later writes were all refused (or never tried): it is still a worker
    # that takes new runs once healed.
    (after,) = enqueue(cluster, 1, count=1)
    wait("a run after the heal", completed(cluster, [after]))


def test_a_host_that_stops_hearing_the_server_mid_claim_blocks_no_run(
    cluster: Cluster
) -> None:
    """Runs are queued and at once one host stops hearing the server (its packets still
    arrive): a claim it sent then reaches the server, but the answer never comes back. The
    claim's transaction was left open on the server, its runs locked, skipped by the
    other hosts for as long as the partition lasted (3 of 8 rounds stuck); now the claim
    commits with its statement, the runs are the host's until the lease expires, and the
    other hosts run every one of them while it stays cut off. Three rounds."""
    victim = cluster.host("h1")
    pid = cluster.pid_of("h1")
    held: set[str] = set()
    for _ in range(3):
        ids = enqueue(cluster, 2, count=12, step_s=0.2)
        victim.partition("in")

        def all_done(ids: list[str] = ids) -> bool:
            for run_id in ids:
                owner = cluster.store.get_run(run_id).owner or ""
                if owner.split(":")[1:2] == [str(pid)]:
                    held.add(run_id)
            return completed(cluster, ids)()

        wait("the other hosts to finish every run", all_done, timeout=30)
        victim.heal()
        time.sleep(TTL + 1.0)
        check_runs(cluster, ids, 2)
    print(f"runs leased to the host while it heard nothing: {len(held)}")


def test_packet_loss_and_delay_lose_and_repeat_nothing(cluster: Cluster) -> None:
    """30% packet loss on one host, 500 ms on every chunk to and from another, the third
    clean: every run completes, exactly once."""
    cluster.host("h1").lose(30)
    cluster.host("h2").delay = 0.5
    ids = enqueue(cluster, 3, count=9)
    wait("every run", completed(cluster, ids), timeout=80)
    cluster.host("h1").heal()
    cluster.host("h2").delay = 0.0
    time.sleep(TTL)
    trails = check_runs(cluster, ids, 3)
    assert {host for trail in trails for _, host, _ in trail} >= {"h3"}
