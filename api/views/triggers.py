"""``/api/triggers/``: an agent's event triggers (G23) — define, change,
delete them. Senders POST their events to each one's ``url``
(``api.views.hooks``), signed with its secret, which only the answer to
its creation shows (a PATCH may set a new one).

Scoped as everything is (G22): another team's trigger is a 404, one seen
without the action's role a 403 naming it. A creation, a change and a
deletion are each an admin log entry, as in the admin (naming the fields
changed, never the secret's value).
"""

from django.contrib.admin.models import ADDITION, CHANGE, DELETION
from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from api import permissions, scoping
from api.trigger_serializers import (
    EventTriggerCreatedSerializer,
    EventTriggerDetailSerializer,
    EventTriggerSerializer,
)
from api.views.base import BaseAPIView, errors
from api.views.schedules import MAX_ID, admin_log, changed_fields
from teams import access
from triggers.models import EventTrigger

VIEW_PERMISSION = "triggers.view_eventtrigger"
ADD_PERMISSION = "triggers.add_eventtrigger"
CHANGE_PERMISSION = "triggers.change_eventtrigger"
DELETE_PERMISSION = "triggers.delete_eventtrigger"
MAY_VIEW = permissions.requires(VIEW_PERMISSION)
MAY_ADD = permissions.requires(ADD_PERMISSION)
MAY_CHANGE = permissions.requires(CHANGE_PERMISSION)
MAY_DELETE = permissions.requires(DELETE_PERMISSION)


def triggers_shown():
    return EventTrigger.objects.select_related("agent__team", "version", "owner")


def get_trigger(pk: int, user, permission: str = VIEW_PERMISSION) -> EventTrigger:
    """The trigger ``pk`` if ``user`` may see it, else a 404 as for none
    (another team's is none); a 403 naming the role without ``permission``
    in its team."""
    trigger = None
    if pk <= MAX_ID:
        trigger = access.scoped(triggers_shown().filter(pk=pk), user, VIEW_PERMISSION).first()
    if trigger is None:
        raise NotFound(f"no trigger {pk}")
    if permission != VIEW_PERMISSION:
        scoping.check_may(user, permission, trigger.agent.team)
    return trigger


def detail(trigger: EventTrigger, request) -> dict:
    return EventTriggerDetailSerializer(trigger, context={"request": request}).data


class TriggerListCreate(BaseAPIView):
    """Event triggers: GET lists those of the teams you may see them in,
    each with the URL its sender POSTs to; POST defines one (you become its
    owner: its runs are yours) and answers its secret, this once."""

    def get_permissions(self):
        return [MAY_ADD()] if self.request.method == "POST" else [MAY_VIEW()]

    @extend_schema(responses={200: EventTriggerSerializer(many=True), **errors()})
    def get(self, request):
        triggers = access.scoped(triggers_shown(), request.user, VIEW_PERMISSION)
        return Response(
            EventTriggerSerializer(triggers, many=True, context={"request": request}).data
        )

    @extend_schema(
        request=EventTriggerSerializer,
        responses={201: EventTriggerCreatedSerializer, **errors(400, 413)},
    )
    def post(self, request):
        created = EventTriggerSerializer(data=request.data, context={"request": request})
        created.is_valid(raise_exception=True)
        with transaction.atomic():
            trigger = created.save()
            admin_log(request.user, trigger, ADDITION, [{"added": {}}])
        return Response(
            EventTriggerCreatedSerializer(trigger, context={"request": request}).data,
            status=status.HTTP_201_CREATED,
        )


class TriggerDetail(BaseAPIView):
    """One event trigger, with its last events and their runs (never its
    secret); PATCH changes it (a new `secret` among the fields), DELETE
    deletes it with its events' records (their runs stay)."""

    http_method_names = ["get", "patch", "delete", "options", "head"]

    def get_permissions(self):
        needed = {"PATCH": MAY_CHANGE, "DELETE": MAY_DELETE}.get(self.request.method, MAY_VIEW)
        return [needed()]

    @extend_schema(responses={200: EventTriggerDetailSerializer, **errors(404)})
    def get(self, request, pk):
        return Response(detail(get_trigger(pk, request.user), request))

    @extend_schema(
        request=EventTriggerSerializer,
        responses={200: EventTriggerDetailSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request, pk):
        trigger = get_trigger(pk, request.user, CHANGE_PERMISSION)
        changed = EventTriggerSerializer(
            trigger, data=request.data, partial=True, context={"request": request}
        )
        changed.is_valid(raise_exception=True)
        with transaction.atomic():
            changed.save()
            admin_log(request.user, trigger, CHANGE, changed_fields(request))
        return Response(detail(trigger, request))

    @extend_schema(responses={204: None, **errors(404)})
    def delete(self, request, pk):
        trigger = get_trigger(pk, request.user, DELETE_PERMISSION)
        with transaction.atomic():
            admin_log(request.user, trigger, DELETION, "")
            trigger.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
