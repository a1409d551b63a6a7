"""The allowlist: which classes a checkpoint may rebuild, and under which stable names.

Loading a checkpoint must never be a way to run code. Stored class references are therefore
plain names that are looked up here and nowhere else: no import, no ``getattr`` on a module.
A class that is not registered is refused when it is *saved* (so the mistake shows up in a
test run, not when a resume fails at 3 a.m.) and reported, not rebuilt, when it is loaded.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import threading
import typing
from collections.abc import Callable
from typing import Any, TypeVar, overload

from .base import NATIVE_TYPES, defined_in_python, type_name_of

T = TypeVar("T")

Encode = Callable[[Any], object]
Decode = Callable[[Any], Any]

#: Built-in bases whose subclasses can be rebuilt faithfully without calling the subclass's
#: ``__new__``/``__init__``: the value is created by the base type's own constructor.
BUILTIN_BASES: tuple[type, ...] = (str, bytes, int, float, tuple, frozenset, list, dict, set)


class Kind(enum.Enum):
    """How instances of a registered class are taken apart and rebuilt (see codec.py)."""

    CUSTOM = "custom"  # the user's encode/decode pair
    ENUM = "enum"  # by member name (by value for Flag)
    PYDANTIC = "pydantic"  # __dict__, extras, fields set and private attributes, not re-validated
    STRUCT = "struct"  # msgspec Struct fields, rebuilt by calling the class
    BUILTIN_SUBCLASS = "builtin_subclass"  # the builtin value plus instance attributes
    OBJECT = "object"  # dataclasses and plain classes: __dict__ and __slots__, like pickle


@dataclasses.dataclass(frozen=True, slots=True)
class Registration:
    """Everything the codec needs about one registered class, worked out once at registration."""

    cls: type
    name: str
    kind: Kind
    encode: Encode | None = None
    decode: Decode | None = None
    #: msgspec Struct field names (the only kind whose state is not simply its attributes).
    fields: tuple[str, ...] = ()
    #: Attribute names stored in ``__slots__`` anywhere in the MRO (already name-mangled).
    slots: frozenset[str] = frozenset()
    #: Whether instances carry a ``__dict__`` (as opposed to slots only).
    has_dict: bool = True
    #: For BUILTIN_SUBCLASS: the builtin type in BUILTIN_BASES that holds the value.
    base: type | None = None


class TypeRegistry:
    """Maps classes to stable names and back; the only source of classes when loading.

    Names, not import paths, are what gets stored, so a class can move between modules without
    breaking old checkpoints: register it under its old name with ``name=...``.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, Registration] = {}
        self._by_class: dict[type, Registration] = {}
        self._lock = threading.Lock()

    @overload
    def register(
        self,
        cls: type[T],
        *,
        name: str | None = None,
        encode: Encode | None = None,
        decode: Decode | None = None,
    ) -> type[T]: ...

    @overload
    def register(
        self,
        cls: None = None,
        *,
        name: str | None = None,
        encode: Encode | None = None,
        decode: Decode | None = None,
    ) -> Callable[[type[T]], type[T]]: ...

    def register(
        self,
        cls: type[T] | None = None,
        *,
        name: str | None = None,
        encode: Encode | None = None,
        decode: Decode | None = None,
    ) -> type[T] | Callable[[type[T]], type[T]]:
        """Allow instances of ``cls`` in checkpoints; usable as ``@register`` or ``@register(...)``.

        ``name`` defaults to ``"module.QualName"``; pass a fixed one (``"invoice.v1"``) to keep
        old checkpoints loadable when the class moves. ``encode(obj)`` must return a value the
        serialiser supports and ``decode(data)`` must rebuild the object from it; without them
        the object's attributes are stored and restored without calling ``__init__``.
        Put ``@register`` above ``@dataclass`` so that it sees the finished class.
        """
        if (encode is None) != (decode is None):
            raise ValueError("pass both encode= and decode=, or neither")

        def apply(klass: type[T]) -> type[T]:
            self._add(klass, name, encode, decode)
            return klass

        return apply if cls is None else apply(cls)

    def _add(
        self, cls: type, name: str | None, encode: Encode | None, decode: Decode | None
    ) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"register() takes a class, got {cls!r}")
        if cls in NATIVE_TYPES:
            raise ValueError(f"{type_name_of(cls)} is supported without registration")
        if name is None:
            name = f"{cls.__module__}.{cls.__qualname__}"
        elif not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        registration = _describe(cls, name, encode, decode)
        with self._lock:
            same_name = self._by_name.get(name)
            if same_name is not None and same_name.cls is not cls and _redefinition(
                same_name.cls, cls
            ):
                # The same class defined again (a reloaded module, a re-run notebook cell):
                # the new definition replaces the old one.
                self._by_class.pop(same_name.cls, None)
                same_name = None
            if same_name is not None and same_name.cls is not cls:
                raise ValueError(
                    f"cannot register {type_name_of(cls)} as {name!r}: that name already belongs "
                    f"to {type_name_of(same_name.cls)}; pass name=... to tell them apart"
                )
            previous = self._by_class.get(cls)
            if previous is not None:
                if previous == registration:
                    return  # registering the same thing twice is harmless
                raise ValueError(
                    f"{type_name_of(cls)} is already registered as {previous.name!r} "
                    "with a different name or encode/decode"
                )
            self._by_name[name] = registration
            self._by_class[cls] = registration

    def registration_for(self, cls: type) -> Registration | None:
        """The registration of exactly ``cls`` (subclasses must be registered themselves)."""
        return self._by_class.get(cls)

    def lookup(self, name: str) -> Registration | None:
        """The registration stored under ``name``: the only way a load obtains a class."""
        return self._by_name.get(name)

    def name_of(self, cls: type) -> str | None:
        registration = self._by_class.get(cls)
        return None if registration is None else registration.name

    def __contains__(self, cls: object) -> bool:
        return cls in self._by_class

    def __len__(self) -> int:
        return len(self._by_class)

    def register_annotations(self, tp: object) -> list[type]:
        """Register every dataclass, pydantic model, msgspec Struct, enum and NamedTuple in ``tp``.

        Walks field annotations recursively through containers, ``Optional``/``Union``,
        ``Annotated``, TypedDicts and type aliases, so declaring a state type is enough to save
        it. Returns the classes that were newly registered. Forward references that cannot be
        resolved are skipped, not guessed.
        """
        added: list[type] = []
        seen: set[int] = set()
        keep_alive: list[object] = []  # so that ids in `seen` are not reused by new objects
        pending: list[object] = [tp]
        while pending:
            item = pending.pop()
            if id(item) in seen:
                continue
            seen.add(id(item))
            keep_alive.append(item)
            if isinstance(item, type) and _auto_registrable(item) and item not in self:
                self.register(item)
                added.append(item)
            pending.extend(_annotation_children(item))
        return added


def _describe(cls: type, name: str, encode: Encode | None, decode: Decode | None) -> Registration:
    if encode is not None:
        return Registration(cls, name, Kind.CUSTOM, encode=encode, decode=decode)
    if issubclass(cls, enum.Enum):
        return Registration(cls, name, Kind.ENUM)
    slots = _slot_names(cls)
    has_dict = getattr(cls, "__dictoffset__", 0) != 0
    if is_pydantic_model(cls):
        return Registration(cls, name, Kind.PYDANTIC)
    if is_struct(cls):
        fields = tuple(getattr(cls, "__struct_fields__", ()))
        return Registration(cls, name, Kind.STRUCT, fields=fields)
    native = next(c for c in cls.__mro__ if not defined_in_python(c))
    if native is object:
        return Registration(cls, name, Kind.OBJECT, slots=slots, has_dict=has_dict)
    if native in BUILTIN_BASES:
        return Registration(
            cls, name, Kind.BUILTIN_SUBCLASS, slots=slots, has_dict=has_dict, base=native
        )
    raise TypeError(
        f"cannot register {type_name_of(cls)} without encode= and decode=: it is built on "
        f"{type_name_of(native)}, whose internal state cannot be restored safely from attributes"
    )


def _slot_names(cls: type) -> frozenset[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        for slot in (declared,) if isinstance(declared, str) else declared:
            if slot in ("__dict__", "__weakref__"):
                continue
            private = slot.startswith("__") and not slot.endswith("__")
            owner = klass.__name__.lstrip("_")
            names.add(f"_{owner}{slot}" if private and owner else slot)  # name mangling
    return frozenset(names)


def is_pydantic_model(cls: type) -> bool:
    pydantic = sys.modules.get("pydantic")  # a model class exists only if pydantic is imported
    return pydantic is not None and issubclass(cls, pydantic.BaseModel)


def is_struct(cls: type) -> bool:
    msgspec = sys.modules.get("msgspec")
    return msgspec is not None and issubclass(cls, msgspec.Struct)


def is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _auto_registrable(cls: type) -> bool:
    """Classes that a state type's annotations can register on their own (not library bases)."""
    if cls.__module__ in ("builtins", "enum", "typing", "pydantic.main", "pydantic.root_model"):
        return False
    if issubclass(cls, enum.Enum):
        return bool(cls.__members__)
    return (
        dataclasses.is_dataclass(cls)
        or is_pydantic_model(cls)
        or (is_struct(cls) and cls.__module__ != "msgspec")
        or is_namedtuple(cls)
    )


_WRAPPERS: frozenset[object] = frozenset(
    {typing.ClassVar, typing.Final, typing.Required, typing.NotRequired}
)


def _annotation_children(item: object) -> list[object]:
    """The types directly mentioned by ``item``: arguments of generics, field annotations..."""
    if isinstance(item, str | typing.ForwardRef):
        return []
    origin = typing.get_origin(item)
    if origin is typing.Annotated:
        return [typing.get_args(item)[0]]  # the rest is metadata, not types
    if origin is typing.Literal:
        return []
    if origin is not None:
        args = list(typing.get_args(item))
        return args if origin in _WRAPPERS else [origin, *args]
    if isinstance(item, typing.TypeVar):
        return [item.__bound__, *item.__constraints__]
    if type(item).__name__ == "TypeAliasType":  # `type X = ...` (3.12+)
        return [getattr(item, "__value__", None)]
    supertype = getattr(item, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return [supertype]
    if not isinstance(item, type) or item.__module__ == "builtins":
        return []
    if is_pydantic_model(item):
        fields = getattr(item, "model_fields", {})
        return [field.annotation for field in fields.values()]
    if (
        dataclasses.is_dataclass(item)
        or is_struct(item)
        or is_namedtuple(item)
        or typing.is_typeddict(item)
    ):
        return list(type_hints(item).values())
    return []


def type_hints(cls: type) -> dict[str, object]:
    """The resolved annotations of ``cls`` (extras kept), skipping only those that fail."""
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:
        pass
    # One unresolvable forward reference makes get_type_hints give up on the whole class;
    # resolve the annotations one by one instead and skip only the ones that fail.
    hints: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        namespace = dict(vars(module)) if module is not None else {}
        namespace.update(vars(klass))
        for key, annotation in inspect.get_annotations(klass).items():
            hint = annotation
            if isinstance(hint, typing.ForwardRef):
                hint = hint.__forward_arg__
            if isinstance(hint, str):
                try:
                    hint = eval(hint, namespace)  # what get_type_hints does, one at a time
                except Exception:
                    continue
            hints[key] = hint
    return hints


#: The registry used when none is passed: what ``pitstop.register`` adds to.
default_registry = TypeRegistry()
register = default_registry.register

__all__ = ["Kind", "Registration", "TypeRegistry", "default_registry", "register"]


def _redefinition(old: type, new: type) -> bool:
    return (old.__module__, old.__qualname__) == (new.__module__, new.__qualname__)
