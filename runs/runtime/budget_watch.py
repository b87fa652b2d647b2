"""The attempt's budget checks: before each model call, never during a tool
(G17).

A run's spend is the sum of its recorded turns over all its attempts (the
run's totals). A resumed attempt starts from the totals its claim read and
adds only the calls it makes itself: a replayed turn is not recorded again,
so it is not counted again. The submitter's spend is what their recorded
turns of the budget's period add up to, read by the claim and again by
every record this attempt makes (no statement of its own), so a check
lags the other runs' spend by at most the step the attempt just took.

"Would go over": a call is made only while what is spent, plus the most
the call can cost (``spend.call_size``: its prompt's bytes and its
``max_tokens``, at the model's price), stays within the limit. A run's
calls are its lease holder's alone, one at a time, so for the run's own
limits that is the reservation: no statement is needed to keep them. A
submitter's budget is shared by their runs in flight, and a team's by
its runs: on PostgreSQL each call also reserves its size against both
(``runs.runtime.reserving``, G21), which alone keeps the team's; elsewhere
the team's spend is read before each call.
"""

from decimal import Decimal

from runs.models.metrics import BUDGET_REFUSALS
from runs.runtime.errors import BudgetExhausted
from runs.runtime.next_call import first_call_size, going_live
from spend.budgets import (
    Budget,
    Spent,
    budget_of,
    database_now,
    no_room,
    over_budget,
    period_bounds,
    period_name,
    team_budget_of,
    team_spent_since,
)
from spend.call_size import CallSize
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
        self.team_budget = starting.team_budget
        self.team, self.team_name = starting.team, starting.team_name
        #: What the database said last (the claim, then every record).
        self.tally = starting.tally()
        #: This attempt's turns whose provider reported no usage.
        self.unreported_turns = 0
        #: The last turn's tokens and cost: the least the next call costs,
        #: which the submitter's reserved budget is checked against first.
        self._last_turn = (0, Decimal(0))

    @property
    def limits_cost(self) -> bool:
        return any(
            limit is not None and limit.max_cost is not None
            for limit in (self.run_limit, self.submitter_budget, self.team_budget)
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

    @property
    def limits_anything(self) -> bool:
        return any(
            limit is not None for limit in (self.run_limit, self.submitter_budget, self.team_budget)
        )

    @property
    def _shared(self) -> str:
        """Which shared budget a refusal that is no run's own names."""
        return "submitter" if self.submitter_budget is not None else "team"

    def size(self, messages, tool_specs, max_tokens: int | None) -> CallSize | None:
        """The most the next call can cost, if a limit needs to know."""
        if not self.limits_anything:
            return None
        return CallSize.of(messages, tool_specs, max_tokens, self.price)

    def replayed(self, journal) -> None:
        """The turns the attempt replays from its ``journal``: counted
        already. One whose usage was not reported leaves what the run spent
        unknown, in this attempt as in the one that made it."""
        self.unreported_turns += journal.unreported_turns
        self._last_turn = _least_next_call(journal.last_turn_result)

    def check_before_call(self, unwritten: list[dict], size: CallSize | None) -> None:
        """Raise ``BudgetExhausted`` if the next model call, of ``size``
        (``self.size``), could go over the run's limit or its submitter's
        budget. ``unwritten``: the attempt's steps the database has not
        recorded yet (their turns count too)."""
        if size is None:
            return
        pending = turns_spend(unwritten)
        if self.unreported_turns:
            self._refuse(
                f"the model {self.model} answered without reporting its usage: what the "
                "run spent is unknown, so its limits cannot be kept",
                "run" if self.run_limit else self._shared,
            )
        if self.limits_cost and self.price is None:
            self._refuse(
                f"the model {self.model} has no price, so a cost limit cannot be kept "
                "(an operator sets prices in the admin: Spend > Model prices)",
                "run" if self.run_limit and self.run_limit.max_cost is not None else self._shared,
            )
        if self.run_limit is not None:
            spent = self.tally.run
            if self.run_limit.max_cost is not None and spent.unpriced_turns:
                self._refuse(
                    f"{spent.unpriced_turns} turn(s) of the run are of unknown cost (no "
                    "price, or no usage reported), so its cost limit cannot be kept",
                    "run",
                )
            why = no_room(self.run_limit, spent.plus(pending), size.tokens, size.cost)
            if why:
                self._refuse(f"the run's limit: {why}", "run")
        if self.submitter_budget is not None:
            spent = self.tally.user.plus(pending)
            if self.tally.reserving:
                # Its reservation sizes the call against every call in
                # flight (G21): first, the least it costs, before it waits
                # for a rate limit or a reservation.
                tokens, cost = self._last_turn
                why = over_budget(
                    self.submitter_budget, spent, projected_tokens=tokens, projected_cost=cost
                )
            else:
                why = no_room(self.submitter_budget, spent, size.tokens, size.cost)
            if why:
                period = period_name(self.submitter_budget.period)
                self._refuse(f"the submitter's {period} budget: {why}", "submitter")
        if self.team_budget is not None and not self.tally.reserving:
            # No reservation here (SQLite): the team's runs of other
            # submitters spend it too, so it is read now.
            start, _ = period_bounds(self.team_budget.period, database_now())
            spent = team_spent_since(self.team, start).plus(pending)
            why = no_room(self.team_budget, spent, size.tokens, size.cost)
            if why:
                period = period_name(self.team_budget.period)
                self._refuse(f"the team {self.team_name}'s {period} budget: {why}", "team")

    @staticmethod
    def _refuse(message: str, where: str) -> None:
        BUDGET_REFUSALS.labels("model_call").inc()
        raise BudgetExhausted(f"stopped before a model call: {message}", where=where)


def _least_next_call(last_turn_result) -> tuple[int, Decimal]:
    """The least the call after a turn costs: its prompt repeats the whole
    conversation the turn's call sent and got back."""
    usage = Usage.of_result(last_turn_result) if last_turn_result else None
    if usage is None:
        return 0, Decimal(0)
    return usage.total, Decimal(last_turn_result.get("cost") or 0)


def why_a_resume_stops(request, run, *, turns, disabled, unreported_turns) -> tuple[str, str]:
    """(code, why, with what to do) an attempt of ``run`` would stop before
    its next model call, as ``BudgetWatch`` would stop it, or ("", "").
    ``turns``: what the attempt replays (a journal's turns; () for a
    restart); calls of the last one that go live first are sized by their
    shortest outcome (``first_call_size``). ``unreported_turns``:
    the run's turns whose usage is unknown, or a callable counting them
    (asked only when a limit applies) — for a restart, those of every
    attempt: stricter than the restarted attempt, which replays none of
    them (G17: unknown is never 0). A run's own limits are fixed with its
    request and count every attempt: neither waiting nor a requeue lifts
    them."""
    limit = Budget.of("run", request.max_total_tokens, request.max_cost)
    budget = budget_of(run.submitted_by_id)
    team_budget = team_budget_of(run.team_id)
    if limit is None and budget is None and team_budget is None:
        return "", ""
    unknown = unreported_turns() if callable(unreported_turns) else unreported_turns
    if unknown:
        return "spend_unknown", (
            f"{unknown} model turn(s) came without their usage: what the run spent is "
            "unknown, so its limits cannot be kept; submit the request again instead"
        )
    provider, model = priced_model(request.provider)
    price = price_of(provider, model)
    limits_cost = any(
        each is not None and each.max_cost is not None for each in (limit, budget, team_budget)
    )
    if limits_cost and price is None:
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
    spent = Spent(run.prompt_tokens + run.completion_tokens, run.cost, run.unpriced_turns)
    size = first_call_size(request, turns, disabled, price)
    why = "" if size is None else no_room(limit, spent, size.tokens, size.cost)
    if why and going_live(turns):
        why += (
            " at least: the calls of its last turn go live first, and it sends their outcomes too"
        )
    return ("run_limit_spent", f"the run's limit: {why}{fixed}") if why else ("", "")
