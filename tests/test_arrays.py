"""Arrays and tensors written from their own memory, in chunks, on every backend.

A value that is or holds numpy arrays or torch tensors (a ``state_dict()``, an optimizer's
state, a dict of weights and Python values) is stored as a msgpack skeleton plus the arrays'
bytes cut into 1 MiB content-addressed chunks: unchanged chunks are not written again, a
changed region rewrites the chunks it touches, and every chunk is checked on load.
"""

from __future__ import annotations

import collections
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pitstop
from pitstop.store import Store

MiB = 1 << 20


def same(a: Any, b: Any) -> None:
    """Equal in type, dtype, shape, strides and bits."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif type(a).__module__.startswith("torch"):
        import torch

        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert a.requires_grad == b.requires_grad
        if a.numel():
            assert torch.equal(a.detach().reshape(-1).view(torch.uint8),
                               b.detach().reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


def weights(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "embed": rng.standard_normal((512, 1024), dtype=np.float32),  # 2 MiB: two chunks
        "bias": rng.standard_normal(300_000).astype(np.float16),  # one chunk and a part
        "small": np.arange(10, dtype=np.int8),  # inline in the skeleton
        "meta": {"step": 3, "names": ["a", "b"], "lr": 1e-3},
    }


def test_nested_arrays_round_trip_and_are_chunked(store: Store) -> None:
    state = {"model": weights(), "t": np.ones((4, 70_000), dtype=np.complex64).T}
    store.save("r", state)
    loaded = store.latest("r")
    assert loaded is not None
    same(state["model"], loaded.state["model"])
    same(np.ascontiguousarray(state["t"]), loaded.state["t"])
    out = loaded.state["model"]["embed"]
    assert out.flags.writeable  # built on a buffer of its own, not a read-only bytes
    out[0, 0] = 1.0


def test_unchanged_resave_writes_nothing_and_a_change_only_its_chunks(store: Store) -> None:
    state = {"model": weights()}
    first = store.save("r", state)
    again = store.save("r", state)
    assert first.added is not None and first.added > 2 * MiB
    assert again.added is not None and again.added < 4096  # the record, no chunk
    state["model"]["embed"][400, 5] += 1.0  # in the second MiB of the 2 MiB array
    state["model"]["meta"]["step"] = 4
    changed = store.save("r", state)
    assert changed.added is not None and MiB <= changed.added < MiB + 8192
    loaded = store.latest("r")
    assert loaded is not None
    same(state["model"], loaded.state["model"])
    older = store.get(again.id)
    assert older.state["model"]["meta"]["step"] == 3
    assert older.state["model"]["embed"][400, 5] != state["model"]["embed"][400, 5]


def test_a_damaged_chunk_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with pitstop.open_store(f"sqlite:///{path}", blobs=False) as store:
        store.save("r", {"model": weights()})
    db = sqlite3.connect(path)
    with db:
        key, data = db.execute(
            "SELECT hash, data FROM pitstop_blobs WHERE size > 500000 ORDER BY hash LIMIT 1"
        ).fetchone()
        damaged = bytearray(data)
        damaged[1000] ^= 0xFF
        db.execute("UPDATE pitstop_blobs SET data = ? WHERE hash = ?", (bytes(damaged), key))
    db.close()
    with pitstop.open_store(f"sqlite:///{path}", blobs=False) as store:
        with pytest.raises(pitstop.CorruptCheckpointError, match="checksum mismatch") as err:
            store.latest("r")
        assert err.value.field == "model"
        assert [p.kind for p in store.verify()] == ["blob"]


@pytest.mark.slow
def test_state_dicts_of_a_model_and_optimizer(store: Store) -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 64).to(torch.bfloat16))
    opt = torch.optim.Adam(model[0].parameters())
    model[0](torch.randn(8, 256)).sum().backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "t": torch.randn(300, 200).T,  # a transpose: its strides come back
        "p": torch.nn.Parameter(torch.randn(40_000)),
        "step": 1,
    }
    store.save("train", state)
    loaded = store.latest("train")
    assert loaded is not None
    assert type(loaded.state["model"]) is collections.OrderedDict
    for name in ("model", "optim", "t", "p", "step"):
        same(state[name], loaded.state[name])
    again = store.save("train", state)
    assert again.added is not None and again.added < 4096


def test_pickle_stores_still_take_arrays(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with pitstop.open_store(url, serializer=pitstop.PickleSerializer()) as store:
        state = {"model": weights()}
        store.save("r", state)
        loaded = store.latest("r")
        assert loaded is not None
        same(state["model"], loaded.state["model"])


@pytest.mark.slow
def test_a_prepared_save_holds_its_own_copy(store: Store) -> None:
    """A save prepared now and committed later (the runtime's background writer) stores the
    arrays as they were when it was prepared, whatever happens to them in between."""
    state = {"model": weights(), "top": np.ones(MiB, dtype=np.float32)}
    before = state["model"]["embed"].copy()
    prepared = store.prepare("r", state)
    state["model"]["embed"][:] = 0.0
    state["top"][:] = 2.0
    store.commit(prepared)
    loaded = store.latest("r")
    assert loaded is not None
    assert loaded.state["model"]["embed"].tobytes() == before.tobytes()
    assert (loaded.state["top"] == 1.0).all()


def test_blob_directory_writes_many_chunks_at_once(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    with pitstop.open_store(f"sqlite:///{tmp_path / 's.db'}", blobs=str(blobs)) as store:
        state = {"w": [np.full(MiB // 4 + 17, i, dtype=np.float32) for i in range(6)]}
        store.save("r", state)
        files = [f for f in blobs.rglob("*") if f.is_file()]
        assert [f.suffix for f in files] == [".pack"]  # every chunk in one file
        assert files[0].stat().st_size > 6 * MiB
        loaded = store.latest("r")
        assert loaded is not None
        same(state["w"], loaded.state["w"])


def test_sqlite_keeps_large_chunks_beside_the_file_by_default(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with pitstop.open_store(f"sqlite:///{path}") as store:
        store.save("small", {"x": 1, "text": "a" * 10_000})
        assert not (tmp_path / "runs.db-blobs").exists()  # made by the first large value
        state = {"model": weights()}
        store.save("big", state)
    files = list((tmp_path / "runs.db-blobs").rglob("*.pack"))
    # the two full 1 MiB chunks of "embed", in one pack; the rest is in the table
    assert len(files) == 1 and 2 * MiB < files[0].stat().st_size < 3 * MiB
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for name in ("runs.db", "runs.db-blobs"):
        (tmp_path / name).rename(moved / name)
    with pitstop.open_store(f"sqlite:///{moved / 'runs.db'}") as store:
        loaded = store.latest("big")
        assert loaded is not None
        same(state["model"], loaded.state["model"])
        assert store.verify() == []
    with pitstop.open_store(f"sqlite:///{tmp_path / 'in.db'}?blobs=off") as store:
        store.save("big", state)
    assert not (tmp_path / "in.db-blobs").exists()


def test_sqlite_writes_a_small_models_tensors_once(tmp_path: Path) -> None:
    """Tensors of a few hundred KB (a small model's) go to one pack a save, not into the
    file, where SQLite writes every row twice (the WAL, then the database)."""
    rng = np.random.default_rng(3)
    model = {f"layer{i}": rng.standard_normal(40_000 + 20_000 * i, dtype=np.float32)
             for i in range(4)}  # 160-400 KB each
    model["bias"] = np.zeros(1000, dtype=np.float32)  # 4 KB: stays in the table
    path = tmp_path / "runs.db"
    with pitstop.open_store(f"sqlite:///{path}?durability=full") as store:
        for step in range(3):
            model["layer0"] += 1  # one tensor changed a save: only its chunk is written
            store.save("train", {"model": model, "step": step})
        with sqlite3.connect(path) as db:
            in_table = db.execute("SELECT SUM(LENGTH(data)) FROM pitstop_blobs").fetchone()[0]
        loaded = store.latest("train")
        assert loaded is not None
        same(model, loaded.state["model"])
        assert store.verify() == []
    tensors = sum(a.nbytes for a in model.values())
    assert in_table < 16_000  # the bias, the skeleton, the manifest nodes
    # the first save's tensors in one pack; each later save's one changed tensor in a file
    written = sorted((f for f in (tmp_path / "runs.db-blobs").rglob("*") if f.is_file()),
                     key=lambda f: f.stat().st_mtime_ns)
    sizes = [f.stat().st_size for f in written]
    assert len(written) == 3 and sizes[0] > tensors - 8_000 and max(sizes[1:]) < 170_000


@pytest.mark.slow
def test_sha256_chunk_keys_when_asked(shared_url: str) -> None:
    """chunk_hash="sha256": new chunks are keyed (and checked) with SHA-256; chunks written
    with xxh3 before still load and verify, and the switch rewrites only what changes."""
    state = {"model": weights()}
    with pitstop.open_store(shared_url) as plain:
        plain.save("r", state)
    with pitstop.open_store(shared_url, chunk_hash="sha256") as crypto:
        loaded = crypto.latest("r")
        assert loaded is not None
        same(state["model"], loaded.state["model"])
        state["model"]["meta"]["step"] = 9
        crypto.save("r", state)
        crypto.save("s", {"model": weights(1), "items": list(range(5000))})
        assert crypto.verify() == []
    with pitstop.open_store(shared_url) as plain:
        for run in ("r", "s"):
            again = plain.latest(run)
            assert again is not None
        assert again.state["items"] == list(range(5000))
        assert plain.latest("r").state["model"]["meta"]["step"] == 9  # type: ignore[union-attr]
    with pytest.raises(pitstop.UnsupportedStoreError, match="chunk_hash"):
        pitstop.open_store(shared_url, chunk_hash="md5")


def test_large_tensors_of_every_kind_round_trip_out_of_band(store: Store) -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(256, 512, generator=gen)  # 512 KiB as float32
    state = {
        "f16": base.half(), "bf16": base.bfloat16(), "i8": (base * 40).to(torch.int8),
        "bool": base > 0, "c64": torch.complex(base, -base),
        "gaps": base[:, ::2],  # not dense: stored compacted, as .contiguous() makes it
        "channels_last": torch.randn(8, 16, 32, 32, generator=gen).to(
            memory_format=torch.channels_last),
        "np_f64": np.arange(20_000, dtype=np.float64).reshape(100, 200),
        "small": torch.zeros(()), "empty": torch.empty(0, 3),
    }
    store.save("r", {"s": state})
    loaded = store.latest("r")
    assert loaded is not None
    out = loaded.state["s"]
    for name, value in state.items():
        expected = value.contiguous() if name == "gaps" else value
        same(expected, out[name])
