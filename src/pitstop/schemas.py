"""Input schemas: what a waiting step accepts, checked when the input is sent.

``@wf.step(wait_for="approval", input_schema=Approval)`` declares the shape of an input with a
pydantic model, a TypedDict or a dataclass. A wrongly shaped payload would otherwise be stored
and fail the run later, far from the mistake. The step records the schema, as JSON Schema,
with the checkpoint it waits at; :meth:`Store.send <pitstop.Store.send>` checks each payload
against it, so the Python API, ``pitstop send`` and the inspector refuse the same payloads with
the same :class:`~pitstop.InputError` naming the field, without importing the workflow's code.
The inspector builds its form from the schema.

The JSON Schema is the subset these types need (``type``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``enum``, ``anyOf``, ``default``): made and checked here,
with no dependency. Unknown fields are refused (a typo is not a new field); types this module
cannot describe (a datetime, a class of your own) accept any value.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, is_typeddict

from .serde.registry import is_pydantic_model, type_hints

Schema = dict[str, Any]

_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def is_schema_type(tp: Any) -> bool:
    """Whether ``tp`` can declare an input: a pydantic model, a TypedDict or a dataclass."""
    return isinstance(tp, type) and (
        is_pydantic_model(tp) or is_typeddict(tp) or dataclasses.is_dataclass(tp))


def json_schema(tp: Any) -> Schema:
    """The JSON Schema of ``tp`` (a pydantic model, TypedDict, dataclass or annotation)."""
    return _schema(tp, set())


def _schema(hint: Any, seen: set[type]) -> Schema:
    if hint is Any:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return _schema(args[0], seen)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(a, seen) for a in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Required, typing.NotRequired):
        return _schema(args[0], seen)
    if origin in (list, tuple, set, frozenset) or origin is typing.Sequence:
        item = args[0] if args else Any  # tuple[int, ...] and list[int] alike
        return {"type": "array", "items": _schema(item, seen)}
    if origin in (dict, Mapping) or origin is typing.Mapping:
        return {"type": "object",
                "additionalProperties": _schema(args[1] if len(args) == 2 else Any, seen)}
    if not isinstance(hint, type):
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if issubclass(hint, enum.Enum):
        return {"enum": [member.value for member in hint]}
    if hint in (list, tuple, set, frozenset):
        return {"type": "array"}
    if hint is dict:
        return {"type": "object"}
    if not is_schema_type(hint) or hint in seen:
        return {}  # a type of its own: anything goes (and no recursion)
    return _object(hint, seen | {hint})


def _object(cls: type, seen: set[type]) -> Schema:
    properties: dict[str, Schema] = {}
    required: list[str] = []
    if is_pydantic_model(cls):
        fields: Any = getattr(cls, "model_fields")  # noqa: B009 - pydantic's own
        for name, info in fields.items():
            properties[name] = _with_default(_schema(info.annotation, seen), info.default)
            if info.is_required():
                required.append(name)
        extra = getattr(cls, "model_config", {}).get("extra") == "allow"
    elif is_typeddict(cls):
        # NotRequired[...] written under `from __future__ import annotations` is a string
        # that __required_keys__ cannot see on Python 3.11: read it from the hints.
        declared: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except (NameError, TypeError):
            hints = type_hints(cls)
        for name, hint in hints.items():
            properties[name] = _schema(hint, seen)
            origin = typing.get_origin(hint)
            if origin is typing.Required or (origin is not typing.NotRequired and
                                             name in declared):
                required.append(name)
        extra = False
    else:
        hints = type_hints(cls)
        for field in dataclasses.fields(cls):
            properties[field.name] = _with_default(_schema(hints.get(field.name, Any), seen),
                                                   field.default)
            if field.default is dataclasses.MISSING and \
                    field.default_factory is dataclasses.MISSING:
                required.append(field.name)
        extra = False
    return {"title": cls.__name__, "type": "object", "properties": properties,
            "required": required, "additionalProperties": extra}


def _with_default(schema: Schema, default: Any) -> Schema:
    if default is dataclasses.MISSING or type(default).__name__ == "PydanticUndefinedType":
        return schema
    if default is None or isinstance(default, bool | int | float | str):
        return {**schema, "default": default}
    return schema


# -- checking ----------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` as the JSON it stands for, for checking: a dataclass or a pydantic model
    passed from Python becomes the object of its fields."""
    if is_pydantic_model(type(value)):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def problem(schema: Schema, value: Any, path: str) -> tuple[str, str] | None:
    """The first place ``value`` does not fit ``schema``: (the field's path, what is wrong),
    or None if it fits. ``path`` names the value itself (the input's name)."""
    if "anyOf" in schema:
        found = [problem(option, value, path) for option in schema["anyOf"]]
        if all(found):
            deepest = max((f for f in found if f), key=lambda f: len(f[0]))
            return deepest if deepest[0] != path else (path, f"expected {_expected(schema)}, "
                                                               f"got {_describe(value)}")
        return None
    if "enum" in schema and value not in schema["enum"]:
        return path, f"expected one of {schema['enum']}, got {_describe(value)}"
    kind = schema.get("type")
    if kind is not None and not _is(kind, value):
        return path, f"expected {_expected(schema)}, got {_describe(value)}"
    if kind == "object" and isinstance(value, Mapping):
        properties: Mapping[str, Schema] = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            where = f"{path}.{key}"
            if key in properties:
                found_problem = problem(properties[key], item, where)
            elif extra is False:
                known = ", ".join(properties) or "none"
                return where, f"is not a field of {schema.get('title', 'the input')} " \
                              f"(fields: {known})"
            elif isinstance(extra, dict):
                found_problem = problem(extra, item, where)
            else:
                found_problem = None
            if found_problem:
                return found_problem
        for name in schema.get("required", ()):  # after unknown fields: a typo says so
            if name not in value:
                return f"{path}.{name}", "is required and missing"
    if kind == "array" and isinstance(value, list | tuple) and "items" in schema:
        for index, item in enumerate(value):
            found_problem = problem(schema["items"], item, f"{path}[{index}]")
            if found_problem:
                return found_problem
    return None


def _is(kind: str, value: Any) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "object":
        return isinstance(value, Mapping)
    return True


def _expected(schema: Schema) -> str:
    if "anyOf" in schema:
        return " or ".join(_expected(option) for option in schema["anyOf"])
    if "enum" in schema:
        return f"one of {schema['enum']}"
    kind = schema.get("type", "any value")
    return f"an {kind}" if kind in ("integer", "array", "object") else \
        ("null" if kind == "null" else f"a {kind}")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def convert(tp: Any, payload: Any) -> Any:
    """A checked payload as the step's declared type (a model, a dataclass; a TypedDict
    stays the dict it is). A value that already has the type is returned as it is."""
    if payload is None or not isinstance(tp, type) or is_typeddict(tp) or \
            isinstance(payload, tp) or not isinstance(payload, Mapping):
        return payload
    if is_pydantic_model(tp):
        return getattr(tp, "model_validate")(payload)  # noqa: B009 - pydantic's own
    if dataclasses.is_dataclass(tp):
        from .edits import convert_value

        return convert_value(payload, tp)
    return payload


def template(schema: Schema) -> Any:
    """A payload to start the inspector's form from: the declared defaults, and for each
    other field an empty value of its type; nothing the schema does not declare."""
    if "default" in schema:
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0] if schema["enum"] else None
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        return template(options[0]) if options else None
    kind = schema.get("type")
    if kind == "object":
        return {name: template(sub) for name, sub in schema.get("properties", {}).items()}
    return {"boolean": False, "integer": 0, "number": 0, "string": "", "array": []}.get(
        str(kind))


__all__ = ["convert", "is_schema_type", "json_schema", "plain", "problem", "template"]
