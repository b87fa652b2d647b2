"""The overview's spend module (G17): cost per day over the last two weeks
as a small bar chart drawn on the server (inline SVG, no script), and the
last 30 days per model and per submitter.

Read from ``DailySpend`` through ``spend.usage``, never from the runs table:
the module costs the same five queries at a million runs. Days are UTC days
of the database's clock, as budgets count them. Model names and usernames
are data: the template escapes them, every bar's title included.
"""

from dataclasses import dataclass
from datetime import UTC, date, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.urls import reverse

from console.run_spend import amount, lower_bound, token_text, turns_text
from spend.budgets import database_now
from spend.usage import usage

CHART_DAYS = 14
TABLE_DAYS = 30
#: Rows per table; the daily spend list has the rest.
TABLE_ROWS = 10

# The chart's geometry in SVG units (pixels, drawn 1:1): 14 slots of 40 fit
# any screen the console is used on.
SLOT = 40
BAR = 28
PLOT = 100  # the tallest bar
TOP = 16  # room for the "≥" over a bar
BOTTOM = 16  # room for the day labels


@dataclass(frozen=True)
class DayBar:
    """One day's bar: where it is drawn and what its tooltip says."""

    x: int
    y: int
    height: int
    #: Where the day label and the "≥" mark are centred, and the mark's baseline.
    middle: int
    mark_y: int
    label: str
    title: str
    #: Some turns had no price: the cost drawn is a lower bound.
    lower_bound: bool


def spend_overview() -> dict:
    """The chart and the two tables, as ``templates/admin/runs/_spend.html``
    draws them."""
    today = database_now().astimezone(UTC).date()
    since = today - timedelta(days=TABLE_DAYS - 1)
    by_model = usage("model", since, today)
    by_submitter = usage("user", since, today)
    return {
        "chart": day_chart(today),
        "since": since,
        "total": _total(by_model),
        "by_model": [_model_row(entry, since) for entry in by_model[:TABLE_ROWS]],
        "more_models": max(len(by_model) - TABLE_ROWS, 0),
        "by_submitter": [_submitter_row(entry, since) for entry in by_submitter[:TABLE_ROWS]],
        "more_submitters": max(len(by_submitter) - TABLE_ROWS, 0),
        "daily_spend_url": reverse("admin:spend_dailyspend_changelist"),
    }


def day_chart(today: date) -> dict:
    """A bar per day from ``CHART_DAYS - 1`` days before ``today`` to it,
    each as tall as its cost against the costliest day's."""
    first = today - timedelta(days=CHART_DAYS - 1)
    by_day = {entry["day"]: entry for entry in usage("day", first, today)}
    highest = max((Decimal(entry["cost"]) for entry in by_day.values()), default=Decimal(0))
    days = [first + timedelta(days=index) for index in range(CHART_DAYS)]
    bars = [_bar(index, day, by_day.get(day), highest) for index, day in enumerate(days)]
    cost = sum((Decimal(entry["cost"]) for entry in by_day.values()), Decimal(0))
    unpriced = sum(entry["unpriced_turns"] for entry in by_day.values())
    return {
        "bars": bars,
        "width": CHART_DAYS * SLOT,
        "bar_width": BAR,
        "height": TOP + PLOT + BOTTOM,
        "baseline": TOP + PLOT,
        "label_y": TOP + PLOT + BOTTOM - 4,
        "highest": amount(highest) if by_day else "",
        "summary": f"Cost per day (UTC), {first} to {today}: {lower_bound(cost, unpriced)} in all",
    }


def _bar(index: int, day: date, entry: dict | None, highest: Decimal) -> DayBar:
    left = index * SLOT
    if entry is None:
        title, height, unpriced = f"{day}: nothing spent", 0, 0
    else:
        unpriced = entry["unpriced_turns"]
        cost = Decimal(entry["cost"])
        height = round(PLOT * cost / highest) if highest else 0
        # A day with turns is never drawn empty, even when they had no price.
        height = max(height, 1)
        title = (
            f"{day}: {lower_bound(cost, unpriced)}, {token_text(entry['tokens'])} tokens "
            f"in {turns_text(entry['turns'])}"
        )
    return DayBar(
        x=left + (SLOT - BAR) // 2,
        y=TOP + PLOT - height,
        height=height,
        middle=left + SLOT // 2,
        mark_y=TOP + PLOT - height - 3,
        label=day.strftime("%m-%d"),
        title=title,
        lower_bound=bool(unpriced),
    )


def _total(entries: list[dict]) -> str:
    turns = sum(entry["turns"] for entry in entries)
    tokens = sum(entry["tokens"] for entry in entries)
    cost = sum((Decimal(entry["cost"]) for entry in entries), Decimal(0))
    unpriced = sum(entry["unpriced_turns"] for entry in entries)
    return f"{turns_text(turns)}, {token_text(tokens)} tokens, {lower_bound(cost, unpriced)}"


def _row(entry: dict, name: str, filters: dict, since: date) -> dict:
    return {
        "name": name,
        "turns": entry["turns"],
        "tokens": token_text(entry["tokens"]),
        "cost": lower_bound(entry["cost"], entry["unpriced_turns"]),
        # Django's admin filters its list by any field in the query string.
        "query": urlencode({**filters, "day__gte": since.isoformat()}),
    }


def _model_row(entry: dict, since: date) -> dict:
    name = f"{entry['provider']}/{entry['model']}"
    return _row(entry, name, {"provider": entry["provider"], "model": entry["model"]}, since)


def _submitter_row(entry: dict, since: date) -> dict:
    user_id = entry["user_id"]
    if user_id is None:
        name = "the command line"
    else:
        name = entry["user"] or f"user #{user_id} (deleted)"
    # DailySpend keeps the command line's turns under submitter 0.
    return _row(entry, name, {"submitter": user_id or 0}, since)
