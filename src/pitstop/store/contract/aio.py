"""The asyncio face of a store: the same methods, awaitable, run off the event loop.

Every store call is short and blocking (a SQLite transaction, a PostgreSQL round trip), so
the async API runs each call in a worker thread (``asyncio.to_thread``) rather than keeping a
second, async copy of every backend that would drift from the first. Stores are thread-safe,
so many coroutines may use one at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

from .base import Store

P = ParamSpec("P")
R = TypeVar("R")


def _offload(
    method: Callable[Concatenate[Store, P], R],
) -> Callable[Concatenate[AsyncStore, P], Awaitable[R]]:
    name = method.__name__

    async def call(self: AsyncStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)
        return result

    functools.update_wrapper(call, method)
    return call


class AsyncStore:
    """``await store.aio.save(...)``: every :class:`~pitstop.Store` method, awaitable.

    ``sync`` is the underlying store, for the rare call that should stay synchronous.
    """

    def __init__(self, store: Store) -> None:
        self.sync = store
        self.url = store.url

    save = _offload(Store.save)
    save_request = _offload(Store.save_request)
    prepare = _offload(Store.prepare)
    prepare_request = _offload(Store.prepare_request)
    commit = _offload(Store.commit)
    get = _offload(Store.get)
    get_many = _offload(Store.get_many)
    latest = _offload(Store.latest)
    latest_with_run = _offload(Store.latest_with_run)
    summary = _offload(Store.summary)
    summaries = _offload(Store.summaries)
    history = _offload(Store.history)
    fork = _offload(Store.fork)
    create_run = _offload(Store.create_run)
    get_run = _offload(Store.get_run)
    runs = _offload(Store.runs)
    children = _offload(Store.children)
    children_summary = _offload(Store.children_summary)
    start_children = _offload(Store.start_children)
    start_run = _offload(Store.start_run)
    count_runs = _offload(Store.count_runs)
    update_run = _offload(Store.update_run)
    delete_run = _offload(Store.delete_run)
    delete_checkpoints = _offload(Store.delete_checkpoints)
    export_run = _offload(Store.export_run)
    import_run = _offload(Store.import_run)
    prune = _offload(Store.prune)
    stats = _offload(Store.stats)
    verify = _offload(Store.verify)
    migrate = _offload(Store.migrate)
    acquire = _offload(Store.acquire)
    renew = _offload(Store.renew)
    release = _offload(Store.release)
    claim = _offload(Store.claim)
    wait_for_work = _offload(Store.wait_for_work)
    send = _offload(Store.send)
    inputs = _offload(Store.inputs)
    get_effect = _offload(Store.get_effect)
    record_effect = _offload(Store.record_effect)
    record_effect_first = _offload(Store.record_effect_first)
    record_effects = _offload(Store.record_effects)
    effects = _offload(Store.effects)
    attach = _offload(Store.attach)
    attachments = _offload(Store.attachments)
    cache_get = _offload(Store.cache_get)
    cache_claim = _offload(Store.cache_claim)
    cache_renew = _offload(Store.cache_renew)
    cache_abandon = _offload(Store.cache_abandon)
    cache_put = _offload(Store.cache_put)
    cache_entries = _offload(Store.cache_entries)
    cache_clear = _offload(Store.cache_clear)
    schedule_put = _offload(Store.schedule_put)
    schedule_rows = _offload(Store.schedule_rows)
    schedule_input = _offload(Store.schedule_input)
    schedule_delete = _offload(Store.schedule_delete)
    schedule_pause = _offload(Store.schedule_pause)
    schedule_advance = _offload(Store.schedule_advance)
    close = _offload(Store.close)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncStore({self.sync!r})"


__all__ = ["AsyncStore"]
