"""pitstop's MessagePack extension types: their codes, encoders and decoders.

Each encoder turns one kind of value into ``(code, payload)`` and each decoder turns a payload
back into the value; both are written once against :class:`Children`, which either passes a
value's children through (the fast paths, where ormsgpack recurses itself) or converts each
one with its own path (the slow paths, which name where a problem is). The codec core that
drives them lives in :mod:`pitstop.serde.codec`.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import decimal
import enum
import math
import sys
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

from pitstop.errors import SerializationError

from . import buffers, tensors
from .base import UnknownObject, defined_in_python, type_name_of
from .registry import (
    BUILTIN_BASES,
    Kind,
    Registration,
    TypeRegistry,
    is_pydantic_model,
    is_struct,
)


class ExtCode(enum.IntEnum):
    """MessagePack extension type codes: part of the on-disk format.

    A code, once released, keeps its meaning forever: never reuse or renumber one, even after
    the type it stands for is dropped; add new codes instead. Payloads are themselves msgpack.
    """

    # 1-15: core Python values that msgpack has no type for.
    BIG_INT = 1  # bytes: two's complement, big-endian (ints outside the 64-bit range)
    SURROGATE_STR = 2  # bytes: UTF-8 with "surrogatepass" (a str holding lone surrogates)
    BYTEARRAY = 3  # bytes
    COMPLEX = 4  # [real, imag]
    TUPLE = 5  # [item, ...]
    SET = 6  # [member, ...], sorted when the members are orderable
    FROZENSET = 7  # [member, ...], sorted when the members are orderable
    DICT = 8  # [[key, ...], [value, ...]]: a dict with at least one key that is not a str
    ORDERED_DICT = 9  # [[key, ...], [value, ...]]
    COUNTER = 10  # [[key, ...], [value, ...]]
    DEQUE = 11  # [maxlen | nil, [item, ...]]
    # 16-31: standard-library value types.
    DATETIME = 16  # [year, month, day, hour, minute, second, microsecond, fold, tz]
    DATE = 17  # [year, month, day]
    TIME = 18  # [hour, minute, second, microsecond, fold, tz]
    TIMEDELTA = 19  # [days, seconds, microseconds]
    UUID = 20  # bytes(16)
    DECIMAL = 21  # str(value), exact (NaN, Infinity and -0 included)
    # 32-47: registered classes, named by their registration name (never an import path).
    ENUM = 32  # [name, member name], or [name, int value] for Flag
    OBJECT = 33  # [name, {attribute: value}]: __dict__ and __slots__
    PYDANTIC = 34  # [name, __dict__, extra | nil, [fields set], private | nil]
    STRUCT = 35  # [name, {field: value}, [names of fields set to msgspec.UNSET]]
    CUSTOM = 36  # [name, encode(obj)]
    BUILTIN_SUBCLASS = 37  # [name, value as the builtin base type, {attribute: value}]
    # 48-63: numpy.
    NDARRAY = 48  # [dtype descr, [dim, ...], raw bytes in C order]
    NUMPY_SCALAR = 49  # [dtype descr, raw bytes]
    # 64-79: torch (see serde/tensors.py).
    TENSOR = 64  # [dtype name, [dim, ...], dims order in memory | nil, raw bytes, flags]
    # 80-95: references to data kept outside the encoding.
    BUFFER = 80  # [index, "ndarray" | "tensor", meta]: an out-of-band buffer (serde/buffers.py)
    # tz above: nil (naive) | str (zoneinfo key) | [offset µs] | [offset µs, name] (timezone)


# -- paths ------------------------------------------------------------------------------------


def _short_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type_name_of(type(value))}>"
    return text if len(text) <= 60 else text[:57] + "..."


def attr_segment(name: str) -> str:
    return f".{name}" if name.isidentifier() else f"[{_short_repr(name)}]"


def key_segment(key: object) -> str:
    return attr_segment(key) if type(key) is str else f"[{_short_repr(key)}]"


class Children:
    """How an encoder or decoder hands over the children of the value it handles.

    Encoders and decoders are written once against this interface. This base class passes
    children through untouched, which is all the fast paths need (ormsgpack recurses on its
    own); the slow paths convert every child themselves, which is what lets them report the
    child's path.
    """

    __slots__ = ("path",)

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def seq(self, items: Iterable[Any]) -> list[Any]:
        return items if type(items) is list else list(items)

    def members(self, items: Iterable[Any]) -> list[Any]:
        return items if type(items) is list else list(items)

    def attrs(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        return fields if type(fields) is dict else dict(fields)

    def entries(self, keys: Iterable[Any], values: Iterable[Any]) -> list[list[Any]]:
        return [self.seq(keys), self.seq(values)]

    def inner(self, value: Any) -> Any:
        """A child that stands for the whole value (a custom encoding): same path."""
        return value


DIRECT: Final = Children()


class Tracked(Children):
    """Children converted one by one by ``convert(child, path)``, each with its own path."""

    __slots__ = ("_convert",)
    path: str
    #: Label dict values by the converted keys (decoding) rather than the originals (encoding).
    _label_by_output = False

    def __init__(self, path: str, convert: Callable[[Any, str], Any]) -> None:
        super().__init__(path)
        self._convert = convert

    def seq(self, items: Iterable[Any]) -> list[Any]:
        convert, path = self._convert, self.path
        return [convert(item, f"{path}[{i}]") for i, item in enumerate(items)]

    def members(self, items: Iterable[Any]) -> list[Any]:
        convert, path = self._convert, self.path
        return [convert(item, f"{path}{{{i}}}") for i, item in enumerate(items)]

    def attrs(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in fields.items():
            if type(name) is not str:
                raise SerializationError(f"attribute name {name!r} is not a str", path=self.path)
            out[name] = self._convert(value, f"{self.path}{attr_segment(name)}")
        return out

    def entries(self, keys: Iterable[Any], values: Iterable[Any]) -> list[list[Any]]:
        convert, path = self._convert, self.path
        keys = list(keys)
        converted = [convert(key, f"{path}.keys()[{i}]") for i, key in enumerate(keys)]
        labels = converted if self._label_by_output else keys
        return [
            converted,
            [
                convert(value, f"{path}{key_segment(label)}")
                for label, value in zip(labels, values, strict=True)
            ],
        ]

    def inner(self, value: Any) -> Any:
        return self._convert(value, self.path)


class Decoding(Tracked):
    """Slow-path decoding: dict values are labelled by their decoded keys, not the raw ones."""

    __slots__ = ()
    _label_by_output = True


# -- encoders: value -> (code, payload) ---------------------------------------------------------

# The registration argument is None for the types handled without one.
Encoder = Callable[[Any, Children, Any], tuple[int, object]]


def _stable_order(members: Iterable[Any]) -> list[Any]:
    # Sets iterate in hash order, which for str changes from process to process; sorting keeps
    # equal states byte-identical, so content-addressed blobs are shared between runs.
    try:
        return sorted(members)
    except Exception:
        return list(members)


def _encode_tz(tz: datetime.tzinfo | None) -> object:
    if tz is None:
        return None
    if type(tz) is datetime.timezone:
        args: tuple[Any, ...] = tz.__getinitargs__()  # type: ignore[attr-defined]
        offset = args[0] // datetime.timedelta(microseconds=1)
        return [offset, *args[1:]]
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        return tz.key
    raise SerializationError(
        f"time zone {tz!r} cannot be stored: use datetime.timezone or zoneinfo.ZoneInfo(key)",
        type_name=type_name_of(type(tz)),
    )


def _pairs(code: ExtCode) -> Encoder:
    def encode(value: Any, kids: Children, reg: Any) -> tuple[int, object]:
        return code, kids.entries(value.keys(), value.values())

    return encode


def _state(value: Any, reg: Registration) -> dict[str, Any]:
    """An instance's attributes as pickle sees them: ``__dict__`` plus filled ``__slots__``."""
    state: dict[str, Any] = object.__getattribute__(value, "__dict__") if reg.has_dict else {}
    if reg.slots:
        state = dict(state)
        for name in reg.slots:
            with contextlib.suppress(AttributeError):  # a slot never assigned stays unassigned
                state[name] = object.__getattribute__(value, name)
    return state


_BASE_VALUE: Final[dict[type, Callable[[Any], object]]] = {
    str: str.__str__,
    bytes: bytes.__bytes__,
    int: int.__int__,
    float: float.__float__,
    # Iterate with the base type's own iterator: a subclass may override __iter__.
    tuple: lambda v: tuple(tuple.__iter__(v)),
    frozenset: lambda v: frozenset(frozenset.__iter__(v)),
    list: lambda v: list(list.__iter__(v)),
    set: lambda v: set(set.__iter__(v)),
    dict: lambda v: dict(dict.items(v)),
}


def _numpy_descr(dtype: Any) -> object:
    from numpy.lib import format as npy_format

    return npy_format.dtype_to_descr(dtype)


def _encode_ndarray(value: Any, kids: Children, reg: Any) -> tuple[int, object]:
    if value.dtype.hasobject:
        raise SerializationError(
            "numpy arrays of dtype object hold arbitrary Python objects and cannot be stored; "
            "convert them to a list or to an array of a concrete dtype",
            type_name="numpy.ndarray",
        )
    return ExtCode.NDARRAY, [_numpy_descr(value.dtype), list(value.shape), value.tobytes()]


def _encode_numpy_scalar(value: Any, kids: Children, reg: Any) -> tuple[int, object]:
    # numpy.str_("") has a dtype of itemsize 0 whose tobytes() is nevertheless 4 bytes.
    raw = value.tobytes() if value.dtype.itemsize else b""
    return ExtCode.NUMPY_SCALAR, [_numpy_descr(value.dtype), raw]


def _encode_buffer_ref(value: Any, kids: Children, reg: Any) -> tuple[int, object]:
    return ExtCode.BUFFER, value.payload()


def _encode_tensor(value: Any, kids: Children, reg: Any) -> tuple[int, object]:
    return ExtCode.TENSOR, tensors.encode_tensor(value)


def _date_parts(v: Any) -> list[object]:
    return [v.year, v.month, v.day]


def _time_parts(v: Any) -> list[object]:
    return [v.hour, v.minute, v.second, v.microsecond, v.fold, _encode_tz(v.tzinfo)]


NATIVE_ENCODERS: Final[dict[type, Encoder]] = {
    int: lambda v, kids, reg: (
        ExtCode.BIG_INT,
        v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True),
    ),
    str: lambda v, kids, reg: (ExtCode.SURROGATE_STR, v.encode("utf-8", "surrogatepass")),
    bytearray: lambda v, kids, reg: (ExtCode.BYTEARRAY, bytes(v)),
    complex: lambda v, kids, reg: (ExtCode.COMPLEX, [v.real, v.imag]),
    tuple: lambda v, kids, reg: (ExtCode.TUPLE, kids.seq(v)),
    set: lambda v, kids, reg: (ExtCode.SET, kids.members(_stable_order(v))),
    frozenset: lambda v, kids, reg: (ExtCode.FROZENSET, kids.members(_stable_order(v))),
    dict: _pairs(ExtCode.DICT),
    collections.OrderedDict: _pairs(ExtCode.ORDERED_DICT),
    collections.Counter: _pairs(ExtCode.COUNTER),
    collections.deque: lambda v, kids, reg: (ExtCode.DEQUE, [v.maxlen, kids.seq(v)]),
    datetime.datetime: lambda v, kids, reg: (ExtCode.DATETIME, [*_date_parts(v), *_time_parts(v)]),
    datetime.date: lambda v, kids, reg: (ExtCode.DATE, _date_parts(v)),
    datetime.time: lambda v, kids, reg: (ExtCode.TIME, _time_parts(v)),
    datetime.timedelta: lambda v, kids, reg: (
        ExtCode.TIMEDELTA,
        [v.days, v.seconds, v.microseconds],
    ),
    uuid.UUID: lambda v, kids, reg: (ExtCode.UUID, v.bytes),
    decimal.Decimal: lambda v, kids, reg: (ExtCode.DECIMAL, str(v)),
}


def _encode_pydantic(value: Any, kids: Children, reg: Registration) -> tuple[int, object]:
    # Mirrors BaseModel.__getstate__, which is what pydantic itself trusts to round-trip a model.
    extra = value.__pydantic_extra__
    private = value.__pydantic_private__
    if private:
        undefined = sys.modules["pydantic_core"].PydanticUndefined
        private = {k: v for k, v in private.items() if v is not undefined}
    return ExtCode.PYDANTIC, [
        reg.name,
        kids.attrs(value.__dict__),
        None if extra is None else kids.attrs(extra),
        sorted(value.__pydantic_fields_set__),
        None if private is None else kids.attrs(private),
    ]


def _encode_struct(value: Any, kids: Children, reg: Registration) -> tuple[int, object]:
    unset = sys.modules["msgspec"].UNSET  # a marker, not a value: stored as a list of names
    fields = {n: getattr(value, n) for n in reg.fields}
    unset_names = [n for n, v in fields.items() if v is unset]
    for name in unset_names:
        del fields[name]
    return ExtCode.STRUCT, [reg.name, kids.attrs(fields), unset_names]


def _encode_builtin_subclass(value: Any, kids: Children, reg: Registration) -> tuple[int, object]:
    assert reg.base is not None
    base_value = _BASE_VALUE[reg.base](value)
    state = kids.attrs(_state(value, reg))
    return ExtCode.BUILTIN_SUBCLASS, [reg.name, kids.inner(base_value), state]


def _encode_custom(value: Any, kids: Children, reg: Registration) -> tuple[int, object]:
    assert reg.encode is not None
    return ExtCode.CUSTOM, [reg.name, kids.inner(reg.encode(value))]


def _encode_enum(value: Any, kids: Children, reg: Registration) -> tuple[int, object]:
    # By name, so that reordering or renumbering members keeps old checkpoints readable; Flag
    # combinations have no single name, so they go by value.
    key = value._value_ if isinstance(value, enum.Flag) else value._name_
    return ExtCode.ENUM, [reg.name, key]


_KIND_ENCODERS: Final[dict[Kind, Encoder]] = {
    Kind.CUSTOM: _encode_custom,
    Kind.ENUM: _encode_enum,
    Kind.PYDANTIC: _encode_pydantic,
    Kind.STRUCT: _encode_struct,
    Kind.BUILTIN_SUBCLASS: _encode_builtin_subclass,
    Kind.OBJECT: lambda v, kids, reg: (ExtCode.OBJECT, [reg.name, kids.attrs(_state(v, reg))]),
}


def encoder_for(cls: type, registry: TypeRegistry) -> tuple[Encoder, Registration | None]:
    encoder = NATIVE_ENCODERS.get(cls)
    if encoder is not None:
        return encoder, None
    if cls is buffers.BufferRef:
        return _encode_buffer_ref, None
    reg = registry.registration_for(cls)
    if reg is not None:
        return _KIND_ENCODERS[reg.kind], reg
    module = cls.__module__
    if module == "numpy" or module.startswith("numpy."):
        np = sys.modules["numpy"]
        if cls is np.ndarray:
            return _encode_ndarray, None
        if issubclass(cls, np.generic):
            return _encode_numpy_scalar, None
    if module.startswith("torch") and tensors.is_tensor_class(cls):
        return _encode_tensor, None
    raise _unsupported(cls)


def _unsupported(cls: type) -> SerializationError:
    name = type_name_of(cls)
    numpy = sys.modules.get("numpy")
    if cls is UnknownObject:
        reason = (
            "an UnknownObject (from loads(strict=False)) is a read-only stand-in and cannot be "
            "saved; load the checkpoint with its classes registered instead"
        )
    elif numpy is not None and issubclass(cls, numpy.ndarray):
        reason = "ndarray subclasses are not supported; store numpy.asarray(value) instead"
    elif _user_defined(cls):
        reason = (
            f"{_describe_class(cls)} {name} is not registered; "
            f"register it with pitstop.register({name})"
        )
    else:
        reason = (
            f"values of type {name} cannot be checkpointed (they hold live process state or have "
            "no safe stored form); keep them out of the state or rebuild them on resume"
        )
    return SerializationError(reason, type_name=name)


def _user_defined(cls: type) -> bool:
    """Whether registering ``cls`` is the likely fix (as opposed to a stdlib or C type)."""
    top = cls.__module__.partition(".")[0]
    return defined_in_python(cls) and top not in sys.stdlib_module_names


def _describe_class(cls: type) -> str:
    if issubclass(cls, enum.Enum):
        return "enum"
    if "__dataclass_fields__" in cls.__dict__:
        return "dataclass"
    if is_pydantic_model(cls):
        return "pydantic model"
    if is_struct(cls):
        return "msgspec Struct"
    base = next((b for b in BUILTIN_BASES if issubclass(cls, b)), None)
    return "class" if base is None else f"{base.__name__} subclass"


# -- decoders: payload -> value -----------------------------------------------------------------


class DecodeContext(Protocol):
    """What a decoder may ask of the ``loads`` call it runs in (``codec._Decoder``)."""

    strict: bool
    buffers: Sequence[Any] | None

    def lookup(self, stored_name: object, kind: Kind, kids: Children) -> Registration | None: ...


Decoder = Callable[[Any, Children, DecodeContext], object]


def expect(value: object, cls: type) -> Any:
    if type(value) is not cls:
        raise TypeError(f"expected {cls.__name__}, found {type(value).__name__}")
    return value


def _decode_tz(tz: object) -> datetime.tzinfo | None:
    if tz is None:
        return None
    if type(tz) is str:
        return zoneinfo.ZoneInfo(tz)
    offset, *name = expect(tz, list)
    return datetime.timezone(datetime.timedelta(microseconds=expect(offset, int)), *name)


def _decode_pairs(payload: Any, kids: Children) -> Iterable[tuple[Any, Any]]:
    keys, values = kids.entries(*expect(payload, list))
    return zip(keys, values, strict=True)


def _decode_counter(payload: Any, kids: Children, dec: DecodeContext) -> object:
    counter: collections.Counter[Any] = collections.Counter()
    dict.update(counter, _decode_pairs(payload, kids))  # Counter.update would add, not set
    return counter


def _decode_deque(payload: Any, kids: Children, dec: DecodeContext) -> object:
    maxlen, items = expect(payload, list)
    return collections.deque(kids.seq(items), maxlen)


def _decode_datetime(payload: Any, kids: Children, dec: DecodeContext) -> object:
    year, month, day, hour, minute, second, micro, fold, tz = expect(payload, list)
    tzinfo = _decode_tz(tz)
    return datetime.datetime(year, month, day, hour, minute, second, micro, tzinfo, fold=fold)


def _decode_time(payload: Any, kids: Children, dec: DecodeContext) -> object:
    hour, minute, second, micro, fold, tz = expect(payload, list)
    return datetime.time(hour, minute, second, micro, _decode_tz(tz), fold=fold)


def _restore(obj: Any, attrs: Any, reg: Registration) -> Any:
    """Set attributes the way pickle does: into ``__dict__`` directly, slots via the descriptor.

    ``object.__setattr__`` skips frozen-dataclass guards and any custom ``__setattr__``;
    nothing of the class runs, so a stored object cannot trigger behaviour on load.
    """
    attrs = expect(attrs, dict)
    if not attrs:
        return obj
    inst_dict = object.__getattribute__(obj, "__dict__") if reg.has_dict else None
    if inst_dict is not None and not reg.slots:
        inst_dict.update(attrs)
        return obj
    for name, value in attrs.items():
        if name in reg.slots:
            object.__setattr__(obj, name, value)
        elif inst_dict is not None:
            inst_dict[name] = value
        else:
            raise TypeError(f"{reg.name} has no slot {name!r}")
    return obj


def _decode_enum(payload: Any, kids: Children, dec: DecodeContext) -> object:
    name, key = expect(payload, list)
    reg = dec.lookup(name, Kind.ENUM, kids)
    if reg is None:
        return UnknownObject(name, {"name" if type(key) is str else "value": key})
    cls: Any = reg.cls
    try:
        return cls[key] if type(key) is str else cls(key)
    except (KeyError, ValueError) as exc:
        raise SerializationError(
            f"{name} has no member {key!r} (renamed or removed since it was saved?)",
            type_name=name,
        ) from exc


def _decode_object(payload: Any, kids: Children, dec: DecodeContext) -> object:
    name, attrs = expect(payload, list)
    reg = dec.lookup(name, Kind.OBJECT, kids)
    attrs = kids.attrs(attrs)
    if reg is None:
        return UnknownObject(name, attrs)
    return _restore(object.__new__(reg.cls), attrs, reg)


def _decode_pydantic(payload: Any, kids: Children, dec: DecodeContext) -> object:
    name, fields, extra, fields_set, private = expect(payload, list)
    reg = dec.lookup(name, Kind.PYDANTIC, kids)
    fields = kids.attrs(expect(fields, dict))
    extra = None if extra is None else kids.attrs(expect(extra, dict))
    private = None if private is None else kids.attrs(expect(private, dict))
    if reg is None:
        return UnknownObject(name, {**fields, **(extra or {}), **(private or {})})
    # What BaseModel.__setstate__ does, without calling into the class: no validation, no
    # default factories, no model_post_init.
    model: Any = object.__new__(reg.cls)
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(model, "__pydantic_extra__", extra)
    object.__setattr__(model, "__pydantic_fields_set__", {expect(f, str) for f in fields_set})
    object.__setattr__(model, "__pydantic_private__", private)
    return model


def _decode_struct(payload: Any, kids: Children, dec: DecodeContext) -> object:
    name, fields, unset_names = expect(payload, list)
    reg = dec.lookup(name, Kind.STRUCT, kids)
    fields = kids.attrs(expect(fields, dict))
    if reg is None:
        return UnknownObject(name, fields)
    unset = sys.modules["msgspec"].UNSET  # imported: a registered Struct class exists
    return reg.cls(**fields, **{expect(n, str): unset for n in expect(unset_names, list)})


def _decode_custom(payload: Any, kids: Children, dec: DecodeContext) -> object:
    name, data = expect(payload, list)
    reg = dec.lookup(name, Kind.CUSTOM, kids)
    data = kids.inner(data)
    if reg is None:
        return UnknownObject(name, {"value": data})
    assert reg.decode is not None
    return reg.decode(data)


def _new_filled(base: Any, fill: Callable[[Any, Any], object]) -> Callable[[type, Any], Any]:
    def build(cls: type, value: Any) -> Any:
        obj = base.__new__(cls)
        fill(obj, value)
        return obj

    return build


# The base type's own constructor and mutators: a subclass's __new__/__init__ never run.
_BASE_REBUILD: Final[dict[type, Callable[[type, Any], Any]]] = {
    str: str.__new__,
    bytes: bytes.__new__,
    int: int.__new__,
    float: float.__new__,
    tuple: tuple.__new__,
    frozenset: frozenset.__new__,
    list: _new_filled(list, list.extend),
    set: _new_filled(set, set.update),
    dict: _new_filled(dict, dict.update),
}


def _decode_builtin_subclass(payload: Any, kids: Children, dec: DecodeContext) -> object:
    name, value, attrs = expect(payload, list)
    reg = dec.lookup(name, Kind.BUILTIN_SUBCLASS, kids)
    value = kids.inner(value)
    attrs = kids.attrs(expect(attrs, dict))
    if reg is None:
        return UnknownObject(name, {"value": value, **attrs})
    assert reg.base is not None
    obj = _BASE_REBUILD[reg.base](reg.cls, expect(value, reg.base))
    return _restore(obj, attrs, reg)


def _numpy_or_none(dec: DecodeContext) -> Any:
    try:
        import numpy
    except ImportError as exc:
        if dec.strict:
            raise SerializationError(
                "the value holds a numpy array or scalar, but numpy is not installed",
                type_name="numpy.ndarray",
            ) from exc
        return None
    return numpy


def _decode_ndarray(payload: Any, kids: Children, dec: DecodeContext) -> object:
    descr, shape, raw = expect(payload, list)
    np = _numpy_or_none(dec)
    if np is None:
        return UnknownObject("numpy.ndarray", {"dtype": descr, "shape": shape})
    dtype = buffers.numpy_dtype(np, descr)
    dims = tuple(expect(dim, int) for dim in expect(shape, list))
    count = math.prod(dims)
    if min(dims, default=0) < 0 or len(expect(raw, bytes)) != count * dtype.itemsize:
        raise ValueError(f"{len(raw)} bytes do not fill an array of shape {dims} and {dtype}")
    if count == 0 or dtype.itemsize == 0:
        return np.zeros(dims, dtype=dtype)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(dims).copy()  # copy: writable


def _decode_buffer(payload: Any, kids: Children, dec: DecodeContext) -> object:
    return buffers.build(expect(payload, list), dec.buffers, dec.strict)


def _decode_tensor(payload: Any, kids: Children, dec: DecodeContext) -> object:
    return tensors.decode_tensor(expect(payload, list), dec.strict)


def _decode_numpy_scalar(payload: Any, kids: Children, dec: DecodeContext) -> object:
    descr, raw = expect(payload, list)
    np = _numpy_or_none(dec)
    if np is None:
        return UnknownObject("numpy.generic", {"dtype": descr})
    dtype = buffers.numpy_dtype(np, descr)
    if len(expect(raw, bytes)) != dtype.itemsize:
        raise ValueError(f"{len(raw)} bytes do not hold one {dtype}")
    if dtype.itemsize == 0:
        return np.zeros((), dtype=dtype)[()]
    return np.frombuffer(raw, dtype=dtype, count=1)[0]


DECODERS: Final[dict[int, Decoder]] = {
    ExtCode.BIG_INT: lambda p, kids, dec: int.from_bytes(expect(p, bytes), "big", signed=True),
    ExtCode.SURROGATE_STR: lambda p, kids, dec: expect(p, bytes).decode("utf-8", "surrogatepass"),
    ExtCode.BYTEARRAY: lambda p, kids, dec: bytearray(expect(p, bytes)),
    ExtCode.COMPLEX: lambda p, kids, dec: complex(*(expect(x, float) for x in expect(p, list))),
    ExtCode.TUPLE: lambda p, kids, dec: tuple(kids.seq(expect(p, list))),
    ExtCode.SET: lambda p, kids, dec: set(kids.members(expect(p, list))),
    ExtCode.FROZENSET: lambda p, kids, dec: frozenset(kids.members(expect(p, list))),
    ExtCode.DICT: lambda p, kids, dec: dict(_decode_pairs(p, kids)),
    ExtCode.ORDERED_DICT: lambda p, kids, dec: collections.OrderedDict(_decode_pairs(p, kids)),
    ExtCode.COUNTER: _decode_counter,
    ExtCode.DEQUE: _decode_deque,
    ExtCode.DATETIME: _decode_datetime,
    ExtCode.DATE: lambda p, kids, dec: datetime.date(*expect(p, list)),
    ExtCode.TIME: _decode_time,
    ExtCode.TIMEDELTA: lambda p, kids, dec: datetime.timedelta(*expect(p, list)),
    ExtCode.UUID: lambda p, kids, dec: uuid.UUID(bytes=expect(p, bytes)),
    ExtCode.DECIMAL: lambda p, kids, dec: decimal.Decimal(expect(p, str)),
    ExtCode.ENUM: _decode_enum,
    ExtCode.OBJECT: _decode_object,
    ExtCode.PYDANTIC: _decode_pydantic,
    ExtCode.STRUCT: _decode_struct,
    ExtCode.CUSTOM: _decode_custom,
    ExtCode.BUILTIN_SUBCLASS: _decode_builtin_subclass,
    ExtCode.NDARRAY: _decode_ndarray,
    ExtCode.NUMPY_SCALAR: _decode_numpy_scalar,
    ExtCode.TENSOR: _decode_tensor,
    ExtCode.BUFFER: _decode_buffer,
}
