"""Filters of ``GET /api/runs/``; each maps to an indexed column."""

from datetime import UTC

import django_filters
from django import forms
from rest_framework.exceptions import ValidationError

from api.approval_serializers import REQUIRED_BY
from runs.models import AgentRun, ApprovalRequest
from runs.models.selectors import offering_tool, writes_in_doubt
from runs.models.vocabulary import (
    ApprovalStatus,
    FailureClass,
    RunMode,
    RunStatus,
    TerminationReason,
    WaitKind,
)


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 date-time, compared in UTC: PostgreSQL refuses offsets past
    ±15:59 that Python accepts (up to ±23:59)."""

    def filter(self, queryset, value):
        if value is not None:
            try:
                value = value.astimezone(UTC)
            except (OverflowError, ValueError):
                raise ValidationError({self.field_name: "date-time out of range"}) from None
        return super().filter(queryset, value)


class IdFilter(django_filters.Filter):
    """A row's id: a whole number a bigint holds (else 400 naming the filter)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        super().__init__(*args, min_value=1, max_value=2**63 - 1, **kwargs)


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=RunStatus.choices)
    termination_reason = django_filters.ChoiceFilter(choices=TerminationReason.choices)
    failure_class = django_filters.ChoiceFilter(choices=FailureClass.choices)
    mode = django_filters.ChoiceFilter(choices=RunMode.choices)
    tool = django_filters.CharFilter(method="offers_tool", help_text="runs offering this tool")
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")
    write_in_doubt = django_filters.BooleanFilter(
        method="filter_write_in_doubt",
        help_text="a write in doubt: a non-idempotent write, or an idempotent one a requeue "
        "would not run again with its key, not reconciled (G10)",
    )
    rerun_of = django_filters.UUIDFilter(help_text="the reruns of this run (G20)")
    # Through the firing's and the event's unique run column: one row per run.
    schedule = IdFilter(
        field_name="firing__schedule", help_text="the runs this schedule fired (its id; G23)"
    )
    trigger = IdFilter(
        field_name="trigger_event__trigger",
        help_text="the runs this event trigger started (its id; G23)",
    )

    class Meta:
        model = AgentRun
        fields = []

    def offers_tool(self, queryset, name, value):
        return offering_tool(queryset, value)

    def filter_write_in_doubt(self, queryset, name, value):
        doubtful = writes_in_doubt(AgentRun.objects.all()).values("pk")
        return queryset.filter(pk__in=doubtful) if value else queryset.exclude(pk__in=doubtful)


class ApprovalFilter(django_filters.FilterSet):
    """Filters of ``GET /api/approvals/``; the ordering is the paginator's
    (``api.views.approvals.ApprovalOrder``)."""

    status = django_filters.ChoiceFilter(choices=ApprovalStatus.choices)
    kind = django_filters.ChoiceFilter(
        choices=WaitKind.choices,
        help_text="approval: calls for an operator's decision; question: the agent's questions "
        "to a person; deferred: calls another system completes",
    )
    run = django_filters.UUIDFilter(field_name="run_id", help_text="the run's id")
    tool_name = django_filters.CharFilter(help_text="the tool called")
    decided_by = django_filters.CharFilter(
        field_name="decided_by__username", help_text="the username of who decided"
    )
    required_by = django_filters.ChoiceFilter(
        choices=REQUIRED_BY,
        help_text="policy: the tool's approval policy; request: the run's require_approval",
    )

    class Meta:
        model = ApprovalRequest
        fields = []
