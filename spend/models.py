"""Prices, budgets and the spend they are kept against (G17).

A turn's cost is computed when the turn is recorded, at the price its
attempt read with its claim, and stored with the turn (the llm step's
``result["cost"]``) and in the totals below: a later price change rewrites
no history. Nothing here imports the runtime; the runtime writes
``DailySpend`` in the statement that records a turn.
"""

from django.conf import settings
from django.db import models

from teams.models import DEFAULT_TEAM_ID

#: Money: a turn costs a few millionths of a unit at the cheapest, and up
#: to 2e10 at the dearest price a row holds (2e8 tokens at 1e8 a million).
MONEY = {"max_digits": 28, "decimal_places": 10}
#: How many rows a day's spend of one submitter and model is spread over.
SPEND_SHARDS = 16
#: A price per million tokens.
PRICE = {"max_digits": 14, "decimal_places": 6}


class ModelPrice(models.Model):
    """What one model of one provider kind costs, per million tokens.

    Operators edit it in the admin (each change an admin log entry) or load
    it from a file (``manage.py load_prices``). A model with no row is
    unpriced: its turns' cost is unknown, never 0.
    """

    #: The provider kind of a run's request (``openai``, ``scripted``).
    provider = models.CharField(max_length=32)
    #: The request's ``provider.model`` (for ``scripted``, ``scripted``).
    model = models.CharField(max_length=200)
    input_per_million = models.DecimalField(**PRICE)
    #: Prompt tokens the provider served from its cache; blank: as input.
    cached_input_per_million = models.DecimalField(**PRICE, null=True, blank=True)
    output_per_million = models.DecimalField(**PRICE)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["provider", "model"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "model"], name="price_one_per_model"),
            models.CheckConstraint(
                condition=models.Q(input_per_million__gte=0)
                & models.Q(output_per_million__gte=0)
                & (
                    models.Q(cached_input_per_million__isnull=True)
                    | models.Q(cached_input_per_million__gte=0)
                ),
                name="price_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}"


class BudgetPeriod(models.TextChoices):
    DAY = "day"
    MONTH = "month"


class BudgetLimits(models.Model):
    """What a budget holds, whoever's it is: a period and its limits, either
    blank for none (``spend.budgets.Budget`` reads them)."""

    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_cost = models.DecimalField(**PRICE, null=True, blank=True)
    note = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class SubmitterBudget(BudgetLimits):
    """One user's budget, in place of the deployment's default
    (``NRLLM_USER_BUDGET_*``). Both limits blank: this user has none."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="spend_budget"
    )

    class Meta:
        ordering = ["user__username"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_cost__isnull=True) | models.Q(max_cost__gte=0),
                name="budget_cost_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"budget of {self.user}"


class TeamBudget(BudgetLimits):
    """One team's budget (G21): shared by every run of the team, whoever
    submitted it, and kept beside each submitter's own — a model call is
    made only when both have room for it. Both limits blank: none."""

    TEAM_FIELD = "team"

    team = models.OneToOneField("teams.Team", on_delete=models.CASCADE, related_name="spend_budget")

    class Meta:
        ordering = ["team__name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_cost__isnull=True) | models.Q(max_cost__gte=0),
                name="team_budget_cost_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"budget of team {self.team}"


class DailySpend(models.Model):
    """What the recorded turns of one day (UTC, the database's clock) cost,
    per submitter and model: one upsert in the statement that records each
    turn, so it is exact whatever crashes (a turn recorded once, counted once).

    Budgets sum it over their period (a submitter's over their rows, a
    team's over its); ``GET /api/usage/`` and the overview read it, never
    the runs table.
    """

    TEAM_FIELD = "team"

    day = models.DateField()
    #: The submitting user's id; 0: none (the command line). Not a foreign
    #: key: the upsert's conflict target must be NOT NULL on every database.
    submitter = models.BigIntegerField()
    provider = models.CharField(max_length=32)
    model = models.CharField(max_length=200)
    #: The team of the runs whose turns these are (a run's team never
    #: changes). No database constraint: the record's upsert would check it
    #: on the hot path, and a team is never deleted while it has runs.
    team = models.ForeignKey(
        "teams.Team",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_default=DEFAULT_TEAM_ID,
        related_name="+",
    )
    #: Which of ``SPEND_SHARDS`` rows of the key a run adds to (by its id):
    #: every record of a turn updates its row, and the key's records would
    #: otherwise queue on one row lock — through a flush, for a turn that
    #: fences a write. Readers sum the shards.
    shard = models.PositiveSmallIntegerField(default=0)
    turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    #: Of ``input_tokens``, those the provider served from its cache.
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    #: The priced turns' cost; ``unpriced_turns`` had no price.
    cost = models.DecimalField(**MONEY, default=0)
    unpriced_turns = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(
                fields=["day", "submitter", "provider", "model", "team", "shard"],
                name="spend_one_row_per_team_key",
            ),
        ]
        indexes = [
            # A budget's sum over its period.
            models.Index(fields=["submitter", "day"], name="spend_submitter_day_idx"),
            models.Index(fields=["team", "day"], name="spend_team_day_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.submitter} {self.provider}/{self.model}"


class SpendHold(models.Model):
    """One owner's budget period — a submitter's or a team's — as the
    reservations before model calls keep it (G21): what its recorded turns
    spent and what calls in flight have reserved, on one row, so a
    reservation is one guarded UPDATE that matches only while ``spent +
    reserved + the call's largest cost`` fits on every row it reserves on
    (``spend.reservations``). Made by an attempt's first reservation of the
    period, from the period's ``DailySpend``; the statement that records a
    turn adds its spend here as it adds it to ``DailySpend``.

    Statements that lock more than one hold lock them in the order of
    ``LOCK_ORDER``, so two of them never wait for each other."""

    #: The submitter whose period this is; 0: a team's.
    submitter = models.BigIntegerField()
    #: The team whose period this is; 0: a submitter's.
    team = models.BigIntegerField(default=0)
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    #: The period's first day (UTC, the database's clock).
    start = models.DateField()
    spent_tokens = models.BigIntegerField(default=0)
    spent_cost = models.DecimalField(**MONEY, default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    reserved_cost = models.DecimalField(**MONEY, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["submitter", "team", "period", "start"], name="hold_one_per_owner_period"
            ),
            # One owner: a submitter's or a team's.
            models.CheckConstraint(
                condition=(models.Q(submitter=0) & ~models.Q(team=0))
                | (~models.Q(submitter=0) & models.Q(team=0)),
                name="hold_one_owner",
            ),
        ]

    #: The order every statement locks holds in: the unique key's.
    LOCK_ORDER = "submitter, team, period, start"

    def __str__(self) -> str:
        owner = f"team {self.team}" if self.team else str(self.submitter)
        return f"{owner} {self.period} from {self.start}"


class SpendReservation(models.Model):
    """A model call's largest possible cost, held against its submitter's
    period or its team's (``hold``: a call under both has a row on each)
    from before the call until the statement that records its turn settles
    it (G21). A failed or abandoned call's is released by
    its attempt; a dead attempt's (its run no longer running under its
    lease) by the reaper."""

    hold = models.ForeignKey(SpendHold, on_delete=models.CASCADE, related_name="reservations")
    #: The run and the attempt's lease token (not a foreign key: spend
    #: imports nothing of the runtime, as ``DailySpend``).
    run_id = models.UUIDField()
    lease_token = models.BigIntegerField()
    tokens = models.BigIntegerField()
    cost = models.DecimalField(**MONEY)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run_id", "lease_token"], name="reservation_attempt_idx")]

    def __str__(self) -> str:
        return f"{self.tokens} tokens for {self.run_id}/{self.lease_token}"
