"""PostgreSQL reads a value's chunks in one statement (issue #12: "chunks of one field are
fetched in a batch"): ``x IN ({in})`` over many keys is sent as ``x = ANY(%b)``, one binary
array parameter, rows in binary. Values of more chunks than one ``IN`` list held before
(500) round-trip, and the other statements that go this way (deletes, checkpoint lists,
value sizes) do what they did."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest

from pitstop import RetentionPolicy, Store
from pitstop.store.engine.backend import CHUNK, _as_any


def test_only_one_in_list_is_rewritten() -> None:
    assert _as_any("SELECT a FROM t WHERE a IN ({in})") == "SELECT a FROM t WHERE a = ANY(%b)"
    with pytest.raises(ValueError, match="one"):
        _as_any("SELECT a FROM t WHERE a IN ({in}) OR b IN ({in})")


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.slow
def test_a_value_of_more_chunks_than_an_in_list_round_trips(store: Store) -> None:
    rng = random.Random(5)
    msgs: list[dict[str, Any]] = []
    for i in range(600):  # sealed on PostgreSQL: a chunk per save (and index nodes)
        msgs.append({"i": i, "text": "".join(rng.choices(string.ascii_letters, k=2100))})
        store.save("big", {"messages": msgs})
    chunk_rows = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.scalar("SELECT count(*) FROM pitstop_blobs")
    )
    assert chunk_rows > CHUNK
    assert store.latest("big").state["messages"] == msgs  # type: ignore[union-attr]
    ids = [s.id for s in store.history("big", limit=None)]
    loaded = store.get_many(ids)
    assert {cid: len(c.state["messages"]) for cid, c in loaded.items()} == {
        s.id: s.step + 1 for s in store.history("big", limit=None)
    }
    assert store.verify() == []
    before = store.stats().bytes
    report = store.prune(RetentionPolicy(keep_last=1), run_id="big")
    assert len(report.checkpoints) == len(ids) - 1 and report.blobs > 0
    assert store.latest("big").state["messages"] == msgs  # type: ignore[union-attr]
    assert store.stats().bytes <= before
    store.delete_run("big")
    left = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.scalar("SELECT count(*) FROM pitstop_blobs")
    )
    assert left == 0
