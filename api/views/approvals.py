"""``/api/approvals/``: the calls that wait for someone outside the worker
— an operator's approval (G14), a person's answer, another system's
completion (G24) — and what people do with them: approve, deny, edit an
approval's arguments, answer a question.

A thin adapter over ``runs.approvals.actions`` and ``runs.approvals.answers``,
which the console's inbox uses too: they check who may act again (the
approver's right to the write, G22, four-eyes, the runner role for an
answer), bind the action to the digest, and record it with the run's
release in one transaction.

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
    AnswerSerializer,
    ApprovalSerializer,
    DecisionResultSerializer,
    DecisionSerializer,
    EditResultSerializer,
    EditSerializer,
    approvals_shown,
)
from api.errors import BadRequest, Conflict
from api.filters import ApprovalFilter
from api.pagination import TimeCursorPagination
from api.serializers import ErrorSerializer
from api.views.base import BaseAPIView, LimitedBodyMixin, errors
from runs.approvals import actions as approval_actions
from runs.approvals import answers
from runs.models import AgentRun
from runs.models.vocabulary import ApprovalStatus, WaitKind
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


def answerable_approvals(user):
    """The requests an answer may name: those ``user`` may see, or of the
    teams where it may start runs (who answers an agent is a runner of its
    team, ``runs.approvals.answers``)."""
    return access.scoped(approvals_shown(), user, VIEW_PERMISSION, approval_actions.RUN_PERMISSION)


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


#: What a request of each kind waits for, as a refusal says it.
WAIT_OF_KIND = {
    WaitKind.APPROVAL: "an approval",
    WaitKind.QUESTION: "an answer (POST answer/)",
    WaitKind.DEFERRED: "another system's completion at its signed URL",
}

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
    "under four-eyes, the run's submitter, or the editor of an edited call)",
)


class _Decision(BaseAPIView):
    """POST → 200 when decided; 404 for another team's request (as for an
    unknown one); 403 with a ``code`` when the user may not decide it
    (``ApprovalApprove`` and ``ApprovalDeny`` name which); 409
    (``stale_digest``, ``already_decided``, ``expired``, ``not_waiting``)
    when the call's state refuses it; 400 ``not_an_approval`` for a request
    that waits for an answer or a completion. A refusal changes nothing: the
    call still waits."""

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
        body = valid_body(DecisionSerializer, request)
        if approval.kind != WaitKind.APPROVAL:
            # The action would find no approval to decide and say the call
            # expired: say what is wrong instead.
            raise BadRequest(
                "not_an_approval",
                f"this request waits for {WAIT_OF_KIND[approval.kind]}, not for an approval: "
                "it is not approved or denied",
            )
        result = type(self).decide(
            approval,
            request.user,
            digest=body["digest"],
            note=body.get("note", ""),
        )
        refuse_unless_ok(result, approval)
        return Response(outcome(result, approval, decidable_approvals(request.user)))


def valid_body(serializer_class, request) -> dict:
    """The request's body as ``serializer_class`` validates it, or a 400
    naming the problem (a body that is no JSON object included)."""
    body = serializer_class(data=request.data if isinstance(request.data, dict) else None)
    body.is_valid(raise_exception=True)
    return body.validated_data


#: Refusals of what the request asks, for the call it names: 400, not 409.
BAD_REQUEST = frozenset(
    {"invalid_arguments", "unchanged", "not_an_approval", "not_a_question", "invalid_answer"}
)


def refuse_unless_ok(result, approval) -> None:
    """Raise the API's answer to a refused action: 403 for the user's,
    400 for what was asked, 404 for a request gone, 409 for the call's
    state (``result.code`` says which)."""
    if result.ok:
        return
    if result.code in FORBIDDEN:
        raise PermissionDenied(result.detail, code=result.code)
    if result.code == "not_found":
        raise NotFound(f"no approval request {approval.pk}")
    if result.code in BAD_REQUEST:
        raise BadRequest(result.code, result.detail)
    raise Conflict(result.code, result.detail)


def outcome(result, approval, shown) -> dict:
    """A 200's body: the action's code and detail, the run's status and
    the request as they stand after it."""
    run_status = AgentRun.objects.filter(pk=approval.run_id).values_list("status", flat=True)
    return {
        "code": result.code,
        "detail": result.detail,
        "run_status": run_status.first(),
        "approval": ApprovalSerializer(get_approval(approval.pk, shown)).data,
    }


class ApprovalApprove(_Decision):
    """Approve the call: it executes once, as approved, when its run resumes
    (once no other call of its turn waits). Only a user who could make the
    write may release it (G22). Refused, changing nothing — the call still
    waits: 404 for another team's request; 403 with code permission_denied
    (runs.approve_write in no team), not_approver (not an approver in the
    run's team), tool_not_in_team (the team may not use the tool now),
    not_runner (not a runner in the run's team: they could not start a run
    with the tool themselves) or second_person_required (under
    NRLLM_APPROVAL_SECOND_PERSON: the run's submitter, or the person who
    edited the call), checked in that order; 409 with code stale_digest,
    already_decided, expired or not_waiting; 400 with code not_an_approval
    for a question or a deferred call."""

    decide = staticmethod(approval_actions.approve)


class ApprovalDeny(_Decision):
    """Deny the call: it never executes; the model is told, with the note,
    and the run goes on. It needs the approver role in the run's team only
    (a denial executes nothing); the run's submitter may deny under
    four-eyes. Refused, changing nothing: 404 for another team's request;
    403 with code permission_denied (runs.approve_write in no team) or
    not_approver (not an approver in the run's team); 409 with code
    stale_digest, already_decided, expired or not_waiting; 400 with code
    not_an_approval for a question or a deferred call."""

    decide = staticmethod(approval_actions.deny)


EDIT_EXAMPLES = [
    OpenApiExample(
        "edit the call's arguments",
        request_only=True,
        value={
            "digest": "9f2c" + "0" * 60,
            "arguments": {"recipient": "ops", "message": "restart db-2, not db-1"},
            "note": "db-2 is the broken one",
        },
    ),
    OpenApiExample(
        "refused: arguments the tool's schema refuses",
        response_only=True,
        status_codes=["400"],
        value={"code": "invalid_arguments", "detail": "recipient: 5 is not of type 'string'"},
    ),
]

#: The 403 of an edit, with the codes it may carry.
EDIT_REFUSED_403 = OpenApiResponse(
    ErrorSerializer,
    description="the user may not edit this call; it still waits. code: permission_denied "
    "(runs.approve_write in no team), not_approver (not an approver in the run's team), "
    "tool_not_in_team (the team may not use the tool now), not_runner (not a runner in the "
    "run's team)",
)


class ApprovalEdit(BaseAPIView):
    """Edit a call that waits for approval: the same tool with other
    arguments, checked against the tool's parameters schema. The edit is a
    new call — its own id, digest and idempotency key, pending — returned
    as `made`; the request it replaces is `replaced` and never executes.
    The edited call waits for its own approval (approve or deny it by its
    id and digest); under NRLLM_APPROVAL_SECOND_PERSON another approver
    must approve it, and the editor's approve is a 403 (second_person_
    required). When it runs, the model is told it ran with edited
    arguments. The editor needs what approving the write needs (G22).
    Refused, changing nothing — the call still waits: 400 with code
    invalid_arguments (naming each field), unchanged (the arguments it
    has) or not_an_approval (a question or a deferred call); 404 for
    another team's request; 403 with code permission_denied,
    not_approver, tool_not_in_team or not_runner; 409 with code
    stale_digest, already_decided, expired, not_waiting or tool_gone (the
    tool is no longer registered)."""

    permission_classes = [permissions.APPROVE]
    http_method_names = ["post", "options"]

    @extend_schema(
        parameters=[ID_PARAMETER],
        request=EditSerializer,
        responses={
            200: EditResultSerializer,
            **errors(400, 404, 409, 413),
            403: EDIT_REFUSED_403,
        },
        examples=EDIT_EXAMPLES,
    )
    def post(self, request, pk):
        shown = decidable_approvals(request.user)
        approval = get_approval(pk, shown)
        body = valid_body(EditSerializer, request)
        result = approval_actions.edit(
            approval,
            request.user,
            digest=body["digest"],
            arguments=body["arguments"],
            note=body.get("note", ""),
        )
        refuse_unless_ok(result, approval)
        return Response(
            {
                **outcome(result, approval, shown),
                "made": ApprovalSerializer(get_approval(result.made.pk, shown)).data,
            }
        )


ANSWER_EXAMPLES = [
    OpenApiExample(
        "answer the question as it was shown",
        request_only=True,
        value={"digest": "9f2c" + "0" * 60, "answer": {"host": "db-2"}},
    ),
    OpenApiExample(
        "refused: the answer does not fit the question's answer_schema",
        response_only=True,
        status_codes=["400"],
        value={"code": "invalid_answer", "detail": "answer: 'host' is a required property"},
    ),
]


class ApprovalAnswer(BaseAPIView):
    """Answer the agent's question (a request of kind question): the answer
    is checked against its answer_schema (a non-empty string when it gives
    none) and becomes the ask_person call's result — what the model is
    told — and the run goes back to the queue. Answering takes the runner
    role in the run's team. Refused, storing nothing — the question still
    waits: 400 with code invalid_answer (naming the place, as
    `answer.host: ...`) or not_a_question; 404 for another team's request;
    403 with code not_runner; 409 with code already_answered,
    stale_digest, expired or not_waiting."""

    permission_classes = [permissions.ADD_RUNS]
    http_method_names = ["post", "options"]

    @extend_schema(
        parameters=[ID_PARAMETER],
        request=AnswerSerializer,
        responses={200: DecisionResultSerializer, **errors(400, 404, 409, 413)},
        examples=ANSWER_EXAMPLES,
    )
    def post(self, request, pk):
        shown = answerable_approvals(request.user)
        question = get_approval(pk, shown)
        body = valid_body(AnswerSerializer, request)
        result = answers.answer(
            question,
            request.user,
            digest=body["digest"],
            answer=body["answer"],
            note=body.get("note", ""),
        )
        refuse_unless_ok(result, question)
        return Response(outcome(result, question, shown))
