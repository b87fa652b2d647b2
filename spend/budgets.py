"""What a run, its submitter and its team may spend, what they have spent,
and the refusal at enqueue (G17, G21).

A run's limits (``max_total_tokens``, ``max_cost``) are in its request, the
deployment's defaults filled in when it is stored. A submitter's budget is
their ``SubmitterBudget`` row, or else the deployment's default
(``NRLLM_USER_BUDGET_PERIOD``, ``NRLLM_USER_MAX_TOKENS``,
``NRLLM_USER_MAX_COST``); a team's is its ``TeamBudget`` row (none
without one). A period is a calendar day or month of the database's
clock, in UTC.
"""

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import F, Q, Sum

from spend.models import BudgetPeriod, DailySpend, SubmitterBudget, TeamBudget
from teams.models import Team


@dataclass(frozen=True)
class Budget:
    """A limit on spend over a period; a limit that is None is not kept."""

    period: str
    max_tokens: int | None
    max_cost: Decimal | None

    @property
    def limits_anything(self) -> bool:
        return self.max_tokens is not None or self.max_cost is not None

    @classmethod
    def of(cls, period, max_tokens, max_cost) -> "Budget | None":
        """A budget from stored values, or None when it limits nothing."""
        budget = cls(
            str(period),
            None if max_tokens is None else int(max_tokens),
            None if max_cost is None else Decimal(max_cost),
        )
        return budget if budget.limits_anything else None


def deployment_budget() -> Budget | None:
    """The default every user without a budget row of their own has."""
    return Budget.of(
        settings.NRLLM_USER_BUDGET_PERIOD,
        settings.NRLLM_USER_MAX_TOKENS,
        settings.NRLLM_USER_MAX_COST,
    )


def budget_of(user_id) -> Budget | None:
    """The budget of the user ``user_id`` (None: a run with no submitter), or
    None when they have none."""
    if user_id is None:
        return None
    row = SubmitterBudget.objects.filter(user_id=user_id).first()
    if row is None:
        return deployment_budget()
    return Budget.of(row.period, row.max_tokens, row.max_cost)


def team_budget_of(team_id) -> "Budget | None":
    """The budget of the team ``team_id``, or None when it has none."""
    return team_budget_and_name(team_id)[0]


# Asked at every enqueue: a statement of its own, not compiled by the ORM
# each time (the join and the model's ordering cost more CPU than the rest
# of an enqueue's checks together).
_TEAM_BUDGET = (
    f"SELECT budget.period, budget.max_tokens, budget.max_cost, team.slug "
    f"FROM {TeamBudget._meta.db_table} budget "
    f"JOIN {Team._meta.db_table} team ON team.id = budget.team_id "
    f"WHERE budget.team_id = %s"
)


def team_budget_and_name(team_id) -> "tuple[Budget | None, str]":
    """The budget of the team ``team_id`` (None: none) and its slug, which
    a refusal names, in one query."""
    if team_id is None:
        return None, ""
    with connection.cursor() as cursor:
        cursor.execute(_TEAM_BUDGET, [team_id])
        row = cursor.fetchone()
    if row is None:
        return None, ""
    period, max_tokens, max_cost, slug = row
    return Budget.of(period, max_tokens, _stored_cost(max_cost)), slug


_MAX_COST = TeamBudget._meta.get_field("max_cost")


def _stored_cost(value) -> Decimal | None:
    """A ``max_cost`` read without the ORM as the ORM reads it: SQLite hands
    a decimal column back as a float, rounded here to the field's places."""
    if value is None or isinstance(value, Decimal):
        return value
    return _MAX_COST.to_python(value).quantize(Decimal(1).scaleb(-_MAX_COST.decimal_places))


def database_now() -> datetime:
    """The database's clock: every period boundary is its, as every lease is."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


def period_bounds(period: str, now: datetime) -> tuple[date, datetime]:
    """The first day of the period ``now`` falls in, and when it ends (UTC)."""
    today = now.astimezone(UTC).date()
    if period == BudgetPeriod.MONTH:
        start = today.replace(day=1)
        days = calendar.monthrange(start.year, start.month)[1]
        end = start + timedelta(days=days)
    else:
        start = today
        end = today + timedelta(days=1)
    return start, datetime(end.year, end.month, end.day, tzinfo=UTC)


@dataclass(frozen=True)
class Spent:
    tokens: int = 0
    cost: Decimal = Decimal(0)
    #: Turns whose model had no price: their cost is unknown.
    unpriced_turns: int = 0

    def plus(self, more) -> "Spent":
        """This and ``more`` (a ``Spent`` or the ``TurnsSpend`` of turns)."""
        return Spent(
            self.tokens + more.tokens,
            self.cost + more.cost,
            self.unpriced_turns + more.unpriced_turns,
        )


def spent_since(user_id, start: date) -> Spent:
    """What the user's recorded turns have spent from ``start`` on."""
    return spent_since_and_since(user_id, start, start)[0]


def team_spent_since(team_id, start: date) -> Spent:
    """What the team's runs' recorded turns have spent from ``start`` on."""
    return _spent(DailySpend.objects.filter(team_id=team_id), start, start)[0]


def spent_since_and_since(user_id, start: date, later: date) -> tuple[Spent, Spent]:
    """What the user's recorded turns have spent from ``start`` on, and the
    part of it from ``later`` on, in one query."""
    return _spent(DailySpend.objects.filter(submitter=user_id), start, later)


def _spent(rows, start: date, later: date) -> tuple[Spent, Spent]:
    tokens = F("input_tokens") + F("output_tokens")
    since_later = Q(day__gte=later)
    # The aliases must not be the columns' names: a later Sum("cost") would
    # read the alias, an aggregate, and Django refuses that.
    totals = rows.filter(day__gte=start).aggregate(
        all_tokens=Sum(tokens),
        all_cost=Sum("cost"),
        all_unpriced=Sum("unpriced_turns"),
        later_tokens=Sum(tokens, filter=since_later),
        later_cost=Sum("cost", filter=since_later),
        later_unpriced=Sum("unpriced_turns", filter=since_later),
    )
    return tuple(
        Spent(
            totals[f"{which}_tokens"] or 0,
            Decimal(totals[f"{which}_cost"] or 0),
            totals[f"{which}_unpriced"] or 0,
        )
        for which in ("all", "later")
    )


def over_budget(budget: Budget, spent: Spent, *, projected_tokens=0, projected_cost=0) -> str:
    """Why another model call would go over ``budget``, or "" if it would
    not: what is ``spent`` reached the limit, or with what the next call is
    projected to cost it would pass it. Turns of a model with no price
    count their tokens only (a run under a cost limit needs a price to
    start, and stops when it finds none: ``runs.runtime.budget_watch``)."""
    limit = budget.max_tokens
    if limit is not None and (spent.tokens >= limit or spent.tokens + projected_tokens > limit):
        projected = f" (the next call: at least {projected_tokens})" if projected_tokens else ""
        return f"{spent.tokens} of {limit} tokens spent{projected}"
    limit = budget.max_cost
    if limit is not None:
        projected_cost = Decimal(projected_cost)
        if spent.cost >= limit or spent.cost + projected_cost > limit:
            projected = f" (the next call: about {projected_cost})" if projected_cost else ""
            return f"{spent.cost} of {limit} spent{projected}"
    return ""


def no_room(budget: Budget, spent: Spent, tokens: int, cost) -> str:
    """Why a call that may cost up to ``tokens`` and ``cost`` (its
    ``spend.call_size.CallSize``) would not fit within ``budget`` beside
    what is ``spent``, or "" if it fits."""
    if budget.max_tokens is not None and spent.tokens + tokens > budget.max_tokens:
        return (
            f"{spent.tokens} of {budget.max_tokens} tokens spent, "
            f"and the call may cost up to {tokens}"
        )
    if budget.max_cost is not None and spent.cost + cost > budget.max_cost:
        return f"{spent.cost} of {budget.max_cost} spent, and the call may cost up to {cost}"
    return ""


@dataclass(frozen=True)
class Refusal:
    """Why a submitter may not start a run now, and when they may again."""

    reason: str
    retry_after_seconds: int


def refusal_at_enqueue(user_id, budget: Budget | None) -> Refusal | None:
    """None if the user may enqueue a run now under ``budget`` (theirs,
    ``budget_of``); else why not and for how long (until the budget's period
    ends, by the database's clock)."""
    if budget is None:
        return None
    now = database_now()
    start, end = period_bounds(budget.period, now)
    why = over_budget(budget, spent_since(user_id, start))
    if not why:
        return None
    retry_after = max(1, int((end - now).total_seconds() + 0.999))
    return Refusal(f"the {_PERIOD_NAME[budget.period]} budget is spent: {why}", retry_after)


def team_refusal_at_enqueue(team_id, budget: Budget | None, team_name: str) -> Refusal | None:
    """As ``refusal_at_enqueue``, for the team ``team_id``'s ``budget``
    (``team_budget_of``): shared by every run of the team."""
    if budget is None:
        return None
    now = database_now()
    start, end = period_bounds(budget.period, now)
    why = over_budget(budget, team_spent_since(team_id, start))
    if not why:
        return None
    retry_after = max(1, int((end - now).total_seconds() + 0.999))
    period = _PERIOD_NAME[budget.period]
    return Refusal(f"the team {team_name}'s {period} budget is spent: {why}", retry_after)


def period_name(period: str) -> str:
    """``daily`` or ``monthly``."""
    return _PERIOD_NAME[period]


_PERIOD_NAME = {BudgetPeriod.DAY: "daily", BudgetPeriod.MONTH: "monthly"}
