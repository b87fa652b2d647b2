"""The spend that recording model turns adds: to the run's totals and to
the submitter's ``DailySpend`` (in the run's team), in the statement that records the turns
(G17: a turn recorded once is counted once, and a statement that does not
commit counts nothing).

The runtime's record statements call these: on PostgreSQL as parts of their
single statement (``spend_cte``, ``user_spent_column``), elsewhere through
the ORM inside their transaction (``add_daily_spend``, ``user_spent``).
"""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

from django.db import connection

from spend.budgets import Spent, spent_since
from spend.models import SPEND_SHARDS, DailySpend
from spend.prices import Usage, money

_LLM = "llm"


@dataclass(frozen=True)
class TurnsSpend:
    """What a record's model turns spent."""

    turns: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    unpriced_turns: int = 0
    #: Of ``turns``, those whose provider reported no usage (counted as 0).
    unreported_turns: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __bool__(self) -> bool:
        return self.turns > 0


def turns_spend(steps: Sequence[dict]) -> TurnsSpend:
    """The spend of the llm steps among ``steps`` that report usage. Each
    carries its cost (``result["cost"]``, None: unpriced) from when the
    attempt made it (``runs.runtime.budget_watch``)."""
    turns = input_tokens = cached = output = unpriced = unreported = 0
    cost = Decimal(0)
    for step in steps:
        result = step.get("result")
        usage = Usage.of_result(result) if step.get("kind") == _LLM else None
        if usage is None:
            continue
        turns += 1
        unreported += not usage.reported
        input_tokens += usage.prompt
        cached += usage.cached
        output += usage.completion
        if result.get("cost") is None:
            unpriced += 1
        else:
            cost += Decimal(result["cost"])
    return TurnsSpend(
        turns, input_tokens, cached, output, money(cost), unpriced, unreported_turns=unreported
    )


@dataclass
class Tally:
    """What one attempt knows of its run's and its submitter's spend: read
    with the claim, refreshed by every record that returns it (G17). The
    budget checks before a model call read it: no statement of their own."""

    #: The submitting user's id (0: none), and the model turns are priced as.
    submitter: int
    provider: str
    model: str
    #: When the submitter has a budget: the day (UTC, by the database's
    #: clock) from which every record reads their spend back, and what they
    #: had spent in the budget's period before it (read by the claim); None:
    #: no budget, nothing read back.
    budget_since: date | None = None
    user_before: Spent = field(default_factory=Spent)
    run: Spent = field(default_factory=Spent)
    user: Spent = field(default_factory=Spent)
    #: The attempt reserves before its calls (G21): its records settle.
    reserving: bool = False

    def saw_run(self, prompt_tokens, completion_tokens, cost, unpriced_turns) -> None:
        self.run = Spent(
            int(prompt_tokens) + int(completion_tokens), Decimal(cost), int(unpriced_turns)
        )

    def landed_unheard(self, spend: TurnsSpend) -> None:
        """Turns whose record committed while its answer was lost: counted
        here as the answer would have (the submitter's others come with the
        next record that is heard)."""
        self.run = self.run.plus(spend)
        self.user = self.user.plus(spend)

    def user_params(self) -> dict:
        return {"spend_user": self.submitter, "spend_since": self.budget_since}

    def saw_user(self, tokens, cost, spend: TurnsSpend) -> None:
        """The submitter's spend since ``budget_since`` as a record's
        statement read it before its own turns (``spend``) were added."""
        before = self.user_before
        self.user = Spent(
            before.tokens + int(tokens) + spend.tokens,
            before.cost + Decimal(cost) + spend.cost,
            0,
        )


# --- PostgreSQL: parts of a record's single statement -------------------------

_TABLE = DailySpend._meta.db_table
_COUNTS = (
    "turns",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost",
    "unpriced_turns",
)
_ADDED = ", ".join(f"{name} = {_TABLE}.{name} + EXCLUDED.{name}" for name in _COUNTS)

#: The unique key a record's upsert adds to.
_KEY = "day, submitter, provider, model, team_id, shard"

#: A CTE that adds the record's turns to the submitter's day (UTC, the
#: database's clock) in the run's team once the run's guarded UPDATE (the
#: CTE ``run``, which returns the key: its submitter, its team and the model
#: its request names) matched: no match, nothing added.
SPEND_CTE = f"""
    spend AS (
        INSERT INTO {_TABLE} ({_KEY}, {", ".join(_COUNTS)})
        SELECT (statement_timestamp() AT TIME ZONE 'UTC')::date, spend_submitter,
            spend_provider, spend_model, spend_team, %(spend_shard)s,
            {", ".join(f"%(spend_{name})s" for name in _COUNTS)}
        FROM run
        ON CONFLICT ({_KEY}) DO UPDATE SET {_ADDED}
        RETURNING 1
    )
"""

#: A column of the statement's result: the submitter's tokens and cost
#: since the attempt's claim day, as they stood before this statement (its
#: own CTE's insert is not visible to it): a day's rows (shards × models),
#: however far into a monthly budget's period — the claim read the days
#: before. (An attempt that runs past midnight keeps counting its claim
#: day: a budget's new period reaches it at its next attempt, the stricter
#: side.)
USER_SPENT_COLUMN = f"""
    (SELECT ARRAY[COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0)]
     FROM {_TABLE} WHERE submitter = %(spend_user)s AND day >= %(spend_since)s
    ) AS user_spent
"""


def spend_params(spend: TurnsSpend, run_id) -> dict:
    return {
        "spend_shard": shard_of(run_id),
        **{f"spend_{name}": getattr(spend, name) for name in _COUNTS},
        "spend_unreported_turns": spend.unreported_turns,
    }


def shard_of(run_id) -> int:
    """The ``DailySpend`` shard a run adds to: its id's, so one run's turns
    of a day are one row, and concurrent runs mostly add to others."""
    return uuid.UUID(str(run_id)).int % SPEND_SHARDS


# --- Elsewhere, and the ORM's records: one upsert in the record's transaction --


def add_daily_spend(
    run_id, submitter: int, provider: str, model: str, spend: TurnsSpend, *, team: int
) -> None:
    """Add ``spend`` to the submitter's day (UTC, the database's clock) in
    the run's ``team``, in one upsert: concurrent records of the same day
    add up, none is lost. Call it inside the transaction whose guarded
    UPDATE matched."""
    today = (
        "(statement_timestamp() AT TIME ZONE 'UTC')::date"
        if connection.vendor == "postgresql"
        else "date('now')"
    )
    names = ", ".join(_COUNTS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_TABLE} ({_KEY}, {names})"
            f" VALUES ({today}, %s, %s, %s, %s, %s, {', '.join(['%s'] * len(_COUNTS))})"
            f" ON CONFLICT ({_KEY}) DO UPDATE SET {_ADDED}",
            [
                submitter,
                provider,
                model,
                team,
                shard_of(run_id),
                *(getattr(spend, name) for name in _COUNTS),
            ],
        )


def user_spent_since(tally: Tally) -> Spent:
    """The submitter's spend since ``tally.budget_since`` (ORM)."""
    return spent_since(tally.submitter, tally.budget_since)
