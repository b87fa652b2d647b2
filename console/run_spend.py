"""A run's spend in the console (G17): the runs list's column, the run
page's fields, and each attempt's and model turn's tokens and cost.

The list and the page read the run's own totals (its row: no query per
row); an attempt's spend is one query over its llm steps' usage. While a
run has a turn whose model had no price its cost is unknown, and says so:
never 0, never the priced turns' sum passed off as the whole.
"""

from collections import defaultdict
from decimal import Decimal

from django.conf import settings
from django.contrib import admin
from django.db.models import BooleanField, ExpressionWrapper, F, Q
from django.db.models.fields.json import KeyTransform
from django.utils.html import format_html

from runs.models import AgentRun, RunStep
from runs.models.vocabulary import StepKind
from spend.prices import Usage
from spend.recording import TurnsSpend, turns_spend
from spend.usage import money_text

#: What the list's spend column sorts by.
TOTAL_TOKENS = F("prompt_tokens") + F("completion_tokens")


def amount(value) -> str:
    """``value`` in the deployment's currency ("0.000195 USD")."""
    return f"{money_text(value)} {settings.NRLLM_CURRENCY}"


def token_text(count: int) -> str:
    return f"{count:,}"


def turns_text(count: int) -> str:
    return f"{count} turn{'' if count == 1 else 's'}"


class RunSpendFields:
    """The spend column of the runs list and the computed fields of the run
    page's "Spend" fieldset, for ``AgentRunAdmin``."""

    @admin.display(description="spend", ordering=TOTAL_TOKENS)
    def spend(self, run: AgentRun):
        """The run's cost ("0.000195 USD", "cost unknown"), its tokens with it
        in the tooltip ("36 tok · 0.000195 USD"): one short line in a row of
        the list (issue #41); None (the admin's empty value) before any turn."""
        if spent_nothing(run):
            return None
        cost = "cost unknown" if run.known_cost is None else amount(run.known_cost)
        return format_html(
            '<span class="run-spend" title="{} tok · {}">{}</span>',
            token_text(run.total_tokens),
            cost,
            cost,
        )

    @admin.display(description="total tokens")
    def total_tokens_shown(self, run: AgentRun) -> str:
        return token_text(run.total_tokens)

    @admin.display(description="cost")
    def cost_shown(self, run: AgentRun) -> str:
        return "none yet" if spent_nothing(run) else run_cost_text(run)


def spent_nothing(run: AgentRun) -> bool:
    """No turn of the run has reported usage (yet)."""
    return not run.total_tokens and not run.unpriced_turns and not run.cost


def run_cost_text(run: AgentRun) -> str:
    """The run's cost, or why it is unknown (and what its priced turns cost)."""
    if run.known_cost is not None:
        return amount(run.known_cost)
    turns = "turn" if run.unpriced_turns == 1 else "turns"
    priced = f"; the others: {amount(run.cost)}" if run.cost else ""
    return (
        f"unknown ({run.unpriced_turns} {turns} of unknown cost: no price, or no usage "
        f"reported{priced})"
    )


def turn_spend_text(step: RunStep) -> str:
    """One model turn's tokens and cost as its step recorded them; "" for a
    step that is not a turn or reports no usage."""
    if step.kind != StepKind.LLM:
        return ""
    usage = Usage.of_result(step.result)
    if usage is None:
        return ""
    # Since G17 the runtime writes ``cost`` with the usage: a decimal string,
    # or None when the attempt's model had no price. A turn recorded before
    # has usage and no ``cost`` at all.
    if "cost" not in step.result:
        cost = "cost not recorded"
    elif step.result["cost"] is None:
        cost = "no price" if usage.reported else "no usage reported"
    else:
        cost = amount(step.result["cost"])
    return f"{token_text(usage.total)} tok · {cost}"


def spend_text(spend: TurnsSpend) -> str:
    """What some turns spent: "2 turns, 36 tok · 0.000195 USD", a lower
    bound (≥) when some had no price; "" when none reported usage."""
    if not spend:
        return ""
    cost = lower_bound(spend.cost, spend.unpriced_turns)
    return f"{turns_text(spend.turns)}, {token_text(spend.tokens)} tok · {cost}"


def spend_by_attempt(run: AgentRun) -> dict[int, str]:
    """lease token → what that attempt's model turns spent (``spend_text``).
    One query: only each llm step's ``usage`` and ``cost``, not its result."""
    # A null ``usage`` (the provider reported none: an unreported turn the
    # totals count, cost unknown) reads as None, as a missing one does (no
    # turn at all): ``has_usage`` tells them apart.
    turns = run.steps.filter(kind=StepKind.LLM).values_list(
        "lease_token",
        KeyTransform("usage", "result"),
        KeyTransform("cost", "result"),
        ExpressionWrapper(Q(result__has_key="usage"), output_field=BooleanField()),
    )
    steps_by_attempt: dict[int, list[dict]] = defaultdict(list)
    for lease_token, usage, cost, has_usage in turns:
        if not has_usage:
            continue  # reports no usage: not a turn the totals count
        # A missing ``cost`` (a turn recorded before G17) reads as None too:
        # unknown, counted as unpriced, never as 0.
        steps_by_attempt[lease_token].append(
            {"kind": StepKind.LLM, "result": {"usage": usage, "cost": cost}}
        )
    # turns_spend is how the run's own totals were added up: the same sum.
    return {
        lease_token: spend_text(turns_spend(steps))
        for lease_token, steps in steps_by_attempt.items()
    }


def lower_bound(cost, unpriced_turns: int) -> str:
    """A sum of priced turns: exact, or "≥ …" when ``unpriced_turns`` had no
    price; "unknown" when none had one (a lower bound of 0 says nothing)."""
    cost = Decimal(cost)
    if not unpriced_turns:
        return amount(cost)
    if not cost:
        return f"unknown ({unpriced_turns} unpriced)"
    return f"≥ {amount(cost)} ({unpriced_turns} unpriced)"
