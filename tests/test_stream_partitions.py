"""Stream jobs on three hosts under a network partition (#34).

Three hosts (network namespaces with their own host names, tests/netsim.py) each run a
stream job process (tests/stream_partition_worker.py: a count per user over a Redis stream,
every fifth count emitted to a RedisStreamSink, PostgreSQL store, 2 s leases). Both servers
listen on loopback only; each host reaches them through forwarders on its veth address.

The network of a host that owns partitions is cut (to PostgreSQL and to Redis alike) while
records keep arriving; the other hosts must wait for its leases to expire (its host name is
not theirs), take its partitions and go on from their last checkpoints. Then the network
heals: the cut-off process, which still believes it owns them, must write nothing (its
commits are refused by the fencing token, so it delivers nothing either). At the end the
state equals the uninterrupted counts and the sink holds every output exactly once: no
duplicate, no gap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("redis")

import netsim
import pitstop
from conftest import BACKENDS, PG_URL, ROOT, drop_pg_schema, pg_schema_url
from streamkill import EMIT_EVERY, REDIS_URL, _caught_up, _cleanup, make_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif("postgres" not in BACKENDS, reason="needs the PostgreSQL server"),
]

TTL = 2.0
PARTITIONS = 6
REDIS = ("127.0.0.1", 6379)


def wait(what: str, check: Callable[[], Any], timeout: float = 40.0,
         detail: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {detail()}"
        time.sleep(0.1)


def test_partitions_of_a_cut_off_host_move_without_a_duplicate_or_gap(
    tmp_path: Any,
) -> None:
    import random

    import redis

    from pitstop.stream import partition_of

    why = netsim.unavailable()
    if why is not None:
        pytest.skip(f"cannot simulate hosts: {why}")
    name = f"sp{uuid.uuid4().hex[:8]}"
    schema = f"spart_{uuid.uuid4().hex[:10]}"
    journal = tmp_path / "journal"
    journal.touch()
    client = redis.Redis.from_url(REDIS_URL)
    _cleanup(client, name, PARTITIONS)
    rng = random.Random(34)
    expected: Counter[str] = Counter()
    last_ids: dict[int, Any] = {}

    def produce(count: int) -> None:
        users = [f"user{rng.randrange(300)}" for _ in range(count)]
        expected.update(users)
        for first in range(0, count, 200):
            with client.pipeline(transaction=False) as pipe:
                for user in users[first:first + 200]:
                    pipe.xadd(f"{name}:{partition_of(user, PARTITIONS)}",
                              {"user": user, "key": user})
                pipe.execute()
            time.sleep(0.05)
        for p in range(PARTITIONS):
            last = client.xrevrange(f"{name}:{p}", count=1)
            if last:
                last_ids[p] = last[0][0]

    store = pitstop.open_store(pg_schema_url(schema))
    procs: dict[str, subprocess.Popen[str]] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        str(ROOT / "tests")]),
           "PARTITION_TTL": str(TTL)}

    def owners() -> dict[int, str]:
        return {p: (store.get_run(f"{name}/{p}").owner or "") for p in range(PARTITIONS)}

    def explain() -> str:
        """Who owns what, how far each partition got, the tail of every host's log."""
        heads = {p: getattr(store.latest(f"{name}/{p}"), "state", {}).get("position")
                 for p in range(PARTITIONS)}
        logs = {h: (tmp_path / f"{h}.log").read_text().splitlines()[-4:] for h in procs}
        return f"owners {owners()}, positions {heads}, wanted {last_ids}, logs {logs}"

    try:
        with netsim.Network(3, also=(REDIS,)) as net:
            try:
                for host in net.hosts:
                    base = PG_URL.replace("127.0.0.1:5432", f"{host.gateway}:{host.port}")
                    sep = "&" if "?" in base else "?"
                    url = f"{base}{sep}schema={schema}&connect_timeout=2&statement_timeout=2"
                    redis_url = f"redis://{host.gateway}:{host.ports[REDIS[1]]}/0"
                    procs[host.name] = subprocess.Popen(
                        [*host.exec_prefix(), "unshare", "--uts", "--", "sh", "-c",
                         'hostname "$0" && exec "$@"', f"pst-{host.name}", sys.executable,
                         str(ROOT / "tests" / "stream_partition_worker.py"), url, redis_url,
                         name, str(PARTITIONS), host.name, str(journal)],
                        env=env, text=True, stdout=subprocess.DEVNULL,
                        stderr=open(tmp_path / f"{host.name}.log", "w"),  # noqa: SIM115
                    )
                wait("the job processes", lambda: all(
                    f"up {h.name} " in journal.read_text() for h in net.hosts), timeout=60)
                produce(3000)
                wait("every partition to catch up",
                     lambda: _caught_up(store, name, PARTITIONS, last_ids), detail=explain)
                before = owners()
                victim = next(h for h in net.hosts
                              if any(o.startswith(f"pst-{h.name}:") for o in before.values()))
                taken = [p for p, o in before.items() if o.startswith(f"pst-{victim.name}:")]
                victim.partition()  # PostgreSQL and Redis alike
                produce(3000)

                def moved() -> bool:
                    now = owners()
                    return all(now[p] and not now[p].startswith(f"pst-{victim.name}:")
                               for p in taken) and _caught_up(store, name, PARTITIONS,
                                                              last_ids)

                wait("the other hosts to take the partitions over", moved, timeout=45,
                     detail=explain)
                victim.heal()
                time.sleep(TTL + 3.0)  # the healed process tries its commits: refused
                produce(1000)
                wait("every partition to catch up after the heal",
                     lambda: _caught_up(store, name, PARTITIONS, last_ids), detail=explain)
                cut = len(journal.read_text().splitlines())
                assert procs[victim.name].poll() is None  # it went on, as a process should
            finally:
                for proc in procs.values():
                    proc.send_signal(signal.SIGTERM)
                for proc in procs.values():
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        # Whatever is left (an outbox not delivered yet): one more run, uninterrupted.
        job = make_job(name, PARTITIONS)
        job.run(store, idle_exit=0.5)
        state = job.state(store)
    finally:
        store.close()
        drop_pg_schema(schema)

    saves = [line.split() for line in journal.read_text().splitlines()[:cut]
             if line.startswith("saved ")]
    for p in taken:
        lines = [(host, int(token)) for _, host, part, token in saves if int(part) == p]
        tokens = [token for _, token in lines]
        assert tokens == sorted(tokens), (p, lines)  # fences never go down
        others = [i for i, (host, _) in enumerate(lines) if host != victim.name]
        assert others, (p, lines)  # another host wrote the partition...
        late = [line for line in lines[others[0]:] if line[0] == victim.name]
        assert not late, (p, lines)  # ...and the cut-off host nothing after it
    lost = (tmp_path / f"{victim.name}.log").read_text().count("lost its lease")
    print(f"partitions taken from {victim.name}: {taken}; its refused commits: {lost}")
    found = client.xrange(f"{name}-out")
    ids = Counter(fields[b"id"] for _, fields in found)
    pairs = Counter((fields[b"key"].decode(), json.loads(fields[b"value"]))
                    for _, fields in found)
    wanted = Counter((user, n) for user, total in expected.items()
                     for n in range(EMIT_EVERY, total + 1, EMIT_EVERY))
    assert state == dict(expected)
    assert not [i for i, n in ids.items() if n > 1]  # no duplicate
    assert not wanted - pairs and not pairs - wanted  # no gap, nothing unexpected
    assert len(found) == sum(wanted.values())
    _cleanup(client, name, PARTITIONS)
    client.close()
