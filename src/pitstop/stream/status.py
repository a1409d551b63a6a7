"""A stream job's partitions as an operator reads them (``pitstop stream status JOB``).

Everything comes from the partition runs and their last two checkpoints' summaries (no
state is loaded): position, records and outbox size are in each checkpoint's metadata, the
rate is the records between the last two checkpoints over their time apart. The lag of a
Redis partition is the stream's ``entries-added`` less the records up to the position, one
XINFO per partition; the lag of a JetStream partition is the number of messages of its
subject after its sequence, as the server counts them for a consumer created there (no ack,
deleted at once), one connection per server. When the broker does not answer the lag is
unknown (None).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from typing import Any

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
    """Between its last two checkpoints."""
    lag: int | None
    """Records in the source after the position (None: unknown)."""
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def job_status(store: Store, job: str, *, lag: bool = True) -> list[PartitionStatus]:
    """The partitions of ``job`` (runs ``<job>/<n>``), in partition order."""
    runs = [r for r in store.runs(id_prefix=f"{job}/", workflow=f"stream:{job}", limit=None)
            if r.id.rsplit("/", 1)[1].isdigit()]
    runs.sort(key=lambda r: int(r.id.rsplit("/", 1)[1]))
    out = []
    now = time.time()
    for run in runs:
        last = store.history(run.id, limit=2)
        meta: dict[str, Any] = dict(last[0].metadata.get("stream") or {}) if last else {}
        rate = None
        if len(last) == 2:
            before = last[1].metadata.get("stream") or {}
            seconds = (last[0].created_at - last[1].created_at).total_seconds()
            done = int(meta.get("records", 0)) - int(before.get("records", 0))
            if seconds > 0 and done >= 0:
                rate = done / seconds
        error = last[0].metadata.get("error") if last else None
        out.append(PartitionStatus(
            run_id=run.id,
            partition=int(run.id.rsplit("/", 1)[1]),
            status=run.status.value,
            owner=run.owner,
            position=meta.get("position"),
            records=int(meta.get("records", 0)),
            outbox=int(meta.get("outbox", 0)),
            checkpoint_age=now - last[0].created_at.timestamp() if last else None,
            records_per_second=rate,
            lag=_redis_lag(run.metadata, meta) if lag else None,
            error=f"{error.get('type')}: {error.get('message')}"
            if isinstance(error, dict) else None,
        ))
    if lag:
        out = _with_jetstream_lag(out, {run.id: run.metadata for run in runs})
    return out


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


def _redis_lag(run_meta: Any, meta: dict[str, Any]) -> int | None:
    source = run_meta.get("redis") if hasattr(run_meta, "get") else None
    if not isinstance(source, dict) or "offset" not in meta:
        return None
    try:
        import redis

        client = redis.Redis.from_url(source["url"], socket_timeout=2.0,
                                      socket_connect_timeout=2.0)
        try:
            info = client.xinfo_stream(source["stream"])
        finally:
            client.close()
    except Exception:  # no redis-py, broker down, no such stream: unknown
        return None
    return max(0, int(info.get("entries-added", 0)) - int(meta["offset"]))


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


__all__ = ["JobSummary", "PartitionStatus", "job_status", "summarise"]
