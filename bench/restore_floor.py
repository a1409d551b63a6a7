"""What restoring the 2,000-turn conversation can cost on PostgreSQL, by row layout (issue #33,
target 4: a restore <= 5x one ``unpackb``): the same ~4 MiB of messages stored as one row a
message (what a store writes today, each save's new message a leaf of its own), as group rows
of several messages, and as one row, each read in one statement, checked and decoded as a
restore does, against one ``ormsgpack.unpackb`` of the list in the same rounds.

    .venv/bin/python bench/restore_floor.py               # restore by layout
    .venv/bin/python bench/restore_floor.py --disk        # also: compaction's bytes on disk

* Each layout's rows go into a table like ``pitstop_blobs`` of a fresh store's schema (its
  storage settings: values inline up to 8,160 bytes, uncompressed by PostgreSQL, larger ones
  in TOAST), keyed by
  xxh3-128 of their raw bytes as chunks are; compressed rows are one zstd frame each
  (pitstop's ``frame``), decompressed by ``decompress_many`` as a restore does.
* A restore: ``SELECT hash, data ... WHERE hash = ANY(%b)`` (binary), every row checked
  against its key, the list decoded a group of rows at a time (``list_groups`` and the
  serializer's ``_loads_lists``). No transaction, head lookup or manifest: only the rows.
* ``--disk``: 2,000 saves of one message written as rows the way a save writes a leaf
  (compressed), and the same with *compaction*: every ``--group`` saves one compressed row
  of those messages, the leaves it replaces made alias rows (key, target, offset), with a
  ``VACUUM`` of the table after every ``--vacuum-every`` compactions (0: never). Bytes of
  the table (heap, TOAST, indexes) at the end, against the messages' bytes.

Timings on a shared 2-core machine are noisy: the ratios are medians of per-round ratios,
each round measuring every layout and the ``unpackb`` close together in time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ormsgpack
import xxhash
from _common import POSTGRES_URL, fmt_bytes, fmt_time, median_ratio, message, save_results, table

import pitstop
from pitstop.serde import chunks as chunking
from pitstop.serde.codec import MsgpackSerializer
from pitstop.serde.framing import COMPRESSED, decompress_many, frame

PG_URL = POSTGRES_URL
FMT = MsgpackSerializer().format_id


def messages(turns: int, size: int) -> list[bytes]:
    """Each message's msgpack encoding (as bench/growth.py's conversation makes them)."""
    rng = random.Random(12)
    return [ormsgpack.packb(message(rng, size, i)) for i in range(turns)]


def key_of(raw: bytes) -> bytes:
    return chunking.chunk_key(FMT, raw)


def grouped(items: list[bytes], group_bytes: int) -> list[list[bytes]]:
    """Consecutive items in groups of at least ``group_bytes`` (0: one item a group)."""
    groups: list[list[bytes]] = []
    current: list[bytes] = []
    size = 0
    for item in items:
        current.append(item)
        size += len(item)
        if size >= group_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


@contextmanager
def scratch_schema() -> Iterator[tuple[Any, str]]:
    """A connection whose search path is a fresh pitstop schema (dropped after)."""
    import psycopg

    schema = f"bench_floor_{uuid.uuid4().hex[:10]}"
    pitstop.open_store(f"{PG_URL}?schema={schema}").close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        try:
            yield conn, schema
        finally:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class Layout:
    """One way of storing the list: its rows' keys, in order, and each row's item count."""

    table = ""

    def __init__(self, name: str, groups: list[list[bytes]], compress: bool) -> None:
        self.name = name
        self.compress = compress
        self.raws = [b"".join(g) for g in groups]
        self.keys = [key_of(raw) for raw in self.raws]
        self.entries = [
            chunking.Entry(k, len(g), len(raw), chunking.CUT)
            for k, g, raw in zip(self.keys, groups, self.raws, strict=True)
        ]
        self.stored = [
            frame(raw, FMT, compress_threshold=128 if compress else None, checksum=False)
            for raw in self.raws
        ]

    def insert(self, conn: Any, table_name: str) -> None:
        """Into a table of its own, like ``pitstop_blobs`` (two layouts share keys)."""
        self.table = table_name
        conn.execute(f"CREATE TABLE {table_name} (LIKE pitstop_blobs INCLUDING ALL)")
        conn.execute(f"ALTER TABLE {table_name} SET (toast_tuple_target = 8160)")  # migration 7
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table_name} (hash, data, size, created_at, run_id) "
                "VALUES (%b, %b, %s, 0, 'bench')",
                [(k, s, len(s)) for k, s in zip(self.keys, self.stored, strict=True)],
            )

    def restore(self, conn: Any, reader: MsgpackSerializer) -> list[Any]:
        rows = conn.execute(
            f"SELECT hash, data FROM {self.table} WHERE hash = ANY(%b)", (self.keys,), binary=True
        ).fetchall()
        found = {bytes(h): data for h, data in rows}
        stored = [found[k] for k in self.keys]
        views: list[Any] = [memoryview(s)[1:] for s in stored]
        packed = [i for i, s in enumerate(stored) if s[0] & COMPRESSED]
        if packed:
            for i, view in zip(packed, decompress_many([views[i] for i in packed]), strict=True):
                views[i] = view
        digest = xxhash.xxh3_128_digest
        for key, view in zip(self.keys, views, strict=True):
            if b"\x01" + digest(view, seed=FMT) != key:
                raise AssertionError("a row does not match its key")
        raws = dict(zip(self.keys, views, strict=True))
        return reader._loads_lists(chunking.list_groups(self.entries, raws))


def restore_floor(turns: int, size: int, rounds: int) -> dict[str, Any]:
    items = messages(turns, size)
    final = ormsgpack.packb([ormsgpack.unpackb(i) for i in items])
    expected = ormsgpack.unpackb(final)
    layouts = [
        Layout("a row a message, compressed (today's default)", grouped(items, 0), True),
        Layout("a row a message, raw (compress_threshold=none)", grouped(items, 0), False),
        Layout("rows of 5 messages, compressed (~7.6 KiB, inline)", grouped(items, 9 * 1024),
               True),
        Layout("rows of 3 messages, raw (~6 KiB, inline)", grouped(items, 6 * 1024), False),
        Layout("rows of 64 KiB, compressed (TOAST)", grouped(items, 64 * 1024), True),
        Layout("rows of 64 KiB, raw (TOAST)", grouped(items, 64 * 1024), False),
        Layout("one row, raw (TOAST)", [items], False),
    ]
    reader = MsgpackSerializer()
    with scratch_schema() as (conn, _):
        for i, layout in enumerate(layouts):
            layout.insert(conn, f"floor_{i}")
            conn.execute(f"VACUUM ANALYZE floor_{i}")
        ops: dict[str, Callable[[], Any]] = {
            layout.name: (lambda layout=layout: layout.restore(conn, reader))
            for layout in layouts
        }
        for name, op in ops.items():
            if op() != expected:
                raise AssertionError(f"{name}: not the list")
        ops["unpackb"] = lambda: ormsgpack.unpackb(final)
        wall: dict[str, list[float]] = {k: [] for k in ops}
        cpu: dict[str, list[float]] = {k: [] for k in ops}
        for _ in range(rounds):
            for name, op in ops.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                op()
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    return {
        "final_bytes": len(final),
        "unpackb_s": statistics.median(wall["unpackb"]),
        "layouts": [
            {
                "layout": layout.name,
                "rows": len(layout.keys),
                "stored_bytes": sum(map(len, layout.stored)),
                "restore_s": statistics.median(wall[layout.name]),
                "restore_per_unpackb": median_ratio(wall[layout.name], wall["unpackb"]),
                "cpu_s": statistics.median(cpu[layout.name]),
                "cpu_per_unpackb": median_ratio(cpu[layout.name], cpu["unpackb"]),
            }
            for layout in layouts
        ],
    }


def compaction_disk(turns: int, size: int, group: int, vacuum_every: int) -> dict[str, Any]:
    """Bytes of pitstop_blobs after ``turns`` saves of one message (see the module)."""
    import psycopg

    items = messages(turns, size)
    vacuums: list[float] = []
    with scratch_schema() as (conn, schema), psycopg.connect(PG_URL, autocommit=True) as other:
        other.execute(f'SET search_path = "{schema}"')
        conn.execute("ALTER TABLE pitstop_blobs ADD COLUMN alias_offset bigint")
        pending: list[tuple[bytes, bytes]] = []
        compactions = 0
        for raw in items:
            key = key_of(raw)
            with conn.transaction():
                conn.execute(
                    "INSERT INTO pitstop_blobs (hash, data, size, created_at, run_id) "
                    "VALUES (%b, %b, %s, 0, 'bench') ON CONFLICT (hash) DO NOTHING",
                    (key, frame(raw, FMT, compress_threshold=128, checksum=False), len(raw) + 1),
                )
                pending.append((key, raw))
                if not group or len(pending) < group:
                    continue
                joined = b"".join(r for _, r in pending)
                target = key_of(joined)
                conn.execute(
                    "INSERT INTO pitstop_blobs (hash, data, size, created_at, run_id) "
                    "VALUES (%b, %b, %s, 0, 'bench') ON CONFLICT (hash) DO NOTHING",
                    (target, frame(joined, FMT, compress_threshold=128, checksum=False),
                     len(joined) + 1),
                )
                offsets, offset = [], 0
                for _, r in pending:
                    offsets.append(offset)
                    offset += len(r)
                conn.execute(
                    "UPDATE pitstop_blobs b SET data = '', alias = %b, alias_offset = u.o "
                    "FROM unnest(%b::bytea[], %s::bigint[]) AS u(h, o) WHERE b.hash = u.h",
                    (target, [k for k, _ in pending], offsets),
                )
                pending = []
                compactions += 1
            if vacuum_every and compactions % vacuum_every == 0:
                start = time.perf_counter()
                other.execute("VACUUM pitstop_blobs")
                vacuums.append(time.perf_counter() - start)
        total = conn.execute("SELECT pg_total_relation_size('pitstop_blobs')").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM pitstop_blobs").fetchone()[0]
    content = sum(map(len, items))
    return {
        "group": group,
        "vacuum_every": vacuum_every,
        "table_bytes": total,
        "per_content": total / content,
        "rows": rows,
        "vacuums": len(vacuums),
        "vacuum_s": statistics.median(vacuums) if vacuums else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--message", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--disk", action="store_true", help="also compaction's bytes on disk")
    parser.add_argument("--group", type=int, default=32, help="--disk: saves per group row")
    parser.add_argument("--vacuum-every", type=int, default=1,
                        help="--disk: compactions between two VACUUMs (0: never)")
    args = parser.parse_args()
    floor = restore_floor(args.turns, args.message, args.rounds)
    rows = [
        [r["layout"], str(r["rows"]), fmt_bytes(r["stored_bytes"]), fmt_time(r["restore_s"]),
         f"{r['restore_per_unpackb']:.1f}x", fmt_time(r["cpu_s"]), f"{r['cpu_per_unpackb']:.1f}x"]
        for r in floor["layouts"]
    ]
    markdown = (
        f"Restore of {args.turns} messages ({fmt_bytes(floor['final_bytes'])}), one statement, "
        f"checked and decoded; one unpackb {fmt_time(floor['unpackb_s'])}:\n\n"
        + table(["layout", "rows", "stored", "restore", "/unpackb (<= 5)", "CPU", "CPU/unpackb"],
                rows)
    )
    results: dict[str, Any] = {"floor": floor}
    if args.disk:
        disk = [
            compaction_disk(args.turns, args.message, 0, 0),
            compaction_disk(args.turns, args.message, args.group, 0),
            compaction_disk(args.turns, args.message, args.group, args.vacuum_every),
        ]
        results["disk"] = disk
        heading = "\n\nBytes of pitstop_blobs after the saves (heap, TOAST, indexes):\n\n"
        markdown += heading + table(
            ["layout", "rows", "table", "/ messages' bytes", "VACUUMs (median)"],
            [
                [
                    "a row a save" if not d["group"] else
                    f"compaction every {d['group']} saves, "
                    + (f"VACUUM every {d['vacuum_every']}" if d["vacuum_every"] else "no VACUUM"),
                    str(d["rows"]), fmt_bytes(d["table_bytes"]), f"{d['per_content']:.2f}x",
                    f"{d['vacuums']} ({fmt_time(d['vacuum_s'])})" if d["vacuum_s"] else "-",
                ]
                for d in disk
            ],
        )
    print(markdown)
    path = save_results("restore_floor", "bench/restore_floor.py", results, markdown)
    print(f"\n(results in {path})")


if __name__ == "__main__":
    main()
