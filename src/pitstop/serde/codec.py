"""The safe default serialiser: MessagePack (ormsgpack) plus pitstop's extension types.

Two paths share one table of encoders and decoders:

* The fast path lets ormsgpack walk the value in Rust and calls back into Python only for the
  values it does not know (tuples, datetimes, dataclasses...). It cannot tell *where* a problem
  is, and it cannot handle dicts with non-str keys, so on any failure the value goes to
* the slow path, which walks the value in Python and converts it into a tree ormsgpack packs
  natively. It writes the same bytes, and it is what names the path of an unsupported value.

Decoding mirrors this: ``ext_hook`` rebuilds values bottom-up, and only when that fails is the
blob walked again top-down to name the path of the culprit.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import ormsgpack

from pitstop.errors import MalformedValueError, SerializationError, UnregisteredTypeError

from . import buffers
from .base import UnknownObject, type_name_of
from .buffers import Parts
from .exttypes import (
    DECODERS,
    DIRECT,
    Children,
    Decoding,
    ExtCode,
    Tracked,
    attr_segment,
    encoder_for,
    expect,
    key_segment,
)
from .registry import Kind, Registration, TypeRegistry, default_registry

_PASSTHROUGH: Final = (
    ormsgpack.OPT_PASSTHROUGH_BIG_INT
    | ormsgpack.OPT_PASSTHROUGH_DATACLASS
    | ormsgpack.OPT_PASSTHROUGH_DATETIME
    | ormsgpack.OPT_PASSTHROUGH_SUBCLASS
    | ormsgpack.OPT_PASSTHROUGH_TUPLE
    | ormsgpack.OPT_PASSTHROUGH_ENUM
    | ormsgpack.OPT_PASSTHROUGH_UUID
)
# Types packed natively, exactly, when nothing inside them needs the hook.
_PLAIN: Final = frozenset({dict, list, str, int, float, bool, type(None), bytes})
_CONTAINERS: Final = frozenset({dict, list})
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1

MAX_DEPTH: Final = 255
"""How deeply extension values (tuples, sets, objects...) may nest inside one another.

ormsgpack caps plain list/dict nesting at this depth itself; extension values are packed one
call per level, so the cap is pitstop's to keep. Decoding an extension level costs Python
stack frames, and a value that saved must always load: deeper values are refused at save
time, where the error can name the path, and never written."""


class _Framing:
    """Where a msgpack object ends is known only by walking it; ormsgpack does not say and
    ignores whatever follows. msgspec's decoder into Raw walks the structure in C without
    building any object (about a tenth of the decoding time) and refuses trailing bytes.
    Imported on the first load (~30 ms), so commands that never load a value skip it."""

    check: Callable[[bytes], object] | None = None
    error: type[Exception] = Exception

    @classmethod
    def load(cls) -> Callable[[bytes], object]:
        import msgspec

        cls.error = msgspec.DecodeError
        cls.check = msgspec.msgpack.Decoder(msgspec.Raw).decode
        return cls.check


def _unpack_exact(data: bytes, ext_hook: Callable[[int, bytes], object]) -> Any:
    """``ormsgpack.unpackb``, refusing data with bytes after the end of its one object:
    pitstop never writes any, so they mean the record was altered (or crafted)."""
    check = _Framing.check or _Framing.load()
    try:
        check(data)
    except _Framing.error as exc:
        raise MalformedValueError(f"not a valid msgpack blob ({exc})") from None
    return ormsgpack.unpackb(data, ext_hook=ext_hook)


class _TooDeep(Exception):
    """Nesting past MAX_DEPTH met on the fast path: the slow path names where."""


_TOO_DEEP: Final = (
    f"the value is nested too deeply: at most {MAX_DEPTH} tuples, sets, objects and other "
    "values that are not lists or str-keyed dicts may be nested inside one another"
)


# -- encoding: fast path and slow path -----------------------------------------------------------


def _holds_raw_buffer(roots: list[Any]) -> bool:
    """Whether ormsgpack packed a bytearray or memoryview somewhere in ``roots`` as plain bytes.

    ormsgpack packs both natively (it has no passthrough option for them), and they would load
    back as ``bytes``. Only the list/dict skeleton that ormsgpack walked itself needs checking:
    everything else went through the hook. ``gc.get_referents`` lists a container's items in C,
    so a level of plain scalars costs no Python-level loop.
    """
    level = roots
    while level:
        kinds = set(map(type, level))
        if bytearray in kinds or memoryview in kinds:
            return True
        if list not in kinds and dict not in kinds:
            return False
        if not kinds <= _SKELETON:
            level = list(itertools.compress(level, map(_SKELETON.__contains__, map(type, level))))
        level = gc.get_referents(*level)
    return False


_SKELETON: Final = frozenset({list, dict})


def _bin_header_from(packed: bytes, start: int) -> bool:
    """Whether ``packed[start:]`` holds a byte that begins a msgpack bin (0xc4-0xc6): where
    none does, ormsgpack packed no bytearray or memoryview (one memchr pass per byte).

    From the start, an int ``in`` the bytes: a memchr and nothing else (~0.3k instructions
    each, callgrind). ``find`` first parses its arguments against a format string (~1.3k
    each), and is used only past ``start``, where a slice would copy a large value. (Never
    ``bytes in bytes``: it tries the needle as an int first and formats, then clears, a
    TypeError every time, ~2.5k.)"""
    if start == 0:
        return 0xC4 in packed or 0xC5 in packed or 0xC6 in packed
    return (
        packed.find(b"\xc4", start) >= 0
        or packed.find(b"\xc5", start) >= 0
        or packed.find(b"\xc6", start) >= 0
    )


class _Collected(Children):
    """Fast-path children, passed through untouched but remembered.

    They are the roots of the skeletons ormsgpack packs inside extension payloads; one scan
    over them after packing finds a bytearray anywhere in the value.
    """

    __slots__ = ("roots",)

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Any] = []

    def seq(self, items: Iterable[Any]) -> list[Any]:
        out = super().seq(items)
        self.roots.append(out)
        return out

    def members(self, items: Iterable[Any]) -> list[Any]:
        out = super().members(items)
        self.roots.append(out)
        return out

    def attrs(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        out = super().attrs(fields)
        self.roots.append(out)
        return out

    def inner(self, value: Any) -> Any:
        self.roots.append(value)
        return value


class _FastEncoder:
    """One ``dumps`` call on the fast path; any failure sends the value to the slow path."""

    __slots__ = ("_depth", "_hook", "_kids", "_registry", "interrupt")

    def __init__(self, registry: TypeRegistry) -> None:
        self._registry = registry
        self._kids = _Collected()
        self._hook = self.hook
        self._depth = 0
        # ormsgpack turns whatever the hook raises into a TypeError; a KeyboardInterrupt must
        # not be mistaken for an unsupported value, so it is kept here and re-raised.
        self.interrupt: BaseException | None = None

    def dumps(self, value: object) -> bytes | None:
        """The encoded value, or None if it holds a bytearray the slow path must handle."""
        out = ormsgpack.packb(value, default=self._hook, option=_PASSTHROUGH)
        # Any bytearray was packed as msgpack bin; without a bin marker byte there is none.
        if _bin_header_from(out, 0):
            roots = [value]
            roots.extend(self._kids.roots)
            if _holds_raw_buffer(roots):
                return None
        return out

    def hook(self, value: object) -> ormsgpack.Ext:
        try:
            encoder, reg = encoder_for(type(value), self._registry)
            code, payload = encoder(value, self._kids, reg)
            if self._depth >= MAX_DEPTH:
                raise _TooDeep
            self._depth += 1
            try:
                packed = ormsgpack.packb(payload, default=self._hook, option=_PASSTHROUGH)
            finally:
                self._depth -= 1
            return ormsgpack.Ext(code, packed)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.interrupt = exc
            raise


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Walker:
    """One ``dumps`` call on the slow path: converts the value into a natively packable tree."""

    __slots__ = ("_depth", "_open", "_registry")

    def __init__(self, registry: TypeRegistry) -> None:
        self._registry = registry
        self._open: set[int] = set()  # ids of the containers being converted: cycle detection
        self._depth = 0  # extension values being converted, one inside the other

    def convert(self, value: Any, path: str) -> object:
        cls = type(value)
        if cls is str:
            return value if _utf8(value) else self._ext(value, cls, path)
        if cls is int:
            return value if _INT_MIN <= value <= _INT_MAX else self._ext(value, cls, path)
        if cls is float or cls is bool or cls is bytes or value is None:
            return value
        if cls is list:
            self._enter(value, path)
            try:
                return [self.convert(item, f"{path}[{i}]") for i, item in enumerate(value)]
            finally:
                self._open.discard(id(value))
        if cls is dict and all(type(key) is str and _utf8(key) for key in value):
            self._enter(value, path)
            try:
                return {k: self.convert(v, f"{path}{attr_segment(k)}") for k, v in value.items()}
            finally:
                self._open.discard(id(value))
        return self._ext(value, cls, path)

    def _enter(self, value: object, path: str) -> None:
        if id(value) in self._open:
            raise SerializationError(
                "the value contains itself (a reference cycle), which cannot be stored",
                path=path,
                type_name=type_name_of(type(value)),
            )
        self._open.add(id(value))

    def _ext(self, value: object, cls: type, path: str) -> ormsgpack.Ext:
        if self._depth >= MAX_DEPTH:
            raise SerializationError(_TOO_DEEP, path=path, type_name=type_name_of(cls))
        self._enter(value, path)
        self._depth += 1
        try:
            encoder, reg = encoder_for(cls, self._registry)
            code, payload = encoder(value, Tracked(path, self.convert), reg)
            return ormsgpack.Ext(code, ormsgpack.packb(payload))
        except SerializationError as exc:
            if exc.path is not None:
                raise  # already located by a child
            type_name = exc.type_name or type_name_of(cls)
            raise type(exc)(exc.reason, path=path, type_name=type_name) from exc
        except RecursionError:
            raise
        except Exception as exc:
            raise SerializationError(
                f"{type(exc).__name__}: {exc}", path=path, type_name=type_name_of(cls)
            ) from exc
        finally:
            self._depth -= 1
            self._open.discard(id(value))


# -- decoders: payload -> value -----------------------------------------------------------------


class _RawExt:
    """An extension value not decoded yet: what the slow decoding path walks top-down."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        self.code = code
        self.data = data


class _Decoder:
    """One ``loads`` call: the fast bottom-up ``ext_hook`` and the slow top-down walk."""

    __slots__ = ("buffers", "failure", "hook", "registry", "strict")

    def __init__(
        self, registry: TypeRegistry, strict: bool, buffers: Sequence[Any] | None = None
    ) -> None:
        self.registry = registry
        self.strict = strict
        self.buffers = buffers
        # ormsgpack replaces whatever ext_hook raises by ValueError("ext_hook failed"), so the
        # first real exception is kept here.
        self.failure: BaseException | None = None
        self.hook = self._fast_hook

    def _fast_hook(self, code: int, data: bytes) -> object:
        try:
            return self.decode_ext(code, data, DIRECT, self.hook)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            raise

    def locate(self, data: bytes) -> object:
        """Decode again, top-down, so that an error names the path where it happened."""
        try:
            tree = _unpack_exact(data, _RawExt)
        except MalformedValueError as exc:
            raise exc.located(path="") from None
        except Exception as exc:
            raise MalformedValueError(f"not a valid msgpack blob ({exc})", path="") from exc
        try:
            return self._resolve(tree, "")
        except RecursionError as exc:
            raise SerializationError(
                "the value is nested too deeply", path="", action="load"
            ) from exc

    def _resolve(self, item: Any, path: str) -> object:
        cls = type(item)
        if cls is _RawExt:
            return self.decode_ext(item.code, item.data, Decoding(path, self._resolve), _RawExt)
        if cls is list:
            return [self._resolve(x, f"{path}[{i}]") for i, x in enumerate(item)]
        if cls is dict:
            return {k: self._resolve(v, f"{path}{key_segment(k)}") for k, v in item.items()}
        return item

    def decode_ext(
        self, code: int, data: bytes, kids: Children, ext_hook: Callable[[int, bytes], object]
    ) -> object:
        decoder = DECODERS.get(code)
        if decoder is None:
            if not self.strict:
                return UnknownObject(f"pitstop.ext.{code}", {"data": data})
            raise SerializationError(
                f"unknown extension type code {code} (written by a newer pitstop?)",
                path=kids.path,
                action="load",
            )
        try:
            return decoder(_unpack_exact(data, ext_hook), kids, self)
        except SerializationError as exc:
            if exc.path is not None or kids.path is None:
                raise exc.located(action="load") from None
            raise type(exc)(
                exc.reason, path=kids.path, type_name=exc.type_name, action="load"
            ) from exc
        except RecursionError:
            raise
        except Exception as exc:
            raise SerializationError(
                f"malformed {ExtCode(code).name.lower()} value ({type(exc).__name__}: {exc})",
                path=kids.path,
                action="load",
            ) from exc

    def lookup(self, stored_name: object, kind: Kind, kids: Children) -> Registration | None:
        """The registered class called ``name``; the allowlist check of every load."""
        name: str = expect(stored_name, str)
        reg = self.registry.lookup(name)
        if reg is None:
            if not self.strict:
                return None
            raise UnregisteredTypeError(
                f"the stored value is a {name}, which is not registered in this process; "
                + self.registry.why_missing(name),
                path=kids.path,
                type_name=name,
            )
        if reg.kind is not kind:
            raise SerializationError(
                f"{name} was stored as {kind.value} but is now registered as {reg.kind.value}",
                path=kids.path,
                type_name=name,
            )
        return reg


# -- the serialiser -----------------------------------------------------------------------------


class MsgpackSerializer:
    """The default serialiser: compact, fast, and safe to load from an untrusted store.

    Values keep their exact types across a round trip. Classes are rebuilt only when they are
    registered in ``registry`` (the default registry unless one is given), and loading never
    imports a module or calls anything the registry does not name.
    """

    format_id: int = 0
    name: str = "msgpack"

    def __init__(self, registry: TypeRegistry | None = None) -> None:
        self.registry = default_registry if registry is None else registry

    def dumps(self, value: object) -> bytes:
        """Encode ``value``; a ``SerializationError`` names the path and type it cannot store."""
        cls = type(value)
        if cls in _PLAIN:
            # Plain data (the common case) in one call into ormsgpack, with no hook: anything
            # it cannot pack natively with exact types raises TypeError and takes the full
            # path below, which knows every supported type.
            try:
                out = ormsgpack.packb(value, option=_PASSTHROUGH)
            except TypeError:
                pass
            else:
                if cls not in _CONTAINERS or not (
                    _bin_header_from(out, 0) and _holds_raw_buffer([value])
                ):
                    return out
        fast = _FastEncoder(self.registry)
        encoded: bytes | None
        try:
            encoded = fast.dumps(value)
        except Exception:
            if fast.interrupt is not None:
                raise fast.interrupt from None
            encoded = None
        return self._dumps_slowly(value) if encoded is None else encoded

    def dumps_unchecked(self, value: object) -> bytes | None:
        """A list's or dict's plain-data encoding, before :meth:`dumps` checks it for raw
        buffers; None if it is not plain data (then call :meth:`dumps`). For a caller that
        knows part of the bytes holds none (a chunked value's prefix, equal to the parent
        version's): :meth:`checked` then scans only the rest."""
        if type(value) not in _CONTAINERS:
            return None
        try:
            return ormsgpack.packb(value, option=_PASSTHROUGH)
        except TypeError:
            return None

    def checked(self, value: object, packed: bytes, start: int) -> tuple[bytes, bool]:
        """``value``'s :meth:`dumps` given ``packed`` (its :meth:`dumps_unchecked`) and
        that ``packed[:start]`` holds no bin header byte, and whether ``packed[start:]``
        holds none either. Scanning a 4 MiB conversation for the three bytes is three passes
        over it, a third of ormsgpack's own time to pack it."""
        if not _bin_header_from(packed, start):
            return packed, True
        if _holds_raw_buffer([value]):
            return self.dumps(value), False
        return packed, False

    def _dumps_slowly(self, value: object) -> bytes:
        try:
            return ormsgpack.packb(_Walker(self.registry).convert(value, ""))
        except SerializationError:
            raise
        except RecursionError as exc:
            raise SerializationError(
                _TOO_DEEP, path="", type_name=type_name_of(type(value))
            ) from exc
        except Exception as exc:  # ormsgpack's own limits, e.g. nesting deeper than it allows
            raise SerializationError(
                f"msgpack encoding failed: {exc}", path="", type_name=type_name_of(type(value))
            ) from exc

    def dumps_parts(self, value: object, *, min_size: int = buffers.BUFFER_MIN) -> Parts:
        """``value`` as a skeleton and its large arrays' and tensors' bytes, uncopied (see
        :mod:`pitstop.serde.buffers`): what the store chunks and writes from where it is.
        The memoryviews share the arrays' memory: use them before the arrays change."""
        found: list[memoryview] = []
        tree = buffers.split_buffers(value, found, min_size)
        return Parts(self.dumps(tree), found)

    def loads_parts(
        self, skeleton: bytes, parts: Sequence[Any], *, strict: bool = True
    ) -> object:
        """The value from :meth:`dumps_parts`'s skeleton and one buffer per part, in order.
        Arrays and tensors are built on those buffers without a copy: pass writable ones
        (``bytearray``) that nothing else uses."""
        return self._loads(skeleton, strict, parts)

    def loads(self, data: bytes, *, strict: bool = True) -> object:
        """Decode ``data``; ``strict=False`` gives ``UnknownObject`` for unregistered classes."""
        return self._loads(data, strict, None)

    def _loads_lists(self, lists: Iterable[bytes], *, strict: bool = True) -> list[object]:
        """The items of ``lists`` (each the bytes of one encoded list) in one list: what
        :meth:`loads` gives for the one list of all their items, decoded a piece at a time.
        Raises on whatever the fast decode refuses, with no path named: decode the whole
        with :meth:`loads` then for the error."""
        decoder = _Decoder(self.registry, strict, None)
        out: list[object] = []
        for data in lists:
            items = _unpack_exact(data, decoder.hook)
            if type(items) is not list:
                raise MalformedValueError("not a list")
            out.extend(items)
        return out

    def _loads(self, data: bytes, strict: bool, parts: Sequence[Any] | None) -> object:
        decoder = _Decoder(self.registry, strict, parts)
        try:
            return _unpack_exact(data, decoder.hook)
        except Exception:
            failure = decoder.failure
            if failure is not None and not isinstance(failure, Exception):
                raise failure from None
        return decoder.locate(data)

    def __repr__(self) -> str:
        return f"MsgpackSerializer(registry with {len(self.registry)} classes)"


__all__ = ["ExtCode", "MsgpackSerializer"]
