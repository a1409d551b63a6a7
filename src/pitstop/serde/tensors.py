"""torch tensors in the safe msgpack format, without importing torch unless a tensor is seen.

A tensor is stored as its dtype's name, its shape, the order of its dimensions in memory and
its raw bytes. Loading builds the tensor from those bytes with a dtype taken from a fixed
allowlist: nothing stored can name a function or a class, so a store never runs code.

Memory layout is kept where it is observable: a tensor that is dense in some order of its
dimensions (contiguous, ``channels_last``, a transpose) is stored in that order and comes back
with the same strides; a tensor that is not dense (a slice with gaps, an expanded view) is
stored compacted, as ``.contiguous()`` would make it, because its other bytes are not part of
its value. CUDA (and other device) tensors are copied to host memory; they load on the CPU,
and ``module.load_state_dict`` moves them to the parameters' device.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Final

from ..errors import SerializationError

# Stored dtype names: the attribute names in torch (torch.float32 is "float32"). Only these are
# accepted on load; a name outside the table is an error, never a getattr on torch.
_DTYPES: Final = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex128",
    "complex64",
    "complex32",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
)


def is_tensor_class(cls: type) -> bool:
    """Whether ``cls`` is torch.Tensor or torch.nn.Parameter (torch already imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and (cls is torch.Tensor or cls is torch.nn.Parameter)


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise SerializationError(
            f"torch tensors of dtype {dtype} cannot be stored (quantized or unsupported dtype)",
            type_name="torch.Tensor",
        )
    return name


def dense_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int] | None:
    """The permutation of dims that makes a tensor of these strides C-contiguous, if it is dense
    in some order (None if it has gaps or overlaps: it is then stored compacted)."""
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    expected = 1
    for dim in reversed(order):
        if shape[dim] != 1 and strides[dim] != expected:
            return None
        expected *= shape[dim]
    return order


def host_tensor(value: Any) -> Any:
    """The tensor as a plain CPU tensor holding its data (no autograd history, no subclass)."""
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.layout is not sys.modules["torch"].strided:
        raise SerializationError(
            f"torch tensors with layout {tensor.layout} cannot be stored; convert with "
            ".to_dense() first",
            type_name="torch.Tensor",
        )
    dtype_name(tensor.dtype)  # refuses quantized dtypes before anything reads their bytes
    return tensor.resolve_conj().resolve_neg()  # lazy conjugate/negative views: real values


def tensor_layout(tensor: Any) -> tuple[Any, list[int] | None]:
    """``(tensor in storage order, dims permutation or None)``: the bytes to store, in order."""
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    order = dense_order(shape, strides) if tensor.numel() > 1 else None
    if order is not None and order == sorted(order):
        order = None  # plain C order: nothing to record
    if order is not None:
        return tensor.permute(order), order
    return tensor.contiguous(), None


def tensor_bytes(tensor: Any) -> memoryview:
    """The C-contiguous tensor's bytes, without a copy."""
    torch = sys.modules["torch"]
    flat = tensor.reshape(-1) if tensor.dim() != 1 else tensor
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def encode_meta(value: Any) -> tuple[list[Any], memoryview]:
    """``([dtype, shape, order | nil, flags], bytes)``: a tensor's description and its bytes
    in storage order, as a memoryview of the tensor's own memory when it is dense."""
    torch = sys.modules["torch"]
    tensor = host_tensor(value)
    name = dtype_name(tensor.dtype)
    stored, order = tensor_layout(tensor)
    flags = (1 if value.requires_grad else 0) | (2 if type(value) is torch.nn.Parameter else 0)
    return [name, list(tensor.shape), order, flags], tensor_bytes(stored.contiguous())


def encode_tensor(value: Any) -> list[object]:
    """The stored form: [dtype, shape, order | nil, bytes, flags]; flags 1 = requires_grad,
    2 = a torch.nn.Parameter."""
    (name, shape, order, flags), raw = encode_meta(value)
    return [name, shape, order, bytes(raw), flags]


def torch_or_none(strict: bool) -> Any:
    try:
        import torch
    except ImportError as exc:
        if strict:
            raise SerializationError(
                "the value holds a torch tensor, but torch is not installed",
                type_name="torch.Tensor",
            ) from exc
        return None
    return torch


def build_tensor(torch: Any, name: object, shape: object, order: object, raw: Any) -> Any:
    """A tensor from its stored parts, every part checked (a bad one raises ValueError)."""
    if type(name) is not str or name not in _DTYPES:
        raise ValueError(f"unknown torch dtype {name!r}")
    dtype = getattr(torch, name)
    if type(shape) is not list or any(type(d) is not int or d < 0 for d in shape):
        raise ValueError(f"bad tensor shape {shape!r}")
    dims = tuple(shape)
    if order is not None and (type(order) is not list or sorted(order) != list(range(len(dims)))):
        raise ValueError(f"bad dimension order {order!r} for shape {dims}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = math.prod(dims)
    if len(raw) != count * itemsize:
        raise ValueError(f"{len(raw)} bytes do not fill a tensor of shape {dims} and {name}")
    if count == 0:
        return torch.empty(dims, dtype=dtype)
    writable = isinstance(raw, bytearray) or (isinstance(raw, memoryview) and not raw.readonly)
    buffer = raw if writable else bytearray(raw)  # the tensor needs memory of its own
    flat = torch.frombuffer(buffer, dtype=torch.uint8).view(dtype)
    if order is None:
        return flat.reshape(dims)
    stored = flat.reshape([dims[d] for d in order])
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return stored.permute(inverse)


def decode_tensor(payload: list[Any], strict: bool) -> Any:
    name, shape, order, raw, flags = payload
    torch = torch_or_none(strict)
    if torch is None:
        from .base import UnknownObject

        return UnknownObject("torch.Tensor", {"dtype": name, "shape": shape})
    if not isinstance(raw, bytes | bytearray | memoryview) or type(flags) is not int:
        raise ValueError("malformed tensor payload")
    tensor = build_tensor(torch, name, shape, order, raw)
    if flags & 2:
        return torch.nn.Parameter(tensor, requires_grad=bool(flags & 1))
    if flags & 1 and tensor.dtype.is_floating_point | tensor.dtype.is_complex:
        tensor.requires_grad_(True)
    return tensor


__all__ = ["build_tensor", "decode_tensor", "encode_meta", "encode_tensor", "is_tensor_class"]
