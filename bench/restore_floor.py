"""What restoring the 2,000-turn conversation can cost on PostgreSQL, by row layout (issue #33,
target 4: a restore <= 5x one ``unpackb``): the same ~4 MiB of messages stored as one row a
message (what a store writes today, each save's new message a leaf of its own), as group rows
of several messages, and as one row, each read in one statement, checked and decoded as a
restore does, against one ``ormsgpack.unpackb`` of the list in the same rounds.

    .venv/bin/python bench/restore_floor.py               # restore by layout
    .venv/bin/python bench/restore_floor.py --disk        # also: compaction's bytes on disk
    .venv/bin/python bench/restore_floor.py --store-disk  # also: a compacted store's bytes
    .venv/bin/python bench/restore_floor.py --text '/usr/share/vim/vim90/doc/[a-u]*.txt'

* Each layout's rows go into a table like ``pitstop_blobs`` of a fresh store's schema (its
  storage settings: values inline up to 8,160 bytes, uncompressed by PostgreSQL, larger ones
  in TOAST), keyed by
  xxh3-128 of their raw bytes as chunks are; compressed rows are one zstd frame each
  (pitstop's ``frame``), decompressed by ``decompress_many`` as a restore does. Rows
  compressed by the server (*lz4* or *pglz* TOAST compression: the column's ``COMPRESSION``
  and ``STORAGE`` changed) are sent raw and decompressed by the server on every read: the
  client receives raw bytes, the server spends the CPU.
* A restore: ``SELECT hash, data ... WHERE hash = ANY(%b)`` (binary), every row checked
  against its key, the list decoded a group of rows at a time (``list_groups`` and the
  serializer's ``_loads_lists``). No transaction, head lookup or manifest: only the rows.
  Wall time, the client's CPU time, and the server process's CPU time (its
  ``/proc/PID/schedstat``: a server on this host only), each against one ``unpackb``.
* On disk, for each layout: its table's bytes (heap, TOAST, indexes) against the messages'.
* The messages are bench/growth.py's (random characters: zstd's entropy coder takes them to
  ~0.75x, lz4 and pglz, which only find repeats, to ~1.0x), or with ``--text`` slices of
  these files' text, in order (prose: repeats that lz4 and pglz find as well).
* ``--disk``: 2,000 saves of one message written as rows the way a save writes a leaf
  (compressed), and the same with *compaction*: every ``--group`` saves one compressed row
  of those messages, the leaves it replaces made alias rows (key, target, offset), with a
  ``VACUUM`` of the table after every ``--vacuum-every`` compactions (0: never). Bytes of
  the table (heap, TOAST, indexes) at the end, against the messages' bytes.
* ``--store-disk``: the whole store a conversation leaves, as ``bench/growth.py`` writes it
  (``turns`` saves of the growing list), then its latest list compacted into group rows of
  ``--store-group`` bytes (raw, zstd, or raw with the server's lz4) in a copy of
  ``pitstop_blobs``, each replaced leaf row made an alias row (key, target, offset); every
  table after ``VACUUM FULL``, summed (heap, TOAST, indexes), against the final list's
  serialised bytes (the growing-state disk target: <= 1.5x).

Timings on a shared 2-core machine are noisy: the ratios are medians of per-round ratios,
each round measuring every layout and the ``unpackb`` close together in time.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import ormsgpack
import xxhash
from _common import POSTGRES_URL, fmt_bytes, fmt_time, median_ratio, message, save_results, table

import pitstop
from pitstop.serde import chunks as chunking
from pitstop.serde.codec import MsgpackSerializer
from pitstop.serde.framing import COMPRESSED, decompress_many, frame

PG_URL = POSTGRES_URL
FMT = MsgpackSerializer().format_id


def conversation(turns: int, size: int, text: str | None = None) -> list[dict[str, Any]]:
    """bench/growth.py's conversation, or with ``text`` (a glob) its messages' content the
    consecutive slices of those files' text."""
    if text is None:
        rng = random.Random(12)
        return [message(rng, size, i) for i in range(turns)]
    words = "".join(
        Path(name).read_text(encoding="utf-8", errors="replace")
        for name in sorted(glob.glob(text))
    )
    if len(words) < turns * size:
        raise SystemExit(f"--text: {len(words)} characters, {turns * size} needed")
    return [
        {"role": "user" if i % 2 else "assistant", "content": words[i * size:(i + 1) * size]}
        for i in range(turns)
    ]


def messages(turns: int, size: int, text: str | None = None) -> list[bytes]:
    """Each message's msgpack encoding."""
    return [ormsgpack.packb(m) for m in conversation(turns, size, text)]


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


def server_cpu_clock(conn: Any) -> Callable[[], float] | None:
    """Seconds the connection's server process has spent on a CPU so far (Linux's
    ``schedstat``, nanoseconds), or None if it cannot be read (the server on another host)."""
    path = f"/proc/{conn.info.backend_pid}/schedstat"
    if not os.access(path, os.R_OK):
        return None

    def clock() -> float:
        with open(path) as f:
            return int(f.read().split()[0]) / 1e9

    return clock


def toast_settings(conn: Any, table_name: str, server_compression: str | None) -> None:
    """Storage settings of a ``pitstop_blobs``-like table: the store's (values inline up to a
    page, uncompressed), or with ``server_compression`` (lz4, pglz) TOAST compression on."""
    conn.execute(f"ALTER TABLE {table_name} SET (toast_tuple_target = 8160)")  # migration 7
    if server_compression:
        # EXTENDED: compressed, then out of line if still too large (MAIN keeps it inline
        # only while it fits a page: a group row of 16 KiB and more goes out of line either
        # way, the same bytes, so MAIN is not a layout of its own here).
        conn.execute(
            f"ALTER TABLE {table_name} ALTER COLUMN data SET STORAGE EXTENDED, "
            f"ALTER COLUMN data SET COMPRESSION {server_compression}"
        )


class Layout:
    """One way of storing the list: its rows' keys, in order, and each row's item count."""

    table = ""
    table_bytes = 0

    def __init__(
        self,
        name: str,
        groups: list[list[bytes]],
        compress: bool,
        server_compression: str | None = None,
    ) -> None:
        self.name = name
        self.compress = compress
        self.server_compression = server_compression
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
        toast_settings(conn, table_name, self.server_compression)
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table_name} (hash, data, size, created_at, run_id) "
                "VALUES (%b, %b, %s, 0, 'bench')",
                [(k, s, len(s)) for k, s in zip(self.keys, self.stored, strict=True)],
            )
        conn.execute(f"VACUUM ANALYZE {table_name}")
        self.table_bytes = conn.execute(
            "SELECT pg_total_relation_size(%s::regclass)", (table_name,)
        ).fetchone()[0]

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


def restore_floor(turns: int, size: int, rounds: int, text: str | None) -> dict[str, Any]:
    items = messages(turns, size, text)
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
        Layout("rows of 16 KiB, raw, server lz4 (TOAST)", grouped(items, 16 * 1024), False,
               "lz4"),
        Layout("rows of 64 KiB, raw, server lz4 (TOAST)", grouped(items, 64 * 1024), False,
               "lz4"),
        Layout("rows of 256 KiB, raw, server lz4 (TOAST)", grouped(items, 256 * 1024), False,
               "lz4"),
        Layout("rows of 64 KiB, raw, server pglz (TOAST)", grouped(items, 64 * 1024), False,
               "pglz"),
    ]
    reader = MsgpackSerializer()
    with scratch_schema() as (conn, _):
        for i, layout in enumerate(layouts):
            layout.insert(conn, f"floor_{i}")
        compressed_by_server = {
            layout.name: conn.execute(
                "SELECT count(pg_column_compression(data)), sum(pg_column_size(data)) "
                f"FROM {layout.table}"
            ).fetchone()
            for layout in layouts
        }
        server_clock = server_cpu_clock(conn)
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
        server: dict[str, list[float]] = {k: [] for k in ops}
        server_now = server_clock or (lambda: 0.0)
        for _ in range(rounds):
            for name, op in ops.items():
                start_server = server_now()
                start, start_cpu = time.perf_counter(), time.process_time()
                op()
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
                server[name].append(server_now() - start_server)
    content = sum(map(len, items))
    return {
        "final_bytes": len(final),
        "messages_bytes": content,
        "unpackb_s": statistics.median(wall["unpackb"]),
        "layouts": [
            {
                "layout": layout.name,
                "rows": len(layout.keys),
                "stored_bytes": sum(map(len, layout.stored)),
                "server_compressed_rows": compressed_by_server[layout.name][0],
                "column_bytes": compressed_by_server[layout.name][1],
                "table_bytes": layout.table_bytes,
                "table_per_content": layout.table_bytes / content,
                "restore_s": statistics.median(wall[layout.name]),
                "restore_per_unpackb": median_ratio(wall[layout.name], wall["unpackb"]),
                "cpu_s": statistics.median(cpu[layout.name]),
                "cpu_per_unpackb": median_ratio(cpu[layout.name], cpu["unpackb"]),
                "server_cpu_per_unpackb": (
                    median_ratio(server[layout.name], cpu["unpackb"]) if server_clock else None
                ),
            }
            for layout in layouts
        ],
    }


def compaction_disk(
    turns: int, size: int, group: int, vacuum_every: int, text: str | None
) -> dict[str, Any]:
    """Bytes of pitstop_blobs after ``turns`` saves of one message (see the module)."""
    import psycopg

    items = messages(turns, size, text)
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


def schema_bytes(conn: Any, schema: str, leave_out: list[str]) -> int:
    """Bytes of a schema's tables (heap, TOAST, indexes), but for those left out."""
    row = conn.execute(
        "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname <> ALL(%s)",
        (schema, leave_out),
    ).fetchone()
    return int(row[0])


STORE_COMPACTIONS = [("raw", None), ("zstd", None), ("raw", "lz4")]
"""The group rows a compacted store is measured with: (client frame, server compression)."""


def table_parts(conn: Any, table_name: str) -> list[int]:
    """A table's bytes: its heap, its TOAST (and free space and visibility maps: none after
    ``VACUUM FULL``) and its indexes."""
    heap, table_bytes, indexes = conn.execute(
        "SELECT pg_relation_size(%s::regclass), pg_table_size(%s::regclass), "
        "pg_indexes_size(%s::regclass)", (table_name, table_name, table_name)
    ).fetchone()
    return [heap, table_bytes - heap, indexes]


def vacuum_full(conn: Any, tables: list[str]) -> int:
    """``VACUUM FULL`` of these tables, again while it keeps dead rows that another session's
    snapshot may still see (the server is shared); the dead rows kept."""
    kept: list[int] = []

    def on_notice(diagnostic: Any) -> None:
        detail = diagnostic.message_detail or ""
        found = re.match(r"(\d+) dead row versions cannot be removed", detail)
        if found:
            kept.append(int(found.group(1)))

    conn.add_notice_handler(on_notice)
    try:
        for _ in range(20):
            kept.clear()
            conn.execute(f"VACUUM (FULL, VERBOSE) {', '.join(tables)}")
            if not sum(kept):
                break
            time.sleep(0.5)
    finally:
        conn.remove_notice_handler(on_notice)
    return sum(kept)


class Compaction(NamedTuple):
    """A list's leaves in group rows: the rows (key, raw bytes) and, for each replaced leaf,
    its key, its group row's and its offset there."""

    groups: list[tuple[bytes, bytes]]
    replaced: list[bytes]
    targets: list[bytes]
    offsets: list[int]


def compaction_of(leaves: list[Any], items: list[bytes], group_bytes: int) -> Compaction:
    """Consecutive leaves in group rows of at least ``group_bytes``; ``items`` the list's."""
    leaf_raws: list[bytes] = []  # from each leaf's item count: one save's new messages
    start = 0
    for leaf in leaves:
        leaf_raws.append(b"".join(items[start:start + leaf.items]))
        start += leaf.items
    if start != len(items) or any(
        key_of(raw) != leaf.key for raw, leaf in zip(leaf_raws, leaves, strict=True)
    ):
        raise AssertionError("the layout's leaves are not the messages")
    compaction = Compaction([], [], [], [])
    start = 0
    for group in grouped(leaf_raws, group_bytes):
        joined = b"".join(group)
        compaction.groups.append((key_of(joined), joined))
        offset = 0
        for leaf, raw in zip(leaves[start:start + len(group)], group, strict=True):
            compaction.replaced.append(leaf.key)
            compaction.targets.append(compaction.groups[-1][0])
            compaction.offsets.append(offset)
            offset += len(raw)
        start += len(group)
    return compaction


def write_compacted(
    conn: Any, table_name: str, compaction: Compaction, client: str, server: str | None
) -> None:
    """A copy of ``pitstop_blobs`` as compaction leaves it: the group rows (zstd frames or
    raw ones, ``server`` the column's compression), the replaced leaves alias rows. Written
    with no row updated: an UPDATE's dead rows could outlive a ``VACUUM FULL`` while another
    session's snapshot is open."""
    columns = "hash, data, size, created_at, location, alias, pack, pack_offset, run_id"
    conn.execute(f"CREATE TABLE {table_name} (LIKE pitstop_blobs INCLUDING ALL)")
    toast_settings(conn, table_name, server)
    conn.execute(f"ALTER TABLE {table_name} ADD COLUMN alias_offset bigint")
    conn.execute(
        f"INSERT INTO {table_name} ({columns}) SELECT {columns} FROM pitstop_blobs "
        "WHERE hash <> ALL(%b)",
        (compaction.replaced,),
    )
    conn.execute(
        f"INSERT INTO {table_name} ({columns}, alias_offset) "
        "SELECT b.hash, '', b.size, b.created_at, b.location, u.target, b.pack, "
        "b.pack_offset, b.run_id, u.o FROM pitstop_blobs b "
        "JOIN unnest(%b::bytea[], %b::bytea[], %s::bigint[]) AS u(h, target, o) "
        "ON b.hash = u.h",
        (compaction.replaced, compaction.targets, compaction.offsets),
    )
    threshold = 128 if client == "zstd" else None
    stored = [
        (key, frame(joined, FMT, compress_threshold=threshold, checksum=False))
        for key, joined in compaction.groups
    ]
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table_name} (hash, data, size, created_at, run_id) "
            "VALUES (%b, %b, %s, 0, 'bench')",
            [(key, data, len(data)) for key, data in stored],
        )


def compacted_store_disk(
    turns: int, size: int, group_bytes: int, text: str | None
) -> dict[str, Any]:
    """The whole store a conversation leaves, as written and compacted (see the module)."""
    said: list[Any] = []
    with scratch_schema() as (conn, schema):
        store = pitstop.open_store(f"{PG_URL}?schema={schema}")
        try:
            for turn_message in conversation(turns, size, text):
                said.append(turn_message)
                checkpoint = store.save("conversation", {"messages": said})
            ref = store._parent(checkpoint.id).fields["messages"]  # type: ignore[attr-defined]
            leaves = store._value_codec.layout_of(ref).leaves  # type: ignore[attr-defined]
        finally:
            store.close()
        final = ormsgpack.packb(said)
        compaction = compaction_of(leaves, [ormsgpack.packb(m) for m in said], group_bytes)
        store_tables = [
            name for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            )
        ]
        dead_kept = vacuum_full(conn, store_tables)
        others = schema_bytes(conn, schema, ["pitstop_blobs"])
        results = [{
            "layout": "as written (a row a save's messages, compressed)",
            "rows": conn.execute("SELECT count(*) FROM pitstop_blobs").fetchone()[0],
            "blobs_bytes": schema_bytes(conn, schema, []) - others,
            "blobs_parts": table_parts(conn, "pitstop_blobs"),
            "dead_rows_kept": dead_kept,
        }]
        for i, (client, server) in enumerate(STORE_COMPACTIONS):
            table_name = f"compacted_{i}"
            write_compacted(conn, table_name, compaction, client, server)
            dead_kept = vacuum_full(conn, [table_name])
            results.append({
                "layout": f"latest list compacted into rows of {group_bytes // 1024} KiB, "
                f"{client}" + (f", server {server}" if server else ""),
                "rows": conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0],
                "blobs_bytes": conn.execute(
                    "SELECT pg_total_relation_size(%s::regclass)", (table_name,)
                ).fetchone()[0],
                "blobs_parts": table_parts(conn, table_name),
                "dead_rows_kept": dead_kept,
            })
    for r in results:
        r["store_bytes"] = others + r["blobs_bytes"]
        r["per_final"] = r["store_bytes"] / len(final)
    return {"final_bytes": len(final), "other_tables_bytes": others, "stores": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--message", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--text", help="messages' content from these files (a glob), not "
                        "random characters")
    parser.add_argument("--disk", action="store_true", help="also compaction's bytes on disk")
    parser.add_argument("--group", type=int, default=32, help="--disk: saves per group row")
    parser.add_argument("--vacuum-every", type=int, default=1,
                        help="--disk: compactions between two VACUUMs (0: never)")
    parser.add_argument("--store-disk", action="store_true",
                        help="also a compacted store's bytes on disk")
    parser.add_argument("--store-group", type=int, default=64 * 1024,
                        help="--store-disk: bytes of a group row")
    args = parser.parse_args()
    floor = restore_floor(args.turns, args.message, args.rounds, args.text)
    rows = [
        [r["layout"], str(r["rows"]), fmt_bytes(r["stored_bytes"]),
         f"{r['table_per_content']:.2f}x", fmt_time(r["restore_s"]),
         f"{r['restore_per_unpackb']:.1f}x", f"{r['cpu_per_unpackb']:.1f}x",
         "-" if r["server_cpu_per_unpackb"] is None else f"{r['server_cpu_per_unpackb']:.1f}x"]
        for r in floor["layouts"]
    ]
    markdown = (
        f"Restore of {args.turns} messages ({fmt_bytes(floor['final_bytes'])}, "
        f"{args.text or 'random characters'}), one statement, "
        f"checked and decoded; one unpackb {fmt_time(floor['unpackb_s'])}:\n\n"
        + table(["layout", "rows", "sent", "table/messages", "restore", "/unpackb (<= 5)",
                 "CPU/unpackb", "server CPU/unpackb"], rows)
    )
    results: dict[str, Any] = {"text": args.text or "random characters", "floor": floor}
    if args.disk:
        disk = [
            compaction_disk(args.turns, args.message, 0, 0, args.text),
            compaction_disk(args.turns, args.message, args.group, 0, args.text),
            compaction_disk(args.turns, args.message, args.group, args.vacuum_every, args.text),
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
    if args.store_disk:
        stores = compacted_store_disk(args.turns, args.message, args.store_group, args.text)
        results["store_disk"] = stores
        markdown += (
            f"\n\nThe store after {args.turns} saves, VACUUM FULL (final list "
            f"{fmt_bytes(stores['final_bytes'])}; the other tables "
            f"{fmt_bytes(stores['other_tables_bytes'])}):\n\n"
            + table(
                ["pitstop_blobs", "rows", "pitstop_blobs (heap, TOAST, indexes)", "store",
                 "/ final list (<= 1.5)", "dead rows kept"],
                [
                    [s["layout"], str(s["rows"]),
                     f"{fmt_bytes(s['blobs_bytes'])} ("
                     + ", ".join(fmt_bytes(part) for part in s["blobs_parts"]) + ")",
                     fmt_bytes(s["store_bytes"]), f"{s['per_final']:.2f}x",
                     str(s["dead_rows_kept"])]
                    for s in stores["stores"]
                ],
            )
        )
    print(markdown)
    path = save_results("restore_floor", "bench/restore_floor.py", results, markdown)
    print(f"\n(results in {path})")


if __name__ == "__main__":
    main()
