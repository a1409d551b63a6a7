"""Tests for pitstop.serde: exact round trips, located errors, the allowlist, framing, display."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import math
import os
import pickle
import socket
import subprocess
import sys
import threading
import typing
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from typing import Annotated, Any, NamedTuple, Optional, TypedDict

import hypothesis.extra.numpy as npst
import msgspec
import numpy as np
import ormsgpack
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pitstop.errors import SerializationError, UnregisteredTypeError
from pitstop.serde import (
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    TypeRegistry,
    UnknownObject,
    codec,
    default_registry,
    digest,
    exttypes,
    frame,
    register,
    to_jsonable,
    unframe,
)
from pitstop.serde.base import NATIVE_TYPES
from pitstop.serde.codec import ExtCode

# Test classes live in their own registry so the default one stays untouched by the suite.
REG = TypeRegistry()
SER = MsgpackSerializer(REG)


@REG.register
class Color(enum.Enum):
    RED = (255, 0, 0)  # a tuple value: enums are stored by name
    GREEN = (0, 255, 0)


@REG.register
class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@REG.register
class Mode(enum.StrEnum):
    READ = "r"
    WRITE = "w"


@REG.register
class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


@REG.register
@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


@REG.register
@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    name: str
    tags: tuple[str, ...] = ()
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", len(self.name))


@REG.register
@dataclasses.dataclass
class Box:
    """Holds arbitrary values; counts __post_init__ calls to prove loading never calls it."""

    a: Any = None
    b: Any = None
    post_inits: typing.ClassVar[int] = 0

    def __post_init__(self) -> None:
        type(self).post_inits += 1


@REG.register
class Inner(pydantic.BaseModel):
    label: str
    weight: float = 1.0


@REG.register
class Outer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    name: str
    inner: Inner
    items: list[Inner] = []
    anything: Any = None
    _secret: str = pydantic.PrivateAttr(default="s")

    @pydantic.field_validator("name")
    @classmethod
    def _shout(cls, value: str) -> str:
        return value.upper()


@REG.register
class Item(msgspec.Struct):
    sku: str
    qty: int = 1
    extra: Any = None


@REG.register
class FrozenItem(msgspec.Struct, frozen=True):
    sku: str


@REG.register
class Plain:
    def __init__(self, value: Any) -> None:
        raise AssertionError("__init__ must not run on load")

    def __eq__(self, other: object) -> bool:
        return type(other) is Plain and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]


@REG.register
class Slotted:
    __slots__ = ("__hidden", "a", "b")

    def __init__(self, a: Any, b: Any = None) -> None:
        self.a, self.b, self.__hidden = a, b, "h"

    def hidden(self) -> str:
        return self.__hidden

    def __eq__(self, other: object) -> bool:
        return type(other) is Slotted and (self.a, self.b) == (other.a, other.b)

    __hash__ = None  # type: ignore[assignment]


@REG.register
class Tag(str):
    pass


@REG.register
class Count(int):
    pass


@REG.register
class Ratio(float):
    pass


@REG.register
class AttrDict(dict[Any, Any]):
    pass


@REG.register
class Stack(list[Any]):
    pass


@REG.register
class Pair(NamedTuple):
    left: Any
    right: Any


class Money:
    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency

    def __eq__(self, other: object) -> bool:
        return type(other) is Money and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]


REG.register(
    Money, name="money.v1", encode=lambda m: [m.cents, m.currency], decode=lambda d: Money(*d)
)


# Never registered: instances must be refused at dump time.
@dataclasses.dataclass(frozen=True)
class Unregistered:
    x: int = 0


class UnregisteredTag(str):
    pass


def _make_plain(value: Any) -> Plain:
    obj = object.__new__(Plain)
    obj.value = value  # type: ignore[attr-defined]
    return obj


def _make_slotted(a: Any, b: Any) -> Slotted:
    return Slotted(a, b)


# -- exact comparison ------------------------------------------------------------------------


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def _label(key: Any) -> str:
    """A dict key for an assertion message (the repr of an int of 5,000 digits would raise)."""
    return f"<int of {key.bit_length()} bits>" if type(key) is int else repr(key)


def assert_same(a: Any, b: Any, path: str = "$") -> None:
    """Equal, with exactly the same types all the way down (NaN equals NaN, -0.0 is not 0.0)."""
    assert type(a) is type(b), f"{path}: {type(a)!r} != {type(b)!r}"
    cls = type(a)
    if isinstance(a, float) and not isinstance(a, np.generic):
        assert _same_float(a, b), f"{path}: {a!r} != {b!r}"
    elif cls is complex:
        assert _same_float(a.real, b.real), path
        assert _same_float(a.imag, b.imag), path
    elif cls is decimal.Decimal:
        assert str(a) == str(b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, np.ndarray):
        assert (a.dtype.str, a.dtype, a.shape) == (b.dtype.str, b.dtype, b.shape), path
        assert a.tobytes() == b.tobytes(), path
        assert b.flags.writeable, path
    elif isinstance(a, np.generic):
        assert (a.dtype, a.tobytes()) == (b.dtype, b.tobytes()), path
    elif isinstance(a, dict):
        assert len(a) == len(b), path
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_same(ka, kb, f"{path}.key")
            assert_same(va, vb, f"{path}[{_label(ka)}]")
        _same_attrs(a, b, path)
    elif isinstance(a, list | tuple | collections.deque):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
        if isinstance(a, collections.deque) and isinstance(b, collections.deque):
            assert a.maxlen == b.maxlen, path
        _same_attrs(a, b, path)
    elif isinstance(a, set | frozenset):
        assert a == b, path
        counterpart = {member: member for member in b}
        for member in a:
            assert_same(member, counterpart[member], f"{path}{{{member!r}}}")
    elif cls in (datetime.datetime, datetime.time):
        assert a == b, path
        assert a.replace(tzinfo=None) == b.replace(tzinfo=None), path
        assert a.fold == b.fold, path
        assert type(a.tzinfo) is type(b.tzinfo), path
        assert repr(a.tzinfo) == repr(b.tzinfo), path
    elif isinstance(a, enum.Enum):
        assert a is b, path
    elif isinstance(a, pydantic.BaseModel):
        assert_same(a.__dict__, b.__dict__, f"{path}.__dict__")
        assert_same(a.__pydantic_extra__, b.__pydantic_extra__, f"{path}.extra")
        assert_same(a.__pydantic_private__, b.__pydantic_private__, f"{path}.private")
        assert a.__pydantic_fields_set__ == b.__pydantic_fields_set__, path
    elif isinstance(a, msgspec.Struct):
        for name in cls.__struct_fields__:
            assert_same(getattr(a, name), getattr(b, name), f"{path}.{name}")
    elif dataclasses.is_dataclass(a) or cls in (Plain, Slotted):
        _same_attrs(a, b, path)
    elif cls is UnknownObject:
        assert a.type_name == b.type_name, path
        assert_same(a.fields, b.fields, f"{path}.fields")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _attrs(obj: Any) -> dict[str, Any]:
    state = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for slot in klass.__dict__.get("__slots__", ()):
            name = f"_{klass.__name__}{slot}" if slot.startswith("__") else slot
            if hasattr(obj, name):
                state[name] = getattr(obj, name)
    return state


def _same_attrs(a: Any, b: Any, path: str) -> None:
    attrs_a, attrs_b = _attrs(a), _attrs(b)
    assert attrs_a.keys() == attrs_b.keys(), path
    for name, value in attrs_a.items():
        assert_same(value, attrs_b[name], f"{path}.{name}")


def roundtrip(value: Any, serializer: MsgpackSerializer = SER) -> Any:
    out = serializer.loads(serializer.dumps(value))
    assert_same(value, out)
    return out


# -- strategies ------------------------------------------------------------------------------

fixed_offsets = st.builds(
    datetime.timezone,
    st.timedeltas(
        min_value=datetime.timedelta(hours=-23, minutes=-59),
        max_value=datetime.timedelta(hours=23, minutes=59),
    ),
)
named_offsets = st.builds(
    datetime.timezone,
    st.timedeltas(min_value=datetime.timedelta(hours=-5), max_value=datetime.timedelta(hours=5)),
    st.text(min_size=1, max_size=5),
)
zones = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"]).map(
    zoneinfo.ZoneInfo
)
tzinfos = st.none() | st.just(datetime.UTC) | fixed_offsets | named_offsets | zones

hashable_leaves = st.one_of(
    st.text(max_size=6),
    st.integers(),
    st.integers(min_value=-(2**130), max_value=2**130),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.binary(max_size=6),
    st.complex_numbers(allow_nan=False),
    st.datetimes(timezones=tzinfos, allow_imaginary=False),
    st.dates(),
    st.times(timezones=tzinfos),
    st.timedeltas(),
    st.uuids(),
    st.decimals(allow_nan=False),
    st.sampled_from([*Color, *Level, *Mode, Perm.R, Perm.R | Perm.W, Perm(0)]),
    st.builds(Point, st.integers(), st.integers()),
    st.builds(Tag, st.text(max_size=4)),
    st.builds(Count, st.integers()),
    st.builds(FrozenItem, st.text(max_size=4)),
)
hashables = st.recursive(
    hashable_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(inner, max_size=3),
        st.builds(Pair, inner, inner),
    ),
    max_leaves=5,
)

numpy_dtypes = st.one_of(
    npst.scalar_dtypes(),
    npst.scalar_dtypes().map(lambda d: d.newbyteorder(">")),
    npst.byte_string_dtypes(max_len=4),
    npst.unicode_string_dtypes(max_len=4),
)
numpy_arrays = npst.arrays(
    numpy_dtypes, npst.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
)
numpy_values = st.one_of(
    numpy_arrays,
    numpy_arrays.filter(lambda a: a.ndim > 0).map(lambda a: a[::-1]),  # non-contiguous views
    npst.arrays(npst.scalar_dtypes(), ()).map(lambda a: a[()]),  # numpy scalars
)

leaves = st.one_of(
    hashable_leaves,
    st.floats(),  # NaN included
    st.decimals(),  # NaN and sNaN included
    st.binary(max_size=6).map(bytearray),
    st.builds(Ratio, st.floats()),
    numpy_values,
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
        st.dictionaries(hashables, inner, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
        st.builds(collections.deque, st.lists(inner, max_size=4), st.none() | st.integers(0, 4)),
        st.dictionaries(hashables, inner, max_size=3).map(collections.OrderedDict),
        st.dictionaries(hashables, inner, max_size=3).map(collections.Counter),
        st.dictionaries(hashables, inner, max_size=3).map(AttrDict),
        st.lists(inner, max_size=3).map(Stack),
        st.builds(Box, inner, inner),
        st.builds(Frozen, st.text(max_size=4), st.lists(st.text(max_size=2)).map(tuple)),
        st.builds(Item, st.text(max_size=4), st.integers(), inner),
        st.builds(
            Outer,
            name=st.text(max_size=4),
            inner=st.builds(Inner, label=st.text(max_size=3)),
            anything=inner,
        ),
        st.builds(_make_plain, inner),
        st.builds(_make_slotted, inner, inner),
        st.builds(Money, st.integers(), st.text(max_size=3)),
    )


values = st.recursive(leaves, _containers, max_leaves=10)

# Default example counts; no deadline, because the first ZoneInfo or numpy dtype an example
# touches is slow to load and a timing failure there would only be noise.
FAST = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


# -- round trips -------------------------------------------------------------------------------


@FAST
@given(values)
@pytest.mark.slow
def test_roundtrip_keeps_exact_types(value: Any) -> None:
    roundtrip(value)


@FAST
@given(values)
@pytest.mark.slow
def test_slow_path_writes_the_same_bytes_as_the_fast_path(value: Any) -> None:
    # Content addressing relies on one value having one encoding, whichever path wrote it.
    assert SER._dumps_slowly(value) == SER.dumps(value)


def _stable_repr(value: Any) -> str:
    """A test id that is the same in every process: a set's repr follows string hashing,
    which is randomised per process, and pytest-xdist's workers must collect identical ids."""
    if isinstance(value, set | frozenset):
        items = ", ".join(sorted(_stable_repr(item) for item in value))
        return f"{type(value).__name__}({{{items}}})"
    return repr(value)


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,  # the largest native msgpack int
        2**64,
        -(2**63) - 1,
        -(2**64) - 1,
        -(10**100),
        10**100,
        True,
        False,
        -0.0,
        float("inf"),
        float("nan"),
        "",
        "naïve ✓ łódź",
        "lone \udc80 surrogate",
        b"",
        b"\x00\xc4\xff",
        bytearray(b"\xc4"),
        [bytearray(b"nested"), {"deep": [bytearray()]}],
        memoryview(b"x").tobytes(),
        (),
        (1, (2, (3,))),
        [(), [()], {"t": ()}],
        {},
        {"a": {"b": {"c": []}}},
        {1: "int", 1.5: "float", None: "none", (1, 2): "tuple", frozenset({1}): "frozenset"},
        {True: "bool stays bool", 2: "int"},
        {"s": "mixed", 3: "keys"},
        {uuid.UUID(int=7): 1, Color.RED: 2, Level.HIGH: 3, datetime.date(2024, 1, 1): 4},
        {Tag("x"): Tag("y")},
        set(),
        {1, "a", (2, 3), None},
        frozenset({frozenset({1}), 2.5}),
        1 + 2j,
        complex(float("nan"), -0.0),
        collections.OrderedDict([(2, "b"), ("a", 1)]),
        collections.Counter("mississippi"),
        collections.deque([1, 2, 3], maxlen=5),
        collections.deque(),
        decimal.Decimal("NaN"),
        decimal.Decimal("-sNaN12"),
        decimal.Decimal("Infinity"),
        decimal.Decimal("-0"),
        decimal.Decimal("1.000"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        datetime.timedelta(days=-3, microseconds=7),
        datetime.date(1, 1, 1),
        datetime.time(23, 59, 59, 999999, fold=1),
        datetime.datetime(2024, 3, 31, 2, 30),
        datetime.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")),
        datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        datetime.datetime(
            2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30), "IST")
        ),
        datetime.datetime(
            2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(microseconds=-1))
        ),
        datetime.time(12, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo")),
        Color.GREEN,
        Level.LOW,
        Mode.WRITE,
        Perm.R | Perm.X,
        Perm(0),
    ],
    ids=_stable_repr,
)
def test_roundtrip_examples(value: Any) -> None:
    roundtrip(value)


def test_dataclasses_are_rebuilt_without_init() -> None:
    frozen = Frozen("abc", ("x",))
    assert frozen.derived == 3
    out = roundtrip(frozen)
    assert out.derived == 3
    box = Box([1], {"p": Point(1, 2)})
    box.extra = "set after __init__"  # type: ignore[attr-defined]
    calls = Box.post_inits
    out = roundtrip(box)
    assert Box.post_inits == calls, "__post_init__ ran on load"
    assert out.extra == "set after __init__"


def test_unset_init_false_field_stays_unset() -> None:
    @dataclasses.dataclass
    class Lazy:
        a: int
        later: int = dataclasses.field(init=False)

    registry = TypeRegistry()
    registry.register(Lazy)
    out = roundtrip(Lazy(1), MsgpackSerializer(registry))
    assert not hasattr(out, "later")


def test_pydantic_models_are_not_revalidated() -> None:
    model = Outer(
        name="abc",
        inner=Inner(label="i"),
        items=[Inner(label="j", weight=2)],
        extra_field=[1],  # type: ignore[call-arg]
    )
    assert model.name == "ABC"
    model._secret = "changed"
    out = roundtrip(model)
    assert out.extra_field == [1]
    assert out._secret == "changed"
    assert out.model_fields_set == model.model_fields_set
    raw = Outer.model_construct(name="lower", inner=Inner(label="x"))
    assert roundtrip(raw).name == "lower", "the validator ran on load"


def test_msgspec_struct() -> None:
    roundtrip(Item("a", 3, extra=(1, {2: Item("b")})))
    roundtrip({FrozenItem("k"): [FrozenItem("v")]})
    roundtrip(Item("unset", extra=msgspec.UNSET))


def test_plain_and_slotted_classes() -> None:
    out = roundtrip(_make_plain({"k": (1, 2)}))
    assert out.value == {"k": (1, 2)}
    slotted = Slotted([1], b=Slotted(2))
    out = roundtrip(slotted)
    assert out.hidden() == "h"
    assert out.b.hidden() == "h"


def test_registered_builtin_subclasses_and_namedtuples() -> None:
    tag = Tag("t")
    tag.note = "attribute on a str subclass"  # type: ignore[attr-defined]
    out = roundtrip(tag)
    assert out.note == tag.note  # type: ignore[attr-defined]
    roundtrip([Count(3), Ratio(float("nan")), AttrDict({1: Stack([2])}), Pair(1, (2,))])


def test_custom_encode_decode() -> None:
    out = roundtrip({"price": Money(199, "EUR")})
    assert out["price"].currency == "EUR"
    assert REG.name_of(Money) == "money.v1"


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],  # non-contiguous
        np.arange(6, dtype=">f8").reshape(2, 3).T,  # big-endian and Fortran-ordered
        np.array(5, dtype=np.uint16),  # 0-d
        np.zeros((0, 3), dtype=np.complex64),
        np.array([b"ab", b""], dtype="S2"),
        np.array(["ü", "xyz"]),
        np.array(["2024-01-01", "NaT"], dtype="datetime64[ms]"),
        np.array([(1, 2.5)], dtype=[("a", "<i4"), ("b", ">f8", (2,))]),
        np.array([np.nan, -0.0, np.inf]),
        np.ones((2, 2), dtype=bool),
    ],
    ids=lambda a: f"{a.dtype}-{a.shape}",
)
def test_numpy_arrays(array: np.ndarray) -> None:
    out = roundtrip(array)
    out[...] = out  # writable


def test_numpy_scalars() -> None:
    scalars = [np.float64(1.5), np.float32(np.nan), np.int8(-3), np.bool_(True), np.str_("s")]
    scalars += [np.bytes_(b"b"), np.datetime64("2024-01-01"), np.uint64(2**64 - 1)]
    for scalar in scalars:
        roundtrip(scalar)


def test_dict_key_order_is_kept() -> None:
    assert list(roundtrip({3: 0, 1: 0, 2: 0})) == [3, 1, 2]
    assert list(roundtrip({"b": 0, "a": 0})) == ["b", "a"]


def test_sets_encode_deterministically() -> None:
    words = {f"w{i}" for i in range(50)}
    reordered: set[str] = set()
    for word in sorted(words, reverse=True):  # same members, inserted in another order
        reordered.add(word)
    assert SER.dumps(words) == SER.dumps(reordered)


def test_shared_references_are_fine_but_cycles_are_refused() -> None:
    shared = [1]
    roundtrip({"a": shared, "b": shared, "k": {1: shared}})
    loop: list[Any] = []
    loop.append({"me": loop})
    with pytest.raises(SerializationError) as info:
        SER.dumps(loop)
    assert info.value.path == "[0].me"
    assert "cycle" in info.value.reason


# -- errors at dump time -----------------------------------------------------------------------


def _sock() -> socket.socket:
    sock = socket.socket()
    sock.close()
    return sock


class CustomTz(datetime.tzinfo):
    def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(0)

    def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(0)

    def tzname(self, dt: datetime.datetime | None) -> str:
        return "custom"


UNREG = f"{Unregistered.__module__}.Unregistered"


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        ([{"a": 1}, {"tool": object()}], "[1].tool", "object"),
        ({"x": (1, 2, lambda: 0)}, ".x[2]", "function"),
        (Box(a=[1, {"sock": _sock()}]), ".a[1].sock", "socket.socket"),
        ({"gen": (i for i in range(0))}, ".gen", "generator"),
        ({"not an identifier": [Unregistered()]}, "['not an identifier'][0]", UNREG),
        ({"arr": np.array([1, None], dtype=object)}, ".arr", "numpy.ndarray"),
        ({1: {2: object()}}, "[1][2]", "object"),
        ({"s": {Unregistered(1)}}, ".s{0}", UNREG),
        ({"k": {Unregistered(): 1}}, ".k.keys()[0]", UNREG),
        ({"t": UnregisteredTag("x")}, ".t", f"{Unregistered.__module__}.UnregisteredTag"),
        (Item("a", extra=[memoryview(b"")]), ".extra[0]", "memoryview"),
        (
            Outer(name="n", inner=Inner(label="l"), anything={"f": print}),
            ".anything.f",
            "builtin_function_or_method",
        ),
        (
            {"when": datetime.datetime(2024, 1, 1, tzinfo=CustomTz())},
            ".when",
            f"{CustomTz.__module__}.CustomTz",
        ),
        (threading.Lock(), "", "_thread.lock"),
        (UnknownObject("x.Y", {}), "", "pitstop.serde.base.UnknownObject"),
    ],
)
def test_unserialisable_values_name_their_path(value: Any, path: str, type_name: str) -> None:
    with pytest.raises(SerializationError) as info:
        SER.dumps(value)
    assert (info.value.path, info.value.type_name) == (path, type_name)
    assert not isinstance(info.value, UnregisteredTypeError)


def test_unregistered_class_error_says_how_to_register() -> None:
    with pytest.raises(SerializationError, match=r"register it with pitstop\.register\(") as info:
        SER.dumps({"point": Unregistered()})
    assert f"dataclass {UNREG} is not registered" in str(info.value)
    assert "at .point" in str(info.value)


def test_located_error_can_be_prefixed_by_the_store() -> None:
    with pytest.raises(SerializationError) as info:
        SER.dumps([object()])
    located = info.value.located(path="state.tools" + (info.value.path or ""))
    assert located.path == "state.tools[0]"
    assert located.type_name == "object"


def test_failing_custom_encoder_is_located_and_chained() -> None:
    registry = TypeRegistry()

    class Broken:
        pass

    def explode(obj: Broken) -> object:
        raise RuntimeError("boom")

    registry.register(Broken, encode=explode, decode=lambda data: Broken())
    with pytest.raises(SerializationError, match="RuntimeError: boom") as info:
        MsgpackSerializer(registry).dumps({"b": [Broken()]})
    assert info.value.path == ".b[0]"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_keyboard_interrupt_is_not_turned_into_an_error() -> None:
    registry = TypeRegistry()

    class Slow:
        pass

    def interrupt(obj: Slow) -> object:
        raise KeyboardInterrupt

    registry.register(Slow, encode=interrupt, decode=lambda data: Slow())
    with pytest.raises(KeyboardInterrupt):
        MsgpackSerializer(registry).dumps([Slow()])


def test_fast_path_does_not_walk_plain_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_walk(*args: object) -> object:
        raise AssertionError("the slow path ran")

    monkeypatch.setattr(MsgpackSerializer, "_dumps_slowly", no_walk)
    monkeypatch.setattr(codec._Decoder, "locate", no_walk)
    state = {
        "messages": [{"role": "user", "content": "hé łódź", "score": 0.1 * i} for i in range(50)],
        "meta": {
            "ids": [uuid.UUID(int=i) for i in range(3)],
            "when": datetime.datetime(2024, 1, 1),
        },
        "pair": (1, 2.0),
        "blob": b"\xc4\xc5",
    }
    roundtrip(state)
    with pytest.raises(AssertionError, match="slow path"):
        SER.dumps({1: "non-str keys need the slow path"})
    with pytest.raises(AssertionError, match="slow path"):
        SER.dumps([bytearray(b"so do nested bytearrays")])


# -- the allowlist at load time ----------------------------------------------------------------


def _ext(code: int, payload: object) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, ormsgpack.packb(payload))


CRAFTED = [
    pytest.param(ExtCode.OBJECT, ["os.system", {"command": "echo pwned"}], id="object"),
    pytest.param(ExtCode.CUSTOM, ["subprocess.Popen", ["echo", "pwned"]], id="custom"),
    pytest.param(ExtCode.ENUM, ["this.Zen", "BEAUTIFUL"], id="enum"),
    pytest.param(ExtCode.STRUCT, ["this.Struct", {"a": 1}, []], id="struct"),
    pytest.param(ExtCode.PYDANTIC, ["this.Model", {"a": 1}, None, ["a"], None], id="pydantic"),
    pytest.param(ExtCode.BUILTIN_SUBCLASS, ["os.PathLike", "x", {}], id="builtin-subclass"),
]


@pytest.fixture
def no_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    calls: list[object] = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append(("system", a)))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: calls.append(("Popen", a)))
    modules_before = set(sys.modules)
    yield calls
    assert calls == []
    imported = {m for m in set(sys.modules) - modules_before if not m.startswith("_pytest")}
    assert not imported, "loading imported a module"


@pytest.mark.parametrize(("code", "payload"), CRAFTED)
def test_crafted_blob_is_refused_in_strict_mode(
    code: int, payload: list[Any], no_calls: list[object]
) -> None:
    assert "this" not in sys.modules  # importing it would print the Zen of Python
    blob = ormsgpack.packb({"state": [1, _ext(code, payload)]})
    with pytest.raises(UnregisteredTypeError) as info:
        SER.loads(blob)
    assert info.value.type_name == payload[0]
    assert info.value.path == ".state[1]"
    assert "this" not in sys.modules


@pytest.mark.parametrize(("code", "payload"), CRAFTED)
def test_crafted_blob_is_inert_in_lenient_mode(
    code: int, payload: list[Any], no_calls: list[object]
) -> None:
    out = SER.loads(ormsgpack.packb([_ext(code, payload)]), strict=False)
    assert isinstance(out, list)
    assert isinstance(out[0], UnknownObject)
    assert out[0].type_name == payload[0]
    assert "this" not in sys.modules


def test_unregistered_classes_load_as_unknown_objects() -> None:
    registry = TypeRegistry()

    @registry.register(name="app.Doc")
    @dataclasses.dataclass(frozen=True)
    class Note:
        title: str
        key: Any = None

    blob = MsgpackSerializer(registry).dumps({Note("k"): [Note("t", key=(1, Note("inner")))]})
    with pytest.raises(UnregisteredTypeError, match=r"app\.Doc") as info:
        SER.loads(blob)
    assert info.value.path == ".keys()[0]"
    out = SER.loads(blob, strict=False)
    assert isinstance(out, dict)
    (key, value), *_ = out.items()
    assert key == UnknownObject("app.Doc", {"title": "k", "key": None})
    assert value[0].fields["key"] == (1, UnknownObject("app.Doc", {"title": "inner", "key": None}))
    assert repr(key) == "UnknownObject('app.Doc', {'title': 'k', 'key': None})"
    with pytest.raises(AttributeError):
        key.type_name = "other"
    with pytest.raises(SerializationError, match="read-only stand-in"):
        SER.dumps(out)


def test_class_stored_as_one_kind_but_registered_as_another_is_refused() -> None:
    blob = ormsgpack.packb(_ext(ExtCode.OBJECT, [REG.name_of(Item), {"sku": "x"}]))
    with pytest.raises(
        SerializationError, match="stored as object but is now registered as struct"
    ):
        SER.loads(blob)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\xc1",
        b"\x92\x01",
        ormsgpack.packb(_ext(99, [])),  # an unknown extension code
        ormsgpack.packb([_ext(ExtCode.DATETIME, [2024, 13, 1, 0, 0, 0, 0, 0, None])]),
        ormsgpack.packb(_ext(ExtCode.TUPLE, {"not": "a list"})),
        ormsgpack.packb(_ext(ExtCode.DICT, [[1, 2], [3]])),
        ormsgpack.packb(_ext(ExtCode.DICT, [[[1]], [3]])),  # unhashable key
        ormsgpack.packb(_ext(ExtCode.NDARRAY, ["|O", [1], b"\x00" * 8])),  # object dtype
        ormsgpack.packb(_ext(ExtCode.NDARRAY, ["<f8", [2], b"\x00" * 8])),  # wrong size
        ormsgpack.packb(_ext(ExtCode.DATETIME, [2024, 1, 1, 0, 0, 0, 0, 0, "../../etc/passwd"])),
        ormsgpack.packb(_ext(ExtCode.ENUM, [REG.name_of(Color), "PURPLE"])),
        ormsgpack.packb(_ext(ExtCode.OBJECT, [REG.name_of(Slotted), {"__class__": 1}])),
    ],
)
def test_malformed_blobs_raise_serialization_error(blob: bytes) -> None:
    with pytest.raises(SerializationError):
        SER.loads(blob)


@pytest.mark.parametrize(
    "value", [{"a": 1}, [1, (2, 3)], (1,), "text", 7, Box(1, 2)], ids=repr
)
@pytest.mark.parametrize("extra", [b"\x00", b"\xc0", b"junk bytes", b"\x91\x01"])
def test_bytes_after_the_value_are_refused(value: Any, extra: bytes) -> None:
    """A value is exactly one msgpack object: anything after it means an altered record,
    never data to ignore (the store reports it as corruption)."""
    blob = SER.dumps(value)
    with pytest.raises(SerializationError, match="trailing characters") as info:
        SER.loads(blob + extra)
    assert info.value.action == "load"
    with pytest.raises(SerializationError, match="trailing characters"):
        SER.loads(blob + extra, strict=False)


def test_bytes_after_a_nested_extension_payload_are_refused() -> None:
    inner = ormsgpack.packb([1, 2]) + b"\x00"
    with pytest.raises(SerializationError, match="trailing characters") as info:
        SER.loads(ormsgpack.packb({"t": ormsgpack.Ext(ExtCode.TUPLE, inner)}))
    assert info.value.path == ".t"


def test_unknown_extension_code_is_kept_in_lenient_mode() -> None:
    out = SER.loads(ormsgpack.packb([_ext(99, [1])]), strict=False)
    assert out == [UnknownObject("pitstop.ext.99", {"data": ormsgpack.packb([1])})]


@FAST
@given(st.data())
def test_corrupted_blobs_never_raise_anything_else(data: st.DataObject) -> None:
    blob = bytearray(SER.dumps(data.draw(values)))
    for _ in range(data.draw(st.integers(1, 3))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(SerializationError):
        SER.loads(bytes(blob), strict=data.draw(st.booleans()))


# -- extremes: whatever saves must load ----------------------------------------------------------


def _nest(depth: int, wrap: Callable[[Any], Any]) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = wrap(value)
    return value


NESTINGS: dict[str, Callable[[Any], Any]] = {
    "tuple": lambda v: (v,),
    "frozenset": lambda v: frozenset([v]),
    "deque": lambda v: collections.deque([v]),
    "dataclass": Box,
    "tuple-in-list": lambda v: [(v,)],
    "int-keyed dict": lambda v: {1: v},
}


@pytest.mark.parametrize("kind", NESTINGS)
def test_nesting_saves_only_as_deep_as_it_loads(kind: str) -> None:
    """Every extension level costs stack when decoding: past ``MAX_DEPTH`` a value is refused
    at save time, and up to it a save always loads again, even from a deep call stack."""
    wrap = NESTINGS[kind]
    deepest = None
    for depth in (codec.MAX_DEPTH - 1, codec.MAX_DEPTH, codec.MAX_DEPTH + 1, 700, 5000):
        value = _nest(depth, wrap)
        try:
            blob = SER.dumps(value)
        except SerializationError as exc:
            message = str(exc)
            if "nested too deeply" not in message:
                raise
            continue
        deepest = depth

        def load_from(frames: int, blob: bytes = blob) -> Any:
            return load_from(frames - 1) if frames else SER.loads(blob)

        assert SER.dumps(load_from(150)) == blob
    # (The slow path, which dicts with non-str keys take, runs out of stack sooner: still
    # refused at save, never written.)
    assert deepest is None or deepest <= codec.MAX_DEPTH
    if kind == "tuple":
        assert deepest == codec.MAX_DEPTH


def test_deeply_nested_blob_is_refused_on_load_not_crashing() -> None:
    blob = ormsgpack.packb(1)
    for _ in range(3000):  # a crafted value: tuples in tuples, far deeper than any save
        blob = ormsgpack.packb(ormsgpack.Ext(ExtCode.TUPLE, b"\x91" + blob))
    with pytest.raises(SerializationError, match="nested too deeply") as info:
        SER.loads(blob)
    assert info.value.action == "load"


def test_huge_ints_round_trip_and_display() -> None:
    for value in (10**4301, -(10**5000) - 7, 2**70000, {10**4400: [10**4400]}):
        roundtrip(value)
        json.dumps(to_jsonable(value))  # shown by size, never a ValueError
    shown = to_jsonable([10**5000, 10**5000 + 1])
    assert isinstance(shown, list) and shown[0] != shown[1]  # a diff tells them apart
    assert "5,001 digits" in shown[0]


def test_numpy_scalars_of_zero_itemsize_round_trip() -> None:
    for value in (np.str_(""), np.bytes_(b""), np.void(b"")):
        roundtrip(value)


_EXTREME_OFFSETS = st.sampled_from(
    [datetime.timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
     -datetime.timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
     datetime.timedelta(0), datetime.timedelta(microseconds=1)]
).map(datetime.timezone)
extreme_leaves = st.one_of(
    # (Built by map: the repr of a strategy holding an int of 5,000 digits would raise.)
    st.builds(lambda bits, offset, sign: sign * (2**bits + offset),
              st.integers(0, 25_000), st.integers(-1000, 1000), st.sampled_from([1, -1])),
    st.sampled_from([4299, 4300, 4301, 6000]).map(lambda digits: 10**digits),
    st.sampled_from([2**64, 2**64 - 1, -(2**63), -(2**63) - 1]),
    st.floats(),
    st.sampled_from([5e-324, -5e-324, sys.float_info.max, -0.0, math.inf, -math.inf]),
    st.decimals(),
    st.sampled_from([decimal.Decimal("9.999E+999999999"), decimal.Decimal("-1E-999999999"),
                     decimal.Decimal("-sNaN123456789")]),
    st.just(5000).map(lambda digits: decimal.Decimal(10**digits)),
    st.datetimes(timezones=st.none() | _EXTREME_OFFSETS | tzinfos, allow_imaginary=False),
    st.sampled_from([datetime.datetime.min, datetime.datetime.max, datetime.date.min,
                     datetime.date.max, datetime.time.max, datetime.timedelta.max,
                     datetime.timedelta.min]),
    st.timedeltas(),
    st.text(st.characters(codec=None), max_size=40),  # lone surrogates included
    st.binary(max_size=70_000),
    st.complex_numbers(),
    st.uuids(),
    st.sampled_from([np.str_(""), np.bytes_(b""), np.void(b""), np.datetime64("NaT"),
                     np.longdouble(1) / 3, np.float16(-0.0)]),
    numpy_values,
    st.builds(lambda d: _nest(d, lambda v: (v,)), st.integers(0, codec.MAX_DEPTH + 5)),
    st.builds(lambda d: _nest(d, Box), st.integers(0, codec.MAX_DEPTH + 5)),
)
extremes = st.recursive(extreme_leaves, _containers, max_leaves=6)


@FAST
@given(extremes)
@pytest.mark.slow
def test_extreme_values_round_trip_or_are_refused_at_save(value: Any) -> None:
    """A value either saves and then loads back the same, or is refused at save time with a
    SerializationError: never a checkpoint that cannot be loaded again."""
    try:
        blob = SER.dumps(value)
    except SerializationError:
        return
    assert_same(value, SER.loads(blob))
    assert_same(value, SER.loads(unframe(frame(blob, 0, compress_threshold=64))[1]))
    json.dumps(to_jsonable(value), allow_nan=False)


# -- the registry ------------------------------------------------------------------------------


def test_register_forms_and_names() -> None:
    registry = TypeRegistry()

    @registry.register
    @dataclasses.dataclass
    class A:
        pass

    @registry.register(name="b.v1")
    class B:
        pass

    class C:
        pass

    assert registry.register(cls=C) is C
    assert registry.name_of(A) == f"{A.__module__}.{A.__qualname__}"
    assert registry.name_of(B) == "b.v1"
    registration = registry.lookup("b.v1")
    assert registration is not None
    assert registration.cls is B
    registry.register(C)  # again, identically: harmless
    assert C in registry
    assert len(registry) == 3


def test_register_refuses_conflicts_and_unsupported_classes() -> None:
    registry = TypeRegistry()

    class A:
        pass

    class B:
        pass

    registry.register(A, name="same")
    with pytest.raises(ValueError, match="already belongs"):
        registry.register(B, name="same")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(A, name="other")
    with pytest.raises(ValueError, match="both encode= and decode="):
        registry.register(B, encode=lambda b: 1)
    with pytest.raises(ValueError, match="without registration"):
        registry.register(datetime.datetime)

    class Defaults(collections.defaultdict[str, int]):
        pass

    with pytest.raises(TypeError, match="encode= and decode="):
        registry.register(Defaults)
    with pytest.raises(TypeError, match="takes a class"):
        registry.register(len)  # type: ignore[call-overload]


def test_default_registry_is_what_register_adds_to() -> None:
    assert register == default_registry.register
    assert MsgpackSerializer().registry is default_registry


class Nested(enum.Enum):
    A = "a"


@dataclasses.dataclass
class Leaf:
    kind: Nested


class Doc(pydantic.BaseModel):
    leaves: list[Optional[Leaf]] = []  # noqa: UP045 - Optional is what is being tested


class Marker:
    """Annotated metadata: not a type of the state, must not be registered."""


class Row(msgspec.Struct):
    docs: dict[str, Annotated[Doc, Marker]]


class Config(TypedDict):
    row: Row | None
    pairs: tuple[Pair, ...]
    unresolved: NoSuchType  # type: ignore[name-defined]  # noqa: F821


@dataclasses.dataclass
class State:
    config: Config
    cycle: Optional[State] = None  # noqa: UP045


def test_register_annotations_walks_the_state_type() -> None:
    registry = TypeRegistry()
    added = registry.register_annotations(State)
    assert set(added) == {State, Row, Doc, Leaf, Nested, Pair}
    assert Marker not in registry
    assert Config not in registry
    assert registry.register_annotations(State) == []
    state = State(
        {"row": Row({"d": Doc(leaves=[Leaf(Nested.A), None])}), "pairs": (), "unresolved": 1}
    )
    roundtrip(state, MsgpackSerializer(registry))


def test_native_types_match_the_codec_table() -> None:
    natively_packed = {str, bytes, int, float, bool, type(None), list, dict}
    assert set(exttypes.NATIVE_ENCODERS) | natively_packed == NATIVE_TYPES


def test_ext_codes_are_pinned() -> None:
    # Codes are the on-disk format: this list may only ever grow.
    assert {c.name: c.value for c in ExtCode} == {
        "BIG_INT": 1, "SURROGATE_STR": 2, "BYTEARRAY": 3, "COMPLEX": 4, "TUPLE": 5, "SET": 6,
        "FROZENSET": 7, "DICT": 8, "ORDERED_DICT": 9, "COUNTER": 10, "DEQUE": 11,
        "DATETIME": 16, "DATE": 17, "TIME": 18, "TIMEDELTA": 19, "UUID": 20, "DECIMAL": 21,
        "ENUM": 32, "OBJECT": 33, "PYDANTIC": 34, "STRUCT": 35, "CUSTOM": 36,
        "BUILTIN_SUBCLASS": 37, "NDARRAY": 48, "NUMPY_SCALAR": 49, "TENSOR": 64, "BUFFER": 80,
    }  # fmt: skip


def test_serializers_satisfy_the_protocol() -> None:
    assert isinstance(SER, Serializer)
    assert isinstance(PickleSerializer(), Serializer)
    assert (SER.format_id, SER.name) == (0, "msgpack")
    assert (PickleSerializer.format_id, PickleSerializer.name) == (1, "pickle")


# -- wire format stability -----------------------------------------------------------------------

PINNED_VALUE = {
    "int": [1, -1, 2**70, -(2**70)],
    "text": ["a", "\udc80"],
    "bytes": [b"\x00", bytearray(b"\x01")],
    "floats": [1.5, 1j],
    "containers": [(1,), {3, 1, 2}, frozenset({"b", "a"}), {1: "x"}],
    "collections": [
        collections.OrderedDict(a=1),
        collections.Counter("aab"),
        collections.deque([1], 2),
    ],
    "time": [
        datetime.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
        datetime.datetime(2024, 5, 6, tzinfo=datetime.timezone(datetime.timedelta(hours=-2), "X")),
        datetime.date(2024, 5, 6),
        datetime.time(1, 2, 3, tzinfo=datetime.UTC),
        datetime.timedelta(1, 2, 3),
    ],
    "misc": [uuid.UUID(int=1), decimal.Decimal("-1.50")],
    "classes": [Color.RED, Perm.R | Perm.W, Point(1, 2), Item("s"), Money(1, "EUR"), Tag("t")],
    "numpy": [np.arange(3, dtype=">i2"), np.float32(0.5)],
}
PINNED_DIGEST = "3d464c6baeba1bd563bfb32f0e31d7b090b055aad2f5244f984e58d76784dc94"


def test_wire_format_is_stable() -> None:
    raw = SER.dumps(PINNED_VALUE)
    roundtrip(PINNED_VALUE)
    assert digest(0, raw).hex() == PINNED_DIGEST, "the wire format changed: old blobs may break"


# -- framing -----------------------------------------------------------------------------------


def test_small_values_are_not_compressed() -> None:
    raw = b"x" * 100
    stored = frame(raw, 0)
    assert stored == b"\x00" + raw
    assert unframe(stored) == (0, raw)


def test_large_compressible_values_are_compressed() -> None:
    raw = b"abc" * 10_000
    stored = frame(raw, 1)
    assert stored[0] == 0x11
    assert len(stored) < len(raw) // 10
    assert unframe(stored) == (1, raw)
    assert frame(raw, 1, compress_threshold=None) == b"\x01" + raw
    assert frame(raw, 1, compress_threshold=len(raw) + 1)[0] == 0x01
    assert frame(raw, 1, level=19)[0] == 0x11


def test_incompressible_values_are_stored_raw() -> None:
    raw = os.urandom(10_000)
    assert frame(raw, 0) == b"\x00" + raw


@pytest.mark.parametrize(
    "mangle",
    [
        lambda s: b"",
        lambda s: s[:-5],  # truncated
        lambda s: s[:20] + bytes([s[20] ^ 0xFF]) + s[21:],  # corrupted
        lambda s: s + b"junk",  # trailing data
        lambda s: bytes([0x40]) + s[1:],  # unknown header flag
        lambda s: bytes([0x10]) + b"not zstd at all",
    ],
)
def test_bad_stored_blobs_raise_value_error(mangle: Callable[[bytes], bytes]) -> None:
    stored = frame(b"0123456789" * 1000 + os.urandom(100), 0)
    assert stored[0] == 0x10
    with pytest.raises(ValueError, match=r"blob"):
        unframe(mangle(stored))


def test_format_id_must_fit_the_header() -> None:
    with pytest.raises(ValueError, match="format_id"):
        frame(b"", 16)
    with pytest.raises(ValueError, match="format_id"):
        digest(-1, b"")


def test_digest_is_stable_and_independent_of_compression() -> None:
    assert digest(0, b"hello").hex() == (
        "8a2a5c9b768827de5a9552c38a044c66959c68f6d2f21b5260af54d2f87db827"
    )
    assert digest(0, b"hello") == hashlib.sha256(b"\x00hello").digest()
    assert digest(1, b"hello") != digest(0, b"hello")
    raw = b"z" * 10_000
    format_id, restored = unframe(frame(raw, 0))
    assert digest(format_id, restored) == digest(0, raw)


def test_framing_is_thread_safe() -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(50):
                raw = bytes([seed]) * (5000 + i)
                assert unframe(frame(raw, seed % 16)) == (seed % 16, raw)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# -- pickle opt-in -----------------------------------------------------------------------------


class Arbitrary:
    def __init__(self) -> None:
        self.data = {1: (Unregistered(), {1, 2})}


def test_pickle_serializer_round_trips_anything_importable() -> None:
    serializer = PickleSerializer()
    out = serializer.loads(serializer.dumps(Arbitrary()))
    assert type(out) is Arbitrary
    assert out.data == {1: (Unregistered(), {1, 2})}
    assert "RUNS CODE" in (PickleSerializer.__doc__ or "")
    with pytest.raises(SerializationError):
        serializer.dumps(lambda: 0)
    with pytest.raises(SerializationError):
        serializer.loads(b"not a pickle")
    assert PickleSerializer(protocol=4).dumps(1) == pickle.dumps(1, protocol=4)


# -- display -----------------------------------------------------------------------------------


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@FAST
@given(values)
@pytest.mark.slow
def test_to_jsonable_is_always_json(value: Any) -> None:
    json.dumps(to_jsonable(value), allow_nan=False)


def test_to_jsonable_examples() -> None:
    loop: list[Any] = []
    loop.append(loop)
    view = to_jsonable(
        {
            "when": datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.UTC),
            "day": datetime.date(2024, 1, 2),
            "wait": datetime.timedelta(minutes=1, milliseconds=500),
            "id": uuid.UUID(int=1),
            "amount": decimal.Decimal("1.10"),
            "blob": bytes(range(40)),
            "tags": {"b", "a"},
            "mixed": {2, "x"},
            "pair": (1, collections.deque([2])),
            "color": Color.RED,
            "keys": {1: "one", None: "none"},
            "point": Point(1, 2),
            "model": Inner(label="l"),
            "item": Item("s"),
            "unknown": UnknownObject("x.Y", {"a": 1}),
            "array": np.arange(20.0).reshape(4, 5),
            "scalar": np.int64(3),
            "nan": float("nan"),
            "bad": BadRepr(),
            "fn": len,
            "loop": loop,
        }
    )
    assert view == {
        "when": "2024-01-02T03:04:00+00:00",
        "day": "2024-01-02",
        "wait": 60.5,
        "id": "00000000-0000-0000-0000-000000000001",
        "amount": "1.10",
        "blob": {"$bytes": 40, "preview": bytes(range(32)).hex()},
        "tags": ["a", "b"],
        "mixed": ["x", 2],  # not orderable: sorted by JSON text
        "pair": [1, [2]],
        "color": "Color.RED",
        "keys": {"1": "one", "None": "none"},
        "point": {"$type": f"{Point.__module__}.Point", "x": 1, "y": 2},
        "model": {"$type": f"{Inner.__module__}.Inner", "label": "l", "weight": 1.0},
        "item": {"$type": f"{Item.__module__}.Item", "sku": "s", "qty": 1, "extra": None},
        "unknown": {"$type": "x.Y", "a": 1},
        "array": {
            "$ndarray": "<f8",
            "shape": [4, 5],
            "preview": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        },
        "scalar": 3,
        "nan": "NaN",
        "bad": f"<{BadRepr.__module__}.BadRepr (repr failed)>",
        "fn": "<built-in function len>",
        "loop": ["<cycle>"],
    }
    json.dumps(view, allow_nan=False)


def test_large_incompressible_values_skip_compression_by_a_sample() -> None:
    from pitstop.serde.framing import SAMPLE_FROM, compressible

    floats = np.random.default_rng(0).standard_normal(SAMPLE_FROM // 2, dtype=np.float32)
    assert not compressible(floats.tobytes())  # shrinks ~8%: not worth zstd's time
    assert frame(floats.tobytes(), 0)[0] == 0x00
    zeros_and_noise = np.zeros(SAMPLE_FROM, dtype=np.float32)
    zeros_and_noise[::97] = 1.5
    assert frame(zeros_and_noise.tobytes(), 0)[0] == 0x10  # sparse: compressed
    text = ("the same few words again " * 100_000).encode()
    assert compressible(text) and frame(text, 0)[0] == 0x10
    assert unframe(frame(floats.tobytes(), 0)) == (0, floats.tobytes())
