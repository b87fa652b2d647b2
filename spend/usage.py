"""Spend grouped by day, model or submitter: what ``GET /api/usage/`` and the
overview show. Read from ``DailySpend`` (a row per day, submitter and
model), never from the runs table, so it costs the same at a million runs.
"""

from datetime import date
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db.models import F, Sum

from spend.models import DailySpend

GROUPS = ("day", "model", "user")
_COUNTS = ("turns", "input_tokens", "cached_input_tokens", "output_tokens", "unpriced_turns")


def usage(group_by: str, since: date, until: date | None = None, *, rows=None) -> list[dict]:
    """One entry per ``group_by`` value from ``since`` to ``until`` (days,
    inclusive): turns, tokens, the priced turns' cost and how many turns
    had no price (``cost`` is then a lower bound: ``cost_known`` false).
    Days newest first; models and users by cost, then tokens, largest first.
    ``rows``: the ``DailySpend`` rows to count (a team's: ``DailySpend`` is
    kept per team, ``TEAM_FIELD``); None: every row."""
    rows = (DailySpend.objects.all() if rows is None else rows).filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    keys = {"day": ["day"], "model": ["provider", "model"], "user": ["submitter"]}[group_by]
    # Named apart from the columns: F("input_tokens") must mean the column.
    totals = {f"sum_{name}": Sum(name) for name in _COUNTS}
    grouped = rows.values(*keys).annotate(
        **totals, sum_cost=Sum("cost"), sum_tokens=Sum(F("input_tokens") + F("output_tokens"))
    )
    entries = [_entry(group_by, row) for row in grouped]
    if group_by == "user":
        _name_users(entries)
    if group_by == "day":
        entries.sort(key=lambda entry: entry["day"], reverse=True)
    else:
        entries.sort(key=lambda entry: (-Decimal(entry["cost"]), -entry["tokens"]))
    return entries


def _entry(group_by: str, row: dict) -> dict:
    entry: dict = {}
    if group_by == "day":
        entry["day"] = row["day"]
    elif group_by == "model":
        entry["provider"], entry["model"] = row["provider"], row["model"]
    else:
        entry["user_id"] = row["submitter"] or None
    entry.update({name: row[f"sum_{name}"] or 0 for name in _COUNTS})
    entry["tokens"] = row["sum_tokens"] or 0
    entry["cost"] = money_text(row["sum_cost"])
    entry["cost_known"] = not entry["unpriced_turns"]
    return entry


def money_text(value) -> str:
    """An amount as a plain decimal string, without trailing zeros ("0.0000975", "12")."""
    return format(Decimal(value or 0).normalize(), "f")


def _name_users(entries: list[dict]) -> None:
    ids = [entry["user_id"] for entry in entries if entry["user_id"]]
    names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    for entry in entries:
        entry["user"] = names.get(entry["user_id"]) if entry["user_id"] else None
