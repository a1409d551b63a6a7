"""Stream jobs: exactly-once consumers of Redis Streams (and iterables), with the source
position, the keyed state and the not-yet-delivered outputs in one checkpoint per partition.

See docs/streams.md for a tutorial and the guarantees.
"""

from __future__ import annotations

from ..errors import (
    BrokerUnavailableError,
    PartitionCountError,
    StreamError,
    TrimmedError,
    UndecodableRecordError,
)
from .jetstream import JetStream
from .job import Job, RunReport
from .keyed import KeyedState
from .records import Output, Position, Record
from .sinks import PostgresSink, RedisStreamSink, Sink
from .sources import Iterable, RedisStream, Source, partition_of
from .windows import Sliding, Tumbling, Window, Windowed, watermark

__all__ = [
    "BrokerUnavailableError",
    "Iterable",
    "JetStream",
    "Job",
    "KeyedState",
    "Output",
    "PartitionCountError",
    "Position",
    "PostgresSink",
    "Record",
    "RedisStream",
    "RedisStreamSink",
    "RunReport",
    "Sink",
    "Sliding",
    "Source",
    "StreamError",
    "TrimmedError",
    "Tumbling",
    "UndecodableRecordError",
    "Window",
    "Windowed",
    "partition_of",
    "watermark",
]
