"""A stream job process on one simulated host (run inside its network namespace by
test_stream_partitions.py): ``python stream_partition_worker.py STORE_URL REDIS_URL NAME
PARTITIONS HOST JOURNAL``.

The job counts records per user over a Redis stream and emits every fifth count to a
RedisStreamSink (tests/streamkill.py's job, with a 2 s lease). Every checkpoint the store
accepts is appended to JOURNAL (a file every host shares): ``saved HOST PARTITION TOKEN``,
so the test can tell that a host wrote nothing after its lease was taken over.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pitstop
from streamkill import make_job

store_url, redis_url, name, partitions, host, journal = sys.argv[1:7]
TTL = float(os.environ.get("PARTITION_TTL", "2"))


def note(line: str) -> None:
    with open(journal, "a") as f:  # one write per line, O_APPEND: lines never interleave
        f.write(line + "\n")


job = make_job(name, int(partitions), redis_url, every=50)
job.lease_ttl = TTL
save = job._save


def journaled_save(store: Any, part: Any, fields: Any, **kwargs: Any) -> Any:
    checkpoint = save(store, part, fields, **kwargs)  # raises LeaseLostError once fenced
    note(f"saved {host} {part.index} {part.held.lease.token}")
    return checkpoint


job._save = journaled_save  # type: ignore[method-assign]
logging.basicConfig(level=logging.INFO, format=f"{host} %(asctime)s %(name)s %(message)s")
with pitstop.open_store(store_url) as store:
    note(f"up {host} {os.getpid()}")
    job.run(store)
