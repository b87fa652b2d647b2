"""``/api/runs/``: start runs, follow them, cancel and requeue them."""

import hashlib
import json

from django.db import IntegrityError, transaction
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import generics, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from agents.starting import StartForbidden, enqueue
from api import permissions, scoping
from api.errors import BudgetSpent, Conflict, Unprocessable
from api.filters import RunFilter
from api.models import RunCreationKey
from api.pagination import TimeCursorPagination
from api.run_start_serializers import RunRequestSerializer, RunStartByAgentSerializer
from api.serializers import (
    ActionResultSerializer,
    NoteSerializer,
    RunSerializer,
    StepPageSerializer,
    StepSerializer,
    VerdictSerializer,
    with_run_relations,
)
from api.views.base import BaseAPIView, LimitedBodyMixin, errors
from runs.models import AgentRun
from runs.models.vocabulary import SubmittedVia
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from teams import access

STEPS_PAGE = 100


class NewestFirst(TimeCursorPagination):
    ordering = "-created_at"
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"


def get_run(pk, user, permission: str = scoping.VIEW_RUNS) -> AgentRun:
    """The run ``pk`` names, with what ``RunSerializer`` shows, if ``user``
    may see it (``api.scoping.get_run``: a 404 otherwise, as for one
    unknown; a 403 naming the role without ``permission`` in its team)."""
    return scoping.get_run(pk, user, permission, queryset=with_run_relations(AgentRun.objects))


def _as_it_is_now(run: AgentRun) -> dict:
    """``run`` serialised as the database holds it once the request's work
    is committed, not as it was created: without Redis the run executed in
    this request (its job ran on commit), and with Redis a fast worker may
    have taken it already, so the answer may be any status, not only
    ``queued``."""
    now = with_run_relations(AgentRun.objects.filter(pk=run.pk)).first()
    return RunSerializer(now or run).data


def _body_digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class RunListCreate(LimitedBodyMixin, generics.ListAPIView):
    """Runs: GET lists them newest first, filtered; POST starts one (201), or finds the run an
    `Idempotency-Key` already started (200)."""

    queryset = with_run_relations(AgentRun.objects.all())
    serializer_class = RunSerializer
    pagination_class = NewestFirst
    filterset_class = RunFilter

    def get_queryset(self):
        # The runs of the teams the user (as its token lets it) may see (G22).
        return scoping.visible_runs(super().get_queryset(), self.request.user)

    def get_permissions(self):
        needed = permissions.ADD_RUNS if self.request.method == "POST" else permissions.VIEW_RUNS
        return [needed()]

    @extend_schema(responses={200: RunSerializer(many=True), **errors(400, 404)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=PolymorphicProxySerializer(
            component_name="RunStart",
            serializers=[RunRequestSerializer, RunStartByAgentSerializer],
            resource_type_field_name=None,
        ),
        examples=[
            OpenApiExample(
                "a run of an agent, by name (the demo's)",
                request_only=True,
                value={"agent": "release-notes", "input": "Note that v2 shipped; tell the team."},
            ),
            OpenApiExample(
                "a scripted run that reads and notifies, in the demo's team ops",
                request_only=True,
                value={
                    # Whole, it names its team: the demo's users may start runs in two.
                    "team": "ops",
                    "prompt": "Tell the team the release notes changed.",
                    "tools": ["read_note", "send_notification"],
                    "provider": {
                        "kind": "scripted",
                        "turns": [
                            {
                                "tool_calls": [
                                    {"name": "read_note", "arguments": {"slug": "release-notes"}}
                                ]
                            },
                            {
                                "tool_calls": [
                                    {
                                        "name": "send_notification",
                                        "arguments": {
                                            "recipient": "team",
                                            "message": "The release notes changed.",
                                        },
                                    }
                                ]
                            },
                            {"content": "Told the team."},
                        ],
                    },
                },
            ),
            OpenApiExample(
                "refused: unknown tool",
                response_only=True,
                status_codes=["400"],
                value={
                    "code": "invalid",
                    "detail": "tools: unknown tool(s) ['nope']; known: [...]",
                    "errors": ["tools: unknown tool(s) ['nope']; known: [...]"],
                },
            ),
        ],
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                location=OpenApiParameter.HEADER,
                required=False,
                description="the same key and body return the same run (200)",
            )
        ],
        responses={
            201: OpenApiResponse(
                RunSerializer,
                description="the run created, as it is when the answer is written: "
                "`queued` while it waits for a worker, but a worker may have taken it "
                "already (`running`), and without Redis (the embedded default) it has "
                "executed in this request (ended, or `waiting_for_approval`). "
                "Follow it with GET /api/runs/{id}/",
            ),
            200: OpenApiResponse(
                RunSerializer, description="the run this key created before, as it is now"
            ),
            **errors(400, 413, 422),
        },
    )
    def post(self, request):
        if not isinstance(request.data, dict):
            raise ValidationError({"request": "the body must be a JSON object"})
        key = request.headers.get("Idempotency-Key", "").strip()
        if len(key) > 200:
            raise ValidationError({"Idempotency-Key": "at most 200 characters"})
        if not key:
            return Response(_as_it_is_now(self._enqueue(request)), status=201)
        digest = _body_digest(request.data)
        # A retried request finds the run its key made before: answered as it
        # is now, whatever would refuse a new run today (a budget spent, a
        # price gone), so the client never takes a run it has for one it lacks.
        earlier = RunCreationKey.objects.select_related("run").filter(user=request.user, key=key)
        earlier = earlier.first()
        if earlier is not None:
            return self._repeated(earlier, digest, request.user)
        try:
            with transaction.atomic():
                run = self._enqueue(request)
                # The unique (user, key) makes a concurrent twin wait here, then fail.
                RunCreationKey.objects.create(
                    user=request.user, key=key, body_sha256=digest, run=run
                )
        except IntegrityError:
            earlier = RunCreationKey.objects.select_related("run").get(user=request.user, key=key)
            return self._repeated(earlier, digest, request.user)
        return Response(_as_it_is_now(run), status=201)

    @staticmethod
    def _repeated(earlier: RunCreationKey, digest: str, user) -> Response:
        if earlier.body_sha256 != digest:
            raise Unprocessable(
                "idempotency_key_reused", "this Idempotency-Key was used with a different body"
            )
        if not access.may(user, scoping.VIEW_RUNS, earlier.run.team_id):
            # The user's own run, but in a team this token (or the user, since
            # they left it) may no longer see: its key starts nothing new.
            raise PermissionDenied(
                "this Idempotency-Key started a run in a team you may no longer see"
            )
        return Response(_as_it_is_now(earlier.run), status=200)

    @staticmethod
    def _enqueue(request) -> AgentRun:
        try:
            return enqueue(request.data, submitted_by=request.user, submitted_via=SubmittedVia.API)
        except InvalidRunRequest as error:
            # The message already names the field (e.g. "tools: unknown tool(s) ...",
            # "team: ..." for a whole request with no one team to run in).
            raise ValidationError(str(error)) from None
        except StartForbidden as forbidden:
            # A visible agent or team without the runner role there (G22).
            raise PermissionDenied(str(forbidden)) from None
        except BudgetRefused as refused:
            raise BudgetSpent(wait=refused.retry_after_seconds, detail=str(refused)) from None


class RunDetail(BaseAPIView):
    """A run as it is now: status, reason, spend, and the approvals it waits for."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(responses={200: RunSerializer, **errors(404)})
    def get(self, request, pk):
        return Response(RunSerializer(get_run(pk, request.user)).data)


class RunSteps(BaseAPIView):
    """A run's steps by sequence, a page at a time (`next_after` to follow a live run)."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="only steps with a higher sequence"),
            OpenApiParameter("limit", int, description=f"at most this many (max {STEPS_PAGE})"),
        ],
        responses={200: StepPageSerializer, **errors(400, 404)},
    )
    def get(self, request, pk):
        run = get_run(pk, request.user)
        after = _int_param(request, "after", 0, minimum=0)
        limit = _int_param(request, "limit", STEPS_PAGE, minimum=1, maximum=STEPS_PAGE)
        steps = list(run.steps.filter(sequence__gt=after).order_by("sequence")[:limit])
        return Response(
            {
                "results": StepSerializer(steps, many=True).data,
                "next_after": steps[-1].sequence if len(steps) == limit else None,
            }
        )


def _int_param(request, name, default, *, minimum, maximum=2**31 - 1) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: f"{raw!r} is not an integer"}) from None
    if not minimum <= value <= maximum:
        raise ValidationError({name: f"must be between {minimum} and {maximum}"})
    return value


class _RunAction(BaseAPIView):
    """POST → 202 when done, 409 naming why when refused."""

    perform_action = None
    #: The permission the action takes in the run's team.
    action_permission = ""
    #: GET → what the action would do, or why it would be refused (the verdict).
    verdict = None

    def get_permissions(self):
        if self.request.method in ("GET", "HEAD"):
            return [permissions.VIEW_RUNS()]
        return super().get_permissions()

    @extend_schema(responses={200: VerdictSerializer, **errors(404)})
    def get(self, request, pk):
        if type(self).verdict is None:
            return self.http_method_not_allowed(request)
        verdict = type(self).verdict(get_run(pk, request.user))
        return Response(VerdictSerializer(verdict).data)

    @extend_schema(
        request=NoteSerializer,
        responses={202: ActionResultSerializer, **errors(400, 404, 409, 413)},
        examples=[
            OpenApiExample(
                "refused by the requeue verdict",
                response_only=True,
                status_codes=["409"],
                value={
                    "code": "write_in_doubt",
                    "detail": "the non_idempotent_write 'send_notification' may have landed; "
                    "reconcile it first",
                },
            )
        ],
    )
    def post(self, request, pk):
        run = get_run(pk, request.user, self.action_permission)
        body = NoteSerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        result = type(self).perform_action(run, request.user, body.validated_data.get("note", ""))
        if not result.ok:
            raise Conflict(result.code, result.detail)
        return Response(
            {"code": result.code, "detail": result.detail}, status=status.HTTP_202_ACCEPTED
        )


class RunCancel(_RunAction):
    """Cancel: a queued run ends now, a running one at its next step boundary."""

    permission_classes = [permissions.CANCEL]
    action_permission = "runs.cancel_agentrun"
    http_method_names = ["post", "options"]
    perform_action = staticmethod(operator_actions.cancel)


class RunRequeue(_RunAction):
    """Requeue: the run resumes from its journal (GET: what that would do)."""

    permission_classes = [permissions.REQUEUE]
    action_permission = "runs.requeue_agentrun"
    perform_action = staticmethod(operator_actions.requeue)
    verdict = staticmethod(requeue_safety)


class RunRestart(_RunAction):
    """Restart from the beginning, replaying nothing (GET: whether it may)."""

    permission_classes = [permissions.REQUEUE]
    action_permission = "runs.requeue_agentrun"
    perform_action = staticmethod(operator_actions.restart)
    verdict = staticmethod(restart_safety)
