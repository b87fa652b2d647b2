"""Prices and budgets in the admin (G17). Every change is an admin log
entry (Django's own, naming the fields changed); the daily spend is read-only."""

from django.contrib import admin

from spend.models import DailySpend, ModelPrice, SubmitterBudget
from spend.usage import money_text


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


@admin.register(DailySpend)
class DailySpendAdmin(admin.ModelAdmin):
    list_display = (
        "day",
        "submitter",
        "provider",
        "model",
        "turns",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "cost_shown",
    )
    list_filter = ("provider", "day")
    date_hierarchy = "day"

    @admin.display(description="cost")
    def cost_shown(self, row: DailySpend) -> str:
        if row.unpriced_turns:
            return f"≥ {money_text(row.cost)} ({row.unpriced_turns} turn(s) unpriced)"
        return money_text(row.cost)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
