"""``/api/dead-letters/`` and ``/api/write-audits/``: failures to act on."""

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from api import permissions, scoping
from api.errors import Conflict
from api.pagination import TimeCursorPagination
from api.serializers import (
    ActionResultSerializer,
    DeadLetterSerializer,
    ReconcileSerializer,
    WriteAuditSerializer,
    with_run_relations,
)
from api.views.base import BaseAPIView, LimitedBodyMixin, errors
from api.views.runs import get_run
from runs.models import DeadLetter
from runs.models.selectors import note_writes_in_doubt, write_audit_runs
from runs.operators import actions as operator_actions
from runs.operators.actions import write_in_question
from teams import access

#: Of the write audits, the newest this many (the console's page lists as many).
WRITE_AUDITS = 200


class DeadLetterFilter(django_filters.FilterSet):
    open = django_filters.BooleanFilter(
        field_name="resolved_at", lookup_expr="isnull", help_text="true: not resolved yet"
    )

    class Meta:
        model = DeadLetter
        fields = ["reason", "failure_class"]


class NewestDeadLettersFirst(TimeCursorPagination):
    ordering = "-created_at"
    page_size = 50


class DeadLetterList(LimitedBodyMixin, generics.ListAPIView):
    """Dead letters, newest first, filtered: the runs that ended without a retry, and why."""

    queryset = DeadLetter.objects.select_related("resolved_by")
    serializer_class = DeadLetterSerializer
    permission_classes = [permissions.VIEW_DEAD_LETTERS]
    pagination_class = NewestDeadLettersFirst
    filterset_class = DeadLetterFilter

    def get_queryset(self):
        # The dead letters of the runs of the teams the user may see them in (G22).
        return access.scoped(super().get_queryset(), self.request.user, "runs.view_deadletter")

    @extend_schema(responses={200: DeadLetterSerializer(many=True), **errors(400, 404)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


def _audit_item(run) -> dict:
    from api.serializers import RunSerializer

    call = write_in_question(run)
    reconciliation = run.reconciliation
    return {
        "run": RunSerializer(run).data,
        "tool": call.get("tool", ""),
        "arguments": call.get("arguments"),
        "idempotency_key": call.get("idempotency_key", ""),
        "effect": call.get("effect", ""),
        "reconciliation": None
        if reconciliation is None
        else {
            "outcome": reconciliation.outcome,
            "note": reconciliation.note,
            "operator": reconciliation.operator.get_username(),
            "created_at": reconciliation.created_at.isoformat(),
        },
    }


class WriteAuditList(BaseAPIView):
    """Runs whose write audit failed or whose write is in doubt, with the
    write in question and how it was reconciled."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(responses={200: WriteAuditSerializer(many=True), **errors()})
    def get(self, request):
        """Runs whose write audit failed, dead-lettered ``write_interrupted``,
        with a non-idempotent fence standing or a write in doubt (newest 200)."""
        # Scoped before the newest are taken: another team's audits never
        # take the places of this user's (G22).
        visible = scoping.visible_runs(write_audit_runs(limit=None), request.user)
        runs = list(with_run_relations(visible)[:WRITE_AUDITS])
        note_writes_in_doubt(runs)  # one query for the page, not one per run
        return Response([_audit_item(run) for run in runs])


class WriteAuditReconcile(BaseAPIView):
    """Reconcile the write in doubt on a run: `applied` or `not_applied`, with a note (G10)."""

    permission_classes = [permissions.RECONCILE]

    @extend_schema(
        request=ReconcileSerializer,
        responses={200: ActionResultSerializer, **errors(400, 404, 409, 413)},
    )
    def post(self, request, pk):
        """Record whether the write in doubt landed (``applied``/``not_applied``)."""
        run = get_run(pk, request.user, "runs.reconcile_agentrun")
        body = ReconcileSerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        result = operator_actions.reconcile(
            run, request.user, body.validated_data["outcome"], body.validated_data["note"]
        )
        if not result.ok:
            raise Conflict(result.code, result.detail)
        return Response({"code": result.code, "detail": result.detail}, status=status.HTTP_200_OK)
