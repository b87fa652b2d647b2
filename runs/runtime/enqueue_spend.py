"""The budget checks a run meets before anything of it is stored (G17)."""

from runs.metrics import BUDGET_REFUSALS
from runs.runtime.run_request import InvalidRunRequest, RunRequest
from spend.budgets import Refusal, budget_of, refusal_at_enqueue
from spend.prices import price_of, priced_model


class BudgetRefused(Exception):
    """The submitter's budget is spent: nothing is stored. The API answers
    429 with ``retry_after_seconds`` (the period's end) as ``Retry-After``."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.reason)
        self.retry_after_seconds = refusal.retry_after_seconds


def check_spend_at_enqueue(request: RunRequest, submitted_by) -> None:
    """Raise ``BudgetRefused`` when the submitter's budget is spent, and
    ``InvalidRunRequest`` when a cost limit applies to a model with no price
    (its cost could not be known, so the limit could not be kept)."""
    user_id = getattr(submitted_by, "pk", submitted_by)
    budget = budget_of(user_id)
    budget_limits_cost = budget is not None and budget.max_cost is not None
    if request.max_cost is not None or budget_limits_cost:
        provider, model = priced_model(request.provider)
        if price_of(provider, model) is None:
            whose = "max_cost" if request.max_cost is not None else "the submitter's budget"
            raise InvalidRunRequest(
                f"{'max_cost' if request.max_cost is not None else 'provider'}: the model "
                f"{provider}/{model} has no price, so {whose} cannot be kept (an operator "
                "sets prices in the admin: Spend > Model prices)"
            )
    if budget is None:
        return
    refusal = refusal_at_enqueue(user_id, budget)
    if refusal is not None:
        BUDGET_REFUSALS.labels("enqueue").inc()
        raise BudgetRefused(refusal)
