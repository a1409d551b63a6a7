"""Where a stream job's outputs go, exactly once.

The protocol (write your own sink to it): outputs are numbered per partition (``seq``, from 0,
no gaps) and committed in the partition's checkpoint *before* any is delivered. After the
commit the job calls ``sink.deliver(job, partition, outputs)``; a crash may make it call again
with outputs already delivered (a restart delivers the outbox of the checkpoint it resumes
from), and a fenced-off old owner may deliver the same outputs concurrently. So a sink keeps,
*in the same atomic write as the outputs*, a delivery mark per partition (the highest ``seq``
delivered) and writes only outputs above it. Where the target has no transactions, an
idempotent write keyed by :attr:`Output.id <pitstop.stream.Output.id>` does the same job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import BrokerUnavailableError
from .records import Output
from .sources import _safe_url, dumps_value


class Sink(Protocol):
    """What :class:`~pitstop.stream.Job` needs of a sink."""

    def deliver(self, job: str, partition: int, outputs: Sequence[Output]) -> None:
        """Write the outputs above the partition's delivery mark and move the mark to the
        last one, atomically; outputs at or below the mark are skipped."""

    def close(self) -> None: ...


class RedisStreamSink:
    """Outputs appended to the Redis stream ``name`` as entries ``{"id", "key", "value"}``
    (``value`` as JSON unless it is a ``str``). The delivery mark of each partition is the
    key ``<name>:delivered:<job>/<partition>``: WATCHed, read, then XADDs and the new mark
    in one MULTI/EXEC, so two writers (a restarted owner and a fenced-off old one) never
    both append an output: the second one's EXEC fails, it rereads the mark and skips."""

    def __init__(self, url: str, name: str, *, maxlen: int | None = None) -> None:
        self.url = url
        self.name = name
        self.maxlen = maxlen
        self._client: Any = None

    def mark_key(self, job: str, partition: int) -> str:
        return f"{self.name}:delivered:{job}/{partition}"

    def _redis(self) -> Any:
        if self._client is None:
            try:
                import redis
            except ImportError as exc:
                raise ImportError(
                    "stream.RedisStreamSink needs redis-py: pip install 'pitstop[stream]'"
                ) from exc
            self._client = redis.Redis.from_url(self.url, socket_timeout=30.0)
        return self._client

    def delivered(self, job: str, partition: int) -> int:
        """The highest ``seq`` of the partition delivered (-1: none)."""
        raw = self._redis().get(self.mark_key(job, partition))
        return -1 if raw is None else int(raw)

    def deliver(self, job: str, partition: int, outputs: Sequence[Output]) -> None:
        if not outputs:
            return
        import redis

        client = self._redis()
        key = self.mark_key(job, partition)
        try:
            with client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(key)
                        raw = pipe.get(key)
                        mark = -1 if raw is None else int(raw)
                        todo = [o for o in outputs if o.seq > mark]
                        if not todo:
                            pipe.unwatch()
                            return
                        pipe.multi()
                        for output in todo:
                            pipe.xadd(
                                self.name,
                                {"id": output.id, "key": dumps_value(output.key),
                                 "value": dumps_value(output.value)},
                                maxlen=self.maxlen, approximate=True,
                            )
                        pipe.set(key, todo[-1].seq)
                        pipe.execute()
                        return
                    except redis.WatchError:
                        continue  # another writer delivered meanwhile: reread the mark
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise BrokerUnavailableError(
                f"the sink's Redis at {_safe_url(self.url)} does not answer ({exc})",
                job=job, partition=partition,
            ) from exc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


class PostgresSink:
    """Outputs as rows of ``table`` (created if missing: ``id`` text primary key, ``job``,
    ``partition``, ``seq``, ``key`` text, ``value`` jsonb, ``delivered_at``), written in one
    transaction with the partition's delivery mark (table ``<table>_delivered``), which is
    locked first: a second writer waits, then sees the outputs delivered and skips them."""

    def __init__(self, url: str, table: str) -> None:
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table {table!r}: a name (optionally schema.name) of letters, "
                             "digits and _")
        self.url = url
        self.table = table
        self._conn: Any = None

    def _connect(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            try:
                self._conn = psycopg.connect(self.url, autocommit=False)
            except psycopg.OperationalError as exc:
                raise BrokerUnavailableError(
                    f"the sink's PostgreSQL at {_safe_url(self.url)} does not answer ({exc})",
                    job="?",
                ) from exc
            with self._conn.transaction():
                self._conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.table} (id text PRIMARY KEY, job text "
                    "NOT NULL, partition integer NOT NULL, seq bigint NOT NULL, key text, "
                    "value jsonb, delivered_at timestamptz NOT NULL DEFAULT now())"
                )
                self._conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.table}_delivered (job text NOT NULL, "
                    "partition integer NOT NULL, seq bigint NOT NULL, "
                    "PRIMARY KEY (job, partition))"
                )
        return self._conn

    def deliver(self, job: str, partition: int, outputs: Sequence[Output]) -> None:
        if not outputs:
            return
        import psycopg

        try:
            conn = self._connect()
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {self.table}_delivered (job, partition, seq) "
                    "VALUES (%s, %s, -1) ON CONFLICT DO NOTHING",
                    (job, partition),
                )
                row = conn.execute(
                    f"SELECT seq FROM {self.table}_delivered WHERE job = %s AND partition = %s "
                    "FOR UPDATE",
                    (job, partition),
                ).fetchone()
                mark = int(row[0])
                todo = [o for o in outputs if o.seq > mark]
                if not todo:
                    return
                with conn.cursor() as cur:
                    cur.executemany(
                        f"INSERT INTO {self.table} (id, job, partition, seq, key, value) "
                        "VALUES (%s, %s, %s, %s, %s, %s)",
                        [(o.id, job, partition, o.seq, dumps_value(o.key),
                          json.dumps(o.value)) for o in todo],
                    )
                conn.execute(
                    f"UPDATE {self.table}_delivered SET seq = %s WHERE job = %s "
                    "AND partition = %s",
                    (todo[-1].seq, job, partition),
                )
        except psycopg.OperationalError as exc:
            self.close()
            raise BrokerUnavailableError(
                f"the sink's PostgreSQL at {_safe_url(self.url)} does not answer ({exc})",
                job=job, partition=partition,
            ) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


__all__ = ["PostgresSink", "RedisStreamSink", "Sink"]
