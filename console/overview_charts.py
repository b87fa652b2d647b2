"""The overview's charts, drawn on the server as inline SVG (no script, as
the spend chart): runs created per hour, stacked by where each is now, and
failed runs per hour, stacked by failure class, over the last 24 hours or
the last 7 days (``?window=7d``); and the window's runs by status and
termination reason as a table. Every bar, legend entry and number links to
the runs list filtered to exactly its rows.

One query feeds all three: the window's runs grouped by hour
(``date_bin`` on PostgreSQL, Django's ``Trunc`` elsewhere), status, reason
and failure class, read from the ``created_at`` index alone (it includes
the other three columns). Its
cost grows with the runs created in the window, not with the table: at
1,000,000 runs made one a second (86,400 a day) the 24-hour window reads
86,400 rows and the 7-day one 604,800 (docs/console.md has the times).
Hours are UTC hours of the database's clock.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, DateTimeField, F, Func, Value
from django.db.models.functions import Trunc
from django.urls import reverse

from console.figures import LIVE, filtered_url
from runs.models import AgentRun
from runs.models.vocabulary import FailureClass, RunStatus
from teams import access

#: ``?window=`` → hours; the first is the default.
WINDOWS = {"24h": 24, "7d": 168}

#: Outcome series, bottom to top: (key, legend, the statuses it holds).
OUTCOMES = (
    ("completed", "completed", (RunStatus.COMPLETED,)),
    ("failed", "failed", (RunStatus.FAILED,)),
    ("cancelled", "cancelled", (RunStatus.CANCELLED,)),
    ("in-flight", "queued, running or waiting", LIVE),
)
#: Failure-class series: every class, and failures with none (a write
#: interrupted, a journal that cannot be replayed: no provider error).
FAILURE_CLASSES = (*FailureClass.values, "")

# Geometry in SVG units, drawn 1:1: 672 px wide fits the overview's column
# at 1366 px with the sidebar beside it. 24 slots of 28, or 168 of 4.
WIDTH = 672
TOP = 6
PLOT = 110
BOTTOM = 16


@dataclass(frozen=True)
class Segment:
    y: int
    height: int
    series: str


@dataclass
class Slot:
    """One hour: its stacked segments, tooltip, link and (some) label."""

    x: int
    title: str
    href: str
    total: int
    segments: list[Segment] = field(default_factory=list)
    label: str = ""
    label_x: int = 0


@dataclass(frozen=True)
class Series:
    """A legend entry: its colour class, name, total and link."""

    key: str
    name: str
    total: int
    href: str


def window_of(request) -> str:
    """``?window=`` if it is one the page offers, else the default."""
    value = request.GET.get("window", "")
    return value if value in WINDOWS else next(iter(WINDOWS))


def _hour_of(field: str):
    """The UTC hour a time falls in. On PostgreSQL ``date_bin`` on the
    timestamp as it is (``date_trunc`` in UTC converts every row's time
    zone first: a third of the 7-day query's time at 600,000 runs)."""
    if connection.vendor != "postgresql":
        return Trunc(field, "hour", tzinfo=UTC)
    return Func(
        Value(timedelta(hours=1)),
        F(field),
        Value(datetime(2000, 1, 1, tzinfo=UTC)),
        function="DATE_BIN",
        output_field=DateTimeField(),
    )


def charts(now: datetime, window: str, user) -> dict:
    """Both charts and the table for ``window`` ending in ``now``'s hour,
    of the runs of the teams where ``user`` may view runs (G22)."""
    hours = WINDOWS[window]
    last = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    since = last - timedelta(hours=hours - 1)
    rows = list(
        access.scoped(AgentRun.objects, user, "runs.view_agentrun")
        .filter(created_at__gte=since)
        .annotate(hour=_hour_of("created_at"))
        .values("hour", "status", "termination_reason", "failure_class")
        # COUNT(*), not of the id: every column the query reads is in the
        # created_at index (runs.models), so PostgreSQL reads only the index.
        .annotate(runs=Count("*"))
        .order_by()
    )
    starts = [since + timedelta(hours=index) for index in range(hours)]
    outcome_of = {status: key for key, _, statuses in OUTCOMES for status in statuses}
    outcomes = [(key, name, _status_filter(statuses)) for key, name, statuses in OUTCOMES]
    classes = [
        (_class_key(cls), cls or "no class", {"failure_class__exact": cls})
        for cls in FAILURE_CLASSES
    ]
    failed = [row for row in rows if row["status"] == RunStatus.FAILED]
    return {
        "window": window,
        "windows": list(WINDOWS),
        "since": since,
        "outcomes": Chart(starts, outcomes, {}, every_series_listed=True).draw(
            rows, lambda row: outcome_of[row["status"]]
        ),
        "failures": Chart(starts, classes, {"status__exact": RunStatus.FAILED}).draw(
            failed, lambda row: _class_key(row["failure_class"])
        ),
        "by_outcome": _table(rows, since),
    }


def _status_filter(statuses) -> dict:
    if len(statuses) == 1:
        return {"status__exact": statuses[0]}
    return {"status__in": ",".join(statuses)}


def _class_key(failure_class: str) -> str:
    return f"class-{failure_class or 'none'}"


def runs_list(**filters) -> str:
    """The runs list filtered by ``filters``."""
    return filtered_url(reverse("admin:runs_agentrun_changelist"), **filters)


@dataclass
class Chart:
    """Stacked bars, one per hour in ``starts``; ``series`` (key, name,
    the list's filters for it) bottom up; ``base`` filters every link."""

    starts: list[datetime]
    series: list[tuple[str, str, dict]]
    base: dict
    #: List a series with no runs in the legend too (the outcomes: a zero
    #: says something there; a failure class without failures does not).
    every_series_listed: bool = False

    def draw(self, rows, series_of) -> dict:
        """The chart of ``rows``, each counted in ``series_of(row)``."""
        counts: dict[tuple, int] = {}
        for row in rows:
            key = (row["hour"], series_of(row))
            counts[key] = counts.get(key, 0) + row["runs"]
        totals = [
            sum(counts.get((start, key), 0) for key, _, _ in self.series) for start in self.starts
        ]
        highest = max(totals, default=0)
        slot_width = WIDTH // len(self.starts)
        bar = slot_width - max(slot_width // 4, 1)
        slots = []
        for index, (start, total) in enumerate(zip(self.starts, totals, strict=True)):
            end = start + timedelta(hours=1)
            parts = [(key, name, counts.get((start, key), 0)) for key, name, _ in self.series]
            slot = Slot(
                x=index * slot_width + (slot_width - bar) // 2,
                title=_title(start, end, total, parts),
                href=runs_list(**self.base, created_at__gte=start, created_at__lt=end)
                if total
                else "",
                total=total,
                segments=_stack(parts, highest),
            )
            if _labelled(start, len(self.starts)):
                slot.label = start.strftime("%H:%M" if len(self.starts) <= 24 else "%m-%d")
                slot.label_x = index * slot_width + slot_width // 2
            slots.append(slot)
        return {
            "slots": slots,
            "legend": self._legend(counts),
            "bar_width": bar,
            "width": WIDTH,
            "height": TOP + PLOT + BOTTOM,
            "baseline": TOP + PLOT,
            "label_y": TOP + PLOT + BOTTOM - 3,
            "highest": highest,
            "total": sum(totals),
        }

    def _legend(self, counts: dict) -> list[Series]:
        legend = []
        for key, name, filters in self.series:
            total = sum(counts.get((start, key), 0) for start in self.starts)
            if total or self.every_series_listed:
                since = self.starts[0]
                href = runs_list(**self.base, **filters, created_at__gte=since) if total else ""
                legend.append(Series(key, name, total, href))
        return legend


def _stack(parts, highest: int) -> list[Segment]:
    """Each nonzero part a segment at least a pixel tall, bottom up."""
    segments, top = [], TOP + PLOT
    for key, _, count in parts:
        if not count:
            continue
        height = max(round(PLOT * count / highest), 1)
        top -= height
        segments.append(Segment(top, height, key))
    return segments


def _title(start, end, total, parts) -> str:
    said = ", ".join(f"{count} {name}" for _, name, count in parts if count)
    # As the console writes a moment (console/formats): to the second.
    hour = f"{start:%Y-%m-%d %H:%M:%S}–{end:%H:%M:%S} UTC"
    return f"{hour}: {total} run{'' if total == 1 else 's'}" + (f" ({said})" if said else "")


def _labelled(start: datetime, hours: int) -> bool:
    return start.hour % 3 == 0 if hours <= 24 else start.hour == 0


def _table(rows, since: datetime) -> list[dict]:
    """The window's runs by status and termination reason, each linked."""
    counts: dict[tuple, int] = {}
    for row in rows:
        key = (row["status"], row["termination_reason"])
        counts[key] = counts.get(key, 0) + row["runs"]
    return [
        {
            "status": status,
            "termination_reason": reason,
            "runs": runs,
            "href": runs_list(
                status__exact=status,
                termination_reason__exact=reason,
                created_at__gte=since,
            ),
        }
        for (status, reason), runs in sorted(counts.items())
    ]
