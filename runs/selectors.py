"""Run queries that the admin, the API and the metrics share, each backed by
an index (see ``AgentRun.Meta``)."""

from django.db import connection
from django.db.models import Q

from runs.models import AgentRun
from runs.vocabulary import RunStatus
from tools.effects import ToolEffect


def writes_in_doubt(queryset):
    """The ended runs of ``queryset`` with a non-idempotent write nobody reconciled."""
    return queryset.filter(
        pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE,
        status__in=RunStatus.terminal(),
        reconciliation__isnull=True,
    )


def offering_tool(queryset, name: str):
    """The runs of ``queryset`` whose request offers the tool ``name``."""
    if connection.vendor == "postgresql":
        # jsonb containment, served by the GIN index on request->'tools'.
        return queryset.filter(request__tools__contains=[name])
    return queryset.filter(request__icontains=f'"{name}"')


def write_audit_runs(limit: int = 200):
    """Runs whose write audit failed, runs dead-lettered ``write_interrupted``
    and runs with a non-idempotent fence standing, newest first."""
    return (
        AgentRun.objects.filter(
            Q(error_type="AuditPersistenceFailed")
            | Q(termination_reason="write_interrupted")
            | Q(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
        )
        .select_related("reconciliation", "reconciliation__operator")
        .order_by("-created_at")[:limit]
    )
