"""What an attempt knows of spend when it starts: the run's totals, the
price of its model, its submitter's budget and what they have spent in its
period (G17), and its team's budget (G21: kept by the reservations). On
PostgreSQL the claim reads all of it in its one statement
(``CLAIM_COLUMNS``); elsewhere, and for an interactive run, the ORM does
(``starting_spend_of``).
"""

from dataclasses import dataclass
from datetime import UTC, date
from decimal import Decimal

from spend.budgets import (
    Budget,
    Spent,
    budget_of,
    database_now,
    deployment_budget,
    period_bounds,
    spent_since_and_since,
    team_budget_of,
)
from spend.models import BudgetPeriod, DailySpend, ModelPrice, SubmitterBudget, TeamBudget
from spend.prices import Price, price_of, priced_model
from spend.recording import Tally
from teams.models import Team


@dataclass(frozen=True)
class StartingSpend:
    submitter: int
    provider: str
    model: str
    #: The price in force when the attempt began; None: the model has none.
    price: Price | None
    #: The submitter's budget; None: none (or no submitter).
    budget: Budget | None
    run: Spent
    #: The submitter's spend over ``budget``'s period (empty without one)...
    user: Spent
    #: ...of which this much before ``today`` (the claim's day, UTC, by the
    #: database's clock): every record reads only the days since.
    user_before_today: Spent = Spent()
    today: date | None = None
    #: The run's team, its budget (None: none) and its slug, for refusals.
    team: int = 0
    team_budget: Budget | None = None
    team_name: str = ""

    @property
    def budgeted(self) -> bool:
        """Whether a budget beyond the run's own applies: its submitter's,
        its team's, or both."""
        return self.budget is not None or self.team_budget is not None

    def tally(self) -> Tally:
        tally = Tally(self.submitter, self.provider, self.model)
        if self.budget is not None:
            tally.budget_since, tally.user_before = self.today, self.user_before_today
        tally.run, tally.user = self.run, self.user
        return tally


_TODAY = "(statement_timestamp() AT TIME ZONE 'UTC')::date"
_MONTH = "date_trunc('month', statement_timestamp() AT TIME ZONE 'UTC')::date"
_KIND = "run.request #>> '{provider,kind}'"
_MODEL = "COALESCE(run.request #>> '{provider,model}', run.request #>> '{provider,kind}')"

#: The claim's extra columns (its UPDATE returns the run as ``run``, with
#: ``request``, ``submitted_by_id`` and ``team_id``): the price, the budget
#: row, the submitter's spend today and this month, the day, and the team's
#: budget row with its slug.
CLAIM_COLUMNS = f"""
    (SELECT ARRAY[input_per_million, cached_input_per_million, output_per_million]
     FROM {ModelPrice._meta.db_table} WHERE provider = {_KIND} AND model = {_MODEL}),
    (SELECT ARRAY[period, max_tokens::text, max_cost::text]
     FROM {SubmitterBudget._meta.db_table} WHERE user_id = run.submitted_by_id),
    (SELECT ARRAY[
        COALESCE(SUM(input_tokens + output_tokens) FILTER (WHERE day >= {_TODAY}), 0),
        COALESCE(SUM(cost) FILTER (WHERE day >= {_TODAY}), 0),
        COALESCE(SUM(input_tokens + output_tokens), 0),
        COALESCE(SUM(cost), 0)]
     FROM {DailySpend._meta.db_table}
     WHERE submitter = run.submitted_by_id AND day >= {_MONTH}),
    {_TODAY},
    (SELECT ARRAY[budget.period, budget.max_tokens::text, budget.max_cost::text, team.slug]
     FROM {TeamBudget._meta.db_table} AS budget
     JOIN {Team._meta.db_table} AS team ON team.id = budget.team_id
     WHERE budget.team_id = run.team_id)
"""


def starting_spend_from_claim(
    request: dict, submitted_by, run_totals, price, budget, spent, today, team, team_budget
) -> StartingSpend:
    """``StartingSpend`` from what the claim returned: ``run_totals`` (prompt
    and completion tokens, cost, unpriced turns), the run's ``team`` and
    ``CLAIM_COLUMNS``."""
    provider, model = priced_model(request.get("provider") or {})
    if budget is None:
        chosen = deployment_budget() if submitted_by is not None else None
    else:
        chosen = Budget.of(*budget)
    user = before_today = Spent()
    if chosen is not None and spent is not None:
        day_tokens, day_cost, month_tokens, month_cost = spent
        user = Spent(int(day_tokens), Decimal(day_cost))
        if chosen.period == BudgetPeriod.MONTH:
            user = Spent(int(month_tokens), Decimal(month_cost))
            before_today = Spent(user.tokens - int(day_tokens), user.cost - Decimal(day_cost))
    prompt, completion, cost, unpriced = run_totals
    return StartingSpend(
        submitter=submitted_by or 0,
        provider=provider,
        model=model,
        price=None if price is None else Price.of(*price),
        budget=chosen,
        run=Spent(int(prompt) + int(completion), Decimal(cost), int(unpriced)),
        user=user,
        user_before_today=before_today,
        today=today,
        team=team,
        team_budget=None if team_budget is None else Budget.of(*team_budget[:3]),
        team_name="" if team_budget is None else team_budget[3],
    )


def starting_spend_of(run) -> StartingSpend:
    """``StartingSpend`` of ``run`` (an ``AgentRun``) through the ORM."""
    provider, model = priced_model((run.request or {}).get("provider") or {})
    budget = budget_of(run.submitted_by_id)
    team_budget = team_budget_of(run.team_id)
    user = before_today = Spent()
    today = None
    if budget is not None or team_budget is not None:
        now = database_now()
        today = now.astimezone(UTC).date()
    if budget is not None:
        start, _ = period_bounds(budget.period, now)
        user, since_today = spent_since_and_since(run.submitted_by_id, start, today)
        before_today = Spent(user.tokens - since_today.tokens, user.cost - since_today.cost)
    return StartingSpend(
        submitter=run.submitted_by_id or 0,
        provider=provider,
        model=model,
        price=price_of(provider, model),
        budget=budget,
        run=Spent(run.prompt_tokens + run.completion_tokens, run.cost, run.unpriced_turns),
        user=user,
        user_before_today=before_today,
        today=today,
        team=run.team_id,
        team_budget=team_budget,
        team_name=run.team.slug if team_budget is not None else "",
    )
