"""What the API says of a tool (``/api/tools/``): its effect from code,
where it comes from, whether it can be offered, and the two settings an
operator may change."""

from rest_framework import serializers

from tools.approval_policy import ApprovalPolicy, requires_approval
from tools.approval_settings import MAX_NOTE_CHARS
from tools.effects import ToolEffect
from tools.operator_view import ToolSource, ToolView, describe_tool


class ToolSerializer(serializers.Serializer):
    """A tool as ``tools.operator_view.describe_tool`` sees it, and its
    settings row. Only ``enabled`` and ``approval`` are accepted (G1)."""

    name = serializers.CharField(read_only=True)
    description = serializers.CharField(
        read_only=True, help_text="the class's, or the MCP server's as listed (its text)"
    )
    source = serializers.ChoiceField(
        choices=[source.value for source in ToolSource],
        read_only=True,
        help_text="where the tool comes from: builtin (shipped with nrllm-ops), class (a tool "
        "class in NRLLM_TOOLS), mcp (a tool of an MCP toolset in NRLLM_TOOLS, on `server`), "
        "unknown (nothing in the running code names it)",
    )
    server = serializers.CharField(
        read_only=True, help_text="the MCP toolset's server name; empty for other tools"
    )
    effect = serializers.ChoiceField(
        choices=[effect.value for effect in ToolEffect],
        read_only=True,
        help_text="from the code; never accepted. An MCP tool its toolset does not declare, "
        "and a tool no longer registered, is non_idempotent_write, as an unknown name always is",
    )
    declared = serializers.BooleanField(
        read_only=True,
        help_text="whether code declares the effect: a tool class always does; an MCP tool "
        "when its toolset lists it (an undeclared one is non_idempotent_write)",
    )
    registered = serializers.BooleanField(
        read_only=True,
        help_text="whether the running code still registers the tool; a setting "
        "may outlive its tool's removal. A declared MCP tool is registered whether or not "
        "its server answers; an undeclared one while its server offers it",
    )
    available = serializers.BooleanField(
        read_only=True,
        help_text="whether a run can be offered the tool now; a run naming an MCP tool "
        "that is not is refused at enqueue with unavailable_reason",
    )
    unavailable_reason = serializers.CharField(
        read_only=True,
        allow_blank=True,
        help_text="why not: the server cannot be reached, does not offer it, offers it with "
        "a schema or name this runtime cannot use, or the tool is not registered; empty when "
        "available",
    )
    hints = serializers.DictField(
        child=serializers.BooleanField(),
        read_only=True,
        help_text="the MCP annotations the server stated (readOnlyHint, destructiveHint, "
        "idempotentHint, openWorldHint), as stated: shown, never trusted; empty for other "
        "tools and while the server's listing lacks the tool",
    )
    hint_contradictions = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="how the hints contradict the declared effect; not empty: flagged for an "
        "operator. The declaration wins",
    )
    parameters = serializers.JSONField(
        read_only=True, help_text="the input schema; null while an MCP tool is not listed"
    )
    enabled = serializers.BooleanField()
    approval = serializers.ChoiceField(
        choices=ApprovalPolicy.choices,
        help_text="the operators' approval setting: default (what the effect and "
        "NRLLM_APPROVAL_REQUIRED_FOR say), required, or not_required. Setting not_required "
        "where the default asks for approval needs the permission tools.relax_approval "
        "(403 relax_permission_required without it)",
    )
    approval_required = serializers.BooleanField(
        read_only=True,
        help_text="whether its calls wait for an operator's approval: the effect, "
        "NRLLM_APPROVAL_REQUIRED_FOR and approval together; a run's request may add "
        "tools (require_approval), never remove one",
    )
    note = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=MAX_NOTE_CHARS,
        help_text="why, recorded in the admin log with the change",
    )

    @staticmethod
    def describe(setting, view: ToolView | None = None) -> dict:
        """The row of ``setting``; ``view`` if the caller described the tool already."""
        view = view or describe_tool(setting.name)
        return {
            "name": setting.name,
            "description": view.description,
            "source": view.source.value,
            "server": view.server,
            # From code, through the resolver, so a removed tool fails closed
            # (G1): it is a non_idempotent_write, and its approval follows.
            "effect": view.effect.value,
            "declared": view.declared,
            "registered": view.registered,
            "available": view.available,
            "unavailable_reason": view.unavailable_reason,
            "hints": view.hints,
            "hint_contradictions": view.hint_contradictions,
            "parameters": view.parameters,
            "enabled": setting.enabled,
            "approval": setting.approval,
            "approval_required": requires_approval(view.effect, setting.approval),
        }
