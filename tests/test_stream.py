"""pitstop.stream: positions, keyed state and outbox in one checkpoint per partition, on the
real Redis (127.0.0.1:6379) and real stores; each test uses its own stream names."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import stream
from pitstop.store import Store

REDIS_URL = "redis://127.0.0.1:6379/0"
redis = pytest.importorskip("redis")


@pytest.fixture
def client() -> Iterator[Any]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


@pytest.fixture
def name(client: Any) -> Iterator[str]:
    """A stream (and job) name of this test alone; its keys are deleted afterwards."""
    n = f"t{uuid.uuid4().hex[:10]}"
    yield n
    keys = list(client.scan_iter(f"{n}*"))
    if keys:
        client.delete(*keys)


def counter_job(name: str, *, partitions: int = 2, sink: bool = True, **options: Any
                ) -> stream.Job:
    job = stream.Job(
        name,
        source=stream.RedisStream(REDIS_URL, name, partitions=partitions),
        sink=stream.RedisStreamSink(REDIS_URL, f"{name}-out") if sink else None,
        **{"every": 100, "seconds": 1.0, **options},
    )

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        user = record.value["user"]
        state[user] = state.get(user, 0) + 1
        emit(user, {"count": state[user]})

    return job


def produce(client: Any, name: str, users: list[str], partitions: int = 2) -> None:
    with client.pipeline(transaction=False) as pipe:
        for user in users:
            pipe.xadd(f"{name}:{stream.partition_of(user, partitions)}", {"user": user})
        pipe.execute()


@pytest.mark.slow
def test_counts_outputs_and_seeks_on_restart(store: Store, client: Any, name: str) -> None:
    users = [f"u{i % 37}" for i in range(1000)]
    produce(client, name, users)
    job = counter_job(name)
    report = job.run(store, idle_exit=0.2)
    assert report.records == 1000
    assert job.state(store) == Counter(users)
    # A restart seeks to the stored positions: only the new records are read.
    produce(client, name, users[:10])
    report = counter_job(name).run(store, idle_exit=0.2)
    assert report.records == 10
    assert job.state(store) == Counter(users) + Counter(users[:10])
    out = client.xrange(f"{name}-out")
    assert len(out) == 1010
    assert len({f[b"id"] for _, f in out}) == 1010
    last = {}
    for _, fields in out:
        last[fields[b"key"].decode()] = json.loads(fields[b"value"])["count"]
    assert last == Counter(users) + Counter(users[:10])


def test_partitions_are_runs_with_position_in_their_checkpoint(
    store: Store, client: Any, name: str
) -> None:
    produce(client, name, ["a", "b", "c", "d"])
    counter_job(name).run(store, idle_exit=0.2)
    for p in range(2):
        run = store.get_run(f"{name}/{p}")
        assert run.workflow == f"stream:{name}"
        assert run.owner is None  # given up at the end
        head = store.latest(f"{name}/{p}")
        assert head is not None
        last = client.xrevrange(f"{name}:{p}", count=1)
        assert head.state["position"] == (last[0][0].decode() if last else None)


def test_a_checkpoint_stores_only_the_changed_keys(store: Store) -> None:
    items = [(f"k{i}", 1) for i in range(5000)] + [("k1", 1), ("k2", 1)]
    job = stream.Job("keys", source=stream.Iterable(items), every=5000, seconds=60)

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        state[record.key] = state.get(record.key, 0) + record.value

    job.run(store, idle_exit=0.1)
    head = store.latest("keys/0")
    assert head is not None
    assert "full" not in head.state
    assert head.state["changes"] == {"k1": 2, "k2": 2}
    history = store.history("keys/0")
    # A base (the empty first checkpoint), the 5,000 new keys, then the two changed ones.
    assert len(history) == 3
    state = job.state(store)
    assert len(state) == 5000 and state["k1"] == 2 and state["k0"] == 1


def test_deleted_keys_and_a_new_base(store: Store) -> None:
    items = [(f"k{i % 301}", i) for i in range(6000)]
    job = stream.Job("dels", source=stream.Iterable(items), every=100, seconds=60,
                     keep_history=True)

    @job.handler
    def keep_odd(state: Any, record: stream.Record, emit: Any) -> None:
        if record.value % 2:
            state[record.key] = record.value
        else:
            state.pop(record.key, None)

    job.run(store, idle_exit=0.1)
    expected: dict[str, int] = {}
    for key, value in items:
        if value % 2:
            expected[key] = value
        else:
            expected.pop(key, None)
    assert job.state(store) == expected
    # 60 checkpoints of ~100 key writes over a ~150-key state: new bases were written.
    bases = [c for c in store.get_many(s.id for s in store.history("dels/0")).values()
             if "full" in c.state]
    assert len(bases) > 1
    # Without keep_history, what precedes the last base is deleted when a base is written.
    pruned = stream.Job("dels2", source=stream.Iterable(items), every=100, seconds=60)
    pruned.handler(keep_odd)
    pruned.run(store, idle_exit=0.1)
    assert pruned.state(store) == expected
    assert len(store.history("dels2/0")) < len(store.history("dels/0")) // 2


def test_iterable_resumes_after_its_checkpoint(store: Store) -> None:
    items = [(f"k{i % 7}", 1) for i in range(700)]
    seen: list[Any] = []

    def make() -> stream.Job:
        job = stream.Job("it", source=stream.Iterable(items, partitions=3), every=50)

        @job.handler
        def count(state: Any, record: stream.Record, emit: Any) -> None:
            seen.append(record.position)
            state[record.key] = state.get(record.key, 0) + 1

        return job

    make().run(store, idle_exit=0.1)
    assert len(seen) == 700
    make().run(store, idle_exit=0.1)
    assert len(seen) == 700
    assert make().state(store) == Counter(k for k, _ in items)


@pytest.mark.slow
def test_handler_error_stops_its_partition_at_its_last_checkpoint(
    store: Store, client: Any, name: str
) -> None:
    users = [f"u{i}" for i in range(400)]
    bad = next(u for u in users[200:] if stream.partition_of(u, 2) == 1)
    produce(client, name, users)
    job = stream.Job(name, source=stream.RedisStream(REDIS_URL, name, partitions=2),
                     every=50, seconds=1.0, retries=0)

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        if record.value["user"] == bad:
            raise ValueError(f"no budget for {bad}")
        state[record.value["user"]] = 1

    report = job.run(store, idle_exit=0.2)
    assert list(report.failed) == [1]
    assert "no budget" in report.failed[1]
    run = store.get_run(f"{name}/1")
    assert run.status is pitstop.RunStatus.FAILED
    head = store.latest(f"{name}/1")
    assert head is not None and "no budget" in head.metadata["error"]["message"]
    # The failed partition stayed at a checkpoint before the bad record; the other finished.
    ones = [u for u in users if stream.partition_of(u, 2) == 1]
    held = job.partition_state(store, 1)
    assert bad not in held and set(held) <= set(ones[: ones.index(bad)])
    zeros = {u for u in users if stream.partition_of(u, 2) == 0}
    assert set(job.partition_state(store, 0)) == zeros

    if not store.url.startswith("memory:"):
        from clitools import pitstop_exe

        shown = pitstop_exe("show", f"{name}/1", store=store.url)
        assert "no budget" in shown.out, shown


@pytest.mark.slow
def test_handler_errors_are_retried_from_the_last_checkpoint(
    store: Store, client: Any, name: str
) -> None:
    users = [f"u{i % 50}" for i in range(600)]
    produce(client, name, users)
    ones = [u for u in users if stream.partition_of(u, 2) == 1]
    flaky_at, broken_at = 130, len(ones) - 60  # the partition's 131st and 60th-last records
    job = stream.Job(name, source=stream.RedisStream(REDIS_URL, name, partitions=2),
                     sink=stream.RedisStreamSink(REDIS_URL, f"{name}-out"), every=40,
                     seconds=5.0, retries=2, retry_backoff=0.05)
    seen: Counter[int] = Counter()

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        user = record.value["user"]
        state[user] = state.get(user, 0) + 1  # applied, then the raise: rolled back
        emit(user, {"count": state[user]})
        if record.partition == 1:
            nth = ones_index[record.position]
            seen[nth] += 1
            if nth == flaky_at and seen[nth] <= 2:
                raise ConnectionError("flaky service")
            if nth == broken_at:
                raise ValueError("always broken")

    ids = [entry for entry, _ in client.xrange(f"{name}:1")]
    ones_index = {i.decode(): n for n, i in enumerate(ids)}
    report = job.run(store, idle_exit=0.5)
    # The flaky record went through on its third attempt; the broken one failed three times
    # (retries=2) and stopped its partition; partition 0 finished.
    assert seen[flaky_at] == 3 and seen[broken_at] == 3
    assert list(report.failed) == [1] and "after 3 attempts" in report.failed[1]
    head = store.latest(f"{name}/1")
    assert head is not None and head.metadata["error"]["attempt"] == 3
    assert store.get_run(f"{name}/1").status is pitstop.RunStatus.FAILED
    # State exact: nothing of a failed attempt stayed (it was rolled back to a checkpoint).
    done = head.state["offset"]
    assert flaky_at < done <= broken_at
    assert job.partition_state(store, 1) == Counter(ones[:done])
    zeros = [u for u in users if stream.partition_of(u, 2) == 0]
    assert job.partition_state(store, 0) == Counter(zeros)
    # The sink holds each committed output once, none of a rolled-back attempt.
    out = client.xrange(f"{name}-out")
    assert len(out) == len(zeros) + done
    assert len({f[b"id"] for _, f in out}) == len(out)


def test_changed_partition_count_is_refused(store: Store, client: Any, name: str) -> None:
    produce(client, name, ["a"])
    counter_job(name, partitions=2).run(store, idle_exit=0.1)
    with pytest.raises(stream.PartitionCountError, match=r"has 3 partitions"):
        counter_job(name, partitions=3).run(store, idle_exit=0.1)
    with pytest.raises(stream.PartitionCountError):
        counter_job(name, partitions=1).run(store, idle_exit=0.1)


def test_trimmed_position_is_an_error_unless_skipped(
    store: Store, client: Any, name: str
) -> None:
    produce(client, name, [f"u{i}" for i in range(20)], partitions=1)
    counter_job(name, partitions=1, sink=False).run(store, idle_exit=0.1)
    produce(client, name, [f"v{i}" for i in range(20)], partitions=1)
    client.xtrim(f"{name}:0", maxlen=5, approximate=False)
    report = counter_job(name, partitions=1, sink=False).run(store, idle_exit=0.1)
    assert "trimmed" in report.failed[0]
    report = counter_job(name, partitions=1, sink=False, on_trimmed="skip").run(
        store, idle_exit=0.1)
    assert report.records == 5 and not report.failed


def test_start_at_end_skips_what_is_there(store: Store, client: Any, name: str) -> None:
    produce(client, name, ["a", "b", "c"], partitions=1)
    report = counter_job(name, partitions=1, start="end").run(store, idle_exit=0.1)
    assert report.records == 0
    produce(client, name, ["z"], partitions=1)
    report = counter_job(name, partitions=1, start="end").run(store, idle_exit=0.1)
    assert report.records == 1


def test_undecodable_records_fail_or_go_to_the_dead_letter_stream(
    store: Store, client: Any, name: str
) -> None:
    client.xadd(f"{name}:0", {"user": "a"})
    client.xadd(f"{name}:0", {"user": b"\xff\xfe"})
    client.xadd(f"{name}:0", {"user": "b"})
    job = counter_job(name, partitions=1, sink=False)
    report = job.run(store, idle_exit=0.1)
    assert "not UTF-8" in report.failed[0]
    job = stream.Job(name, source=stream.RedisStream(REDIS_URL, name, partitions=1,
                                                      undecodable="dead-letter"))
    job.handler(lambda state, record, emit: state.__setitem__(record.value["user"], 1))
    report = job.run(store, idle_exit=0.1)
    assert not report.failed
    assert job.state(store) == {"a": 1, "b": 1}
    letters = client.xrange(f"{name}:dead-letter")
    assert len(letters) == 1 and letters[0][1][b"field:user"] == b"\xff\xfe"


def test_reads_the_same_records_with_and_without_the_read_script(
    client: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RedisStream reads through a script (XRANGE, the reply packed by the server's
    cmsgpack: unpacked in C instead of redis-py's parser); a user whose ACL refuses
    scripts reads the same records with XREAD."""
    produce(client, name, [f"u{i}" for i in range(250)], partitions=2)
    client.xadd(f"{name}:0", {"user": "k", "key": "the-key", "n": "1"})
    user = f"noscript-{name}"
    client.acl_setuser(user, enabled=True, nopass=True, keys=["*"],
                       commands=["+@all", "-@scripting"])
    try:
        answers = []
        for url in (REDIS_URL, f"redis://{user}@127.0.0.1:6379/0"):
            source = stream.RedisStream(url, name, partitions=2)
            positions: dict[int, Any] = {0: None, 1: None}
            records: list[stream.Record] = []
            with caplog.at_level("INFO", logger="pitstop.stream"):
                while batch := source.read(positions, 100, 0.0):
                    for partition, got in batch.items():
                        records += got
                        positions[partition] = got[-1].position
            answers.append((records, source._script is not False))
            source.close()
    finally:
        client.acl_deluser(user)
    (scripted, used_script), (plain, used_then) = answers
    assert used_script and not used_then
    assert "the read script was refused" in caplog.text
    assert scripted == plain and len(scripted) == 251
    keyed = [r for r in scripted if r.key is not None]
    assert [r.value for r in keyed] == [{"user": "k", "key": "the-key", "n": "1"}]
    assert keyed[0].key == "the-key" and keyed[0].partition == 0


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_unreachable_broker_is_one_line_and_retried(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    job = stream.Job("down", source=stream.RedisStream("redis://127.0.0.1:1/0", "x"))
    job.handler(lambda state, record, emit: None)
    threading.Timer(1.5, job.stop).start()
    with caplog.at_level("ERROR", logger="pitstop.stream"):
        job.run(store)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("does not answer" in line and "retrying in" in line
                         for line in lines)
    assert all("\n" not in line for line in lines)


def test_postgres_sink_rows_exactly_once(store: Store, client: Any, name: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from conftest import PG_URL

    table = f"out_{name}"
    produce(client, name, [f"u{i % 5}" for i in range(300)])
    job = counter_job(name)
    job.sink = stream.PostgresSink(PG_URL, table)
    job.run(store, idle_exit=0.2)
    # Delivering the same outputs again (a restart after a crash) adds nothing.
    outputs = [stream.Output(name, 0, seq, "k", {"n": seq}) for seq in range(3)]
    job.sink.deliver(name, 0, outputs)
    try:
        with psycopg.connect(PG_URL) as conn:
            rows = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
    finally:
        job.sink.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_delivered")
    assert rows == (300, 300)


@pytest.mark.slow
def test_jetstream_counts_and_seeks_by_sequence(store: Store, name: str) -> None:
    pytest.importorskip("nats")
    import asyncio

    import nats

    async def publish(users: list[str], *, create: bool = False, delete: bool = False
                      ) -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        if create:
            await js.add_stream(name=name, subjects=[f"{name}.>"])
        for user in users:
            await js.publish(f"{name}.{stream.partition_of(user, 2)}",
                             json.dumps({"user": user}).encode(), headers={"key": user})
        if delete:
            await js.delete_stream(name)
        await nc.close()

    users = [f"u{i % 11}" for i in range(300)]
    asyncio.run(publish(users, create=True))
    try:
        def make() -> stream.Job:
            job = stream.Job(name, source=stream.JetStream("nats://127.0.0.1:4222", name,
                                                           partitions=2), every=40)

            @job.handler
            def count(state: Any, record: stream.Record, emit: Any) -> None:
                assert record.key == record.value["user"]
                state[record.key] = state.get(record.key, 0) + 1

            return job

        assert make().run(store, idle_exit=0.2).records == 300
        asyncio.run(publish(users[:5]))
        assert make().run(store, idle_exit=0.2).records == 5
        assert make().state(store) == Counter(users) + Counter(users[:5])
        # `pitstop stream status`'s lag: the subject's messages after each position.
        from pitstop.stream.status import job_status

        behind = [f"v{i}" for i in range(9)]
        asyncio.run(publish(behind))
        parts = job_status(store, name)
        assert [p.lag for p in parts] == [
            sum(stream.partition_of(u, 2) == i for u in behind) for i in (0, 1)]
        assert [p.lag for p in job_status(store, name, lag=False)] == [None, None]
    finally:
        asyncio.run(publish([], delete=True))


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_stream_status_command(store: Store, client: Any, name: str) -> None:
    from clitools import pitstop_exe

    produce(client, name, [f"u{i % 9}" for i in range(500)])
    counter_job(name, sink=False, every=100).run(store, idle_exit=0.1)
    produce(client, name, ["late"] * 7)
    result = pitstop_exe("stream", "status", name, "--json", store=store.url)
    assert result.code == 0, result
    parts = result.json["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    assert sum(p["records"] for p in parts) == 500
    assert sum(p["lag"] for p in parts) == 7
    assert all(p["outbox"] == 0 and p["status"] == "running" for p in parts)
    assert all(p["records_per_second"] is not None for p in parts)
    text = pitstop_exe("stream", "status", name, store=store.url)
    assert text.code == 0 and "PARTITION" in text.out
    missing = pitstop_exe("stream", "status", "nope", store=store.url)
    assert missing.code == 2 and "no stream job 'nope'" in missing.err


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_partition_position_lag_and_rate_in_runs_and_show(
    store: Store, client: Any, name: str
) -> None:
    from clitools import pitstop_exe
    from pitstop.stream.status import RATE_CHECKPOINTS

    users = [f"u{i % 9}" for i in range(600)]
    produce(client, name, users)
    counter_job(name, sink=False, every=25).run(store, idle_exit=0.1)
    late = ["x1", "x2", "x3", "x4", "x5", "x6", "x7"]
    produce(client, name, late)  # in the streams, not read yet: the lag
    behind = {p: sum(stream.partition_of(u, 2) == p for u in late) for p in (0, 1)}

    listed = pitstop_exe("runs", "--json", store=store.url)
    assert listed.code == 0, listed
    parts = {r["id"]: r for r in listed.json["runs"]}
    for p in (0, 1):
        run = parts[f"{name}/{p}"]
        head = store.history(f"{name}/{p}", limit=RATE_CHECKPOINTS)
        figures = [h.metadata["stream"] for h in head]
        seconds = (head[0].created_at - head[-1].created_at).total_seconds()
        assert len(head) == RATE_CHECKPOINTS  # (a rate over several checkpoints)
        assert run["stream"]["position"] == figures[0]["position"]
        assert run["stream"]["records"] == figures[0]["records"]
        assert run["stream"]["lag"] == behind[p]
        assert run["stream"]["records_per_second"] == pytest.approx(
            (figures[0]["records"] - figures[-1]["records"]) / seconds)
        assert run["progress"] == f"{figures[0]['records']:,} records · at " \
            f"{figures[0]['position']} · lag {behind[p]} · " \
            f"{run['stream']['records_per_second']:,.0f}/s"
    text = pitstop_exe("runs", store=store.url)
    assert text.code == 0 and f"· lag {behind[0]} ·" in text.out, text.out
    assert f"pitstop stream status {name}" in text.out  # (the line fits, its hint too)
    unasked = pitstop_exe("runs", "--json", "--no-lag", store=store.url)
    assert {r["stream"]["lag"] for r in unasked.json["runs"]} == {None}

    shown = pitstop_exe("show", f"{name}/1", "--json", store=store.url)
    assert shown.code == 0, shown
    assert shown.json["stream"]["lag"] == behind[1]
    assert shown.json["stream"]["records_per_second"] > 0
    text = pitstop_exe("show", f"{name}/1", store=store.url)
    assert f"{behind[1]} records behind" in text.out and "records/s" in text.out
    assert shown.json["stream"]["position"] in text.out
    # Not a partition: no stream figures, and nothing asked of a broker.
    other = pitstop_exe("runs", "--json", "--workflow", "none", store=store.url)
    assert other.code == 0 and other.json["runs"] == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_inspector_shows_the_job_partitions(store: Store, client: Any, name: str) -> None:
    pytest.importorskip("fastapi", reason="the ui extra is not installed")
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    users = [f"u{i % 9}" for i in range(400)]
    produce(client, name, users)
    job = counter_job(name, every=50, retries=0)
    bad = next(u for u in users if stream.partition_of(u, 2) == 1)

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        if record.value["user"] == bad and state.get(bad, 0) >= 3:
            raise ValueError(f"no more {bad}")
        state[record.value["user"]] = state.get(record.value["user"], 0) + 1

    report = job.run(store, idle_exit=0.2)
    assert set(report.failed) == {1}
    produce(client, name, ["x"] * 5)  # behind the positions: lag
    with TestClient(create_app(store)) as http:
        found = http.get(f"/api/streams/{name}").json()
        assert found["job"] == name
        zero, one = found["partitions"]
        assert (zero["partition"], zero["status"], one["status"]) == (0, "running", "failed")
        assert zero["records"] == sum(1 for u in users if stream.partition_of(u, 2) == 0)
        assert zero["checkpoint_age"] >= 0 and zero["outbox"] == 0
        assert zero["records_per_second"] is not None
        assert "ValueError: no more" in one["error"]
        summary = found["summary"]
        assert summary["partitions"] == 2 and summary["failed"] == 1
        assert summary["records"] == zero["records"] + one["records"]
        assert zero["lag"] == (5 if stream.partition_of("x", 2) == 0 else 0)
        assert one["lag"] == client.xlen(f"{name}:1") - one["records"] > 0
        assert summary["lag"] == zero["lag"] + one["lag"]
        assert http.get(f"/api/streams/{name}", params={"lag": "false"}).json()[
            "summary"]["lag"] is None
        missing = http.get("/api/streams/nope")
        assert missing.status_code == 404 and "no stream job 'nope'" in \
            missing.json()["message"]
        page = http.get(f"/runs/{name}%2F1")
        assert page.status_code == 200
        html = page.text
        assert f"Stream job <code>{name}</code>" in html
        assert 'class="current" data-partition="1"' in html
        assert f"/runs/{name}%2F0" in html and "ValueError: no more" in html
        assert "1 failed" in html
        store.save("plain", {"n": 1})
        assert "Stream job" not in http.get("/runs/plain").text


def _windowed_job(items: list[tuple[str, dict[str, Any]]], windows: Any, late: str,
                  lateness: float = 0.0, idle: float | None = None
                  ) -> tuple[stream.Job, list[Any]]:
    fired: list[Any] = []
    job = stream.Job("win", source=stream.Iterable(items), every=3, seconds=60)
    sums = stream.Windowed(job, windows, time=lambda r: r.value["t"], lateness=lateness,
                           late=late, idle=idle)  # type: ignore[arg-type]

    @sums.reduce
    def add(acc: Any, record: stream.Record) -> Any:
        return (acc or 0) + record.value["n"]

    @sums.fire
    def done(key: str, window: stream.Window, acc: Any, emit: Any) -> None:
        fired.append((key, window.start, acc))
        emit(key, {"start": window.start, "sum": acc})

    return job, fired


def test_tumbling_windows_fire_when_the_watermark_passes(store: Store) -> None:
    items = [("a", {"t": 1, "n": 1}), ("a", {"t": 5, "n": 2}), ("b", {"t": 9, "n": 4}),
             ("a", {"t": 12, "n": 8}),  # watermark 12 - 2 = 10: [0, 10) fires
             ("a", {"t": 3, "n": 100}),  # late for [0, 10): dropped
             ("a", {"t": 25, "n": 1})]  # watermark 23: [10, 20) fires
    job, fired = _windowed_job(items, stream.Tumbling(10), "drop", lateness=2)
    job.run(store, idle_exit=0.1)
    assert sorted(fired) == [("a", 0.0, 3), ("a", 10.0, 8), ("b", 0.0, 4)]
    state = job.partition_state(store, 0)
    assert stream.watermark(state) == 23
    assert state["\x00late"] == 1
    assert job.state(store) == {}  # windows are the job's own entries


@pytest.mark.slow
def test_windows_fire_on_an_idle_partition_with_processing_time(store: Store) -> None:
    items = [("a", {"t": 100.0, "n": 1}), ("b", {"t": 100.5, "n": 2})]
    # Without idleness the watermark (100.5) stays below the window's end (101): no fire.
    job, fired = _windowed_job(items, stream.Tumbling(1.0), "drop")
    job.run(store, idle_exit=1.0)
    assert fired == []
    # With idle=0.3: after 0.3 s without a record the watermark moves on with the clock
    # (100.5 + elapsed), passes 101 half a second after the last record, and both fire.
    job, fired = _windowed_job(items, stream.Tumbling(1.0), "drop", idle=0.3)
    job.name = "win-idle"
    job.run(store, idle_exit=1.5)
    assert sorted(fired) == [("a", 100.0, 1), ("b", 100.0, 2)]
    # Fired by the clock, and committed: no window left, the watermark written past 101.
    state = job.partition_state(store, 0)
    assert not [k for k in state if k.startswith("\x00w|")]
    assert (stream.watermark(state) or 0) >= 101.0
    head = store.latest("win-idle/0")
    assert head is not None and [o[1] for o in head.state["outbox"]] in ([], ["a", "b"])
    with pytest.raises(ValueError, match="idle"):
        _windowed_job(items, stream.Tumbling(1.0), "drop", idle=0)


def test_windows_survive_a_restart_in_the_checkpoint(store: Store) -> None:
    first = [("a", {"t": 1, "n": 1}), ("a", {"t": 2, "n": 2}), ("a", {"t": 4, "n": 4})]
    job, fired = _windowed_job(first, stream.Tumbling(10), "drop")
    job.run(store, idle_exit=0.1)
    assert fired == []
    job, fired = _windowed_job([*first, ("a", {"t": 11, "n": 1})], stream.Tumbling(10),
                               "drop")
    job.run(store, idle_exit=0.1)
    assert fired == [("a", 0.0, 7)]


def test_sliding_windows_and_late_records_updated_or_sent_aside(store: Store) -> None:
    items = [("a", {"t": 1, "n": 1}), ("a", {"t": 6, "n": 2}), ("a", {"t": 30, "n": 0}),
             ("a", {"t": 2, "n": 5})]
    job, fired = _windowed_job(items, stream.Sliding(10, 5), "update")
    job.run(store, idle_exit=0.1)
    # [-5, 5): 1; [0, 10): 1 + 2; [5, 15): 2; then t=2 is late: [-5,5) and [0,10) again.
    assert fired[:3] == [("a", -5.0, 1), ("a", 0.0, 3), ("a", 5.0, 2)]
    assert sorted(fired[3:]) == [("a", -5.0, 5), ("a", 0.0, 5)]


class ListSink:
    """A sink written to the documented protocol: a delivery mark per partition, kept with
    the outputs (here both in memory, so one process)."""

    def __init__(self) -> None:
        self.outputs: list[stream.Output] = []
        self.marks: dict[tuple[str, int], int] = {}

    def deliver(self, job: str, partition: int, outputs: Any) -> None:
        mark = self.marks.get((job, partition), -1)
        todo = [o for o in outputs if o.seq > mark]
        self.outputs.extend(todo)
        if todo:
            self.marks[job, partition] = todo[-1].seq

    def close(self) -> None:
        pass


def test_late_records_to_the_side_output(store: Store) -> None:
    items = [("a", {"t": 1, "n": 1}), ("a", {"t": 30, "n": 0}), ("a", {"t": 2, "n": 5})]
    job, fired = _windowed_job(items, stream.Tumbling(10), "side")
    job.sink = sink = ListSink()
    job.run(store, idle_exit=0.1)
    assert fired == [("a", 0.0, 1)]
    values = [o.value for o in sink.outputs]
    assert values == [{"start": 0.0, "sum": 1}, {"late": {"t": 2, "n": 5}, "window": [0.0, 10.0]}]
    assert [o.seq for o in sink.outputs] == [0, 1]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_partitions_in_pitstop_runs_and_show(store: Store) -> None:
    from clitools import pitstop_exe

    job = stream.Job("shown", source=stream.Iterable([("a", 1), ("b", 2)], partitions=2))
    job.handler(lambda state, record, emit: state.__setitem__(record.key, record.value))
    job.run(store, idle_exit=0.1)
    runs = pitstop_exe("runs", store=store.url)
    assert "shown/0" in runs.out and "pitstop stream status shown" in runs.out
    shown = pitstop_exe("show", "shown/0", store=store.url)
    assert '"position"' in shown.out and '"outbox"' in shown.out


def test_state_schema_version_is_migrated_on_load(store: Store) -> None:
    items = [("a", 1), ("b", 2)]
    old = stream.Job("mig", source=stream.Iterable(items))
    old.handler(lambda state, record, emit: state.__setitem__(record.key, record.value))
    old.run(store, idle_exit=0.1)

    new = stream.Job("mig", source=stream.Iterable([*items, ("c", 3)]), version=1)

    @new.migration(from_version=0)
    def to_dicts(state: dict[Any, Any]) -> dict[Any, Any]:
        return {key: {"n": value} for key, value in state.items()}

    new.handler(lambda state, record, emit: state.__setitem__(record.key,
                                                              {"n": record.value}))
    assert new.state(store) == {"a": {"n": 1}, "b": {"n": 2}}
    new.run(store, idle_exit=0.1)
    assert new.state(store) == {"a": {"n": 1}, "b": {"n": 2}, "c": {"n": 3}}
    head = store.latest("mig/0")
    assert head is not None and head.schema_version == 1
    # Older code meets newer state: the partition is refused, not misread.
    report = old.run(store, idle_exit=0.1)
    assert "newer than stream job 'mig' version 0" in report.failed[0]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.slow
def test_a_partition_leased_elsewhere_is_taken_over_when_the_lease_expires(
    store: Store
) -> None:
    import time

    job = stream.Job("away", source=stream.Iterable([("a", 1), ("b", 1)], partitions=1))
    job.handler(lambda state, record, emit: state.__setitem__(record.key, record.value))
    store.create_run("away/0", workflow="stream:away",
                     metadata={"partitions": 1, "source": "iterable (1 partitions)"})
    # An owner on another machine (its pid cannot be checked from here) holds it 1 s.
    store.acquire("away/0", "another-host:4242:abcdef", ttl=1.0)
    started = time.monotonic()
    report = job.run(store, idle_exit=1.6)
    assert report.records == 2
    assert time.monotonic() - started >= 0.9  # not before the lease expired
    assert job.state(store) == {"a": 1, "b": 1}


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.slow
def test_a_partition_whose_row_lock_is_held_is_claimed_once_it_is_released(
    store_url: str, open_store: Any, caplog: Any,
) -> None:
    """An owner cut off in the middle of a transaction keeps its partition's run row locked
    until the server notices; meanwhile the other processes' claims of it wait, then hit
    ``statement_timeout``. That is "not available now", not an error that ends the job."""
    import threading
    import time

    import psycopg

    from conftest import PG_URL

    store = open_store(statement_timeout=0.5)
    items = [(f"k{i % 40}", 1) for i in range(400)]

    def make(upto: int) -> stream.Job:
        job = stream.Job("locked", source=stream.Iterable(items[:upto], partitions=2),
                         every=50, seconds=0.2)

        @job.handler
        def count(state: Any, record: stream.Record, emit: Any) -> None:
            state[record.key] = state.get(record.key, 0) + record.value

        return job

    make(200).run(store, idle_exit=0.1)  # the partitions' runs exist, half the items read
    schema = store_url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL) as holder:  # (a transaction until rollback)
        holder.execute(f'SELECT 1 FROM "{schema}".pitstop_runs WHERE run_id = %s FOR UPDATE',
                       ("locked/0",))
        job = make(400)
        done: list[stream.RunReport] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                done.append(job.run(store))
            except BaseException as exc:  # (the bug: run() ended on it)
                failed.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        with caplog.at_level("WARNING", logger="pitstop.stream"):
            thread.start()
            deadline = time.monotonic() + 30
            while not caplog.text.count("partition 0 not claimed") >= 2:
                assert time.monotonic() < deadline and not failed, (failed, caplog.text)
                time.sleep(0.05)
        # Two claims of partition 0 timed out; the job goes on with partition 1.
        assert thread.is_alive() and not failed
        while job.partition_state(store, 1) != Counter(
                k for k, _ in items if stream.partition_of(k, 2) == 1):
            assert time.monotonic() < deadline, job.partition_state(store, 1)
            time.sleep(0.05)
        assert store.get_run("locked/0").owner is None
        holder.rollback()
    deadline = time.monotonic() + 60  # (the backoff doubles up to 30 s: 2 s after 3 waits)
    while job.state(store) != Counter(k for k, _ in items):
        assert time.monotonic() < deadline and not failed, (failed, job.state(store))
        time.sleep(0.05)
    assert store.get_run("locked/0").owner is not None
    job.stop()
    thread.join(30)
    assert not failed and done and not done[0].failed


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_a_long_running_job_keeps_its_store_size_level(store: Store) -> None:
    """A partition's store holds its last base and the deltas since: at most 256 of them
    (keyed.needs_base), the older ones deleted when a new base is written. So rows and
    bytes rise in a sawtooth of that period and level off; nothing else piles up (#34: a
    3-minute soak ended before its partitions' first new base, its size still rising)."""
    items = [(f"k{i % 10}", i) for i in range(1400)]  # 10 keys: bases by checkpoint count
    seen: list[tuple[int, int, int, int, int]] = []
    """(records, checkpoints, blobs, bytes, the database file's bytes without its WAL)"""
    database = Path(store.url.removeprefix("sqlite:///"))
    for upto in range(100, len(items) + 1, 100):
        job = stream.Job("level", source=stream.Iterable(items[:upto]), every=1)
        job.handler(lambda state, record, emit: (state.__setitem__(record.key, record.value),
                                                 emit(record.key, record.value)))
        job.run(store, idle_exit=0.05)
        stats = store.stats()
        seen.append((upto, stats.checkpoints, stats.blobs, stats.all_bytes,
                     database.stat().st_size))
        assert stats.checkpoints <= 256 + 2, seen
    assert job.state(store) == {f"k{i}": 1390 + i for i in range(10)}
    # After the first full cycle (257 checkpoints: a base, 256 deltas) the peaks stay put.
    first = [row for row in seen if row[0] <= 600]
    later = [row for row in seen if row[0] > 600]
    for column in (1, 2, 3, 4):  # (the file: the deleted rows' pages are reused)
        assert max(r[column] for r in later) <= max(r[column] for r in first) * 1.05, seen


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.slow
def test_keys_expire_after_the_ttl_through_a_restart(store: Store) -> None:
    import time

    def make(items: list[tuple[str, int]]) -> stream.Job:
        job = stream.Job("ttl", source=stream.Iterable(items), every=2, ttl=3.0)
        job.handler(lambda state, record, emit: state.__setitem__(record.key, record.value))
        return job

    first = [("old1", 1), ("old2", 1), ("kept", 1)]
    make(first).run(store, idle_exit=0.1)
    assert make(first).state(store) == {"old1": 1, "old2": 1, "kept": 1}
    time.sleep(1.7)
    second = [*first, ("kept", 2), ("new", 2)]
    make(second).run(store, idle_exit=0.1)
    time.sleep(1.7)  # old1/old2 were set over 3.4 s ago, kept/new 1.7 s ago (ttl 3 s)
    third = [*second, ("x", 3), ("y", 3)]
    make(third).run(store, idle_exit=0.1)
    state = make(third).state(store)
    assert state == {"kept": 2, "new": 2, "x": 3, "y": 3}
    head = store.latest("ttl/0")
    assert head is not None
    deleted = set()
    for summary in store.history("ttl/0"):
        deleted.update(store.get(summary.id).state.get("deleted") or ())
    assert {"old1", "old2"} <= deleted  # the expiry is in a checkpoint, like any delete


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_run_async_and_cancel_end_at_a_checkpoint(store: Store) -> None:
    import asyncio

    items = [(f"k{i % 10}", 1) for i in range(500)]
    job = stream.Job("aio", source=stream.Iterable(items), every=10_000, seconds=60)
    job.handler(lambda state, record, emit: state.__setitem__(
        record.key, state.get(record.key, 0) + 1))
    report = await job.run_async(store, idle_exit=0.1)
    assert report.records == 500

    later = stream.Job("aio", source=stream.Iterable([*items, ("new", 1)]), every=10_000,
                       seconds=60)
    later.handler(lambda state, record, emit: state.__setitem__(record.key, 1))
    task = asyncio.ensure_future(later.run_async(store))  # no idle exit: runs until cancelled
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The record handled before the cancellation is committed (no every/seconds reached).
    assert later.state(store)["new"] == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_jetstream_start_at_end_and_undecodable_dead_letter(store: Store, name: str) -> None:
    pytest.importorskip("nats")
    import asyncio

    import nats

    async def publish(payloads: list[bytes], *, create: bool = False,
                      delete: bool = False) -> list[Any]:
        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        if create:
            await js.add_stream(name=name, subjects=[f"{name}.>"])
        for payload in payloads:
            await js.publish(f"{name}.0", payload)
        letters = []
        if delete:
            sub = await js.pull_subscribe(f"{name}.dead-letter", stream=name)
            letters = await sub.fetch(1, timeout=2)
            await js.delete_stream(name)
        await nc.close()
        return letters

    asyncio.run(publish([b'{"n": 1}', b'{"n": 2}'], create=True))
    try:
        seen: list[Any] = []

        def make() -> stream.Job:
            job = stream.Job(name, source=stream.JetStream(
                "nats://127.0.0.1:4222", name, undecodable="dead-letter"), start="end")
            job.handler(lambda state, record, emit: seen.append(record.value))
            return job

        assert make().run(store, idle_exit=0.2).records == 0
        asyncio.run(publish([b'{"n": 3}', b"\xff\xfe", b"plain text"]))
        make().run(store, idle_exit=0.2)
        assert seen == [{"n": 3}, "plain text"]
    finally:
        letters = asyncio.run(publish([], delete=True))
    assert letters and letters[0].data == b"\xff\xfe"
    assert letters[0].headers["partition"] == "0"


@pytest.mark.slow
def test_a_lost_commit_and_a_store_outage_keep_exactly_once(client: Any, name: str) -> None:
    import threading

    from conftest import POSTGRES_SKIP, drop_pg_schema, pg_schema_url
    from faults import FaultProxy

    if POSTGRES_SKIP:
        pytest.skip(POSTGRES_SKIP)
    schema = f"s_{uuid.uuid4().hex[:12]}"
    proxy = FaultProxy()
    store = pitstop.open_store(proxy.url(pg_schema_url(schema)))
    try:
        users = [f"u{i % 23}" for i in range(3000)]
        produce(client, name, users)
        # A checkpoint's write (one autocommitted statement) reaches the server, then the
        # connection is reset before its answer and the server stays away for a second: the
        # job cannot tell whether its checkpoint was written, and retries until the store
        # answers again.
        proxy.cut_on(b"INSERT INTO pitstop_checkpoints", deliver=True, skip=1,
                     then_down=True)

        def heal_a_second_later() -> None:
            if proxy.triggered.wait(60):
                threading.Event().wait(1.0)
            proxy.heal()

        threading.Thread(target=heal_a_second_later, daemon=True).start()
        counter_job(name).run(store, idle_exit=0.5)
        assert proxy.triggered.is_set()
        assert counter_job(name).state(store) == Counter(users)
        out = client.xrange(f"{name}-out")
        assert len(out) == 3000 and len({f[b"id"] for _, f in out}) == 3000
    finally:
        proxy.heal()
        store.close()
        drop_pg_schema(schema)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.slow
def test_taking_a_lease_on_a_row_locked_elsewhere_is_busy_not_a_timeout(
    store_url: str, open_store: Any,
) -> None:
    """``acquire`` waits for a run row's lock only as long as the store's bounded lock wait
    (5 s on PostgreSQL), then answers ``RunBusyError`` naming no owner, rather than waiting
    for ``statement_timeout`` (set far longer here) and failing with a ``StoreError``."""
    import psycopg

    from conftest import PG_URL
    from pitstop.errors import RunBusyError

    store = open_store(statement_timeout=60)
    job = stream.Job("held", source=stream.Iterable([("a", 1)], partitions=1), every=1)

    @job.handler
    def count(state: Any, record: stream.Record, emit: Any) -> None:
        state[record.key] = state.get(record.key, 0) + record.value

    job.run(store, idle_exit=0.1)
    schema = store_url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL) as holder:
        holder.execute(f'SELECT 1 FROM "{schema}".pitstop_runs WHERE run_id = %s FOR UPDATE',
                       ("held/0",))
        with pytest.raises(RunBusyError, match="locked by another transaction") as caught:
            store.acquire("held/0", "someone-else")
        assert caught.value.owner is None and caught.value.run_id == "held/0"
        holder.rollback()
    lease = store.acquire("held/0", "someone-else")  # the lock gone: taken at once
    assert lease.owner == "someone-else"
