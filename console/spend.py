"""Prices and budgets in the admin (G17). Every change is an admin log
entry (Django's own, naming the fields changed); the daily spend is read-only,
a row per day, submitter and model."""

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Subquery, Sum

from console.run_spend import lower_bound, token_text
from console.team_scope import TeamColumn
from spend.models import DailySpend, ModelPrice, SubmitterBudget


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = (
        "provider",
        "model",
        "input_per_million",
        "cached_input_per_million",
        "output_per_million",
        "updated_at",
    )
    list_filter = ("provider",)
    search_fields = ("model",)
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "provider",
                    "model",
                    "input_per_million",
                    "cached_input_per_million",
                    "output_per_million",
                ],
                "description": "Per million tokens. A turn's cost is computed when it is "
                "recorded, at the price its attempt read when it began, and stored with "
                "it: a change here applies to turns made from then on, never to earlier ones. "
                "Cached input blank: priced as input.",
            },
        )
    ]


@admin.register(SubmitterBudget)
class SubmitterBudgetAdmin(admin.ModelAdmin):
    list_display = ("user", "period", "max_tokens", "max_cost", "updated_at")
    list_filter = ("period",)
    search_fields = ("user__username",)
    autocomplete_fields = ("user",)
    fieldsets = [
        (
            None,
            {
                "fields": ["user", "period", "max_tokens", "max_cost", "note"],
                "description": "In place of the deployment's default (NRLLM_USER_BUDGET_*). "
                "Periods are calendar days or months, UTC, by the database's clock. Both "
                "limits blank: this user has no budget. A run is refused at enqueue (429) "
                "once the period's budget is spent, and a running one stops before its next "
                "model call (budget_exhausted).",
            },
        )
    ]


#: The columns a day's spend of one submitter and model in one team is
#: keyed by; a key is spread over up to ``SPEND_SHARDS`` rows
#: (``DailySpend.shard``).
KEY = ("day", "submitter", "provider", "model", "team")
#: The counts a key's rows are summed over, each shown as ``total_<name>``.
SUMMED = ("turns", "input_tokens", "cached_input_tokens", "output_tokens", "cost", "unpriced_turns")


@admin.register(DailySpend)
class DailySpendAdmin(TeamColumn, admin.ModelAdmin):
    """A row per day, submitter, model and team, as the docs and the overview
    count them: its shards summed. The row listed stands for its key (the
    key's lowest shard), each total a subquery on the key's unique index,
    so the list's filters, date drill-down, count and sorting work on the
    keys as they would on rows; the shards themselves are never listed.
    The submitter is named (one subquery, not a query per row)."""

    list_display = ("day", "submitter_shown", "model_shown", "turns_shown", "tokens", "cost_shown")
    list_display_links = None
    list_filter = ("provider", "day")
    date_hierarchy = "day"

    def get_queryset(self, request):
        same_key = DailySpend.objects.filter(**{name: OuterRef(name) for name in KEY}).order_by()
        totals = {
            f"total_{name}": Subquery(
                same_key.values("day").annotate(total=Sum(name)).values("total")
            )
            for name in SUMMED
        }
        # Not ModelAdmin's: it orders before the totals it orders by exist.
        return (
            DailySpend.objects.exclude(Exists(same_key.filter(shard__lt=OuterRef("shard"))))
            .annotate(
                **totals,
                submitter_name=Subquery(
                    get_user_model().objects.filter(pk=OuterRef("submitter")).values("username")
                ),
            )
            .order_by(*self.get_ordering(request))
        )

    def changelist_view(self, request, extra_context=None):
        title = {"title": "Spend per day, submitter and model"}
        response = super().changelist_view(request, {**title, **(extra_context or {})})
        context = getattr(response, "context_data", None) or {}
        changelist = context.get("cl")
        if changelist is not None:
            context["spend_totals"] = selection_totals(changelist)
        return response

    def get_ordering(self, request):
        # A day's costliest first (an annotation: the ``ordering`` attribute
        # may only name fields).
        return ["-day", "-total_cost"]

    @admin.display(description="submitter", ordering="submitter_name")
    def submitter_shown(self, row: DailySpend) -> str:
        # DailySpend keeps the command line's turns under submitter 0.
        if not row.submitter:
            return "the command line"
        return row.submitter_name or f"user #{row.submitter} (deleted)"

    @admin.display(description="model", ordering="model")
    def model_shown(self, row: DailySpend) -> str:
        return f"{row.provider}/{row.model}"

    @admin.display(description="turns", ordering="total_turns")
    def turns_shown(self, row: DailySpend) -> int:
        return row.total_turns

    @admin.display(description="tokens: in (cached) · out", ordering="total_input_tokens")
    def tokens(self, row: DailySpend) -> str:
        return tokens_text(
            row.total_input_tokens, row.total_cached_input_tokens, row.total_output_tokens
        )

    @admin.display(description="cost", ordering="total_cost")
    def cost_shown(self, row: DailySpend) -> str:
        return lower_bound(row.total_cost, row.total_unpriced_turns)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def selection_totals(changelist) -> dict:
    """What the rows the list's filters select add up to, over every page:
    the turns, the tokens as a row shows them and the cost (a lower bound
    where some turns had no price). One query: the shards of the keys the
    filtered list holds (``changelist.queryset``, one row a key), summed."""
    selected_key = changelist.queryset.filter(**{name: OuterRef(name) for name in KEY})
    totals = DailySpend.objects.filter(Exists(selected_key)).aggregate(
        **{name: Sum(name, default=0) for name in SUMMED}
    )
    return {
        "rows": changelist.result_count,
        "turns": totals["turns"],
        "tokens": tokens_text(
            totals["input_tokens"], totals["cached_input_tokens"], totals["output_tokens"]
        ),
        "cost": lower_bound(totals["cost"], totals["unpriced_turns"]),
    }


def tokens_text(input_tokens: int, cached: int, output: int) -> str:
    """ "input (cached) · output", as the list's tokens column heads it."""
    return f"{token_text(input_tokens)} ({token_text(cached)}) · {token_text(output)}"
