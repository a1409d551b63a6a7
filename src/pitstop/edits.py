"""Edits of a checkpoint's state typed in by people: ``pitstop fork --set``, the web inspector.

People type JSON; a state holds dataclasses, pydantic models, datetimes, tuples, enums. An
edit that stored the JSON as it came would replace a ``Plan`` with a dict, and the run would
fail later, far from the mistake, with an ``AttributeError``. So every edited value is
converted to the type the field holds (the stored value's own type, or the annotation of the
state type or of the enclosing dataclass/model when there is no value yet), or the edit is
refused with a :class:`~pitstop.errors.FieldEditError` naming the field. A field that does not
exist is refused too, unless adding fields was asked for, so a typo never adds a field.

The rules, for a value of type T (the stored value's type, else the annotation):

- ``bool``, ``int``, ``float``, ``str``: the same JSON type (an int is accepted for a float,
  an integral float for an int); ``None`` only where the annotation allows it (or when there
  is no annotation to say otherwise).
- ``datetime``/``date``/``time``: an ISO-8601 string (a naive time for an aware one is
  refused); ``timedelta``: seconds; ``UUID``, ``Decimal``, ``complex``: their string form;
  enums: the member's name (``"HIGH"`` or ``"Risk.HIGH"``, as ``show`` prints it) or value.
- dataclasses, pydantic models, msgspec Structs, NamedTuples: a JSON object of their fields
  (``"$type"``, as ``show`` prints it, may be included); unknown fields are refused, nested
  values converted by the same rules (pydantic and msgspec validate with their own rules).
- lists, tuples, sets, dicts: the JSON container; members that are (or are annotated as)
  structured classes are converted, other members are taken as JSON.
- ``bytes`` and classes with custom encoders cannot be written as JSON: refused (edit their
  fields with a path, or pass the Python object).

A value that already has the right type (a Python caller passing a ``Plan``) is taken as is.
Paths reach inside values: ``plan.goal``, ``messages[-1].content``, ``limits["eu-west"]``.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import enum
import sys
import types
import typing
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from typing import Any, is_typeddict

from .errors import FieldEditError
from .fieldpath import PathPart, format_path, parse_path
from .serde.base import UnknownObject, type_name_of
from .serde.registry import (
    TypeRegistry,
    default_registry,
    is_namedtuple,
    is_pydantic_model,
    is_struct,
    type_hints,
)


class _Missing(enum.Enum):
    MISSING = "MISSING"


_MISSING = _Missing.MISSING
"""No stored value at this place (a field being added, or declared but not yet set)."""

_NO_HINT: Any = None


def apply_field_edits(
    state: Mapping[str, Any],
    edits: Mapping[str, Any],
    *,
    add: bool = False,
    state_type: Any = None,
    registry: TypeRegistry | None = None,
) -> dict[str, Any]:
    """The top-level fields of ``state`` changed by ``edits``, each converted to its type.

    ``state`` is a checkpoint's state (``checkpoint.state``: field name -> value); ``edits``
    maps field paths (``"plan"``, ``"plan.goal"``, ``"messages[-1].content"``) to new values,
    usually decoded JSON. The result is what ``fork(..., update=...)`` takes: only the
    top-level fields that an edit touches, with nested edits applied to copies (``state`` is
    never mutated). ``add=True`` allows new top-level fields and new mapping keys;
    ``state_type`` (a workflow's ``state=`` type) supplies annotations and the fields a
    dataclass or model state may have. Classes named by ``"$type"`` are looked up in
    ``registry`` (default: :data:`pitstop.serde.default_registry`), never imported.

    Raises :class:`~pitstop.errors.FieldEditError` naming the field for an unknown field or
    a value that cannot be converted; nothing is changed then.
    """
    editor = _Editor(registry or default_registry, add)
    hints, declared = _state_fields(state_type)
    updates: dict[str, Any] = {}
    for path, new in edits.items():
        try:
            parts = parse_path(path)
        except ValueError as exc:
            raise FieldEditError(str(exc), field=path) from None
        top = parts[0]
        if not isinstance(top, str):
            raise FieldEditError("a path starts with a field name, not an index", field=path)
        current: Any = updates.get(top, state.get(top, _MISSING))
        if current is _MISSING and top not in updates:
            if declared is not None and top not in declared:
                raise FieldEditError(
                    f"{type_name_of(state_type)} has no field {top!r} "
                    f"(fields: {', '.join(sorted(declared)) or 'none'})", field=path
                )
            if declared is None and not add:
                known = ", ".join(sorted(state)) or "none"
                raise FieldEditError(
                    f"no field {top!r} in this state (fields: {known}); to add a new field, "
                    "pass add=True (pitstop fork --add)", field=path
                )
        editor.path = path
        if len(parts) == 1:
            updates[top] = editor.convert(new, current, hints.get(top), [top])
        elif current is _MISSING or current is None:
            raise FieldEditError(f"field {top!r} has no value to edit inside", field=path)
        else:
            updates[top] = editor.set_in(current, parts, 1, new, hints.get(top))
    return updates


def convert_value(value: Any, hint: Any, *, registry: TypeRegistry | None = None) -> Any:
    """``value`` (decoded JSON) as the type ``hint`` names, by the rules above (a dataclass
    from a JSON object of its fields...); :class:`~pitstop.errors.FieldEditError` if it
    cannot be."""
    editor = _Editor(registry or default_registry, add=False)
    editor.path = type_name_of(hint)
    return editor.convert(value, _MISSING, hint, [])


def _state_fields(state_type: Any) -> tuple[dict[str, Any], frozenset[str] | None]:
    """Annotations of a state type's fields, and the field names it allows (None: any)."""
    if state_type is None or state_type is dict:
        return {}, None
    if is_pydantic_model(state_type):
        fields = state_type.model_fields
        return {k: f.annotation for k, f in fields.items()}, frozenset(fields)
    if dataclasses.is_dataclass(state_type) or is_typeddict(state_type):
        hints = type_hints(state_type)
        return hints, frozenset(hints)
    return {}, None


class _Editor:
    """One call's conversions; ``path`` is the edit being applied, for error messages."""

    def __init__(self, registry: TypeRegistry, add: bool) -> None:
        self.registry = registry
        self.add = add
        self.path = ""

    def refuse(self, where: list[PathPart], message: str) -> FieldEditError:
        inner = format_path(where)
        prefix = f"at {inner}: " if inner != self.path and len(where) > 1 else ""
        return FieldEditError(prefix + message, field=self.path)

    # -- reaching inside a value ---------------------------------------------------------------

    def set_in(self, value: Any, parts: list[PathPart], i: int, new: Any, hint: Any) -> Any:
        """A copy of ``value`` with ``parts[i:]`` inside it set to ``new``."""
        where = parts[:i]
        part = parts[i]
        last = i == len(parts) - 1
        hint = _unwrap(hint)

        def child(old: Any, child_hint: Any) -> Any:
            if last:
                return self.convert(new, old, child_hint, parts[: i + 1])
            if old is _MISSING or old is None:
                raise self.refuse(parts[: i + 1], "has no value to edit inside")
            return self.set_in(old, parts, i + 1, new, child_hint)

        if isinstance(value, UnknownObject):
            raise self.refuse(where, _unknown_class(value))
        if isinstance(part, int):
            if not isinstance(value, list | tuple | deque):
                raise self.refuse(where, f"is a {_kind(value)}, not a list: {part} is no key")
            if not -len(value) <= part < len(value):
                raise self.refuse(where, f"has {len(value)} items; there is no item {part}")
            items = list(value)
            items[part] = child(items[part], _item_hint(hint, part))
            return _rebuild_sequence(value, items)
        if isinstance(value, Mapping):
            old = value.get(part, _MISSING)
            declared = isinstance(hint, type) and is_typeddict(hint) and part in type_hints(hint)
            if old is _MISSING and not self.add and not declared:
                keys = ", ".join(map(str, list(value)[:12])) or "none"
                raise self.refuse(
                    where, f"has no key {part!r} (keys: {keys}); pass add=True (--add) to add it"
                )
            out: Any = copy.copy(value)
            out[part] = child(old, _value_hint(hint, part))
            return out
        fields = _field_names(value, self.registry)
        if fields is None:
            raise self.refuse(where, f"is a {_kind(value)}, which has no field {part!r}")
        if part not in fields:
            raise self.refuse(
                where, f"{type_name_of(type(value))} has no field {part!r} "
                f"(fields: {', '.join(fields)})"
            )
        changed = child(getattr(value, part, _MISSING), _field_hint(type(value), part))
        return _replace(value, part, changed)

    # -- converting one value ------------------------------------------------------------------

    def convert(self, new: Any, old: Any, hint: Any, where: list[PathPart]) -> Any:
        """``new`` as the type ``hint`` names or, without a usable hint, as the type of
        ``old`` (the stored value); as JSON when neither says anything."""
        hint = _unwrap(hint)
        if not _usable(hint):
            hint = None
        if new is None:
            if hint is None or _allows_none(hint):
                return None
            raise self.refuse(where, f"cannot be null (it is a {_hint_name(hint)})")
        if hint is not None:
            return self._by_hint(new, hint, where, old)
        if old is not _MISSING and old is not None:
            return self._as_type(new, type(old), old, None, where)
        return self._loose(new, where)

    def _loose(self, new: Any, where: list[PathPart]) -> Any:
        """A value with nothing to say its type: JSON as it came, or a ``"$type"`` object."""
        if isinstance(new, Mapping):
            name = new.get("$type")
            if isinstance(name, str):
                registration = self.registry.lookup(name)
                if registration is None:
                    raise self.refuse(where, f"\"$type\" {name!r} is not a registered class")
                return self._build(registration.cls, new, _MISSING, where)
            return {k: self._loose(v, [*where, k]) for k, v in new.items()}
        if isinstance(new, list):
            return [self._loose(v, [*where, i]) for i, v in enumerate(new)]
        return new

    def _member(self, new: Any, example: Any, hint: Any, where: list[PathPart]) -> Any:
        """A member of a container: converted if it is (or is annotated as) a typed value."""
        if _usable(_unwrap(hint)):
            return self.convert(new, example, hint, where)
        if example is not _MISSING and example is not None and _structured(type(example)):
            return self.convert(new, example, None, where)
        return self._loose(new, where)

    def _by_hint(self, new: Any, hint: Any, where: list[PathPart], old: Any = _MISSING) -> Any:
        hint = _unwrap(hint)
        if not _usable(hint):
            return self._loose(new, where)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is typing.Union or origin is types.UnionType:
            if new is None:
                if type(None) in args:
                    return None
                raise self.refuse(where, f"cannot be null (it is a {_hint_name(hint)})")
            errors: list[FieldEditError] = []
            options = [a for a in args if a is not type(None)]
            # The stored value's type first, then structured options: a JSON object is meant
            # as one of those rather than as a dict.
            options.sort(key=lambda a: (not (isinstance(a, type) and isinstance(old, a)),
                                        not (isinstance(a, type) and _structured(a))))
            for option in options:
                try:
                    return self._by_hint(new, option, where, old)
                except FieldEditError as exc:
                    errors.append(exc)
            raise self.refuse(where, f"expects {_hint_name(hint)}: {errors[0].reason}")
        if origin is typing.Literal:
            if new in args:
                return new
            raise self.refuse(where, f"must be one of {', '.join(map(repr, args))}")
        if new is None:
            raise self.refuse(where, f"cannot be null (it is a {_hint_name(hint)})")
        if origin is not None and isinstance(origin, type):
            return self._container(new, origin, old if isinstance(old, origin) else _MISSING,
                                   hint, where)
        if isinstance(hint, type):
            if is_typeddict(hint):
                if not isinstance(new, Mapping):
                    raise self.refuse(where, f"expects a JSON object, got {_json_kind(new)}")
                hints = type_hints(hint)
                unknown = [k for k in new if k not in hints]
                if unknown:
                    raise self.refuse(where, f"{type_name_of(hint)} has no key {unknown[0]!r} "
                                      f"(keys: {', '.join(hints)})")
                before = old if isinstance(old, Mapping) else {}
                return {k: self.convert(v, before.get(k, _MISSING), hints.get(k), [*where, k])
                        for k, v in new.items()}
            if isinstance(old, UnknownObject):
                raise self.refuse(where, _unknown_class(old))
            return self._as_type(new, hint, old if isinstance(old, hint) else _MISSING, hint,
                                 where)
        return self._loose(new, where)

    def _as_type(self, new: Any, cls: type, old: Any, hint: Any, where: list[PathPart]) -> Any:
        if type(new) is cls and not _container(cls):
            return new
        if issubclass(cls, enum.Enum):
            return self._enum(new, cls, where)
        if cls is bool or cls is int or cls is float or cls is str:
            return self._scalar(new, cls, where)
        if issubclass(cls, datetime.date | datetime.time | datetime.timedelta):
            return self._time(new, cls, old, where)
        if cls in (uuid.UUID, decimal.Decimal, complex):
            number = isinstance(new, int | float) and not isinstance(new, bool)
            if not isinstance(new, str) and not (number and cls is not uuid.UUID):
                raise self.refuse(where, f"expects a {cls.__name__} as a string, "
                                  f"got {_json_kind(new)}")
            make: Any = cls
            try:
                return make(str(new) if cls is decimal.Decimal else new)
            except (ValueError, decimal.InvalidOperation):
                raise self.refuse(where, f"{new!r} is not a valid {cls.__name__}") from None
        if cls.__module__ == "numpy" or cls.__module__.startswith("numpy."):
            return self._numpy(new, old, where)
        if issubclass(cls, bytes | bytearray):
            raise self.refuse(where, "holds bytes, which cannot be written as JSON")
        if is_namedtuple(cls):
            return self._namedtuple(new, cls, where)
        if _container(cls):
            return self._container(new, cls, old, hint, where)
        if isinstance(old, UnknownObject) or cls is UnknownObject:
            raise self.refuse(where, _unknown_class(old))
        if isinstance(new, cls):
            return new
        return self._build(cls, new, old, where)

    def _scalar(self, new: Any, cls: type, where: list[PathPart]) -> Any:
        if cls is float and isinstance(new, int) and not isinstance(new, bool):
            return float(new)
        if cls is int and isinstance(new, float) and new.is_integer():
            return int(new)
        if type(new) is cls or (cls is not bool and isinstance(new, cls)
                                and not isinstance(new, bool)):
            return cls(new)
        raise self.refuse(where, f"expects {_article(cls.__name__)}, got {_json_kind(new)} "
                          f"{_preview(new)}")

    def _enum(self, new: Any, cls: type[enum.Enum], where: list[PathPart]) -> Any:
        if isinstance(new, cls):
            return new
        if isinstance(new, str):
            name = new.removeprefix(cls.__name__ + ".")
            if name in cls.__members__:
                return cls.__members__[name]
        try:
            return cls(new)
        except (ValueError, TypeError):
            names = ", ".join(cls.__members__)
            raise self.refuse(where, f"{new!r} is not a {cls.__name__} (members: {names})") \
                from None

    def _time(self, new: Any, cls: type, old: Any, where: list[PathPart]) -> Any:
        if issubclass(cls, datetime.timedelta):
            if isinstance(new, int | float) and not isinstance(new, bool):
                return datetime.timedelta(seconds=new)
            raise self.refuse(where, f"expects a duration in seconds, got {_json_kind(new)}")
        if not isinstance(new, str):
            raise self.refuse(where, f"expects {_article(cls.__name__)} as an ISO-8601 string, "
                              f"got {_json_kind(new)}")
        try:
            parsed = getattr(cls, "fromisoformat")(new)  # noqa: B009 - date, time or datetime
        except ValueError:
            raise self.refuse(where, f"{new!r} is not an ISO-8601 {cls.__name__}") from None
        if isinstance(old, datetime.datetime) and old.tzinfo is not None and \
                parsed.tzinfo is None:
            raise self.refuse(where, f"{new!r} has no time zone, but the stored time has one "
                              "(add e.g. +00:00)")
        return parsed

    def _numpy(self, new: Any, old: Any, where: list[PathPart]) -> Any:
        np = sys.modules["numpy"]
        if isinstance(new, np.ndarray | np.generic):
            return new
        dtype = getattr(old, "dtype", None)
        try:
            if isinstance(old, np.ndarray):
                return np.asarray(new, dtype=dtype)
            return np.dtype(dtype).type(new)
        except (ValueError, TypeError) as exc:
            raise self.refuse(where, f"cannot convert {_preview(new)} to numpy {dtype}: {exc}") \
                from None

    def _namedtuple(self, new: Any, cls: type, where: list[PathPart]) -> Any:
        names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        hints = type_hints(cls)
        if isinstance(new, Mapping):
            unknown = [k for k in new if k not in names]
            if unknown:
                raise self.refuse(where, f"{cls.__name__} has no field {unknown[0]!r} "
                                  f"(fields: {', '.join(names)})")
            values = {k: self._member(v, _MISSING, hints.get(k), [*where, k])
                      for k, v in new.items()}
            try:
                return cls(**values)
            except TypeError as exc:
                raise self.refuse(where, str(exc)) from None
        if isinstance(new, list):
            if len(new) > len(names):
                raise self.refuse(where, f"{cls.__name__} has {len(names)} fields, "
                                  f"got {len(new)} values")
            return cls(*(self._member(v, _MISSING, hints.get(n), [*where, n])
                         for n, v in zip(names, new, strict=False)))
        raise self.refuse(where, f"expects a {cls.__name__} as a JSON object or list, "
                          f"got {_json_kind(new)}")

    def _container(self, new: Any, cls: type, old: Any, hint: Any, where: list[PathPart]) -> Any:
        args = typing.get_args(hint) if typing.get_origin(hint) is not None else ()
        if issubclass(cls, Mapping):
            if not isinstance(new, Mapping):
                raise self.refuse(where, f"expects a JSON object, got {_json_kind(new)}")
            value_hint = args[1] if len(args) == 2 else None
            examples = _common_example(old.values()) if isinstance(old, Mapping) else _MISSING
            out = {k: self._member(v, examples, value_hint, [*where, k])
                   for k, v in new.items()}
            if cls is Counter or cls is OrderedDict:
                return cls(out)
            return out
        if not isinstance(new, list | tuple):
            raise self.refuse(where, f"expects a JSON list, got {_json_kind(new)}")
        if issubclass(cls, tuple):
            if len(args) == 2 and args[1] is Ellipsis:
                hints: list[Any] = [args[0]] * len(new)
            elif args:
                if len(args) != len(new):
                    raise self.refuse(where, f"expects {len(args)} items, got {len(new)}")
                hints = list(args)
            else:
                hints = [None] * len(new)
            examples_by_index = list(old) if isinstance(old, tuple) else []
            return tuple(
                self._member(v, examples_by_index[i] if i < len(examples_by_index) else _MISSING,
                             hints[i], [*where, i])
                for i, v in enumerate(new)
            )
        item_hint = args[0] if args else None
        example = _common_example(old) if old is not _MISSING else _MISSING
        items = [self._member(v, example, item_hint, [*where, i]) for i, v in enumerate(new)]
        if issubclass(cls, set | frozenset):
            try:
                return frozenset(items) if issubclass(cls, frozenset) else set(items)
            except TypeError as exc:
                raise self.refuse(where, f"cannot make a set of these items: {exc}") from None
        if cls is deque:
            return deque(items, maxlen=getattr(old, "maxlen", None))
        return items

    def _build(self, cls: type, new: Any, old: Any, where: list[PathPart]) -> Any:
        """A dataclass, pydantic model or msgspec Struct from a JSON object of its fields."""
        if isinstance(new, cls):
            return new
        if not isinstance(new, Mapping):
            raise self.refuse(where, f"holds a {type_name_of(cls)}: give it as a JSON object "
                              f"of its fields, not {_json_kind(new)}")
        data = dict(new)
        named = data.pop("$type", None)
        if named is not None and named not in (self.registry.name_of(cls), type_name_of(cls)):
            raise self.refuse(where, f"holds a {type_name_of(cls)}, not a {named}")
        if is_pydantic_model(cls):
            return self._pydantic(cls, data, where)
        if is_struct(cls):
            import msgspec

            try:
                return msgspec.convert(data, cls)
            except msgspec.ValidationError as exc:
                raise self.refuse(where, f"not a valid {type_name_of(cls)}: {exc}") from None
        if not dataclasses.is_dataclass(cls):
            raise self.refuse(where, f"holds a {type_name_of(cls)}, which cannot be built from "
                              "JSON (only dataclasses, pydantic models and msgspec Structs "
                              "can); edit its attributes one by one with a path instead")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in data if k not in fields]
        if unknown:
            raise self.refuse(where, f"{type_name_of(cls)} has no field {unknown[0]!r} "
                              f"(fields: {', '.join(fields)})")
        hints = type_hints(cls)
        values = {
            k: self.convert(v, getattr(old, k, _MISSING), hints.get(k), [*where, k])
            for k, v in data.items()
        }
        missing = [
            f.name for f in fields.values()
            if f.init and f.name not in values and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            alone = format_path([*where, next(iter(data), missing[0])])
            raise self.refuse(where, f"{type_name_of(cls)} needs field {missing[0]!r} too; to "
                              f"change only some fields, set each alone ({alone}=JSON)")
        init = {k: v for k, v in values.items() if fields[k].init}
        try:
            obj = cls(**init)
        except (TypeError, ValueError) as exc:
            raise self.refuse(where, f"{type_name_of(cls)}: {exc}") from None
        for name, value in values.items():
            if not fields[name].init:
                object.__setattr__(obj, name, value)
        return obj

    def _pydantic(self, cls: type, data: dict[str, Any], where: list[PathPart]) -> Any:
        import pydantic

        try:
            return cls.model_validate(data)  # type: ignore[attr-defined]
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            loc = format_path([*where, *first["loc"]])
            raise self.refuse(where, f"not a valid {type_name_of(cls)}: at {loc}: "
                              f"{first['msg']}") from None


# -- small helpers --------------------------------------------------------------------------------


def _unwrap(hint: Any) -> Any:
    """The type inside ``Annotated[...]``, ``Required[...]`` and friends."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated or origin in (typing.Required, typing.NotRequired,
                                                    typing.ClassVar, typing.Final):
            hint = typing.get_args(hint)[0]
            continue
        if type(hint).__name__ == "TypeAliasType":  # `type X = ...` (3.12+)
            hint = hint.__value__
            continue
        return hint


def _usable(hint: Any) -> bool:
    """Whether an annotation says something about the type (``Any`` or a string does not)."""
    return hint is not None and hint is not Any and hint is not object and \
        not isinstance(hint, typing.TypeVar | str | typing.ForwardRef)


def _allows_none(hint: Any) -> bool:
    hint = _unwrap(hint)
    if hint is Any or hint is None or hint is type(None):
        return True
    origin = typing.get_origin(hint)
    return (origin is typing.Union or origin is types.UnionType) and \
        type(None) in typing.get_args(hint)


def _item_hint(hint: Any, index: int) -> Any:
    args = typing.get_args(hint) if typing.get_origin(hint) is not None else ()
    if not args:
        return _NO_HINT
    if len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    origin = typing.get_origin(hint)
    if isinstance(origin, type) and issubclass(origin, tuple):
        return args[index] if -len(args) <= index < len(args) else _NO_HINT
    return args[0]


def _value_hint(hint: Any, key: str) -> Any:
    if isinstance(hint, type) and is_typeddict(hint):
        return type_hints(hint).get(key)
    args = typing.get_args(hint) if typing.get_origin(hint) is not None else ()
    return args[1] if len(args) == 2 else _NO_HINT


def _field_names(value: Any, registry: TypeRegistry) -> list[str] | None:
    cls = type(value)
    if dataclasses.is_dataclass(value):
        return [f.name for f in dataclasses.fields(value)]
    if is_pydantic_model(cls):
        return list(cls.model_fields)
    if is_struct(cls):
        return list(cls.__struct_fields__)
    if is_namedtuple(cls):
        return list(cls._fields)
    if hasattr(value, "__dict__") and registry.registration_for(cls) is not None:
        return list(vars(value))
    return None


def _field_hint(cls: type, name: str) -> Any:
    if is_pydantic_model(cls):
        field = cls.model_fields.get(name)  # type: ignore[attr-defined]
        return None if field is None else field.annotation
    return type_hints(cls).get(name)


def _replace(value: Any, name: str, new: Any) -> Any:
    """A copy of ``value`` with attribute ``name`` set, without running ``__init__``."""
    cls = type(value)
    if is_namedtuple(cls):
        return value._replace(**{name: new})
    if is_pydantic_model(cls):
        return value.model_copy(update={name: new})
    if is_struct(cls):
        import msgspec

        return msgspec.structs.replace(value, **{name: new})
    out = copy.copy(value)
    object.__setattr__(out, name, new)
    return out


def _rebuild_sequence(original: Any, items: list[Any]) -> Any:
    if isinstance(original, deque):
        return deque(items, maxlen=original.maxlen)
    if is_namedtuple(type(original)):
        return type(original)(*items)
    return tuple(items) if isinstance(original, tuple) else items


def _structured(cls: type) -> bool:
    return (
        dataclasses.is_dataclass(cls)
        or is_pydantic_model(cls)
        or is_struct(cls)
        or is_namedtuple(cls)
        or issubclass(cls, enum.Enum | datetime.date | datetime.time | uuid.UUID
                      | decimal.Decimal)
    )


def _container(cls: type) -> bool:
    return issubclass(cls, list | tuple | set | frozenset | deque | Mapping) and \
        not is_namedtuple(cls)


def _common_example(values: Any) -> Any:
    """A member to convert new members like: the first, if every member is of its type."""
    members = list(values)
    if not members:
        return _MISSING
    first = type(members[0])
    return members[0] if all(type(m) is first for m in members) else _MISSING


def _unknown_class(value: Any) -> str:
    name = value.type_name if isinstance(value, UnknownObject) else "value"
    return (f"holds a {name}, whose class is not registered in this process; load the code "
            "that defines it (e.g. --workflow MODULE:ATTR) to edit it")


def _kind(value: Any) -> str:
    return type_name_of(type(value))


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a JSON object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type_name_of(type(value))}"


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _article(name: str) -> str:
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def _hint_name(hint: Any) -> str:
    return type_name_of(hint) if isinstance(hint, type) else str(hint).replace("typing.", "")


__all__ = ["apply_field_edits"]
