"""The allowlist: which classes a checkpoint may rebuild, and under which stable names.

Loading a checkpoint must never be a way to run code. Stored class references are therefore
plain names that are looked up here and nowhere else: no import, no ``getattr`` on a module.
A class that is not registered is refused when it is *saved* (so the mistake shows up in a
test run, not when a resume fails at 3 a.m.) and reported, not rebuilt, when it is loaded.

Default names do not depend on how a module was started: a class in a script run as
``python agent.py`` is named ``agent.Plan``, as it is when ``pitstop resume --workflow
agent:wf`` imports that file, not ``__main__.Plan``. Values stored under ``__main__.X`` by older
versions still load, as the one registered class whose qualified name is ``X``.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import threading
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, overload

from .base import NATIVE_TYPES, defined_in_python, type_name_of

T = TypeVar("T")

Encode = Callable[[Any], object]
Decode = Callable[[Any], Any]

#: Built-in bases whose subclasses can be rebuilt faithfully without calling the subclass's
#: ``__new__``/``__init__``: the value is created by the base type's own constructor.
BUILTIN_BASES: tuple[type, ...] = (str, bytes, int, float, tuple, frozenset, list, dict, set)


class Kind(enum.Enum):
    """How instances of a registered class are taken apart and rebuilt (see exttypes.py)."""

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
    #: Other names that load as this class (old names); values are always written as ``name``.
    aliases: tuple[str, ...] = ()


class TypeRegistry:
    """Maps classes to stable names and back; the only source of classes when loading.

    Names, not import paths, are what gets stored, so a class can move between modules without
    breaking old checkpoints: register it under its old name with ``name=...``.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, Registration] = {}
        self._by_class: dict[type, Registration] = {}
        self._aliases: dict[str, Registration] = {}
        # "__main__.QualName" -> the one default-named class with that qualified name (None
        # when several have it: then only an explicit alias decides).
        self._main_names: dict[str, Registration | None] = {}
        self._lock = threading.Lock()

    @overload
    def register(
        self,
        cls: type[T],
        *,
        name: str | None = None,
        aliases: Iterable[str] = (),
        encode: Encode | None = None,
        decode: Decode | None = None,
    ) -> type[T]: ...

    @overload
    def register(
        self,
        cls: None = None,
        *,
        name: str | None = None,
        aliases: Iterable[str] = (),
        encode: Encode | None = None,
        decode: Decode | None = None,
    ) -> Callable[[type[T]], type[T]]: ...

    def register(
        self,
        cls: type[T] | None = None,
        *,
        name: str | None = None,
        aliases: Iterable[str] = (),
        encode: Encode | None = None,
        decode: Decode | None = None,
    ) -> type[T] | Callable[[type[T]], type[T]]:
        """Allow instances of ``cls`` in checkpoints; usable as ``@register`` or ``@register(...)``.

        ``name`` defaults to ``"module.QualName"``, where a module run as a script
        (``__main__``) is named as it is when imported (``agent`` for ``python agent.py``,
        ``pkg.agent`` inside a package, the ``-m`` name for ``python -m``); pass a fixed one
        (``"invoice.v1"``) to keep old checkpoints loadable when the class moves or its module
        is renamed. ``aliases`` are further names that load as this class (the names it had
        before); values are always written under ``name``. ``encode(obj)`` must return a value the
        serialiser supports and ``decode(data)`` must rebuild the object from it; without them
        the object's attributes are stored and restored without calling ``__init__``.
        Put ``@register`` above ``@dataclass`` so that it sees the finished class.
        """
        if (encode is None) != (decode is None):
            raise ValueError("pass both encode= and decode=, or neither")

        alias_names = (aliases,) if isinstance(aliases, str) else tuple(aliases)

        def apply(klass: type[T]) -> type[T]:
            self._add(klass, name, alias_names, encode, decode)
            return klass

        return apply if cls is None else apply(cls)

    def _add(
        self,
        cls: type,
        name: str | None,
        aliases: tuple[str, ...],
        encode: Encode | None,
        decode: Decode | None,
    ) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"register() takes a class, got {cls!r}")
        if cls in NATIVE_TYPES:
            raise ValueError(f"{type_name_of(cls)} is supported without registration")
        default_name = name is None
        if name is None:
            name = f"{stable_module_name(cls)}.{cls.__qualname__}"
        elif not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        for alias in aliases:
            if not isinstance(alias, str) or not alias or alias == name:
                raise ValueError(f"aliases must be non-empty names other than {name!r}, "
                                 f"got {alias!r}")
        registration = dataclasses.replace(_describe(cls, name, encode, decode), aliases=aliases)
        with self._lock:
            same_name = self._by_name.get(name)
            if same_name is not None and same_name.cls is not cls and _redefinition(
                same_name.cls, cls
            ):
                # The same class defined again: a reloaded module or a re-run notebook cell
                # (the new definition replaces the old one), or a script's module imported
                # under its own name as well (both classes exist: instances of either save).
                if "__main__" not in (same_name.cls.__module__, cls.__module__):
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
            for alias in aliases:
                taken = self._by_name.get(alias) or self._aliases.get(alias)
                if taken is not None and taken.cls is not cls and not _redefinition(
                    taken.cls, cls
                ):
                    raise ValueError(
                        f"cannot use {alias!r} as an alias of {type_name_of(cls)}: it already "
                        f"names {type_name_of(taken.cls)}"
                    )
            self._by_name[name] = registration
            self._by_class[cls] = registration
            for alias in aliases:
                self._aliases[alias] = registration
            if default_name:
                main_name = f"__main__.{cls.__qualname__}"
                if main_name in self._main_names:
                    known = self._main_names[main_name]
                    if known is not None and not _redefinition(known.cls, cls):
                        self._main_names[main_name] = None  # ambiguous: explicit aliases decide
                    elif known is not None:
                        self._main_names[main_name] = registration
                else:
                    self._main_names[main_name] = registration

    def registration_for(self, cls: type) -> Registration | None:
        """The registration of exactly ``cls`` (subclasses must be registered themselves)."""
        return self._by_class.get(cls)

    def lookup(self, name: str) -> Registration | None:
        """The registration stored under ``name``: the only way a load obtains a class.

        Besides registered names: aliases, and ``__main__.X`` (what a script's classes were
        called before their module got its real name) as the one default-named class ``X``.
        """
        found = self._by_name.get(name)
        if found is None:
            found = self._aliases.get(name)
        if found is None and name.startswith("__main__."):
            found = self._main_names.get(name)
        return found

    def why_missing(self, name: str) -> str:
        """What to do about a stored class name that :meth:`lookup` does not know."""
        if name.startswith("__main__."):
            qualname = name.removeprefix("__main__.")
            if self._main_names.get(name, False) is None:
                candidates = sorted(r.name for r in self._by_class.values()
                                    if r.cls.__qualname__ == qualname)
                return (f"several registered classes are called {qualname} "
                        f"({', '.join(candidates)}); register the one it was with "
                        f"aliases=[{name!r}]")
            return (f"it was saved by a script run as __main__; import the module that defines "
                    f"{qualname} (e.g. --workflow MODULE:ATTR) so that it is registered, or "
                    f"register it with aliases=[{name!r}]")
        return "register the class to load it, or load with strict=False to inspect it"

    def name_of(self, cls: type) -> str | None:
        """The name ``cls`` is stored under, or None if it is not registered."""
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

__all__ = [
    "Kind",
    "Registration",
    "TypeRegistry",
    "default_registry",
    "main_module_name",
    "register",
    "stable_module_name",
]


def _redefinition(old: type, new: type) -> bool:
    return (stable_module_name(old), old.__qualname__) == \
        (stable_module_name(new), new.__qualname__)


def stable_module_name(cls: type) -> str:
    """``cls.__module__``, except that a module run as a script is given the name it has
    when imported, so that default registration names do not depend on how it started."""
    module = cls.__module__
    if module != "__main__":
        return module
    return main_module_name() or module


def main_module_name() -> str | None:
    """The import name of the module running as ``__main__``: its ``-m`` name, or the name
    its file has on ``sys.path`` (with its package, if its directory is one). None when
    there is no file (``python -c``, an interactive session, a notebook)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    spec_name = getattr(spec, "name", None)
    if isinstance(spec_name, str) and spec_name and spec_name != "__main__":
        return spec_name
    file = getattr(main, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = Path(file).resolve()
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file() and directory.name.isidentifier():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts) if all(p.isidentifier() for p in parts) else None
