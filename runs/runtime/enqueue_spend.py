"""The budget checks a run meets before anything of it is stored (G17)."""

from decimal import Decimal

from runs.models.metrics import BUDGET_REFUSALS
from runs.runtime.next_call import first_call_size
from runs.runtime.run_request import InvalidRunRequest, RunRequest
from spend.budgets import (
    Budget,
    Refusal,
    Spent,
    budget_of,
    no_room,
    refusal_at_enqueue,
    team_budget_and_name,
    team_refusal_at_enqueue,
)
from spend.prices import price_of, priced_model


class BudgetRefused(Exception):
    """The submitter's budget or the team's is spent: nothing is stored. The API answers
    429 with ``retry_after_seconds`` (the period's end) as ``Retry-After``."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.reason)
        self.retry_after_seconds = refusal.retry_after_seconds


def check_spend_at_enqueue(request: RunRequest, submitted_by, *, team_id=None) -> None:
    """Raise ``BudgetRefused`` when the submitter's budget is spent, or the
    budget of the team ``team_id`` (None: no team's is checked), and
    ``InvalidRunRequest`` when a cost limit applies to a model with no price
    (its cost could not be known, so the limit could not be kept) or the
    run's own limits leave no room for its first model call."""
    user_id = getattr(submitted_by, "pk", submitted_by)
    budget = budget_of(user_id)
    team_budget, team_name = team_budget_and_name(team_id)
    budget_limits_cost = budget is not None and budget.max_cost is not None
    team_limits_cost = team_budget is not None and team_budget.max_cost is not None
    if request.max_cost is not None or budget_limits_cost or team_limits_cost:
        provider, model = priced_model(request.provider)
        if price_of(provider, model) is None:
            whose = (
                "max_cost"
                if request.max_cost is not None
                else "the submitter's budget"
                if budget_limits_cost
                else f"the team {team_name}'s budget"
            )
            raise InvalidRunRequest(
                f"{'max_cost' if request.max_cost is not None else 'provider'}: the model "
                f"{provider}/{model} has no price, so {whose} cannot be kept (an operator "
                "sets prices in the admin: Spend > Model prices)"
            )
    _refuse_limits_no_call_fits(request)
    refusal = refusal_at_enqueue(user_id, budget) or team_refusal_at_enqueue(
        team_id, team_budget, team_name
    )
    if refusal is not None:
        BUDGET_REFUSALS.labels("enqueue").inc()
        raise BudgetRefused(refusal)


def _refuse_limits_no_call_fits(request: RunRequest) -> None:
    """A run whose own limits have no room for the most its first model
    call can cost would only ever stop before it (G17): refused now, naming
    the limit, rather than stored to fail at once."""
    limit = Budget.of("run", request.max_total_tokens, request.max_cost)
    if limit is None:
        return
    provider, model = priced_model(request.provider)
    size = first_call_size(request, (), (), price_of(provider, model))
    if size is None or not no_room(limit, Spent(0, Decimal(0), 0), size.tokens, size.cost):
        return
    if limit.max_tokens is not None and size.tokens > limit.max_tokens:
        field, room, most = "max_total_tokens", limit.max_tokens, size.tokens
        room, most = f"{room} tokens", f"{most} tokens"
    else:
        field, room, most = "max_cost", f"{limit.max_cost:f}", f"{size.cost:f}"
    raise InvalidRunRequest(
        f"{field}: the limit of {room} has no room for the run's first model call, which "
        f"may cost up to {most} (its prompt, instructions and tool specifications as sent, "
        f"and max_tokens {size.completion}); raise the limit or set the provider's "
        "max_tokens lower"
    )
