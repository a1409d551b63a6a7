"""Large values in object storage (s3://), on SQLite and PostgreSQL, against a real S3 API:
moto's server on loopback (tests/s3server.py), reached over HTTP by the client we ship."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop import CorruptCheckpointError, RetentionPolicy, StoreError

pytest.importorskip("obstore")

from pitstop.store import S3BlobStore
from pitstop.store.encoding import objects

BIG = os.urandom(300_000)  # incompressible: its stored size stays above the threshold
BIG2 = os.urandom(300_000)


@pytest.fixture
def opener(open_shared: Callable[..., pitstop.Store], s3_blobs: str
           ) -> Callable[..., pitstop.Store]:
    return functools.partial(open_shared, blobs=s3_blobs, blob_threshold=100_000)


def objects_in(url: str) -> list[str]:
    """Every object pitstop keeps under the URL's prefix: values stored alone (named by
    their key) and packs (the values one save adds together)."""
    bucket = S3BlobStore(url)
    alone = bucket.keys()
    return sorted([key.hex() for key in alone] + [f"pack {name}" for name in bucket.packs()])


def test_large_values_live_in_the_bucket_shared_and_read_back(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    store = opener()
    first = store.save("r", {"doc": BIG, "note": "small stays in the table"})
    store.save("r", {"doc": BIG, "note": "small stays in the table", "i": 1})
    store.save("other", {"doc": BIG})  # shared, not copied
    assert len(objects_in(s3_blobs)) == 1
    assert store.get(first.id).state["doc"] == BIG
    assert store.verify() == []
    assert opener().latest("other").state == {"doc": BIG}  # type: ignore[union-attr]


def test_arrays_go_up_as_chunks_and_an_unchanged_resave_uploads_nothing(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    np = pytest.importorskip("numpy")
    store = opener()
    weights = np.random.default_rng(1).standard_normal(3 << 20, dtype=np.float32)  # 12 MiB
    saved = store.save("r", {"w": weights, "step": 1})
    (pack,) = objects_in(s3_blobs)  # twelve 1 MiB chunks in one pack object
    assert pack.startswith("pack ")
    bucket = S3BlobStore(s3_blobs)
    before = set(_etags(bucket))
    store.save("r", {"w": weights, "step": 2})  # unchanged: no object written
    assert set(_etags(bucket)) == before
    weights[:10] = 0.0
    store.save("r", {"w": weights, "step": 3})  # one chunk changed: one object more
    assert len(objects_in(s3_blobs)) == 2
    with opener() as fresh:  # read by the load's threads, each chunk into place
        np.testing.assert_array_equal(fresh.latest("r").state["w"], weights)  # type: ignore[union-attr]
        assert fresh.get(saved.id).state["step"] == 1
    assert store.verify() == []


def _etags(bucket: S3BlobStore) -> set[tuple[str, Any]]:
    import obstore

    return {
        (meta["path"], meta["last_modified"])
        for batch in obstore.list(bucket._store, bucket.prefix + "/") for meta in batch
    }


def test_collected_with_the_last_reference(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    store = opener()
    store.save("a", {"doc": BIG})
    store.save("b", {"doc": BIG})
    store.save("b", {"doc": BIG2})
    assert len(objects_in(s3_blobs)) == 2
    store.delete_run("a")
    assert len(objects_in(s3_blobs)) == 2  # `b` still holds BIG in its first checkpoint
    store.prune(RetentionPolicy(keep_last=1), run_id="b")
    assert len(objects_in(s3_blobs)) == 1
    store.delete_run("b")
    assert objects_in(s3_blobs) == []
    assert store.verify() == []


def test_damaged_or_missing_objects_are_detected_and_passed_by_fallback(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    import obstore

    store = opener()
    good = store.save("r", {"doc": BIG2, "n": 1})
    bad = store.save("r", {"doc": BIG, "n": 2})
    bucket = S3BlobStore(s3_blobs)
    alone = bucket.keys()
    (key,) = [k for k in alone if bytes(bucket.get(k) or b"").endswith(BIG[-100:])]
    data = bytearray(bucket.get(key) or b"")
    data[-1] ^= 0xFF
    obstore.put(bucket._store, bucket._path(key), bytes(data))
    with pytest.raises(CorruptCheckpointError) as info:
        store.latest("r")
    assert info.value.checkpoint_id == bad.id and info.value.field == "doc"
    assert store.latest("r", fallback=True).id == good.id  # type: ignore[union-attr]
    assert [p.kind for p in store.verify()] == ["blob"]
    bucket.delete([key])
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.get(bad.id)
    assert any("missing" in p.message for p in store.verify())


def test_orphaned_objects_are_reported_and_removed_by_prune(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    store = opener()
    store.save("r", {"doc": BIG})
    # what a save killed between its upload and its commit leaves behind
    S3BlobStore(s3_blobs).put(b"\x01" * 32, b"orphan")
    S3BlobStore(s3_blobs).put_many([(b"\x02" * 17, (b"a",)), (b"\x03" * 17, (b"b",))])
    assert len(objects_in(s3_blobs)) == 3
    assert store.verify() == []  # too young to be judged: a save may be about to commit
    store.blobs.orphan_age = 0.0  # type: ignore[attr-defined]
    assert sorted(p.message.split()[0] for p in store.verify()) == ["file", "pack"]
    store.prune(RetentionPolicy(keep_last=5))
    assert len(objects_in(s3_blobs)) == 1
    assert store.verify() == []
    assert store.latest("r").state == {"doc": BIG}  # type: ignore[union-attr]


def test_options_in_the_url_and_the_endpoint_given_there(
    shared_url: str, s3_blobs: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    blobs = f"{s3_blobs}?endpoint={s3_server.endpoint}"
    sep = "&" if "?" in shared_url else "?"
    with pitstop.open_store(f"{shared_url}{sep}blobs={blobs}&blob_threshold=1000") as store:
        saved = store.save("r", {"doc": os.urandom(5000)})
        assert store.blobs.url == s3_blobs  # type: ignore[attr-defined]  # rows: no endpoint
    with pitstop.open_store(
        shared_url, blobs=S3BlobStore(s3_blobs, endpoint=s3_server.endpoint)
    ) as store:
        assert len(store.get(saved.id).state["doc"]) == 5000


def test_a_store_without_the_bucket_says_where_values_are(
    opener: Callable[..., pitstop.Store], shared_url: str, s3_blobs: str
) -> None:
    opener().save("r", {"doc": BIG})
    with pitstop.open_store(shared_url, blobs=False) as plain:
        assert [run.id for run in plain.runs()] == ["r"]
        with pytest.raises(StoreError, match=s3_blobs):
            plain.latest("r")


def test_export_import_to_and_from_a_bucket(
    opener: Callable[..., pitstop.Store], tmp_path: Path, s3_server: Any
) -> None:
    source = opener()
    first = source.save("r", {"doc": BIG})
    source.save("r", {"doc": BIG, "n": 1})
    data = source.export_run("r")
    other = f"s3://{s3_server.new_bucket()}/copy"
    with pitstop.open_store(f"sqlite:///{tmp_path / 'target.db'}", blobs=other,
                            blob_threshold=100_000) as target:
        target.import_run(data)
        assert target.get(first.id).state == {"doc": BIG}
        assert len(objects_in(other)) == 1
        assert target.verify() == []


def test_a_large_value_goes_up_in_parts_and_comes_back_in_ranges(
    opener: Callable[..., pitstop.Store], s3_blobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(objects, "MULTIPART_FROM", 6 << 20)
    monkeypatch.setattr(objects, "PART_SIZE", 5 << 20)  # S3's smallest part
    store = opener(blob_threshold=1 << 20)
    # one value of 12 MiB, not chunked (a str): a multipart upload of three parts
    text = os.urandom(6 << 20).hex()
    saved = store.save("r", {"text": text})
    assert len(objects_in(s3_blobs)) == 1
    with opener() as fresh:
        assert fresh.get(saved.id).state["text"] == text


def test_an_unreachable_or_missing_bucket_is_one_line_at_open(
    tmp_path: Path, s3_blobs: str, s3_server: Any
) -> None:
    from s3server import SECRET_KEY, free_port

    url = f"sqlite:///{tmp_path / 'x.db'}"
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StoreError) as info:
        pitstop.open_store(url, blobs=f"s3://nowhere/p?endpoint={dead}")
    text = str(info.value)
    assert "s3://nowhere/p" in text and "cannot connect" in text and "\n" not in text
    assert SECRET_KEY not in text
    with pytest.raises(StoreError) as info:
        pitstop.open_store(url, blobs="s3://no-such-bucket-here/p")
    text = str(info.value)
    assert "s3://no-such-bucket-here/p" in text and "NoSuchBucket" in text
    assert "\n" not in text and SECRET_KEY not in text


@pytest.mark.slow
def test_the_cli_works_on_a_store_whose_values_are_in_a_bucket(
    tmp_path: Path, s3_blobs: str
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}?blobs={s3_blobs}&blob_threshold=100000"
    with pitstop.open_store(url) as store:
        store.save("r", {"doc": BIG})
        store.save("r", {"doc": BIG2})
    archive = tmp_path / "r.pitstop"

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pitstop", "--store", url, *args],
            check=False, capture_output=True, text=True, timeout=120, env=os.environ.copy(),
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "r" in cli("runs")
    cli("verify")
    cli("export", "r", "-o", str(archive))
    cli("prune", "--keep-last", "1")
    assert len(objects_in(s3_blobs)) == 1
    cli("verify")


@pytest.mark.slow
def test_sigkill_during_saves_leaves_no_torn_checkpoint_and_prune_removes_orphans(
    tmp_path: Path, s3_blobs: str
) -> None:
    """Ten saver processes killed at random moments while they save arrays and documents
    to the bucket (bench/objects_kill.py runs fifty): see tests/s3kill.py."""
    pytest.importorskip("numpy")
    from s3kill import kill_saves

    outcome = kill_saves(f"sqlite:///{tmp_path / 'kills.db'}", s3_blobs, 10, seed=31)
    assert outcome.problems == []
    assert outcome.kills >= 8 and outcome.saves > 0
    # every object left is one a row references
    with pitstop.open_store(f"sqlite:///{tmp_path / 'kills.db'}", blobs=s3_blobs) as store:
        assert store.verify() == []


def test_a_short_pack_fails_the_load_naming_the_field(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    import obstore

    np = pytest.importorskip("numpy")
    store = opener()
    weights = np.arange(1 << 20, dtype=np.float32)  # four chunks, one pack
    good = store.save("r", {"n": 1})
    bad = store.save("r", {"w": weights, "n": 2})
    bucket = S3BlobStore(s3_blobs)
    (pack,) = bucket.packs()
    path = bucket._pack_path(pack)
    obstore.put(bucket._store, path, bytes(obstore.get(bucket._store, path).bytes())[:5000])
    with opener() as fresh:
        with pytest.raises(CorruptCheckpointError) as info:
            fresh.latest("r")
        assert info.value.checkpoint_id == bad.id and info.value.field == "w"
        assert fresh.latest("r", fallback=True).id == good.id  # type: ignore[union-attr]
        assert any("pack object" in p.message for p in fresh.verify())


@pytest.mark.slow
def test_an_array_load_streams_each_pack_into_the_array_and_checks_every_chunk(
    opener: Callable[..., pitstop.Store], s3_blobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import obstore

    from pitstop.serde import chunkkeys

    np = pytest.importorskip("numpy")
    store = opener()
    rng = np.random.default_rng(7)
    weights = rng.standard_normal(5 << 20, dtype=np.float32)  # 20 chunks
    weights[: 3 << 18] = 1.5  # three equal chunks: one key, three places in the array
    parts = {"a": rng.standard_normal(1 << 19), "b": rng.standard_normal(1 << 18)}
    state = {"w": weights, "parts": parts}
    bad = store.save("r", state)
    streamed: list[int] = []
    gets: list[str] = []
    original = S3BlobStore._get_group_into

    def counted(self: S3BlobStore, pack: str, group: Any, places: Any, check: Any) -> Any:
        assert check is not None  # each chunk is checked by the GET that lands it
        streamed.append(sum(len(targets) for targets in places.values()))
        gets.append(pack)
        return original(self, pack, group, places, check)

    def unwanted(*args: Any) -> Any:
        raise AssertionError("a value of the load read apart from its pack's GET")

    checked: list[bytes] = []
    check_chunk = chunkkeys.check_chunk

    def counted_check(key: bytes, format_id: int, raw: Any) -> bool:
        checked.append(key)
        return check_chunk(key, format_id, raw)

    with monkeypatch.context() as patched, opener() as fresh:
        patched.setattr(S3BlobStore, "_get_group_into", counted)
        patched.setattr(S3BlobStore, "_get_group", unwanted)
        patched.setattr(S3BlobStore, "_read_now", unwanted)
        patched.setattr(chunkkeys, "check_chunk", counted_check)  # what ChunkKeys.check calls
        loaded = fresh.latest("r").state  # type: ignore[union-attr]
        np.testing.assert_array_equal(loaded["w"], weights)
        np.testing.assert_array_equal(loaded["parts"]["a"], state["parts"]["a"])
        np.testing.assert_array_equal(loaded["parts"]["b"], state["parts"]["b"])
    # Every chunk of `w` went straight into its place (the GET of the pack it shares with
    # `parts` starts once `w` says where its chunks go: those of `parts` are copied).
    assert sum(streamed) == 20
    # The array's chunks were asked for at two levels of its tree: still one GET per pack.
    assert sorted(gets) == sorted(S3BlobStore(s3_blobs).packs())
    # Each distinct chunk checked once, as it landed: none a second time after.
    assert len(checked) == len(set(checked)) >= 20 - 2 + 4 + 2
    good = store.save("r2", {"n": 1})
    bucket = S3BlobStore(s3_blobs)
    for pack in bucket.packs():  # one byte altered in the middle of each pack
        path = bucket._pack_path(pack)
        data = bytearray(obstore.get(bucket._store, path).bytes())
        data[len(data) // 2 + 1000] ^= 0xFF  # (in a body, not a header byte)
        obstore.put(bucket._store, path, bytes(data))
    with opener() as fresh:
        with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as info:
            fresh.latest("r")
        assert info.value.checkpoint_id == bad.id
        assert fresh.latest("r2").id == good.id  # type: ignore[union-attr]


def test_a_corrupt_chunk_is_caught_by_the_get_that_lands_it_and_by_a_read_after(
    opener: Callable[..., pitstop.Store], s3_blobs: str
) -> None:
    """A chunk altered in its pack fails its check whichever way it was read: streamed into
    place by a GET that checks it as it lands, or read into a buffer first (a read of one
    value before the load said where the chunks go) and checked as it is copied."""
    import obstore

    np = pytest.importorskip("numpy")
    store = opener()
    weights = np.random.default_rng(3).standard_normal(3 << 18, dtype=np.float32)  # 3 chunks
    saved = store.save("r", {"w": weights})
    bucket = S3BlobStore(s3_blobs)
    (pack,) = bucket.packs()
    path = bucket._pack_path(pack)
    data = bytearray(obstore.get(bucket._store, path).bytes())
    data[(1 << 20) + 100] ^= 0x01  # in the second chunk's body
    obstore.put(bucket._store, path, bytes(data))
    with opener() as fresh, pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        fresh.get(saved.id)
    with opener() as fresh:
        blobs: S3BlobStore = fresh.blobs  # type: ignore[attr-defined]
        original = blobs.place
        blobs.place = lambda places, check=None: (  # type: ignore[method-assign]
            blobs.get(places[0][0], places[0][1]), original(places, check))[1]
        with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
            fresh.get(saved.id)


def test_a_read_before_any_place_starts_the_gets_of_its_own_load_only(s3_blobs: str) -> None:
    """Values prefetched by a load that failed before reading them (say, at a damaged
    record) are not fetched by the next load's first read; the values one load asks for at
    two levels of a tree are still one batch."""
    bucket = S3BlobStore(s3_blobs)
    values = {name: os.urandom(1000) for name in ("a1", "a2", "b1", "b2")}
    keys = {name: bytes([i]) * 16 for i, name in enumerate(values)}
    slots = {}
    for pack in ("a", "b"):
        written = bucket.put_many(
            [(keys[name], (values[name],)) for name in values if name[0] == pack])
        slots.update({name: written[keys[name]] for name in values if name[0] == pack})
    bucket.prefetch([(keys["a1"], slots["a1"]), (keys["a2"], slots["a2"])])  # never read
    bucket.prefetch([(keys["b1"], slots["b1"])])  # a load's first level,
    bucket.prefetch([(keys["b2"], slots["b2"])])  # then its second: merged
    assert bucket._pending[keys["b1"]] is bucket._pending[keys["b2"]]  # one GET for both
    assert bucket.get(keys["b1"], slots["b1"]) == values["b1"]
    assert list(bucket._waiting) == [slots["a1"].pack]  # (the failed load's GET not started)
    assert bucket.get(keys["b2"], slots["b2"]) == values["b2"]
    assert bucket.get(keys["a2"], slots["a2"]) == values["a2"]


def test_opening_a_store_does_not_list_its_values(
    opener: Callable[..., pitstop.Store], s3_blobs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check at open is one request whose answer is empty however many values are
    stored alone under the prefix (a listing of them took a request per 1,000)."""
    import obstore

    store = opener()
    for n in range(3):
        store.save(f"r{n}", {"doc": os.urandom(150_000)})
    assert len(list(S3BlobStore(s3_blobs).keys())) == 3
    listed: list[Any] = []
    original = obstore.list

    def recorded(*args: Any, **kwargs: Any) -> Any:
        for batch in original(*args, **kwargs):
            listed.extend(batch)
            yield batch

    monkeypatch.setattr(obstore, "list", recorded)
    monkeypatch.setattr(obstore, "list_with_delimiter", None)
    with opener() as fresh:
        assert listed == []
        assert len(fresh.latest("r1").state["doc"]) == 150_000  # type: ignore[union-attr]


def test_credentials_from_a_named_profile(
    tmp_path: Path, s3_blobs: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from s3server import ACCESS_KEY, SECRET_KEY

    pytest.importorskip("boto3")
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[ci]\naws_access_key_id = {ACCESS_KEY}\n"
                           f"aws_secret_access_key = {SECRET_KEY}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "ci")
    with pitstop.open_store(f"sqlite:///{tmp_path / 'p.db'}", blobs=s3_blobs,
                            blob_threshold=100_000) as store:
        saved = store.save("r", {"doc": BIG})
        assert store.get(saved.id).state == {"doc": BIG}
    assert len(objects_in(s3_blobs)) == 1


def test_a_store_used_across_fork_says_so_in_the_child_instead_of_hanging(
    tmp_path: Path, s3_blobs: str
) -> None:
    """obstore's clients stop working in a forked child (a request waits forever): the
    child's first request is a StoreError naming the cause; the parent carries on."""
    code = f"""
import os, signal, sys
import pitstop
store = pitstop.open_store({f"sqlite:///{tmp_path / 'f.db'}"!r}, blobs={s3_blobs!r},
                           blob_threshold=1000)
store.save("r", {{"doc": os.urandom(5000)}})
pid = os.fork()
if pid == 0:
    signal.alarm(30)
    try:
        store.save("child", {{"doc": os.urandom(5000), "more": os.urandom(5000)}})
    except pitstop.StoreError as exc:
        print("child:", exc, flush=True)
        os._exit(0)
    os._exit(1)
_, status = os.waitpid(pid, 0)
print("exit", os.waitstatus_to_exitcode(status))
store.save("parent", {{"doc": os.urandom(5000)}})
print("parent saved")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert "do not work across fork" in done.stdout and "exit 0" in done.stdout
    assert "parent saved" in done.stdout
