"""``/api/runs/{id}/rerun-from/{sequence}/``: go back into a run (G20).

GET answers the verdict: what a rerun from that model turn would replay,
the writes the run recorded from it on, and whether it may go ahead. POST
makes the new run (201, the run) or answers why not: 409 with the
verdict's code, 403 when confirming past a non-idempotent write without
the permission ``runs.rerun_past_write``.
"""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from agents.starting import rerun_request
from api import permissions
from api.errors import BudgetSpent, Conflict
from api.rerun_serializers import RerunBodySerializer, RerunVerdictSerializer
from api.serializers import RunSerializer, with_run_relations
from api.views.base import BaseAPIView, errors
from api.views.runs import get_run
from runs.models import AgentRun
from runs.models.vocabulary import SubmittedVia
from runs.operators.rerun import rerun_from
from runs.operators.rerun_verdict import rerun_verdict
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest


class RunRerunFrom(BaseAPIView):
    """Rerun a run from a chosen model turn as a new run (GET: the verdict)."""

    permission_classes = [permissions.REQUEUE]

    def get_permissions(self):
        if self.request.method in ("GET", "HEAD"):
            return [permissions.VIEW_RUNS()]
        return super().get_permissions()

    @extend_schema(
        parameters=[
            OpenApiParameter("input", str, description="preview with this input"),
            OpenApiParameter("version", int, description="preview with this agent version"),
        ],
        responses={200: RerunVerdictSerializer, **errors(400, 404)},
    )
    def get(self, request, pk, sequence):
        run = get_run(pk, request.user)
        previewed = {
            n: request.query_params[n] for n in ("input", "version") if n in request.query_params
        }
        body = RerunBodySerializer(data=previewed)
        body.is_valid(raise_exception=True)
        request_data, _ = _request_of(run, body.validated_data)
        verdict = rerun_verdict(run, sequence, request_data=request_data)
        return Response(RerunVerdictSerializer(verdict).data)

    @extend_schema(
        request=RerunBodySerializer,
        responses={201: RunSerializer, **errors(400, 404, 409, 413)},
    )
    def post(self, request, pk, sequence):
        run = get_run(pk, request.user, "runs.requeue_agentrun")
        body = RerunBodySerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        request_data, version = _request_of(run, data)
        try:
            result = rerun_from(
                run,
                sequence,
                request.user,
                request_data=request_data,
                agent_version=version,
                note=data["note"],
                confirm_past_write=data["confirm_past_write"],
                submitted_via=SubmittedVia.API,
            )
        except BudgetRefused as refused:
            raise BudgetSpent(wait=refused.retry_after_seconds, detail=str(refused)) from None
        if result.code == "permission":
            raise PermissionDenied(result.detail)
        if not result.ok:
            raise Conflict(result.code, result.detail)
        new_run = with_run_relations(AgentRun.objects.filter(pk=result.run.pk)).first()
        return Response(RunSerializer(new_run).data, status=status.HTTP_201_CREATED)


def _request_of(run: AgentRun, data: dict):
    """The rerun's request and agent version from the body's ``input`` and
    ``version`` (400 naming the field when they cannot be used)."""
    try:
        return rerun_request(run, new_input=data.get("input"), version=data.get("version"))
    except InvalidRunRequest as error:
        field, _, message = str(error).partition(":")
        raise ValidationError({field.strip(): [message.strip()]}) from None
