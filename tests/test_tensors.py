"""torch tensors and state_dicts round-trip exactly: dtypes, shapes, layouts, structures."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pitstop
from pitstop.serde import MsgpackSerializer, UnknownObject
from pitstop.serde.tensors import dense_order

torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")

SER = MsgpackSerializer()


def roundtrip(value: Any) -> Any:
    return SER.loads(SER.dumps(value))


def same(a: Any, b: Any) -> None:
    """Equal in type, dtype, shape, strides and bits (NaNs included)."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.stride() == b.stride() or not a.is_contiguous()
        assert a.requires_grad == b.requires_grad
        if a.numel():
            bits_a = a.detach().contiguous().reshape(-1).view(torch.uint8)
            bits_b = b.detach().contiguous().reshape(-1).view(torch.uint8)
            assert torch.equal(bits_a, bits_b)
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


DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes(dtype: Any) -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(5, 3, generator=gen, dtype=torch.float64) * 50
    tensor = torch.complex(base, -base).to(dtype) if dtype.is_complex else base.to(dtype)
    same(tensor, roundtrip(tensor))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor(3.25),  # 0-d
        torch.tensor(7, dtype=torch.bfloat16),
        torch.zeros(0),  # empty
        torch.zeros(4, 0, 2, dtype=torch.int8),
        torch.arange(12.0).reshape(3, 4).t(),  # transposed: strides kept
        torch.arange(120.0).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last),
        torch.arange(16.0).reshape(4, 4)[::2, 1:],  # gaps: stored compacted
        torch.arange(3.0).expand(4, 3),  # overlapping view
        torch.tensor([float("nan"), -0.0, float("inf")]),
        torch.tensor([1 + 2j, 3 - 1j]).conj(),  # lazy conjugate: its values, resolved
    ],
    ids=lambda t: f"{t.dtype}-{tuple(t.shape)}-{t.stride()}",
)
def test_shapes_and_layouts(tensor: Any) -> None:
    out = roundtrip(tensor)
    assert torch.equal(out.resolve_conj(), tensor.resolve_conj()) or tensor.isnan().any()
    assert out.shape == tensor.shape and out.dtype == tensor.dtype
    if dense_order(tuple(tensor.shape), tensor.stride()) is not None:
        assert out.stride() == tensor.stride()  # dense in some order: layout kept
    else:
        assert out.is_contiguous()
    out.add_(1) if out.dtype != torch.bool else out.logical_not_()  # writable memory


def test_parameters_and_requires_grad() -> None:
    param = torch.nn.Parameter(torch.ones(3))
    out = roundtrip({"p": param, "t": torch.ones(2, requires_grad=True)})
    assert type(out["p"]) is torch.nn.Parameter and out["p"].requires_grad
    assert out["t"].requires_grad and out["t"].is_leaf


def make_model_and_optimizer() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 2),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(2, 3, 6, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.mark.slow
def test_state_dicts_of_model_and_optimizer(tmp_path: Path) -> None:
    model, opt = make_model_and_optimizer()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 2}
    with pitstop.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.save("train", state)
        loaded = store.latest("train")
        assert loaded is not None
        out = dict(loaded.state)
    same(state["model"], out["model"])
    assert type(out["model"]) is collections.OrderedDict
    same(state["optim"], out["optim"])  # int keys, tuples (betas), 0-d step tensors
    model2, opt2 = make_model_and_optimizer()
    model2.load_state_dict(out["model"])
    opt2.load_state_dict(out["optim"])
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:.*quantized:UserWarning")
def test_unsupported_tensors_are_named() -> None:
    with pytest.raises(pitstop.SerializationError, match=r"state\.q.*quantized"):
        save_in_memory({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)})
    with pytest.raises(pitstop.SerializationError, match="layout"):
        SER.dumps(torch.ones(2, 2).to_sparse())


def save_in_memory(state: dict[str, Any]) -> None:
    with pitstop.open_store("memory://") as store:
        store.save("run", state)


def test_malformed_payloads_are_refused() -> None:
    from pitstop.serde.tensors import build_tensor

    with pytest.raises(ValueError, match="dtype"):
        build_tensor(torch, "Tensor.__init__", [1], None, b"\0" * 4)
    with pytest.raises(ValueError, match="bytes do not fill"):
        build_tensor(torch, "float32", [2], None, b"\0" * 4)
    with pytest.raises(ValueError, match="order"):
        build_tensor(torch, "float32", [1, 1], [0, 0], b"\0" * 4)


def test_loads_without_torch_as_unknown_object(tmp_path: Path) -> None:
    """A process without torch (the CLI on an ops box) still opens the checkpoint."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with pitstop.open_store(url) as store:
        store.save("run", {"w": torch.ones(2, 3, dtype=torch.bfloat16)})
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pitstop\n"
        f"store = pitstop.open_store({url!r})\n"
        "print(store.latest('run', strict=False).state['w'])\n"
        "try:\n    store.latest('run')\nexcept pitstop.SerializationError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "UnknownObject('torch.Tensor', {'dtype': 'bfloat16', 'shape': [2, 3]})" in out.stdout
    assert "torch is not installed" in out.stdout
    assert isinstance(UnknownObject("torch.Tensor", {}), UnknownObject)


def test_display_view() -> None:
    from pitstop.serde import to_jsonable

    view = to_jsonable({"w": torch.arange(4, dtype=torch.bfloat16)})
    assert view == {"w": {"$tensor": "bfloat16", "shape": [4], "preview": [0.0, 1.0, 2.0, 3.0]}}
