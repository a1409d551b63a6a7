"""Large values in a blob store (a directory), on SQLite and PostgreSQL; schema upgrades."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pitstop
from oldstore import write_old
from pitstop import CorruptCheckpointError, RetentionPolicy, RunStatus, StoreError
from pitstop.store.encoding.blobs import DirectoryBlobStore
from pitstop.store.engine import schema as store_schema

BIG = os.urandom(300_000)  # incompressible: its stored size stays above the threshold
BIG2 = os.urandom(300_000)


@pytest.fixture
def url(shared_url: str) -> str:
    return shared_url


@pytest.fixture
def blob_dir(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


@pytest.fixture
def opener(url: str, blob_dir: Path) -> Iterator[Callable[..., pitstop.Store]]:
    opened: list[pitstop.Store] = []

    def open_(**options: Any) -> pitstop.Store:
        options.setdefault("blobs", str(blob_dir))
        options.setdefault("blob_threshold", 100_000)
        store = pitstop.open_store(url, **options)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def files(blob_dir: Path) -> list[Path]:
    """Files named by a value's key (a value written alone), then packs (the values one save
    adds together)."""
    return sorted(blob_dir.glob("*/*/*.blob")) + sorted(blob_dir.glob("packs/*/*.pack"))


def test_large_values_live_in_the_blob_store(opener: Callable[..., pitstop.Store],
                                             blob_dir: Path) -> None:
    store = opener()
    first = store.save("r", {"doc": BIG, "note": "small stays in the table " * 3})
    for i in range(5):
        store.save("r", {"doc": BIG, "note": "small stays in the table " * 3, "i": i})
    store.save("other", {"doc": BIG})  # shared, not copied
    assert len(files(blob_dir)) == 1
    assert store.get(first.id).state["doc"] == BIG
    stats = store.stats()
    assert stats.blobs == 2  # the big one (as a row pointing at the file) and the note
    assert store.verify() == []
    # a fresh handle on the same store reads it back
    assert opener().latest("other").state == {"doc": BIG}  # type: ignore[union-attr]


def test_collected_with_the_last_reference(opener: Callable[..., pitstop.Store],
                                           blob_dir: Path) -> None:
    store = opener()
    store.save("a", {"doc": BIG})
    store.save("b", {"doc": BIG})
    store.save("b", {"doc": BIG2})
    assert len(files(blob_dir)) == 2
    store.delete_run("a")
    assert len(files(blob_dir)) == 2  # `b` still holds BIG in its first checkpoint
    store.prune(RetentionPolicy(keep_last=1), run_id="b")
    assert len(files(blob_dir)) == 1  # BIG is gone; BIG2 is b's head
    assert store.latest("b").state == {"doc": BIG2}  # type: ignore[union-attr]
    store.delete_run("b")
    assert files(blob_dir) == []
    assert store.verify() == []


def test_damaged_or_missing_files_are_detected(opener: Callable[..., pitstop.Store],
                                               blob_dir: Path) -> None:
    store = opener()
    good = store.save("r", {"doc": BIG2, "n": 1})
    bad = store.save("r", {"doc": BIG, "n": 2})
    path = next(p for p in files(blob_dir) if p.read_bytes().endswith(BIG[-100:]))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError) as info:
        store.latest("r")
    assert info.value.checkpoint_id == bad.id and info.value.field == "doc"
    assert store.latest("r", fallback=True).id == good.id  # type: ignore[union-attr]
    assert [p.kind for p in store.verify()] == ["blob"]
    path.unlink()
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.get(bad.id)
    assert any("missing" in p.message for p in store.verify())


@pytest.mark.parametrize("durability", ["normal", "full"])
@pytest.mark.slow
def test_a_short_file_is_written_again_not_reused(
    opener: Callable[..., pitstop.Store], blob_dir: Path, durability: str
) -> None:
    """What power loss can leave of an unsynced file (``normal``): the right name, too few
    bytes. Detected on load; the next save of the same bytes rewrites it instead of trusting
    the name; array chunks read into place say so too."""
    np = pytest.importorskip("numpy")
    store = opener(durability=durability)
    weights = np.arange(300_000, dtype=np.float64)  # 2.4 MB: chunks of 1 MiB in files
    first = store.save("r", {"doc": BIG, "w": weights})
    (pack,) = files(blob_dir)  # the values one save adds share one pack
    assert pack.suffix == ".pack"
    pack.write_bytes(pack.read_bytes()[: 1000])
    with pytest.raises(CorruptCheckpointError):
        store.get(first.id)
    assert "ends at byte 1000" in " ".join(p.message for p in store.verify())
    with opener() as fresh:
        with pytest.raises(CorruptCheckpointError):
            fresh.get(first.id)
        fresh.save("other", {"doc": BIG, "w": weights.copy()})  # a new run: every value new
        (new,) = set(files(blob_dir)) - {pack}
        assert new.stat().st_size > BIG.__len__() + weights.nbytes
        assert fresh.get(first.id).state["doc"] == BIG  # the old checkpoint is whole again
        np.testing.assert_array_equal(fresh.get(first.id).state["w"], weights)
    assert store.verify() == []


def test_large_arrays_hashed_and_read_by_threads_round_trip_and_detect_damage(
    opener: Callable[..., pitstop.Store], blob_dir: Path
) -> None:
    """Values of 8 MiB and more are hashed on save, and read and checked on load, by several
    threads (serde/parallel.py): the same bytes come back, and a damaged chunk in the middle
    still fails the load, naming the field."""
    np = pytest.importorskip("numpy")
    from pitstop.serde import parallel

    assert parallel.PARALLEL_MIN <= 12 << 20
    store = opener()
    rng = np.random.default_rng(7)
    alone = rng.standard_normal(3 << 20, dtype=np.float32)  # 12 MiB: the ndarray kind
    model = {"w": rng.standard_normal(3 << 20, dtype=np.float32), "step": 3}  # parts
    saved = store.save("r", {"alone": alone, "model": model})
    with opener() as fresh:
        state = fresh.get(saved.id).state
    np.testing.assert_array_equal(state["alone"], alone)
    np.testing.assert_array_equal(state["model"]["w"], model["w"])
    assert state["model"]["step"] == 3
    middle = alone[5 << 18 : 6 << 18].tobytes()  # the sixth 1 MiB chunk of `alone`
    (path,) = files(blob_dir)
    data = bytearray(path.read_bytes())
    data[data.find(middle) + len(middle) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with opener() as fresh, pytest.raises(CorruptCheckpointError) as info:
        fresh.get(saved.id)
    assert info.value.field == "alone" and "checksum mismatch" in str(info.value)


def test_orphaned_files_are_reported_and_swept(opener: Callable[..., pitstop.Store],
                                               blob_dir: Path) -> None:
    store = opener()
    store.save("r", {"doc": BIG})
    # what a crash between writing a value and committing its checkpoint leaves behind
    blobs = DirectoryBlobStore(blob_dir)
    blobs.put(b"\x01" * 32, b"orphan")
    assert store.verify() == []  # too young to be judged: a save may be about to commit
    hour_ago = time.time() - 7200
    orphan = blob_dir / "01" / "01" / f"{'01' * 32}.blob"
    os.utime(orphan, (hour_ago, hour_ago))
    assert [p.message.split()[0] for p in store.verify()] == ["file"]
    # and what a save killed before its rename leaves: a temporary file
    abandoned = orphan.parent / ".tmp-123-abcd-0"
    abandoned.write_bytes(b"half a chunk")
    fresh = orphan.parent / ".tmp-123-abcd-1"  # a save still writing it
    fresh.write_bytes(b"half")
    os.utime(abandoned, (hour_ago, hour_ago))
    store.prune(RetentionPolicy(keep_last=5))
    assert not orphan.exists()
    assert not abandoned.exists() and fresh.exists()
    assert len(files(blob_dir)) == 1


def test_a_store_without_the_blob_store_says_where_values_are(
    opener: Callable[..., pitstop.Store], url: str
) -> None:
    opener().save("r", {"doc": BIG})
    with pitstop.open_store(url) as plain, pytest.raises(StoreError, match="blob store"):
        plain.latest("r")


def test_blob_store_options_in_the_url(url: str, blob_dir: Path) -> None:
    sep = "&" if "?" in url else "?"
    with pitstop.open_store(f"{url}{sep}blobs={blob_dir}&blob_threshold=1000") as store:
        store.save("r", {"doc": os.urandom(5000)})
        assert len(files(blob_dir)) == 1


def test_export_import_moves_external_values(opener: Callable[..., pitstop.Store],
                                             tmp_path: Path) -> None:
    source = opener()
    first = source.save("r", {"doc": BIG})
    source.save("r", {"doc": BIG, "n": 1})
    data = source.export_run("r")
    with pitstop.open_store(f"sqlite:///{tmp_path / 'target.db'}") as target:
        target.import_run(data)
        assert target.get(first.id).state == {"doc": BIG}
        assert target.verify() == []


def test_sqlite_store_at_the_oldest_schema_is_upgraded_on_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    oldest = store_schema.MIGRATIONS[0][0]
    assert oldest < store_schema.LATEST_SCHEMA  # there is something to upgrade
    first = write_old(url, oldest, lambda old: old.save(  # made by the first release
        "r", {"doc": "x" * 10_000, "n": 1}, workflow="wf",
        status=RunStatus.WAITING, metadata={"waiting_for": ["go"]},
    ))
    with pytest.raises(pitstop.StoreSchemaError, match="migrate"):
        pitstop.open_store(url, auto_migrate=False)
    with pitstop.open_store(url) as new:
        assert new.schema_version() == store_schema.LATEST_SCHEMA  # type: ignore[attr-defined]
        assert new.get(first.id).state == {"doc": "x" * 10_000, "n": 1}
        assert new.get_run("r").waiting_for == ("go",)
        assert new.verify() == []
    with pitstop.open_store(url, blobs=str(tmp_path / "blobs"), blob_threshold=1000) as new:
        new.save("r", {"doc": os.urandom(5000), "n": 2})  # uses what version 2 added
        assert new.verify() == []


def test_a_save_packs_what_it_adds_in_one_file_collected_with_its_last_row(
    opener: Callable[..., pitstop.Store], blob_dir: Path
) -> None:
    np = pytest.importorskip("numpy")
    store = opener()
    weights = np.arange(4 << 18, dtype=np.float32)  # 4 MiB: four chunks of 1 MiB
    store.save("a", {"w": weights, "doc": BIG})
    (pack,) = files(blob_dir)
    assert pack.parent.parent.name == "packs" and pack.stat().st_size > weights.nbytes
    store.save("a", {"w": weights, "doc": BIG, "n": 1})  # unchanged: nothing written
    assert files(blob_dir) == [pack]
    weights[: 2 << 18] *= -1.0
    store.save("a", {"w": weights})  # two chunks new: a pack of two, two chunks kept
    assert len(files(blob_dir)) == 2
    store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
    assert pack in files(blob_dir)  # the head still reads two of its chunks
    np.testing.assert_array_equal(store.latest("a").state["w"], weights)  # type: ignore[union-attr]
    assert store.verify() == []
    # A new run has no parent to share chunks with: its save writes them all, and the
    # rows of those stored before point at the new copies (known whole: see
    # test_a_short_file_is_written_again_not_reused); a pack left with no row is swept.
    before = set(files(blob_dir))
    store.save("b", {"w": weights})
    (left,) = set(files(blob_dir)) - before
    store.delete_run("a")
    assert pack in files(blob_dir)  # no row in it any more, but it is too young to go
    hour_ago = time.time() - 7200
    for path in blob_dir.glob("packs/*/*.pack"):
        os.utime(path, (hour_ago, hour_ago))
    store.prune(RetentionPolicy(keep_last=5))
    assert files(blob_dir) == [left]
    np.testing.assert_array_equal(store.latest("b").state["w"], weights)  # type: ignore[union-attr]
    store.delete_run("b")
    assert files(blob_dir) == []


def test_values_in_a_file_each_still_load_beside_packs(
    opener: Callable[..., pitstop.Store], blob_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written before packs (a file per chunk) reads as before, and a save that
    keeps some of those chunks and adds others mixes both."""
    np = pytest.importorskip("numpy")

    def a_file_each(self: DirectoryBlobStore, items: Any, *, sync: bool = True) -> dict[Any, Any]:
        self._put_files(items, sync)
        return {}

    weights = np.arange(4 << 18, dtype=np.float32)
    with monkeypatch.context() as patch:
        patch.setattr(DirectoryBlobStore, "put_many", a_file_each)
        old = opener().save("r", {"w": weights})
    assert len(files(blob_dir)) == 4 and all(p.suffix == ".blob" for p in files(blob_dir))
    store = opener()
    np.testing.assert_array_equal(store.get(old.id).state["w"], weights)
    changed = weights.copy()
    changed[: 2 << 18] += 0.5  # two chunks new, two kept in their files
    new = store.save("r", {"w": changed})
    assert [p.suffix for p in files(blob_dir)] == [".blob"] * 4 + [".pack"]
    with opener() as fresh:
        np.testing.assert_array_equal(fresh.get(new.id).state["w"], changed)
        np.testing.assert_array_equal(fresh.get(old.id).state["w"], weights)
    store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
    assert [p.suffix for p in files(blob_dir)] == [".blob"] * 2 + [".pack"]
    assert store.verify() == []


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_a_pack_is_synced_with_full_durability_only(
    opener: Callable[..., pitstop.Store], durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    np = pytest.importorskip("numpy")
    store = opener(durability=durability)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc") else "?")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.save("r", {"w": np.arange(3 << 18, dtype=np.float32)})
    if durability == "normal":
        assert synced == []
    else:  # the pack under its temporary name, then its directory and those made for it
        assert len(synced) >= 2 and ".tmp-" in synced[0]
        assert any(path.endswith("/packs") for path in synced)


def test_an_orphaned_pack_is_reported_and_swept(opener: Callable[..., pitstop.Store],
                                                blob_dir: Path) -> None:
    """What a save killed after writing its pack and before its commit leaves."""
    store = opener()
    store.save("r", {"doc": BIG})
    blobs = DirectoryBlobStore(blob_dir)
    slots = blobs.put_many([(b"\x01" * 17, (b"a",)), (b"\x02" * 17, (b"b",))])
    assert {slot.offset for slot in slots.values()} == {0, 1}
    (pack,) = blob_dir.glob("packs/*/*.pack")
    assert store.verify() == []  # too young to be judged: a save may be about to commit
    hour_ago = time.time() - 7200
    os.utime(pack, (hour_ago, hour_ago))
    assert [p.message.split()[0] for p in store.verify()] == ["pack"]
    store.prune(RetentionPolicy(keep_last=5))
    assert not pack.exists() and len(files(blob_dir)) == 1
    assert store.verify() == []


def test_a_loops_retention_leaves_only_the_kept_checkpoints_files(
        opener: Callable[..., pitstop.Store], blob_dir: Path) -> None:
    """A ``Checkpointer`` prunes in its save's own transaction where the store can (SQLite)
    and right after it elsewhere: either way the run keeps its newest 3 checkpoints, and the
    packs of the pruned ones leave the directory (by the time the store is closed)."""
    store = opener(durability="full")
    with pitstop.Checkpointer(store, "train") as ckpt:
        for step in range(6):
            ckpt.save({"a": os.urandom(150_000), "b": os.urandom(150_000), "step": step})
        assert [c.step for c in store.history("train", limit=None)] == [5, 4, 3]
        state = ckpt.restore()
        assert state["step"] == 5 and len(state["a"]) == 150_000
    store.close()
    assert len(files(blob_dir)) == 3  # one pack a save: those of the 3 kept
    store = opener()
    assert not store.verify()
    assert store.prune(RetentionPolicy(keep_last=3), run_id="train").checkpoints == []
