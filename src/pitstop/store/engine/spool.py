"""A run's records read a page at a time into a temporary file: an export of a run with very
many checkpoints, inputs or effect records holds one page of rows in memory, not all of them.

``Store.export_run(stream=True)`` reads each table of the run in keyset pages of
:data:`PAGE` rows inside its one read transaction (so the export is still one snapshot),
appends every row to a :class:`RecordSpool`, and an archive writer then iterates the spool
as often as it needs (verify, measure, write), each pass reading the file back in pieces.
Rows are kept as msgpack lists of their column values: ints, floats, text, bytes and NULL
come back exactly as the store returned them, so an archive written from a spool is byte for
byte the one written from lists of the same rows.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, TypeVar

import ormsgpack

from .backend import Tx
from .schema import Table

R = TypeVar("R")

PAGE = 500
"""Rows read by one statement of a spooled export."""
IN_MEMORY = 8 << 20
"""A spool keeps up to this many bytes in memory, beyond it in a temporary file."""
_LENGTH = struct.Struct(">I")
_PIECE = 1 << 20
"""The file is read back this much at a time."""


class RecordSpool(Collection[R]):
    """Records of one kind in the order they were added, their rows in a temporary file.

    Sized and iterable (each iteration independent of the others); not indexable. A store's
    records are unique by its keys, so an export checks a spool for duplicates no more
    (:func:`pitstop.store.engine.rowcheck.export_problem`)."""

    __slots__ = ("_count", "_end", "_file", "_make")

    def __init__(self, make: Callable[..., R], *, in_memory: int | None = None) -> None:
        self._make = make
        self._file = tempfile.SpooledTemporaryFile(  # noqa: SIM115 (closed by close())
            max_size=IN_MEMORY if in_memory is None else in_memory)
        self._count = 0
        self._end = 0

    def add(self, row: Sequence[Any]) -> None:
        """Append one row (the record's column values, in its fields' order)."""
        packed = ormsgpack.packb([bytes(v) if isinstance(v, memoryview) else v for v in row])
        self._file.seek(self._end)
        self._file.write(_LENGTH.pack(len(packed)))
        self._file.write(packed)
        self._end += _LENGTH.size + len(packed)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __contains__(self, item: object) -> bool:  # (a scan: Collection asks for it)
        return any(record == item for record in self)

    def __iter__(self) -> Iterator[R]:
        offset = 0
        end = self._end
        while offset < end:
            # Re-seek for each piece: another iteration may have moved the file meanwhile.
            self._file.seek(offset)
            buf = self._file.read(min(_PIECE, end - offset))
            at = 0
            while at + _LENGTH.size <= len(buf):
                (length,) = _LENGTH.unpack_from(buf, at)
                if at + _LENGTH.size + length > len(buf):
                    if at == 0:  # a record larger than a piece: read it whole
                        self._file.seek(offset)
                        buf = self._file.read(_LENGTH.size + length)
                        continue
                    break
                row = ormsgpack.unpackb(buf[at + _LENGTH.size : at + _LENGTH.size + length])
                at += _LENGTH.size + length
                yield self._make(*row)
            offset += at

    def close(self) -> None:
        """Give the temporary file back (also done when this is garbage-collected)."""
        self._file.close()


def spool_rows(
    tx: Tx, table: Table, make: Callable[..., R], run_id: str, *, order: str,
    page: int | None = None, convert: Callable[[Sequence[Any]], Sequence[Any]] | None = None,
) -> RecordSpool[R]:
    """Every row of ``table`` for ``run_id`` ordered by ``order`` (a column unique within
    the run: an index after ``run_id`` keeps each page a range read), into a spool, read in
    keyset pages of ``page`` rows (default :data:`PAGE`): as the one ``ORDER BY`` statement
    would return them; each row made ``convert(row)`` first if given."""
    page = PAGE if page is None else page
    key = table.columns.index(order)
    base = f"SELECT {table.column_list()} FROM {table.name} WHERE run_id = ?"
    first = f"{base} ORDER BY {order} LIMIT {int(page)}"
    rest = f"{base} AND {order} > ? ORDER BY {order} LIMIT {int(page)}"
    spool: RecordSpool[R] = RecordSpool(make)
    rows = tx.all(first, (run_id,))
    while rows:
        for row in rows:
            spool.add(row if convert is None else convert(row))
        if len(rows) < page:
            break
        rows = tx.all(rest, (run_id, rows[-1][key]))
    return spool


__all__ = ["IN_MEMORY", "PAGE", "RecordSpool", "spool_rows"]
