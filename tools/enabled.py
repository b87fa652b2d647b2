"""Which registered tools operators have switched off."""

from tools.models import ToolSetting


def disabled_tool_names() -> set[str]:
    """Names of tools an operator disabled; a tool with no setting is enabled."""
    return set(ToolSetting.objects.filter(enabled=False).values_list("name", flat=True))
