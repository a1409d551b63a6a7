"""Records attached to a checkpoint (``Store.attach``, ``save(attach=...)``), kept in its row:
every backend, through the public API, and what travels with the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import ConflictError, CorruptCheckpointError, RetentionPolicy, Store, archive
from pitstop.archive import import_archive, read_archive, write_archive


def _raw(store: Store, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Rows read behind the API (through the store's own connection): where things are."""
    return store._query(sql, params)  # type: ignore[attr-defined,no-any-return]


def _in_rows(store: Store, run_id: str) -> set[str]:
    return {r[0] for r in _raw(store, "SELECT id FROM pitstop_checkpoints WHERE run_id = ? "
                                      "AND writes IS NOT NULL", (run_id,))}


def test_attached_records_are_kept_once_or_replaced(store: Store) -> None:
    first = store.save("r", {"a": 1})
    store.attach("r", first.id, {"k": b"one"})
    store.attach("r", first.id, {"k": b"two", "j": [1, 2]})  # k is kept
    assert store.attachments("r", first.id) == {"j": [1, 2], "k": b"one"}
    store.attach("r", first.id, {"k": {"three": 3}}, replace=True)
    store.attach("r", first.id, {"k": "four"})  # kept again: the replaced value
    assert store.attachments("r", first.id) == {"j": [1, 2], "k": {"three": 3}}
    # In the checkpoint's row, which is not changed otherwise: same checksum, same state.
    assert _in_rows(store, "r") == {first.id}
    assert _raw(store, "SELECT COUNT(*) FROM pitstop_effects")[0][0] == 0
    again = store.get(first.id)
    assert again.checksum == first.checksum and again.state == {"a": 1}
    # Separate from effect records.
    assert store.effects("r") == {} and store.get_effect("r", "k") == (False, None)
    assert store.attachments("r", "nothing") == {}
    assert store.verify() == []


def test_records_attached_before_their_checkpoint_is_written(store: Store) -> None:
    store.save("r", {"a": 1})
    store.attach("r", "later", {"early": 1})  # no such row yet: kept as an effect record
    store.save("r", {"a": 2}, checkpoint_id="later")
    store.attach("r", "later", {"early": 2, "next": 3})
    assert store.attachments("r", "later") == {"early": 1, "next": 3}
    store.attach("r", "later", {"early": 4}, replace=True)
    assert store.attachments("r", "later") == {"early": 4, "next": 3}


def test_save_attaches_in_its_transaction(store: Store) -> None:
    first = store.save("r", {"a": 1})
    second = store.save("r", {"a": 2}, attach={first.id: {"w": 1}})
    assert store.attachments("r", first.id) == {"w": 1}
    # Several checkpoints, the new one's own (into the row it inserts, id chosen by the caller).
    store.save("r", {"a": 3}, checkpoint_id="third",
               attach={first.id: {"w": 2, "x": 2}, "third": {"own": "x"}, second.id: {}})
    assert store.attachments("r", "third") == {"own": "x"}
    assert store.attachments("r", first.id) == {"w": 1, "x": 2}
    assert store.attachments("r", second.id) == {}
    assert store.get("third").checksum == store.history("r", limit=1)[0].checksum
    # A refused save attaches nothing.
    with pytest.raises(ConflictError):
        store.save("r", {"a": 4}, expected_head=second.id, attach={first.id: {"lost": 1}})
    assert "lost" not in store.attachments("r", first.id)
    # A step continuing the run, with records for a checkpoint not written yet.
    store.save("r", {"a": 4}, attach={"nowhere": {"z": 1}, first.id: {"y": 1}})
    assert store.attachments("r", "nowhere") == {"z": 1}
    assert store.attachments("r", first.id) == {"w": 1, "x": 2, "y": 1}
    # A run's first save, and records for a checkpoint that does not exist yet.
    store.save("fresh", {"a": 1}, checkpoint_id="f1", attach={"f1": {"k": 1}, "f9": {"q": 9}})
    assert store.attachments("fresh", "f1") == {"k": 1}
    assert store.attachments("fresh", "f9") == {"q": 9}
    assert store.verify() == []


@pytest.mark.slow
def test_stores_before_schema_8_keep_their_effect_records(store: Store) -> None:
    # Pending writes as integrations recorded them before: effect records naming the
    # checkpoint. Read with what is attached since.
    first = store.save("r", {"a": 1})
    store.record_effects("r", {"old": 1, "both": 1}, checkpoint_id=first.id)
    store.attach("r", first.id, {"new": 2, "both": 2})
    assert store.attachments("r", first.id) == {"both": 1, "new": 2, "old": 1}


def test_attached_records_go_where_their_checkpoint_goes(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = store.save("r", {"a": 1})
    store.save("r", {"a": 2}, attach={first.id: {"w": [1]}})
    head = store.save("r", {"a": 3})
    store.attach("r", head.id, {"h": "head"})
    # Export and import (another store), an archive, a renamed copy.
    other = pitstop.open_store("memory://")
    other.import_run(store.export_run("r"))
    assert other.attachments("r", first.id) == {"w": [1]}
    assert other.attachments("r", head.id) == {"h": "head"}
    assert other.verify() == []
    path = tmp_path / "r.pitstop"
    write_archive(store, "r", path)
    _, data = read_archive(path)
    third = pitstop.open_store("memory://")
    copy = import_archive(third, data, run_id="copy")
    assert copy.head_id is not None and third.attachments("copy", copy.head_id) == {"h": "head"}
    # A pitstop that reads only version 2 ignores keys it does not know: it would import the
    # checkpoints without their records, so the version says they are there and it refuses.
    monkeypatch.setattr(archive, "VERSION", 2)
    with pytest.raises(archive.ArchiveError, match="newer than this pitstop"):
        read_archive(path)
    monkeypatch.undo()
    # Pruned with the checkpoint.
    store.prune(RetentionPolicy(keep_last=1))
    assert store.attachments("r", first.id) == {}
    assert store.attachments("r", head.id) == {"h": "head"}


def test_a_damaged_attached_record_is_found(store: Store) -> None:
    first = store.save("r", {"a": 1})
    store.attach("r", first.id, {"k": "value " * 10, "j": 1})

    def flip(tx: Any) -> None:
        data = bytes(tx.one("SELECT writes FROM pitstop_checkpoints WHERE id = ?",
                            (first.id,))[0])
        bad = data[:-2] + bytes(b ^ 0xFF for b in data[-2:])
        tx.run("UPDATE pitstop_checkpoints SET writes = ? WHERE id = ?", (bad, first.id))

    store._tx(flip, write=True)  # type: ignore[attr-defined]
    with pytest.raises(CorruptCheckpointError) as info:
        store.attachments("r", first.id)
    assert info.value.checkpoint_id == first.id and info.value.run_id == "r"
    problems = store.verify()
    assert [(p.kind, p.id) for p in problems] == [("checkpoint", first.id)]
    assert "attached records" in problems[0].message
    # The checkpoint itself still loads: its checksum does not cover them.
    assert store.get(first.id).state == {"a": 1}
    with pytest.raises(CorruptCheckpointError):
        pitstop.open_store("memory://").import_run(store.export_run("r"))
