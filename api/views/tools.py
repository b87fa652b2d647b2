"""``/api/tools/``: the registry as operators see it. Only ``enabled`` and
``approval`` can change; the effect is code (G1)."""

import json

from django.contrib.admin.models import CHANGE, LogEntry
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from api import permissions
from api.serializers import ToolSerializer
from api.views.base import BaseAPIView, errors
from ground.commits import reaching_disk
from tools import approval_settings
from tools.approval_policy import ApprovalPolicy
from tools.models import ToolSetting
from tools.operator_view import ToolSource, describe_tool, setting_for, sync_tool_settings

READ_ONLY_FIELDS = {
    "name",
    "description",
    "source",
    "server",
    "effect",
    "declared",
    "registered",
    "available",
    "unavailable_reason",
    "hints",
    "hint_contradictions",
    "parameters",
    "approval_required",
}
WRITABLE_FIELDS = {"enabled", "approval", "note"}
CHANGEABLE = "only enabled and approval can change (with a note saying why)"


#: A name that exists, so that generated requests (schemathesis) reach the
#: body's checks rather than only the 404 of a random name.
NAME_PARAMETER = OpenApiParameter(
    "name",
    str,
    OpenApiParameter.PATH,
    description="the tool's name",
    examples=[OpenApiExample("a builtin tool", value="send_notification")],
)


def _setting(name) -> ToolSetting:
    # An undeclared MCP tool no list has synced yet gets its row here.
    setting = setting_for(name)
    if setting is None:
        raise NotFound(f"no tool {name!r}")
    return setting


def _boolean_filter(name: str, help_text: str) -> OpenApiParameter:
    return OpenApiParameter(name, bool, OpenApiParameter.QUERY, description=help_text)


LIST_FILTERS = [
    _boolean_filter("available", "only tools a run can (true) or cannot (false) be offered now"),
    _boolean_filter(
        "flagged", "only tools whose server's hints contradict the declared effect (true) or not"
    ),
    OpenApiParameter(
        "source",
        str,
        OpenApiParameter.QUERY,
        enum=[source.value for source in ToolSource],
        description="only tools from this source",
    ),
    OpenApiParameter(
        "server", str, OpenApiParameter.QUERY, description="only the tools of this MCP server"
    ),
]
_BOOLEANS = {"true": True, "false": False}


def _list_filters(query) -> dict:
    """The list's filters checked: each a ``ToolView`` attribute and the
    value it must have, or a 400 naming the parameter and what it takes."""
    wanted = {}
    for name in ("available", "flagged"):
        if name in query:
            value = query[name]
            if value not in _BOOLEANS:
                raise ValidationError({name: f"must be true or false, not {value!r}"})
            wanted[name] = _BOOLEANS[value]
    if "source" in query:
        sources = [source.value for source in ToolSource]
        if query["source"] not in sources:
            raise ValidationError({"source": f"must be one of {sources}, not {query['source']!r}"})
        wanted["source"] = ToolSource(query["source"])
    if "server" in query:
        wanted["server"] = query["server"]
    return wanted


class ToolList(BaseAPIView):
    """Every registered tool with its effect from the code, whether it can
    be offered now, and its settings."""

    permission_classes = [permissions.VIEW_TOOLS]

    @extend_schema(
        parameters=LIST_FILTERS, responses={200: ToolSerializer(many=True), **errors(400)}
    )
    def get(self, request):
        """Every tool with a setting: builtin, tool classes, MCP tools (those
        an MCP server offers undeclared get their setting as this list sees
        them). An MCP server is asked at most once a minute (every few
        seconds while it cannot be reached): its tools are listed
        unavailable with the reason, never a 5xx."""
        wanted = _list_filters(request.query_params)
        sync_tool_settings()
        rows = []
        for setting in ToolSetting.objects.all():
            view = describe_tool(setting.name)
            if all(getattr(view, name) == value for name, value in wanted.items()):
                rows.append(ToolSerializer.describe(setting, view))
        return Response(rows)


class ToolDetail(BaseAPIView):
    """One tool (GET); PATCH switches it on or off or sets its approval policy, never its effect."""

    def get_permissions(self):
        if self.request.method == "PATCH":
            return [permissions.CHANGE_TOOLS()]
        return [permissions.VIEW_TOOLS()]

    @extend_schema(parameters=[NAME_PARAMETER], responses={200: ToolSerializer, **errors(404)})
    def get(self, request, name):
        return Response(ToolSerializer.describe(_setting(name)))

    @extend_schema(
        request=ToolSerializer(partial=True),
        parameters=[NAME_PARAMETER],
        examples=[
            OpenApiExample(
                "require approval of every call",
                request_only=True,
                value={"approval": "required", "note": "new integration, watch it"},
            ),
            OpenApiExample(
                "refused: a relaxation without tools.relax_approval",
                response_only=True,
                status_codes=["403"],
                value={
                    "code": "relax_permission_required",
                    "detail": "letting a non_idempotent_write tool run without approval "
                    "(NRLLM_APPROVAL_REQUIRED_FOR=non_idempotent_write asks for it) needs "
                    "the permission 'tools.relax_approval'",
                },
            ),
        ],
        responses={200: ToolSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request, name):
        """Switch a tool on or off and set its approval policy, each change
        with an entry in the admin log; all of the body or nothing. The
        effect comes from code: naming it (or any other read-only field) is
        refused, and nothing changes. ``approval: not_required`` where the
        default asks for approval needs ``tools.relax_approval`` (403
        ``relax_permission_required``)."""
        setting = _setting(name)
        changes = _changes(request.data)
        with reaching_disk():
            # Locked, so the log's "before" is the value this change replaced.
            # Gone if deleted since the lookup above: the same 404 as before it.
            setting = ToolSetting.objects.select_for_update().filter(pk=setting.pk).first()
            if setting is None:
                raise NotFound(f"no tool {name!r}")
            if "enabled" in changes:
                before, after = setting.enabled, changes["enabled"]
                ToolSetting.objects.filter(pk=setting.pk).update(enabled=after)
                # In the admin's log like a change made there (G11), in the same
                # transaction: no change without its entry.
                LogEntry.objects.log_actions(
                    request.user.pk,
                    [setting],
                    CHANGE,
                    change_message=_change_message(before, after, changes.get("note", "")),
                    single_object=True,
                )
                setting.enabled = after
            if "approval" in changes:
                result = approval_settings.set_approval_policy(
                    setting,
                    request.user,
                    changes["approval"],
                    changes.get("note", ""),
                    via=approval_settings.VIA_API,
                )
                if not result.ok:
                    # Raised inside the transaction: the switch above is undone too.
                    raise _refusal(result)
        # The row as this change left it, not read again: deleted after the
        # commit, it would be a 404 for a change that happened.
        return Response(ToolSerializer.describe(setting))


def _changes(body) -> dict:
    """The PATCH body checked: ``enabled`` and/or ``approval`` (with an
    optional ``note``), or a 400 naming what is wrong."""
    if not isinstance(body, dict):
        raise ValidationError({"body": "must be a JSON object"})
    for field in body:
        if field in READ_ONLY_FIELDS:
            raise ValidationError({field: f"{field} is read-only; {CHANGEABLE}"})
        if field not in WRITABLE_FIELDS:
            raise ValidationError({field: f"unknown field {field!r}; {CHANGEABLE}"})
    if not body.keys() & {"enabled", "approval"}:
        raise ValidationError({"body": f"nothing to change; {CHANGEABLE}"})
    if "enabled" in body and not isinstance(body["enabled"], bool):
        raise ValidationError({"enabled": "must be true or false"})
    if "approval" in body and body["approval"] not in ApprovalPolicy.values:
        raise ValidationError(
            {"approval": f"must be one of {ApprovalPolicy.values}, not {body['approval']!r}"}
        )
    problem = approval_settings.note_problem(body.get("note", ""))
    if problem:
        raise ValidationError({"note": problem})
    return body


def _refusal(result: approval_settings.PolicyChange) -> Exception:
    if result.code == "not_found":
        return NotFound(result.detail)
    if result.code == "invalid":
        return ValidationError({"approval": result.detail})
    return PermissionDenied(result.detail, code=result.code)


def _change_message(before: bool, after: bool, note: str) -> str:
    was, now = json.dumps(before), json.dumps(after)
    if before == after:
        text = f"No fields changed through the API (enabled stays {now})."
    else:
        text = f"Changed enabled through the API: {was} → {now}."
    return f"{text} Note: {note}" if note else text
