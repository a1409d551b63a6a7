"""A stream job's partitions as an operator reads them (``pitstop stream status JOB``,
``pitstop runs``, ``pitstop show`` and the inspector).

Everything comes from the partition runs and their newest checkpoints' summaries (no state
is loaded): position, records and outbox size are in each checkpoint's metadata, the rate is
the records between the oldest and the newest of the last :data:`RATE_CHECKPOINTS`
checkpoints over their time apart. The lag of a Redis partition is the stream's
``entries-added`` less the records up to the position: one XINFO per partition, pipelined,
one connection per server. The lag of a JetStream partition is the number of messages of its
subject after its sequence, as the server counts them for a consumer created there (no ack,
deleted at once), one connection per server. A source that cannot tell (an ``Iterable``), or
a broker that does not answer, leaves the lag unknown (None).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..model import Run
from ..store import Store


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    run_id: str
    partition: int
    status: str
    owner: str | None
    position: str | None
    records: int
    outbox: int
    checkpoint_age: float | None
    """Seconds since the partition's last checkpoint."""
    records_per_second: float | None
    """Records/s over its last :data:`RATE_CHECKPOINTS` checkpoints (None: fewer than two)."""
    lag: int | None
    """Records in the source after the position (None: unknown)."""
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


RATE_CHECKPOINTS = 8
"""A partition's records/s is taken over its newest checkpoints, this many at most."""


def job_status(store: Store, job: str, *, lag: bool = True) -> list[PartitionStatus]:
    """The partitions of ``job`` (runs ``<job>/<n>``), in partition order."""
    runs = [r for r in store.runs(id_prefix=f"{job}/", workflow=f"stream:{job}", limit=None)
            if r.id.rsplit("/", 1)[1].isdigit()]
    runs.sort(key=lambda r: int(r.id.rsplit("/", 1)[1]))
    return partitions_status(store, runs, lag=lag)


def is_partition(run: Run) -> bool:
    """Whether ``run`` is a stream job's partition (workflow ``stream:JOB``, id ``JOB/N``)."""
    job, _, index = run.id.rpartition("/")
    return run.workflow == f"stream:{job}" and index.isdigit()


def partitions_status(store: Store, runs: Sequence[Run], *, lag: bool = True
                      ) -> list[PartitionStatus]:
    """The status of each partition run in ``runs`` (see :func:`is_partition`), in their
    order; with ``lag``, each broker is asked once for all of its partitions."""
    now = time.time()
    found = [_status(store, run, now) for run in runs]
    out = [part for part, _ in found]
    if lag:
        meta = {run.id: run.metadata for run in runs}
        out = _with_redis_lag(out, meta, [offset for _, offset in found])
        out = _with_jetstream_lag(out, meta)
    return out


def _status(store: Store, run: Run, now: float) -> tuple[PartitionStatus, int | None]:
    """The partition's status (its lag still unknown), and the records of its source up to
    its position (None: no checkpoint says)."""
    last = store.history(run.id, limit=RATE_CHECKPOINTS)
    meta: dict[str, Any] = dict(last[0].metadata.get("stream") or {}) if last else {}
    rate = None
    if len(last) >= 2:
        oldest = last[-1].metadata.get("stream") or {}
        seconds = (last[0].created_at - last[-1].created_at).total_seconds()
        done = int(meta.get("records", 0)) - int(oldest.get("records", 0))
        if seconds > 0 and done >= 0:
            rate = done / seconds
    error = last[0].metadata.get("error") if last else None
    offset = meta.get("offset")
    position = meta.get("position")
    return PartitionStatus(
        run_id=run.id,
        partition=int(run.id.rsplit("/", 1)[1]),
        status=run.status.value,
        owner=run.owner,
        # (A checkpoint before the first record writes str(None).)
        position=None if position in (None, "None") else str(position),
        records=int(meta.get("records", 0)),
        outbox=int(meta.get("outbox", 0)),
        checkpoint_age=now - last[0].created_at.timestamp() if last else None,
        records_per_second=rate,
        lag=None,
        error=f"{error.get('type')}: {error.get('message')}"
        if isinstance(error, dict) else None,
    ), offset if type(offset) is int else None


def progress_text(part: PartitionStatus) -> str:
    """A partition in one line: ``1,560 records · at 1733356347000-3 · lag 77 · 180/s``."""
    words = [f"{part.records:,} records"]
    if part.position is not None:
        words.append(f"at {part.position}")
    if part.lag is not None:
        words.append(f"lag {part.lag:,}")
    if part.records_per_second is not None:
        words.append(f"{part.records_per_second:,.0f}/s")
    return " · ".join(words)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A stream job at a glance: its partitions' figures added up."""

    partitions: int
    running: int
    failed: int
    records: int
    records_per_second: float | None
    """The partitions' rates added up (None: no partition has two checkpoints yet)."""
    lag: int | None
    """Records behind, all partitions (None: unknown for every partition)."""
    outbox: int
    oldest_checkpoint_age: float | None
    """The stalest partition's last checkpoint, in seconds."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarise(parts: list[PartitionStatus]) -> JobSummary:
    """Add up ``parts`` (what :func:`job_status` returned)."""
    rates = [p.records_per_second for p in parts if p.records_per_second is not None]
    lags = [p.lag for p in parts if p.lag is not None]
    ages = [p.checkpoint_age for p in parts if p.checkpoint_age is not None]
    return JobSummary(
        partitions=len(parts),
        running=sum(p.status == "running" for p in parts),
        failed=sum(p.status == "failed" for p in parts),
        records=sum(p.records for p in parts),
        records_per_second=sum(rates) if rates else None,
        lag=sum(lags) if lags else None,
        outbox=sum(p.outbox for p in parts),
        oldest_checkpoint_age=max(ages) if ages else None,
    )


def _with_redis_lag(parts: list[PartitionStatus], run_meta: dict[str, Any],
                    offsets: list[int | None]) -> list[PartitionStatus]:
    """Fill in the lag of Redis partitions: one pipelined XINFO STREAM per partition, one
    connection per server (a server that does not answer within 2 s: unknown)."""
    asks: dict[str, list[tuple[int, str, int]]] = {}
    for i, part in enumerate(parts):
        meta = run_meta.get(part.run_id)
        source = meta.get("redis") if meta is not None else None
        offset = offsets[i]
        if not isinstance(source, dict) or offset is None:
            continue
        asks.setdefault(source["url"], []).append((i, source["stream"], offset))
    for url, wanted in asks.items():
        try:
            import redis

            client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
            try:
                with client.pipeline(transaction=False) as pipe:
                    for _, stream_name, _ in wanted:
                        pipe.xinfo_stream(stream_name)
                    infos = pipe.execute(raise_on_error=False)
            finally:
                client.close()
        except Exception:  # no redis-py, broker down: unknown
            continue
        for (i, _, offset), info in zip(wanted, infos, strict=True):
            if isinstance(info, dict):  # (an error: no such stream, unknown)
                parts[i] = replace(parts[i], lag=max(
                    0, int(info.get("entries-added", 0)) - offset))
    return parts


def _with_jetstream_lag(parts: list[PartitionStatus], run_meta: dict[str, Any]
                        ) -> list[PartitionStatus]:
    """Fill in the lag of JetStream partitions, asking each server once for all of its."""
    asks: dict[str, list[tuple[int, str, str, int]]] = {}
    for i, part in enumerate(parts):
        meta = run_meta.get(part.run_id)
        source = meta.get("jetstream") if meta is not None else None
        if not isinstance(source, dict):
            continue
        position = part.position or ""
        after = int(position) if position.isdigit() else 0
        asks.setdefault(source["url"], []).append(
            (i, source["stream"], source["subject"], after))
    import asyncio

    for url, wanted in asks.items():
        try:
            lags = asyncio.run(_jetstream_pending(url, wanted))
        except Exception:  # no nats-py, server down, no such stream: unknown
            continue
        for i, pending in lags.items():
            parts[i] = replace(parts[i], lag=pending)
    return parts


async def _jetstream_pending(url: str, wanted: list[tuple[int, str, str, int]]
                             ) -> dict[int, int]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0,
                            allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=2.0)
        out: dict[int, int] = {}
        for i, stream_name, subject, after in wanted:
            try:
                info = await js.add_consumer(stream_name, ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1,
                    ack_policy=AckPolicy.NONE, filter_subject=subject,
                    inactive_threshold=5.0, mem_storage=True,
                ))
            except Exception:  # that stream is gone: unknown, the others still asked
                continue
            out[i] = int(info.num_pending or 0)
            with suppress(Exception):  # else it goes by itself after inactive_threshold
                await js.delete_consumer(stream_name, info.name)
        return out
    finally:
        await nc.close()


__all__ = ["RATE_CHECKPOINTS", "JobSummary", "PartitionStatus", "is_partition", "job_status",
           "partitions_status", "progress_text", "summarise"]
