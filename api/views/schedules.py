"""``/api/schedules/``: an agent's schedules (G23) — define, change and
delete them, pause and resume them, backfill a range of their slots.

Each is scoped as everything is (G22): another team's schedule is a 404,
one seen without the action's role a 403 naming it. Pause, resume and
backfill are ``triggers.actions``', the console's own: each an admin log
entry; a creation, a change and a deletion here are one too, as in the
admin.
"""

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from api import permissions, scoping
from api.errors import Conflict
from api.serializers import ActionResultSerializer
from api.trigger_serializers import (
    BackfillPreviewSerializer,
    BackfillSerializer,
    PauseSerializer,
    ScheduleDetailSerializer,
    ScheduleSerializer,
)
from api.views.base import BaseAPIView, errors
from teams import access
from triggers import actions
from triggers.models import Schedule

VIEW_PERMISSION = "triggers.view_schedule"
ADD_PERMISSION = "triggers.add_schedule"
CHANGE_PERMISSION = "triggers.change_schedule"
DELETE_PERMISSION = "triggers.delete_schedule"
PAUSE_PERMISSION = "triggers.pause_schedule"
#: A backfill starts runs, submitted by who asked for it.
START_RUNS = "runs.add_agentrun"
MAY_VIEW = permissions.requires(VIEW_PERMISSION)
MAY_ADD = permissions.requires(ADD_PERMISSION)
MAY_CHANGE = permissions.requires(CHANGE_PERMISSION)
MAY_DELETE = permissions.requires(DELETE_PERMISSION)
MAY_PAUSE = permissions.requires(PAUSE_PERMISSION)
#: The largest id a row may have (bigint): a larger one names none.
MAX_ID = 2**63 - 1


def schedules_shown():
    return Schedule.objects.select_related("agent__team", "version", "owner")


def get_schedule(pk: int, user, permission: str = VIEW_PERMISSION) -> Schedule:
    """The schedule ``pk`` if ``user`` may see it, else a 404 as for none
    (another team's is none); a 403 naming the role without ``permission``
    in its team."""
    schedule = None
    if pk <= MAX_ID:
        schedule = access.scoped(schedules_shown().filter(pk=pk), user, VIEW_PERMISSION).first()
    if schedule is None:
        raise NotFound(f"no schedule {pk}")
    if permission != VIEW_PERMISSION:
        scoping.check_may(user, permission, schedule.agent.team)
    return schedule


def admin_log(user, obj, flag: int, message) -> None:
    """The admin log entry of an API change, as the admin's own would read."""
    LogEntry.objects.log_actions(user.pk, [obj], flag, change_message=message, single_object=True)


def changed_fields(request) -> list:
    """The change message the admin writes: the fields the body named."""
    named = sorted(request.data) if isinstance(request.data, dict) else []
    return [{"changed": {"fields": named}}]


def detail(schedule: Schedule, request) -> dict:
    return ScheduleDetailSerializer(schedule, context={"request": request}).data


class ScheduleListCreate(BaseAPIView):
    """Schedules: GET lists those of the teams you may see them in, with
    their next firing times; POST defines one (you become its owner: its
    runs are yours)."""

    def get_permissions(self):
        return [MAY_ADD()] if self.request.method == "POST" else [MAY_VIEW()]

    @extend_schema(responses={200: ScheduleSerializer(many=True), **errors()})
    def get(self, request):
        schedules = access.scoped(schedules_shown(), request.user, VIEW_PERMISSION)
        return Response(ScheduleSerializer(schedules, many=True).data)

    @extend_schema(
        request=ScheduleSerializer,
        responses={201: ScheduleDetailSerializer, **errors(400, 413)},
    )
    def post(self, request):
        created = ScheduleSerializer(data=request.data, context={"request": request})
        created.is_valid(raise_exception=True)
        with transaction.atomic():
            schedule = created.save()
            admin_log(request.user, schedule, ADDITION, [{"added": {}}])
        return Response(detail(schedule, request), status=status.HTTP_201_CREATED)


class ScheduleDetail(BaseAPIView):
    """One schedule, with its next firing times and its last firings (each
    slot's outcome and run); PATCH changes it (a change of its timing
    considers slots from then on), DELETE deletes it with its firings."""

    http_method_names = ["get", "patch", "delete", "options", "head"]

    def get_permissions(self):
        needed = {"PATCH": MAY_CHANGE, "DELETE": MAY_DELETE}.get(self.request.method, MAY_VIEW)
        return [needed()]

    @extend_schema(responses={200: ScheduleDetailSerializer, **errors(404)})
    def get(self, request, pk):
        return Response(detail(get_schedule(pk, request.user), request))

    @extend_schema(
        request=ScheduleSerializer,
        responses={200: ScheduleDetailSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request, pk):
        schedule = get_schedule(pk, request.user, CHANGE_PERMISSION)
        changed = ScheduleSerializer(
            schedule, data=request.data, partial=True, context={"request": request}
        )
        changed.is_valid(raise_exception=True)
        with transaction.atomic():
            changed.save()
            admin_log(request.user, schedule, CHANGE, changed_fields(request))
        return Response(detail(schedule, request))

    @extend_schema(responses={204: None, **errors(404)})
    def delete(self, request, pk):
        schedule = get_schedule(pk, request.user, DELETE_PERMISSION)
        with transaction.atomic():
            admin_log(request.user, schedule, DELETION, "")
            schedule.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class _ScheduleAction(BaseAPIView):
    perform_action = None

    permission_classes = [MAY_PAUSE]

    @extend_schema(
        request=PauseSerializer,
        responses={200: ActionResultSerializer, **errors(400, 404, 409, 413)},
    )
    def post(self, request, pk):
        schedule = get_schedule(pk, request.user, PAUSE_PERMISSION)
        body = PauseSerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        result = type(self).perform_action(
            schedule, request.user, body.validated_data.get("note", "")
        )
        if not result.ok:
            raise Conflict(result.code, result.detail)
        return Response({"code": result.code, "detail": result.detail})


class SchedulePause(_ScheduleAction):
    """Pause: no slot fires until it is resumed (`409` `already_paused`).
    The note is recorded in the admin log and shown as why."""

    perform_action = staticmethod(actions.pause)


class ScheduleResume(_ScheduleAction):
    """Resume: it fires from now on, never the slots it slept through.
    Refused (`409` `open_question`) while a run of it has a write in doubt
    not reconciled or a dead letter not resolved (G23)."""

    perform_action = staticmethod(actions.resume)


class ScheduleBackfill(BaseAPIView):
    """Backfill (start, end]: fire every slot of the range no firing
    records, oldest first, whatever the overlap policy; its runs are yours
    (the runner role in the agent's team). With `"preview": true`, what it
    would do: the slots, those already recorded, the runs it would start,
    and the agent's tools that write and that wait for approval."""

    permission_classes = [MAY_VIEW]

    @extend_schema(
        request=BackfillSerializer,
        responses={
            200: OpenApiResponse(
                PolymorphicProxySerializer(
                    component_name="BackfillAnswer",
                    serializers=[BackfillPreviewSerializer, ActionResultSerializer],
                    resource_type_field_name=None,
                ),
                description="a preview's counts, or what the backfill did",
            ),
            **errors(400, 404, 409, 413),
        },
    )
    def post(self, request, pk):
        schedule = get_schedule(pk, request.user)
        body = BackfillSerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        start, end = body.validated_data["start"], body.validated_data["end"]
        try:
            if body.validated_data["preview"]:
                return Response(_preview(actions.backfill_preview(schedule, start, end)))
            if not access.may(request.user, START_RUNS, schedule.agent.team_id):
                raise PermissionDenied(
                    scoping.refusal(request.user, START_RUNS, schedule.agent.team)
                )
            result = actions.backfill(schedule, start, end, request.user)
        except actions.BackfillRefused as refused:
            field, _, why = str(refused).partition(": ")
            raise ValidationError({field: [why]}) from None
        if not result.ok:
            if result.code == "forbidden":  # the roles changed since
                raise PermissionDenied(result.detail)
            raise Conflict(result.code, result.detail)
        return Response({"code": result.code, "detail": result.detail})


def _preview(preview: actions.BackfillPreview) -> dict:
    return BackfillPreviewSerializer(
        {
            "preview": True,
            "slots": len(preview.slots),
            "already_recorded": len(preview.already),
            "runs": preview.runs,
            "writes": preview.writes,
            "approval_required": preview.approval_required,
            "too_many": preview.too_many,
        }
    ).data
