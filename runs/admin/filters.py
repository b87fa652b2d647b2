"""List filters for runs, each backed by an index (see the model's Meta)."""

from django.contrib import admin
from django.db import connection

from runs.vocabulary import RunStatus
from tools.effects import ToolEffect
from tools.registry import get_registry


class WriteInDoubtFilter(admin.SimpleListFilter):
    title = "write in doubt"
    parameter_name = "write_in_doubt"

    def lookups(self, request, model_admin):
        return [("yes", "Yes: a non-idempotent write not reconciled")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return in_doubt(queryset)
        return queryset


def in_doubt(queryset):
    return queryset.filter(
        pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE,
        status__in=RunStatus.terminal(),
        reconciliation__isnull=True,
    )


class OffersToolFilter(admin.SimpleListFilter):
    title = "offers tool"
    parameter_name = "tool"

    def lookups(self, request, model_admin):
        return [(tool.name, f"{tool.name} ({tool.effect.value})") for tool in get_registry()]

    def queryset(self, request, queryset):
        name = self.value()
        if not name:
            return queryset
        if connection.vendor == "postgresql":
            # jsonb containment, served by the GIN index on request->'tools'.
            return queryset.filter(request__tools__contains=[name])
        return queryset.filter(request__icontains=f'"{name}"')
