"""``/api/tools/``: the registry as operators see it. Only ``enabled`` can change."""

import json

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from api import permissions
from api.serializers import ToolSerializer
from api.views.base import BaseAPIView, errors
from tools.models import ToolSetting

READ_ONLY_FIELDS = {"name", "description", "effect", "registered", "parameters"}


def _setting(name) -> ToolSetting:
    setting = ToolSetting.objects.filter(name=name).first()
    if setting is None:
        raise NotFound(f"no tool {name!r}")
    return setting


class ToolList(BaseAPIView):
    permission_classes = [permissions.VIEW_TOOLS]

    @extend_schema(responses={200: ToolSerializer(many=True), **errors()})
    def get(self, request):
        return Response([ToolSerializer.describe(setting) for setting in ToolSetting.objects.all()])


class ToolDetail(BaseAPIView):
    def get_permissions(self):
        if self.request.method == "PATCH":
            return [permissions.CHANGE_TOOLS()]
        return [permissions.VIEW_TOOLS()]

    @extend_schema(responses={200: ToolSerializer, **errors(404)})
    def get(self, request, name):
        return Response(ToolSerializer.describe(_setting(name)))

    @extend_schema(
        request=ToolSerializer(partial=True),
        responses={200: ToolSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request, name):
        """Switch a tool on or off, with an entry in the admin log. The effect
        comes from code: naming it (or any other read-only field) is refused,
        and nothing changes."""
        setting = _setting(name)
        body = request.data
        if not isinstance(body, dict):
            raise ValidationError({"body": "must be a JSON object"})
        for field in body:
            if field in READ_ONLY_FIELDS:
                raise ValidationError({field: f"{field} is read-only; only enabled can change"})
            if field != "enabled":
                raise ValidationError({field: f"unknown field {field!r}; only enabled can change"})
        if "enabled" not in body or not isinstance(body["enabled"], bool):
            raise ValidationError({"enabled": "must be true or false"})
        with transaction.atomic():
            # Locked, so the log's "before" is the value this change replaced.
            # Gone if deleted since the lookup above: the same 404 as before it.
            setting = ToolSetting.objects.select_for_update().filter(pk=setting.pk).first()
            if setting is None:
                raise NotFound(f"no tool {name!r}")
            before, after = setting.enabled, body["enabled"]
            ToolSetting.objects.filter(pk=setting.pk).update(enabled=after)
            # In the admin's log like a change made there (G11), in the same
            # transaction: no change without its entry.
            LogEntry.objects.log_actions(
                request.user.pk,
                [setting],
                CHANGE,
                change_message=_change_message(before, after),
                single_object=True,
            )
        # The row as this change left it, not read again: deleted after the
        # commit, it would be a 404 for a change that happened.
        setting.enabled = after
        return Response(ToolSerializer.describe(setting))


def _change_message(before: bool, after: bool) -> str:
    was, now = json.dumps(before), json.dumps(after)
    if before == after:
        return f"No fields changed through the API (enabled stays {now})."
    return f"Changed enabled through the API: {was} → {now}."
