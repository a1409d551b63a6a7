"""A NATS JetStream source: subjects ``<stream>.0`` … ``<stream>.<N-1>`` of one JetStream
stream, one per partition, read by stream sequence.

Each partition is read through an ephemeral pull consumer filtered on its subject, created
at the stored sequence + 1 with no acknowledgements (the position lives in the checkpoint, so
the broker keeps no per-job state). nats-py is asyncio: the source runs its own event loop
on a daemon thread and the job calls it synchronously.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import BrokerUnavailableError, TrimmedError, UndecodableRecordError
from .records import Position, Record
from .sources import _SKIPPED, Undecodable, _safe_url

log = logging.getLogger("pitstop.stream")


class JetStream:
    """JetStream stream ``stream_name`` at ``url``, partition ``p`` being the subject
    ``<stream_name>.<p>``. A record's ``value`` is the message's data decoded as JSON (or
    the text itself when it is not JSON), its ``key`` the ``key`` header (None if absent),
    its ``position`` the stream sequence. Data that is not UTF-8 follows ``undecodable``
    (``"dead-letter"`` publishes it to ``<stream_name>.dead-letter`` with headers naming the
    partition and sequence)."""

    def __init__(self, url: str, stream_name: str, *, partitions: int = 1,
                 undecodable: Undecodable = "fail") -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        if undecodable not in ("fail", "dead-letter"):
            raise ValueError('undecodable must be "fail" or "dead-letter"')
        self.url = url
        self.stream_name = stream_name
        self.partitions = partitions
        self.undecodable = undecodable
        self._job = "?"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: Any = None
        self._js: Any = None
        self._subs: dict[int, tuple[Any, int]] = {}  # partition: (subscription, next seq)

    def describe(self) -> str:
        return (f"jetstream {self.stream_name} ({self.partitions} partitions) at "
                f"{_safe_url(self.url)}")

    def subject(self, partition: int) -> str:
        return f"{self.stream_name}.{partition}"

    # -- the event loop ----------------------------------------------------------------------

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="pitstop-jetstream",
                                      daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _connect(self) -> Any:
        if self._js is None:
            try:
                import nats
            except ImportError as exc:
                raise ImportError(
                    "stream.JetStream needs nats-py: pip install 'pitstop[stream]'"
                ) from exc
            try:
                self._nc = await nats.connect(self.url, connect_timeout=5,
                                              max_reconnect_attempts=2, allow_reconnect=True)
            except Exception as exc:
                raise BrokerUnavailableError(
                    f"NATS at {_safe_url(self.url)} does not answer ({type(exc).__name__}: "
                    f"{exc})", job=self._job,
                ) from exc
            self._js = self._nc.jetstream()
        return self._js

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        try:
            return self._run(coro, timeout)
        except (BrokerUnavailableError, TrimmedError, UndecodableRecordError):
            raise
        except Exception as exc:
            self._reset()
            raise BrokerUnavailableError(
                f"NATS at {_safe_url(self.url)}: {type(exc).__name__}: {exc}", job=self._job
            ) from exc

    def _reset(self) -> None:
        self._subs.clear()
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and self._loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(nc.close(), self._loop).result(5)
            except Exception as exc:  # already gone
                log.debug("closing NATS: %s", exc)

    # -- the Source protocol -----------------------------------------------------------------

    async def _stream_state(self) -> Any:
        js = await self._connect()
        info = await js.stream_info(self.stream_name)
        return info.state

    def first_position(self, partition: int, start: str) -> tuple[Position | None, int]:
        if start != "end":
            return None, 0
        state = self._call(self._stream_state())
        return (int(state.last_seq) or None), 0

    def check_position(
        self, partition: int, position: Position | None, offset: int, on_trimmed: str
    ) -> None:
        """Sequences are shared by the stream's subjects: when the oldest message left comes
        after the one following ``position``, messages of the partition may be gone (the
        stream's limits removed them), and that is reported unless ``on_trimmed="skip"``."""
        state = self._call(self._stream_state())
        after = int(position or 0) + 1
        if int(state.first_seq) > after and int(state.messages or 0) >= 0:
            gone = int(state.first_seq) - after
            if on_trimmed == "fail":
                raise TrimmedError(
                    f"the JetStream stream {self.stream_name} no longer holds sequences "
                    f"{after}..{int(state.first_seq) - 1} after the stored position "
                    f"{position} ({gone} messages, some may be of {self.subject(partition)}); "
                    'pass on_trimmed="skip" to go on from the oldest message left',
                    job=self._job, partition=partition,
                )
            log.warning("stream job %r: partition %d: sequences %d..%d were removed; going on",
                        self._job, partition, after, int(state.first_seq) - 1)

    async def _subscription(self, partition: int, position: Position | None) -> Any:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        next_seq = int(position or 0) + 1
        held = self._subs.get(partition)
        if held is not None and held[1] == next_seq:
            return held[0]
        if held is not None:
            await held[0].unsubscribe()
        js = await self._connect()
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=next_seq,
            ack_policy=AckPolicy.NONE, filter_subject=self.subject(partition),
            inactive_threshold=60.0, max_waiting=4,
        )
        sub = await js.pull_subscribe(self.subject(partition), stream=self.stream_name,
                                      config=config)
        self._subs[partition] = (sub, next_seq)
        return sub

    async def _fetch(self, partition: int, position: Position | None, count: int,
                     block: float) -> list[Record]:
        import nats.errors

        sub = await self._subscription(partition, position)
        try:
            msgs = await sub.fetch(batch=count, timeout=max(block, 0.01))
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        records = []
        for msg in msgs:
            seq = int(msg.metadata.sequence.stream)
            headers = msg.headers or {}
            try:
                text = msg.data.decode()
            except UnicodeDecodeError as exc:
                await self._undecodable(partition, seq, msg.data, exc)
                records.append(Record(partition, seq, None, _SKIPPED))
                continue
            try:
                value: Any = json.loads(text)
            except ValueError:
                value = text
            records.append(Record(partition, seq, headers.get("key"), value))
        if records:
            self._subs[partition] = (sub, int(records[-1].position) + 1)
        return records

    async def _undecodable(self, partition: int, seq: int, data: bytes,
                           exc: Exception) -> None:
        if self.undecodable == "fail":
            raise UndecodableRecordError(
                f"message {seq} of {self.subject(partition)} is not UTF-8 ({exc}); "
                'pass undecodable="dead-letter" to set such messages aside',
                job=self._job, partition=partition,
            )
        js = await self._connect()
        await js.publish(f"{self.stream_name}.dead-letter", data,
                         headers={"partition": str(partition), "sequence": str(seq),
                                  "error": str(exc)})

    async def _read(self, positions: Mapping[int, Position | None], count: int,
                    block: float) -> dict[int, list[Record]]:
        parts = list(positions)
        results = await asyncio.gather(
            *(self._fetch(p, positions[p], count, block) for p in parts)
        )
        return {p: records for p, records in zip(parts, results, strict=True) if records}

    def read(self, positions: Mapping[int, Position | None], count: int,
             block: float) -> dict[int, list[Record]]:
        if not positions:
            return {}
        result: dict[int, list[Record]] = self._call(self._read(positions, count, block),
                                                     timeout=30.0 + block)
        return result

    async def _lag(self, partition: int, position: Position | None) -> int:
        sub = await self._subscription(partition, position)
        info = await sub.consumer_info()
        return int(info.num_pending) + int(getattr(info, "num_ack_pending", 0) or 0)

    def lag(self, partition: int, position: Position | None) -> int | None:
        try:
            return int(self._call(self._lag(partition, position)))
        except BrokerUnavailableError:
            return None

    async def _shutdown(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        self._subs.clear()
        if nc is not None:
            try:
                await nc.close()
            except Exception as exc:  # already gone
                log.debug("closing NATS: %s", exc)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        except Exception as exc:
            log.debug("closing NATS: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = self._thread = None


__all__ = ["JetStream"]
