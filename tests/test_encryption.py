"""Encryption at rest of the blob store (AES-256-GCM, key rotation), on SQLite and PostgreSQL,
with the blobs in a directory and in a bucket (moto's S3 server on loopback)."""

from __future__ import annotations

import base64
import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest

import pitstop
from pitstop import CorruptCheckpointError, Encryption, EncryptionKeyError, StoreError

pytest.importorskip("cryptography")

from pitstop.store.encoding.sealed import OVERHEAD, SealedBlobStore, key_id_of
from pitstop.store.engine.rekey import rekey

K1, K2, K3 = os.urandom(32), os.urandom(32), os.urandom(32)
BIG = os.urandom(300_000)
BIG2 = os.urandom(300_000)


class Reviewed(TypedDict, total=False):
    """The LangGraph test's state (at module level: LangGraph reads its annotations)."""

    doc: str
    log: list[str]


def ring(*ids: str, current: str | None = None) -> Encryption:
    every = {"k1": K1, "k2": K2, "k3": K3}
    return Encryption(keys={i: every[i] for i in ids}, current=current or ids[0])


@pytest.fixture(params=["directory", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "directory":
        return str(tmp_path / "blobs")
    pytest.importorskip("obstore")
    return str(request.getfixturevalue("s3_blobs"))


@pytest.fixture
def opener(open_shared: Callable[..., pitstop.Store], blobs: str) -> Callable[..., pitstop.Store]:
    return functools.partial(open_shared, blobs=blobs, blob_threshold=100_000)


def stored_bytes(blobs: str) -> list[tuple[str, bytes]]:
    """Every object or file of the blob store, raw (name, bytes)."""
    if not blobs.startswith("s3://"):
        return [(str(p), p.read_bytes()) for p in sorted(Path(blobs).rglob("*")) if p.is_file()]
    from pitstop.store import S3BlobStore

    bucket = S3BlobStore(blobs)
    out = [(f"pack {name}", _raw_object(bucket, bucket._pack_path(name)))
           for name in bucket.packs()]
    alone = bucket.keys()
    out += [(key.hex(), bytes(bucket.get(key) or b"")) for key in alone]
    return out


def _raw_object(bucket: Any, path: str) -> bytes:
    import obstore

    return bytes(obstore.get(bucket._store, path).bytes())


@pytest.mark.slow
def test_values_are_sealed_and_read_back_on_every_backend(
    opener: Callable[..., pitstop.Store], blobs: str
) -> None:
    np = pytest.importorskip("numpy")
    store = opener(encryption=ring("k1"))
    weights = np.random.default_rng(3).standard_normal(1 << 20, dtype=np.float32)  # 4 MiB
    saved = store.save("r", {"doc": BIG, "w": weights, "note": "small"})
    store.save("r", {"doc": BIG2, "w": weights})
    with opener(encryption=ring("k1")) as fresh:
        state = fresh.get(saved.id).state
        assert state["doc"] == BIG and state["note"] == "small"
        np.testing.assert_array_equal(state["w"], weights)
        assert fresh.verify() == []
    found = stored_bytes(blobs)
    assert found
    everything = b"".join(data for _, data in found)
    assert BIG[:64] not in everything and BIG2[:64] not in everything
    assert weights.tobytes()[:64] not in everything
    # no name in the blob store is a value's content key: every value is in a pack
    assert all("pack" in name for name, _ in found)


def test_old_keys_keep_opening_and_rekey_seals_under_the_new_one(
    opener: Callable[..., pitstop.Store], blobs: str
) -> None:
    old = opener(encryption=ring("k1"))
    first = old.save("r", {"doc": BIG})
    old.close()
    store = opener(encryption=ring("k2", "k1"))
    assert store.get(first.id).state == {"doc": BIG}  # sealed under k1, opened
    second = store.save("r", {"doc": BIG2})
    sealed: SealedBlobStore = store.blobs  # type: ignore[attr-defined]
    rows = _rows(store)
    assert {sealed.sealed_with(key, slot) for key, slot in rows} == {"k1", "k2"}
    assert rekey(store, "k2") == 1
    assert {sealed.sealed_with(key, slot) for key, slot in _rows(store)} == {"k2"}
    assert rekey(store, "k2") == 0  # nothing left to do
    with opener(encryption=ring("k2")) as without_k1:  # k1 can leave the ring now
        assert without_k1.get(first.id).state == {"doc": BIG}
        assert without_k1.get(second.id).state == {"doc": BIG2}
        assert without_k1.verify() == []
    # the old copy is gone: only what rows point at is left (after the prune's sweep)
    sealed.orphan_age = 0.0
    store.prune(pitstop.RetentionPolicy(keep_last=10))
    assert store.verify() == []


def _rows(store: pitstop.Store) -> list[tuple[bytes, Any]]:
    from pitstop.store.engine.values import slot_of

    rows = store._tx(lambda tx: tx.all(  # type: ignore[attr-defined]
        "SELECT hash, pack, pack_offset, size FROM pitstop_blobs WHERE location IS NOT NULL"))
    return [(bytes(h), slot_of(p, o, s)) for h, p, o, s in rows]


def test_a_missing_key_is_named_and_a_store_without_keys_still_lists_runs(
    opener: Callable[..., pitstop.Store],
) -> None:
    store = opener(encryption=ring("k1"))
    store.save("r", {"doc": BIG, "n": 1})
    with opener(encryption=ring("k2")) as wrong:
        with pytest.raises(EncryptionKeyError, match="'k1'") as info:
            wrong.latest("r")
        assert info.value.key_id == "k1"
        with pytest.raises(EncryptionKeyError):
            wrong.latest("r", fallback=True)  # not damage: never skipped
    with opener() as plain:
        assert [run.id for run in plain.runs()] == ["r"]
        assert plain.history("r")[0].run_id == "r"
        with pytest.raises(EncryptionKeyError, match=r"sealed .* with key 'k1'"):
            plain.latest("r")


def test_tampered_ciphertext_is_corruption_and_fallback_passes_it(
    opener: Callable[..., pitstop.Store], blobs: str, tmp_path: Path
) -> None:
    store = opener(encryption=ring("k1"))
    good = store.save("r", {"doc": BIG2, "n": 1})
    bad = store.save("r", {"doc": BIG, "n": 2})
    sealed: SealedBlobStore = store.blobs  # type: ignore[attr-defined]
    key, slot = next((k, s) for k, s in _rows(store) if sealed.get(k, s) and
                     (sealed.get(k, s) or b"").endswith(BIG[-100:]))
    raw = sealed.inner.get(key, slot._replace(size=slot.size + OVERHEAD))
    assert raw is not None and key_id_of(raw) == "k1"
    altered = bytearray(raw)
    altered[len(altered) // 2] ^= 0x01
    _overwrite_pack(sealed, slot.pack, slot.offset, bytes(altered))
    with opener(encryption=ring("k1")) as fresh:
        with pytest.raises(CorruptCheckpointError) as info:
            fresh.latest("r")
        assert info.value.checkpoint_id == bad.id and info.value.field == "doc"
        assert fresh.latest("r", fallback=True).id == good.id  # type: ignore[union-attr]
        problems = fresh.verify()
        assert any("fails authentication under key 'k1'" in p.message for p in problems)


def _overwrite_pack(sealed: SealedBlobStore, pack: str, offset: int, data: bytes) -> None:
    inner: Any = sealed.inner
    if inner.url.startswith("s3://"):
        import obstore

        path = inner._pack_path(pack)
        whole = bytearray(obstore.get(inner._store, path).bytes())
        whole[offset : offset + len(data)] = data
        obstore.put(inner._store, path, bytes(whole))
        return
    path = Path(inner._pack_name(pack))
    whole = bytearray(path.read_bytes())
    whole[offset : offset + len(data)] = data
    path.write_bytes(bytes(whole))


def test_keys_from_the_environment_in_the_url(
    shared_url: str, blobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = ",".join(f"{i}={base64.b64encode(k).decode()}" for i, k in (("k2", K2),
                                                                          ("k1", K1)))
    monkeypatch.setenv("PITSTOP_KEYS", encoded)
    sep = "&" if "?" in shared_url else "?"
    url = f"{shared_url}{sep}blobs={blobs}&blob_threshold=1000&encryption=env:PITSTOP_KEYS"
    with pitstop.open_store(url) as store:
        saved = store.save("r", {"doc": os.urandom(5000)})
        sealed: SealedBlobStore = store.blobs  # type: ignore[attr-defined]
        assert sealed.encryption.current == "k2"
        assert {sealed.sealed_with(k, s) for k, s in _rows(store)} == {"k2"}
    with pitstop.open_store(shared_url, blobs=blobs, encryption=ring("k2")) as store:
        assert len(store.get(saved.id).state["doc"]) == 5000


def test_bad_rings_are_refused_at_open_without_showing_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(pitstop.UnsupportedStoreError, match="32 bytes"):
        Encryption(keys={"k1": b"short"}, current="k1")
    with pytest.raises(pitstop.UnsupportedStoreError, match="current key 'k9'"):
        Encryption(keys={"k1": K1}, current="k9")
    with pytest.raises(pitstop.UnsupportedStoreError, match="PITSTOP_NOPE is not set"):
        pitstop.open_store(url, encryption="env:PITSTOP_NOPE")
    with pytest.raises(pitstop.UnsupportedStoreError, match="encryption"):
        pitstop.open_store(url, encryption="k1")
    with pytest.raises(pitstop.UnsupportedStoreError, match="blobs=off"):
        pitstop.open_store(url, blobs=False, encryption=ring("k1"))
    assert K1.hex() not in repr(ring("k1")) and "k1" in repr(ring("k1"))


def test_checkpointer_and_cli_rekey_on_a_sealed_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    np = pytest.importorskip("numpy")
    keys = {"k1": K1}
    monkeypatch.setenv("PITSTOP_KEYS", f"k1={base64.b64encode(K1).decode()}")
    db = tmp_path / "ck.db"
    with pitstop.open_store(f"sqlite:///{db}", encryption=Encryption(keys, "k1")) as store:
        with pitstop.Checkpointer(store, "train") as ck:
            weights = np.arange(1 << 19, dtype=np.float64)  # 4 MiB
            ck.save({"w": weights, "step": 1})
        assert store.latest("train").state["step"] == 1  # type: ignore[union-attr]
    both = f"k2={base64.b64encode(K2).decode()},k1={base64.b64encode(K1).decode()}"
    env = {**os.environ, "PITSTOP_KEYS": both}
    url = f"sqlite:///{db}?encryption=env:PITSTOP_KEYS"
    done = subprocess.run([sys.executable, "-m", "pitstop", "--store", url, "rekey", "--to",
                           "k2"], check=False, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sealed again under key 'k2'" in done.stdout
    with pitstop.open_store(f"sqlite:///{db}", encryption=ring("k2")) as store:
        np.testing.assert_array_equal(
            store.latest("train").state["w"], np.arange(1 << 19, dtype=np.float64)  # type: ignore[union-attr]
        )
    with pytest.raises(StoreError):
        rekey(pitstop.open_store(f"sqlite:///{db}"), "k2")  # no keys: refused


@pytest.mark.slow
def test_langgraph_saver_on_a_sealed_store_in_a_bucket(
    shared_url: str, s3_blobs: str
) -> None:
    """A graph whose channel holds a large document, on PitstopSaver over a store whose blob
    store is a bucket, sealed: it interrupts, resumes from a fresh store handle, and the
    document in the bucket is ciphertext."""
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    from pitstop.integrations.langgraph import PitstopSaver

    document = os.urandom(400_000).hex()  # 800 kB of text: over the threshold

    def build(saver: PitstopSaver) -> Any:
        def draft(state: dict[str, Any]) -> dict[str, Any]:
            return {"doc": document, "log": [*state.get("log", []), "draft"]}

        def review(state: dict[str, Any]) -> dict[str, Any]:
            decision = interrupt("ship it?")
            return {"log": [*state["log"], f"review:{decision}"]}

        builder: Any = StateGraph(Reviewed)
        builder.add_node("draft", draft)
        builder.add_node("review", review)
        builder.add_edge(START, "draft")
        builder.add_edge("draft", "review")
        builder.add_edge("review", END)
        return builder.compile(checkpointer=saver)

    cfg: Any = {"configurable": {"thread_id": "t-sealed"}}
    options = {"blobs": s3_blobs, "blob_threshold": 100_000}
    with pitstop.open_store(shared_url, encryption=ring("k1"), **options) as store:
        build(PitstopSaver(store)).invoke({"log": []}, cfg)
    with pitstop.open_store(shared_url, encryption=ring("k1"), **options) as store:
        out = build(PitstopSaver(store)).invoke(Command(resume="yes"), cfg)
        assert out["doc"] == document and out["log"] == ["draft", "review:yes"]
        assert store.verify() == []
    everything = b"".join(data for _, data in stored_bytes(s3_blobs))
    assert everything and document[:64].encode() not in everything


def test_export_of_a_sealed_store_imports_anywhere_and_is_sealed_again_on_import(
    opener: Callable[..., pitstop.Store], tmp_path: Path
) -> None:
    source = opener(encryption=ring("k1"))
    first = source.save("r", {"doc": BIG})
    data = source.export_run("r")
    with pitstop.open_store(f"sqlite:///{tmp_path / 'plain.db'}", blob_threshold=100_000) as plain:
        plain.import_run(data)
        assert plain.get(first.id).state == {"doc": BIG}
    target_blobs = tmp_path / "sealed-blobs"
    with pitstop.open_store(f"sqlite:///{tmp_path / 'sealed.db'}", blobs=str(target_blobs),
                            blob_threshold=100_000, encryption=ring("k2")) as sealed:
        sealed.import_run(data)
        assert sealed.get(first.id).state == {"doc": BIG}
        assert sealed.verify() == []
    on_disk = b"".join(p.read_bytes() for p in target_blobs.rglob("*") if p.is_file())
    assert on_disk and BIG[:64] not in on_disk


@pytest.mark.slow
def test_sigkill_during_sealed_saves_to_a_bucket(
    tmp_path: Path, s3_blobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both together: savers killed while they seal values into the bucket; every head
    opens, nothing referenced is missing or fails to open, and prune removes the orphans
    (tests/s3kill.py)."""
    pytest.importorskip("numpy")
    from s3kill import kill_saves

    monkeypatch.setenv("PITSTOP_KEYS", f"k1={base64.b64encode(K1).decode()}")
    outcome = kill_saves(f"sqlite:///{tmp_path / 'kills.db'}", s3_blobs, 5, seed=7,
                         encryption="env:PITSTOP_KEYS")
    assert outcome.problems == []
    assert outcome.kills >= 4 and outcome.saves > 0


def test_rekey_beside_saves_and_prunes_loses_nothing(
    shared_url: str, tmp_path: Path
) -> None:
    """Rekey runs while another thread keeps saving (new values, and values already stored
    that a save packs again) and pruning: afterwards every checkpoint left opens under the
    new key alone, and verify finds nothing."""
    import threading

    blobs = str(tmp_path / "blobs")
    docs = [os.urandom(150_000) for _ in range(6)]
    with pitstop.open_store(shared_url, blobs=blobs, blob_threshold=100_000,
                            encryption=ring("k1")) as old:
        for i in range(20):
            old.save(f"r{i % 3}", {"doc": docs[i % 6], "i": i})
    store = pitstop.open_store(shared_url, blobs=blobs, blob_threshold=100_000,
                               encryption=ring("k2", "k1"))
    worker = pitstop.open_store(shared_url, blobs=blobs, blob_threshold=100_000,
                                encryption=ring("k2", "k1"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_saving() -> None:
        try:
            i = 0
            while not stop.is_set():
                worker.save(f"r{i % 4}", {"doc": docs[i % 6], "new": os.urandom(120_000),
                                          "i": i})
                if i % 5 == 0:
                    worker.prune(pitstop.RetentionPolicy(keep_last=3))
                i += 1
        except BaseException as exc:  # (raised in the test below)
            errors.append(exc)

    thread = threading.Thread(target=keep_saving)
    thread.start()
    try:
        rekey(store, "k2")
        rekey(store, "k2")  # what the saves sealed under k1 meanwhile: none (current is k2)
    finally:
        stop.set()
        thread.join(60)
    assert errors == []
    worker.close()
    store.close()
    with pitstop.open_store(shared_url, blobs=blobs, blob_threshold=100_000,
                            encryption=ring("k2")) as only_k2:
        for run in only_k2.runs():
            for summary in only_k2.history(run.id, limit=None):
                only_k2.get(summary.id)  # opens under k2 alone
        assert only_k2.verify() == []


def test_a_large_save_into_a_directory_is_streamed_into_one_sealed_pack(
    tmp_path: Path,
) -> None:
    """12 MiB (past the size from which sealing and writing overlap, a few MiB a batch):
    one pack of sealed chunks, no plaintext in it, the array read back whole."""
    np = pytest.importorskip("numpy")
    array = np.arange(3 << 20, dtype=np.float32)
    url = f"sqlite:///{tmp_path / 'big.db'}"
    blobs = str(tmp_path / "blobs")
    with pitstop.open_store(url, blobs=blobs, encryption=ring("k1"),
                            durability="full") as store:
        saved = store.save("r", {"w": array})
    (pack,) = (tmp_path / "blobs").rglob("*.pack")
    data = pack.read_bytes()
    assert len(data) == array.nbytes + 12 * (1 + OVERHEAD)  # 12 chunks, a header byte each
    assert array.tobytes()[4096:8192] not in data
    with pitstop.open_store(url, blobs=blobs, encryption=ring("k1")) as fresh:
        np.testing.assert_array_equal(fresh.get(saved.id).state["w"], array)
        assert fresh.verify() == []


def test_a_forked_child_draws_its_own_nonces() -> None:
    """Nonces are a per-process random prefix and a count: a child must not repeat its
    parent's (the same key, the same nonce, two values would give the key away)."""
    from pitstop.store.encoding.sealed import _nonce

    first = _nonce()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, _nonce())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 12)
    os.close(read)
    os.close(write)
    ours = _nonce()
    assert len(child) == 12 and child[:8] != ours[:8]
    assert ours[:8] == first[:8] and ours != first
