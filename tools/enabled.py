"""Which registered tools operators have switched off, and where they
changed a tool's approval policy."""

from django.db import connection

from tools.models import ToolSetting

# Asked at every enqueue: a statement of its own, not compiled by the ORM each time.
_DISABLED = f"SELECT name FROM {ToolSetting._meta.db_table} WHERE NOT enabled"


def disabled_tool_names() -> set[str]:
    """Names of tools an operator disabled; a tool with no setting is enabled."""
    with connection.cursor() as cursor:
        cursor.execute(_DISABLED)
        return {name for (name,) in cursor.fetchall()}


def approval_overrides(names) -> dict[str, str]:
    """The approval settings of the tools ``names`` that are not ``default``."""
    return dict(
        ToolSetting.objects.filter(name__in=list(names))
        .exclude(approval="default")
        .values_list("name", "approval")
    )
