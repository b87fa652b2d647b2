"""The attempt's budget checks: before each model call, never during a tool
(G17).

A run's spend is the sum of its recorded turns over all its attempts (the
run's totals). A resumed attempt starts from the totals its claim read and
adds only the calls it makes itself: a replayed turn is not recorded again,
so it is not counted again. The submitter's spend is what their recorded
turns of the budget's period add up to, read by the claim and again by
every record this attempt makes (no statement of its own), so a check
lags the other runs' spend by at most the step the attempt just took.

"Would go over": the next call's prompt repeats the whole conversation the
last call sent and got back, so it costs at least the last turn's tokens.
A call is made only while what is spent, plus that, stays within the limit.
"""

from decimal import Decimal

from runs.metrics import BUDGET_REFUSALS
from runs.runtime.errors import BudgetExhausted
from spend.budgets import Budget, Spent, budget_of, over_budget
from spend.prices import Usage, price_of, priced_model
from spend.recording import turns_spend
from spend.starting import StartingSpend


class BudgetWatch:
    def __init__(
        self,
        starting: StartingSpend,
        *,
        max_total_tokens: int | None,
        max_cost: Decimal | None,
    ):
        self.price = starting.price
        self.model = f"{starting.provider}/{starting.model}"
        self.run_limit = Budget.of("run", max_total_tokens, max_cost)
        self.submitter_budget = starting.budget
        #: What the database said last (the claim, then every record).
        self.tally = starting.tally()
        #: The last turn's tokens and cost: the least the next call costs.
        self._last_turn = (0, Decimal(0))
        #: This attempt's turns whose provider reported no usage.
        self.unreported_turns = 0

    @property
    def limits_cost(self) -> bool:
        return any(
            limit is not None and limit.max_cost is not None
            for limit in (self.run_limit, self.submitter_budget)
        )

    def priced(self, result: dict) -> dict:
        """An llm step's result with its cost at the attempt's price
        (``cost``: a decimal string, or None when the model has no price)."""
        usage = Usage.of_result(result)
        if usage is None:
            return result
        if not usage.reported:
            self.unreported_turns += 1
        cost = None if self.price is None or not usage.reported else usage.cost(self.price)
        self._last_turn = (usage.total, cost or Decimal(0))
        return {**result, "cost": None if cost is None else str(cost)}

    def replayed(self, journal) -> None:
        """The turns the attempt replays from its ``journal``: counted
        already. The last one still tells what the next call costs at least;
        one whose usage was not reported leaves what the run spent unknown,
        in this attempt as in the one that made it."""
        self.unreported_turns += journal.unreported_turns
        result = journal.last_turn_result
        usage = Usage.of_result(result)
        if usage is not None:
            cost = result.get("cost")
            self._last_turn = (usage.total, Decimal(cost) if cost is not None else Decimal(0))

    def check_before_call(self, unwritten: list[dict]) -> None:
        """Raise ``BudgetExhausted`` if the next model call would go over the
        run's limit or its submitter's budget. ``unwritten``: the attempt's
        steps the database has not recorded yet (their turns count too)."""
        pending = turns_spend(unwritten)
        tokens, cost = self._last_turn
        if self.unreported_turns and (self.run_limit or self.submitter_budget):
            self._refuse(
                f"the model {self.model} answered without reporting its usage: what the "
                "run spent is unknown, so its limits cannot be kept",
                "run" if self.run_limit else "submitter",
            )
        if self.limits_cost and self.price is None:
            self._refuse(
                f"the model {self.model} has no price, so a cost limit cannot be kept "
                "(an operator sets prices in the admin: Spend > Model prices)",
                "run" if self.run_limit and self.run_limit.max_cost is not None else "submitter",
            )
        if self.run_limit is not None:
            spent = self.tally.run
            if self.run_limit.max_cost is not None and spent.unpriced_turns:
                self._refuse(
                    f"{spent.unpriced_turns} turn(s) of the run are of unknown cost (no "
                    "price, or no usage reported), so its cost limit cannot be kept",
                    "run",
                )
            why = over_budget(
                self.run_limit,
                spent.plus(pending),
                projected_tokens=tokens,
                projected_cost=cost,
            )
            if why:
                self._refuse(f"the run's limit: {why}", "run")
        if self.submitter_budget is not None:
            why = over_budget(
                self.submitter_budget,
                self.tally.user.plus(pending),
                projected_tokens=tokens,
                projected_cost=cost,
            )
            if why:
                period = "daily" if self.submitter_budget.period == "day" else "monthly"
                self._refuse(f"the submitter's {period} budget: {why}", "submitter")

    @staticmethod
    def _refuse(message: str, where: str) -> None:
        BUDGET_REFUSALS.labels("model_call").inc()
        raise BudgetExhausted(f"stopped before a model call: {message}", where=where)


def why_a_resume_stops(request, run, *, last_turn_result, unreported_turns) -> tuple[str, str]:
    """(code, why, with what to do) an attempt of ``run`` would stop before
    its next model call, as ``BudgetWatch`` would stop it, or ("", "").
    ``last_turn_result``: the last turn the attempt replays (None: a
    restart, nothing replayed). ``unreported_turns``: the run's turns whose
    usage is unknown, or a callable counting them (asked only when a limit
    applies) — for a restart, those of every attempt: stricter than the
    restarted attempt, which replays none of them (G17: unknown is never 0).
    A run's own limits are fixed with its request and count every attempt:
    neither waiting nor a requeue lifts them."""
    limit = Budget.of("run", request.max_total_tokens, request.max_cost)
    budget = budget_of(run.submitted_by_id)
    if limit is None and budget is None:
        return "", ""
    unknown = unreported_turns() if callable(unreported_turns) else unreported_turns
    if unknown:
        return "spend_unknown", (
            f"{unknown} model turn(s) came without their usage: what the run spent is "
            "unknown, so its limits cannot be kept; submit the request again instead"
        )
    provider, model = priced_model(request.provider)
    limits_cost = any(each is not None and each.max_cost is not None for each in (limit, budget))
    if limits_cost and price_of(provider, model) is None:
        return "price_missing", (
            f"the model {provider}/{model} has no price, so a cost limit cannot be kept; "
            "set its price in Spend › Model prices, then requeue"
        )
    if limit is None:
        return "", ""
    fixed = "; a run's limits are fixed with its request: submit the request again instead"
    if limit.max_cost is not None and run.unpriced_turns:
        return "run_limit_spent", (
            f"{run.unpriced_turns} turn(s) of the run are of unknown cost, so its cost "
            f"limit cannot be kept{fixed}"
        )
    tokens, cost = 0, Decimal(0)
    usage = Usage.of_result(last_turn_result) if last_turn_result else None
    if usage is not None:
        tokens = usage.total
        cost = Decimal(last_turn_result.get("cost") or 0)
    spent = Spent(run.prompt_tokens + run.completion_tokens, run.cost, run.unpriced_turns)
    why = over_budget(limit, spent, projected_tokens=tokens, projected_cost=cost)
    return ("run_limit_spent", f"the run's limit: {why}{fixed}") if why else ("", "")
