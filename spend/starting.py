"""What an attempt knows of spend when it starts: the run's totals, the
price of its model, its submitter's budget and what they have spent in its
period (G17). On PostgreSQL the claim reads all of it in its one statement
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
)
from spend.models import BudgetPeriod, DailySpend, ModelPrice, SubmitterBudget
from spend.prices import Price, price_of, priced_model
from spend.recording import Tally


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
#: ``request`` and ``submitted_by_id``): the price, the budget row, and the
#: submitter's spend today and this month.
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
    {_TODAY}
"""


def starting_spend_from_claim(
    request: dict, submitted_by, run_totals, price, budget, spent, today
) -> StartingSpend:
    """``StartingSpend`` from what the claim returned: ``run_totals`` (prompt
    and completion tokens, cost, unpriced turns) and ``CLAIM_COLUMNS``."""
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
    )


def starting_spend_of(run) -> StartingSpend:
    """``StartingSpend`` of ``run`` (an ``AgentRun``) through the ORM."""
    provider, model = priced_model((run.request or {}).get("provider") or {})
    budget = budget_of(run.submitted_by_id)
    user = before_today = Spent()
    today = None
    if budget is not None:
        now = database_now()
        start, _ = period_bounds(budget.period, now)
        today = now.astimezone(UTC).date()
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
    )
