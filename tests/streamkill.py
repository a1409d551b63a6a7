"""Kill test of stream jobs: real processes running ``job.run`` on a shared store, SIGKILLed
at random and restarted while a producer writes events; afterwards the committed state must
equal the uninterrupted counts and the sink must hold each output exactly once.

Used by tests/test_stream_kill.py (lean) and bench/stream.py --kills (full size). Run as a
script, it is one worker: ``python streamkill.py worker STORE_URL REDIS_URL NAME PARTITIONS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

REDIS_URL = os.environ.get("PITSTOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("PITSTOP_TEST_NATS_URL", "nats://127.0.0.1:4222")
EMIT_EVERY = 5
"""A key's count emits an output at every multiple of this."""


def make_job(name: str, partitions: int, redis_url: str = REDIS_URL, *,
             every: int = 500, broker: str = "redis") -> Any:
    from pitstop import stream

    source: Any = (
        stream.RedisStream(redis_url, name, partitions=partitions) if broker == "redis"
        else stream.JetStream(NATS_URL, name, partitions=partitions)
    )
    job = stream.Job(
        name,
        source=source,
        sink=stream.RedisStreamSink(redis_url, f"{name}-out"),
        every=every, seconds=1.0, lease_ttl=5.0,
    )

    @job.handler
    def count(state: Any, record: Any, emit: Any) -> None:
        user = record.value["user"]
        state[user] = state.get(user, 0) + 1
        if state[user] % EMIT_EVERY == 0:
            emit(user, state[user])

    return job


def worker(store_url: str, redis_url: str, name: str, partitions: int, broker: str) -> None:
    import pitstop

    store = pitstop.open_store(store_url)
    make_job(name, partitions, redis_url, broker=broker).run(store)
    store.close()


@dataclass
class KillResult:
    events: int
    kills: int
    seconds: float
    state_exact: bool
    outputs_expected: int
    outputs_found: int
    duplicates: int
    missing: int
    unexpected: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.state_exact and not self.duplicates and not self.missing
                and not self.unexpected and self.outputs_found == self.outputs_expected)


def run_kill_test(
    store_url: str, name: str, *, partitions: int = 4, events: int = 20_000,
    keys: int = 1_000, kills: int = 8, processes: int = 2, seed: int = 0,
    redis_url: str = REDIS_URL, pace: float = 6.0, timeout: float = 300.0,
    broker: str = "redis",
) -> KillResult:
    """Produce ``events`` over about ``pace`` seconds while ``processes`` workers run the
    job and ``kills`` SIGKILLs hit random ones (each restarted at once)."""
    import redis

    import pitstop
    from pitstop.stream import partition_of

    rng = random.Random(seed)
    client = redis.Redis.from_url(redis_url)
    _cleanup(client, name, partitions)
    users = [f"user{rng.randrange(keys)}" for _ in range(events)]
    expected = Counter(users)
    last_ids: dict[int, Any] = {}

    def produce() -> None:
        if broker == "jetstream":
            import asyncio

            asyncio.run(produce_jetstream())
            return
        chunk = max(1, events // 40)
        for first in range(0, events, chunk):
            with client.pipeline(transaction=False) as pipe:
                for user in users[first:first + chunk]:
                    pipe.xadd(f"{name}:{partition_of(user, partitions)}",
                              {"user": user, "key": user})
                pipe.execute()
            time.sleep(pace / 40)
        for p in range(partitions):
            last = client.xrevrange(f"{name}:{p}", count=1)
            if last:
                last_ids[p] = last[0][0]

    async def produce_jetstream() -> None:
        import nats

        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        chunk = max(1, events // 40)
        for first in range(0, events, chunk):
            acks = await asyncio_gather(*(
                js.publish(f"{name}.{partition_of(user, partitions)}",
                           json.dumps({"user": user}).encode(), headers={"key": user})
                for user in users[first:first + chunk]
            ))
            for user, ack in zip(users[first:first + chunk], acks, strict=True):
                last_ids[partition_of(user, partitions)] = ack.seq
            await asyncio_sleep(pace / 40)
        await nc.close()

    if broker == "jetstream":
        _jetstream_stream(name)

    script = os.path.abspath(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, script, "worker", store_url, redis_url, name, str(partitions),
             broker],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    started = time.monotonic()
    procs = [spawn() for _ in range(processes)]
    producer = threading.Thread(target=produce)
    producer.start()
    killed = 0
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, 2 * pace / max(kills, 1)))
            i = rng.randrange(len(procs))
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            killed += 1
            procs[i] = spawn()
        producer.join()
        store = pitstop.open_store(store_url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _caught_up(store, name, partitions, last_ids):
                break
            time.sleep(0.3)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    errors = [p.stderr.read().decode(errors="replace") for p in procs if p.stderr]
    # Whatever is left (an outbox delivered by nobody yet): one more run, uninterrupted.
    job = make_job(name, partitions, redis_url, broker=broker)
    job.run(store, idle_exit=0.5)
    seconds = time.monotonic() - started
    state = job.state(store)
    store.close()
    found = client.xrange(f"{name}-out")
    ids = Counter(fields[b"id"] for _, fields in found)
    pairs = Counter((fields[b"key"].decode(), json.loads(fields[b"value"]))
                    for _, fields in found)
    wanted = Counter((user, n) for user, total in expected.items()
                     for n in range(EMIT_EVERY, total + 1, EMIT_EVERY))
    result = KillResult(
        events=events, kills=killed, seconds=seconds,
        state_exact=state == dict(expected),
        outputs_expected=sum(wanted.values()), outputs_found=len(found),
        duplicates=sum(n - 1 for n in ids.values() if n > 1),
        missing=sum((wanted - pairs).values()), unexpected=sum((pairs - wanted).values()),
        problems=[e for e in errors if "Traceback" in e],
    )
    if result.ok:
        _cleanup(client, name, partitions)
        if broker == "jetstream":
            _jetstream_stream(name, create=False)
    client.close()
    return result


def _caught_up(store: Any, name: str, partitions: int, last_ids: dict[int, bytes]) -> bool:
    for p in range(partitions):
        want = last_ids.get(p)
        if want is None:
            continue
        try:
            head = store.latest(f"{name}/{p}")
        except Exception:
            return False
        if head is None or head.state.get("position") != (
                want.decode() if isinstance(want, bytes) else want):
            return False
    return True


async def asyncio_gather(*aws: Any) -> list[Any]:
    import asyncio

    return list(await asyncio.gather(*aws))


async def asyncio_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def _jetstream_stream(name: str, *, create: bool = True) -> None:
    """(Re)create the JetStream stream ``name`` on subjects ``name.>`` (or just delete it)."""
    import asyncio

    async def go() -> None:
        import nats

        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        with contextlib.suppress(Exception):  # there was none
            await js.delete_stream(name)
        if create:
            await js.add_stream(name=name, subjects=[f"{name}.>"])
        await nc.close()

    asyncio.run(go())


def _cleanup(client: Any, name: str, partitions: int) -> None:
    names = [f"{name}:{p}" for p in range(partitions)] + [f"{name}-out"]
    names += [k.decode() for k in client.scan_iter(f"{name}-out:delivered:*")]
    client.delete(*names)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
