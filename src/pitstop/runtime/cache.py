"""Results cached across runs: ``CachePolicy``, cache keys, and computing a key once.

A key is the step's (or ``ctx.cached`` call's) name, a hash of the declared inputs and a
code version. The inputs are hashed by their canonical serialisation with pitstop's own
serialiser (registered types included; mappings and sets in a sorted order), never by
``repr``: equal values give equal keys in any process. The code version is a hash of the
function's source unless ``version=`` says otherwise. ``key=`` replaces all of it.

Computing a key is *single flight* (see :mod:`pitstop.store.cache`): the first claimant
computes it while renewing its claim; the others wait, up to ``CachePolicy.wait`` seconds,
and take the result (or the claim, if the computation failed or its process died).
"""

from __future__ import annotations

import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import CacheKeyError, PitstopError
from ..ids import new_id
from .leases import owner_id


@dataclass(frozen=True)
class CachePolicy:
    """Serve a step from a result cached by any run (``@wf.step(cache=CachePolicy(...))``).

    ``inputs`` names the state fields the step's result depends on (None: the whole state);
    the step's delivered inputs (``wait_for``) are always part of the key. ``ttl`` (seconds
    or a timedelta) expires a result; ``version`` replaces the default code version (a hash
    of the step function's source); ``key(state)`` computes the key's input part instead of
    the declared fields (its value is hashed canonically too). ``wait`` bounds how long a
    run waits for another worker computing the same key before computing it itself;
    ``lease`` is how long a claim outlives a process that died while computing.
    """

    inputs: Sequence[str] | None = None
    ttl: float | timedelta | None = None
    version: str | None = None
    key: Callable[..., Any] | None = None
    wait: float = 600.0
    lease: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):
            object.__setattr__(self, "inputs", (self.inputs,))
        elif self.inputs is not None:
            object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError("CachePolicy ttl must be positive (or None: never expires)")
        if self.wait < 0 or self.lease <= 0:
            raise ValueError("CachePolicy wait must be >= 0 and lease > 0")

    @property
    def seconds(self) -> float | None:
        """``ttl`` in seconds (None: never expires)."""
        ttl = self.ttl
        return ttl.total_seconds() if isinstance(ttl, timedelta) else ttl


# -- keys ------------------------------------------------------------------------------------

_SOURCES: dict[object, str] = {}  # code object -> source hash


def code_version(fn: Callable[..., Any]) -> str:
    """A hash of ``fn``'s source (its bytecode and constants if the source is unavailable)."""
    func = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(func, "__code__", None)
    known = _SOURCES.get(code) if code is not None else None
    if known is not None:
        return known
    try:
        text = inspect.getsource(func).encode()
    except (OSError, TypeError):
        text = repr((getattr(code, "co_code", b""), getattr(code, "co_consts", ()),
                     getattr(func, "__qualname__", type(fn).__qualname__))).encode()
    known = hashlib.sha256(text).hexdigest()[:16]
    if code is not None:
        if len(_SOURCES) > 4096:
            _SOURCES.clear()
        _SOURCES[code] = known
    return known


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


class _Hasher:
    """Feeds a value's canonical serialisation into a hash, part by part."""

    _serializer: Any = None  # pitstop's msgpack over the default registry, made once

    def __init__(self) -> None:
        if _Hasher._serializer is None:
            from ..serde import MsgpackSerializer

            _Hasher._serializer = MsgpackSerializer()
        self.dumps: Callable[[Any], bytes] = _Hasher._serializer.dumps
        self.hash = hashlib.sha256()

    def feed(self, value: Any) -> None:
        update = self.hash.update
        if type(value) in _SCALARS:  # the common case, without the ABC checks below
            data = self.dumps(value)
            update(b"V%d:" % len(data))
            update(data)
        elif isinstance(value, Mapping):
            items = sorted((self.dumps(k), v) for k, v in value.items())
            update(b"M%d:" % len(items))
            for key, item in items:
                update(key)
                self.feed(item)
        elif isinstance(value, list | tuple):
            update((b"L%d:" if isinstance(value, list) else b"T%d:") % len(value))
            for item in value:
                self.feed(item)
        elif isinstance(value, set | frozenset):
            members = sorted(self._digest(item) for item in value)
            update(b"S%d:" % len(members))
            for member in members:
                update(member)
        else:
            data = self.dumps(value)
            update(b"V%d:" % len(data))
            update(data)

    def _digest(self, value: Any) -> bytes:
        inner = _Hasher()
        inner.feed(value)
        return inner.hash.digest()


def input_digest(
    parts: Iterable[tuple[str, Any]], *, run_id: str | None, step: str, what: str = "field"
) -> str:
    """The hash of named values (their canonical serialisation); an unserialisable one is a
    :class:`~pitstop.CacheKeyError` naming the step and the field."""
    hasher = _Hasher()
    for name, value in parts:
        hasher.hash.update(name.encode() + b"=")
        try:
            hasher.feed(value)
        except (PitstopError, TypeError, ValueError, OverflowError) as exc:
            raise CacheKeyError(
                f"cannot hash {what} {name!r} for the cache key: "
                f"{type(value).__name__} has no canonical serialisation ({exc}); register its "
                "type (pitstop.register) or give the CachePolicy a key=",
                run_id=run_id, step=step, field=name,
            ) from None
    return hasher.hash.hexdigest()


def step_key(
    workflow: str,
    step: str,
    fn: Callable[..., Any],
    policy: CachePolicy,
    fields: Mapping[str, Any],
    view: Any,
    inputs: Mapping[str, Any],
    run_id: str,
) -> str:
    """The cache key of a step about to run over ``fields`` with delivered ``inputs``."""
    version = policy.version if policy.version is not None else code_version(fn)
    parts: list[tuple[str, Any]]
    if policy.key is not None:
        parts = [("key()", policy.key(view))]
    else:
        names = sorted(fields) if policy.inputs is None else policy.inputs
        parts = [(name, fields.get(name)) for name in names]
    parts.extend((f"input:{name}", value) for name, value in sorted(inputs.items()))
    digest = input_digest(parts, run_id=run_id, step=step)
    return f"step:{workflow}:{step}:{version}:{digest}"


def call_key(
    name: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    version: str | None,
    key: Callable[..., Any] | None,
    run_id: str,
    step: str,
) -> str:
    """The cache key of ``ctx.cached(name, fn, *args, **kwargs)``."""
    code = version if version is not None else code_version(fn)
    if key is not None:
        parts: list[tuple[str, Any]] = [("key()", key(*args, **kwargs))]
    else:
        parts = [(f"argument {i}", value) for i, value in enumerate(args)]
        parts.extend((f"argument {k}", kwargs[k]) for k in sorted(kwargs))
    digest = input_digest(parts, run_id=run_id, step=step, what="the value of")
    return f"call:{name}:{code}:{digest}"


# -- claims ----------------------------------------------------------------------------------


def claim_owner() -> str:
    """An owner unique to one claim: two runs of one process never share a claim."""
    return f"{owner_id()}/{new_id()}"


class Renewal:
    """Keeps a claim alive (a thread renewing it every third of its lease) while the claimed
    result is computed; stopped when it is stored or abandoned."""

    def __init__(self, store: Any, key: str, owner: str, lease: float) -> None:
        self.store, self.key, self.owner, self.lease = store, key, owner, lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="pitstop-cache-claim",
                                        daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                if not self.store.cache_renew(self.key, self.owner, lease=self.lease):
                    return
            except PitstopError:
                continue  # the next renewal tries again; the lease outlasts two misses

    def stop(self) -> None:
        self._stop.set()


class Waiting:
    """How long a claimant waiting for another's computation sleeps between looks: from
    20 ms doubling to 500 ms, until ``wait`` seconds have passed."""

    def __init__(self, wait: float) -> None:
        self.deadline = time.monotonic() + wait
        self.delay = 0.02

    def next_delay(self) -> float | None:
        """Seconds to sleep before looking again; None once the wait is over."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        delay, self.delay = min(self.delay, left), min(self.delay * 2, 0.5)
        return delay


__all__ = [
    "CachePolicy",
    "Renewal",
    "Waiting",
    "call_key",
    "claim_owner",
    "code_version",
    "input_digest",
    "step_key",
]
