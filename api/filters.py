"""Filters of ``GET /api/runs/``; each maps to an indexed column."""

import django_filters
from django.db import connection

from runs.models import AgentRun
from runs.requeue_safety import writes_in_doubt
from runs.vocabulary import FailureClass, RunMode, RunStatus, TerminationReason


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=RunStatus.choices)
    termination_reason = django_filters.ChoiceFilter(choices=TerminationReason.choices)
    failure_class = django_filters.ChoiceFilter(choices=FailureClass.choices)
    mode = django_filters.ChoiceFilter(choices=RunMode.choices)
    tool = django_filters.CharFilter(method="offers_tool", help_text="runs offering this tool")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    write_in_doubt = django_filters.BooleanFilter(
        method="filter_write_in_doubt", help_text="a non-idempotent write not reconciled"
    )

    class Meta:
        model = AgentRun
        fields = []

    def offers_tool(self, queryset, name, value):
        if connection.vendor == "postgresql":
            return queryset.filter(request__tools__contains=[value])
        return queryset.filter(request__icontains=f'"{value}"')

    def filter_write_in_doubt(self, queryset, name, value):
        doubtful = writes_in_doubt(AgentRun.objects.all()).values("pk")
        return queryset.filter(pk__in=doubtful) if value else queryset.exclude(pk__in=doubtful)
