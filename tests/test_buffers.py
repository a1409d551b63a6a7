"""Out-of-band buffers: arrays and tensors leave the msgpack encoding as memoryviews."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

import pitstop
from pitstop.serde import BUFFER_MIN, MsgpackSerializer, Parts

SER = MsgpackSerializer()


def through_a_store(parts: Parts) -> list[bytearray]:
    """What a store hands back on load: one writable buffer per part, filled from disk."""
    return [bytearray(view) for view in parts.buffers]


def test_large_arrays_go_out_of_band_without_a_copy() -> None:
    big = np.arange(BUFFER_MIN // 4, dtype=np.float32)
    small = np.arange(10, dtype=np.int64)
    value = {"model": collections.OrderedDict(w=big, b=small), "step": 3, "hist": [big[::-1]]}
    parts = SER.dumps_parts(value)
    assert len(parts.buffers) == 2
    assert np.shares_memory(np.frombuffer(parts.buffers[0], dtype=np.float32), big)  # no copy
    assert len(parts.skeleton) < 300  # the skeleton holds no array bytes
    buffers = through_a_store(parts)
    out: Any = SER.loads_parts(parts.skeleton, buffers)
    assert type(out["model"]) is collections.OrderedDict
    assert np.array_equal(out["model"]["w"], big) and out["model"]["w"].dtype == np.float32
    assert np.array_equal(out["model"]["b"], small) and out["step"] == 3
    assert np.array_equal(out["hist"][0], big[::-1])  # non-contiguous: compacted
    assert np.shares_memory(out["model"]["w"], np.frombuffer(buffers[0], dtype=np.uint8))
    out["model"]["w"][0] = 7  # writable
    assert value["model"]["w"][0] == 0  # and not the original's memory


def test_values_without_large_arrays_encode_as_dumps_does() -> None:
    value = {"a": [1, (2, 3)], "arr": np.zeros(3)}
    parts = SER.dumps_parts(value)
    assert parts.buffers == [] and parts.skeleton == SER.dumps(value)


def test_a_skeleton_needs_its_buffers() -> None:
    parts = SER.dumps_parts({"w": np.zeros(BUFFER_MIN, dtype=np.uint8)})
    with pytest.raises(pitstop.SerializationError, match="loads_parts"):
        SER.loads(parts.skeleton)
    with pytest.raises(pitstop.SerializationError, match="out of range"):
        SER.loads_parts(parts.skeleton, [])
    with pytest.raises(pitstop.SerializationError, match="do not fill"):
        SER.loads_parts(parts.skeleton, [bytearray(10)])


def test_tensors_go_out_of_band_with_their_layout() -> None:
    torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
    w = torch.randn(256, 128)  # 128 KiB
    value = {"w": w, "wt": w.t(), "p": torch.nn.Parameter(torch.ones(BUFFER_MIN)),
             "bf": torch.ones(BUFFER_MIN, dtype=torch.bfloat16), "tiny": torch.ones(2)}
    parts = SER.dumps_parts(value)
    assert len(parts.buffers) == 4
    out: Any = SER.loads_parts(parts.skeleton, through_a_store(parts))
    assert torch.equal(out["w"], w) and torch.equal(out["wt"], w.t())
    assert out["wt"].stride() == w.t().stride()  # a transpose stays a transpose
    assert type(out["p"]) is torch.nn.Parameter and out["bf"].dtype == torch.bfloat16
    assert torch.equal(out["tiny"], torch.ones(2))


def test_large_load_buffers_start_on_a_huge_page() -> None:
    """What a load reads chunks into: a large buffer aligned to 2 MiB (only whole aligned
    ranges get huge pages: faults of 4 KiB elsewhere), writable, of exactly its size."""
    from pitstop.serde.partchunks import uninitialised

    for size in (4 << 20, (32 << 20) + 12345):
        buffer = uninitialised(size)
        assert buffer.nbytes == size and not buffer.readonly
        assert np.frombuffer(buffer, dtype=np.uint8).ctypes.data % (2 << 20) == 0
        buffer[-1] = 7
    assert uninitialised(100).nbytes == 100
