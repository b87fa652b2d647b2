"""A schedule's slots: the instants its cron expression or interval names.

Cron expressions are read by cronsim (healthchecks' parser) in the
schedule's IANA time zone, five fields or six (seconds first), and across a
DST change they behave as Debian's cron does, which cronsim follows:

- clocks going forward: a time in the skipped hour that names one hour
  (``30 2 * * *``) fires at the first instant after the change (03:00); a
  frequent expression (``*/20 * * * *``) skips the slots that did not exist;
- clocks going back: a time in the repeated hour that names one hour fires
  once, at its first occurrence; a frequent expression fires in both passes
  of the hour (each pass's 02:20 is an instant of its own).

An interval's slots are aligned to the Unix epoch (every 3600 s: on the
hour, UTC), so every scheduler computes the same ones. Slots are UTC
instants: a slot's identity is the instant, whatever the local clock says.
"""

import functools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError
from django.core.exceptions import ValidationError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.cache
def _zone_names() -> frozenset[str]:
    """The IANA zones: not ``right/…`` (leap seconds), which ``ZoneInfo``
    also opens and whose clock runs seconds off."""
    return frozenset(available_timezones())


def check_timing(cron: str, interval_seconds: int | None, time_zone: str) -> None:
    """Refuse, naming the field, a timing no slot can be computed from."""
    if bool(cron) == (interval_seconds is not None):
        raise ValidationError({"cron": "give a cron expression or an interval, one of the two"})
    try:
        if time_zone not in _zone_names():
            raise ZoneInfoNotFoundError(time_zone)
        zone = ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError(
            {"time_zone": f"{time_zone!r} is no IANA time zone (Europe/Berlin, UTC, …)"}
        ) from None
    if cron:
        try:
            next(CronSim(cron, datetime.now(zone)))
        except CronSimError as error:
            raise ValidationError({"cron": f"{cron!r}: {error}"}) from None
        except StopIteration:
            raise ValidationError(
                {"cron": f"{cron!r} names no time in the next 50 years"}
            ) from None
    elif interval_seconds < 1:
        raise ValidationError({"interval_seconds": "an interval is at least 1 second"})


def slots_after(schedule, after: datetime) -> Iterator[datetime]:
    """The schedule's slots after ``after``, in order, as UTC instants
    (endless but for a cron expression that names no more times). Only
    later instants: cronsim, started in the second pass of a repeated
    hour, may name the first pass's time first."""
    if not schedule.cron:
        step = schedule.interval_seconds
        elapsed = int((after - _EPOCH).total_seconds()) // step + 1
        while True:
            yield _EPOCH + timedelta(seconds=elapsed * step)
            elapsed += 1
    zone = ZoneInfo(schedule.time_zone)
    last = after
    for local in CronSim(schedule.cron, after.astimezone(zone)):
        slot = local.astimezone(UTC)
        if slot > last:
            last = slot
            yield slot


def slots_back_from(schedule, until: datetime) -> Iterator[datetime]:
    """The schedule's slots at or before ``until``, newest first."""
    if not schedule.cron:
        step = schedule.interval_seconds
        elapsed = int((until - _EPOCH).total_seconds()) // step
        while elapsed >= 0:
            yield _EPOCH + timedelta(seconds=elapsed * step)
            elapsed -= 1
        return
    zone = ZoneInfo(schedule.time_zone)
    last = until + timedelta(microseconds=1)
    # From just after ``until``: cronsim's reverse names no time equal to its start.
    for local in CronSim(schedule.cron, last.astimezone(zone), reverse=True):
        slot = local.astimezone(UTC)
        if slot < last:
            last = slot
            yield slot


def slots_between(schedule, after: datetime, until: datetime, *, limit: int) -> list[datetime]:
    """The slots in (``after``, ``until``], at most the first ``limit``."""
    found = []
    for slot in slots_after(schedule, after):
        if slot > until or len(found) >= limit:
            break
        found.append(slot)
    return found


def count_between(schedule, after: datetime, until: datetime, *, limit: int) -> int:
    """How many slots are in (``after``, ``until``], counting up to
    ``limit`` (an interval's by arithmetic: no limit)."""
    if until <= after:
        return 0
    if not schedule.cron:
        step = schedule.interval_seconds
        first = int((after - _EPOCH).total_seconds()) // step + 1
        last = int((until - _EPOCH).total_seconds()) // step
        return max(0, last - first + 1)
    return len(slots_between(schedule, after, until, limit=limit))


def is_slot(schedule, instant: datetime) -> bool:
    """Whether ``instant`` is one of the schedule's slots (as it is timed now)."""
    return next(slots_after(schedule, instant - timedelta(microseconds=1)), None) == instant


def next_slots(schedule, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` slots after ``after`` (what the pages show)."""
    found = []
    for slot in slots_after(schedule, after):
        found.append(slot)
        if len(found) >= count:
            break
    return found
