"""Out-of-band buffers: large arrays and tensors handed to the store as memoryviews.

``dumps_parts(value)`` returns the value's msgpack encoding with every numpy array and torch
tensor of at least :data:`BUFFER_MIN` bytes replaced by a small reference (``ExtCode.BUFFER``:
its index, dtype, shape and layout), plus those arrays' bytes as memoryviews, in order. The
bytes never pass through msgpack: the store chunks and hashes them where they are (the
chunked layout, :mod:`pitstop.serde.chunks`) and writes them from there. ``loads_parts``
takes the skeleton and one writable buffer per reference (a ``bytearray`` the store filled)
and builds the arrays on that memory without copying it.

The same as pickle protocol 5's out-of-band buffers, without pickle. Arrays are found inside
dicts, lists and tuples (the shape of every ``state_dict()``); one held by a registered class
stays inline, in the ordinary ``NDARRAY``/``TENSOR`` encoding.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

BUFFER_MIN: Final = 64 * 1024
"""Arrays and tensors with fewer bytes stay inline in the skeleton."""


class Parts(NamedTuple):
    """A value as a msgpack skeleton and the raw buffers it refers to, in order."""

    skeleton: bytes
    buffers: list[memoryview]


class BufferRef:
    """Stands in the skeleton for one out-of-band buffer (encoded as ``ExtCode.BUFFER``)."""

    __slots__ = ("index", "kind", "meta")

    def __init__(self, index: int, kind: str, meta: list[Any]) -> None:
        self.index = index
        self.kind = kind
        self.meta = meta

    def payload(self) -> list[Any]:
        return [self.index, self.kind, self.meta]


def numpy_dtype(np: Any, descr: object) -> Any:
    """The dtype an array's stored ``descr`` names (a string, or numpy's list form), refusing
    object dtypes: building one would unpickle arbitrary objects. Here because both the
    in-band codec and out-of-band buffers rebuild arrays from it."""
    if type(descr) is str:
        dtype = np.dtype(descr)
    elif type(descr) is list:
        from numpy.lib import format as npy_format

        dtype = npy_format.descr_to_dtype(descr)
    else:
        raise TypeError(f"expected list, found {type(descr).__name__}")
    if dtype.hasobject:
        raise TypeError("object dtypes are refused: they would unpickle arbitrary objects")
    return dtype


def _ndarray_part(array: Any) -> tuple[list[Any], memoryview]:
    from numpy.lib import format as npy_format

    np = sys.modules["numpy"]
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    meta = [npy_format.dtype_to_descr(array.dtype), list(array.shape)]
    return meta, memoryview(contiguous.reshape(-1).view(np.uint8))


def _tensor_part(value: Any) -> tuple[list[Any], memoryview]:
    from .tensors import encode_meta

    return encode_meta(value)


def split_buffers(value: Any, buffers: list[memoryview], min_size: int) -> Any:
    """``value`` with its large arrays and tensors replaced by :class:`BufferRef`\\ s (their
    bytes appended to ``buffers``); containers without any are returned as they are."""
    cls = type(value)
    if cls is dict or cls is collections.OrderedDict:
        items = {k: split_buffers(v, buffers, min_size) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value
        return cls(items) if cls is dict else collections.OrderedDict(items)
    if cls is list or cls is tuple:
        converted = [split_buffers(v, buffers, min_size) for v in value]
        if all(a is b for a, b in zip(converted, value, strict=True)):
            return value
        return converted if cls is list else tuple(converted)
    module = cls.__module__
    if module == "numpy" and cls is sys.modules["numpy"].ndarray:
        if value.nbytes < min_size or value.dtype.hasobject:
            return value
        meta, view = _ndarray_part(value)
        kind = "ndarray"
    elif module.startswith("torch"):
        from .tensors import is_tensor_class

        if not is_tensor_class(cls) or value.nbytes < min_size:
            return value
        meta, view = _tensor_part(value)
        kind = "tensor"
    else:
        return value
    buffers.append(view)
    return BufferRef(len(buffers) - 1, kind, meta)


def build(payload: Any, buffers: Sequence[Any] | None, strict: bool) -> Any:
    """The array or tensor an ``ExtCode.BUFFER`` reference stands for, on its buffer."""
    index, kind, meta = payload
    if buffers is None:
        raise ValueError(
            "the value refers to out-of-band buffers: load it with loads_parts(skeleton, "
            "buffers)"
        )
    if type(index) is not int or not 0 <= index < len(buffers):
        raise ValueError(f"buffer index {index!r} out of range ({len(buffers)} buffers)")
    buffer = buffers[index]
    if kind == "ndarray":
        import math

        import numpy

        descr, shape = meta
        dtype = numpy_dtype(numpy, descr)
        dims = tuple(shape)
        if any(type(d) is not int or d < 0 for d in dims):
            raise ValueError(f"bad array shape {shape!r}")
        if len(buffer) != math.prod(dims) * dtype.itemsize:
            raise ValueError(f"{len(buffer)} bytes do not fill an array of {dims} and {dtype}")
        if math.prod(dims) == 0:
            return numpy.zeros(dims, dtype=dtype)
        return numpy.frombuffer(buffer, dtype=dtype).reshape(dims)
    if kind == "tensor":
        from .tensors import decode_tensor

        name, shape, order, flags = meta
        return decode_tensor([name, shape, order, buffer, flags], strict)
    raise ValueError(f"unknown buffer kind {kind!r}")


__all__ = ["BUFFER_MIN", "BufferRef", "Parts", "build", "numpy_dtype", "split_buffers"]
