"""Schedules: a workflow started on a cron expression, one run per tick, by any worker.

``wf.schedule(store, "nightly", cron="0 2 * * *", timezone="Europe/Berlin", input={...})``
stores the schedule; every :class:`~pitstop.Worker` serving the workflow looks at it (at most
every second) and enqueues the runs of the ticks that fell due. **Exactly one run per
tick**, whatever the number of workers and however they crash: a tick's run id is derived
from the schedule and the tick (``nightly@20261205T010000Z``), and enqueuing an id that
exists converges on that run; the schedule's next tick moves only after its runs were
enqueued, by compare-and-set, so a worker killed in between leaves the tick to the next one.

``catchup`` says what happens to ticks that fell due while no worker looked: ``"all"``
starts a run for each, ``"latest"`` for the newest only, ``"none"`` for those at most
:data:`GRACE` seconds late. ``overlap`` is for a tick that falls while the schedule's
previous run is still queued, running or waiting: ``"skip"`` drops the tick, ``"queue"``
holds it until that run stopped, ``"allow"`` starts it anyway.

Cron expressions are read by `cronsim <https://github.com/cuu508/cronsim>`_ (five fields,
or six with a leading seconds field), in the schedule's timezone (IANA names, via
:mod:`zoneinfo`; DST gaps and repeats as cronsim defines them).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..errors import RunExistsError, ScheduleError
from ..logfmt import kv
from ..model import RunStatus

if TYPE_CHECKING:
    from ..store import Store
    from ..store.engine.schema import ScheduleRow
    from .workflow import Workflow

log = logging.getLogger("pitstop.schedule")

Catchup = Literal["none", "latest", "all"]
Overlap = Literal["skip", "queue", "allow"]
CATCHUP = ("none", "latest", "all")
OVERLAP = ("skip", "queue", "allow")
GRACE = 60.0
"""Seconds a tick may be late and still start with ``catchup="none"``."""
MAX_TICKS = 1000
"""Ticks one look starts at most (``catchup="all"`` after a long outage): the rest follow."""
_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)


@dataclass(frozen=True)
class Schedule:
    """A stored schedule, as :meth:`Workflow.schedule` and :func:`schedules` return it."""

    name: str
    workflow: str
    cron: str
    timezone: str
    catchup: str
    overlap: str
    paused: bool
    next_tick: datetime
    """The first tick not started yet (UTC)."""
    last_run: str | None

    @classmethod
    def of(cls, row: ScheduleRow) -> Schedule:
        return cls(row.name, row.workflow, row.cron, row.timezone, row.catchup, row.overlap,
                   bool(row.paused), datetime.fromtimestamp(row.next_tick, UTC), row.last_run)

    def upcoming(self, count: int = 5) -> list[datetime]:
        """The next ``count`` ticks from now, in the schedule's timezone."""
        tz = zone(self.timezone, self.name)
        out: list[datetime] = []
        at = max(time.time(), self.next_tick.timestamp() - 1e-6)
        for _ in range(count):
            at = tick_after(self.cron, self.timezone, at, self.name)
            out.append(datetime.fromtimestamp(at, tz))
        return out


def zone(name: str, schedule: str) -> Any:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"timezone {name!r} does not exist ({exc})",
                            schedule=schedule) from None


def _cronsim(cron: str, start: datetime, schedule: str) -> Any:
    try:
        from cronsim import CronSim, CronSimError
    except ImportError as exc:
        raise ScheduleError(f"schedules need the schedule extra: pip install "
                            f"'pitstop[schedule]' ({exc})", schedule=schedule) from None
    try:
        return CronSim(cron, start)
    except CronSimError as exc:
        raise ScheduleError(f"cron expression {cron!r} does not parse: {exc}",
                            schedule=schedule) from None


def tick_after(cron: str, timezone: str, after: float, schedule: str) -> float:
    """The first tick strictly after ``after`` (epoch seconds)."""
    start = datetime.fromtimestamp(after, zone(timezone, schedule))
    tick = next(_cronsim(cron, start, schedule)).timestamp()
    if tick <= after:  # (cronsim starts at the next whole second; be sure)
        return tick_after(cron, timezone, tick + 0.5, schedule)
    return float(tick)


def run_id_for(name: str, tick: float) -> str:
    """The id of the run a schedule's tick starts: the same in every worker."""
    return f"{name}@{datetime.fromtimestamp(tick, UTC):%Y%m%dT%H%M%S}Z"


def add_schedule(
    store: Store, wf: Workflow, name: str, *, cron: str, timezone: str, input: Any,
    catchup: str, overlap: str,
) -> Schedule:
    """Validate and store a schedule (see :meth:`Workflow.schedule`)."""
    if not isinstance(name, str) or not name or len(name) > 200 or "@" in name:
        raise ScheduleError("a schedule's name must be 1-200 characters without '@'",
                            schedule=str(name))
    if catchup not in CATCHUP:
        raise ScheduleError(f"catchup must be one of {', '.join(CATCHUP)}, not {catchup!r}",
                            schedule=name)
    if overlap not in OVERLAP:
        raise ScheduleError(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}",
                            schedule=name)
    first = tick_after(cron, timezone, time.time(), name)  # refuses bad cron and timezone
    row = store.schedule_put(name, wf.name, cron, timezone, wf.adapter.fields_of(input),
                             catchup=catchup, overlap=overlap, next_tick=first)
    return Schedule.of(row)


def schedules(store: Store, *, workflows: list[str] | None = None) -> list[Schedule]:
    """The store's schedules by name (only those of ``workflows``)."""
    return [Schedule.of(row) for row in store.schedule_rows(workflows=workflows)]


def _busy(store: Store, row: ScheduleRow) -> bool:
    if row.overlap == "allow" or not row.last_run:
        return False
    try:
        return store.get_run(row.last_run).status in _ACTIVE
    except LookupError:
        return False


def fire_due(store: Store, workflows: Mapping[str, Workflow], now: float | None = None
             ) -> list[str]:
    """Enqueue the runs of every due tick of the schedules of ``workflows``; their ids."""
    started: list[str] = []
    for row in store.schedule_rows(workflows=list(workflows)):
        if row.paused:
            continue
        at = time.time() if now is None else now
        if row.next_tick > at:
            continue
        started += _fire(store, workflows[row.workflow], row, at)
    return started


def _fire(store: Store, wf: Workflow, row: ScheduleRow, now: float) -> list[str]:
    due = [row.next_tick]
    while len(due) < MAX_TICKS:
        later = tick_after(row.cron, row.timezone, due[-1], row.name)
        if later > now:
            break
        due.append(later)
    following = tick_after(row.cron, row.timezone, due[-1], row.name)
    if row.catchup == "latest":
        chosen = due[-1:]
    elif row.catchup == "none":
        chosen = [t for t in due if t >= now - GRACE]
    else:
        chosen = due
    if row.overlap != "allow" and chosen:
        if _busy(store, row):
            if row.overlap == "queue":
                return []  # held: the tick starts once the previous run stopped
            chosen = []  # skip: dropped
        else:
            # One at a time: the first starts; "queue" holds the next, "skip" drops the rest.
            if row.overlap == "queue" and len(chosen) > 1:
                following = chosen[1]
            chosen = chosen[:1]
    started = []
    payload = store.schedule_input(row) if chosen else None
    for tick in chosen:
        run_id = run_id_for(row.name, tick)
        # An id taken by other input (the schedule was redefined since): the tick has its run.
        with contextlib.suppress(RunExistsError):
            wf.enqueue(store, payload, run_id=run_id,
                       metadata={"schedule": row.name, "tick": tick})
        started.append(run_id)
    if store.schedule_advance(row.name, row.next_tick, following,
                              started[-1] if started else None):
        for run_id in started:
            log.info(kv(event="scheduled", schedule=row.name, run=run_id))
        skipped = len(due) - len(chosen)
        if skipped and row.overlap != "queue":
            log.info(kv(event="ticks_skipped", schedule=row.name, ticks=skipped,
                        catchup=row.catchup, overlap=row.overlap))
    return started


__all__ = ["CATCHUP", "GRACE", "OVERLAP", "Schedule", "add_schedule", "fire_due", "run_id_for",
           "schedules", "tick_after"]
