"""Which registered tools operators have switched off, and where they
changed a tool's approval policy."""

from tools.models import ToolSetting


def disabled_tool_names() -> set[str]:
    """Names of tools an operator disabled; a tool with no setting is enabled."""
    return set(ToolSetting.objects.filter(enabled=False).values_list("name", flat=True))


def approval_overrides(names) -> dict[str, str]:
    """The approval settings of the tools ``names`` that are not ``default``."""
    return dict(
        ToolSetting.objects.filter(name__in=list(names))
        .exclude(approval="default")
        .values_list("name", "approval")
    )
