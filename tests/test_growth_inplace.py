"""SQLite and memory stores keep a growing list's superseded open chunk as an alias (the first
bytes of the chunk that extends it). The longer chunk is written into the superseded one's
row and the alias becomes a new small row, so the leaf pages the big rows used stay full
(issue #12: a conversation's leaf pages had ended 40% empty). Every checkpoint keeps its own
value: forks from an old checkpoint, runs sharing the open chunk, GC and verify."""

from __future__ import annotations

import random
import sqlite3
import string
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import Append, RetentionPolicy, Store


def _message(rng: random.Random, i: int) -> dict[str, Any]:
    return {"i": i, "content": "".join(rng.choices(string.ascii_letters + " ", k=2048))}


def _rows(store: Store) -> list[tuple[bytes, int, Any]]:
    rows = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.all("SELECT hash, length(data), alias FROM pitstop_blobs")
    )
    return [(bytes(h), int(n), a) for h, n, a in rows if len(bytes(h)) == 17]


@pytest.mark.parametrize("store_url", ["sqlite", "memory"], indirect=True)
def test_every_checkpoint_of_a_growing_list_keeps_its_value(store: Store) -> None:
    rng = random.Random(1)
    msgs: list[dict[str, Any]] = []
    for i in range(120):
        msg = _message(rng, i)
        msgs.append(msg)
        if i % 2:
            store.save("conv", {"messages": Append([msg]), "turn": i})
        else:
            store.save("conv", {"messages": msgs, "turn": i})
    for summary in store.history("conv", limit=None):
        ckpt = store.get(summary.id)
        assert ckpt.state["messages"] == msgs[: ckpt.state["turn"] + 1]
    rows = _rows(store)
    aliases = [r for r in rows if r[2] is not None]
    assert len(aliases) > 80  # nearly every save superseded the open chunk
    assert all(n == 0 for _, n, a in rows if a is not None)
    assert store.verify() == []


@pytest.mark.parametrize("store_url", ["sqlite", "memory"], indirect=True)
def test_forks_and_runs_sharing_the_open_chunk(store: Store) -> None:
    rng = random.Random(2)
    base = [_message(rng, i) for i in range(30)]
    store.save("a", {"messages": base})
    store.save("b", {"messages": base})  # the same chunks, the same open one
    early = store.save("a", {"messages": [*base, _message(rng, 30)]})
    a_msgs = [*base, early.state["messages"][-1]]
    b_extra = _message(rng, 99)
    for i in range(31, 40):  # a grows on; its first open chunk is an alias long since
        msg = _message(rng, i)
        a_msgs.append(msg)
        store.save("a", {"messages": Append([msg])})
    store.save("b", {"messages": [*base, b_extra]})  # b extends what is now an alias
    same = store.save("b", {"messages": [*base, b_extra, a_msgs[31]]})
    store.fork(early.id, new_run_id="fork")
    fork_msgs = [*early.state["messages"], b_extra]
    store.save("fork", {"messages": fork_msgs})  # extends a's superseded open chunk again
    assert store.latest("a").state["messages"] == a_msgs  # type: ignore[union-attr]
    assert store.get(same.id).state["messages"] == [*base, b_extra, a_msgs[31]]
    assert store.latest("fork").state["messages"] == fork_msgs  # type: ignore[union-attr]
    assert store.get(early.id).state["messages"] == a_msgs[:31]
    assert store.verify() == []
    # Retention drops every checkpoint of a but its head: what is left still loads.
    store.prune(RetentionPolicy(keep_last=1), run_id="a")
    assert store.latest("a").state["messages"] == a_msgs  # type: ignore[union-attr]
    assert store.latest("b").state["messages"] == [*base, b_extra, a_msgs[31]]  # type: ignore[union-attr]
    assert store.latest("fork").state["messages"] == fork_msgs  # type: ignore[union-attr]
    assert store.verify() == []
    store.delete_run("a")  # the run whose saves moved the shared rows
    assert store.latest("b").state["messages"] == [*base, b_extra, a_msgs[31]]  # type: ignore[union-attr]
    assert store.latest("fork").state["messages"] == fork_msgs  # type: ignore[union-attr]
    assert store.verify() == []


def test_leaf_pages_stay_full(tmp_path: Path) -> None:
    path = tmp_path / "grow.db"
    store = pitstop.open_store(f"sqlite:///{path}")
    rng = random.Random(3)
    msgs: list[dict[str, Any]] = []
    for i in range(300):
        msgs.append(_message(rng, i))
        store.save("conv", {"messages": msgs})
    store.close()
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        row = conn.execute(
            "SELECT sum(pgsize), sum(unused) FROM dbstat "
            "WHERE name = 'pitstop_blobs' AND pagetype = 'leaf'"
        ).fetchone()
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    finally:
        conn.close()
    size, unused = row
    assert unused < 0.3 * size, (unused, size)  # was ~0.42 with aliases shrunk in place
