"""``/api/approvals/``: the calls that wait for an operator, and their
decisions (G14).

A thin adapter over ``runs.approvals.actions``, which the admin's inbox uses
too: it checks who may decide again (the approver's right to the write,
G22, and four-eyes), binds the decision to the digest, and records it with
the run's release in one transaction.

Lists and lookups are scoped to the teams the user (as its token lets it)
may see runs in (``teams.access``): another team's request is not listed,
and is a 404 by id, as an unknown one is — never a 403 telling it exists.
"""

import re

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import generics
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from api import permissions
from api.approval_serializers import (
    ApprovalSerializer,
    DecisionResultSerializer,
    DecisionSerializer,
    approvals_shown,
)
from api.errors import Conflict
from api.filters import ApprovalFilter
from api.pagination import TimeCursorPagination
from api.serializers import ErrorSerializer
from api.views.base import BaseAPIView, LimitedBodyMixin, errors
from runs.approvals import actions as approval_actions
from runs.models import AgentRun
from runs.models.vocabulary import ApprovalStatus
from teams import access

#: Seeing a request is seeing its run (``permissions.VIEW_RUNS``).
VIEW_PERMISSION = "runs.view_agentrun"

ASCII_DIGITS = re.compile(r"[0-9]{1,20}")

ID_PARAMETER = OpenApiParameter(
    "id", OpenApiTypes.INT, OpenApiParameter.PATH, description="the approval request's id"
)


def visible_approvals(user):
    """The requests ``user`` may see: those of runs of its teams."""
    return access.scoped(approvals_shown(), user, VIEW_PERMISSION)


def decidable_approvals(user):
    """The requests a decision may name: those ``user`` may see, and those
    of the teams where it may decide (a global ``runs.approve_write``
    without ``runs.view_agentrun`` decided before teams, and still does)."""
    if access.teams_with(user, approval_actions.APPROVE_PERMISSION) is access.EVERY:
        return approvals_shown()
    return visible_approvals(user)


def get_approval(pk, shown):
    """The request ``pk`` names among ``shown``, or a 404 that says why
    (malformed id, unknown, or another team's: the same answer)."""
    pk = str(pk)
    # Digits only: int() would also take " 7", "+7", "7_0" and "７".
    if not ASCII_DIGITS.fullmatch(pk):
        raise NotFound(f"{pk!r} is not an approval request id (an integer)")
    approval_id = int(pk)
    # Django answers an id past bigint's range with no row, not an error.
    found = shown.filter(pk=approval_id).first()
    if found is None:
        raise NotFound(f"no approval request {approval_id}")
    return found


class ApprovalOrder(TimeCursorPagination):
    """The orders a client may ask for (``ordering``). Unasked, it follows
    the status filter: ``pending`` oldest first — the inbox: the next to
    expire on top; any other status latest decision first — the record;
    none newest request first, as every other list here."""

    ORDERINGS = {
        "requested_at": ("requested_at", "id"),
        "-requested_at": ("-requested_at", "-id"),
        # Decided, expired or withdrawn requests only: a pending one has no
        # decided_at, and a cursor cannot stand on a null.
        "-decided_at": ("-decided_at", "-id"),
    }
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"

    def chosen(self, request) -> str:
        asked = request.query_params.get("ordering")
        if asked is None:
            status = request.query_params.get("status")
            if status == ApprovalStatus.PENDING:
                return "requested_at"
            return "-decided_at" if status else "-requested_at"
        if asked not in self.ORDERINGS:
            raise ValidationError({"ordering": f"{asked!r} is not one of {list(self.ORDERINGS)}"})
        return asked

    def get_ordering(self, request, queryset, view):
        return self.ORDERINGS[self.chosen(request)]

    def paginate_queryset(self, queryset, request, view=None):
        if self.chosen(request) == "-decided_at":
            queryset = queryset.filter(decided_at__isnull=False)
        return super().paginate_queryset(queryset, request, view)

    def get_schema_operation_parameters(self, view):
        return [
            *super().get_schema_operation_parameters(view),
            {
                "name": "ordering",
                "required": False,
                "in": "query",
                "description": "requested_at: oldest request first; -requested_at: newest "
                "first; -decided_at: latest decision first (decided, expired and withdrawn "
                "requests only). Default: requested_at with status=pending, -decided_at "
                "with any other status, -requested_at without a status filter",
                "schema": {"type": "string", "enum": list(self.ORDERINGS)},
            },
        ]


class ApprovalList(LimitedBodyMixin, generics.ListAPIView):
    """Approval requests, pending and decided, with filters."""

    serializer_class = ApprovalSerializer
    permission_classes = [permissions.VIEW_RUNS]
    pagination_class = ApprovalOrder
    filterset_class = ApprovalFilter

    def get_queryset(self):
        return visible_approvals(self.request.user)

    @extend_schema(responses={200: ApprovalSerializer(many=True), **errors(400, 404)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class ApprovalDetail(BaseAPIView):
    """One approval request, pending or decided; another team's is a 404."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(parameters=[ID_PARAMETER], responses={200: ApprovalSerializer, **errors(404)})
    def get(self, request, pk):
        return Response(ApprovalSerializer(get_approval(pk, visible_approvals(request.user))).data)


#: Refusals that are the user's, not the call's state: 403, not 409.
FORBIDDEN = approval_actions.REFUSED_TO_USER

DECISION_EXAMPLES = [
    OpenApiExample(
        "decide the call as it was shown",
        request_only=True,
        value={"digest": "9f2c" + "0" * 60, "note": "checked with the team"},
    ),
    OpenApiExample(
        "refused: stale digest",
        response_only=True,
        status_codes=["409"],
        value={
            "code": "stale_digest",
            "detail": "the digest is not this call's as it stands: the page was old or the "
            "run moved on; look at the call again",
        },
    ),
    OpenApiExample(
        "refused: not an approver in the run's team",
        response_only=True,
        status_codes=["403"],
        value={
            "code": "not_approver",
            "detail": "you are not an approver in team 'alpha': deciding its calls needs "
            "the approver role there (runs.approve_write)",
        },
    ),
    OpenApiExample(
        "refused: the team may not use the tool",
        response_only=True,
        status_codes=["403"],
        value={
            "code": "tool_not_in_team",
            "detail": "team 'alpha' may not use the tool 'send_notification' now: its calls "
            "cannot be approved until a team admin gives the team that tool again; you may "
            "deny it",
        },
    ),
    OpenApiExample(
        "refused: not a runner in the run's team",
        response_only=True,
        status_codes=["403"],
        value={
            "code": "not_runner",
            "detail": "you are not a runner in team 'alpha': you may approve only a write you "
            "could make yourself (runner and approver in the run's team); you may deny it",
        },
    ),
    OpenApiExample(
        "refused: four-eyes",
        response_only=True,
        status_codes=["403"],
        value={
            "code": "second_person_required",
            "detail": "you submitted this run: another operator must approve its calls "
            "(NRLLM_APPROVAL_SECOND_PERSON); you may deny them",
        },
    ),
]


#: The 403 of a decision, with the codes it may carry.
REFUSED_403 = OpenApiResponse(
    ErrorSerializer,
    description="the user may not decide this call; it still waits. code: permission_denied "
    "(runs.approve_write in no team), not_approver (not an approver in the run's team), "
    "tool_not_in_team (approve only: the team may not use the tool now), not_runner "
    "(approve only: not a runner in the run's team), second_person_required (approve only: "
    "the run's submitter under four-eyes)",
)


class _Decision(BaseAPIView):
    """POST → 200 when decided; 404 for another team's request (as for an
    unknown one); 403 with a ``code`` when the user may not decide it
    (``ApprovalApprove`` and ``ApprovalDeny`` name which); 409
    (``stale_digest``, ``already_decided``, ``expired``, ``not_waiting``)
    when the call's state refuses it. A refusal changes nothing: the call
    still waits."""

    permission_classes = [permissions.APPROVE]
    http_method_names = ["post", "options"]
    decide = None

    @extend_schema(
        parameters=[ID_PARAMETER],
        request=DecisionSerializer,
        responses={
            200: DecisionResultSerializer,
            **errors(400, 404, 409, 413),
            403: REFUSED_403,
        },
        examples=DECISION_EXAMPLES,
    )
    def post(self, request, pk):
        approval = get_approval(pk, decidable_approvals(request.user))
        body = DecisionSerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        result = type(self).decide(
            approval,
            request.user,
            digest=body.validated_data["digest"],
            note=body.validated_data.get("note", ""),
        )
        if result.code in FORBIDDEN:
            raise PermissionDenied(result.detail, code=result.code)
        if result.code == "not_found":
            raise NotFound(f"no approval request {approval.pk}")
        if not result.ok:
            raise Conflict(result.code, result.detail)
        run_status = AgentRun.objects.filter(pk=approval.run_id).values_list("status", flat=True)
        return Response(
            {
                "code": result.code,
                "detail": result.detail,
                "run_status": run_status.first(),
                "approval": ApprovalSerializer(
                    get_approval(approval.pk, decidable_approvals(request.user))
                ).data,
            }
        )


class ApprovalApprove(_Decision):
    """Approve the call: it executes once, as approved, when its run resumes
    (once no other call of its turn waits). Only a user who could make the
    write may release it (G22). Refused, changing nothing — the call still
    waits: 404 for another team's request; 403 with code permission_denied
    (runs.approve_write in no team), not_approver (not an approver in the
    run's team), tool_not_in_team (the team may not use the tool now),
    not_runner (not a runner in the run's team: they could not start a run
    with the tool themselves) or second_person_required (the run's submitter
    under NRLLM_APPROVAL_SECOND_PERSON), checked in that order; 409 with code
    stale_digest, already_decided, expired or not_waiting."""

    decide = staticmethod(approval_actions.approve)


class ApprovalDeny(_Decision):
    """Deny the call: it never executes; the model is told, with the note,
    and the run goes on. It needs the approver role in the run's team only
    (a denial executes nothing); the run's submitter may deny under
    four-eyes. Refused, changing nothing: 404 for another team's request;
    403 with code permission_denied (runs.approve_write in no team) or
    not_approver (not an approver in the run's team); 409 with code
    stale_digest, already_decided, expired or not_waiting."""

    decide = staticmethod(approval_actions.deny)
